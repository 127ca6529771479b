"""A node's plan for one mesh: the tasks it runs (sends and computations), the messages
it receives, where each item's values live, and one wave's state (`Wave`).

Everything here follows from the mesh spec and the cell alone (meshdl/protocol/spec.py); the
node machine (nodes/agent.py) runs it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from enum import IntEnum, IntFlag
from typing import NamedTuple

import numpy as np

from meshdl.nodes.execute import OPERANDS, SEND, STEP_CODES, layout_rows
from meshdl.nodes.memory import MemoryPlan, plan_memory, unplanned
from meshdl.nodes.shared import Held, held_program, interned, read_only, slice_of
from meshdl.protocol.deadlines import Arrivals, Schedule
from meshdl.protocol.lifecycle import NodePhase
from meshdl.protocol.messages import ITEM_BYTES, Kind
from meshdl.protocol.spec import Field, MeshSpec, Mode, Send
from meshdl.protocol.topology import Cell
from meshdl.protocol.work import Step, Work, node_work

Item = tuple[Field, Hashable]
ACTIVATION_SCALE_BYTES = 4  # an int8 message's scale: above float32 for a single value
Source = Hashable  # an inbox key (`InboxKey`), or the item a computation makes
Rows = slice | np.ndarray  # buffer slots: a run of them, or any (a send's items)


class InboxKey(NamedTuple):
    """How a node knows a message of its plan: its header's kind, layer, phase and
    source. Equal to (and hashes as) the plain tuple, so a header's four values look
    one up without building it."""

    kind: Kind
    layer: int
    phase: int
    src: Cell


class Seen(IntFlag):
    """What became of a message of a wave (`Wave.seen`, per inbox key; 0: nothing yet)."""

    RECEIVED = 1  # it came
    FILLED_IN = 2  # its deadline passed: values were put in its place
    LATE = RECEIVED | FILLED_IN  # it came after its deadline


class Role(IntEnum):
    """How a node takes a message of its plan (`Expect.role`)."""

    PARAMETERS = 0  # PARAMS: the conv parameters and normalization of a wave
    SAMPLES = 1  # BATCH: mode, split and sample indices of a wave
    PARTIAL_GRADIENTS = 2  # REDUCE from a tree child: a vector added to this node's own
    ITEMS = 3  # any other kind: values of items, stored in the slots of a field buffer

    @property
    def starts_wave(self) -> bool:
        """PARAMS and BATCH: together they start a wave."""
        return self in (Role.PARAMETERS, Role.SAMPLES)


class Computation(NamedTuple):
    """A task that runs one of this node's kernels."""

    step: Step  # which computation (nodes/execute.py runs it)
    layer: int
    stage: str  # its name in the wave's timing ("conv1", "pool", ...)


class SendJob(NamedTuple):
    """A task that sends the values of some items: a slice of one field buffer."""

    kind: Kind
    dst: Cell
    buffer: int
    rows: Rows
    layer: int
    phase: int


class Operation(NamedTuple):
    """A computation of the program as the machine's hot path reads it (its `Program`
    rows, as Python values and views), for `steps.run`."""

    step: int  # its step code (nodes/execute.py)
    layer: int
    buffers: tuple[int, ...]  # per operand: its field buffer, or < 0 (a list, or none)
    at: np.ndarray  # (OPERANDS, 2): each operand's range in the program's lists
    kept: tuple[int, int] | None  # (operand, conv layer): this cell's own activation,
    # which a wave may keep apart (nodes/memory.py) ...
    kept_at: np.ndarray  # ... and `at` where it is: that operand's one slot then 0
    made: tuple[int, ...]  # the tasks waiting for what it makes, in order


class Job(NamedTuple):
    """One task of a node's plan as the machine's hot path reads it: a send, or a
    computation for the executor (the machine runs it through `steps.run`, around
    nodes/execute.py: this module names no runner, since steps.py reads this one's
    `Operation` and `Wave`)."""

    train_only: bool
    send: SendJob | None
    operation: Operation | None  # a computation: its operands, else None
    stage: str
    work: Work = Work(0)  # a computation's floating-point operations (meshdl/protocol/work.py)


