"""Run directories and the input that reaches them (issue 29, items 8 and 9): a run never
clobbers another, a refused run writes nothing, config.json finds its data from any
directory, and hostile numbers are refused in one line before numpy can warn."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from meshdl import CNN, load_run_config
from meshdl.config import DataConfig
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from tests.helpers import (
    INTERRUPTED,
    TWO_MESHES_TOML,
    assert_one_line_error,
    interrupt_at,
)

RUN_FILES = ("config.json", "metrics.json", "model.npz", "checkpoint.npz")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 x 5 lounge data set of 16 training and 8 test maps."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.npz"
    save_dataset(generate_lounge(DataConfig(rows=4, cols=5, train=16, test=8, seed=1)), path)
    return path


def _train(cli: Callable, data: Path | str, *extra: str | Path) -> tuple[int, str, str]:
    return cli("train", "--data", data, "--epochs", "1", "--batch", "8", "--hidden", "4",
               "--mode", "central", *extra)


def _snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run directory: its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.iterdir())}


def _no_runtime_warnings(caught: list[warnings.WarningMessage]) -> None:
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == []


# ------------------------------------------------------------------ item 8: no clobbering
def test_out_of_a_finished_run_is_refused_in_one_line_and_nothing_in_it_changes(
        cli, tiny_data, tmp_path) -> None:
    run = tmp_path / "run"
    code, _, err = _train(cli, tiny_data, "--out", run)
    assert code == 0, err
    assert {p.name for p in run.iterdir()} >= set(RUN_FILES)
    before = _snapshot(run)
    code, _, err = _train(cli, tiny_data, "--out", run, "--seed", "9")
    assert_one_line_error(code, err, 2, str(run), "holds a run", "--force",
                          f"--resume {run}")
    assert _snapshot(run) == before


def test_a_run_that_fails_at_once_leaves_the_run_in_out_resumable(cli, tiny_data,
                                                                   tmp_path) -> None:
    run = tmp_path / "run"
    assert _train(cli, tiny_data, "--out", run)[0] == 0
    before = _snapshot(run)
    code, _, err = _train(cli, tiny_data, "--out", run, "--lr", "1e30")
    assert code == 2, err
    assert _snapshot(run) == before  # config.json included: what --resume reads
    code, _, err = cli("train", "--resume", run)
    assert code == 0, err
    assert "resuming" in err


def test_force_replaces_the_run_in_out_files_and_all(cli, tiny_data, tmp_path) -> None:
    run = tmp_path / "run"
    assert _train(cli, tiny_data, "--out", run, "--seed", "1")[0] == 0
    first = CNN.load(run / "model.npz").flat.copy()
    (run / "notes.txt").write_text("mine\n")  # not a run file: left alone
    code, _, err = _train(cli, tiny_data, "--out", run, "--seed", "2", "--force")
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["train"]["seed"] == 2
    assert not np.array_equal(CNN.load(run / "model.npz").flat, first)
    assert (run / "notes.txt").read_text() == "mine\n"
    code, _, err = cli("train", "--resume", run, "--force")
    assert_one_line_error(code, err, 2, "drop --force")


def test_an_empty_existing_directory_may_be_the_out_of_a_run(cli, tiny_data,
                                                             tmp_path) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    code, _, err = _train(cli, tiny_data, "--out", run)
    assert code == 0, err
    assert (run / "model.npz").is_file()


def test_a_run_refused_at_validation_writes_nothing(cli, tiny_data, tmp_path,
                                                    monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # where runs/<timestamp>-<name>/ would go
    for extra in (("--out", tmp_path / "new"), ()):
        code, _, err = _train(cli, tiny_data, "--lr", "1e30", *extra)
        assert_one_line_error(code, err, 2, "train.lr")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_run_that_fails_before_its_first_checkpoint_leaves_its_out_free(
        cli, tiny_data, tmp_path) -> None:
    run = tmp_path / "run"
    code, _, err = _train(cli, tiny_data, "--out", run, "--lr", "1e6", "--clip-norm", "0",
                          "--warmup", "0", "--batch", "2")  # NaN at step 3 of 8
    assert_one_line_error(code, err, 1, "diverged")
    assert "--resume" not in err  # nothing to resume from
    assert not run.exists()  # no config.json claiming a run that never was
    code, _, err = _train(cli, tiny_data, "--out", run)
    assert code == 0, err


# ------------------------------------------------- item 9: data path, numbers, TOML grid
def test_resume_from_another_working_directory_finds_the_data(cli, tiny_data, tmp_path,
                                                              monkeypatch) -> None:
    here = tmp_path / "here"
    here.mkdir()
    (here / "d.npz").write_bytes(tiny_data.read_bytes())
    monkeypatch.chdir(here)
    # Stopped in its second epoch: the resume has epochs left, so it reads the data.
    interrupt_at(monkeypatch, 2)
    code, _, err = _train(cli, "d.npz", "--out", tmp_path / "run", "--epochs", "2",
                          "--batch", "16")
    monkeypatch.undo()  # (the directory too: the data is found by the recorded path)
    assert code == INTERRUPTED, err
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["data_source"]
    assert recorded == str(here / "d.npz")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = cli("train", "--resume", tmp_path / "run")
    assert code == 0, err


@pytest.mark.parametrize("lr", ["inf", "nan", "1e30", "-inf"])
def test_a_non_finite_or_absurd_learning_rate_is_one_line_before_any_warning(
        cli, tiny_data, tmp_path, lr) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _train(cli, tiny_data, "--out", tmp_path / "run", "--lr", lr)
    _no_runtime_warnings(caught)
    assert_one_line_error(code, err, 2, "train.lr")
    assert not (tmp_path / "run").exists()


def test_an_absurd_epoch_count_is_refused_by_the_configuration(cli, monkeypatch) -> None:
    with pytest.raises(ValidationError, match=r"train\.epochs"):
        load_run_config(train={"epochs": 1_000_000_000_000})
    assert load_run_config(train={"epochs": 100_000}).train.epochs == 100_000  # the bound
    monkeypatch.setenv("MESHDL_TRAIN__EPOCHS", "1000000000000")
    code, _, err = cli("config", "show")
    assert_one_line_error(code, err, 2, "train.epochs")


def test_a_bad_grid_in_the_toml_file_is_refused_with_a_data_file_too(cli, tiny_data,
                                                                     tmp_path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nrows = "six"\n')
    for data in ((), ("--data", tiny_data)):
        code, _, err = cli("train", "--config", toml, "--out", tmp_path / "run",
                           "--epochs", "1", *data)
        assert_one_line_error(code, err, 2, str(toml), "model.rows")
    assert not (tmp_path / "run").exists()


def test_the_data_files_grid_is_the_default_under_the_toml_files(cli, tiny_data,
                                                                 tmp_path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("[model]\nkernel = 2\n")  # no grid: the data file's (4 x 5)
    code, _, err = _train(cli, tiny_data, "--config", toml, "--out", tmp_path / "run")
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["model"]["rows"], config["model"]["cols"], config["model"]["kernel"]) \
        == (4, 5, 2)
    toml.write_text("[model]\nrows = 6\n")  # a grid the data file does not have
    code, _, err = _train(cli, tiny_data, "--config", toml, "--out", tmp_path / "other")
    assert_one_line_error(code, err, 2, "4 x 5", "6 x 5")


def test_a_float64_data_set_beyond_float32_is_refused_at_load_before_any_warning(
        cli, tiny_data, tmp_path) -> None:
    with np.load(tiny_data) as stored:
        arrays = {key: stored[key] for key in stored.files}
    arrays["X_train"] = arrays["X_train"].astype(np.float64)
    arrays["X_train"][3, 1, 2] = 1e300
    hostile = tmp_path / "hostile.npz"
    np.savez(hostile, **arrays)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _train(cli, hostile, "--out", tmp_path / "run")
    _no_runtime_warnings(caught)
    assert_one_line_error(code, err, 1, str(hostile), "X_train", "beyond float32")
    assert not (tmp_path / "run").exists()


# ------------------------------------- issue 43, item 7: every command that takes --out
def _hashes(run: Path) -> dict[str, str]:
    """Every file under a run directory, by its SHA-256."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _simulate(cli: Callable, command: str, run: Path, *extra: str | Path
              ) -> tuple[int, str, str]:
    """A tiny `meshdl simulate COMMAND` on a 4 x 5 grid into `run`."""
    size = {"train": ("--epochs", "1", "--batch", "8", "--hidden", "4"),
            "infer": ("--hidden", "4"), "live": ("--hidden", "4", "--slots", "2",
                                                 "--timed-slots", "2")}[command]
    return cli("simulate", command, "--rows", "4", "--cols", "5", *size, "--out", run,
               *extra)


