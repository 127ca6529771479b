"""The training loop shared by every mode: batches, optimizer, epochs, metrics.

What differs between modes is only *where* the loss and gradients of a batch are
computed: `CentralEngine` runs the whole network in this process; the mesh engine
runs convolution and pooling in the sensor nodes. The loop, the batch order, the
normalization constants and the optimizer are the same, which is what lets the
mesh be checked against the centralized model step by step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import ValidationError

from meshdl.blas import one_blas_thread
from meshdl.config import RunConfig, TrainConfig
from meshdl.data.augment import as_read_by, orientations, originals, training_data
from meshdl.data.datasets import Dataset
from meshdl.errors import MeshdlError, NonFiniteError, StepSkipped, UsageError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.model.threads import ThreadChooser
from meshdl.training.checkpoint import Checkpoint, save_checkpoint
from meshdl.training.cumulative import SoFar, add_comm
from meshdl.training.failout import failout_cells


class Engine(Protocol):
    """Computes one batch's loss, logits and flat gradient for the model's parameters."""

    train_samples: int  # maps of the training split it holds (mirrors included)

    def loss_and_grads(self, model: CNN, indices: np.ndarray,
                       failout: np.ndarray | None = None
                       ) -> tuple[float, np.ndarray, np.ndarray]: ...

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray: ...

    def report(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class Stalls(Protocol):
    """An engine that may wait long for one batch, and says so first: `on_stall` is
    called as it begins to wait (MqttEngine: a wave tried on past its attempts while a
    flood loses its messages). The loop sets it to keep a checkpoint of the updates done
    so far, so that a run stopped while the engine waits loses none of them."""

    on_stall: Callable[[], None] | None


class CentralEngine:
    """Everything in this process: the reference every other engine must equal."""

    def __init__(self, data: Dataset, quantized: bool = False) -> None:
        """`quantized`: inference is the central int8 emulation (`CNN.forward`)."""
        self.splits = {"train": (data.X_train, data.y_train), "test": (data.X_test, data.y_test)}
        self.quantized = quantized
        self.train_samples = len(data.y_train)
        # Maps before mirrors (a bare stand-in without `meta` holds none).
        self.originals = originals(data) if hasattr(data, "meta") else self.train_samples
        # Each pass on the thread count fastest on this machine at the moment (1 or all
        # cores for the conv kernels, 1 for BLAS): the same bits whichever runs.
        self.threads = ThreadChooser()

    def loss_and_grads(self, model: CNN, indices: np.ndarray,
                       failout: np.ndarray | None = None
                       ) -> tuple[float, np.ndarray, np.ndarray]:
        X, y = self.splits["train"]
        # Which mirror each map is (`augment.batches`' index o x n + i): a position bias
        # flips with its map, the room's installations and all.
        orientation = indices // self.originals \
            if model.config.position_bias and self.originals < len(y) else None
        loss, logits = self.threads.run(
            ("step", len(indices)),
            lambda: model.gradient_pass(X[indices], y[indices], failout, orientation))
        return loss, logits, model.grad_flat

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray:
        X, _ = self.splits[split]
        return self.threads.run(("forward", len(indices)),
                                lambda: model.forward(X[indices], quantized=self.quantized))

    def report(self) -> dict[str, Any]:
        return {}  # nothing crosses a network

    def close(self) -> None:
        """Nothing to release."""


def engine_for(config: RunConfig, data: Dataset) -> Engine:
    """The engine of `config.mode`: this process, or the virtual mesh."""
    if config.mode == "central":
        # int8-static: what a mesh under it computes, centrally (inference only: `train`)
        return CentralEngine(data, config.mesh.activations == "int8-static")
    from meshdl.sim.mesh import MeshEngine  # the simulator is only loaded when used

    # Its nodes hold each cell's values as the model reads them (the alive mask too).
    return MeshEngine(as_read_by(data, config.model), edge_at=config.mesh.edge_at,
                      mesh_id=config.mesh.mesh_id,
                      wire=config.mesh.wire, params_via=config.mesh.params_via,
                      max_message_bytes=config.mesh.max_message_bytes,
                      auth=config.mesh.auth, compress=config.mesh.compress,
                      activations=config.mesh.activations, delta=config.mesh.delta,
                      compiled=config.mesh.dispatch == "compiled")


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
    """A run's record, every stretch of it: a run resumed from a checkpoint starts with
    what the checkpoint carries (`restore`) and adds its own."""

    epochs: list[EpochMetrics] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)  # see `final_metrics`
    wall_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=dict)  # the engine's network report
    # Several meshes (meshdl/training/parallel.py): the server's and each mesh's figures.
    parallel: dict[str, Any] = field(default_factory=dict)
    # Each time the run went on from a checkpoint: where (`resume_point`).
    resumed_from: list[dict[str, Any]] = field(default_factory=list)


ProgressFn = Callable[[int, int, int, float], None]  # (epoch, step, steps_per_epoch, loss)
EpochFn = Callable[["EpochMetrics"], None]  # an epoch is over (its test accuracy known)


def normalization(X: np.ndarray, alive: bool = False) -> tuple[float, float]:
    """Mean and standard deviation of every training reading: fixed before training.

    Scalars over all cells, so each node can normalize its own reading alone (and a
    mesh can compute them with one sum/sum-of-squares reduction up the tree).
    `alive`: X's maps (N, C, rows, cols) end with the alive mask, which is no reading
    (the model keeps it at mean 0, std 1: `CNN.set_normalization`).
    """
    if alive:
        X = X[:, :-1]
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


@one_blas_thread  # the same bits whatever the machine's cores (meshdl/blas.py)
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
    to go on from (same configuration, or more epochs where `extension_refusal` allows),
    ending where the uninterrupted run would. The history is the whole run's: a resumed
    run's counts, wall time and epochs include those before its checkpoint."""
    if config.mode == "mesh" and config.mesh.activations == "int8-static":
        raise UsageError("--activations int8-static is inference only (its scales are "
                         "calibrated on the trained model): train with float32, then "
                         "infer with int8-static")
    if (data.rows, data.cols) != (config.model.rows, config.model.cols):
        raise UsageError(
            f"data grid {data.rows} x {data.cols} does not match model grid "
            f"{config.model.rows} x {config.model.cols} (--rows/--cols or the config "
            "file): drop them or pass data of that grid"
        )
    data.require_classes(config.model.classes)  # before any engine connects or computes
    started = time.perf_counter()
    tc = config.train
    # An engine given by the caller holds the same view.
    data = training_data(tc, data, config.model)
    model = CNN(config.model, seed=tc.seed)
    model.set_normalization(*normalization(data.X_train, config.model.alive))
    created = engine is None
    engine = engine or engine_for(config, data)
    held = getattr(engine, "data", None)  # a mesh engine's nodes read their cells of it
    if engine.train_samples != len(data.y_train) or (
            isinstance(held, Dataset) and held.channels != data.channels):
        raise MeshdlError(
            f"the engine holds {engine.train_samples} training maps but this run trains on "
            f"{len(data.y_train)} (augment={tc.augment}, {data.channels} values a cell): "
            "build the engine and its nodes on "
            "augment.training_data(config.train, data, config.model)")
    try:
        optimizer = Optimizer(tc, model.flat.size)
        rng = np.random.default_rng(tc.seed)
        history = History()
        if resume is not None:
            restore(resume, config, model, optimizer, rng, history)
        n_train, n_test = originals(data), len(data.y_test)
        test_pred = np.empty(0, np.int64)
        per_epoch = -(-n_train // tc.batch)
        total = tc.epochs * per_epoch  # updates in the whole run
        # Where a resumed run picks up inside its next epoch: steps done, loss, hits and
        # (best effort) steps skipped and their samples so far.
        within = (0, 0.0, 0, 0, 0) if resume is None else \
            (resume.steps_done, resume.epoch_loss, resume.epoch_correct,
             resume.epoch_skipped, resume.epoch_skipped_samples)

        def keep(batch_order: dict[str, Any], **position: Any) -> None:
            """A checkpoint of the run up to here, its earlier stretches included."""
            if checkpoints is not None:
                so_far = SoFar(history.wall_s + time.perf_counter() - started,
                               add_comm(history.comm, engine.report()))
                save_checkpoint(checkpoints, checkpoint_of(
                    config, model, optimizer, history, batch_order, **position,
                    so_far=so_far))

        def keep_on_stall(position: Callable[[], None] | None) -> None:
            """What the engine calls if it begins to wait long (`Stalls`): a checkpoint
            of the updates done (None: nothing done yet, or nothing to keep)."""
            if isinstance(engine, Stalls):
                engine.on_stall = position if checkpoints is not None else None
        for epoch in range(len(history.epochs) + 1, tc.epochs + 1):
            epoch_start = rng.bit_generator.state  # draws this epoch's batches again
            epoch_batches = batches(n_train, tc.batch, rng, orientations(tc))
            applied, loss_sum, correct, skipped, skipped_samples = within
            within = (0, 0.0, 0, 0, 0)

            for step, idx in enumerate(epoch_batches[applied:], applied + 1):
                keep_on_stall(partial(keep, epoch_start, steps_done=applied,
                                      loss_sum=loss_sum, correct=correct,
                                      skipped=(skipped, skipped_samples))
                              if applied + epoch > 1 else None)
                # Failout: the cells acting dead in this update (a skipped one too).
                failed = () if not (tc.failout or tc.failout_max) else (failout_cells(
                    config.model.rows, config.model.cols, tc.failout, tc.seed,
                    (epoch - 1) * per_epoch + step - 1, tc.failout_max,
                    tc.failout_clean),)
                try:
                    # Overflow in a diverging run is no warning to print: the check
                    # below turns it into one clean error.
                    with np.errstate(over="ignore", invalid="ignore"):
                        loss, logits, grads = engine.loss_and_grads(model, idx, *failed)
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
                    if applied + epoch > 1:
                        keep(epoch_start, steps_done=applied, loss_sum=loss_sum,
                             correct=correct, skipped=(skipped, skipped_samples))
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
            keep_on_stall(partial(keep, epoch_start, steps_done=applied, loss_sum=loss_sum,
                                  correct=correct, skipped=(skipped, skipped_samples)))
            try:
                # A run blown up but still finite (a huge --lr) may overflow its logits:
                # the argmax still says something, numpy's warning nothing.
                with np.errstate(over="ignore", invalid="ignore"):
                    test_pred = predictions(engine, model, "test", n_test)
            except MeshdlError:  # every update of the epoch done, its evaluation not
                keep(epoch_start, steps_done=applied, loss_sum=loss_sum, correct=correct,
                     skipped=(skipped, skipped_samples))
                raise
            learned = n_train - skipped_samples  # none, if every step was skipped
            history.epochs.append(EpochMetrics(
                epoch=epoch,
                train_loss=loss_sum / learned if learned else float("nan"),
                train_acc=correct / learned if learned else float("nan"),
                test_acc=float(np.mean(test_pred == data.y_test)) if n_test else float("nan"),
                skipped_steps=skipped,
            ))
            keep(rng.bit_generator.state)
            keep_on_stall(None)  # every epoch so far is in that checkpoint
            if on_epoch is not None:
                on_epoch(history.epochs[-1])
        with np.errstate(over="ignore", invalid="ignore"):  # as each epoch's
            if len(test_pred) != n_test:  # resumed after the last epoch: nothing ran
                test_pred = predictions(engine, model, "test", n_test)
            train_pred = predictions(engine, model, "train", n_train)
        history.final = final_metrics(config.model.classes, train_pred,
                                      data.y_train[:n_train], test_pred, data.y_test)
        # Static int8 inference's scales (meshdl/model/quantize.py), fixed now that training
        # is over: the largest value of each layer on the training maps.
        model.calibrate(data.X_train[:n_train])
        history.comm = add_comm(history.comm, engine.report())
    finally:
        if isinstance(engine, Stalls):  # the engine outlives this run: no hold on it
            engine.on_stall = None
        if created:  # an engine given by the caller is the caller's to close
            engine.close()
    history.wall_s += time.perf_counter() - started
    return model, history


def checkpoint_of(config: RunConfig, model: CNN, optimizer: Optimizer, history: History,
                batch_order: dict[str, Any], steps_done: int = 0, loss_sum: float = 0.0,
                correct: int = 0, skipped: tuple[int, int] = (0, 0),
                so_far: SoFar | None = None) -> Checkpoint:
    """The run's state after the epochs in `history` and `steps_done` updates of the
    next, whose batches `batch_order` (a generator state) draws; `so_far`: the whole
    run's wall time and counts up to here, for the metrics of the run resumed from it."""
    so_far = so_far or SoFar()
    return Checkpoint(config=config.model_dump(mode="json"), epochs_done=len(history.epochs),
                      params=model.flat.copy(), optimizer=optimizer.state_dict(),
                      batch_order=batch_order, epochs=[asdict(e) for e in history.epochs],
                      steps_done=steps_done, epoch_loss=loss_sum, epoch_correct=correct,
                      epoch_skipped=skipped[0], epoch_skipped_samples=skipped[1],
                      wall_s=so_far.wall_s, comm=so_far.comm, parallel=so_far.parallel,
                      resumed_from=list(history.resumed_from))


def extension_refusal(train: TrainConfig, epochs_before: int) -> str | None:
    """Why a run of `epochs_before` epochs may not go on to `train.epochs`, or None.

    A run goes on to more epochs only if it then is the run it would have been had it
    been started with them: every update's learning rate must not depend on the run's
    total of updates. The warm-up's length and the cosine decay do (a cosine run ends
    at a learning rate near 0, and its updates so far followed a decay over the shorter
    run); a constant learning rate without warm-up does not."""
    if train.epochs <= epochs_before:
        return (f"the run has {epochs_before} epochs already: a resumed run goes on to "
                "more epochs only")
    if train.schedule == "constant" and train.warmup_fraction == 0:
        return None
    shape = " and ".join(
        part for part in (f"a warm-up over {train.warmup_fraction:g} of them"
                          if train.warmup_fraction else "",
                          "a cosine decay to 0" if train.schedule == "cosine" else "")
        if part)
    return (f"its learning rate follows its {epochs_before} epochs ({shape}), so more "
            "epochs would not be the run started with them; only a run with a constant "
            "learning rate and no warm-up (schedule = \"constant\", --warmup 0) goes on "
            f"to more epochs (else train a new run with --epochs {train.epochs})")


def resume_point(checkpoint: Checkpoint) -> dict[str, Any]:
    """metrics.json's record of one resume: where the run went on from (epochs done and
    updates done of the next), the epochs it then had, and its wall time so far."""
    return {"epochs_done": checkpoint.epochs_done, "steps_done": checkpoint.steps_done,
            "epochs_planned": int(checkpoint.config.get("train", {}).get("epochs", 0)),
            "wall_s": round(checkpoint.wall_s, 3)}


def restore(checkpoint: Checkpoint, config: RunConfig, model: CNN, optimizer: Optimizer,
             rng: np.random.Generator, history: History) -> None:
    """Put a run's saved state into its freshly made parts, and its record so far into
    `history` (to which the resumed stretch adds its own)."""
    check_same_run(checkpoint.config, config)
    if checkpoint.params.shape != model.flat.shape:
        raise MeshdlError("the checkpoint's parameters do not fit this model")
    model.flat[...] = checkpoint.params
    optimizer.load_state_dict(checkpoint.optimizer)
    rng.bit_generator.state = checkpoint.batch_order  # draws the next epoch's batches
    history.epochs = [EpochMetrics(**e) for e in checkpoint.epochs]
    history.wall_s, history.comm = checkpoint.wall_s, dict(checkpoint.comm)
    history.parallel = dict(checkpoint.parallel)
    history.resumed_from = [*checkpoint.resumed_from, resume_point(checkpoint)]


def check_same_run(saved: dict[str, Any], config: RunConfig) -> None:
    """The checkpoint's run is `config`'s, or `config` is it with more epochs where
    `extension_refusal` allows; else MeshdlError saying which."""
    now = config.model_dump(mode="json")
    # A checkpoint from before a field was added holds its default (one that does not
    # validate is compared as it is: it differs).
    with contextlib.suppress(ValidationError):
        saved = type(config).model_validate(saved).model_dump(mode="json")
    if saved == now:
        return
    before = saved.get("train", {}).get("epochs") if isinstance(saved.get("train"), dict) \
        else None
    if isinstance(before, int) and saved == {**now, "train": {**now["train"],
                                                                "epochs": before}}:
        if (why := extension_refusal(config.train, before)) is not None:
            raise MeshdlError(f"the checkpoint's run cannot go on to {config.train.epochs} "
                              f"epochs: {why}")
        return
    raise MeshdlError("the checkpoint was written by a run with another configuration; "
                      "resume it with its own (the run directory's config.json)")
