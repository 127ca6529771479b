"""`meshdl ps run --resume` keeps the run's history (issue 33, item 2), as `train` and
`edge run` do: the metrics.json of a parameter server stopped after an epoch and resumed
is the whole run's (its updates, staleness, pushes and wall time over both stretches,
and where it went on from); `--resume` on a finished run leaves it as it is, in one line.

The server runs through the CLI in this process; the two meshes' node hosts and edges
(`edge run --ps`'s loop) in threads, over the suite's Mosquitto: a 4 x 5 grid, 2 meshes,
2 epochs of 4 steps each.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

import meshdl.training.ps_run as serve_module
from meshdl.config import load_run_config
from meshdl.data.datasets import Dataset, save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.edge.remote import MqttEngine
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.protocol.spec import MeshSpec
from meshdl.training.checkpoint import load_checkpoint
from meshdl.training.edge_run import train_with_server
from tests.helpers import TWO_MESHES_TOML

MESHES = (1, 2)
STEPS = 2 * 4  # 2 epochs of 4 clocks (40 maps, global batches of 2 x 5)
NOTHING_LISTENS = "mqtt://127.0.0.1:1"


class _Site:
    """The meshes' files (mesh files, data set) and what their processes share."""

    def __init__(self, root: Path, broker: str) -> None:
        self.mesh_files = {mesh: root / f"mesh{mesh}.toml" for mesh in MESHES}
        for mesh, path in self.mesh_files.items():
            path.write_text(TWO_MESHES_TOML.format(mesh_id=mesh))
        self.configs = [load_run_config(self.mesh_files[mesh]) for mesh in MESHES]
        self.data: Dataset = generate_lounge(self.configs[0].data)
        self.data_file = save_dataset(self.data, root / "data.npz")
        self.broker = broker
        self.address = BrokerAddress.parse(broker)

    def ps(self, cli: Callable, *extra: str | Path, broker: str | None = None
           ) -> tuple[int, str, str]:
        """`meshdl ps run` of mesh 1's file (the server of both meshes)."""
        return cli("ps", "run", "--broker", broker or self.broker, "--mesh",
                   self.mesh_files[1], "--data", self.data_file, "--edges-timeout", "120",
                   *extra)

    @contextmanager
    def node_hosts(self) -> Iterator[None]:
        cells = list(MeshSpec(1, self.configs[0].model).topology.cells())
        with ExitStack() as hosts:
            for config in self.configs:
                hosts.enter_context(BackgroundNodeHost(
                    config, cells, self.address, self.data,
                    client=f"hosts{config.mesh.mesh_id}"))
            yield

    @contextmanager
    def edges(self) -> Iterator[None]:
        """Both meshes' edges training with the server (each its whole run), joined and
        checked at the end."""
        errors: list[BaseException] = []
        threads, engines = [], []
        for config in self.configs:
            engine = MqttEngine.for_run(config, self.data, self.address, wave_timeout=5.0)

            def edge(c=config, e=engine) -> None:
                try:
                    train_with_server(c, self.data, e, resend_s=0.5, patience_s=120.0)
                except BaseException as exc:  # reported by the test
                    errors.append(exc)

            engines.append(engine)
            threads.append(threading.Thread(target=edge, daemon=True))
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            for thread, engine in zip(threads, engines, strict=True):
                thread.join(300)
                engine.close()
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.iterdir())}


def _interrupt_after_first_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C just after the server has saved epoch 1's checkpoint."""
    real = serve_module.save_checkpoint

    def saved_then_pressed(*args):
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_module, "save_checkpoint", saved_then_pressed)


@pytest.mark.slow
def test_a_resumed_ps_run_reports_the_whole_runs_updates_pushes_and_wall_time(
        mosquitto, cli, tmp_path, monkeypatch) -> None:
    """Stopped after epoch 1 and resumed: the epochs, updates, staleness and pushes of
    the run never stopped (epoch 1's counted once), its wall time both stretches', and
    where it went on from."""
    site = _Site(tmp_path, mosquitto.url)
    whole_run, run = tmp_path / "whole", tmp_path / "run"
    with site.node_hosts():
        with site.edges():
            code, _, err = site.ps(cli, "--out", whole_run)
            assert code == 0, err
        with site.edges():
            _interrupt_after_first_checkpoint(monkeypatch)
            code, _, err = site.ps(cli, "--out", run)
            assert code != 0, err
            before = load_checkpoint(run)
            assert before.epochs_done == 1
            monkeypatch.undo()
            code, out, err = site.ps(cli, "--resume", run, "--json")
            assert code == 0, err
    whole, resumed = _metrics(whole_run), _metrics(run)
    assert json.loads(out) == resumed
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    for key in ("train_loss", "train_acc"):  # sums of pushes: equal to rounding
        assert [e[key] for e in resumed["epochs"]] == \
            pytest.approx([e[key] for e in whole["epochs"]], rel=1e-5), key
    assert resumed["parallel"]["updates"] == whole["parallel"]["updates"] == STEPS
    assert resumed["parallel"]["staleness"] == whole["parallel"]["staleness"] == \
        {"0": len(MESHES) * STEPS}
    assert resumed["parallel"]["server"]["pushes"] == \
        whole["parallel"]["server"]["pushes"] == len(MESHES) * STEPS
    assert resumed["resumed_from"] == [{"epochs_done": 1, "steps_done": 0,
                                        "epochs_planned": 2,
                                        "wall_s": round(before.wall_s, 3)}]
    assert "resumed_from" not in whole
    # the server's wall time: both stretches' (the first up to its checkpoint)
    assert before.wall_s > 0 and resumed["wall_s"] > round(before.wall_s, 3)
    assert before.parallel["wall_s"] == pytest.approx(before.wall_s)
    assert resumed["parallel"]["wall_s"] == pytest.approx(resumed["wall_s"], abs=1e-3)
    assert whole["wall_s"] > 0
    assert whole["parallel"]["wall_s"] == pytest.approx(whole["wall_s"], abs=1e-3)


@pytest.mark.slow
def test_resume_of_a_finished_ps_run_leaves_it_as_it_is_in_one_line(
        mosquitto, cli, tmp_path) -> None:
    """Nothing to do: no broker needed, metrics.json, model and checkpoint untouched,
    one line saying so."""
    site = _Site(tmp_path, mosquitto.url)
    run = tmp_path / "run"
    with site.node_hosts(), site.edges():
        code, _, err = site.ps(cli, "--out", run)
        assert code == 0, err
    before = _snapshot(run)
    code, out, err = site.ps(cli, "--resume", run, "--json", "--broker-patience", "1",
                             broker=NOTHING_LISTENS)
    assert code == 0, err
    assert _snapshot(run) == before
    assert json.loads(out) == _metrics(run)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"not resuming {run}: it has trained all its 2 epochs")
    assert "metrics.json left as it is" in lines[0]
