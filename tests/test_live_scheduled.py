"""Scheduled slots over MQTT: the edge sends the parameters once, every later slot's wave
is started by the node hosts' clocks, and each slot's alert is central inference's on
the same readings. A host without the parameters (restarted) gets them again when its
slot stalls, and a cell never starts a slot twice."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter

import aiomqtt
import numpy as np
import pytest

from meshdl.config import load_run_config
from meshdl.edge.agent import EdgeMachine
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import anomaly_probability, serve
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress, share_of
from meshdl.nodes.host import NodeHost
from meshdl.nodes.live import LiveSampler, SlotStarter, live_ring
from meshdl.nodes.sensors import SensorError
from meshdl.nodes.serve import BackgroundNodeHost, Readings, host_spec
from meshdl.protocol.messages import ALL, EDGE, Kind, Message
from meshdl.protocol.spec import LIVE_SLOTS, Mode, Split
from meshdl.protocol.topics import ROOT, TopicNames
from meshdl.protocol.topology import Cell

ROWS, COLS = 3, 4
SLOT_S = 1.0
FIRST = 1_000  # a slot number (Unix time // SLOT_S) for the in-process benches
TOP = [(r, c) for r in range(2) for c in range(COLS)]  # one node host ...
BOTTOM = [(2, c) for c in range(COLS)]  # ... and another


def reading(cell: Cell, slot: int) -> float:
    """The room at `cell` in `slot`: a pure function, whichever host reads it, whenever."""
    r, c = cell
    return round(21.0 + 1.5 * math.sin(0.7 * slot + 1.3 * r + 0.4 * c), 3)


class Series:
    """A sensor read by slot number (`SlotSensor`): `reading(cell, slot)`."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell

    def read(self) -> float:
        raise SensorError("read by slot only")

    def read_slot(self, slot: int) -> float:
        return reading(self.cell, slot)


def _config():
    return load_run_config(None, model={"rows": ROWS, "cols": COLS, "hidden": 6})


def _model() -> CNN:
    model = CNN(_config().model, seed=3)
    model.set_normalization(21.0, 2.0)
    return model


def central(model: CNN, slot: int) -> np.ndarray:
    """(1, classes) logits of the model on slot `slot`'s readings, outside any mesh."""
    maps = np.array([[[reading((r, c), slot) for c in range(COLS)] for r in range(ROWS)]],
                    np.float32)
    return model.forward(maps)


# ------------------------------------------------------------------ in process