class Operand(NamedTuple):
    """Where a computation reads or writes (`Program.args`): slots of one of this node's
    field buffers, or a list of kernel taps (`TAP_LIST`) or of tree children
    (`CHILD_LIST`); `kept`: the conv layer of this cell's own activation, which a wave
    may keep apart (nodes/memory.py), else NONE."""

    buffer: int
    slots: list[int]
    kept: int = -1


NONE = -1  # no operand, no kept activation
TAP_LIST = -2  # an operand listing kernel taps (flat positions dy * k + dx)
CHILD_LIST = -3  # an operand listing tree children, by their place in the plan's


class Planned(NamedTuple):
    """A task as the plan lays it out, before it is numbered into the `Program`."""

    task: Computation | Send
    needs: list[Item]  # what must exist before it runs
    train_only: bool
    makes: list[Item]  # what it makes: the tasks waiting for those count down
    operands: list[Operand]


class Program(NamedTuple):
    """A node's plan as integer rows, one per task, in the node's own numbering (its
    field buffers and their slots): what the executor runs (nodes/execute.py), the
    machine one task at a time (nodes/steps.py), the compiled loop over every node's
    (nodes/compiled.py). A list (slots, taps, task numbers, children) is a range
    [start, end) of `lists`."""

    step: np.ndarray  # SEND or a step code (`execute.STEP_CODES`)
    layer: np.ndarray  # its conv layer (0: none, and every send)
    train: np.ndarray  # uint8: only training waves run it
    needs: np.ndarray  # sources it waits for
    made: np.ndarray  # (tasks, 2): the tasks waiting for what it makes, in order
    args: np.ndarray  # (tasks, OPERANDS, 3): per operand buffer (or TAP_LIST, CHILD_LIST,
    # NONE), and the range of its slots (taps, children)
    kept: np.ndarray  # (tasks, OPERANDS): `Operand.kept`
    started: np.ndarray  # range: the tasks waiting for this cell's own input, a_0
    input: np.ndarray  # (buffer, slot) of that input
    layout: np.ndarray  # the PARAMS vector's conv layers (`execute.layout_rows`)
    lists: np.ndarray  # intp; its last number a 0 (`Operation.kept_at`)

    def slots(self, start: int, end: int) -> np.ndarray:
        return self.lists[start:end]


class Expect(NamedTuple):
    """A message this node's plan receives, keyed by its `InboxKey`."""

    role: Role  # how `NodeMachine._accept` takes it
    dst: Cell  # the header's destination: this cell, or ALL for the edge's broadcasts
    rows: int = 0  # ITEMS: items carried, a payload row each ...
    channels: int = 0  # ... of (channels, batch) values
    train_only: bool = False
    buffer: int = -1  # ITEMS: the field buffer its rows go to ...
    slots: Rows = slice(0)  # ... and where in it
    index: int = 0  # its flag in a wave's `seen`
    waiters: tuple[int, ...] = ()  # the tasks waiting for it


# As plain ints for the hot path (a bytearray holds them), as `MODES` below.
RECEIVED, FILLED_IN, LATE = int(Seen.RECEIVED), int(Seen.FILLED_IN), int(Seen.LATE)

ITEMS = Role.ITEMS  # the hot path's comparison, without an attribute lookup
MODES = tuple(Mode)  # by value, without the enum's lookup