@pytest.fixture
def simulated_run(cli, tmp_path) -> Path:
    """An inference run of `meshdl simulate` with its report.html beside it."""
    run = tmp_path / "sim"
    code, _, err = _simulate(cli, "infer", run)
    assert code == 0, err
    code, _, err = cli("report", run)
    assert code == 0, err
    assert {"sim.json", "trace.jsonl", "energy.png", "report.html"} <= set(_hashes(run))
    return run


@pytest.mark.parametrize("command", ["train", "infer", "live"])
def test_simulate_into_an_out_holding_a_run_is_refused_and_every_file_stays_the_same(
        cli, simulated_run, tiny_data, command) -> None:
    before = _hashes(simulated_run)
    code, _, err = _simulate(cli, command, simulated_run)
    assert_one_line_error(code, err, 2, str(simulated_run), "holds a run", "--force")
    assert _hashes(simulated_run) == before
    code, _, err = _train(cli, tiny_data, "--out", simulated_run)  # train: the same rule
    assert_one_line_error(code, err, 2, "holds a run", "--force", "--resume")
    assert _hashes(simulated_run) == before


def test_simulate_with_force_leaves_no_stale_file_beside_the_new_run(cli,
                                                                     simulated_run) -> None:
    (simulated_run / "notes.txt").write_text("mine\n")  # not a run file: left alone
    code, _, err = _simulate(cli, "live", simulated_run, "--force")
    assert code == 0, err
    # live writes no trace, energy plot or report: the inference run's are gone
    assert set(_hashes(simulated_run)) == {"config.json", "sim.json", "alerts.jsonl",
                                           "notes.txt"}
    assert "alerts" in json.loads((simulated_run / "sim.json").read_text())


