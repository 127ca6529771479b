"""Training checkpoints: what a run needs to go on exactly where it stopped.

`train` writes `checkpoint.npz` into the run directory at the end of every epoch, and
also when its engine gives up in the middle of one (the broker away for longer than the
edge's patience, node hosts gone); `meshdl train --resume RUN_DIR` (or `meshdl edge run
--resume RUN_DIR`) continues from it. It holds the parameters, the optimizer's state,
the position in the run (epochs done, and updates done of the next epoch with their
loss and hits so far), the state of the generator that draws the next epoch's batch
order, the metrics of the epochs done, and the run's configuration, which the resumed
run must match. It also carries what the run did so far for its metrics.json, which
outlives the process: wall time, the engine's "comm" counts (and, of several meshes,
the "parallel" record) summed over every stretch the run was trained in, and where it
was resumed from before. As the batches are drawn again from the saved generator state, a run
stopped anywhere and resumed ends with exactly the parameters of a run never stopped
(a run killed outright computes its interrupted epoch again).

The file is written next to its final name and renamed over it, so a kill mid-write
leaves the previous checkpoint; it is read without pickle and checked field by field.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.data.npzfile import read_npz
from meshdl.errors import MeshdlError

CHECKPOINT = "checkpoint.npz"


@dataclass
class Checkpoint:
    """A run's state after epoch `epochs_done` and `steps_done` updates of the next."""

    config: dict[str, Any]  # RunConfig.model_dump(mode="json")
    epochs_done: int
    params: np.ndarray  # the model's flat float32 parameters
    optimizer: dict[str, np.ndarray]  # Optimizer.state_dict()
    batch_order: dict[str, Any]  # the batch generator's bit_generator.state
    epochs: list[dict[str, Any]]  # EpochMetrics of the epochs done, as dicts
    steps_done: int = 0  # updates of epoch epochs_done + 1 already applied ...
    epoch_loss: float = 0.0  # ... their summed loss (times batch size) ...
    epoch_correct: int = 0  # ... and correctly classified samples
    epoch_skipped: int = 0  # best effort: steps of it skipped (no update) ...
    epoch_skipped_samples: int = 0  # ... and their samples
    # What the run did up to this checkpoint, earlier stretches included (a run resumed
    # from here adds its own): seconds trained, the engine's "comm" report and the
    # "parallel" one, summed (meshdl/training/cumulative.py), and the points it was
    # resumed from ({"epochs_done", "steps_done", "wall_s"} each).
    wall_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=dict)
    parallel: dict[str, Any] = field(default_factory=dict)
    resumed_from: list[dict[str, Any]] = field(default_factory=list)


def save_checkpoint(folder: Path, checkpoint: Checkpoint) -> Path:
    """Write `checkpoint` into `folder` atomically; returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT
    meta = {"config": checkpoint.config, "epochs_done": checkpoint.epochs_done,
            "batch_order": checkpoint.batch_order, "epochs": checkpoint.epochs,
            "steps_done": checkpoint.steps_done, "epoch_loss": checkpoint.epoch_loss,
            "epoch_correct": checkpoint.epoch_correct,
            "epoch_skipped": checkpoint.epoch_skipped,
            "epoch_skipped_samples": checkpoint.epoch_skipped_samples,
            "wall_s": checkpoint.wall_s, "comm": checkpoint.comm,
            "parallel": checkpoint.parallel, "resumed_from": checkpoint.resumed_from}
    partial = path.with_name(f".{CHECKPOINT}.{os.getpid()}.partial")
    with partial.open("wb") as out:
        np.savez(out, params=checkpoint.params,
                 meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                 **{f"optimizer.{k}": v for k, v in checkpoint.optimizer.items()})
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    return path


def load_checkpoint(folder: Path) -> Checkpoint:
    """The checkpoint in `folder`; MeshdlError naming what is missing or wrong."""
    path = folder / CHECKPOINT
    if not path.is_file():
        raise MeshdlError(f"no checkpoint in {folder} (a run writes {CHECKPOINT} after "
                          "its first epoch)")
    stored = read_npz(path, "checkpoint", MeshdlError)
    try:
        meta = json.loads(stored.pop("meta").tobytes())
        optimizer = {k.removeprefix("optimizer."): stored.pop(k)
                     for k in list(stored) if k.startswith("optimizer.")}
        checkpoint = Checkpoint(config=meta["config"], epochs_done=int(meta["epochs_done"]),
                                params=stored["params"], optimizer=optimizer,
                                batch_order=meta["batch_order"], epochs=list(meta["epochs"]),
                                steps_done=int(meta.get("steps_done", 0)),
                                epoch_loss=float(meta.get("epoch_loss", 0.0)),
                                epoch_correct=int(meta.get("epoch_correct", 0)),
                                epoch_skipped=int(meta.get("epoch_skipped", 0)),
                                epoch_skipped_samples=int(
                                    meta.get("epoch_skipped_samples", 0)),
                                # absent from the checkpoints of earlier versions
                                wall_s=float(meta.get("wall_s", 0.0)),
                                comm=meta.get("comm", {}),
                                parallel=meta.get("parallel", {}),
                                resumed_from=meta.get("resumed_from", []))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise MeshdlError(f"{path} is not a readable checkpoint ({exc})") from None
    if checkpoint.params.dtype != np.float32 or checkpoint.params.ndim != 1 or \
            set(optimizer) != {"steps", "first_moment", "second_moment"} or \
            not isinstance(checkpoint.config, dict) or checkpoint.epochs_done < 0 or \
            not isinstance(checkpoint.comm, dict) or \
            not isinstance(checkpoint.parallel, dict) or \
            not isinstance(checkpoint.resumed_from, list) or \
            not all(isinstance(point, dict) for point in checkpoint.resumed_from) or \
            checkpoint.steps_done < 0 or checkpoint.epochs_done + checkpoint.steps_done < 1:
        raise MeshdlError(f"{path} is not a checkpoint of this version of meshdl")
    return checkpoint
