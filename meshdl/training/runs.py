"""Run directories: where one `meshdl train` leaves its model, config and metrics.

A run directory holds `config.json` (the effective RunConfig and where the data came
from; written first), `checkpoint.npz` (after every epoch, for `--resume`), and at the
end `model.npz` (the model, PyTorch names) and `metrics.json`, whose schema users script
against:
    {"mode", "config", "epochs": [{"epoch", "train_loss", "train_acc", "test_acc"}],
     "final": {"train_acc", "test_acc", "predicted_per_class": {"train", "test"},
               "single_class"}, "wall_s"}
Later modes add keys (the mesh adds "comm"); none is ever renamed. A run resumed from its
checkpoint keeps the whole run: every epoch, "wall_s" and "comm" summed over the
stretches it was trained in, and "resumed_from": [{"epochs_done", "steps_done",
"epochs_planned", "wall_s"}], one record per resume (training/cumulative.py).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.errors import MeshdlError, UsageError
from meshdl.model.cnn import CNN
from meshdl.training.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint
from meshdl.training.loop import History, extension_refusal


def new_run_dir(root: Path = Path("runs"), name: str | None = None) -> Path:
    """A fresh `runs/<timestamp>-<name>/` directory (suffixed if the name is taken)."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "run").strip("-") or "run"
    base = root / f"{datetime.now():%Y%m%d-%H%M%S}-{label}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def metrics_record(config: RunConfig, history: History, extra: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The metrics.json document of a finished run."""
    return {
        "mode": config.mode,
        "config": config.model_dump(mode="json"),
        "epochs": [asdict(e) for e in history.epochs],
        "final": history.final,
        "wall_s": round(history.wall_s, 3),
        **({"resumed_from": history.resumed_from} if history.resumed_from else {}),
        **({"comm": history.comm} if history.comm else {}),
        **({"parallel": history.parallel} if history.parallel else {}),
        **(extra or {}),
    }


def single_class_warning(final: dict[str, Any]) -> str | None:
    """One line for a run that ended predicting one class for every sample, else None.

    Such a model is no detector at all, whatever its accuracy (the majority share).
    """
    if not final.get("single_class"):
        return None
    counts = final["predicted_per_class"]
    predicted = int(np.argmax(np.add(counts["train"], counts["test"])))
    return (f"warning: the model predicts class {predicted} for every sample (a collapsed "
            "run: it detects nothing); train longer (--epochs: a short run may not have left "
            "it yet), or again with another --seed or a lower --lr")


# What a run leaves in its directory: a directory holding any of them holds a run.
# `meshdl simulate` adds sim.json, trace.jsonl, energy.png and (live) alerts.jsonl,
# `meshdl report` report.html: --force clears them all, so that no file of the old run
# is left beside the new one's (a report.html of the old run beside a new sim.json).
RUN_FILES = ("config.json", "metrics.json", "model.npz", CHECKPOINT, "sim.json",
             "trace.jsonl", "energy.png", "alerts.jsonl", "report.html")
SYNTHETIC = "synthetic lounge"  # the data source of a run on the generated data set


@dataclass(frozen=True)
class RunDir:
    """A run directory this process may write a new run into."""

    path: Path
    created: bool  # made by this run: removed again if the run leaves nothing in it

    def abandon(self) -> None:
        """The run failed before its first checkpoint: take back its config.json, which
        only said what to resume (there is nothing), and the directory if it made it.
        Another run's `--out` then takes it again without --force."""
        if (self.path / CHECKPOINT).exists():
            return
        (self.path / "config.json").unlink(missing_ok=True)
        self._remove_if_made()

    def discard(self) -> None:
        """The run stopped where nothing can go on from it (a simulated run keeps no
        clock in its checkpoint): take back every run file it wrote, and the directory
        if it made it. (Its --out held no run files when it was claimed.)"""
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        self._remove_if_made()

    def _remove_if_made(self) -> None:
        if self.created:
            with contextlib.suppress(OSError):  # not empty: something else is in it
                self.path.rmdir()


