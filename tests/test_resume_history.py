"""`--resume` keeps the run's history (issue 33, item 2): metrics.json of a resumed run
is the whole run's (every epoch, the counts and wall time of every stretch, where it
was resumed from); `--resume` on a finished run leaves it as it is; a run goes on to
more epochs exactly where its learning rate does not depend on its length, and is
refused in one line where it does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import DataConfig, load_run_config
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.training.checkpoint import load_checkpoint
from meshdl.training.loop import train
from tests.helpers import INTERRUPTED, assert_one_line_error, interrupt_at


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 x 5 lounge data set of 16 training and 8 test maps: 2 updates an epoch."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.npz"
    save_dataset(generate_lounge(DataConfig(rows=4, cols=5, train=16, test=8, seed=1)), path)
    return path


def _train(cli: Callable, data: Path, run: Path, *extra: str | Path) -> tuple[int, str, str]:
    return cli("train", "--data", data, "--batch", "8", "--hidden", "4", "--out", run, *extra)


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.iterdir())}


def _assert_same_comm(resumed: dict, whole: dict) -> None:
    """Every count equal; the per-wave means of the halo equal to rounding."""
    for layer, figures in whole.pop("halo").items():
        assert resumed["halo"][layer] == pytest.approx(figures)
    resumed.pop("halo")
    assert resumed == whole


@pytest.mark.parametrize("meshes", [1, 2])
def test_a_resumed_run_keeps_every_epoch_and_the_whole_runs_counts(
        cli, tiny_data, tmp_path, monkeypatch, meshes) -> None:
    """Stopped in epoch 2 and resumed: the epochs, waves, messages and bytes of the run
    never stopped (the stopped stretch's epoch 1 included), its wall time the sum of
    both stretches', and where it went on from; with several meshes, the server's
    updates and each mesh's steps too."""
    flags = ("--epochs", "3", "--meshes", str(meshes))
    assert _train(cli, tiny_data, tmp_path / "whole", *flags)[0] == 0
    whole = _metrics(tmp_path / "whole")
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 3 if meshes == 1 else 2,
                 "meshdl.training.loop" if meshes == 1 else "meshdl.training.parallel")
    assert _train(cli, tiny_data, run, *flags)[0] == INTERRUPTED
    before = load_checkpoint(run)
    assert before.epochs_done == 1
    monkeypatch.undo()
    code, out, err = cli("train", "--resume", run, "--json")
    assert code == 0, err
    resumed = _metrics(run)
    assert json.loads(out) == resumed
    assert resumed["epochs"] == whole["epochs"]
    assert resumed["final"] == whole["final"]
    np.testing.assert_array_equal(CNN.load(run / "model.npz").flat,
                                  CNN.load(tmp_path / "whole" / "model.npz").flat)
    for key in ("waves", "total_messages", "total_bytes"):
        assert resumed["comm"][key] == whole["comm"][key] > 0, key
    _assert_same_comm(resumed["comm"], whole["comm"])
    assert resumed["resumed_from"] == [{"epochs_done": 1, "steps_done": 0,
                                        "epochs_planned": 3,
                                        "wall_s": round(before.wall_s, 3)}]
    assert before.wall_s > 0 and resumed["wall_s"] >= round(before.wall_s, 3)
    if meshes > 1:
        for key in ("updates", "staleness", "server"):
            assert resumed["parallel"][key] == whole["parallel"][key], key
        assert [m["steps"] for m in resumed["parallel"]["per_mesh"]] == \
            [m["steps"] for m in whole["parallel"]["per_mesh"]]
        assert resumed["parallel"]["elapsed"] == pytest.approx(whole["parallel"]["elapsed"])


def test_a_run_resumed_twice_lists_both_points_it_went_on_from(cli, tiny_data, tmp_path,
                                                               monkeypatch) -> None:
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 3)
    assert _train(cli, tiny_data, run, "--epochs", "3", "--mode", "central")[0] == \
        INTERRUPTED
    interrupt_at(monkeypatch, 3)  # epoch 3's first update
    assert cli("train", "--resume", run)[0] == INTERRUPTED
    monkeypatch.undo()
    assert cli("train", "--resume", run)[0] == 0
    points = _metrics(run)["resumed_from"]
    assert [(p["epochs_done"], p["steps_done"]) for p in points] == [(1, 0), (2, 0)]
    assert points[0]["wall_s"] <= points[1]["wall_s"] <= _metrics(run)["wall_s"]


