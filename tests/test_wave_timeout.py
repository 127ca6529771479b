"""The edge's wave timeout over MQTT (issue 29, item 9): a wave is restarted when nothing
of it came for the timeout, not merely because it is old, so that a wave a lossy link
still delivers goes on; and a wave that fails after a node host's last will names it.

Driven with fake time and no broker: one node host of every cell and the edge machine
exchange messages by topic as a broker would, at the times each test says."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.edge.agent import EdgeMachine
from meshdl.edge.remote import MqttEngine, Patience
from meshdl.errors import MeshdlError
from meshdl.nodes.host import NodeHost, dataset_readings
from meshdl.protocol.messages import EDGE, Kind, Message
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import name_of, topic
from tests.helpers import assert_one_line_error, noise_dataset

CONFIG = ModelConfig(rows=4, cols=5, hidden=8)
DATA = noise_dataset(CONFIG, samples=8)
SPEC = MeshSpec(1, CONFIG, (0, 0), "broadcast")
TIMEOUT = 10.0


def _model() -> CNN:
    model = CNN(CONFIG, seed=2)
    model.set_normalization(20.0, 3.0)
    return model


class _Mesh:
    """The edge machine and one node host of every cell; messages wait in `pending`
    until the test delivers them, at a time it chooses."""

    def __init__(self, wave_cap: float | None = None) -> None:
        self.host = NodeHost(SPEC, list(SPEC.topology.cells()),
                             lambda cell: dataset_readings(DATA, cell))
        cap = {} if wave_cap is None else {"wave_cap": wave_cap}  # else the default's
        self.edge = EdgeMachine(SPEC, _model(), {Split.TRAIN: DATA.y_train},
                                wave_timeout=TIMEOUT, **cap)
        self.pending: list[Message] = []

    def start(self, now: float) -> None:
        self.pending = self.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(8), now=now)

    def deliver_until(self, kind: Kind, now: float) -> None:
        """Deliver what is pending, and what it sends, at `now`, until a `kind` message
        has reached the edge."""
        while self.pending:
            message = self.pending.pop(0)
            h = message.header
            if h.dst == EDGE:
                self.pending += self.edge.handle(message, now)
                if h.kind == kind:
                    return
                continue
            self.pending += self.host.handle(topic(SPEC.mesh_id, h.src, h.dst, h.kind),
                                             message, now)
        raise AssertionError(f"no {kind.name} reached the edge")


def test_a_wave_still_being_delivered_past_the_timeout_is_not_restarted() -> None:
    mesh = _Mesh()
    mesh.start(now=0.0)
    mesh.deliver_until(Kind.GATHER, now=9.0)  # the forward pass took 9 s of the 10
    assert mesh.edge.tick(15.0) == []  # 15 s old, but it heard from the wave 6 s ago
    mesh.deliver_until(Kind.REDUCE, now=18.0)
    assert mesh.edge.result is not None and mesh.edge.result.grads is not None
    assert mesh.edge.stats["restarted_waves"] == 0 and mesh.edge.attempts == 1


def test_a_wave_that_hears_nothing_for_the_timeout_is_restarted() -> None:
    mesh = _Mesh()
    mesh.start(now=0.0)
    assert mesh.edge.tick(TIMEOUT - 0.1) == []
    step = mesh.edge.step
    again = mesh.edge.tick(TIMEOUT)  # nothing since the start: restarted
    assert {m.header.kind for m in again} == {Kind.PARAMS, Kind.BATCH}
    assert mesh.edge.step == step + 1 and mesh.edge.attempts == 2
    mesh.pending = again  # the restarted wave: silent from its GATHER on
    mesh.deliver_until(Kind.GATHER, now=12.0)
    assert mesh.edge.tick(12.0 + TIMEOUT - 0.1) == []
    assert mesh.edge.tick(12.0 + TIMEOUT) != []
    assert mesh.edge.stats["restarted_waves"] == 2


def test_a_wave_that_keeps_moving_is_still_restarted_at_its_cap() -> None:
    mesh = _Mesh(wave_cap=15.0)
    mesh.start(now=0.0)
    mesh.deliver_until(Kind.GATHER, now=9.0)
    assert mesh.edge.tick(14.9) == []
    assert mesh.edge.tick(15.0) != []  # heard 6 s ago, but 15 s old
    assert mesh.edge.stats["restarted_waves"] == 1


def _status(cells: list[str], state: str) -> bytes:
    """A node host's status record as its session publishes it (its will: "offline")."""
    return json.dumps({"role": "node-host", "state": state, "mesh": 1, "cells": cells,
                       "time": time.time()}).encode()


