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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.augment import orientations, originals, training_data
from meshdl.data.datasets import Dataset
from meshdl.errors import MeshdlError, NonFiniteError, StepSkipped, UsageError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.training.checkpoint import Checkpoint, save_checkpoint


class Engine(Protocol):
    """Computes one batch's loss, logits and flat gradient for the model's parameters."""

    train_samples: int  # maps of the training split it holds (mirrors included)

    def loss_and_grads(self, model: CNN, indices: np.ndarray) -> tuple[float, np.ndarray,
                                                                       np.ndarray]: ...

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray: ...

    def report(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class CentralEngine:
    """Everything in this process: the reference every other engine must equal."""

    def __init__(self, data: Dataset) -> None:
        self.splits = {"train": (data.X_train, data.y_train), "test": (data.X_test, data.y_test)}
        self.train_samples = len(data.y_train)

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
                      wire=config.mesh.wire, params_via=config.mesh.params_via,
                      max_message_bytes=config.mesh.max_message_bytes,
                      auth=config.mesh.auth, compress=config.mesh.compress,
                      activations=config.mesh.activations, delta=config.mesh.delta)


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float  # mean over the epoch's batches, before each update
    train_acc: float  # running accuracy of those same forward passes
    test_acc: float  # the model after the epoch, on the whole test split
    # Best effort: batches whose wave missed its deadline, so no update (their samples
    # are left out of train_loss and train_acc).
    skipped_steps: int = 0


@dataclass
class History:
    epochs: list[EpochMetrics] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)  # see `final_metrics`
    wall_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=dict)  # the engine's network report
    # Several meshes (meshdl/training/parallel.py): the server's and each mesh's figures.
    parallel: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[int, int, int, float], None]  # (epoch, step, steps_per_epoch, loss)
EpochFn = Callable[["EpochMetrics"], None]  # an epoch is over (its test accuracy known)