class Bench:
    """Node hosts with their samplers and slot starters, and an edge, in process: each
    message goes where the broker would take it (by its topic), through the starter."""

    def __init__(self, groups: list[list[Cell]], model: CNN) -> None:
        self.spec = host_spec(_config())
        self.topics = TopicNames(self.spec.mesh_id)
        self.now = 0.0  # the Unix clock of every host
        self.edge = EdgeMachine(self.spec, model, {}, session=5)
        self.starters = [self._starter(cells) for cells in groups]

    def _starter(self, cells: list[Cell]) -> SlotStarter:
        host = NodeHost(self.spec, cells, lambda _cell: {Split.LIVE: live_ring()})
        sampler = LiveSampler(host.nodes, {c: Series(c) for c in cells}, SLOT_S,
                              clock=lambda: self.now)
        return SlotStarter(host, sampler)

    def restart(self, index: int) -> None:
        """Host `index` starts again: its cells hold nothing."""
        self.starters[index] = self._starter(list(self.starters[index].host.nodes))

    def sample(self, slot: int) -> None:
        """The start of `slot`: every host reads its sensors."""
        self.now = slot * SLOT_S
        for starter in self.starters:
            asyncio.run(starter.sampler.sample(slot))

    def flood(self, slot: int) -> list[Message]:
        """The edge's PARAMS and BATCH of `slot`, under its number (as `MqttEngine`)."""
        return self.edge.start(Mode.INFER, Split.LIVE, np.array([slot % LIVE_SLOTS]),
                               step=slot)

    def begin(self) -> list[Message]:
        """Halfway through the slot: each host starts it."""
        self.now = (int(self.now // SLOT_S) + 0.5) * SLOT_S
        return [m for starter in self.starters for m in starter.begin()]

    def route(self, messages: list[Message]) -> None:
        queue = list(messages)
        while queue:
            message = queue.pop(0)
            dst = message.header.dst
            if dst == EDGE:
                queue += self.edge.handle(message)
                continue
            name = self.topics.of(message.header)
            for starter in self.starters:
                if dst == ALL or dst in starter.host.nodes:
                    queue += starter.host.handle(name, message)

    def count(self, name: str) -> int:
        return sum(s.host.node_stats()[name] for s in self.starters)

    def failed(self) -> dict[Cell, str]:
        return {cell: why for s in self.starters for cell, why in s.host.failed.items()}


def test_hosts_start_slots_on_cached_params_and_take_the_same_slot_resent_once() -> None:
    model = _model()
    bench = Bench([TOP + BOTTOM], model)
    bench.sample(FIRST)
    bench.route(bench.flood(FIRST))  # the parameters go out with the first slot
    np.testing.assert_allclose(bench.edge.result.logits, central(model, FIRST), atol=1e-5)
    assert bench.begin() == []  # that slot's wave started with the PARAMS: not again
    for slot in (FIRST + 1, FIRST + 2):
        bench.sample(slot)
        bench.edge.start_slot(slot)
        gather = bench.begin()  # the hosts' clocks start it; their GATHER is held ...
        assert [m.header.kind for m in gather] == [Kind.GATHER]
        if slot == FIRST + 2:  # ... while the edge sends the slot's parameters again
            bench.route(bench.flood(slot))
        bench.route(gather)
        np.testing.assert_allclose(bench.edge.result.logits, central(model, slot), atol=1e-5)
    assert bench.failed() == {}  # no cell started a slot twice
    assert bench.count("duplicates") == 2 * len(TOP + BOTTOM)  # that PARAMS and BATCH
    assert bench.count("scheduled_slots") == 2 * len(TOP + BOTTOM)
    assert not any(k.startswith("rejected") for k in bench.starters[0].host.node_stats())


def test_a_restarted_host_gets_the_parameters_from_its_tree_parents_not_a_flood() -> None:
    """Host BOTTOM restarts: its cells reach the next slot without parameters, ask their
    tree parents, and those of TOP (or, once repaired, of BOTTOM) send theirs down, one
    message a link; the slot completes with no PARAMS from the edge, and from then on
    both hosts start slots by their clocks."""
    model = _model()
    bench = Bench([TOP, BOTTOM], model)
    bench.sample(FIRST)
    bench.route(bench.flood(FIRST))
    bench.restart(1)
    slot = FIRST + 1
    bench.sample(slot)
    bench.edge.start_slot(slot)
    sent_before = bench.edge.seq
    bench.route(bench.begin())
    np.testing.assert_allclose(bench.edge.result.logits, central(model, slot), atol=1e-5)
    assert bench.edge.seq == sent_before  # the edge sent nothing: the mesh repaired
    assert bench.count("rejected:slot_without_params") == len(BOTTOM)
    assert bench.count("params_repaired") == len(BOTTOM)
    assert bench.count("params_repairs_sent") == len(BOTTOM)  # one answer per asker
    bench.sample(slot + 1)
    bench.edge.start_slot(slot + 1)
    bench.route(bench.begin())
    np.testing.assert_allclose(bench.edge.result.logits, central(model, slot + 1), atol=1e-5)
    waves = [node.wave for node in bench.starters[1].host.nodes.values()]
    assert all(w.scheduled and w.step == slot + 1 for w in waves)  # by their clocks
    assert bench.failed() == {}


def test_other_params_for_a_started_slot_make_its_cells_forget_theirs() -> None:
    """The edge's model changed: a cell that started the slot on its cached parameters
    cannot take the new ones for it, so it forgets the old ones (the next slot gets the
    new ones sent) rather than computing every later slot on them."""
    model = _model()
    bench = Bench([TOP + BOTTOM], model)
    bench.sample(FIRST)
    bench.route(bench.flood(FIRST))
    bench.sample(FIRST + 1)
    bench.edge.start_slot(FIRST + 1)
    bench.begin()
    model.flat[0] += 1.0
    bench.route(bench.flood(FIRST + 1))
    host = bench.starters[0].host
    assert all(node.cached is None for node in host.nodes.values())
    assert host.node_stats()["params_changed"] == len(TOP + BOTTOM)
    assert bench.failed() == {}


def test_a_slot_the_sampler_skipped_reads_as_missing() -> None:
    """A ring place keeps its reading of LIVE_SLOTS slots before: a skipped slot must
    not offer it to a wave."""
    bench = Bench([TOP + BOTTOM], _model())
    node = bench.starters[0].host.nodes[(1, 1)]
    bench.sample(FIRST)
    bench.sample(FIRST + LIVE_SLOTS + 1)  # FIRST + LIVE_SLOTS, in FIRST's place, skipped
    assert np.isnan(node.readings[Split.LIVE][0, FIRST % LIVE_SLOTS])
    assert bench.starters[0].sampler.stats["skipped_slots"] == LIVE_SLOTS


# ----------------------------------------------------------------------- MQTT


class Published:
    """Counts the messages published on one topic filter by sender (the topic's
    publisher level: `edge`, `r1c2`), from a client of its own on a thread."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self.by_sender: Counter[str] = Counter()
        self._subscribed, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(host, port, name)),
                                        daemon=True)

    async def _main(self, host: str, port: int, name: str) -> None:
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(name, qos=1)
            self._subscribed.set()
            pending = asyncio.ensure_future(anext(client.messages))
            while not self._stop.is_set():
                done, _ = await asyncio.wait({pending}, timeout=0.1)
                if done:
                    self.by_sender[share_of(str(pending.result().topic))] += 1
                    pending = asyncio.ensure_future(anext(client.messages))
            pending.cancel()

    def __enter__(self) -> Published:
        self._thread.start()
        assert self._subscribed.wait(30), "the counting client did not subscribe"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _host(config, cells: list[Cell], address: BrokerAddress, name: str) -> BackgroundNodeHost:
    host = BackgroundNodeHost(config, cells, address,
                              Readings(sensors={c: Series(c) for c in cells}, slot_s=SLOT_S),
                              client=name)
    host.sampler.timeout_s = 10 * SLOT_S  # a busy machine may make a read slow
    return host


def _assert_central(model: CNN, alerts: list[dict]) -> None:
    for alert in alerts:
        assert "probability" in alert, alert
        want = anomaly_probability(central(model, alert["slot"]))
        assert alert["probability"] == pytest.approx(want, abs=1e-5), alert


def test_edge_serve_sends_the_params_once_and_alerts_as_central_inference(mosquitto) -> None:
    config, model = _config(), _model()
    address = BrokerAddress.parse(mosquitto.url)
    # Every PARAMS the broker carries, the edge's and any a node sends another host's.
    params = f"{ROOT}/{config.mesh.mesh_id}/+/+/{Kind.PARAMS.name.lower()}"
    with Published(mosquitto.host, mosquitto.port, params) as published, \
            _host(config, TOP, address, "host-top") as top, \
            _host(config, BOTTOM, address, "host-bottom") as bottom:
        # A wave that hears nothing for 5 slots is sent again: none should be.
        engine = MqttEngine(None, address, wave_timeout=5 * SLOT_S, max_attempts=3,
                            nodes_timeout=20)
        try:
            alerts = serve(engine, model, SLOT_S, slots=4)
        finally:
            engine.close()
        begun = sum(h.host.node_stats()["scheduled_slots"] for h in (top, bottom))
    _assert_central(model, alerts)
    assert engine.stats["slot_params_sent"] == 1 and engine.stats["scheduled_slots"] == 3
    edge = f"{ROOT}/{config.mesh.mesh_id}/edge"
    assert published.by_sender[edge] == 1  # the edge's PARAMS the broker carried
    # Any other PARAMS on the broker is a repair from one host's cell to the other's: a
    # loaded host may begin the next slot before it has handled the flood, and then asks.
    repairs = sum(node.stats["params_repairs_sent"]
                  for h in (top, bottom) for node in h.host.nodes.values())
    assert sum(published.by_sender.values()) - 1 <= repairs
    assert begun >= 3 * len(TOP + BOTTOM)  # the hosts started the last three slots


def test_restarted_node_hosts_get_the_params_again_over_mqtt(mosquitto) -> None:
    """Both node hosts start again (a power cut): no cell holds the parameters. The cell
    the edge is linked to asks the edge, every other cell its tree parent, and each
    answers once it holds them (the mesh's repair); should a slot stall anyway, the edge
    sends its PARAMS again. Either way the slots after give results."""
    config, model = _config(), _model()
    address = BrokerAddress.parse(mosquitto.url)
    engine = MqttEngine(None, address, wave_timeout=SLOT_S / 2, max_attempts=4,
                        nodes_timeout=20)
    try:
        with _host(config, TOP, address, "host-top"), \
                _host(config, BOTTOM, address, "host-bottom"):
            before = serve(engine, model, SLOT_S, slots=2)
        with _host(config, TOP, address, "host-top") as top, \
                _host(config, BOTTOM, address, "host-bottom") as bottom:
            after: list[dict] = []
            deadline = time.monotonic() + 120  # a hang guard, not a duration claim
            while sum("probability" in a for a in after[-2:]) < 2 and \
                    time.monotonic() < deadline:
                after += serve(engine, model, SLOT_S, slots=1)
            hosts = [top.host, bottom.host]
            begun = sum(h.node_stats()["scheduled_slots"] for h in hosts)
            repaired = sum(h.node_stats()["params_repaired"] for h in hosts)
            cached = all(n.cached is not None for h in hosts for n in h.nodes.values())
    finally:
        engine.close()
    _assert_central(model, before)
    _assert_central(model, after[-2:])
    assert engine.stats["slot_params_resent"] >= 1 or repaired == len(TOP + BOTTOM)
    # The last slot was a scheduled one: every new cell started it by its host's clock.
    assert cached and begun >= len(TOP + BOTTOM)