def test_resume_of_a_finished_run_leaves_it_as_it_is_in_one_line(cli, tiny_data,
                                                                  tmp_path) -> None:
    run = tmp_path / "run"
    assert _train(cli, tiny_data, run, "--epochs", "2")[0] == 0
    before = _snapshot(run)
    code, out, err = cli("train", "--resume", run, "--json")
    assert code == 0, err
    assert _snapshot(run) == before  # metrics.json, model and checkpoint untouched
    assert json.loads(out) == _metrics(run)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"not resuming {run}: it has trained all its 2 epochs")
    assert "metrics.json left as it is" in lines[0]
    assert "cannot be extended" in lines[0]  # the default recipe's cosine schedule


CONSTANT = '[train]\nschedule = "constant"\nwarmup_fraction = 0.0\n'


def test_a_run_with_a_constant_learning_rate_extends_to_the_run_trained_that_long(
        cli, tiny_data, tmp_path) -> None:
    recipe = tmp_path / "constant.toml"
    recipe.write_text(CONSTANT)
    flags = ("--config", recipe, "--mode", "central")
    assert _train(cli, tiny_data, tmp_path / "long", *flags, "--epochs", "3")[0] == 0
    run = tmp_path / "run"
    assert _train(cli, tiny_data, run, *flags, "--epochs", "2")[0] == 0
    code, _, err = cli("train", "--resume", run)
    assert code == 0 and "--epochs N" in err  # finished: says how to go on
    code, _, err = cli("train", "--resume", run, "--epochs", "3")
    assert code == 0, err
    assert "extended from 2" in err
    long, extended = _metrics(tmp_path / "long"), _metrics(run)
    assert extended["epochs"] == long["epochs"] and extended["final"] == long["final"]
    np.testing.assert_array_equal(CNN.load(run / "model.npz").flat,
                                  CNN.load(tmp_path / "long" / "model.npz").flat)
    assert extended["config"]["train"]["epochs"] == 3
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 3
    point, = extended["resumed_from"]
    # it went on after epoch 2 of the 2 it then had
    assert (point["epochs_done"], point["epochs_planned"]) == (2, 2)


def test_extending_a_run_whose_learning_rate_spans_its_epochs_is_refused_in_one_line(
        cli, tiny_data, tmp_path) -> None:
    run = tmp_path / "run"
    assert _train(cli, tiny_data, run, "--epochs", "1", "--mode", "central")[0] == 0
    before = _snapshot(run)
    code, _, err = cli("train", "--resume", run, "--epochs", "2")
    assert_one_line_error(code, err, 2, "--epochs 2", "cosine", "warm-up",
                          'schedule = "constant"', "--warmup 0")
    assert _snapshot(run) == before


def test_the_loop_goes_on_to_more_epochs_only_where_the_schedule_allows(tmp_path) -> None:
    data = generate_lounge(DataConfig(rows=4, cols=5, train=16, test=8, seed=1))

    def config(epochs: int, **recipe: object):
        return load_run_config(mode="central", model={"rows": 4, "cols": 5, "hidden": 4},
                               train={"epochs": epochs, "batch": 8, **recipe})

    constant = {"schedule": "constant", "warmup_fraction": 0.0}
    train(config(1, **constant), data, checkpoints=tmp_path / "constant")
    longer, _ = train(config(2, **constant), data,
                      resume=load_checkpoint(tmp_path / "constant"))
    np.testing.assert_array_equal(longer.flat, train(config(2, **constant), data)[0].flat)
    for recipe in ({"schedule": "cosine", "warmup_fraction": 0.0},
                   {"schedule": "constant", "warmup_fraction": 0.25}):
        folder = tmp_path / recipe["schedule"] / str(recipe["warmup_fraction"])
        train(config(1, **recipe), data, checkpoints=folder)
        with pytest.raises(MeshdlError, match="cannot go on to 2 epochs"):
            train(config(2, **recipe), data, resume=load_checkpoint(folder))