def test_a_failed_wave_names_the_node_host_whose_last_will_fired() -> None:
    cells = [name_of(c) for c in SPEC.topology.cells()]
    engine = MqttEngine(DATA, "mqtt://127.0.0.1:1", wave_timeout=TIMEOUT, max_attempts=5)
    try:
        engine._status("elsewhere", _status(cells[:2], "offline"), True)  # never ours
        engine._status("north", _status(cells[:10], "online"), False)
        engine._status("south", _status(cells[10:], "online"), False)
        engine._status("south", _status(cells[10:], "offline"), False)  # its last will
        edge = engine._edge_for(_model())
        message = engine._no_result(edge)
        assert message.startswith(f"wave {edge.step} failed: node host south went "
                                  "offline (its last will; 10 cells unserved)"), message
        assert "north" not in message and "elsewhere" not in message
        engine._status("south", _status(cells[10:], "online"), False)  # back again
        assert "south" not in engine._no_result(edge)
    finally:
        engine.close()


def _patient_engine(total_s: float) -> MqttEngine:
    """An engine with every cell's host online, allowed 2 attempts, then `total_s`."""
    cells = [name_of(c) for c in SPEC.topology.cells()]
    engine = MqttEngine(DATA, "mqtt://127.0.0.1:1", wave_timeout=TIMEOUT, max_attempts=2,
                        patience=Patience(total_s=total_s))
    engine._status("north", _status(cells[:10], "online"), False)
    engine._status("south", _status(cells[10:], "online"), False)
    return engine


def _restarts(engine: MqttEngine, until: float, heard: tuple[str, ...],
              beat_every: float = 0.5) -> list[float]:
    """Start a wave at 0 that hears nothing; restart it as the engine's loop does (the
    hosts in `heard` sending heartbeats all along, one every `beat_every` s) until
    `until` or it gives up (raises); the timeouts the restarted attempts were given."""
    edge = engine._edge_for(_model())
    engine._wave_began = 0.0
    engine.heard.clear()  # on the test's clock from here
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(8), now=0.0)
    timeouts, now, beats = [], 0.0, itertools.count(1)
    while now < until:
        now += 0.5
        for client in heard if next(beats) % round(beat_every / 0.5) == 0 else ():
            engine.heard[client] = now
        if edge.tick(now):
            engine._go_on(edge, now)
            timeouts.append(edge.wave_timeout)
    return timeouts


def test_a_wave_that_fails_only_for_loss_goes_on_past_its_attempts_until_patience_runs_out(
        ) -> None:
    # Issue 43, item 3: a sustained flood keeps a host's broker queue full, Mosquitto
    # drops its genuine messages and every attempt is lost; the edge gave up after
    # max_attempts (no model, no checkpoint) though every host was alive.
    engine = _patient_engine(total_s=200.0)
    stalled: list[int] = []
    engine.on_stall = lambda: stalled.append(engine.edge.attempts)  # the loop's checkpoint
    try:
        timeouts = _restarts(engine, 150.0, heard=("north", "south"))
        assert stalled == [3]  # once, as the wave went on past its 2 attempts
        # Past its 2 attempts the wave goes on, each time waiting longer (up to 4x).
        assert timeouts[0] == TIMEOUT and len(timeouts) >= 4
        assert timeouts[1:4] == [1.5 * TIMEOUT, 2.25 * TIMEOUT, 3.375 * TIMEOUT]
        assert max(timeouts) == 4 * TIMEOUT
        assert engine.stats["patient_waves"] == 1
        with pytest.raises(MeshdlError, match=r"got no result in \d+ attempts over 2\d\d s "
                                              "although every node host was heard"):
            _restarts(engine, 400.0, heard=("north", "south"))
    finally:
        engine.close()