class NodePlan:
    """A node's tasks, the sources each waits for, and where each item's values live;
    built once, shared by all waves.

    Storage: the items of one field (say the activations ("a", 1) of the cells in this
    node's window, own cell included) are the slots of one (slots, channels, batch) array
    per wave. Every item has exactly one writer, a message of the plan or one of this
    node's computations, so a slot is written once per wave; a message in or out is one
    indexing of that array (a slice where its items are adjacent: slots follow the
    items' row-major order, as strips do), a compute kernel reads its window by slot
    numbers, and a wave's storage is a handful of arrays, not thousands of small ones.
    """

    def __init__(self, spec: MeshSpec, cell: Cell) -> None:
        topo, layers = spec.topology, spec.model.conv_layers
        # Its program held to its buffers, lists and parameters (nodes/compiled.py
        # `validate_program`): by the machine, before its first wave of this plan.
        self.checked = False
        if cell not in topo.members:  # left out of this mesh: nothing to do in it
            self._empty()
            return
        before, after = spec.offsets
        # Windowed pooling: the cell's block, whether it leads it, the members it pools.
        # Global pooling (`aggregates`): every cell pools its subtree, its tree children's
        # maxima with its own values.
        aggregates = spec.model.global_pool
        children = topo.children[cell]
        block = topo.block_of(cell)
        leads = topo.leader.get(block) == cell and not aggregates
        members = [cell] if aggregates else topo.pool_members(block)
        self.writer: dict[Item, Source] = {}
        # Per field, its items as they are written (fields in the order they first are,
        # that of their buffers): what `writer` holds, grouped.
        self._items: dict[Field, list[Hashable]] = {}
        received = {InboxKey(*key): send for key, send in spec.expects[cell].items()}
        for key, send in received.items():
            self._write(send.field, send.items, key)
        # What this node computes itself: its cell's activations and output gradients; a
        # block leader also its block's pooled features and each member's routed gradient.
        for layer in range(layers + 1):
            self._write(("a", layer), [cell])
        for layer in range(1, layers + 1):
            self._write(("dz", layer), [cell])
        if leads:
            self._write(("pooled",), [block])
            self._write(("route",), members)
        if aggregates:  # its subtree's maxima, their first cells, and the routing down
            self._write(("pooled",), [cell])
            self._write(("winner",), [cell])
            self._write(("route",), [cell])
            self._write(("dpooled",), children)
        # Window cells whose values no message brings (absent cells, or relayed only
        # through them): orphans, filled in before the kernel that reads them.
        self.orphans: dict[Field, list[Hashable]] = {}
        windows = [(("a", layer - 1), topo.window(cell, before, after))
                   for layer in range(1, layers + 1)]
        windows += [(("dz", layer), topo.window(cell, after, before))
                    for layer in range(2, layers + 1)]
        # A cell that cannot reach its block's leader (dead cells in between) is pooled
        # by nobody: no gradient is routed back to it.
        if cell not in members:
            windows.append((("route",), [cell]))
        for f, window in windows:
            for c in window:
                if (f, c) not in self.writer:
                    self.orphans.setdefault(f, []).append(c)
                    self.writer[(f, c)] = (f, c)
                    self._items.setdefault(f, []).append(c)
        orphaned = {(f, c) for f, items in self.orphans.items() for c in items}
        fields, self._items = self._items, {}
        self.buffers = {f: index for index, f in enumerate(fields)}  # field -> buffer
        self.slots = [{item: slot for slot, item in enumerate(sorted(items))}
                      for items in fields.values()]  # per buffer: item -> slot
        self.buffer_channels = [spec.item_shape(f, 0)[0] for f in fields]

        # The inbox's entries without their index and waiters (`Expect`'s first seven
        # fields): each `Expect` is made once, when the tasks waiting for it are known.
        entries: dict[InboxKey, tuple] = {
            key: (Role.ITEMS, cell, len(send.items), self.buffer_channels[self.buffers[
                send.field]], send.train_only, self.buffers[send.field],
                  self.rows(send.field, send.items))
            for key, send in received.items()}
        control, to = spec.control_source(cell), spec.control_destination or cell
        entries[InboxKey(Kind.PARAMS, 0, 0, control)] = (Role.PARAMETERS, to)
        entries[InboxKey(Kind.BATCH, 0, 0, control)] = (Role.SAMPLES, to)
        for child in topo.children[cell]:
            key = InboxKey(Kind.REDUCE, 0, 0, child)
            entries[key] = (Role.PARTIAL_GRADIENTS, cell, 0, 0, True)
            self.writer[(("reduce",), child)] = key  # no buffer: REDUCE is a vector

        # Each task: what it is, the items it needs, whether only training runs it, the
        # items it makes and its operands (where what it reads and writes lives, for
        # the executor: nodes/execute.py); computations, then sends, in a fixed order.
        # A computation needs every item its kernel reads, so it runs only once they all
        # exist, in whatever order messages arrive (a message may come early, forged or
        # not: it fills its slot and waits). Own results stand for what they were made
        # from: ("a", layer) of this cell for the window conv `layer` read.
        kernel = spec.model.kernel
        forward = _taps(cell, topo.window(cell, before, after), before, kernel)
        backward = _taps(cell, topo.window(cell, after, before), after, kernel)

        def of(f: Field, items: Iterable[Hashable], kept: int = NONE) -> Operand:
            b = self.buffers[f]
            return Operand(b, [self.slots[b][i] for i in items], kept)

        def own_a(layer: int) -> Operand:  # this cell's activation, maybe kept apart
            return of(("a", layer), [cell], layer)

        def taps(window: list[tuple[Cell, int]]) -> Operand:
            return Operand(TAP_LIST, [tap for _, tap in window])

        def cells(window: list[tuple[Cell, int]]) -> list[Cell]:
            return [c for c, _ in window]

        tasks: list[Planned] = []
        for layer in range(1, layers + 1):
            needs = [(("a", layer - 1), c) for c in topo.window(cell, before, after)
                     if (("a", layer - 1), c) not in orphaned]
            tasks.append(Planned(
                Computation(Step.CONV, layer, f"conv{layer}"), needs, False,
                [(("a", layer), cell)],
                [of(("a", layer - 1), cells(forward)), taps(forward),
                 of(("a", layer), [cell])]))
        if leads:
            needs = [(("a", layers), c) for c in members]
            tasks.append(Planned(Computation(Step.POOL, layers, "pool"), needs, False,
                                 [(("pooled",), block)],
                                 [of(("a", layers), members), of(("pooled",), [block])]))
            needs = [(("dpooled",), block), (("pooled",), block)]  # and pool's winners
            tasks.append(Planned(Computation(Step.ROUTE, layers, "route"), needs, True,
                                 [(("route",), c) for c in members],
                                 [of(("dpooled",), [block]), of(("route",), members)]))
        if aggregates:
            needs = [(("a", layers), cell), *((("pooled",), c) for c in children)]
            tasks.append(Planned(
                Computation(Step.AGGREGATE, layers, "pool"), needs, False,
                [(("pooled",), cell)],
                [own_a(layers), of(("pooled",), children), of(("pooled",), [cell])]))
            needs = [(("pooled",), cell), *((("winner",), c) for c in children)]
            tasks.append(Planned(
                Computation(Step.WINNERS, layers, "winners"), needs, True,
                [(("winner",), cell)],
                [own_a(layers), of(("pooled",), [cell]), of(("pooled",), children),
                 of(("winner",), children), of(("winner",), [cell])]))
            needs = [(("dpooled",), cell), (("winner",), cell)]  # and which source won
            tasks.append(Planned(
                Computation(Step.SPLIT, layers, "route"), needs, True,
                [(("route",), cell), *((("dpooled",), c) for c in children)],
                [of(("dpooled",), [cell]), of(("route",), [cell]),
                 of(("dpooled",), children)]))
        needs = [(("route",), cell)] if cell in members else []
        needs.append((("a", layers), cell))  # ReLU's mask
        tasks.append(Planned(
            Computation(Step.DZ_TOP, layers, "dz_top"), needs, True, [(("dz", layers), cell)],
            [own_a(layers), of(("route",), [cell]), of(("dz", layers), [cell])]))
        for layer in range(layers, 0, -1):
            # The weight gradient of a layer is taken either from this cell's output
            # gradient and input window or, above the first layer, from this cell's
            # input and the output gradients around it (nodes/memory.py): it waits for
            # what both read. The input gradient comes after it: it may overwrite what
            # the weight gradient reads (seed 002's order).
            needs = [(("dz", layer), cell), (("a", layer), cell)]  # the input window
            window = [(("dz", layer), c) for c in topo.window(cell, after, before)
                      if (("dz", layer), c) not in orphaned] if layer > 1 else []
            around = [of(("dz", layer), cells(backward)), taps(backward)] if layer > 1 \
                else [Operand(NONE, []), Operand(NONE, [])]
            tasks.append(Planned(
                Computation(Step.WEIGHT_GRAD, layer, f"grad{layer}"), needs + window, True,
                [(("grad", layer), cell)],  # a marker: the reduce and dinput wait for it
                [of(("dz", layer), [cell]), of(("a", layer - 1), cells(forward)),
                 taps(forward), *around, own_a(layer - 1)]))
            if layer > 1:
                needs = [*window, (("a", layer - 1), cell), (("grad", layer), cell)]
                tasks.append(Planned(
                    Computation(Step.INPUT_GRAD, layer, f"dinput{layer}"), needs, True,
                    [(("dz", layer - 1), cell)],
                    [of(("dz", layer), cells(backward)), taps(backward),
                     own_a(layer - 1), of(("dz", layer - 1), [cell])]))
        needs = [(("grad", layer), cell) for layer in range(1, layers + 1)]
        needs += [(("reduce",), child) for child in topo.children[cell]]
        tasks.append(Planned(Computation(Step.REDUCE, 0, "reduce"), needs, True, [],
                             [Operand(CHILD_LIST, list(range(len(children))))]))
        for send in spec.sends[cell]:
            tasks.append(Planned(send, [(send.field, i) for i in send.items],
                                 send.train_only, [], [of(send.field, send.items)]))

        # What this node sends besides items (`MeshSpec.relays`): PARAMS and BATCH on
        # to its tree children as a wave starts, its REDUCE and HEALTH up the tree.
        relays = spec.relays[cell]
        self.forwards = [s for s in relays if s.kind in (Kind.PARAMS, Kind.BATCH)]
        self.reduce_to = next(s.dst for s in relays if s.kind == Kind.REDUCE)
        self.health_to: Cell | None = next(s.dst for s in relays if s.kind == Kind.HEALTH)

        self.tasks = [planned.task for planned in tasks]
        # A send's values: (buffer, slots) of its items.
        self.send_rows: list[tuple[int, Rows] | None] = [
            (self.buffers[task.field], self.rows(task.field, task.items))
            if isinstance(task, Send) else None for task in self.tasks]
        self.train_only = [planned.train_only for planned in tasks]
        waiters: dict[Source, list[int]] = {}
        self.needs_count: list[int] = []
        writer = self.writer.get
        for index, planned in enumerate(tasks):
            # An item nobody writes is a computation's marker (("grad", layer), cell).
            sources = dict.fromkeys(map(writer, planned.needs, planned.needs))
            self.needs_count.append(len(sources))
            for source in sources:
                waiters.setdefault(source, []).append(index)
        self.waiters: dict[Source, tuple[int, ...]] = {
            source: interned(tuple(tasks)) for source, tasks in waiters.items()}
        self.inbox: dict[InboxKey, Expect] = {
            key: Expect(*_padded(entry), index, self.waiting_for(key))
            for index, (key, entry) in enumerate(entries.items())}
        self.keys = list(self.inbox)  # by `Expect.index`
        self.expected = list(self.inbox.values())
        # What each message carries (field, items): a best-effort node fills them in
        # when one misses its deadline (meshdl/protocol/deadlines.py).
        self.carries: list[tuple[Field, tuple[Hashable, ...]]] = [
            (received[key].field, tuple(received[key].items)) if key in received else
            (("reduce",), ()) for key in self.keys]
        # Which task makes each of this node's own items (its own readings are there
        # from the wave's start): a neighbour's value is usable once it is made.
        self.maker: dict[Item, int] = {item: index for index, planned in enumerate(tasks)
                                       for item in planned.makes if item in self.writer}
        # Per field: the slots of its orphans, filled in per wave (nodes/besteffort.py).
        self.orphan_rows = {f: np.array([self.slot(f, c) for c in items], np.intp)
                            for f, items in self.orphans.items()}
        self.number = cell[0] * spec.model.cols + cell[1]  # as BATCH and WINNER name it
        # Held once for every plan of the same content (nodes/shared.py), with the jobs
        # of its computations.
        held = held_program(self._program(spec, cell, tasks))
        self.program = program = held.program
        self.jobs = self._jobs(spec, cell, held)
        # The program's input as the machine reads it: (buffer, slot, waiting tasks).
        self.input = (int(program.input[0]), int(program.input[1]),
                      tuple(int(t) for t in program.slots(*program.started)))
        self.active = {mode: sum(1 for t in self.train_only if mode == Mode.TRAIN or not t)
                       for mode in Mode}
        self.ready_at_start = [i for i, n in enumerate(self.needs_count) if n == 0]
        # What a sender may have waiting here: two waves' worth of its messages, each at
        # the largest batch (an honest sender is at most one wave ahead).
        self.early_bytes: dict[Cell, int] = {}
        fixed = {Role.PARTIAL_GRADIENTS: spec.reduce_size, Role.PARAMETERS: spec.params_size,
                 Role.SAMPLES: spec.max_batch_values}
        for (_, _, _, src), expect in self.inbox.items():
            values = expect.rows * expect.channels * spec.max_batch \
                if expect.role == Role.ITEMS else fixed[expect.role]
            size = ITEM_BYTES * values + ACTIVATION_SCALE_BYTES
            if expect.role == Role.PARTIAL_GRADIENTS and spec.reduce_codec is not None:
                size = max(size, spec.reduce_codec.nbytes)  # top-k: more than float32
            if expect.role == Role.PARTIAL_GRADIENTS and spec.reduce_sum is not None:
                size = max(size, spec.reduce_sum.max_nbytes(
                    spec.topology.subtree_sizes.get(src, 1)))
            self.early_bytes[src] = self.early_bytes.get(src, 0) + 2 * size
        self.buffer_shapes = [(len(s), c) for s, c in zip(self.slots, self.buffer_channels,
                                                          strict=True)]
        self.layers = layers
        # Where a wave's fields live, by mode and exactness (nodes/memory.py): planned
        # when a wave first asks (a run asks for one or two of the four).
        self._memory: dict[tuple[Mode, bool], MemoryPlan] = {}
        self.unplanned = unplanned(self.buffer_shapes, layers)

    def _empty(self) -> None:
        """The plan of a cell the mesh leaves out: no messages, no tasks."""
        self.writer, self.buffers, self.slots, self.buffer_channels = {}, {}, [], []
        self.inbox, self.keys, self.expected, self.carries = {}, [], [], []
        self.maker, self.orphans, self.tasks, self.send_rows = {}, {}, [], []
        self.train_only, self.waiters, self.needs_count = [], {}, []
        self.forwards, self.reduce_to, self.health_to = [], None, None
        self.active = dict.fromkeys(Mode, 0)
        self.ready_at_start, self.early_bytes, self.buffer_shapes = [], {}, []
        self.layers, self._memory = 0, {}
        self.unplanned = unplanned([], 0)
        self.orphan_rows, self.number, self.jobs, self.input = {}, 0, [], (0, 0, ())
        self.program = Program(
            *(np.zeros(0, np.int64) for _ in range(4)), np.zeros((0, 2), np.int64),
            np.zeros((0, OPERANDS, 3), np.int64), np.zeros((0, OPERANDS), np.int64),
            np.zeros(2, np.int64), np.zeros(2, np.int64), np.full((1, 7), -1, np.int64),
            np.zeros(0, np.intp))

    def _program(self, spec: MeshSpec, cell: Cell, tasks: list[Planned]) -> Program:
        """The tasks as the executor's integer rows (`Program`)."""
        lists: list[int] = []

        def put(values: Iterable[int]) -> tuple[int, int]:
            start = len(lists)
            lists.extend(int(v) for v in values)
            return start, len(lists)

        count = len(tasks)
        made, kept = np.zeros((count, 2), np.int64), np.full((count, OPERANDS), NONE, np.int64)
        args = np.zeros((count, OPERANDS, 3), np.int64)
        args[..., 0] = NONE
        for t, planned in enumerate(tasks):
            made[t] = put(w for item in planned.makes for w in self.waiting_for(item))
            for i, operand in enumerate(planned.operands):
                args[t, i] = (operand.buffer, *put(operand.slots))
                kept[t, i] = operand.kept
        a0 = self.buffers[("a", 0)]
        started = np.array(put(self.waiting_for((("a", 0), cell))), np.int64)
        put([0])  # the one slot of an activation kept apart (`Operation.kept_at`)
        return Program(
            step=np.array([SEND if isinstance(p.task, Send) else STEP_CODES[p.task.step]
                           for p in tasks], np.int64),
            layer=np.array([0 if isinstance(p.task, Send) else p.task.layer for p in tasks],
                           np.int64),
            train=np.array([p.train_only for p in tasks], np.uint8),
            needs=np.array(self.needs_count, np.int64), made=made, args=args, kept=kept,
            started=started, input=np.array([a0, self.slots[a0][cell]], np.int64),
            layout=layout_rows(spec.params_layout), lists=np.array(lists, np.intp))

    def _jobs(self, spec: MeshSpec, cell: Cell, held: Held[Program]) -> list[Job]:
        """The program's rows as the machine's hot path reads them: a computation's job
        is the one made for the held program (`held.jobs`) when its own figures (its
        flops) are the same."""
        jobs = []
        for t, (task, rows) in enumerate(zip(self.tasks, self.send_rows, strict=True)):
            if isinstance(task, Send):
                send = SendJob(task.kind, task.dst, *rows, task.layer, task.phase)
                jobs.append(Job(self.train_only[t], send, None, ""))
                continue
            key = (t, task.stage, node_work(spec, cell, task.step, task.layer))
            job = held.jobs.get(key)
            if job is None:
                job = held.jobs[key] = self._computation(t, task, key[2])
            jobs.append(job)
        return jobs

    def _computation(self, t: int, task: Computation, work: Work) -> Job:
        """Task `t`'s job, a computation of the program (read-only: held jobs are
        shared by plans)."""
        program, lists = self.program, self.program.lists
        zero = len(lists) - 1  # (a 0)
        at = np.ascontiguousarray(program.args[t, :, 1:])
        kept_at, kept = at.copy(), None
        for i, layer in enumerate(program.kept[t]):
            if layer != NONE:
                kept, kept_at[i] = (i, int(layer)), (zero, zero + 1)
        made = interned(tuple(int(w) for w in lists[program.made[t, 0]:program.made[t, 1]]))
        operation = Operation(int(program.step[t]), int(program.layer[t]),
                              tuple(int(b) for b in program.args[t, :, 0]), read_only(at),
                              kept, read_only(kept_at), made)
        return Job(self.train_only[t], None, operation, task.stage, work)

    def memory(self, mode: Mode, exact: bool) -> MemoryPlan:
        """Where the fields of a wave of `mode` live, exact or best effort
        (nodes/memory.py); planned once per plan."""
        key = (mode, exact)
        planned = self._memory.get(key)
        if planned is None:
            planned = self._memory[key] = plan_memory(self.buffers, self.buffer_shapes,
                                                      mode, exact, self.layers)
        return planned

    def usable(self, wave: Wave, f: Field, item: Hashable) -> bool:
        """Has this wave got the values of item `item` of field `f` (received, not
        filled in; or computed here)?"""
        writer = self.writer[(f, item)]
        if item in self.orphans.get(f, ()):
            return False
        if writer == (f, item):  # this node's own
            maker = self.maker.get(writer)
            return maker is None or bool(wave.done[maker])
        return wave.seen[self.inbox[writer].index] == RECEIVED

    def _write(self, f: Field, items: Sequence[Hashable], writer: Source | None = None
               ) -> None:
        """Record who writes `items` of field `f`: a message (its inbox key), or (None)
        this node's own computations, each known by the item it makes."""
        keys = [(f, item) for item in items]
        written = {key: key for key in keys} if writer is None else dict.fromkeys(keys, writer)
        if len(written) < len(keys) or not self.writer.keys().isdisjoint(written):
            # The plan would write a slot twice in a wave: name the first such item.
            seen = set(self.writer)
            for key in keys:
                if key in seen:
                    raise ValueError(f"item {key} has two writers")
                seen.add(key)
        self.writer.update(written)
        self._items.setdefault(f, []).extend(items)

    def waiting_for(self, source: Source) -> tuple[int, ...]:
        """The tasks that wait for a message (its inbox key) or a computation (the item
        it makes)."""
        return self.waiters.get(source, ())

    def slot(self, f: Field, item: Hashable) -> int:
        return self.slots[self.buffers[f]][item]

    def rows(self, f: Field, items: Iterable[Hashable]) -> Rows:
        """The slots of `items` in field `f`'s buffer: a slice when they are a run."""
        slots = list(map(self.slots[self.buffers[f]].__getitem__, items))
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice_of(slots[0], slots[0] + len(slots))
        return np.array(slots, np.intp)


