"""Ctrl-C during training (issue 33, item 3): `meshdl train` (the virtual mesh and
--transport mqtt) and `meshdl edge run` end with exit code 130 and one line saying after
which epoch the run stopped and the command that goes on from its checkpoint; that
command does go on.

Ctrl-C is raised in this process where the loop asks an update's learning rate, as a
user pressing it mid-epoch would (no signal, no timing)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from meshdl.config import DataConfig, load_run_config
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.training.runs import single_class_warning
from tests.helpers import INTERRUPTED, TWO_MESHES_TOML, interrupt_at, small_run_toml


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def _go_on(cli: Callable, line: str) -> tuple[int, str, str]:
    """Run the command an interrupted run's line names."""
    command = shlex.split(line.split("go on with: ", 1)[1])
    assert command[0] == "meshdl"
    return cli(*command[1:])


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 x 5 lounge data set of 16 training and 8 test maps: 2 updates an epoch."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.npz"
    save_dataset(generate_lounge(DataConfig(rows=4, cols=5, train=16, test=8, seed=1)), path)
    return path


def _train(cli: Callable, data: Path, run: Path) -> tuple[int, str, str]:
    return cli("train", "--data", data, "--epochs", "3", "--batch", "8", "--hidden", "4",
               "--out", run)


def test_ctrl_c_during_train_says_after_which_epoch_and_the_command_that_goes_on(
        cli, tiny_data, tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 4)  # epoch 2's second update
    code, out, err = _train(cli, tiny_data, run)
    assert code == INTERRUPTED and out == ""
    said = [line for line in _lines(err) if "interrupted" in line]
    assert said == [f"interrupted after epoch 1; go on with: meshdl train --resume {run}"]
    assert _lines(err)[-1] == said[0]
    monkeypatch.undo()
    code, out, err = _go_on(cli, said[0])
    assert code == 0, err
    assert [e["epoch"] for e in json.loads((run / "metrics.json").read_text())["epochs"]] \
        == [1, 2, 3]


def test_ctrl_c_before_the_first_epoch_ends_says_there_is_nothing_to_go_on_from(
        cli, tiny_data, tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 1)
    code, _, err = _train(cli, tiny_data, run)
    assert code == INTERRUPTED
    assert _lines(err)[-1] == ("interrupted before the first epoch ended: no checkpoint to "
                               "go on from")
    assert not run.exists()  # nothing claims a run that never was


