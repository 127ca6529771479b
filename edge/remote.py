"""The training loop's engine for a mesh of real nodes, reached through an MQTT broker.

`MqttEngine` does for `meshdl.training.loop.train` what `MeshEngine` does in process: each
batch is one wave of the same `EdgeMachine`, whose messages now cross a broker to node
hosts (other processes, other machines). Before the first wave it waits until the node
hosts' status records cover every cell. A wave that hears nothing of its own for
`wave_timeout` seconds (a broker restart, a lost message; counted from its start or its
last message, so that a slow but moving wave goes on) is restarted under a new step
number, at most `max_attempts` times; the optimizer only ever sees a finished wave's
gradients, so a retried step is applied once. Past those attempts the edge goes on while
the wave fails only for loss (`Patience`): every cell's node host still heard, nothing
refused by the broker. A flood that keeps a host's broker queue full (Mosquitto drops its
genuine QoS 0 messages) loses waves for as long as it lasts; the edge then restarts with
a growing timeout until the wave is `Patience.total_s` old, and only then gives up (the
run keeps its checkpoint and goes on with `--resume`). A host gone or silent ends it at
once, as before: waiting would not bring it back.

Live inference (`live_logits`, `meshdl edge serve`) runs on scheduled slots: the first
slot's wave brings the parameters (PARAMS and BATCH to every node, which cache them), and
every later slot's wave is started by the node hosts' clocks, the edge only waiting for
its GATHER; it sends the parameters again only when a slot gave no result or the model
changed (`_slot`).

Before its first wave the edge also makes sure it is the only edge of the mesh and that
every node host runs the same mesh (and replays the same data):
- the lease: the edge's retained status topic (`meshdl/<mesh>/status/edge`) says which
  edge session holds the mesh, with a heartbeat every few seconds, and the broker turns
  it "offline" (the edge's last will) when that edge drops. A second edge refuses to start
  while a live edge holds it, unless told to take over; of two edges that both hold it
  (a take-over, or two started at the same moment) the one that took it last keeps it and
  the other stops, without a word on the lease;
- agreement: each node host's status record carries its mesh spec's summary and its
  data set's digest; the edge refuses, in one line naming the host and the fields that
  differ, to start waves with a host of another mesh or data.

What the mesh sent is counted as the virtual mesh counts it (meshdl/protocol/accounting.py,
the "comm" record of metrics.json: per class, `total_bytes`, `waves`): the edge's own
messages as it sends them, and the nodes' by the plan: the node hosts' messages cross no
link the edge sees (a host hands its own cells' messages over in process), but a wave
sends exactly the rows of `MeshSpec.sends` and `MeshSpec.relays` (tests/test_walk.py),
each of a size the plan fixes, so a finished wave adds them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from meshdl.config import RunConfig
from meshdl.data.augment import training_data
from meshdl.data.datasets import Dataset, data_digest
from meshdl.edge.agent import EdgeMachine, WaveEngine, WaveResult
from meshdl.errors import MeshdlError
from meshdl.limits import MAX_MESSAGE_BYTES
from meshdl.model.cnn import CNN
from meshdl.mqtt.sdnotify import Notifier, stop_task
from meshdl.mqtt.session import (
    HEARTBEAT_S,
    OPERATION_TIMEOUT_S,
    BrokerAddress,
    Session,
    close_loop,
)
from meshdl.mqtt.status import StatusRecord, parse_status
from meshdl.nodes.serve import MQTT_LEAST_MARGIN_S
from meshdl.protocol.accounting import Ledger
from meshdl.protocol.activations import FORWARD_KINDS, activation_bytes
from meshdl.protocol.auth import Authenticator, authenticator_for
from meshdl.protocol.deadlines import Learning, Policy
from meshdl.protocol.lifecycle import UNDER_WAY
from meshdl.protocol.messages import (
    BYTES,
    EDGE,
    FLOAT32,
    PROTOCOL_VERSION,
    SERVER,
    Header,
    Kind,
    Message,
    decode,
    encode,
    make,
)
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.protocol.topics import (
    ROOT,
    TopicNames,
    inbox_filter,
    name_of,
    status_topic,
    weights_topic,
)
from meshdl.protocol.topology import Cell
from meshdl.protocol.wire import Wire

STEP_CLOCK_EPOCH = 1_700_000_000  # 2023-11-14: wave numbers count 1/16 s from here
# A node host is heard while its heartbeats come (meshdl/mqtt/session.py): one every
# HEARTBEAT_S, but none while the last waits for its acknowledgement, up to
# OPERATION_TIMEOUT_S, which a flooded broker is slow to send. Two such gaps missed and it
# may be gone, though its last will has not come yet (15 s gave up on flooded hosts).
HEARD_S = 2 * (HEARTBEAT_S + OPERATION_TIMEOUT_S)
UNREAD_SLOTS_KEPT = 8  # slots whose unread cells the edge remembers (a slot is given
# up at most a few slots after it began)
EDGE_CLIENT = "edge"  # the edge's status topic, which is also the mesh's lease
LEASE_READ_S = 1.0  # how long a starting edge waits for a retained lease record


def clock_step() -> int:
    """A first wave number: sixteenths of a second since STEP_CLOCK_EPOCH, modulo the
    header's u32 (it wraps in 2032; steps compare in serial-number arithmetic). Not what
    keeps a restarted edge's waves apart from its predecessor's: the session does."""
    return int((time.time() - STEP_CLOCK_EPOCH) * 16) & 0xFFFFFFFF


@dataclass(frozen=True)
class Patience:
    """How long the edge keeps restarting a wave that gets no result (sans-I/O: the
    engine asks it with what it saw). The engine's first `max_attempts` attempts wait
    `wave_timeout` each, as ever. After them a wave that fails only for loss (its hosts
    heard, nothing refused) is restarted with a timeout `growth` times the last, up to
    `most_timeouts` wave timeouts (a flooded host may be slow rather than lossy, and
    restarting often only adds to the broker's queue), until it is `total_s` old."""

    total_s: float = 600.0
    growth: float = 1.5
    most_timeouts: float = 4.0

    def timeout(self, attempt: int, attempts: int, wave_timeout: float) -> float:
        """The wave timeout of attempt `attempt` (from 1) of a wave allowed `attempts`."""
        beyond = attempt - attempts
        if beyond <= 0:
            return wave_timeout
        return wave_timeout * min(self.growth ** beyond, self.most_timeouts)

    def goes_on(self, attempt: int, attempts: int, age_s: float, lost_only: bool) -> bool:
        """Whether attempt `attempt` of a wave `age_s` old may start."""
        return attempt <= attempts or (lost_only and age_s < self.total_s)


class MqttEngine(WaveEngine):
    """Computes every batch in the nodes of a real mesh, over MQTT."""

    def __init__(self, data: Dataset | None, broker: str | BrokerAddress, mesh_id: int = 1,
                 edge_at: Cell = (0, 0), wave_timeout: float = 10.0, max_attempts: int = 5,
                 nodes_timeout: float = 60.0, connect_timeout_s: float | None = 30.0,
                 systemd: Notifier | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 session: int | None = None, take_over: bool = False,
                 auth: Authenticator | None = None,
                 patience: Patience = Patience()) -> None:
        """`connect_timeout_s`: how long to wait for the broker (None: as long as it
        takes, for a service); `systemd`: the unit of this process (`meshdl edge ...`
        under systemd), told what the edge does and pinged while its loop turns;
        `take_over`: start even while another edge holds the mesh (it stops); `auth`:
        seals and opens the edge's messages (a mesh with `auth` on); `patience`: how
        long a wave that fails only for loss is tried past `max_attempts`."""
        # No data set: inference on live readings only (`meshdl edge serve`).
        self.labels = {} if data is None else {Split.TRAIN: data.y_train,
                                               Split.TEST: data.y_test}
        self.train_samples = 0 if data is None else len(data.y_train)
        self.data_digest: str | None = None  # of the data set node hosts must replay
        self.address = broker if isinstance(broker, BrokerAddress) else \
            BrokerAddress.parse(broker)
        self.mesh_id = mesh_id
        self.edge_at = edge_at
        self.max_message_bytes = max_message_bytes
        # The mesh's --compress policy and activation format (`for_run` sets them).
        self.compress, self.activations, self.delta = "none", "float32", None
        # This edge run's name in its waves: nodes follow a new session whatever the
        # steps their last edge reached (restarted after a fast run, across the wrap).
        # (`session`: None draws one; tests pass their own.)
        self.edge_session = int.from_bytes(os.urandom(2), "little") if session is None \
            else session
        self.wave_timeout = wave_timeout
        self.max_attempts = max_attempts
        self.patience = patience
        self._wave_began = 0.0  # when the current wave's first attempt started
        self._base_cap: float | None = None  # the edge machine's wave cap, as configured
        # Called when a wave first goes on past `max_attempts`: the training loop's
        # checkpoint of the updates done, so that a run stopped while the edge waits
        # out a flood loses none of them.
        self.on_stall: Callable[[], None] | None = None
        self.nodes_timeout = nodes_timeout
        self.connect_timeout_s = connect_timeout_s
        self.edge: EdgeMachine | None = None
        self.session: Session | None = None
        self.online: dict[str, set[Cell]] = {}  # client -> the cells it serves
        self.stale: dict[str, float] = {}  # client -> age (s) of a claim with no heartbeat
        self.hosts: dict[str, StatusRecord] = {}  # online node hosts' status records
        self.heard: dict[str, float] = {}  # online node host -> its last record (monotonic)
        # Live: slot -> host -> (cells it could not read, the first error), the newest
        # slots (`_heard_unread`).
        self.unread: dict[int, dict[str, tuple[str, str]]] = {}
        # Node hosts of this run whose status went offline (their last will, when they
        # dropped) and the cells they served, until they come back: a failing wave
        # names them.
        self.gone: dict[str, set[Cell]] = {}
        self.take_over = take_over
        self.auth = auth
        self.since = 0.0  # when this edge took the mesh (its lease record says so)
        self.taken_over: StatusRecord | None = None  # the edge that took the mesh from us
        self.stats: Counter[str] = Counter()
        # What the mesh sent, as the virtual mesh counts it (made with the first wave's
        # edge), and the nodes' messages of a wave by the plan, by (spec, training, batch).
        self.ledger: Ledger | None = None
        self._planned: dict[tuple[int, bool, int], tuple[MeshSpec, list[Header]]] = {}
        self.systemd = systemd or Notifier({})
        self._keep_alive: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._threadpools = ThreadpoolController()  # found once: a lookup costs ~0.5 ms
        self._routes = TopicNames(mesh_id)
        # Best effort (`mesh.recovery`): the fill-in policy and how deadlines are learnt;
        # `say` hears of each change of the cells the edge plans around.
        self.best_effort: tuple[Policy, Learning] | None = None
        self.say: Callable[[str], None] = lambda line: None
        self._dead_said: frozenset[Cell] = frozenset()
        # Several meshes training one model: where the parameter server's weights go
        # (meshdl/training/edge_run.py); None: this edge trains alone.
        self.on_weights: Callable[[Message], None] | None = None
        self._weights_topic = weights_topic(mesh_id)
        # Live inference on scheduled slots (`live_logits`): the PARAMS the edge last sent
        # into the mesh (what the nodes cache), and whether a slot gave a result on them
        # since (else the next slot sends them again).
        self._slot_params: np.ndarray | None = None
        self._params_held = False

    @classmethod
    def for_run(cls, config: RunConfig, data: Dataset | None, broker: str | BrokerAddress,
                **options: Any) -> MqttEngine:
        """The edge of the mesh `config` describes, holding the labels of the view of
        `data` the run trains on (with its mirrors, as the node hosts build it)."""
        view = None if data is None else training_data(config.train, data)
        spec = MeshSpec(config.mesh.mesh_id, config.model, config.mesh.edge_at, "broadcast",
                        config.mesh.max_message_bytes, config.mesh.auth,
                        compress=config.mesh.compress, activations=config.mesh.activations,
                        delta=config.mesh.delta)
        auth = authenticator_for(spec, [EDGE], config.mesh.keys, config.mesh.auth)
        engine = cls(view, broker, config.mesh.mesh_id, config.mesh.edge_at,
                     max_message_bytes=config.mesh.max_message_bytes, auth=auth, **options)
        engine.data_digest = None if data is None else data_digest(data)
        engine.compress, engine.activations = config.mesh.compress, config.mesh.activations
        engine.delta = config.mesh.delta
        if config.mesh.recovery == "best-effort":
            engine.best_effort = (Policy(config.mesh.policy),
                                  Learning(config.mesh.patience, MQTT_LEAST_MARGIN_S))
        return engine

    # ------------------------------------------------------------- the engine
    def live_logits(self, model: CNN, slot: int, begins_in: float = 0.0) -> np.ndarray:
        """(1, classes) logits of the nodes' live readings of time slot `slot`, whose wave
        the node hosts start by their clocks in `begins_in` seconds (halfway through the
        slot: `meshdl.nodes.live.SlotStarter`). The edge listens from now on; it sends
        PARAMS and BATCH (then, not before: the readings must be in) only when the nodes
        may not hold the model's parameters (see `_slot`)."""
        self._edge_for(model)
        with self._threadpools.limit(limits=1):  # as `_run`
            result = self._loop.run_until_complete(self._slot(slot, begins_in))
        self._say_dead()
        return result.logits

    def report(self) -> dict[str, Any]:
        """What the mesh sent, as the virtual mesh reports it (`total_bytes`, `waves`,
        per class; the nodes' messages by the plan), then the transport's own counts:
        the edge's connection, the machine's and the engine's, and the cells the edge
        found dead (best effort)."""
        session = self.session.stats if self.session else Counter()
        edge = self.edge.stats if self.edge else Counter()
        dead = sorted(self.edge.spec.dead) if self.edge else []
        mesh = self.ledger.report() if self.ledger is not None else {}
        if mesh:
            # Where a payload's length depends on its values (intsum's REDUCE codes, a
            # live HALO of changes only), the plan gives its bound, or its full size.
            spec = self.edge.spec if self.edge else None
            mesh["nodes_counted_by"] = "plan"
            mesh["bytes_exact"] = spec is None or (spec.reduce_sum is None and
                                                   spec.delta is None)
        return {**mesh, "transport": "mqtt", "broker": str(self.address),
                "edge": dict(edge), "session": dict(session), "engine": dict(self.stats),
                "node_hosts": sorted(self.online),
                "dead_cells": [name_of(cell) for cell in dead]}

    def idle(self, seconds: float) -> None:
        """Wait between waves with the connection alive: keepalive pings, heartbeats and
        status records keep flowing (a loop that stood still would be dropped by the
        broker after 1.5 keepalive periods)."""
        if self.session is None:
            time.sleep(max(seconds, 0.0))
            return
        deadline = time.monotonic() + seconds
        self.run_coroutine(self.session.run(self._handle,
                                            until=lambda: time.monotonic() >= deadline))

    def wait_until(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Take messages (the server's weights among them) until `condition()` holds or
        `seconds` pass; whether it holds."""
        deadline = time.monotonic() + seconds
        self.run_coroutine(self._session())
        self.run_coroutine(self.session.run(
            self._handle, until=lambda: condition() or time.monotonic() >= deadline))
        return condition()

    def send(self, messages: list[Message]) -> None:
        """Publish messages of this edge's own (its pushes to the server)."""
        self.run_coroutine(self._session())
        self.run_coroutine(self.session.send(messages))

    def run_coroutine(self, coroutine: Any) -> Any:
        """Run a coroutine on the engine's loop (its session lives there)."""
        return self._loop.run_until_complete(coroutine)

    def open(self, model: CNN) -> None:
        """Connect and wait until node hosts cover every cell (the first wave does it
        otherwise): `meshdl edge serve` does this before it waits for its first slot."""
        self._edge_for(model)
        self._loop.run_until_complete(self._session())

    def close(self) -> None:
        """Say goodbye and release the loop (again: nothing more)."""
        if self._loop.is_closed():
            return
        self.systemd.stopping()
        if self.session is not None:
            self._loop.run_until_complete(self.session.close())
        self._loop.run_until_complete(stop_task(self._keep_alive))
        close_loop(self._loop)

    # ---------------------------------------------------------------- waves
    def _edge_for(self, model: CNN) -> EdgeMachine:
        if self.edge is None or self.edge.model is not model:
            spec = MeshSpec(self.mesh_id, model.config, self.edge_at, "broadcast",
                            self.max_message_bytes, self.auth is not None,
                            compress=self.compress, activations=self.activations,
                            delta=self.delta)
            # Above the clock, and above this engine's own earlier waves.
            first = clock_step() if self.edge is None else self.edge.step + 1
            self.edge = EdgeMachine(spec, model, self.labels, first_step=first,
                                    wave_timeout=self.wave_timeout, session=self.edge_session)
            self._base_cap = self.edge.wave_cap
            self.ledger = self.ledger or Ledger(spec)
            if self.best_effort is not None:  # deadlines learnt; dead cells planned around
                self.edge.learn_deadlines(*self.best_effort)
                self.edge.watch_health = True
        return self.edge

    def spec_for(self, model: CNN) -> MeshSpec:
        return self._edge_for(model).spec

    def _run(self, model: CNN, mode: Mode, split: Split, indices: np.ndarray,
             failout: np.ndarray | None = None) -> WaveResult:
        self._edge_for(model)
        # One BLAS thread, as in the virtual mesh: the head's products then sum in the
        # same order there and here, and a run gives the same bytes on any machine.
        with self._threadpools.limit(limits=1):
            result = self._loop.run_until_complete(self._wave(mode, split, indices, failout))
        self._say_dead()
        return result

    def _say_dead(self) -> None:
        """Say so when the cells the edge plans around changed (best effort)."""
        dead = self.edge.spec.dead
        if dead != self._dead_said:
            self._dead_said = dead
            self.say(f"wave {self.edge.step}: planning around dead cells "
                     f"{', '.join(name_of(c) for c in sorted(dead)) or '(none)'}")

    async def _wave(self, mode: Mode, split: Split, indices: np.ndarray,
                    failout: np.ndarray | None = None) -> WaveResult:
        session = await self._session()
        edge = self.edge
        self._view(edge)
        # Each wave starts with the configured timeouts (a patient wave's grew).
        edge.wave_timeout, edge.wave_cap = self.wave_timeout, self._base_cap
        self._wave_began = time.monotonic()
        await session.send(self._sent(edge.start(mode, split, indices, now=time.monotonic(),
                                                 failout=failout)))

        async def tick() -> None:
            self._check_still_ours()
            again = edge.tick(time.monotonic())
            if again:
                self._go_on(edge, time.monotonic())
                await session.send(self._sent(again))  # (the edge machine counts the restart)

        await session.run(self._handle, tick=tick, until=lambda: edge.result is not None)
        self._count_nodes(edge.spec, mode == Mode.TRAIN, len(indices), edge.step)
        return edge.result

    def _view(self, edge: EdgeMachine) -> None:
        """Best effort: the cells no online node host serves are down, in the edge's own
        view (`EdgeMachine.view_down`): at the start those no host answered for (the
        roll call of `_wait_for_nodes`), later a host's last will or goodbye, and a
        host back online brings its cells back. The plan goes around them from this
        wave on, without waiting out their silence."""
        if self.best_effort is not None and self.session is not None:
            edge.view_down(self.uncovered(edge.spec))

    def _go_on(self, edge: EdgeMachine, now: float) -> None:
        """The edge machine restarted the wave: raise (why the wave got no result) unless
        `Patience` lets this attempt go on; past `max_attempts`, with a longer timeout."""
        attempt, allowed = edge.attempts, self.max_attempts
        lost_only = self.lost_only(edge.spec, now)
        if not self.patience.goes_on(attempt, allowed, now - self._wave_began, lost_only):
            raise MeshdlError(self._no_result(edge, patient_at=now if attempt > allowed + 1
                                              else None))
        if attempt <= allowed:
            return
        if attempt == allowed + 1:
            self.stats["patient_waves"] += 1
            if self.on_stall is not None:  # keep what is done before waiting on
                self.on_stall()
            self.say(f"wave {edge.step}: no result in {allowed} attempts, but every node "
                     "host is heard and nothing was refused (messages lost, as under a "
                     "flood): trying on for up to "
                     f"{self.patience.total_s - (now - self._wave_began):.0f} s more")
        self.stats["patient_restarts"] += 1
        grown = self.patience.timeout(attempt, allowed, self.wave_timeout)
        edge.wave_timeout = grown
        if self._base_cap is not None:
            edge.wave_cap = self._base_cap * grown / self.wave_timeout

    def lost_only(self, spec: MeshSpec, now: float) -> bool:
        """Whether a wave without result can only have lost messages: the broker refused
        nothing (of the edge's, or a host's by its status record), no node host of this
        run went offline, and every cell's host was heard (a status record) within
        HEARD_S of `now` (monotonic). A host that stopped or hangs, or a message the
        broker will never take, does not get better by waiting."""
        if self.gone or any(k.startswith("refused:") for k in
                            (self.session.stats if self.session else Counter())):
            return False
        if any(record.refused for record in self.hosts.values()):
            return False
        heard = [self.online[c] for c, at in self.heard.items()
                 if c in self.online and now - at <= HEARD_S]
        return not set(spec.topology.cells()) - set().union(*heard)

    # --------------------------------------------------------- scheduled slots
    async def _slot(self, slot: int, begins_in: float) -> WaveResult:
        """The wave of live slot `slot`. When the last slot gave a result on the model's
        parameters as they are, the nodes hold them: the slot is scheduled, and the edge
        only waits for its GATHER (`EdgeMachine.start_slot`). Otherwise (the first slot,
        a slot after one that gave none, or the model changed) the edge sends PARAMS and
        BATCH of the slot, under its number, when the nodes start it. A slot that hears
        nothing for `wave_timeout` after that (or is the wave cap old) gets them again,
        under the same number, up to `max_attempts` sends in all: the nodes that started
        it go on (`SlotStarter` keeps them from starting it twice), the others (a host
        that just started) start it, and their messages complete the wave."""
        session = await self._session()
        edge = self.edge
        self._view(edge)
        begins = time.monotonic() + max(begins_in, 0.0)
        held, self._params_held = self._params_held, False  # until this slot's result
        if not (held and self._listen(edge, slot)):
            # Another plan (cells went down or came back) goes out now, ahead of the
            # nodes' clocks (the slot's readings are in: sampled at its start), so that
            # no node starts the slot on the plan it cached; else at the nodes' start.
            if edge.sent_params is None or edge.sent_plan == edge.spec.plan_key:
                await session.run(self._handle, until=lambda: time.monotonic() >= begins)
            await self._send_params(session, edge, slot)
        attempts = 1

        async def tick() -> None:
            nonlocal attempts
            self._check_still_ours()
            now = time.monotonic()
            if edge.next_deadline() is not None:  # best effort: fills in, never sends again
                edge.tick(now)
                return
            if not self._stalled(edge, begins, now):
                return
            attempts += 1
            if attempts > self.max_attempts:
                raise MeshdlError(self._no_result(edge))
            self.stats["slot_params_resent"] += 1
            await self._send_params(session, edge, slot)

        await session.run(self._handle, tick=tick, until=lambda: edge.result is not None)
        self._params_held = True
        self._count_nodes(edge.spec, False, 1, edge.step)
        return edge.result

    def _listen(self, edge: EdgeMachine, slot: int) -> bool:
        """Wait for slot `slot`'s GATHER from the nodes' cached parameters; False if
        they are not the model's (it changed since its PARAMS went out)."""
        try:
            edge.start_slot(slot, time.monotonic())
        except MeshdlError:
            return False
        self.stats["scheduled_slots"] += 1
        return True

    async def _send_params(self, session: Session, edge: EdgeMachine, slot: int) -> None:
        """PARAMS and BATCH of slot `slot`'s sample, to every node, under the slot's
        number. Parameters other than those sent before: the nodes that started the slot
        on the old ones compute it on them (they forget them for the next slot), so its
        result could mix both: `MeshdlError`, the slot gives none."""
        await session.send(self._sent(edge.start(Mode.INFER, Split.LIVE,
                                                 np.array([slot % LIVE_SLOTS]),
                                                 time.monotonic(), step=slot & 0xFFFFFFFF)))
        self.stats["slot_params_sent"] += 1
        before, self._slot_params = self._slot_params, edge.sent_params
        if before is not None and not np.array_equal(before, edge.sent_params):
            raise MeshdlError(f"slot {slot}: the model changed; its parameters went out "
                              "with this slot, whose result could mix them with the last "
                              "ones: the next slot computes on them")

    def _stalled(self, edge: EdgeMachine, begins: float, now: float) -> bool:
        """Nothing of the slot's wave for `wave_timeout` since the nodes started it, the
        edge sent it or last heard of it, or it is the edge's wave cap old: when
        `EdgeMachine.tick` would restart a wave."""
        if edge.phase not in UNDER_WAY:
            return False
        return now - max(edge.heard_at, begins) >= self.wave_timeout or (
            edge.wave_cap is not None and now - max(edge.started_at, begins) >= edge.wave_cap)

    # ------------------------------------------------------------ counting
    def _sent(self, messages: list[Message]) -> list[Message]:
        """The edge's own messages, counted as sent."""
        if self.ledger is not None:
            self.ledger.record_all(messages)
        return messages

    def _count_nodes(self, spec: MeshSpec, training: bool, batch: int, step: int) -> None:
        """A finished wave: the nodes sent the plan's messages (counted under the wave's
        step, after the edge's own, as the ledger tallies wave by wave)."""
        if self.ledger is None:
            return
        key = (id(spec), training, batch)
        planned = self._planned.get(key)
        if planned is None or planned[0] is not spec:
            planned = self._planned[key] = (spec, node_messages(spec, training, batch))
        self.ledger.record_all([Message(h._replace(step=step), None) for h in planned[1]])
        self.ledger.tally()

    def _no_result(self, edge: EdgeMachine, patient_at: float | None = None) -> str:
        """Why a wave may have got no result: what the broker said it refused, if it
        did, else the questions to ask. `patient_at`: it was tried on past
        `max_attempts` (it failed only for loss until then), given up at that time."""
        if patient_at is not None and self.lost_only(edge.spec, patient_at):
            return (f"wave {edge.step} got no result in {edge.attempts - 1} attempts over "
                    f"{patient_at - self._wave_began:.0f} s although every node "
                    "host was heard: its messages were lost all that time (a host's "
                    "broker queue kept full, as by a flood from a stolen login: the "
                    "broker logs 'Outgoing messages are being dropped')")
        unread = self._unread(edge.step)
        if unread:  # a live slot: never computed without every cell's reading
            return (f"slot {edge.step}: no valid reading of "
                    f"{'; '.join(unread)}: a slot is computed only on every cell's reading")
        what = f"wave {edge.step} got no result in {self.max_attempts} attempts (each " \
               f"given up after {self.wave_timeout:g} s without a message of it)"
        refused = Counter({k.removeprefix("refused:"): n for k, n in
                           (self.session.stats if self.session else Counter()).items()
                           if k.startswith("refused:")})
        by: list[str] = [] if not refused else ["the edge"]
        for client, record in sorted(self.hosts.items()):
            if record.refused:
                refused.update(record.refused)
                by.append(f"node host {client}")
        if refused.get("packet_too_large"):
            return (f"{what}: the broker refused messages as too large (from "
                    f"{', '.join(by)}): mesh.max_message_bytes ({edge.spec.max_message_bytes}) "
                    "must not exceed what it takes (its max_packet_size and "
                    "message_size_limit)")
        if refused:
            return (f"{what}: the broker refused messages from {', '.join(by)} "
                    f"({', '.join(f'{n} {why}' for why, n in sorted(refused.items()))})")
        if self.gone:  # the broker said so for them: the likeliest cause, named
            names = ", ".join(sorted(self.gone))
            cells = sum(len(served) for served in self.gone.values())
            hosts, wills, them = ("node host", "its last will", "it") \
                if len(self.gone) == 1 else ("node hosts", "their last wills", "them")
            return (f"wave {edge.step} failed: {hosts} {names} went offline ({wills}; "
                    f"{cells} cells unserved) and {self.max_attempts} attempts got no "
                    f"result: start {them} again (`meshdl nodes run`)")
        # The edge's own connection broke (the broker dropped it, for instance for a
        # missed keepalive while its loop was busy): that lost the waves, not the hosts.
        stats = self.session.stats if self.session else Counter()
        if stats["reconnects"]:
            return (f"{what}: the broker dropped this edge {stats['reconnects']} times "
                    "in this run (a keepalive missed while its loop was busy, or the broker "
                    f"restarting); {self.stats['rejected:unsigned_status']} unsigned and "
                    f"{self.stats['rejected:bad_status']} invalid status records were "
                    "ignored")
        return (f"{what}; are all node hosts running (`meshdl doctor --broker "
                f"{self.address}`), and does the broker take messages of "
                f"{edge.spec.max_message_bytes} bytes (mesh.max_message_bytes vs its "
                "message_size_limit)?")

    def _unread(self, step: int) -> list[str]:
        """The cells the node hosts said they could not read for live slot `step` (its
        wave number), with the first error of each host's: "r1c2 (node host north:
        r1c2: no answer on the 1-wire bus)"."""
        said = self.unread.get(step, {})
        return [f"{cells} (node host {client}: {error})"
                for client, (cells, error) in sorted(said.items())]

    def _heard_unread(self, client: str, record: StatusRecord) -> None:
        """Keep what a host's record says it could not read, by slot: by the time a
        slot's wave is given up, the host may be telling of the next one."""
        if not record.unread or record.unread_slot is None:
            return
        slot = record.unread_slot & 0xFFFFFFFF
        self.unread.setdefault(slot, {})[client] = (", ".join(record.unread),
                                                    record.unread_error or "no reading")
        while len(self.unread) > UNREAD_SLOTS_KEPT:
            del self.unread[next(iter(self.unread))]

    def _handle(self, topic: str, message: Message) -> list[Message]:
        """A message from the broker: its topic must be the edge's inbox (or the server's
        weights for it) and agree with its header (the topic is what the broker's ACL
        checked)."""
        if topic == self._weights_topic and self.on_weights is not None:
            h = message.header
            if (h.src, h.dst, h.kind) != (SERVER, EDGE, Kind.WEIGHTS):
                self.stats["rejected:topic_mismatch"] += 1
            else:
                self.on_weights(message)
            return []
        route = self._routes.route(topic)
        if route is None or (route.src, route.dst) != (self.edge_at, EDGE):
            self.stats["rejected:bad_topic"] += 1
            return []
        if not route.agrees_with(message.header):
            self.stats["rejected:topic_mismatch"] += 1
            return []
        return self._sent(self.edge.handle(message, time.monotonic()))

    async def _session(self) -> Session:
        """The connection, opened on first use; then every cell's host must be online,
        running this edge's mesh."""
        if self.session is None:
            spec = self.edge.spec
            status = f"{ROOT}/{self.mesh_id}/status/#"
            # The watchdog runs from READY on, so the pings start with it; waiting for
            # the broker keeps them going.
            self._keep_alive = self._keep_alive or self.systemd.start_keep_alive()
            self.systemd.ready(f"connecting to {self.address}")
            await self._check_lease()
            self.since = time.time()
            server = [self._weights_topic] if self.on_weights is not None else []
            session = Session(self.address, self.mesh_id, EDGE_CLIENT,
                              [inbox_filter(self.mesh_id, spec.edge_at, EDGE), status,
                               *server],
                              status={"role": "edge", "session": self.edge_session,
                                      "since": self.since},
                              on_status=self._status, connect_timeout_s=self.connect_timeout_s,
                              wire=Wire(self.mesh_id, self.auth),
                              sign_status=None if self.auth is None else self.auth.sign_status)
            await session.connect()
            self.session = session
            self.systemd.status(f"connected to {self.address}; waiting for node hosts")
            self._warm_up(spec)
            await self._wait_for_nodes(spec)
            self.systemd.status(f"running waves of mesh {self.mesh_id} on {self.address}")
        return self.session

    def _warm_up(self, spec: MeshSpec) -> None:
        """Compile (or load from Numba's cache) what a wave runs at the edge: the codec's
        check and the head, forward and backward, so that no wave's deadline pays for it."""
        decode(encode(make(Kind.GATHER, self.mesh_id, 0, spec.edge_at, EDGE,
                           np.zeros((1, 1, 1), np.float32))))
        model = self.edge.model
        rows, cols = spec.model.pooled_shape
        trace = model.head_forward(np.zeros((model.config.filters, rows, cols, 1), np.float32))
        model.head_backward(trace, np.zeros_like(trace.logits))

    async def _check_lease(self) -> None:
        """Refuse to start while another edge holds the mesh (unless taking over): read
        the lease, the edge's retained status, without writing anything."""
        lease: list[StatusRecord] = []

        def read(client: str, payload: bytes, retained: bool) -> None:
            record = self._parse_status(payload)
            if client == EDGE_CLIENT and record is not None:
                lease.append(record)

        probe = Session(self.address, self.mesh_id, f"edge-lease-{os.getpid()}",
                        [status_topic(self.mesh_id, EDGE_CLIENT)], on_status=read,
                        presence=False, connect_timeout_s=self.connect_timeout_s)
        async with probe:  # a retained record comes right after the subscription
            deadline = time.monotonic() + LEASE_READ_S
            await probe.run(lambda _t, _m: [], until=lambda: bool(lease) or
                            time.monotonic() > deadline)
        holder = lease[-1] if lease else None
        if holder is None or holder.role != "edge" or holder.state != "online" or \
                not holder.fresh(time.time(), retained=True):
            return
        if self.take_over:
            self.stats["took_over"] += 1
            return
        raise MeshdlError(
            f"another edge holds mesh {self.mesh_id} (session {holder.session}, heartbeat "
            f"{time.time() - (holder.time or 0):.0f} s ago): stop it, or pass --take-over "
            "to take the mesh from it")

    def _check_still_ours(self) -> None:
        taker = self.taken_over
        if taker is not None:
            raise MeshdlError(f"another edge (session {taker.session}) took mesh "
                              f"{self.mesh_id} over: this edge stops")

    def _status(self, client: str, payload: bytes, retained: bool) -> None:
        """A client's status: which cells a node host serves, while online and alive;
        for the edge's own topic, who holds the mesh."""
        record = self._parse_status(payload)
        if record is None:
            return
        if client == EDGE_CLIENT:
            self._lease_record(record)
            return
        self.stale.pop(client, None)
        served = self.online.pop(client, None)
        self.hosts.pop(client, None)
        self.heard.pop(client, None)
        if served and record.state == "offline":  # a host of this run: its will, or bye
            self.gone[client] = served
        if record.role != "node-host" or record.mesh != self.mesh_id or not record.served:
            return
        if record.fresh(time.time(), retained):
            self.online[client] = record.served
            self.hosts[client] = record
            self._heard_unread(client, record)
            if not retained:  # published now, not replayed: the host is alive
                self.heard[client] = time.monotonic()
            self.gone.pop(client, None)  # back
        else:  # a claim with no heartbeat behind it: named if cells stay uncovered
            self.stale[client] = time.time() - (record.time or 0.0)

    def _parse_status(self, payload: bytes) -> StatusRecord | None:
        """A valid status record; in a mesh that authenticates, only one its writer signed
        (a node host for every cell it claims, the edge with its key). Others are counted."""
        record = parse_status(payload)
        if record is None:
            self.stats["rejected:bad_status"] += 1
            return None
        if self.auth is not None and record.role in ("node-host", "edge") and \
                not self.auth.verify_status(json.loads(payload)):
            self.stats["rejected:unsigned_status"] += 1
            return None
        return record

    def _lease_record(self, record: StatusRecord) -> None:
        """Another edge's record on the lease: the one that took the mesh last keeps it
        (ties: the higher session). The loser leaves the lease as it is."""
        if record.role != "edge" or record.state != "online" or \
                record.session in (None, self.edge_session):
            return
        if (record.since or 0.0, record.session) > (self.since, self.edge_session):
            self.taken_over = record
            if self.session is not None:
                self.session.presence = False  # no "offline" over the new holder's lease

    def _check_agreement(self, spec: MeshSpec) -> None:
        """Every node host runs this mesh, and replays this data set (if it replays one)."""
        for client, record in sorted(self.hosts.items()):
            if record.spec is None:
                raise MeshdlError(f"node host {client} does not say which mesh it runs "
                                  "(a meshdl older than this edge?)")
            differ = spec.differences(record.spec)
            if differ:
                raise MeshdlError(f"node host {client} runs another mesh: "
                                  f"{', '.join(differ)}; give it this edge's mesh file")
            if self.data_digest is not None and record.data is not None and \
                    record.data != self.data_digest:
                raise MeshdlError(f"node host {client} replays another data set (digest "
                                  f"{record.data}, here {self.data_digest}); give it the "
                                  "edge's --data file")

    def uncovered(self, spec: MeshSpec) -> set[Cell]:
        """Cells no online node host serves."""
        served = set().union(*self.online.values()) if self.online else set()
        return set(spec.topology.cells()) - served

    async def _wait_for_nodes(self, spec: MeshSpec) -> None:
        deadline = time.monotonic() + self.nodes_timeout
        await self.session.run(lambda _t, _m: [], until=lambda: not self.uncovered(spec) or
                               time.monotonic() > deadline)
        self._check_still_ours()
        missing = self.uncovered(spec)
        # Best effort: the roll call is over; cells nobody serves are planned around
        # (`_view`), as long as the cell the edge is linked to answered.
        around = bool(missing) and self.best_effort is not None and \
            spec.edge_at not in missing
        if not missing or around:
            self._check_agreement(spec)
        if around:
            names = ", ".join(name_of(c) for c in sorted(missing)[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            self.say(f"{len(missing)} cells have no node host online after "
                     f"{self.nodes_timeout:g} s: {names}{more}; the waves go around them "
                     "(best effort) until a host serves them")
        elif missing:
            names = ", ".join(name_of(c) for c in sorted(missing)[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            stale = "".join(f"; {client}'s status claims cells but is {age:.0f} s old, "
                            "with no heartbeat since" for client, age in sorted(self.stale.items()))
            raise MeshdlError(f"{len(missing)} cells have no node host online after "
                              f"{self.nodes_timeout:g} s: {names}{more} "
                              f"(start them with `meshdl nodes run`){stale}")


def node_messages(spec: MeshSpec, training: bool, batch: int) -> list[Header]:
    """The headers of every message the nodes send in one wave of `batch` samples, by
    the plan (`MeshSpec.sends` and `MeshSpec.relays`: forward rows, and in a training
    wave the backward ones and the REDUCE up the tree), each of the shape and type the
    node machines send (float32 items (cells, channels, batch), or a codec's bytes).
    Not HEALTH, sent only when best effort finds silence; not PARAMS or BATCH, which
    over MQTT only the edge sends (to every node at once)."""
    headers = []
    activations = spec.activation_codec
    for src, rows in spec.sends.items():
        if src == EDGE:
            continue
        for row in rows:
            if row.train_only and not training:
                continue
            channels, _ = spec.item_shape(row.field, batch)
            shape = (len(row.items), channels, batch)
            dtype = FLOAT32
            if activations is not None and row.kind in FORWARD_KINDS:
                shape, dtype = (activation_bytes(activations, shape),), BYTES
            headers.append(_header(spec, row.kind, row.layer, row.phase, src, row.dst,
                                   shape, dtype))
    if training:
        for src, rows in spec.relays.items():
            for row in rows:
                if src != EDGE and row.kind == Kind.REDUCE:
                    shape, dtype = _reduce_payload(spec, src)
                    headers.append(_header(spec, row.kind, 0, 0, src, row.dst, shape, dtype))
    return headers


def _reduce_payload(spec: MeshSpec, src: Cell) -> tuple[tuple[int, ...], int]:
    """(shape, dtype) of the REDUCE `src` sends: float32 partial gradients, a codec's
    bytes, or intsum's codes (at most their bound: their length depends on the sums)."""
    if spec.reduce_sum is not None:
        return (spec.reduce_sum.max_nbytes(spec.topology.subtree_sizes.get(src, 1)),), BYTES
    if spec.reduce_codec is not None:
        return (spec.reduce_codec.nbytes,), BYTES
    return (spec.reduce_size,), FLOAT32


def _header(spec: MeshSpec, kind: Kind, layer: int, phase: int, src: Cell, dst: Cell,
            shape: tuple[int, ...], dtype: int) -> Header:
    return Header(PROTOCOL_VERSION, kind, spec.mesh_id, 0, layer, phase, src, dst, 0, dtype,
                  shape)