def check_run_dir(out: Path, force: bool = False,
                  resume: str | None = "meshdl train") -> list[str]:
    """The run files in `out`, which a new run may write into; else one line
    (`UsageError`), naming `--force` and, where the run can go on, the `resume` command
    that goes on with it: a file, or a directory holding a run (unless `force`)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a run directory")
    found = [name for name in RUN_FILES if (out / name).exists()]
    if found and not force:
        go_on = f", or go on with it: {resume} --resume {out}" if resume else ""
        raise UsageError(f"--out {out} holds a run already ({', '.join(found)}): choose "
                         f"another --out, replace it with --force{go_on}")
    return found


def claim_run_dir(out: Path, force: bool = False,
                  resume: str | None = "meshdl train") -> RunDir:
    """`out` for a new run: refused as `check_run_dir` says (nothing changed), else made
    if need be. `force` removes the run files already there first (a stale checkpoint
    left beside a new config would be resumed into the wrong run, a stale report.html
    read as the new run's); an empty directory, or one holding other files only, is
    taken as it is."""
    found = check_run_dir(out, force, resume)
    for name in found:
        (out / name).unlink()
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    return RunDir(out, created)


def data_source_of(data: Path | None) -> str:
    """What config.json records as a run's data: the file's absolute path, so that
    `--resume` finds it from any working directory, or the synthetic lounge."""
    return SYNTHETIC if data is None else str(data.resolve())


def start_run(out: Path, config: RunConfig, data_source: str) -> None:
    """Write config.json into `out` before training: what `--resume` starts again from.
    A data file's path is recorded absolute (`--resume` from any directory)."""
    out.mkdir(parents=True, exist_ok=True)
    if data_source != SYNTHETIC:
        data_source = data_source_of(Path(data_source))
    record = {**config.model_dump(mode="json"), "data_source": data_source}
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")


def resumed_run(out: Path) -> tuple[RunConfig, str, Checkpoint]:
    """The configuration, data source and last checkpoint of the run in `out`."""
    try:
        record = json.loads((out / "config.json").read_text())
        source = record.pop("data_source")
        config = RunConfig.model_validate(record)
    except (OSError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise MeshdlError(f"{out} holds no run to resume: config.json is missing or "
                          f"unreadable ({exc})") from None
    return config, source, load_checkpoint(out)


def with_epochs(config: RunConfig, epochs: int | None) -> RunConfig:
    """The run `config` resumed with `--epochs epochs` (None: as it is): the same run
    with more epochs, where `loop.extension_refusal` allows; else one line saying why."""
    if epochs is None or epochs == config.train.epochs:
        return config
    record = config.model_dump(mode="json")
    extended = RunConfig.model_validate({**record, "train": {**record["train"],
                                                             "epochs": epochs}})
    why = extension_refusal(extended.train, config.train.epochs)
    if why is not None:
        raise UsageError(f"--epochs {epochs} with --resume: {why}; or drop --epochs")
    return extended


def finished_metrics(out: Path, config: RunConfig, checkpoint: Checkpoint
                     ) -> dict[str, Any] | None:
    """The metrics.json of the run in `out` if it has trained all of `config`'s epochs
    and written it (a resume then has nothing to do), else None."""
    if checkpoint.epochs_done < config.train.epochs or checkpoint.steps_done:
        return None
    try:
        return json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):  # stopped before writing it: the resume writes it
        return None


def nothing_to_resume(out: Path, config: RunConfig, command: str) -> str:
    """The one line of `--resume` on a finished run, which leaves it as it is; with how
    to train it for more epochs, where it can be."""
    tc = config.train
    more = tc.model_copy(update={"epochs": tc.epochs + 1})
    # `train` takes --epochs; `edge run` and `ps run` take the epochs of their mesh file.
    longer = "--epochs N" if command.startswith("meshdl train") else \
        "and a mesh file of more epochs ([train] epochs)"
    further = (f"for more epochs: {command} --resume {out} {longer}"
               if extension_refusal(more, tc.epochs) is None else
               "its learning-rate schedule spans exactly those epochs, so it cannot be "
               "extended: train a new run with more --epochs")
    return (f"not resuming {out}: it has trained all its {tc.epochs} epochs (metrics.json "
            f"left as it is); {further}")


def interrupted(out: Path, command: str) -> str:
    """The one line of a run stopped by Ctrl-C: where its checkpoint stands, and the
    command that goes on from it."""
    try:
        checkpoint = load_checkpoint(out)
    except MeshdlError:
        return "interrupted before the first epoch ended: no checkpoint to go on from"
    done, steps = checkpoint.epochs_done, checkpoint.steps_done
    where = f"epoch {done}" if not steps else \
        f"{steps} updates of epoch {done + 1}" if not done else \
        f"epoch {done} and {steps} updates of epoch {done + 1}"
    return f"interrupted after {where}; go on with: {command} --resume {out}"


def with_resume_hint(exc: MeshdlError, out: Path, command: str) -> MeshdlError:
    """`exc`, saying how to go on when the run in `out` has a checkpoint to go on from."""
    if not (out / CHECKPOINT).is_file():
        return exc
    return type(exc)(f"{exc}; the run can go on from its checkpoint (every update it "
                     f"finished): {command} --resume {out}")


def write_run(out: Path, config: RunConfig, model: CNN, metrics: dict[str, Any],
              data_source: str) -> None:
    """Write model.npz, config.json and metrics.json into `out`."""
    start_run(out, config, data_source)
    model.save(out / "model.npz")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=True) + "\n")