def test_a_flooded_host_whose_heartbeats_wait_for_their_acknowledgement_is_still_heard(
        ) -> None:
    # A host beats every 5 s but not while the last beat waits for its acknowledgement
    # (up to 10 s), which a flooded broker is slow to send: beats 20 s apart. Heard only
    # within 15 s, such a host counted as silent and the edge gave up on the flood.
    engine = _patient_engine(total_s=200.0)
    try:
        _restarts(engine, 150.0, heard=("north", "south"), beat_every=20.0)
        assert engine.stats["patient_restarts"] > 0
    finally:
        engine.close()


def test_a_wave_whose_host_is_silent_gives_up_after_its_attempts() -> None:
    engine = _patient_engine(total_s=200.0)
    try:  # south's heartbeats stopped (hung, or its link gone): waiting will not help
        with pytest.raises(MeshdlError, match="got no result in 2 attempts"):
            _restarts(engine, 150.0, heard=("north",))
        assert engine.stats["patient_restarts"] == 0
    finally:
        engine.close()


def test_a_wave_the_broker_refused_gives_up_after_its_attempts() -> None:
    engine = _patient_engine(total_s=200.0)
    try:  # south's record says the broker threw it out for a packet too large
        cells = [name_of(c) for c in SPEC.topology.cells()]
        record = json.loads(_status(cells[10:], "online"))
        engine._status("south", json.dumps({**record, "refused": {"packet_too_large": 1}}
                                           ).encode(), False)
        with pytest.raises(MeshdlError, match="refused messages as too large"):
            _restarts(engine, 150.0, heard=("north", "south"))
        assert engine.stats["patient_restarts"] == 0
    finally:
        engine.close()


@pytest.mark.parametrize(("flags", "total_s"), [((), 600.0), (("--patience", "90"), 90.0),
                                                (("--patience", "0"), 0.0)],
                         ids=["default", "90s", "off"])
def test_edge_run_patience_sets_how_long_a_wave_lost_to_a_flood_is_tried_on(
        cli, tmp_path, small_data_file, monkeypatch, flags, total_s) -> None:
    """`meshdl edge run --patience SECONDS` (issue 43, item 3): the engine it builds
    tries a wave that fails only for loss on for that long; 0 gives up after the
    attempts, as before there was any patience."""
    seen: list[Patience] = []

    def for_run(cls, config, data, broker, **options):
        seen.append(options["patience"])
        raise MeshdlError("no broker in this test")

    monkeypatch.setattr(MqttEngine, "for_run", classmethod(for_run))
    mesh = tmp_path / "mesh.toml"
    mesh.write_text("[model]\nrows = 6\ncols = 8\n")
    code, _, err = cli("edge", "run", "--broker", "mqtt://127.0.0.1:1", "--mesh", mesh,
                       "--data", small_data_file, "--out", tmp_path / "run", *flags)
    assert code == 1 and "no broker in this test" in err
    assert seen == [Patience(total_s=total_s)]
    assert not Patience(total_s=0.0).goes_on(6, 5, 1.0, lost_only=True)


def test_edge_run_refuses_a_negative_patience(cli, tmp_path, small_data_file) -> None:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text("[model]\nrows = 6\ncols = 8\n")
    code, _, err = cli("edge", "run", "--broker", "mqtt://127.0.0.1:1", "--mesh", mesh,
                       "--data", small_data_file, "--patience", "-1")
    assert_one_line_error(code, err, 2, "--patience", "greater than or equal to 0")
