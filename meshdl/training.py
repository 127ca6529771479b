"""The training loop shared by every mode: batches, optimizer, epochs, metrics.

What differs between modes is only *where* the loss and gradients of a batch are
computed: `CentralEngine` runs the whole network in this process; the mesh engine
runs convolution and pooling in the sensor nodes. The loop, the batch order, the
normalization constants and the optimizer are the same, which is what lets the
mesh be checked against the centralized model step by step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from meshdl.config import RunConfig
from meshdl.data import Dataset
from meshdl.errors import MeshdlError, NonFiniteError
from meshdl.model import CNN
from meshdl.optim import Optimizer, learning_rate


class Engine(Protocol):
    """Computes one batch's loss, logits and flat gradient for the model's parameters."""

    def loss_and_grads(self, model: CNN, indices: np.ndarray) -> tuple[float, np.ndarray,
                                                                       np.ndarray]: ...

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray: ...

    def report(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class CentralEngine:
    """Everything in this process: the reference every other engine must equal."""

    def __init__(self, data: Dataset) -> None:
        self.splits = {"train": (data.X_train, data.y_train), "test": (data.X_test, data.y_test)}

    def loss_and_grads(self, model: CNN, indices: np.ndarray) -> tuple[float, np.ndarray,
                                                                       np.ndarray]:
        X, y = self.splits["train"]
        loss, logits = model.gradient_pass(X[indices], y[indices])
        return loss, logits, model.grad_flat

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray:
        X, _ = self.splits[split]
        return model.forward(X[indices])

    def report(self) -> dict[str, Any]:
        return {}  # nothing crosses a network

    def close(self) -> None:
        """Nothing to release."""


def engine_for(config: RunConfig, data: Dataset) -> Engine:
    """The engine of `config.mode`: this process, or the virtual mesh."""
    if config.mode == "central":
        return CentralEngine(data)
    from meshdl.sim.mesh import MeshEngine  # the simulator is only loaded when used

    return MeshEngine(data, edge_at=config.mesh.edge_at, mesh_id=config.mesh.mesh_id,
                      wire=config.mesh.wire, params_via=config.mesh.params_via)


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float  # mean over the epoch's batches, before each update
    train_acc: float  # running accuracy of those same forward passes
    test_acc: float  # the model after the epoch, on the whole test split


@dataclass
class History:
    epochs: list[EpochMetrics] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=dict)  # the engine's network report


ProgressFn = Callable[[int, int, int, float], None]  # (epoch, step, steps_per_epoch, loss)


def normalization(X: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of every training reading: fixed before training.

    Scalars over all cells, so each node can normalize its own reading alone (and a
    mesh can compute them with one sum/sum-of-squares reduction up the tree).
    """
    mean = float(np.mean(X, dtype=np.float64))
    std = float(np.std(X, dtype=np.float64))
    return mean, (std if std > 1e-6 else 1.0)


def batches(n: int, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled sample indices, cut into batches (the last may be short)."""
    order = rng.permutation(n)
    return [order[i : i + batch] for i in range(0, n, batch)]


EVAL_BATCH = 1024  # samples per evaluation pass: in the mesh, one inference wave each


def accuracy(engine: Engine, model: CNN, split: str, labels: np.ndarray,
             batch: int = EVAL_BATCH) -> float:
    """Fraction of `split` predicted right, evaluated in batches of `batch`."""
    if len(labels) == 0:
        return float("nan")
    correct = 0
    for start in range(0, len(labels), batch):
        idx = np.arange(start, min(start + batch, len(labels)))
        correct += int(np.sum(engine.logits(model, split, idx).argmax(axis=1) == labels[idx]))
    return correct / len(labels)


def train(
    config: RunConfig,
    data: Dataset,
    engine: Engine | None = None,
    progress: ProgressFn | None = None,
) -> tuple[CNN, History]:
    """Fit a fresh model to `data` as `config` says; returns the model and its history."""
    if (data.rows, data.cols) != (config.model.rows, config.model.cols):
        raise MeshdlError(
            f"data grid {data.rows} x {data.cols} does not match model grid "
            f"{config.model.rows} x {config.model.cols} (pass --rows/--cols or other data)"
        )
    started = time.perf_counter()
    tc = config.train
    model = CNN(config.model, seed=tc.seed)
    model.set_normalization(*normalization(data.X_train))
    created = engine is None
    engine = engine or engine_for(config, data)
    optimizer = Optimizer(tc, model.flat.size)
    rng = np.random.default_rng(tc.seed)
    history = History()
    n_train = len(data.y_train)
    total = tc.epochs * -(-n_train // tc.batch)  # updates in the whole run
    for epoch in range(1, tc.epochs + 1):
        epoch_batches = batches(n_train, tc.batch, rng)
        loss_sum, correct = 0.0, 0
        for step, idx in enumerate(epoch_batches, 1):
            try:
                loss, logits, grads = engine.loss_and_grads(model, idx)
            except NonFiniteError:
                loss = float("nan")
            else:
                optimizer.step(model.flat, grads, learning_rate(tc, optimizer.steps, total))
            if not (np.isfinite(loss) and np.isfinite(model.flat.sum(dtype=np.float64))):
                raise MeshdlError(
                    f"training diverged at epoch {epoch}, step {step} (loss {loss}); "
                    f"lower the learning rate (now {tc.lr})"
                )
            loss_sum += loss * len(idx)
            correct += int(np.sum(logits.argmax(axis=1) == data.y_train[idx]))
            if progress:
                progress(epoch, step, len(epoch_batches), loss)
        history.epochs.append(EpochMetrics(
            epoch=epoch,
            train_loss=loss_sum / n_train,
            train_acc=correct / n_train,
            test_acc=accuracy(engine, model, "test", data.y_test),
        ))
    history.final = {
        "train_acc": accuracy(engine, model, "train", data.y_train),
        "test_acc": history.epochs[-1].test_acc,
    }
    history.comm = engine.report()
    if created:
        engine.close()
    history.wall_s = time.perf_counter() - started
    return model, history
