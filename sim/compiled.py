"""The virtual mesh's exact waves through the compiled dispatch (nodes/compiled.py).

`CompiledWaves` stands in for the node hosts and the broker of a `VirtualMesh` in a wave
that needs nothing of them but the plan: no fault injection, no bytes on a wire, no
authentication, no compression, no deadlines, no cell left out. The nodes' messages to
one another stay inside the compiled loop, delivered in the broker's rounds; the edge
stays the edge machine, and what crosses between them is real `Message`s, counted by the
ledger like every message, checked on the way in as a node checks what the edge sends.
The node machines' adopted plans are what the tables are read from, once; every value a
wave computes is theirs to the bit (tests/test_compiled.py), and so are the counts, the
rounds and each node's stage timing. A wave that does not qualify goes through the
machines as before (`VirtualMesh.run_wave`). The machines' own state is not kept up by
compiled waves message by message: once per wave each node's lifecycle moves as the
machines' waves do (`NodeMachine.ran_compiled`: its current wave, DONE), and before a
machine wave, a scheduled slot or a report (`VirtualMesh.settle`) `settle` hands each
node the messages it took (its stats) and the parameters it keeps for its slots
(`NodeMachine.keep_params`). What it needs of
the nodes and the mesh it asks through their public methods; what it needs of the mesh
is `InProcessMesh` (below), not the class: sim/mesh.py imports this module, and an
import back would close a circle. The readings are shared: a node's `record` reaches
compiled waves too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from meshdl.edge.agent import WaveResult
from meshdl.errors import MeshdlError, NonFiniteError
from meshdl.nodes.agent import compiled_wave
from meshdl.nodes.compiled import (
    ARRIVALS,
    NONE,
    SEND,
    SENT_COUNT,
    TO_EDGE,
    MeshTables,
    State,
    WaveArrays,
    run_rounds,
    tabulate,
    warm_up,
)
from meshdl.protocol.messages import ALL, EDGE, FLOAT32, INT32, Kind, Message, make
from meshdl.protocol.payloads import BatchOrder
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topology import Cell

if TYPE_CHECKING:
    from meshdl.edge.agent import EdgeMachine
    from meshdl.nodes.agent import NodeMachine
    from meshdl.nodes.plan import Wave
    from meshdl.protocol.accounting import Ledger
    from meshdl.sim.broker import VirtualBroker
    from meshdl.sim.faults.chaos import Chaos

ITEM_KINDS = frozenset((Kind.HALO, Kind.POOL, Kind.GATHER, Kind.SCATTER, Kind.ROUTE,
                        Kind.GRAD_HALO))
KEPT_BATCHES = 4  # arenas kept, by batch size (a run's training and evaluation batches)


class Started(NamedTuple):
    """A compiled wave as its PARAMS and BATCH start it."""

    wave: WaveArrays
    params: np.ndarray  # the PARAMS payload, as sent
    batch: np.ndarray  # the BATCH payload


# What the compiled dispatch supports: of a mesh's spec (`MeshSpec`) and its model
# (`ModelConfig`), the fields that may take any value, and those that may take some;
# every other field must keep its default. A field added later therefore runs through
# the machines until it is added here (and to the loop, if it changes a wave).
SPEC_ANY = frozenset({"mesh_id", "model", "edge_at", "params_via", "max_message_bytes",
                      "header", "topology"})
SPEC_WHEN: dict[str, Callable[[MeshSpec], bool]] = {
    "home": lambda spec: not spec.planned,  # the configured plan, wherever it says home is
}
MODEL_ANY = frozenset({"rows", "cols", "in_channels", "alive", "kernel", "filters",
                       "conv_layers", "pool", "hidden", "classes", "position_bias"})


def unsupported(spec: MeshSpec) -> list[str]:
    """The fields of `spec` (and `model.` its model's) the compiled dispatch does not
    support at the values they have: none, and its waves may run compiled."""
    names = []
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name in SPEC_ANY or SPEC_WHEN.get(f.name, lambda _: False)(spec):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        if value != default:
            names.append(f.name)
    model = spec.model
    names += [f"model.{name}" for name, info in type(model).model_fields.items()
              if name not in MODEL_ANY and getattr(model, name) != info.get_default(
                  call_default_factory=True)]
    return names


class InProcessMesh(Protocol):
    """What the compiled waves read and call of the virtual mesh whose exact waves they
    run (`VirtualMesh`, sim/mesh.py, which imports this module): its parties, broker
    and ledger, whether anything comes between its parties (a wire, faults, a failed
    cell), and where a wave's end and rounds go."""

    spec: MeshSpec
    nodes: dict[Cell, NodeMachine]
    edge: EdgeMachine
    broker: VirtualBroker
    ledger: Ledger
    wire: bool
    chaos: Chaos | None
    isolated: list[dict[Cell, str]]  # each host's failed cells, and why
    max_rounds: int
    last_wave_rounds: int
    gather_rounds: int | None

    def send(self, messages: list[Message]) -> None: ...

    def finish_wave(self, mode: Mode) -> WaveResult: ...

    def record_timing(self, mode: Mode, start_round: int, rounds: int,
                      finished: Iterable[tuple[Cell, dict[str, float]]]) -> None: ...


def compiled_applies(mesh: InProcessMesh) -> bool:
    """Can `mesh`'s next wave run compiled? Only what the dispatch supports: a spec of
    supported fields (`unsupported`), every cell a member, in process with no bytes on
    a wire or injected faults, an edge without deadlines or their learning, no party
    failed. Anything else goes through the machines."""
    spec = mesh.spec
    return not unsupported(spec) and \
        len(spec.topology.members) == spec.model.rows * spec.model.cols and \
        not mesh.wire and mesh.chaos is None and mesh.edge.policy is None and \
        mesh.edge.learning is None and not any(mesh.isolated)


class CompiledWaves:
    """A virtual mesh's node hosts and broker, for its exact waves."""

    def __init__(self, mesh: InProcessMesh) -> None:
        self.mesh = mesh
        spec = mesh.spec
        self.cells: list[Cell] = list(spec.topology.cells())
        self.index = {cell: n for n, cell in enumerate(self.cells)}
        nodes = [mesh.nodes[cell] for cell in self.cells]
        self.mesh_tables: MeshTables = tabulate(spec, nodes)
        tb = self.tables = self.mesh_tables.tables
        self.state = State.of(tb)
        warm_up(tb, self.state)
        # The inbox entries the edge's messages fill: (cell, kind, layer, phase) -> entry,
        # and its broadcasts' (every node's) by kind.
        self.from_edge: dict[tuple, int] = {}
        self.broadcast: dict[Kind, list[int]] = {}
        for n, node in enumerate(nodes):
            base = int(np.searchsorted(tb.entry_node, n))  # a node's entries are a run
            for (kind, layer, phase, src), expect in node.plan.inbox.items():
                if src != EDGE:
                    continue
                e = base + expect.index
                if expect.dst == ALL:
                    self.broadcast.setdefault(kind, []).append(e)
                else:
                    self.from_edge[(node.cell, kind, layer, phase)] = e
        # Every node's log in one array per split; each node's own becomes a view of its
        # row, so that what it records (a live reading) is what compiled waves read.
        self.readings = {split: np.ascontiguousarray(np.stack(
            [node.readings[split] for node in nodes]), np.float32)
            for split in nodes[0].readings}
        for split, logs in self.readings.items():  # (nodes, channels, samples): the loop
            if logs.ndim != 3 or logs.shape[1] != tb.in_channels:  # reads in_channels
                raise MeshdlError(f"the nodes hold {logs.shape[1] if logs.ndim == 3 else '?'}"
                                  f" values a cell ({Split(split).name.lower()} split), the "
                                  f"model reads {tb.in_channels}: give them the data as it "
                                  "reads it (augment.as_read_by)")
        for n, node in enumerate(nodes):
            node.readings = {split: logs[n] for split, logs in self.readings.items()}
        self.nodes = nodes
        self.grads = np.zeros((len(nodes), tb.grad_size), np.float32)
        # A position bias's columns: each node's, per map of a wave (`_columns`).
        self.table = bool(np.any(tb.p_off != NONE))
        self.no_columns = np.zeros((len(nodes), 0), np.int64)
        self.number = {cell[0] * spec.model.cols + cell[1]: n
                       for n, cell in enumerate(self.cells)}
        self._arenas: dict[int, tuple[np.ndarray, ...]] = {}  # by batch, the latest last
        self._keys: dict[tuple, list[tuple]] = {}  # what the ledger counts, by wave kind
        self._checker = nodes[0]  # checks PARAMS and BATCH as every node would
        # What the nodes would have counted of the edge's messages (dropped ones).
        self.stats: Counter[str] = Counter()
        self._unsettled: Started | None = None  # the last wave, not yet handed back
        self._seen = np.zeros(len(tb.entry_node), np.uint8)  # the edge's, this wave
        # Messages each node took in compiled waves, not yet in its stats (`settle`).
        self._accepted = np.zeros(tb.nodes, np.int64)
        # And the operations each ran (its `flops`), by the wave's mode and batch.
        self._flops = np.zeros(tb.nodes, np.int64)
        self._wave_flops: dict[tuple[Mode, int], np.ndarray] = {}
        self._plans = [node.plan for node in nodes]
        self._waves: dict[tuple[Mode, int], Wave] = {}  # the nodes' view of a wave
        # What every node has as its current wave, and of which edge session (until the
        # machines run a wave: `settle`).
        self._handed: tuple[Wave, int] | None = None

    def settle(self) -> None:
        """Hand the node machines what a machine wave, a scheduled slot or a report
        needs of the compiled waves before it: the messages each took (its stats), and
        each node's cached parameters, as its own waves keep them
        (`NodeMachine.keep_params`: and no ask for them pending)."""
        for node, count, flops in zip(self.nodes, self._accepted.tolist(),
                                      self._flops.tolist(), strict=True):
            if count:
                node.count_accepted(count)
            if flops:
                node.count_flops(flops)
        self._accepted[:] = 0
        self._flops[:] = 0
        self._handed = None  # (the machines may run next: their waves replace it)
        started, self._unsettled = self._unsettled, None
        if started is None:
            return
        edge = self.mesh.edge
        for node in self.nodes:
            node.keep_params(edge.session, edge.step, started.params)

    # ------------------------------------------------------------------ a wave
    def run_wave(self, mode: Mode, split: Split, indices: np.ndarray,
                 failout: np.ndarray | None) -> WaveResult:
        """One wave from the edge and back (as `VirtualMesh.run_wave`)."""
        mesh, edge, tb, st = self.mesh, self.mesh.edge, self.tables, self.state
        start = mesh.broker.round
        out = edge.start(mode, split, indices, failout=failout)
        started = self._start(out)
        if started is None:  # what a node would refuse: the machines say why
            self.settle()
            mesh.send(out)
            return mesh.finish_wave(mode)
        wave = started.wave
        mesh.ledger.record_all(out)
        failed = np.zeros(tb.nodes, np.uint8)
        for number in BatchOrder.read(started.batch).failout:
            failed[self.number[int(number)]] = 1
        st.reset(tb, failed)
        self._seen[:] = 0
        first = self._inject(out, wave)
        st.cur[:len(first)] = first
        st.counts[ARRIVALS] = len(first)
        now, limit = start, start + mesh.max_rounds
        pending = np.zeros(0, np.int64)
        mesh.gather_rounds = None
        while True:
            now = run_rounds(tb, st, wave, now, limit, pending)
            if not st.counts[TO_EDGE]:
                break
            at = now + 1  # the edge's round: it has what was sent in round `now`
            replies: list[Message] = []
            for m in st.to_edge[:st.counts[TO_EDGE]]:
                message = self._to_edge(int(m), wave)
                mesh.ledger.record(message)
                replies.extend(edge.handle(message, float(at)))
            if mesh.gather_rounds is None and edge.trace is not None:
                mesh.gather_rounds = at - start
            mesh.ledger.record_all(replies)
            pending = np.array(self._inject(replies, wave), np.int64)
            if not st.counts[ARRIVALS] and not pending.size:
                now = at
                break
        mesh.broker.round = now
        self._unsettled = started
        if edge.result is None:
            self._stalled(now - start, now >= limit)
        mesh.ledger.record_wave(edge.step, self._sent_keys(started))
        mesh.last_wave_rounds = now - start
        mesh.record_timing(mode, start, now - start, Finished(self, st.task_round.copy(),
                                                              st.finished.copy()))
        self._moved(mode, wave.batch)
        return edge.result

    def _moved(self, mode: Mode, batch: int) -> None:
        """Each node's lifecycle, moved once for the wave: one finished wave of its mode
        and batch stands for every node's (`compiled_wave`: DONE by the table), handed
        to each (`NodeMachine.ran_compiled`) unless each has it from the wave before; the
        messages each took (the tables' it was sent, and the edge's) and the operations
        it ran (`NodeMachine.wave_flops`) counted here until `settle`."""
        tb, st, edge = self.tables, self.state, self.mesh.edge
        wave = self._waves.get((mode, batch))
        if wave is None:
            wave = self._waves[(mode, batch)] = compiled_wave(mode, batch, self._plans)
        wave.renumber(edge.step, edge.session)
        if self._handed != (wave, edge.session):
            for node in self.nodes:
                node.ran_compiled(wave)
            self._handed = (wave, edge.session)
        flops = self._wave_flops.get((mode, batch))
        if flops is None:
            flops = self._wave_flops[(mode, batch)] = np.array(
                [node.wave_flops(mode == Mode.TRAIN, batch) for node in self.nodes], np.int64)
        self._flops += flops
        to_nodes = (st.sent != 0) & (tb.msg_dst != NONE)
        self._accepted += np.bincount(tb.msg_dst[to_nodes], minlength=tb.nodes)
        self._accepted += np.bincount(tb.entry_node[self._seen != 0], minlength=tb.nodes)

    def _stalled(self, rounds: int, at_limit: bool) -> None:
        """Raise why a compiled wave cannot finish, naming what was dropped of the edge's
        messages (as `VirtualMesh._stalled` names the nodes' rejections)."""
        why = "round limit" if at_limit else "no messages left"
        dropped = ", ".join(f"{n} x {k}" for k, n in self.stats.most_common(3))
        message = (f"wave {self.mesh.edge.step} stalled after {rounds} rounds in the "
                   f"compiled dispatch ({why}){'; dropped ' + dropped if dropped else ''}")
        if not np.isfinite(self.grads).all():
            raise NonFiniteError(message)
        raise MeshdlError(message)

    def _start(self, out: list[Message]) -> Started | None:
        """The wave the edge's PARAMS and BATCH start, or None if a node would refuse
        them (`NodeMachine.takes_control`) or a live slot's reading may
        be missing: the machines then run it, and say why."""
        params = next((m for m in out if m.header.kind == Kind.PARAMS), None)
        batch = next((m for m in out if m.header.kind == Kind.BATCH), None)
        if params is None or batch is None or not self._checker.takes_control(params, batch):
            return None
        mode, split, indices, _ = BatchOrder.read(batch.payload)
        if split == Split.LIVE:
            return None
        size = len(indices)
        arenas = self._arenas.pop(size, None)
        if arenas is None:
            if len(self._arenas) >= KEPT_BATCHES:  # the least recently used goes
                del self._arenas[next(iter(self._arenas))]
            tb = self.tables
            arenas = (np.zeros((tb.arena_slots(0), tb.in_channels, size), np.float32),
                      np.zeros((tb.arena_slots(1), tb.filters, size), np.float32),
                      np.zeros((tb.nodes, tb.filters, size), np.uint8))
        self._arenas[size] = arenas
        wave = WaveArrays(*arenas, self.grads, np.array(params.payload, np.float32),
                    self.readings[split], np.array(indices, np.int32), size,
                    mode == Mode.TRAIN, self._columns(split, indices))
        return Started(wave, params.payload, batch.payload)

    def _columns(self, split: int, indices: np.ndarray) -> np.ndarray:
        """With a position bias, the column of its table each node reads for each map
        (nodes, batch), as each node's machine would (`NodeMachine.mirrored_columns`:
        every node's readings are laid out alike); else none."""
        if not self.table:
            return self.no_columns
        tb = self.tables
        columns = self._checker.mirrored_columns(split, indices, tb.number.astype(np.int64))
        # The loop reads columns[n, j] for its nodes and the wave's maps, each a column of
        # a table of `tb.cells` (its stride): held to that here, whatever built them.
        if columns.shape != (tb.nodes, len(indices)) or \
                (columns.size and not 0 <= columns.min() <= columns.max() < tb.cells):
            raise MeshdlError("a position bias's columns outside the compiled tables")
        return columns

    def _inject(self, messages: list[Message], wave: WaveArrays) -> list[int]:
        """What the edge sent, as arrivals of the loop (-1 - entry), items put into
        their slots now. As a node would, it counts and drops what is not this wave's
        (another mesh, step or session), what its plan does not receive, a repeat, and
        items of the wrong dtype or shape."""
        tb, edge, arrivals = self.tables, self.mesh.edge, []
        for message in messages:
            h = message.header
            if h.mesh != self.mesh.spec.mesh_id or h.step != edge.step or \
                    h.session != edge.session:
                self.stats["stale"] += 1
                continue
            if h.dst == ALL:
                entries = self.broadcast.get(h.kind, [])
            else:
                e = self.from_edge.get((h.dst, h.kind, h.layer, h.phase))
                entries = [] if e is None else [e]
            if not entries:
                self.stats["rejected:not_planned"] += 1
                continue
            if self._seen[entries].any():
                self.stats["duplicates"] += 1
                continue
            if h.kind in ITEM_KINDS:  # (a broadcast carries none)
                e = entries[0]
                arena = self._arena(int(tb.entry_buf[e]), wave)
                slots = tb.lists[tb.entry_slots[e, 0]:tb.entry_slots[e, 1]]
                if h.dtype != FLOAT32 or message.payload.shape != \
                        (len(slots), arena.shape[1], wave.batch):
                    self.stats["rejected:bad_shape"] += 1
                    continue
                arena[slots] = message.payload
            self._seen[entries] = 1
            arrivals.extend(-1 - e for e in entries)
        return arrivals

    def _arena(self, g: int, wave: WaveArrays) -> np.ndarray:
        """The arena buffer `g` is in (the tables' slots index it whole)."""
        return wave.inputs if self.tables.buf_arena[g] == 0 else wave.features

    def _to_edge(self, m: int, wave: WaveArrays) -> Message:
        """Message `m` of the tables, to the edge, as its sender would make it."""
        tb, key, edge = self.tables, self.mesh_tables.messages[m], self.mesh.edge
        if key.kind == Kind.REDUCE:
            payload = self.grads[int(tb.msg_src[m])].copy()
        else:
            rows = tb.lists[tb.msg_rows[m, 0]:tb.msg_rows[m, 1]]
            payload = self._arena(int(tb.msg_buf[m]), wave)[rows]
        return make(key.kind, self.mesh.spec.mesh_id, edge.step, key.src, EDGE, payload,
                    key.layer, key.phase, session=edge.session)

    def _sent_keys(self, started: Started) -> list[tuple]:
        """What the ledger counts of the messages the nodes sent one another in this
        wave: per message, its header's (src, dst, kind, layer, phase, shape, dtype)."""
        st, wave = self.state, started.wave
        params, batch = started.params.size, started.batch.size
        signature = (wave.training, wave.batch, params, batch, int(st.counts[SENT_COUNT]))
        keys = self._keys.get(signature)
        if keys is None:
            tb, spec = self.tables, self.mesh.spec
            keys = []
            for m in np.flatnonzero(st.sent):
                key = self.mesh_tables.messages[m]
                if key.dst == EDGE:
                    continue  # counted as the message it was
                if key.kind == Kind.PARAMS:
                    shape, dtype = (params,), FLOAT32
                elif key.kind == Kind.BATCH:
                    shape, dtype = (batch,), INT32
                elif key.kind == Kind.REDUCE:
                    shape, dtype = (spec.reduce_size,), FLOAT32
                else:
                    rows = int(tb.msg_rows[m, 1] - tb.msg_rows[m, 0])
                    shape = (rows, int(tb.buf_ch[tb.msg_buf[m]]), wave.batch)
                    dtype = FLOAT32
                keys.append((key.src, key.dst, key.kind, key.layer, key.phase, shape, dtype))
            self._keys[signature] = keys
        return keys


class Finished:
    """Each node's finishing round of each stage in a compiled wave, as
    `VirtualMesh.record_timing` keeps the machines' (cell, `finish_times`) pairs;
    made into dicts only when a report asks."""

    def __init__(self, waves: CompiledWaves, task_round: np.ndarray,
                 finished: np.ndarray) -> None:
        self.waves, self.task_round, self.finished = waves, task_round, finished

    def __iter__(self) -> Iterator[tuple[Cell, dict[str, float]]]:
        tb, stages = self.waves.tables, self.waves.mesh_tables.stages
        for n, cell in enumerate(self.waves.cells):
            at: dict[str, float] = {}
            for t in range(int(tb.node_tasks[n, 0]), int(tb.node_tasks[n, 1])):
                if tb.task_step[t] != SEND and self.task_round[t] != NONE:
                    at[stages[t]] = float(self.task_round[t])
            if self.finished[n] != NONE:
                at["finished"] = float(self.finished[n])
            yield cell, at