def test_ctrl_c_while_the_data_is_made_says_nothing_was_written(cli, tmp_path,
                                                                monkeypatch) -> None:
    def pressed(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr("meshdl.cli.train.generate_lounge", pressed)
    code, _, err = cli("train", "--rows", "4", "--cols", "5", "--out", tmp_path / "run")
    assert code == INTERRUPTED
    assert _lines(err) == ["interrupted before training began: nothing was written"]
    assert not (tmp_path / "run").exists()


def test_ctrl_c_in_a_resumed_run_names_the_checkpoint_it_still_has(
        cli, tiny_data, tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 4)
    assert _train(cli, tiny_data, run)[0] == INTERRUPTED
    interrupt_at(monkeypatch, 1)  # at once again: the run stands where it stood
    code, _, err = cli("train", "--resume", run)
    assert code == INTERRUPTED
    assert _lines(err)[-1] == f"interrupted after epoch 1; go on with: meshdl train " \
                              f"--resume {run}"
    assert (run / "checkpoint.npz").is_file() and (run / "config.json").is_file()


# ------------------------------------------------------------------------------ over MQTT
@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 4 x 5 mesh file (2 epochs of 4 updates) and its data set."""
    folder = tmp_path_factory.mktemp("mesh")
    mesh_file = folder / "mesh.toml"
    mesh_file.write_text(small_run_toml(10))
    data_file = save_dataset(generate_lounge(load_run_config(mesh_file).data),
                             folder / "data.npz")
    return mesh_file, data_file


def test_ctrl_c_during_train_over_mqtt_goes_on_through_the_same_broker(
        cli, mesh_run, mosquitto, tmp_path, monkeypatch) -> None:
    mesh_file, data_file = mesh_run
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 6)  # epoch 2's second update
    code, _, err = cli("train", "--transport", "mqtt", "--broker", mosquitto.url,
                       "--config", mesh_file, "--data", data_file, "--out", run)
    assert code == INTERRUPTED
    address = BrokerAddress.parse(mosquitto.url)
    assert _lines(err)[-1] == (f"interrupted after epoch 1; go on with: meshdl train "
                               f"--transport mqtt --broker {address} --resume {run}")
    monkeypatch.undo()
    code, _, err = _go_on(cli, _lines(err)[-1])
    assert code == 0, err
    assert "over MQTT" in err


def test_ctrl_c_during_edge_run_says_the_edge_command_that_goes_on(
        cli, mesh_run, mosquitto, tmp_path, monkeypatch) -> None:
    mesh_file, data_file = mesh_run
    config = load_run_config(mesh_file)
    cells = [(r, c) for r in range(config.model.rows) for c in range(config.model.cols)]
    run = tmp_path / "run"
    address = BrokerAddress.parse(mosquitto.url)
    with BackgroundNodeHost(config, cells, address, generate_lounge(config.data)):
        interrupt_at(monkeypatch, 6)
        code, _, err = cli("edge", "run", "--broker", mosquitto.url, "--mesh", mesh_file,
                           "--data", data_file, "--out", run, "--nodes-timeout", "60")
        assert code == INTERRUPTED
        assert _lines(err)[-1] == (f"interrupted after epoch 1; go on with: meshdl edge run "
                                   f"--broker {address} --mesh {mesh_file} --data "
                                   f"{data_file} --resume {run}")
        monkeypatch.undo()
        go_on = _lines(err)[-1]
        code, _, err = _go_on(cli, go_on)
    assert code == 0, err
    metrics = (run / "metrics.json").read_bytes()
    assert [e["epoch"] for e in json.loads(metrics)["epochs"]] == [1, 2]
    assert json.loads(metrics)["resumed_from"][0]["epochs_done"] == 1
    code, _, err = _go_on(cli, go_on)  # once more: the run is finished, left as it is
    assert code == 0 and _lines(err)[-1].startswith(f"not resuming {run}"), err
    assert (run / "metrics.json").read_bytes() == metrics


def test_ctrl_c_during_ps_run_says_so_in_one_line_with_exit_130(
        cli, tiny_data, tmp_path, monkeypatch) -> None:
    """The parameter server stopped by Ctrl-C before its first epoch: exit 130 and the one
    line `edge run` says (it said `error: stopped; go on with meshdl ps run ...` and 1)."""
    import meshdl.training.ps_run as serve_module

    async def pressed(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_module, "serve", pressed)
    mesh_file = tmp_path / "mesh.toml"
    mesh_file.write_text(TWO_MESHES_TOML.format(mesh_id=1))
    run = tmp_path / "run"
    code, out, err = cli("ps", "run", "--broker", "mqtt://127.0.0.1:1", "--mesh", mesh_file,
                         "--data", tiny_data, "--out", run)
    assert code == INTERRUPTED and out == ""
    assert _lines(err)[-1] == ("interrupted before the first epoch ended: no checkpoint to "
                               "go on from")
    assert "error" not in err
    assert not (run / "config.json").exists()  # nothing claims a run that never was


# ------------------------------------------- issue 43, item 9: the simulator says so too
def _simulate_train(cli: Callable, data: Path, run: Path) -> tuple[int, str, str]:
    return cli("simulate", "train", "--data", data, "--epochs", "2", "--batch", "8",
               "--hidden", "4", "--out", run)


def test_ctrl_c_during_simulate_train_says_so_in_one_line_and_keeps_nothing(
        cli, tiny_data, tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 3)  # epoch 2's first update: epoch 1 is checkpointed
    code, out, err = _simulate_train(cli, tiny_data, run)
    assert code == INTERRUPTED and out == ""
    last = _lines(err)[-1]
    assert last.startswith("interrupted; a simulated run cannot go on") and \
        "`meshdl simulate train`" in last
    assert not run.exists()  # simulated time cannot go on from a checkpoint
    monkeypatch.undo()
    code, _, err = _simulate_train(cli, tiny_data, run)  # the same command starts over
    assert code == 0, err


def test_ctrl_c_during_simulate_live_says_so_in_one_line_and_keeps_nothing(
        cli, tmp_path, monkeypatch) -> None:
    from meshdl.sim.studies import live

    real = live.run_mesh

    def pressed_in_slot_2(run, series, say):
        def said(done: int) -> None:
            if done == 2:
                raise KeyboardInterrupt
            say(done)
        return real(run, series, said)

    monkeypatch.setattr(live, "run_mesh", pressed_in_slot_2)
    run = tmp_path / "run"
    code, _, err = cli("simulate", "live", "--rows", "4", "--cols", "5", "--slots", "4",
                       "--timed-slots", "4", "--out", run)
    assert code == INTERRUPTED
    assert _lines(err)[-1].startswith("interrupted; a simulated run cannot go on")
    assert "`meshdl simulate live`" in _lines(err)[-1]
    assert not run.exists()


def test_ctrl_c_before_the_simulation_began_says_nothing_was_written(
        cli, tmp_path, monkeypatch) -> None:
    def pressed(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr("meshdl.data.lounge.generate_lounge", pressed)
    code, _, err = cli("simulate", "train", "--rows", "4", "--cols", "5", "--out",
                       tmp_path / "run")
    assert code == INTERRUPTED
    assert _lines(err) == ["interrupted before the simulation began: nothing was written"]
    assert not (tmp_path / "run").exists()


def test_simulate_train_that_ends_predicting_one_class_warns_as_train_does(
        cli, tiny_data, tmp_path) -> None:
    run = tmp_path / "run"
    code, _, err = cli("simulate", "train", "--data", tiny_data, "--epochs", "1",
                       "--batch", "8", "--hidden", "4", "--out", run)
    assert code == 0, err
    final = json.loads((run / "metrics.json").read_text())["final"]
    assert final["single_class"]  # this tiny run collapses (the README's run did too)
    assert single_class_warning(final) in _lines(err)