def normalization(X: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of every training reading: fixed before training.

    Scalars over all cells, so each node can normalize its own reading alone (and a
    mesh can compute them with one sum/sum-of-squares reduction up the tree).
    """
    mean = float(np.mean(X, dtype=np.float64))
    std = float(np.std(X, dtype=np.float64))
    return mean, (std if std > 1e-6 else 1.0)


def batches(n: int, batch: int, rng: np.random.Generator,
            orientations: int = 1) -> list[np.ndarray]:
    """One epoch's shuffled sample indices, cut into batches (the last may be short).

    With mirrors (`augment.training_data`) sample i appears in orientation o at index
    o * n + i; each epoch draws one orientation per sample, so it still has n samples.
    """
    order = rng.permutation(n)
    if orientations > 1:
        order += n * rng.integers(0, orientations, n)
    return [order[i : i + batch] for i in range(0, n, batch)]


EVAL_BATCH = 1024  # samples per evaluation pass: in the mesh, one inference wave each


def predictions(engine: Engine, model: CNN, split: str, n: int,
                batch: int = EVAL_BATCH) -> np.ndarray:
    """The predicted class of each of the `n` samples of `split`, in batches of `batch`."""
    out = np.empty(n, np.int64)
    for start in range(0, n, batch):
        idx = np.arange(start, min(start + batch, n))
        out[idx] = engine.logits(model, split, idx).argmax(axis=1)
    return out


def final_metrics(classes: int, train_pred: np.ndarray, y_train: np.ndarray,
                  test_pred: np.ndarray, y_test: np.ndarray) -> dict[str, Any]:
    """`History.final`: accuracies, how often each class was predicted, and whether the
    model ended predicting one class for every sample (a collapsed run, which an
    accuracy near the majority share alone does not tell apart from a weak one)."""
    def share(pred: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(pred == y)) if len(y) else float("nan")

    per_class = {split: np.bincount(pred, minlength=classes).tolist()
                 for split, pred in (("train", train_pred), ("test", test_pred))}
    used = np.flatnonzero(np.add(per_class["train"], per_class["test"]))
    return {
        "train_acc": share(train_pred, y_train),
        "test_acc": share(test_pred, y_test),
        "predicted_per_class": per_class,
        "single_class": bool(len(used) == 1),
    }


def train(
    config: RunConfig,
    data: Dataset,
    engine: Engine | None = None,
    progress: ProgressFn | None = None,
    checkpoints: Path | None = None,
    resume: Checkpoint | None = None,
    on_epoch: EpochFn | None = None,
) -> tuple[CNN, History]:
    """Fit a fresh model to `data` as `config` says; returns the model and its history.

    `checkpoints`: a folder to write a checkpoint into after every epoch; `resume`: one
    to go on from (same configuration), ending where the uninterrupted run would."""
    if (data.rows, data.cols) != (config.model.rows, config.model.cols):
        raise UsageError(
            f"data grid {data.rows} x {data.cols} does not match model grid "
            f"{config.model.rows} x {config.model.cols} (pass --rows/--cols or other data)"
        )
    data.require_classes(config.model.classes)  # before any engine connects or computes
    started = time.perf_counter()
    tc = config.train
    data = training_data(tc, data)  # an engine given by the caller holds the same view
    model = CNN(config.model, seed=tc.seed)
    model.set_normalization(*normalization(data.X_train))
    created = engine is None
    engine = engine or engine_for(config, data)
    if engine.train_samples != len(data.y_train):
        raise MeshdlError(
            f"the engine holds {engine.train_samples} training maps but this run trains on "
            f"{len(data.y_train)} (augment={tc.augment}): build the engine and its nodes "
            "on augment.training_data(config.train, data)")
    try:
        optimizer = Optimizer(tc, model.flat.size)
        rng = np.random.default_rng(tc.seed)
        history = History()
        if resume is not None:
            restore(resume, config, model, optimizer, rng, history)
        n_train, n_test = originals(data), len(data.y_test)
        test_pred = np.empty(0, np.int64)
        total = tc.epochs * -(-n_train // tc.batch)  # updates in the whole run
        # Where a resumed run picks up inside its next epoch: steps done, loss, hits and
        # (best effort) steps skipped and their samples so far.
        within = (0, 0.0, 0, 0, 0) if resume is None else \
            (resume.steps_done, resume.epoch_loss, resume.epoch_correct,
             resume.epoch_skipped, resume.epoch_skipped_samples)
        for epoch in range(len(history.epochs) + 1, tc.epochs + 1):
            epoch_start = rng.bit_generator.state  # draws this epoch's batches again
            epoch_batches = batches(n_train, tc.batch, rng, orientations(tc))
            applied, loss_sum, correct, skipped, skipped_samples = within
            within = (0, 0.0, 0, 0, 0)

            for step, idx in enumerate(epoch_batches[applied:], applied + 1):
                try:
                    # Overflow in a diverging run is no warning to print: the check
                    # below turns it into one clean error.
                    with np.errstate(over="ignore", invalid="ignore"):
                        loss, logits, grads = engine.loss_and_grads(model, idx)
                except StepSkipped:  # best effort: nothing came to learn from
                    applied = step
                    skipped += 1
                    skipped_samples += len(idx)
                    if progress:
                        progress(epoch, step, len(epoch_batches), float("nan"))
                    continue
                except NonFiniteError:
                    loss = float("nan")
                except MeshdlError:  # the engine gave up: keep what is done, exactly
                    if checkpoints is not None and applied + epoch > 1:
                        save_checkpoint(checkpoints, checkpoint_of(
                            config, model, optimizer, history, epoch_start,
                            steps_done=applied, loss_sum=loss_sum, correct=correct,
                            skipped=(skipped, skipped_samples)))
                    raise
                else:
                    with np.errstate(over="ignore", invalid="ignore"):  # as above
                        optimizer.step(model.flat, grads,
                                       learning_rate(tc, optimizer.steps, total))
                with np.errstate(over="ignore", invalid="ignore"):  # inf + -inf: NaN, said
                    finite = np.isfinite(loss) and np.isfinite(model.flat.sum(dtype=np.float64))
                if not finite:
                    raise MeshdlError(
                        f"training diverged at epoch {epoch}, step {step} (loss {loss}); "
                        f"lower the learning rate (now {tc.lr})"
                    )
                applied = step
                loss_sum += loss * len(idx)
                correct += int(np.sum(logits.argmax(axis=1) == data.y_train[idx]))
                if progress:
                    progress(epoch, step, len(epoch_batches), loss)
            try:
                # A run blown up but still finite (a huge --lr) may overflow its logits:
                # the argmax still says something, numpy's warning nothing.
                with np.errstate(over="ignore", invalid="ignore"):
                    test_pred = predictions(engine, model, "test", n_test)
            except MeshdlError:  # every update of the epoch done, its evaluation not
                if checkpoints is not None:
                    save_checkpoint(checkpoints, checkpoint_of(
                        config, model, optimizer, history, epoch_start,
                        steps_done=applied, loss_sum=loss_sum, correct=correct,
                        skipped=(skipped, skipped_samples)))
                raise
            learned = n_train - skipped_samples  # none, if every step was skipped
            history.epochs.append(EpochMetrics(
                epoch=epoch,
                train_loss=loss_sum / learned if learned else float("nan"),
                train_acc=correct / learned if learned else float("nan"),
                test_acc=float(np.mean(test_pred == data.y_test)) if n_test else float("nan"),
                skipped_steps=skipped,
            ))
            if checkpoints is not None:
                save_checkpoint(checkpoints, checkpoint_of(config, model, optimizer, history,
                                                         rng.bit_generator.state))
            if on_epoch is not None:
                on_epoch(history.epochs[-1])
        with np.errstate(over="ignore", invalid="ignore"):  # as each epoch's
            if len(test_pred) != n_test:  # resumed after the last epoch: nothing ran
                test_pred = predictions(engine, model, "test", n_test)
            train_pred = predictions(engine, model, "train", n_train)
        history.final = final_metrics(config.model.classes, train_pred,
                                      data.y_train[:n_train], test_pred, data.y_test)
        history.comm = engine.report()
    finally:
        if created:  # an engine given by the caller is the caller's to close
            engine.close()
    history.wall_s = time.perf_counter() - started
    return model, history


def checkpoint_of(config: RunConfig, model: CNN, optimizer: Optimizer, history: History,
                batch_order: dict[str, Any], steps_done: int = 0, loss_sum: float = 0.0,
                correct: int = 0, skipped: tuple[int, int] = (0, 0)) -> Checkpoint:
    """The run's state after the epochs in `history` and `steps_done` updates of the
    next, whose batches `batch_order` (a generator state) draws."""
    return Checkpoint(config=config.model_dump(mode="json"), epochs_done=len(history.epochs),
                      params=model.flat.copy(), optimizer=optimizer.state_dict(),
                      batch_order=batch_order, epochs=[asdict(e) for e in history.epochs],
                      steps_done=steps_done, epoch_loss=loss_sum, epoch_correct=correct,
                      epoch_skipped=skipped[0], epoch_skipped_samples=skipped[1])


def restore(checkpoint: Checkpoint, config: RunConfig, model: CNN, optimizer: Optimizer,
             rng: np.random.Generator, history: History) -> None:
    """Put a run's saved state into its freshly made parts."""
    if checkpoint.config != config.model_dump(mode="json"):
        raise MeshdlError("the checkpoint was written by a run with another configuration; "
                          "resume it with its own (the run directory's config.json)")
    if checkpoint.params.shape != model.flat.shape:
        raise MeshdlError("the checkpoint's parameters do not fit this model")
    model.flat[...] = checkpoint.params
    optimizer.load_state_dict(checkpoint.optimizer)
    rng.bit_generator.state = checkpoint.batch_order  # draws the next epoch's batches
    history.epochs = [EpochMetrics(**e) for e in checkpoint.epochs]