@pytest.fixture(scope="module")
def mesh_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mesh file of two 4 x 5 meshes (what `ps run` needs, and `edge run` takes)."""
    path = tmp_path_factory.mktemp("mesh") / "mesh.toml"
    path.write_text(TWO_MESHES_TOML.format(mesh_id=1))
    return path


@pytest.mark.parametrize("command", ["edge", "ps"])
def test_edge_and_ps_run_refuse_an_out_holding_a_run_before_the_broker_and_change_nothing(
        cli, tiny_data, mesh_file, tmp_path, command) -> None:
    run = tmp_path / "run"
    assert _train(cli, tiny_data, "--out", run)[0] == 0
    before = _hashes(run)
    closed = "mqtt://127.0.0.1:1"  # nothing listens: the refusal comes before any connect
    code, _, err = cli(command, "run", "--broker", closed, "--mesh", mesh_file, "--data",
                       tiny_data, "--out", run, "--broker-patience", "0")
    assert_one_line_error(code, err, 2, str(run), "holds a run", "--force",
                          f"meshdl {command} run --broker {closed}", f"--resume {run}")
    assert _hashes(run) == before


def test_edge_run_that_never_reaches_its_broker_leaves_its_out_free(
        cli, tiny_data, mesh_file, tmp_path) -> None:
    run = tmp_path / "run"
    code, _, err = cli("edge", "run", "--broker", "mqtt://127.0.0.1:1", "--mesh", mesh_file,
                       "--data", tiny_data, "--out", run, "--broker-patience", "0",
                       "--nodes-timeout", "1")
    assert_one_line_error(code, err, 1, "cannot reach the broker")
    assert not run.exists()  # no config.json claiming a run that never was
