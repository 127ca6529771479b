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
machines as before (`VirtualMesh.run_wave`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from meshdl.edge.agent import WaveResult
from meshdl.errors import MeshdlError
from meshdl.nodes import compute
from meshdl.nodes.compiled import (
    NONE,
    SEND,
    Layout,
    State,
    Wave,
    lay_out,
    run_rounds,
    warm_up,
)
from meshdl.protocol.messages import ALL, EDGE, FLOAT32, INT32, Kind, Message, make
from meshdl.protocol.payloads import BatchOrder
from meshdl.protocol.spec import Mode, Split
from meshdl.protocol.topology import Cell

if TYPE_CHECKING:
    from meshdl.sim.mesh import VirtualMesh

ITEM_KINDS = frozenset((Kind.HALO, Kind.POOL, Kind.GATHER, Kind.SCATTER, Kind.ROUTE,
                        Kind.GRAD_HALO))


def compiled_applies(mesh: VirtualMesh) -> bool:
    """Can `mesh`'s next wave run compiled: an exact wave of the configured plan, in
    process, that no party has failed in? (Only simulated time gives nodes deadlines,
    and only a planned spec's PARAMS another plan.)"""
    spec = mesh.spec
    return not mesh.wire and mesh.chaos is None and not spec.auth and \
        spec.reduce_codec is None and spec.reduce_sum is None and \
        spec.activation_codec is None and spec.delta is None and not spec.planned and \
        len(spec.topology.members) == spec.model.rows * spec.model.cols and \
        mesh.edge.policy is None and mesh.edge.learning is None and \
        not any(mesh.isolated)


class CompiledWaves:
    """A virtual mesh's node hosts and broker, for its exact waves."""

    def __init__(self, mesh: VirtualMesh) -> None:
        self.mesh = mesh
        spec = mesh.spec
        self.cells: list[Cell] = list(spec.topology.cells())
        self.index = {cell: n for n, cell in enumerate(self.cells)}
        nodes = [mesh.nodes[cell] for cell in self.cells]
        self.layout: Layout = lay_out(spec, nodes)
        tb = self.tables = self.layout.tables
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
        self.readings = {split: np.ascontiguousarray(np.stack(
            [node.readings[split] for node in nodes]), np.float32)
            for split in nodes[0].readings}
        self.grads = np.zeros((len(nodes), spec.conv_size), np.float32)
        self.number = {cell[0] * spec.model.cols + cell[1]: n
                       for n, cell in enumerate(self.cells)}
        self._arenas: dict[int, tuple[np.ndarray, ...]] = {}  # by batch
        self._keys: dict[tuple, list[tuple]] = {}  # what the ledger counts, by wave kind
        self._checker = nodes[0]  # checks a BATCH as every node would

    # ------------------------------------------------------------------ a wave
    def run_wave(self, mode: Mode, split: Split, indices: np.ndarray,
                 failout: np.ndarray | None) -> WaveResult:
        """One wave from the edge and back (as `VirtualMesh.run_wave`)."""
        mesh, edge, tb, st = self.mesh, self.mesh.edge, self.tables, self.state
        start = mesh.broker.round
        out = edge.start(mode, split, indices, failout=failout)
        wave = self._wave(out)
        if wave is None:  # what a node would refuse: the machines say why
            mesh.send(out)
            return mesh._finish_wave(mode)
        mesh.ledger.record_all(out)
        failed = np.zeros(tb.nodes, np.uint8)
        for number in BatchOrder.read(self._batch_payload).failout:
            failed[self.number[int(number)]] = 1
        st.reset(tb, failed)
        first = self._inject(out, wave)
        st.cur[:len(first)] = first
        st.counts[0] = len(first)
        now, limit = start, start + mesh.max_rounds
        pending = np.zeros(0, np.int64)
        mesh.gather_rounds = None
        while True:
            now = run_rounds(tb, st, wave, now, limit, pending)
            if not st.counts[2]:
                break
            at = now + 1  # the edge's round: it has what was sent in round `now`
            replies: list[Message] = []
            for m in st.to_edge[:st.counts[2]]:
                message = self._to_edge(int(m), wave)
                mesh.ledger.record(message)
                replies.extend(edge.handle(message, float(at)))
            if mesh.gather_rounds is None and edge.trace is not None:
                mesh.gather_rounds = at - start
            mesh.ledger.record_all(replies)
            pending = np.array(self._inject(replies, wave), np.int64)
            if not st.counts[0] and not pending.size:
                now = at
                break
        mesh.broker.round = now
        if edge.result is None:
            why = "round limit" if now >= limit else "no messages left"
            raise MeshdlError(f"wave {edge.step} stalled after {now - start} rounds in "
                              f"the compiled dispatch ({why})")
        mesh.ledger.record_wave(edge.step, self._sent_keys(wave))
        mesh.last_wave_rounds = now - start
        mesh._timing[mode] = (start, now - start, Finished(self, st.task_round.copy(),
                                                          st.finished.copy()))
        return edge.result

    def _wave(self, out: list[Message]) -> Wave | None:
        """The wave the edge's PARAMS and BATCH start, or None if a node would refuse
        them (`NodeMachine._store_params`, `_store_batch`)."""
        node = self._checker
        params = next((m.payload for m in out if m.header.kind == Kind.PARAMS), None)
        batch = next((m for m in out if m.header.kind == Kind.BATCH), None)
        if params is None or batch is None or batch.header.dtype != INT32 or \
                any(m.header.kind == Kind.PARAMS and m.header.dtype != FLOAT32 for m in out):
            return None
        if not node._params_shaped(params) or \
                not compute.all_positive(params[node.layout.std]) or \
                not node._valid_batch(batch.payload):
            return None
        self._batch_payload = batch.payload
        mode, split, indices, _ = BatchOrder.read(batch.payload)
        if split == Split.LIVE:
            return None  # (a live reading may be missing: the machines tell)
        size = len(indices)
        arenas = self._arenas.get(size)
        if arenas is None:
            tb = self.tables
            arenas = self._arenas[size] = (
                np.zeros((tb.arena_slots(0), tb.in_channels, size), np.float32),
                np.zeros((tb.arena_slots(1), tb.filters, size), np.float32),
                np.zeros((tb.nodes, tb.filters, size), np.uint8))
        self._params_size = params.size
        return Wave(*arenas, self.grads, np.array(params, np.float32),
                    self.readings[split], np.array(indices, np.int32), size,
                    mode == Mode.TRAIN)

    def _inject(self, messages: list[Message], wave: Wave) -> list[int]:
        """What the edge sent, as arrivals of the loop (-1 - entry): items put into their
        slots now, once checked as a node checks them."""
        tb, arrivals = self.tables, []
        for message in messages:
            h = message.header
            if h.dst == ALL:
                arrivals.extend(-1 - e for e in self.broadcast.get(h.kind, ()))
                continue
            e = self.from_edge.get((h.dst, h.kind, h.layer, h.phase))
            if e is None:
                raise MeshdlError(f"the edge sent {h.kind.name} to {h.dst}, which the "
                                  f"plan does not receive")
            if h.kind in ITEM_KINDS:
                arena = self._arena(int(tb.entry_buf[e]), wave)
                slots = tb.pool[tb.entry_slots[e, 0]:tb.entry_slots[e, 1]]
                if h.dtype != FLOAT32 or message.payload.shape != \
                        (len(slots), arena.shape[1], wave.batch):
                    raise MeshdlError(f"the edge's {h.kind.name} has shape "
                                      f"{message.payload.shape}")
                arena[slots] = message.payload
            arrivals.append(-1 - e)
        return arrivals

    def _arena(self, g: int, wave: Wave) -> np.ndarray:
        """The arena buffer `g` is in (the tables' slots index it whole)."""
        return wave.inputs if self.tables.buf_arena[g] == 0 else wave.features

    def _to_edge(self, m: int, wave: Wave) -> Message:
        """Message `m` of the tables, to the edge, as its sender would make it."""
        tb, key, edge = self.tables, self.layout.messages[m], self.mesh.edge
        if key.kind == Kind.REDUCE:
            payload = self.grads[int(tb.msg_src[m])].copy()
        else:
            rows = tb.pool[tb.msg_rows[m, 0]:tb.msg_rows[m, 1]]
            payload = self._arena(int(tb.msg_buf[m]), wave)[rows]
        return make(key.kind, self.mesh.spec.mesh_id, edge.step, key.src, EDGE, payload,
                    key.layer, key.phase, session=edge.session)

    def _sent_keys(self, wave: Wave) -> list[tuple]:
        """What the ledger counts of the messages the nodes sent one another in this
        wave: per message, its header's (src, dst, kind, layer, phase, shape, dtype)."""
        st = self.state
        signature = (wave.training, wave.batch, self._params_size, self._batch_payload.size,
                     int(st.counts[4]))
        keys = self._keys.get(signature)
        if keys is None:
            tb, spec = self.tables, self.mesh.spec
            keys = []
            for m in np.flatnonzero(st.sent):
                key = self.layout.messages[m]
                if key.dst == EDGE:
                    continue  # counted as the message it was
                if key.kind == Kind.PARAMS:
                    shape, dtype = (self._params_size,), FLOAT32
                elif key.kind == Kind.BATCH:
                    shape, dtype = (self._batch_payload.size,), INT32
                elif key.kind == Kind.REDUCE:
                    shape, dtype = (spec.conv_size,), FLOAT32
                else:
                    rows = int(tb.msg_rows[m, 1] - tb.msg_rows[m, 0])
                    shape = (rows, int(tb.buf_ch[tb.msg_buf[m]]), wave.batch)
                    dtype = FLOAT32
                keys.append((key.src, key.dst, key.kind, key.layer, key.phase, shape, dtype))
            self._keys[signature] = keys
        return keys


class Finished:
    """Each node's finishing round of each stage in a compiled wave, as
    `VirtualMesh._record_timing` keeps the machines' (cell, `finish_times`) pairs;
    made into dicts only when a report asks."""

    def __init__(self, waves: CompiledWaves, task_round: np.ndarray,
                 finished: np.ndarray) -> None:
        self.waves, self.task_round, self.finished = waves, task_round, finished

    def __iter__(self) -> Iterator[tuple[Cell, dict[str, float]]]:
        tb, stages = self.waves.tables, self.waves.layout.stages
        for n, cell in enumerate(self.waves.cells):
            at: dict[str, float] = {}
            for t in range(int(tb.node_tasks[n, 0]), int(tb.node_tasks[n, 1])):
                if tb.task_step[t] != SEND and self.task_round[t] != NONE:
                    at[stages[t]] = float(self.task_round[t])
            if self.finished[n] != NONE:
                at["finished"] = float(self.finished[n])
            yield cell, at