class Wave:
    """Everything a node knows about one wave (one step number of one edge session)."""

    def __init__(self, step: int, session: int, plan: NodePlan) -> None:
        self.step = step
        self.session = session
        # Where the wave is in its lifecycle (meshdl/protocol/lifecycle.py): it begins when the
        # first PARAMS of its step come; only `NodeMachine._move` changes it.
        self.phase = NodePhase.AWAITING_CONTROL
        self.mode: Mode | None = None
        self.training = False
        self.scheduled = False  # started by the node's clock on cached parameters
        self.failed_out = False  # failout: this cell acts dead in this training wave
        self.params_vector: np.ndarray | None = None  # PARAMS: conv weights, mean, std
        self.params_payload: np.ndarray | None = None  # all of it (the plan's tail too)
        self.batch_payload: np.ndarray | None = None
        self.batch = 0
        # Per field: (slots, channels, batch); None (despite the type, for the hot path)
        # for a field the wave never touches (nodes/memory.py). Per conv layer: this
        # cell's activation, (1, channels, batch), kept apart where its field's memory
        # goes to gradients in the backward pass, else None.
        self.buffers: list[np.ndarray] = []
        self.kept: list[np.ndarray | None] = []
        self.by_input_cell = False  # weight gradients above layer 1: see nodes/memory.py
        # Where fields share memory, gradients that come before this node's forward
        # tasks are done wait here (nodes/memory.py).
        self.forward_left = 0
        self.holding = False
        self.held: list[tuple[Expect, np.ndarray]] = []
        self.deferred: list[int] = []  # ... and backward tasks that were ready
        self.reduce: dict[Cell, np.ndarray] = {}  # children's REDUCE payloads
        self.missing = list(plan.needs_count)  # per task: sources still to come
        self.ready: list[int] = list(plan.ready_at_start)
        self.tasks_done = 0
        # Training: this subtree's gradients (the conv layers', then a position bias's).
        self.grad: np.ndarray | None = None
        # With a position bias: the column of its table this cell reads for each map
        # (`NodeMachine.position_columns`); None: the model has none.
        self.columns: np.ndarray | None = None
        self.weights: dict[int, np.ndarray] = {}  # layer -> (h, c_in, k * k)
        self.biases: dict[int, np.ndarray] = {}  # layer -> (h,)
        self.winners: np.ndarray | None = None  # leader: argmax over its block's cells
        self.seen = bytearray(len(plan.inbox))  # per inbox key: 0 or a `Seen`
        self.done = bytearray(len(plan.tasks))  # per task: has run
        self.finished_at: dict[str, float] = {}
        # Best effort (meshdl/protocol/deadlines.py): this wave's deadlines, from when each phase
        # began (as a list by time, and per inbox entry); how far each list has been
        # gone through; messages filled in.
        self.arrivals: Arrivals | None = None
        self.schedule: Schedule | None = None
        self.learnt: dict[int, float] | None = None  # learning: when each message came
        self.timing = False  # deadlines or learning: each arrival's time counts
        self.after: dict[int, float] = {}
        self.started_at = 0.0
        self.backward_at: float | None = None
        self.next_forward = self.next_backward = 0

    def renumber(self, step: int, session: int) -> None:
        """The same wave as wave `step` of edge session `session`: one finished wave the
        compiled dispatch runs stands for each of its kind (`agent.compiled_wave`)."""
        self.step, self.session = step, session


def _padded(entry: tuple) -> tuple:
    """An inbox entry's first seven `Expect` fields, the defaults after what it gives."""
    return entry + _EXPECT_DEFAULTS[len(entry):]


_EXPECT_DEFAULTS = tuple(Expect._field_defaults.get(name) for name in Expect._fields[:7])


def _taps(cell: Cell, window: list[Cell], before: int, kernel: int) -> list[tuple[Cell, int]]:
    """Each window cell with its tap: the flat index into the k x k kernel positions."""
    return [(c, (c[0] - cell[0] + before) * kernel + c[1] - cell[1] + before) for c in window]
