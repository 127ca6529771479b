"""The virtual mesh: every node machine and the edge machine of one mesh in one process.

Each cell is served by a `NodeHost` of its own, as by one Raspberry Pi over MQTT, so a
message takes a deployment's path: topic checked against header, then the cell's
machine (a cell that raises is isolated and named when the wave stalls). Agents talk
only through `VirtualBroker` topics; the broker delivers in rounds (one
round = one hop), which is the mesh's virtual clock. With `wire=True` (and always under
fault injection) every message crosses as bytes through the real codec, exactly as over
Mosquitto; by default the agents' messages cross as immutable objects, which computes the
same results (a test shows it) and counts the same bytes (the ledger sizes messages from
their headers) in less than half the time per wave. Bytes published from outside
(`inject`) are always decoded and validated. A mesh whose spec authenticates (`auth`)
always crosses as bytes: each party seals its messages with its own keys and opens what
it receives, exactly as a node host does (meshdl/protocol/auth.py). The parties (node
hosts, edge, ledger) are built as for the mesh under simulated time (sim/parties.py).
`VirtualMesh.run_wave`, as `TimedMesh.run_wave`, runs one wave to its end and returns
its result (a plain call: nothing in it waits on anything outside the process);
`MeshEngine` adapts it to the training loop's `Engine` protocol.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from meshdl.config import ModelConfig
from meshdl.data.augment import as_read_by, mirrors_of
from meshdl.data.datasets import Dataset
from meshdl.edge.agent import EdgeMachine, WaveEngine, WaveResult
from meshdl.errors import MeshdlError, NonFiniteError
from meshdl.limits import MAX_MESSAGE_BYTES
from meshdl.model.cnn import CNN
from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.host import NodeHost
from meshdl.protocol.auth import Authenticator, MeshKeys
from meshdl.protocol.messages import EDGE, Message
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import TopicNames, inbox_filter, name_of
from meshdl.protocol.topology import Cell
from meshdl.protocol.wire import Wire
from meshdl.sim.broker import VirtualBroker
from meshdl.sim.compiled import CompiledWaves, compiled_applies
from meshdl.sim.faults.chaos import Chaos, Forger
from meshdl.sim.parties import MeshParties


class VirtualMesh:
    """Nodes, edge, broker and ledger of one simulated mesh."""

    def __init__(self, spec: MeshSpec, readings: dict[int, np.ndarray], model: CNN,
                 labels: dict[int, np.ndarray], max_rounds: int | None = None,
                 chaos: Chaos | None = None, wire: bool = False,
                 keys: MeshKeys | None = None, memory_plan: bool = True,
                 compiled: bool = False, originals: int | None = None) -> None:
        """`readings[split]` holds maps, (samples, [in_channels,] rows, cols): each node
        gets its cell's. `keys`: those of an authenticating mesh (default: from seed 0).
        `memory_plan`: see `MeshParties`. `compiled`: run every exact wave through the
        compiled dispatch (sim/compiled.py: the same values, counts and rounds, without
        a Python call per message); the others, and scheduled slots, go through the
        machines. `originals`: see `MeshParties`."""
        self.spec = spec
        self.compiled = compiled
        self._compiled: CompiledWaves | None = None  # built by the first compiled wave
        self.broker = VirtualBroker()
        self.chaos = chaos
        # Faults are injected into bytes; tags are computed over them.
        self.wire = wire or chaos is not None or spec.auth
        # Each party seals what it sends and opens what it receives with its own keys.
        self.auth: dict[Cell, Authenticator] = {}
        if spec.auth:
            keys = keys or MeshKeys.from_seed(0)
            self.auth = {party: Authenticator(keys.keyring(spec, [party]))
                         for party in [*spec.topology.cells(), EDGE]}
            if chaos is not None and chaos.forger_cell is not None:
                chaos.forger = Forger(keys.keyring(spec, [chaos.forger_cell]),
                                      chaos.forger_cell, chaos.rng)
        if chaos is not None and chaos.shuffle:
            self.broker.shuffle = chaos.rng
        topo = spec.topology
        self.parties = MeshParties(spec, readings, model, labels, memory_plan, originals)
        self.ledger = self.parties.ledger
        self.hosts: dict[Cell, NodeHost] = self.parties.hosts
        # Each host's isolated cells (the hosts stay for the mesh's life): none, or the
        # compiled dispatch leaves the waves to the machines.
        self.isolated = [host.failed for host in self.hosts.values()]
        self.nodes: dict[Cell, NodeMachine] = self.parties.nodes
        self.edge: EdgeMachine = self.parties.edge  # (a test may put a new one here)
        self.wires = {party: Wire(spec.mesh_id, self.auth.get(party))
                      for party in [*topo.cells(), EDGE]}
        self.codec_errors: Counter[str] = Counter()
        self._outbox: list[Message] = []  # what agents sent during the current round
        self._topics = TopicNames(spec.mesh_id)
        for cell, host in self.hosts.items():
            deliver = self._deliver_to_host(cell, host)
            for name in host.subscriptions():
                self.broker.subscribe(name, deliver)
        self.broker.subscribe(inbox_filter(spec.mesh_id, spec.edge_at, EDGE),
                              self._deliver_to_edge())
        # A wave needs about four crossings of the mesh; anything far beyond is a hang.
        self.max_rounds = max_rounds or 16 * (topo.diameter + 4) * (spec.model.conv_layers + 2)
        self.last_wave_rounds = 0
        self.gather_rounds: int | None = None  # of the last wave: when the head ran
        self._timing: dict[Mode, tuple] = {}  # the last wave of each mode, see `timing`

    def _deliver_to_host(self, cell: Cell, host: NodeHost):
        outbox, wire, name = self._outbox, self.wires[cell], str(cell)

        def deliver(topic_: str, payload: bytes | Message, now: float) -> None:
            if isinstance(payload, Message):  # an agent's own, never touched by bytes
                outbox.extend(host.handle(topic_, payload, now))
                return
            message = wire.receive(payload, host.stats)
            if message is None:
                self.codec_errors[name] += 1
            else:
                outbox.extend(host.handle(topic_, message, now))

        return deliver

    def _deliver_to_edge(self):
        outbox, wire = self._outbox, self.wires[EDGE]

        def deliver(_topic: str, payload: bytes | Message, now: float) -> None:
            edge = self.edge  # (a test may restart the edge: a new machine)
            message = payload if isinstance(payload, Message) else \
                wire.receive(payload, edge.stats)
            if message is None:
                self.codec_errors["edge"] += 1
            else:
                outbox.extend(edge.handle(message, now))

        return deliver

    def deliver_round(self) -> None:
        """Deliver one round; what the agents sent in it goes out in the next."""
        self.broker.deliver_round()
        sent = self._outbox[:]  # the agents' closures hold this very list
        self._outbox.clear()
        self.send(sent)

    def send(self, messages: list[Message]) -> None:
        """Encode, count and publish messages from any agent."""
        record, name_of_topic, publish = self.ledger.record, self._topics.of, \
            self.broker.publish
        wires = self.wires
        for message in messages:
            record(message)
            h = message.header
            name = name_of_topic(h)
            if not self.wire:
                publish(name, message)
                continue
            data = wires[h.src].seal(message)
            if self.chaos is None:
                self.broker.publish(name, data)
            else:
                for topic_, payload, delay in self.chaos.copies(name, data):
                    self.broker.publish(topic_, payload, delay)

    def inject(self, topic_: str, payload: bytes) -> None:
        """Publish raw bytes on a mesh topic (fault injection, tests)."""
        self.broker.publish(topic_, payload)

    def run_wave(self, mode: Mode, split: Split, indices: np.ndarray,
                 failout: np.ndarray | None = None) -> WaveResult:
        """One wave from the edge and back (`failout`: cells acting dead in it); raises
        MeshdlError if it does not complete."""
        if self.compiled and compiled_applies(self):
            if self._compiled is None:
                self._compiled = CompiledWaves(self)
            return self._compiled.run_wave(mode, split, indices, failout)
        self.settle()
        self.send(self.edge.start(mode, split, indices, failout=failout))
        return self.finish_wave(mode)

    def run_slot(self, slot: int) -> WaveResult:
        """One scheduled slot of live inference: every node starts it on the parameters
        it cached (a wave with PARAMS must have brought them), all in the same round."""
        self.settle()
        out = self.edge.start_slot(slot)
        for node in self.nodes.values():
            out.extend(node.begin_slot(slot))
        self.send(out)
        return self.finish_wave(Mode.INFER)

    def settle(self) -> None:
        """Bring the node machines up to date with the compiled waves before now (the
        messages they took, the parameters they keep: `CompiledWaves.settle`): before
        the machines run a wave, and before their counts are read."""
        if self._compiled is not None:
            self._compiled.settle()

    def finish_wave(self, mode: Mode) -> WaveResult:
        """Deliver rounds until the edge has the wave's result, then the wave's tail."""
        start_round = self.broker.round
        self.gather_rounds = None
        while self.edge.result is None:
            if self.broker.idle or self.broker.round - start_round > self.max_rounds:
                self._stalled(start_round)
            self.deliver_round()
            if self.gather_rounds is None and self.edge.trace is not None:
                self.gather_rounds = self.broker.round - start_round  # the head ran
        # Let the tail of the wave (e.g. the last REDUCE relays) settle for the counts.
        while not self.broker.idle:
            self.deliver_round()
        self.ledger.tally()
        self.last_wave_rounds = self.broker.round - start_round
        finished = [(cell, node.finish_times) for cell, node in self.nodes.items()]
        self.record_timing(mode, start_round, self.last_wave_rounds, finished)
        return self.edge.result

    def _stalled(self, start_round: int) -> None:
        """Raise the reason a wave cannot finish, naming what the nodes rejected."""
        rejected = Counter({k: v for k, v in self.node_stats().items()
                            if k.startswith("rejected")})
        why = "no messages left" if self.broker.idle else "round limit"
        detail = ", ".join(f"{n} x {k.removeprefix('rejected:')}"
                           for k, n in rejected.most_common(3))
        failed = {cell: error for host in self.hosts.values()
                  for cell, error in host.failed.items()}
        isolated = "".join(f"; cell {name_of(cell)} failed and was isolated: {error}"
                           for cell, error in sorted(failed.items())[:3])
        message = (f"wave {self.edge.step} stalled after {self.broker.round - start_round} "
                   f"rounds ({why}){'; nodes rejected ' + detail if detail else ''}"
                   f"{isolated}")
        if any("NaN" in k for k in rejected):
            raise NonFiniteError(message)
        raise MeshdlError(message)

    def record_timing(self, mode: Mode, start_round: int, rounds: int,
                      finished: Iterable[tuple[Cell, dict[str, float]]]) -> None:
        """Keep what `wave_report` needs of the last wave of `mode` (started in round
        `start_round`, `rounds` long): each node's finishing round of each stage, as
        (cell, {stage: round}) pairs (a machine's `finish_times`, the very dicts: a node
        starts a new one each wave, so these stay as they are; or the compiled
        dispatch's)."""
        self._timing[mode] = (start_round, rounds, finished)

    def timing(self, mode: Mode) -> dict[str, Any]:
        """Rounds (relative to the wave's start) at which nodes finished each stage, in the
        last wave of `mode`."""
        if mode not in self._timing:
            return {}
        start_round, rounds, finished = self._timing[mode]
        stages: dict[str, dict[str, float]] = {}
        for cell, at_round in finished:
            for stage, at in at_round.items():
                stages.setdefault(stage, {})[name_of(cell)] = at - start_round
        return {"mode": mode.name.lower(), "rounds": rounds, "stages": stages}

    def wave_report(self) -> dict[str, Any]:
        """Wave depth against the mesh diameter, from the last (training) wave's timing."""
        timing = self.timing(Mode.TRAIN) or self.timing(Mode.INFER)
        stages = timing.get("stages", {})
        last = f"conv{self.spec.model.conv_layers}"
        forward = max(stages.get(last, {}).values(), default=0)
        return {
            "diameter": self.spec.topology.diameter,
            "edge_hops_to_far_corner": max(self.spec.topology.depth.values()),
            "forward_rounds": forward,
            "wave": timing.get("mode"),
            "wave_rounds": timing.get("rounds", 0),
            "finished_round": stages,
        }

    def node_stats(self) -> Counter[str]:
        """Every count of the node hosts and their cells (rejections wherever made)."""
        self.settle()
        total: Counter[str] = Counter()
        for host in self.hosts.values():
            total.update(host.node_stats())
        if self._compiled is not None:  # what compiled waves dropped of the edge's
            total.update(self._compiled.stats)
        return total


class MeshEngine(WaveEngine):
    """The training loop's engine, computing every batch in the virtual mesh."""

    def __init__(self, data: Dataset, edge_at: Cell = (0, 0), mesh_id: int = 1,
                 chaos: Chaos | None = None, wire: bool = False,
                 params_via: str = "tree", max_message_bytes: int = MAX_MESSAGE_BYTES,
                 auth: bool = False, keys: MeshKeys | None = None,
                 compress: str = "none", activations: str = "float32",
                 delta: float | None = None, memory_plan: bool = True,
                 compiled: bool = True) -> None:
        """`memory_plan`: see `MeshParties` (False only to measure or test without it).
        `compiled`: exact waves through the compiled dispatch (`VirtualMesh`); False,
        every message through the node machines."""
        self.data = data
        self.compiled = compiled
        self.memory_plan = memory_plan
        self.compress, self.activations, self.delta = compress, activations, delta
        self.auth = auth
        self.keys = keys
        self.max_message_bytes = max_message_bytes
        self.train_samples = len(data.y_train)
        self.chaos = chaos
        self.wire = wire
        self.params_via = params_via
        self.edge_at = edge_at
        self.mesh_id = mesh_id
        self.mesh: VirtualMesh | None = None
        self._threadpools = ThreadpoolController()  # found once: a lookup costs ~0.5 ms

    def mesh_for(self, model: CNN) -> VirtualMesh:
        """The virtual mesh whose edge holds `model`: the last one, or a new one when
        the model is another (tests reach into its parties through it)."""
        if self.mesh is None or self.mesh.edge.model is not model:
            spec = MeshSpec(self.mesh_id, model.config, self.edge_at, self.params_via,
                            self.max_message_bytes, self.auth, compress=self.compress,
                            activations=self.activations, delta=self.delta)
            # Each node holds its cell's values as the model reads them (the alive mask).
            readings, labels = by_split(as_read_by(self.data, model.config))
            self.mesh = VirtualMesh(spec, readings, model, labels, chaos=self.chaos,
                                    wire=self.wire, keys=self.keys,
                                    memory_plan=self.memory_plan, compiled=self.compiled,
                                    originals=mirrors_of(self.data))
        return self.mesh

    def spec_for(self, model: CNN) -> MeshSpec:
        return self.mesh_for(model).spec

    def _run(self, model: CNN, mode: Mode, split: Split, indices: np.ndarray,
             failout: np.ndarray | None = None) -> WaveResult:
        mesh = self.mesh_for(model)
        # The nodes' products are tiny: BLAS threads would only add wake-up latency.
        with self._threadpools.limit(limits=1), cyclic_gc_paused():
            return mesh.run_wave(mode, split, indices, failout)

    def report(self) -> dict[str, Any]:
        """The "comm" record: ledger counts plus the wave timing of the last wave."""
        if self.mesh is None:
            return {}
        comm = self.mesh.ledger.report()
        comm["wave_depth"] = self.mesh.wave_report()
        comm["rejected"] = {k: v for k, v in self.mesh.node_stats().items()
                            if k.startswith("rejected") or k in ("duplicates", "stale")}
        return comm

    def close(self) -> None:
        """Nothing to release: no loop, no sockets."""


def dry_wave(config: ModelConfig, batch: int, edge_at: tuple[int, int],
             auth: bool = False) -> dict[str, Any]:
    """The "comm" report of one training wave over `batch` random maps."""
    rng = np.random.default_rng(0)
    X = rng.normal(20.0, 2.0, (batch, config.rows, config.cols)).astype(np.float32)
    y = rng.integers(0, config.classes, batch)
    engine = MeshEngine(Dataset(X, y, X[:1], y[:1], {"generator": "random"}), edge_at=edge_at,
                        auth=auth)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 2.0)
    try:
        engine.loss_and_grads(model, np.arange(batch))
        report = engine.report()
    finally:
        engine.close()
    report["batch"] = batch
    report["per_sample_bytes"] = report["total_bytes"] / batch
    return report


def by_split(data: Dataset) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """A data set's maps and labels, keyed by the split a BATCH names."""
    return ({Split.TRAIN: data.X_train, Split.TEST: data.X_test},
            {Split.TRAIN: data.y_train, Split.TEST: data.y_test})


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """A wave makes a great many short-lived objects (messages, headers, keys) and no
    reference cycles, so reference counting frees them all; Python's cyclic collector
    would only rescan the mesh's long-lived plans again and again (about 7 % of a wave's
    time, measured). It runs again after the wave, as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

