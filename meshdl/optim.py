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

_JIT = {"cache": True, "fastmath": True, "nogil": True, "boundscheck": False}


@njit(**_JIT)
def _sgd_step(
    params: np.ndarray, grads: np.ndarray, velocity: np.ndarray,
    lr: float, momentum: float, weight_decay: float, first: bool,
) -> None:
    for i in range(params.size):
        g = grads[i] + weight_decay * params[i]
        if momentum > 0.0:
            v = g if first else momentum * velocity[i] + g
            velocity[i] = v
            g = v
        params[i] -= lr * g


@njit(**_JIT)
def _adam_step(
    params: np.ndarray, grads: np.ndarray, m: np.ndarray, v: np.ndarray, step: int,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
) -> None:
    bias1 = 1.0 - beta1**step
    bias2_sqrt = np.sqrt(1.0 - beta2**step)
    step_size = lr / bias1
    for i in range(params.size):
        g = grads[i] + weight_decay * params[i]
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

    def step(self, params: np.ndarray, grads: np.ndarray, lr: float | None = None) -> None:
        """One update: params -= f(grads, state), at `lr` (default: the configured one)."""
        cfg = self.config
        lr = cfg.lr if lr is None else lr
        self.steps += 1
        if cfg.optimizer == "sgd":
            _sgd_step(params, grads, self.first_moment, lr, cfg.momentum,
                      cfg.weight_decay, self.steps == 1)
        else:
            _adam_step(params, grads, self.first_moment, self.second_moment, self.steps,
                       lr, 0.9, 0.999, 1e-8, cfg.weight_decay)

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


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """The learning rate of update `step` (0-based) out of `total_steps`."""
    if config.schedule == "constant" or total_steps <= 1:
        return config.lr
    return 0.5 * config.lr * (1.0 + math.cos(math.pi * step / total_steps))
