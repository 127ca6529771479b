"""Live inference over MQTT with a node host killed mid-run: the edge learns of it from
the host's last will (the broker's word, not silence), plans around its cells from the
next slot, and from that slot on every alert is the central model's reading of the
same readings with those cells left out, and names them. A host that never came up is
the same from the first slot: no status record answers for its cells."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from meshdl.config import RunConfig, load_run_config
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import anomaly_probability, serve
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress
from meshdl.sim.faults.dead import cell_numbers
from tests.mosquitto import Mosquitto

ROWS, COLS = 3, 4
SLOT_S = 2.0
KILLED_AFTER = 5  # alerts: the bottom row's host is killed once the fifth is out
SLOTS = 8
BOTTOM = frozenset((2, c) for c in range(COLS))
MESH_TOML = f"""
[model]
rows = {ROWS}
cols = {COLS}
hidden = 6

[mesh]
recovery = "best-effort"
patience = 100.0
"""


def _log(path: Path) -> np.ndarray:
    """A sensor log both hosts replay (slot s reads row s mod its length), with a warm
    blob moving through it: some slots' maps hold a step, some none."""
    rng = np.random.default_rng(11)
    maps = 21.0 + rng.normal(0.0, 0.4, (16, ROWS, COLS))
    for t in range(0, 16, 3):
        maps[t, t % ROWS, t % COLS] += 4.0
    np.savez(path, X=maps.astype(np.float32))
    return maps.astype(np.float32)


class Setup(NamedTuple):
    """A test's mesh file, its configuration, the replayed log's maps and the model."""

    mesh: Path
    config: RunConfig
    maps: np.ndarray
    model: CNN


def _setup(tmp_path: Path) -> Setup:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(MESH_TOML)
    config = load_run_config(mesh)
    maps = _log(tmp_path / "log.npz")
    model = CNN(config.model, seed=3)
    model.set_normalization(21.0, 1.0)
    return Setup(mesh, config, maps, model)


def _host(broker: Mosquitto, mesh: Path, log: Path, cells: str, name: str
          ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "meshdl", "nodes", "run", "--cells", cells, "--broker",
         broker.url, "--mesh", str(mesh), "--sensor", f"replay:{log}", "--slot-seconds",
         str(SLOT_S), "--name", name],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_killed_node_hosts_cells_are_left_out_from_the_next_slot_as_central_would(
        mosquitto, tmp_path) -> None:
    mesh, config, maps, model = _setup(tmp_path)
    top = _host(mosquitto, mesh, tmp_path / "log.npz", "0-1,0-3", "host-top")
    bottom = _host(mosquitto, mesh, tmp_path / "log.npz", "2,0-3", "host-bottom")
    engine = MqttEngine.for_run(config, None, BrokerAddress.parse(mosquitto.url),
                                wave_timeout=5 * SLOT_S, max_attempts=3, nodes_timeout=60)
    said: list[str] = []
    engine.say = said.append
    alerts: list[dict] = []

    def killing(alert: dict) -> None:
        alerts.append(alert)
        if len(alerts) == KILLED_AFTER:
            bottom.send_signal(signal.SIGKILL)  # no goodbye: the broker sends its will
            bottom.wait(30)

    try:
        serve(engine, model, SLOT_S, slots=SLOTS, on_alert=killing)
    finally:
        engine.close()
        for host in (top, bottom):
            host.terminate()
        top.wait(30)
        bottom.wait(30)
    assert len(alerts) == SLOTS
    before, after = alerts[:KILLED_AFTER], alerts[KILLED_AFTER:]
    assert all("probability" in a and "left_out" not in a for a in before), before
    # The first slot after the kill is computed without the bottom row, as every later.
    assert after[0]["slot"] == before[-1]["slot"] + 1
    names = sorted(f"r2c{c}" for c in range(COLS))
    for alert in after:
        assert alert.get("left_out") == names, alert
        readings = maps[alert["slot"] % len(maps)][None]
        want = anomaly_probability(model.forward(readings, cell_numbers(BOTTOM, COLS)))
        assert alert["probability"] == pytest.approx(want, abs=1e-5), alert
    assert any("planning around dead cells r2c0, r2c1, r2c2, r2c3" in line for line in said)
    assert engine.report()["dead_cells"] == names


def test_cells_no_node_host_serves_at_the_start_are_left_out_from_the_first_slot(
        mosquitto, tmp_path) -> None:
    mesh, config, maps, model = _setup(tmp_path)
    top = _host(mosquitto, mesh, tmp_path / "log.npz", "0-1,0-3", "host-top")
    engine = MqttEngine.for_run(config, None, BrokerAddress.parse(mosquitto.url),
                                wave_timeout=5 * SLOT_S, max_attempts=3, nodes_timeout=15)
    said: list[str] = []
    engine.say = said.append
    try:
        alerts = serve(engine, model, SLOT_S, slots=3)
    finally:
        engine.close()
        top.terminate()
        top.wait(30)
    names = sorted(f"r2c{c}" for c in range(COLS))
    for alert in alerts:
        assert alert.get("left_out") == names, alert
        readings = maps[alert["slot"] % len(maps)][None]
        want = anomaly_probability(model.forward(readings, cell_numbers(BOTTOM, COLS)))
        assert alert["probability"] == pytest.approx(want, abs=1e-5), alert
    assert any("4 cells have no node host online" in line for line in said), said
