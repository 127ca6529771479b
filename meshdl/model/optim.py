"""Optimizers over the model's flat parameter vector: SGD with momentum, and Adam.

Semantics are PyTorch's (`torch.optim.SGD(momentum=...)`, `torch.optim.Adam`), so a run
can be cross-checked step by step. State (velocity, moments, step count) is kept in
flat float32 vectors that `state_dict` exposes for checkpoints. One Numba kernel
updates every parameter in one pass.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from meshdl.config import TrainConfig

# error_model "numpy": a division by a zero (a diverged run's NaNs, which fastmath may take
# for anything) gives inf or NaN, which the training loop reports as divergence, instead of
# raising ZeroDivisionError from inside the kernel.
_JIT = {"cache": True, "fastmath": True, "nogil": True, "boundscheck": False,
        "error_model": "numpy"}


@njit(**_JIT)
def _sgd_step(
    params: np.ndarray, grads: np.ndarray, grad_scale: float, velocity: np.ndarray,
    lr: float, momentum: float, weight_decay: float, first: bool,
) -> None:
    for i in range(params.size):
        g = grad_scale * grads[i] + weight_decay * params[i]
        if momentum > 0.0:
            v = g if first else momentum * velocity[i] + g
            velocity[i] = v
            g = v
        params[i] -= lr * g


@njit(**_JIT)
def _adam_step(
    params: np.ndarray, grads: np.ndarray, grad_scale: float, m: np.ndarray, v: np.ndarray,
    step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
) -> None:
    bias1 = 1.0 - beta1**step
    bias2_sqrt = np.sqrt(1.0 - beta2**step)
    step_size = lr / bias1
    for i in range(params.size):
        g = grad_scale * grads[i] + weight_decay * params[i]
        m[i] = beta1 * m[i] + (1.0 - beta1) * g
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g
        params[i] -= step_size * m[i] / (np.sqrt(v[i]) / bias2_sqrt + eps)


class Optimizer:
    """Updates a flat parameter vector in place from a flat gradient vector."""

    def __init__(self, config: TrainConfig, size: int) -> None:
        self.config = config
        self.steps = 0
        self.first_moment = np.zeros(size, np.float32)  # SGD velocity, or Adam's m
        self.second_moment = np.zeros(size if config.optimizer == "adam" else 0, np.float32)
        # The gradient widened to float64 for its norm, kept from step to step: two fresh
        # megabyte-sized copies a step cost more page faults than the whole update.
        self._wide = np.empty(size, np.float64)

    def step(self, params: np.ndarray, grads: np.ndarray, lr: float | None = None) -> None:
        """One update: params -= f(grads, state), at `lr` (default: the configured one)."""
        cfg = self.config
        lr = cfg.lr if lr is None else lr
        self.steps += 1
        scale = clip_scale(grads, cfg.clip_norm, self._wide)
        if cfg.optimizer == "sgd":
            _sgd_step(params, grads, scale, self.first_moment, lr, cfg.momentum,
                      cfg.weight_decay, self.steps == 1)
        else:
            _adam_step(params, grads, scale, self.first_moment, self.second_moment,
                       self.steps, lr, 0.9, 0.999, 1e-8, cfg.weight_decay)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The optimizer state as arrays, for checkpoints."""
        return {"steps": np.array(self.steps), "first_moment": self.first_moment.copy(),
                "second_moment": self.second_moment.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned."""
        if state["first_moment"].shape != self.first_moment.shape:
            raise ValueError("optimizer state does not match the model size")
        self.steps = int(state["steps"])
        self.first_moment[...] = state["first_moment"]
        self.second_moment[...] = state["second_moment"]


def clip_scale(grads: np.ndarray, max_norm: float, wide: np.ndarray | None = None) -> float:
    """The factor that shortens `grads` to global L2 norm `max_norm` (1 when it is shorter).

    PyTorch's `clip_grad_norm_(params, max_norm)`, over the whole flat gradient: in the
    mesh the edge holds that vector after the reduction, so the norm is the same one.
    The norm is taken in float64 (BLAS's dot); `wide`, a float64 array of the gradient's
    shape, holds the widened copy (else a new one is made).
    """
    if max_norm <= 0.0:
        return 1.0
    if wide is None or wide.shape != grads.shape:
        wide = np.empty(grads.shape, np.float64)
    np.copyto(wide, grads)
    norm = float(np.sqrt(np.dot(wide, wide)))
    return min(1.0, max_norm / (norm + 1e-6))


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """The learning rate of update `step` (0-based) out of `total_steps`.

    A linear warm-up over the first w = round(warmup_fraction * total_steps) updates
    (lr/w, 2 lr/w, ..., lr), then the schedule over the updates that remain: constant, or
    a cosine decay towards 0.
    """
    warmup = round(config.warmup_fraction * total_steps)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    if config.schedule == "constant" or total_steps - warmup <= 1:
        return config.lr
    progress = (step - warmup) / (total_steps - warmup)
    return 0.5 * config.lr * (1.0 + math.cos(math.pi * progress))
