"""Every node's program of one mesh as flat tables, and an exact wave's rounds run over
them in one compiled loop: the in-process mesh's dispatch at the cost of a table lookup a
message.

The node machine (nodes/agent.py) takes one message at a time in Python, which is most
of a virtual-mesh run. In an exact wave inside one process, what a node does with a
message of its plan is fixed once the plan is: its values go into the slots its `Expect`
names, the tasks waiting for it count down, and those whose sources are all in run. Here
the values are not even copied: every slot of the tables is a *home* slot, where the
item was made (a received item's is in its sender's buffer, or its first sender's when
relayed), and nothing writes a slot twice in a wave. `tabulate` reads each node's
program (`NodePlan.program`: its tasks' steps, operands and waiters, nodes/plan.py) into
arrays of global numbers, once, and `validate` holds every index of them to what it
indexes (the loop itself checks no bounds); `run_rounds` delivers rounds as the virtual
broker does (what is sent in round r arrives in round r + 1) and runs each ready task
through the executor the machines use too (`execute.run_task`, nodes/execute.py), so
every value is the machines' to the bit (tests/test_compiled.py). Only messages to and
from the edge leave the loop; sim/compiled.py hands them to the edge machine.

What it does not do is what an exact in-process wave never needs: deadlines and
fill-ins, compression, delta halos, replanning, held gradients under shared memory
(no slot here is written twice), and checking messages that never leave it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np
from numba import njit

from meshdl.errors import MeshdlError
from meshdl.nodes.execute import (
    A_SCALE,
    B_LEN,
    B_OFF,
    CONV,
    INPUT_GRAD,
    OPERAND_KINDS,
    OPERANDS,
    P_CELLS,
    P_OFF,
    PAIRED,
    REDUCE,
    SEND,
    W_FILTERS,
    W_OFF,
    W_TAPS,
    WEIGHT_GRAD,
    run_task,
    start_input,
)
from meshdl.nodes.execute import (
    UnknownStep as UnknownStep,  # (what the loop raises: the executor's)
)
from meshdl.nodes.plan import CHILD_LIST, TAP_LIST, Job, NodePlan, Role
from meshdl.nodes.shared import hash_arrays
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.spec import MeshSpec, Mode
from meshdl.protocol.topology import Cell

ITEMS, PARAMETERS, SAMPLES, PARTIAL_GRADIENTS = (int(r) for r in (
    Role.ITEMS, Role.PARAMETERS, Role.SAMPLES, Role.PARTIAL_GRADIENTS))
NONE = -1  # no such buffer, slot, message or operand; a message's destination: the edge
# What an operand of a task (`Tables.task_kind`) lists: home slots of the inputs' arena
# or the filters', kernel taps, or tree children (node numbers).
INPUTS, FEATURES, TAPS, CHILDREN = range(4)
# `State.counts`: arrivals of this round (`cur`), of the next (`nxt`), messages to the
# edge (`to_edge`), tasks ready (`stack`), messages sent in the wave.
ARRIVALS, NEXT, TO_EDGE, READY, SENT_COUNT = range(5)


class Tables(NamedTuple):
    """The programs of every node of a mesh, numbered: nodes 0..N-1 (in `cells` order),
    their buffers, inbox entries, tasks and messages, each by a global number. A list
    per owner (the slots of an operand, the tasks waiting for a source) is a range
    [start, end) of `lists`, given as a (..., 2) array of ranges."""

    lists: np.ndarray  # intp: slots, taps, task numbers and node numbers of every list
    # Buffers: each node's field buffers, numbered in node order; their slots live in
    # the wave's arena `buf_arena` (INPUTS for fields of the input's channels, FEATURES
    # for the filters'), an array (home slots, channels, batch): a slot of any list
    # below is a home slot, where the item's value was made (`_Builder.glob`).
    buf_arena: np.ndarray
    arena_sizes: np.ndarray  # home slots of each arena
    buf_ch: np.ndarray
    # Inbox entries (node `entry_node`): how each is taken, where its items go, and the
    # tasks waiting for it.
    entry_node: np.ndarray
    entry_role: np.ndarray
    entry_buf: np.ndarray
    entry_slots: np.ndarray  # ranges
    entry_waiters: np.ndarray  # ranges
    # Tasks: node, step (SEND or a step code), conv layer, training only, sources
    # needed, the message a send (or REDUCE) sends, the tasks waiting for what a
    # computation makes, and its operands (`Program.args`): what each lists (INPUTS,
    # FEATURES, TAPS, CHILDREN or NONE) and the range of its list.
    task_node: np.ndarray
    task_step: np.ndarray
    task_layer: np.ndarray
    task_train: np.ndarray
    task_needs: np.ndarray
    task_msg: np.ndarray
    task_made: np.ndarray  # ranges
    task_kind: np.ndarray  # (tasks, OPERANDS)
    task_args: np.ndarray  # (tasks, OPERANDS, 2) ranges
    node_tasks: np.ndarray  # ranges: a node's tasks are a run of numbers
    # Messages: sender, its buffer and rows (ITEMS), receiver (NONE: the edge) and the
    # inbox entry it fills there.
    msg_src: np.ndarray
    msg_buf: np.ndarray
    msg_rows: np.ndarray  # ranges
    msg_dst: np.ndarray
    msg_entry: np.ndarray
    # Per node: PARAMS and BATCH to its children (ranges of message numbers), the tasks
    # waiting for its own normalized readings (ranges) and their home slot (INPUTS),
    # tasks a wave runs (training, inference), row x cols + col, and whether weight
    # gradients above layer 1 are taken by input cell.
    forwards: np.ndarray
    made_input: np.ndarray
    input_slot: np.ndarray
    active: np.ndarray  # (N, 2)
    number: np.ndarray  # float64
    by_input: np.ndarray  # uint8
    # The parameters' layout (`ParamsLayout`), per conv layer.
    w_off: np.ndarray
    w_shape: np.ndarray  # (layers + 1, 3)
    b_off: np.ndarray
    b_len: np.ndarray
    # A position bias: where its (filters, cells) table starts in PARAMS, at the last
    # layer (NONE: none, at every other), and the grid's cells (its stride).
    p_off: np.ndarray
    cells: int
    mean_off: int
    std_off: int
    in_channels: int
    layers: int
    filters: int
    conv_size: int  # values of the conv parameters: a gradient vector's first
    grad_size: int  # values of a node's gradient vector (`grads`' rows): then a table's
    params_size: int  # values of the PARAMS vector the offsets above index

    @property
    def nodes(self) -> int:
        return len(self.node_tasks)

    def arena_slots(self, arena: int) -> int:
        """Home slots of one arena (INPUTS, FEATURES)."""
        return int(self.arena_sizes[arena])


class AdoptedNode(Protocol):
    """What the tables are read from of a node machine (`NodeMachine`, nodes/agent.py,
    which imports this module to check its own program: `validate_program`): its cell,
    its adopted plan and the plan's tasks, its tree children, and whether its waves lay
    their fields out by the memory plan."""

    cell: Cell
    plan: NodePlan
    jobs: list[Job]
    children: list[Cell]
    memory_plan: bool


class MessageKey(NamedTuple):
    """A message of the tables as its header names it (the payload's shape aside)."""

    src: Cell
    dst: Cell
    kind: Kind
    layer: int
    phase: int


class _Sent(NamedTuple):
    """A message of the tables as the builder first lays it out."""

    src: int  # node
    buffer: int  # ITEMS: the sender's buffer (global), else NONE ...
    rows: np.ndarray | None  # ... and its slots there
    dst: int  # node, or NONE: the edge
    entry: int  # the receiver's inbox entry (global), or NONE


class MeshTables(NamedTuple):
    """A mesh's tables, what each message of them is, and each task's stage name."""

    tables: Tables
    messages: list[MessageKey]
    stages: list[str]  # "" for a send


def tabulate(spec: MeshSpec, nodes: list[AdoptedNode]) -> MeshTables:
    """The tables of `nodes` (every member of `spec`'s mesh, adopted to `spec`)."""
    builder = _Builder(spec, nodes)
    tables = builder.tables()
    validate(tables)
    stages = [job.stage if job.send is None else "" for node in nodes for job in node.jobs]
    return MeshTables(tables, builder.keys, stages)


class _Builder:
    """Reads node machines' adopted plans into `Tables`."""

    def __init__(self, spec: MeshSpec, nodes: list[AdoptedNode]) -> None:
        self.spec, self.nodes = spec, nodes
        self.index: dict[Cell, int] = {node.cell: n for n, node in enumerate(nodes)}
        self.lists: list[int] = []
        self.known: dict[tuple[int, ...], tuple[int, int]] = {}  # operands' lists put
        self.node_buffer: list[int] = []
        self.node_entry: list[int] = []
        self.node_task: list[int] = []
        buffers = entries = tasks = 0
        for node in nodes:
            self.node_buffer.append(buffers)
            self.node_entry.append(entries)
            self.node_task.append(tasks)
            buffers += len(node.plan.buffer_shapes)
            entries += len(node.plan.expected)
            tasks += len(node.jobs)
        self.counts = (buffers, entries, tasks)
        self.sent: list[_Sent] = []  # every message of the tables, numbered ...
        self.keys: list[MessageKey] = []  # ... and its header's names

    def put(self, values) -> tuple[int, int]:
        """A list appended to `lists`: its range there."""
        start = len(self.lists)
        self.lists.extend(int(v) for v in values)
        return start, len(self.lists)

    def put_operand(self, values) -> tuple[int, int]:
        """An operand's list: where the same operand list already is, or appended (a
        window's slots are read by several tasks: one copy keeps the loop's lists
        small)."""
        values = tuple(int(v) for v in values)
        at = self.known.get(values)
        if at is None:
            at = self.known[values] = self.put(values)
        return at

    def glob(self, buffer: int, slots) -> np.ndarray:
        """Where the values of `slots` of a (global) buffer live: their home slots in its
        arena."""
        return self.home[self.buf_arena[buffer]][self.buf_off[buffer] + _slot_array(slots)]

    def entry_of(self, dst: Cell, kind: Kind, layer: int, phase: int, src: Cell) -> int:
        node = self.nodes[self.index[dst]]
        return self.node_entry[self.index[dst]] + node.plan.inbox[(kind, layer, phase, src)].index

    def tables(self) -> Tables:
        spec, nodes = self.spec, self.nodes
        layers, n_nodes = spec.model.conv_layers, len(nodes)
        _, entries, tasks = self.counts
        self._buffers()
        entry_node, entry_role, entry_buf = (np.full(entries, NONE, np.int64) for _ in range(3))
        entry_slots, entry_waiters = (np.zeros((entries, 2), np.int64) for _ in range(2))
        received: dict[int, np.ndarray] = {}  # per ITEMS entry: the slots it fills
        for n, node in enumerate(nodes):
            if node.plan.orphans:  # (every cell a member: every item is sent)
                raise ValueError(f"cell {node.cell} has items no message brings")
            base = self.node_task[n]
            for expect in node.plan.expected:
                e = self.node_entry[n] + expect.index
                entry_node[e], entry_role[e] = n, int(expect.role)
                if expect.role == Role.ITEMS:
                    entry_buf[e] = self.node_buffer[n] + expect.buffer
                    received[e] = _slot_array(expect.slots)
                entry_waiters[e] = self.put(base + t for t in expect.waiters)
        task_node, task_step, task_layer, task_train, task_needs, task_msg = (
            np.full(tasks, NONE, np.int64) for _ in range(6))
        task_made, node_tasks = np.zeros((tasks, 2), np.int64), np.zeros((n_nodes, 2), np.int64)
        forwards, made_input = np.zeros((n_nodes, 2), np.int64), np.zeros((n_nodes, 2), np.int64)
        active = np.zeros((n_nodes, 2), np.int64)
        # Operands in the node's numbering, until the home slots are known: (task,
        # operand, global buffer or NONE, what it lists, its numbers).
        operands: list[tuple[int, int, int, int, np.ndarray]] = []
        for n, node in enumerate(nodes):
            plan, base = node.plan, self.node_task[n]
            program, buffers = plan.program, self.node_buffer[n]
            node_tasks[n] = base, base + len(program.step)
            task_node[base:base + len(program.step)] = n
            for name, values in (("step", task_step), ("layer", task_layer),
                                 ("train", task_train), ("needs", task_needs)):
                values[base:base + len(program.step)] = getattr(program, name)
            for i, args in enumerate(program.args):
                t = base + i
                if program.step[i] == SEND:
                    send, (buffer, start, end) = plan.tasks[i], args[0]
                    task_msg[t] = self.message(n, send.kind, send.dst, send.layer, send.phase,
                                               buffers + buffer, program.slots(start, end))
                    continue
                task_made[t] = self.put(base + w for w in program.slots(*program.made[i]))
                for k, (buffer, start, end) in enumerate(args):
                    values = program.slots(start, end)
                    if buffer >= 0:
                        operands.append((t, k, buffers + buffer, NONE, values))
                    elif buffer == TAP_LIST:
                        operands.append((t, k, NONE, TAPS, values))
                    elif buffer == CHILD_LIST:
                        operands.append((t, k, NONE, CHILDREN, np.array(
                            [self.index[node.children[c]] for c in values], np.int64)))
                if program.step[i] == REDUCE:
                    task_msg[t] = self.message(n, Kind.REDUCE, plan.reduce_to, 0, 0)
            forwards[n] = self.put([self.message(n, s.kind, s.dst, 0, 0)
                                    for s in plan.forwards])
            made_input[n] = self.put(base + w for w in program.slots(*program.started))
            active[n] = plan.active[Mode.TRAIN], plan.active[Mode.INFER]
        self._homes(received, entry_buf)
        for e, slots in received.items():
            entry_slots[e] = self.put(self.glob(entry_buf[e], slots))
        task_kind = np.full((tasks, OPERANDS), NONE, np.int64)
        task_args = np.zeros((tasks, OPERANDS, 2), np.int64)
        for t, k, g, kind, values in operands:
            if g == NONE:
                task_kind[t, k], task_args[t, k] = kind, self.put_operand(values)
            else:
                task_kind[t, k] = self.buf_arena[g]
                task_args[t, k] = self.put_operand(self.glob(g, values))
        input_slot = np.array([self.glob(self.node_buffer[n] + node.plan.program.input[0],
                                         node.plan.program.input[1])[0]
                               for n, node in enumerate(nodes)], np.int64)
        sent = self.sent
        msg_src, msg_buf, msg_dst, msg_entry = (
            np.array([getattr(m, name) for m in sent], np.int64)
            for name in ("src", "buffer", "dst", "entry"))
        msg_rows = np.array([(0, 0) if m.rows is None else self.put(self.glob(m.buffer, m.rows))
                             for m in sent], np.int64).reshape(-1, 2)
        by_input = np.array([(node.plan.memory(Mode.TRAIN, True) if node.memory_plan else
                              node.plan.unplanned).by_input_cell for node in nodes], np.uint8)
        return Tables(
            lists=np.array(self.lists, np.intp), buf_arena=self.buf_arena,
            arena_sizes=np.array(self.used, np.int64), buf_ch=self.buf_ch,
            entry_node=entry_node, entry_role=entry_role, entry_buf=entry_buf,
            entry_slots=entry_slots, entry_waiters=entry_waiters, task_node=task_node,
            task_step=task_step, task_layer=task_layer, task_train=task_train,
            task_needs=task_needs, task_msg=task_msg, task_made=task_made,
            task_kind=task_kind, task_args=task_args, node_tasks=node_tasks,
            msg_src=msg_src, msg_buf=msg_buf, msg_rows=msg_rows, msg_dst=msg_dst,
            msg_entry=msg_entry, forwards=forwards, made_input=made_input,
            input_slot=input_slot, active=active,
            number=np.array([float(node.plan.number) for node in nodes], np.float64),
            by_input=by_input, **_parameter_offsets(spec),
            in_channels=spec.model.in_channels, layers=layers, filters=spec.model.filters)

    def _buffers(self) -> None:
        """Every node's field buffers, numbered in node order: which arena each lives in
        (by its channels), its first slot there before the arenas keep home slots only,
        its channels; the slots of each arena."""
        spec, (buffers, _, _) = self.spec, self.counts
        self.buf_arena, self.buf_off, self.buf_ch = (np.zeros(buffers, np.int64)
                                                     for _ in range(3))
        self.used = [0, 0]  # slots of each arena
        for n, node in enumerate(self.nodes):
            for b, (slots, channels) in enumerate(node.plan.buffer_shapes):
                g = self.node_buffer[n] + b
                arena = 0 if channels == spec.model.in_channels else 1
                if arena and channels != spec.model.filters:
                    raise ValueError(f"a field of {channels} channels: the compiled "
                                     f"dispatch keeps the inputs' and the filters'")
                self.buf_arena[g], self.buf_off[g], self.buf_ch[g] = \
                    arena, self.used[arena], channels
                self.used[arena] += slots

    def message(self, n: int, kind: Kind, dst: Cell, layer: int, phase: int,
                buffer: int = NONE, rows=None) -> int:
        """A message node `n` sends (items: `rows` of its `buffer`), numbered."""
        cell = self.nodes[n].cell
        if dst == EDGE:
            target, entry = NONE, NONE
        else:
            target, entry = self.index[dst], self.entry_of(dst, kind, layer, phase, cell)
        self.sent.append(_Sent(n, buffer, None if rows is None else _slot_array(rows),
                               target, entry))
        self.keys.append(MessageKey(cell, dst, kind, layer, phase))
        return len(self.sent) - 1

    def _homes(self, received: dict[int, np.ndarray], entry_buf: np.ndarray) -> None:
        """Where each slot's value lives (`home`): a received item in its sender's slot
        (a relayed one in the slot it was first made in), an own one in its own; the
        arenas then keep the home slots alone, numbered in order (a quarter of the
        slots, and of the memory a wave sweeps)."""
        buf_arena, buf_off = self.buf_arena, self.buf_off
        self.home = [np.arange(size, dtype=np.int64) for size in self.used]
        for m in self.sent:
            if m.rows is not None and m.dst != NONE:
                self.home[buf_arena[m.buffer]][buf_off[entry_buf[m.entry]] +
                                               received[m.entry]] = buf_off[m.buffer] + m.rows
        for k, home in enumerate(self.home):  # follow relays to the first slot
            while not np.array_equal(jumped := home[home], home):  # (pointer jumping)
                home[:] = jumped
            kept, self.home[k] = np.unique(home, return_inverse=True)
            self.used[k] = len(kept)


# ---------------------------------------------------------------- checked before run
# The loop runs without bounds checks (a checked loop is several times slower), so every
# number of the tables that the loop uses to index an array is checked once, when the
# tables are built, against the size of what it indexes: a table laid out wrong, or
# tampered with, is refused in one line rather than read past its arrays. Every integer
# field of `Tables` is declared here as an index (`INDEXES`: what its numbers count) or
# as a value (`VALUES`); tests/test_compiled_tables.py holds each field to one of the two
# and tampers every index in turn. What each step reads of its operands (which arena,
# one slot or a list, lists walked in pairs) is the executor's (`OPERAND_KINDS`,
# `PAIRED`: nodes/execute.py).


class TablesError(MeshdlError, ValueError):
    """Compiled tables that would make the loop index outside its arrays."""


class Index(NamedTuple):
    """What the numbers of an index field count (`_counts`): nodes, tasks, messages,
    entries, buffers, arenas, layers, kinds (of operand), inputs (home slots of the
    INPUTS arena), params (offsets into the PARAMS vector), slots (of the arena of the
    buffer `buffer` names, aligned with the field) or operands (the home slots, taps or
    nodes an operand lists, by its kind). `listed`: the field holds ranges [start, end)
    of `lists`, whose numbers are the ones counted; `span`: ranges of the counted numbers
    themselves. `none`: NONE (nothing there) is allowed; a step that needs the thing
    checks it is there."""

    of: str
    listed: bool = False
    span: bool = False
    none: bool = False
    buffer: Callable[[Tables], np.ndarray] | None = None


def _field(name: str) -> Callable[[Tables], np.ndarray]:
    return lambda tb: getattr(tb, name)


INDEXES: dict[str, Index] = {
    "lists": Index("lists"),  # its numbers: checked as those of the ranges that list them
    "buf_arena": Index("arenas"),
    "entry_node": Index("nodes"),
    "entry_buf": Index("buffers", none=True),
    "entry_slots": Index("slots", listed=True, buffer=_field("entry_buf")),
    "entry_waiters": Index("tasks", listed=True),
    "task_node": Index("nodes"),
    "task_layer": Index("layers"),
    "task_msg": Index("messages", none=True),
    "task_made": Index("tasks", listed=True),
    "task_kind": Index("kinds", none=True),  # (before the operands it says how to read)
    "task_args": Index("operands", listed=True),
    "node_tasks": Index("tasks", span=True),
    "msg_src": Index("nodes"),
    "msg_buf": Index("buffers", none=True),
    "msg_rows": Index("slots", listed=True, buffer=_field("msg_buf")),
    "msg_dst": Index("nodes", none=True),  # NONE: the edge
    "msg_entry": Index("entries", none=True),
    "forwards": Index("messages", listed=True),
    "made_input": Index("tasks", listed=True),
    "input_slot": Index("inputs"),
    "w_off": Index("params"),  # (each with its layer's w_shape: the whole weight)
    "b_off": Index("params"),  # (with b_len)
    "p_off": Index("params", none=True),  # (with filters x cells: the table)
    "mean_off": Index("params"),  # (with in_channels)
    "std_off": Index("params"),
}
# Numbers that index nothing: sizes, counts, flags, codes (`task_step`: checked as
# codes below, and the executor refuses an unknown one). (`number` is a float.)
VALUES = frozenset({"arena_sizes", "buf_ch", "entry_role", "task_step", "task_train",
                    "task_needs", "active", "by_input", "w_shape", "b_len",
                    "in_channels", "layers", "filters", "conv_size", "params_size",
                    "cells", "grad_size"})
LOWEST_LAYER = {CONV: 1, WEIGHT_GRAD: 1, INPUT_GRAD: 2}  # else 0


REFUSED = "compiled tables refused: "


def _refuse(field: str, at, value: int, bound: str) -> TablesError:
    """`field`: of `Tables`, or named with its owner (`Program.args`)."""
    where = ", ".join(str(int(i)) for i in np.atleast_1d(at))
    name = field if "." in field else f"Tables.{field}"
    return TablesError(f"{REFUSED}{name}[{where}] = {int(value)}, not {bound}")


def _counts(tb: Tables) -> dict[str, int]:
    """How many there are of what each kind of index counts."""
    return {"nodes": tb.nodes, "tasks": len(tb.task_node), "messages": len(tb.msg_src),
            "entries": len(tb.entry_node), "buffers": len(tb.buf_arena),
            "arenas": len(tb.arena_sizes), "layers": tb.layers + 1, "kinds": 4,
            "inputs": int(tb.arena_sizes[INPUTS]) if len(tb.arena_sizes) else 0,
            "params": tb.params_size}


def _taps(tb: Tables) -> int:
    """Kernel taps of the smallest kernel: what a tap list may index."""
    return int(tb.w_shape[1:, 2].min()) if tb.layers else 0


def _within(field: str, values: np.ndarray, bound, what: str, none: bool) -> None:
    """Every number of `values` (positions of `field`) is in [0, bound) (bound: one
    number, or one per position), or NONE where allowed."""
    bound = np.broadcast_to(np.asarray(bound, np.int64), values.shape)
    bad = ((values < 0) | (values >= bound)) & ~(none & (values == NONE))
    if bad.any():
        at = np.argwhere(bad)[0] if values.ndim else ()
        b = bound[tuple(at)] if values.ndim else bound
        allowed = " or NONE" if none else ""
        raise _refuse(field, at, values[tuple(at)] if values.ndim else values,
                      f"one of the {int(b)} {what}{allowed}")


def _slot_bounds(tb: Tables, index: Index, shape: tuple[int, ...]) -> np.ndarray:
    """Per position of a slot field, the home slots of its buffer's arena (0: no
    buffer, so no slot)."""
    buffers = np.broadcast_to(index.buffer(tb), shape)
    sizes = tb.arena_sizes[np.clip(tb.buf_arena[np.clip(buffers, 0, None)], 0, None)]
    return np.where(buffers == NONE, 0, sizes)


def _operand_bounds(tb: Tables) -> np.ndarray:
    """Per operand of a task, what its list's numbers may reach: the home slots of its
    arena, the taps of a kernel, the nodes (0: NONE, no list)."""
    sizes = np.zeros(4, np.int64)
    sizes[:len(tb.arena_sizes)] = tb.arena_sizes[:2]
    sizes[TAPS], sizes[CHILDREN] = _taps(tb), tb.nodes
    kinds = tb.task_kind
    return np.where((kinds >= 0) & (kinds < 4), sizes[np.clip(kinds, 0, 3)], 0)


def _ranges(field: str, spans: np.ndarray, size: int, what: str) -> None:
    """Every range [start, end) of `field` lies in [0, size]."""
    starts, ends = spans[..., 0], spans[..., 1]
    for bad, value in (((starts < 0) | (starts > ends), starts), (ends > size, ends)):
        if bad.any():
            at = np.argwhere(bad)[0]
            raise _refuse(field, at, value[tuple(at)],
                          f"a range [start, end) of the {size} {what}")


def _listed(tb: Tables, field: str, index: Index, counts: dict[str, int]) -> None:
    """The numbers a range field lists in `lists` count what it indexes."""
    spans = getattr(tb, field)
    _ranges(field, spans, len(tb.lists), "numbers of the lists")
    starts, lengths = spans[..., 0].ravel(), (spans[..., 1] - spans[..., 0]).ravel()
    owner = np.repeat(np.arange(len(starts)), lengths)  # each listed number's range
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    where = starts[owner] + np.arange(len(owner)) - first  # its place in the lists
    if index.of == "slots":
        bound = _slot_bounds(tb, index, spans.shape[:-1]).ravel()[owner]
    elif index.of == "operands":
        bound = _operand_bounds(tb).ravel()[owner]
    else:
        bound = counts[index.of]
    values = tb.lists[where]
    bad = (values < 0) | (values >= bound)
    if bad.any():
        i = int(np.argmax(bad))
        at = np.unravel_index(owner[i], spans.shape[:-1])
        b = bound[i] if np.ndim(bound) else bound
        raise _refuse("lists", where[i], values[i],
                      f"one of the {int(b)} {index.of} (listed by Tables.{field}"
                      f"[{', '.join(str(int(a)) for a in at)}])")


def validate(tb: Tables) -> None:
    """Refuse (`TablesError`, one line: the field, the position, the bound) tables the
    loop would index outside its arrays with: every index field of `INDEXES` against
    the size of what it indexes, every step code known, each task's operands what its
    step reads (`_check_steps`), and each message sent by one sender (the loop's queues
    hold each message once)."""
    counts = _counts(tb)
    for field, index in INDEXES.items():
        if field == "lists":
            continue  # (checked through the fields that list its numbers)
        values = np.asarray(getattr(tb, field))
        if index.listed:
            _listed(tb, field, index, counts)
        elif index.span:
            _ranges(field, values, counts[index.of], index.of)
        elif index.of == "slots":
            _within(field, values, _slot_bounds(tb, index, values.shape), "home slots of "
                    "its buffer's arena", index.none)
        elif index.of != "params":
            _within(field, values, counts[index.of], index.of, index.none)
    if tb.task_kind.shape != (len(tb.task_node), OPERANDS) or \
            tb.task_args.shape != (len(tb.task_node), OPERANDS, 2):
        raise TablesError(f"compiled tables refused: Tables.task_kind and task_args have "
                          f"shapes {tb.task_kind.shape}, {tb.task_args.shape}, not "
                          f"({len(tb.task_node)}, {OPERANDS}[, 2])")
    _check_parameters(tb)
    _check_steps(tb)
    senders = np.concatenate([tb.task_msg[tb.task_msg != NONE]] + [
        tb.lists[s:e] for s, e in tb.forwards])
    if senders.size and np.bincount(senders).max() > 1:
        m = int(np.argmax(np.bincount(senders)))
        raise TablesError(f"compiled tables refused: message {m} has more than one "
                          f"sender (Tables.task_msg, Tables.forwards)")


def _check_parameters(tb: Tables) -> None:
    """Each conv layer's weight and bias, and the normalization, inside the PARAMS
    vector, and the layers' inside a node's gradient vector (conv_size) too."""
    for layer in range(1, tb.layers + 1):
        # (its kernel's shape bounds the kernels' loops over the arenas' channels)
        shape = (tb.filters, tb.in_channels if layer == 1 else tb.filters)
        if tuple(tb.w_shape[layer, :2]) != shape or tb.b_len[layer] != tb.filters:
            raise _refuse("w_shape", layer, tb.w_shape[layer, 0],
                          f"a kernel of shape {(*shape, int(tb.w_shape[layer, 2]))} "
                          f"with {tb.filters} biases")
        weight = int(np.prod(tb.w_shape[layer]))
        for field, start, size in (("w_off", tb.w_off[layer], weight),
                                   ("b_off", tb.b_off[layer], tb.b_len[layer])):
            if start < 0 or start + size > tb.conv_size:
                raise _refuse(field, layer, start, f"the start of {int(size)} values "
                              f"within the {tb.conv_size} conv parameters")
    table = tb.filters * tb.cells
    for layer in range(tb.layers + 1):
        start = tb.p_off[layer]
        if start != NONE and (layer != tb.layers or start < 0 or
                              start + table > tb.params_size):
            raise _refuse("p_off", layer, start, f"the start of the {table} values of PARAMS "
                          "(its position bias) at the last layer, or NONE")
    tables = int(np.count_nonzero(tb.p_off != NONE))
    if tb.grad_size != tb.conv_size + tables * table:
        raise _refuse("grad_size", (), tb.grad_size, f"the {tb.conv_size} conv parameters' "
                      f"gradients and {tables} position bias tables' of {table}")
    for field in ("mean_off", "std_off"):
        start = getattr(tb, field)
        if start < 0 or start + tb.in_channels > tb.params_size:
            raise _refuse(field, (), start, f"the start of {tb.in_channels} values within "
                          f"the {tb.params_size} of PARAMS")


def _check_steps(tb: Tables) -> None:
    """Every task's step code is known, its layer one the step may run at, each operand
    it reads of the kind the step reads (an arena of the channels it expects, taps,
    children; one slot where it reads one), the lists it walks in pairs as long as each
    other, and its message there where it sends one."""
    codes = np.array([SEND, *sorted(OPERAND_KINDS)], np.int64)
    unknown = ~np.isin(tb.task_step, codes)
    if unknown.any():
        t = int(np.argmax(unknown))
        raise _refuse("task_step", t, tb.task_step[t],
                      f"a step code ({', '.join(map(str, codes))})")
    channels = np.array([tb.in_channels, tb.filters, -1, -1])  # of each kind's values
    lengths = tb.task_args[..., 1] - tb.task_args[..., 0]
    for code in (SEND, REDUCE):  # they send: their message is there
        tasks = np.flatnonzero((tb.task_step == code) & (tb.task_msg == NONE))
        if tasks.size:
            raise TablesError(f"compiled tables refused: task {int(tasks[0])} (step code "
                              f"{code}) sends a message, and its Tables.task_msg is NONE")
    for code, operands in OPERAND_KINDS.items():
        tasks = np.flatnonzero(tb.task_step == code)
        if not tasks.size:  # (a node's program runs a few of the steps)
            continue
        layer = tb.task_layer[tasks]
        low = tasks[layer < LOWEST_LAYER.get(code, 0)]
        if low.size:
            raise _refuse("task_layer", low[0], tb.task_layer[low[0]],
                          f"a layer from {LOWEST_LAYER.get(code, 0)} (step code {code})")
        for k, (what, one) in enumerate(operands):
            read = tasks
            if code == WEIGHT_GRAD and k in (3, 4):  # by input cell, above layer 1 only
                read = tasks[layer > 1]
            kinds = tb.task_kind[read, k]
            if what[0] in ("a", "f"):
                at = tb.layers if what[0] == "a" and what[1] == "top" else \
                    tb.task_layer[read] + what[1] if what[0] == "a" else None
                want = np.full(read.size, tb.filters) if at is None else \
                    np.where(np.asarray(at) == 0, tb.in_channels, tb.filters)
                bad = (kinds < 0) | (kinds > FEATURES)
                bad |= channels[np.clip(kinds, 0, 3)] != want
                expected = "an arena of the channels it reads"
            else:
                bad = kinds != (TAPS if what[0] == "taps" else CHILDREN)
                expected = f"{TAPS if what[0] == 'taps' else CHILDREN} ({what[0]})"
            if bad.any():
                t = int(read[np.argmax(bad)])
                raise _refuse("task_kind", (t, k), tb.task_kind[t, k],
                              f"{expected} (step code {code}, operand {k})")
            if one and (lengths[read, k] != 1).any():
                t = int(read[np.argmax(lengths[read, k] != 1)])
                raise _refuse("task_args", (t, k, 1), tb.task_args[t, k, 1],
                              f"the end of a range of one slot (step code {code}, "
                              f"operand {k})")
        for first, second in PAIRED.get(code, ()):
            read = tasks[tb.task_layer[tasks] > 1] if code == WEIGHT_GRAD and first == 3 \
                else tasks
            walked, taps = lengths[read, first], lengths[read, second]
            if (walked > taps).any():
                t = int(read[np.argmax(walked > taps)])
                raise _refuse("task_args", (t, first, 1), tb.task_args[t, first, 1],
                              f"the end of a list as long as operand {second}'s "
                              f"({int(lengths[t, second])}, step code {code})")


# A node machine's program is checked by the same code before its first task runs: read
# as the tables of a mesh of that node alone (`program_tables`), every index the machine's
# executor reads (operands' lists, taps, task numbers, the layer, the layout's offsets) is
# held by `validate` to what it indexes. Checked first, and only here, is what those
# tables cannot say: that each list of slots lies in its own buffer (the machine hands
# the executor a buffer an operand, where the loop hands it a whole arena), and each
# child a REDUCE lists one of the node's.


# Digests of the programs that passed `validate_program`, most recent last: nodes with
# the same neighbourhood have the same program (92 of a 17 x 25 mesh's 425 differ), and
# checking one takes milliseconds (at 60 x 60, 21 of a live run's 72 s before this
# memo). A program whose digest is here is the same numbers, so the same verdict. At
# most CHECKED_KEPT of them are kept.
_CHECKED: OrderedDict[bytes, None] = OrderedDict()
CHECKED_KEPT = 4096


def validate_program(plan: NodePlan, spec: MeshSpec, cell: Cell) -> None:
    """Refuse (`TablesError`, one line) a node's program (`NodePlan.program`) its
    machine would index outside its buffers, lists or parameters with. Each plan once,
    as its machine starts its first wave of it (`NodeMachine._new_wave`), before any
    task of it runs; a program with the numbers of one already passed is not read
    again (`program_digest`)."""
    if not len(plan.program.step):
        return  # a cell the mesh leaves out: no tasks, no buffers
    children = len(spec.topology.children.get(cell, []))
    digest = program_digest(plan, spec, children)
    if digest in _CHECKED:
        _CHECKED.move_to_end(digest)
        return
    try:
        validate(program_tables(plan, spec, children))
    except TablesError as refused:
        raise TablesError(f"program of cell {cell} refused (read as one node's tables): "
                          f"{str(refused).removeprefix(REFUSED)}") from None
    _CHECKED[digest] = None
    if len(_CHECKED) > CHECKED_KEPT:
        _CHECKED.popitem(last=False)


def program_digest(plan: NodePlan, spec: MeshSpec, children: int) -> bytes:
    """A digest (BLAKE2b, 16 bytes) of every number `program_tables` reads: the
    program's arrays (dtype and shape with their bytes), its buffers' shapes, its inbox
    entries' roles, buffers, slots and waiters, the node's children and the mesh's
    parameter layout."""
    digest = hashlib.blake2b(digest_size=16)
    hash_arrays(digest, plan.program)
    model = spec.model
    # A position bias makes the node's number one of the numbers read (its column).
    own = plan.number if np.any(plan.program.layout[:, P_OFF] != NONE) else None
    digest.update(repr((plan.buffer_shapes, children, spec.params_size, model.conv_layers,
                        model.in_channels, model.filters, own,
                        model.rows * model.cols)).encode())
    for expect in plan.expected:
        digest.update(repr((int(expect.role), expect.buffer, expect.waiters)).encode())
        slots = expect.slots
        if isinstance(slots, slice):  # (slice(0) where an entry fills no buffer)
            digest.update(repr((slots.start, slots.stop, slots.step)).encode())
        else:
            hash_arrays(digest, [np.asarray(slots)])
    hash_arrays(digest, map(np.asarray, _parameter_offsets(spec).values()))
    return digest.digest()


def program_tables(plan: NodePlan, spec: MeshSpec, children: int) -> Tables:
    """One node's program as the tables of a mesh of that node alone, numbered as the
    program numbers them (tasks, buffers, inbox entries; its `lists` first, at their own
    places): its buffers end to end in the arena of their channels (slot s of buffer b
    at `offset[b] + s`), each send and REDUCE a message to the edge, its tree children
    nodes 0, 1, ... as a REDUCE lists them and itself the node after, and the
    parameters' offsets those of the program's `layout`, which its executor reads."""
    program, shapes, layers = plan.program, plan.buffer_shapes, spec.model.conv_layers
    tasks, entries, nodes, me = len(program.step), len(plan.expected), children + 1, children
    args, buffers, size = program.args, len(shapes), len(program.lists)
    # What must hold before the program can be read as tables at all.
    named = np.where(np.isin(args[..., 0], (TAP_LIST, CHILD_LIST)), NONE, args[..., 0])
    _within("Program.args", named, buffers, "buffers of the node", True)
    for field, spans in (("args", args[..., 1:]), ("made", program.made),
                         ("started", program.started[None])):
        _ranges(f"Program.{field}", spans, size, "numbers of the lists")
    _within("Program.kept", program.kept, layers + 1, "layers", True)
    _within("Program.layout", program.layout[:, A_SCALE], spec.params_size,
            "values of PARAMS (its activation scale)", True)
    # A position bias: the node reads value f of a column at P_OFF + f x P_CELLS + the
    # column (its own number, or under a mirror another cell's: `Wave.columns`, each
    # below the cells), for each of the layer's filters: its stride the grid's cells
    # (here), the whole table inside PARAMS (`_check_parameters`, Tables.p_off).
    p_off, p_cells = program.layout[:, P_OFF], program.layout[:, P_CELLS]
    cells = spec.model.rows * spec.model.cols
    _within("Program.layout", np.where(p_off == NONE, NONE, p_cells), cells + 1,
            "cells of the grid (its position bias's stride)", True)
    if plan.number >= cells or np.any((p_off != NONE) & (p_cells != cells)):
        raise _refuse("Program.layout", (), plan.number,
                      f"a cell of the {cells} whose position bias has a column each")
    _within("Program.input", program.input[:1], buffers, "buffers of the node", False)
    items = [e for e, expect in enumerate(plan.expected) if expect.role == Role.ITEMS]
    entry_buf = np.full(entries, NONE, np.int64)
    entry_buf[items] = [plan.expected[e].buffer for e in items]
    _within("Expect.buffer", entry_buf, buffers, "buffers of the node", True)
    # Each number an operand lists: a slot inside its buffer, a child of the node; and
    # each slot an inbox entry fills, and the input's, inside theirs.
    slots = np.array([n for n, _ in shapes], np.int64)
    arena = np.array([0 if c == spec.model.in_channels else 1 for _, c in shapes], np.int64)
    offset = np.zeros(buffers, np.int64)
    for k in (0, 1):
        offset[arena == k] = np.cumsum(slots[arena == k]) - slots[arena == k]
    own = args[..., 0] >= 0
    for reads, limit, what in ((own, slots, "slots of the buffer its operand reads"),
                               (args[..., 0] == CHILD_LIST, None, "children of the node")):
        at = _positions(args[..., 1:][reads])
        listed, bound = np.zeros(size, np.int64), np.ones(size, np.int64)  # (0 < 1: others)
        listed[at] = program.lists[at]
        bound[at] = children if limit is None else np.repeat(
            limit[args[..., 0][reads]], (args[..., 2] - args[..., 1])[reads])
        _within("Program.lists", listed, bound, what, False)
    a0, first = (int(v) for v in program.input)
    _within("Program.input", np.array([first]), slots[a0], f"slots of buffer {a0}", False)
    filled = [_slot_array(plan.expected[e].slots) for e in items]
    _within("Expect.slots", np.concatenate([np.zeros(0, np.int64), *filled]),
            np.repeat(slots[entry_buf[items]], [len(f) for f in filled]),
            "slots of its buffer (the inbox entries' slots, in order)", False)
    # The tables: the program's lists, then the same with each operand's slots at their
    # arena places, then the inbox entries' waiters and slots.
    shift = np.zeros(size, np.int64)
    shift[_positions(args[..., 1:][own])] = np.repeat(
        offset[args[..., 0][own]], (args[..., 2] - args[..., 1])[own])
    task_args = np.array(args[..., 1:])
    task_args[own] += size
    task_kind = np.select([own, args[..., 0] == TAP_LIST, args[..., 0] == CHILD_LIST],
                          [arena[np.where(own, args[..., 0], 0)], TAPS, CHILDREN], NONE)
    waiters = [np.array(expect.waiters, np.int64) for expect in plan.expected]
    homes = [offset[entry_buf[e]] + f for e, f in zip(items, filled, strict=True)]
    ends = 2 * size + np.cumsum([len(w) for w in waiters + homes], dtype=np.int64)
    spans = np.column_stack([ends - [len(w) for w in waiters + homes], ends])
    entry_slots = np.zeros((entries, 2), np.int64)
    entry_slots[items] = spans[entries:]
    sends = np.flatnonzero((program.step == SEND) | (program.step == REDUCE))
    task_msg = np.full(tasks, NONE, np.int64)
    task_msg[sends] = np.arange(len(sends))
    msg_buf = np.where(program.step[sends] == SEND, args[sends, 0, 0], NONE)
    layout = program.layout
    others = np.zeros((children, 2), np.int64)  # the children: no tasks, no input
    return Tables(
        lists=np.concatenate([program.lists, program.lists + shift, *waiters,
                              *homes]).astype(np.intp),
        buf_arena=arena, arena_sizes=np.array([slots[arena == k].sum() for k in (0, 1)]),
        buf_ch=np.array([c for _, c in shapes], np.int64),
        entry_node=np.full(entries, me, np.int64),
        entry_role=np.array([int(e.role) for e in plan.expected], np.int64),
        entry_buf=entry_buf, entry_slots=entry_slots, entry_waiters=spans[:entries],
        task_node=np.full(tasks, me, np.int64), task_step=program.step,
        task_layer=program.layer, task_train=program.train.astype(np.int64),
        task_needs=program.needs, task_msg=task_msg, task_made=program.made,
        task_kind=task_kind, task_args=task_args,
        node_tasks=np.vstack([others, [(0, tasks)]]),
        msg_src=np.full(len(sends), me, np.int64), msg_buf=msg_buf,
        msg_rows=np.where((msg_buf != NONE)[:, None], task_args[sends, 0], 0),
        msg_dst=np.full(len(sends), NONE, np.int64),
        msg_entry=np.full(len(sends), NONE, np.int64), forwards=np.zeros((nodes, 2), np.int64),
        made_input=np.vstack([others, program.started[None]]),
        input_slot=np.array([0] * children + [offset[a0] + first], np.int64),
        active=np.zeros((nodes, 2), np.int64), number=np.full(nodes, float(plan.number)),
        by_input=np.zeros(nodes, np.uint8),
        **{**_parameter_offsets(spec), "w_off": layout[:, W_OFF],
           "w_shape": layout[:, W_FILTERS:W_TAPS + 1], "b_off": layout[:, B_OFF],
           "b_len": layout[:, B_LEN], "p_off": layout[:, P_OFF]},
        in_channels=spec.model.in_channels, layers=layers, filters=spec.model.filters)


def _positions(spans: np.ndarray) -> np.ndarray:
    """Every place [start, end) of `spans` (n, 2) covers, in order."""
    lengths = spans[:, 1] - spans[:, 0]
    return np.repeat(spans[:, 0] - np.cumsum(lengths) + lengths, lengths) + \
        np.arange(lengths.sum())


def _parameter_offsets(spec: MeshSpec) -> dict[str, np.ndarray | int]:
    """Where each conv layer's weight (and its kernels' shape) and bias, and the
    normalization, sit in a PARAMS vector (`ParamsLayout`), as `Tables` fields."""
    layout, layers = spec.params_layout, spec.model.conv_layers
    w_off, b_off, b_len = (np.zeros(layers + 1, np.int64) for _ in range(3))
    w_shape = np.ones((layers + 1, 3), np.int64)
    for layer, where in layout.layers.items():
        w_off[layer], w_shape[layer] = where.weight.start, where.kernel_shape
        b_off[layer], b_len[layer] = where.bias.start, where.bias.stop - where.bias.start
    p_off = np.full(layers + 1, NONE, np.int64)
    if layout.position.stop > layout.position.start:  # the last layer's
        p_off[layers] = layout.position.start
    return {"w_off": w_off, "w_shape": w_shape, "b_off": b_off, "b_len": b_len,
            "p_off": p_off, "cells": spec.model.rows * spec.model.cols,
            "mean_off": layout.mean.start, "std_off": layout.std.start,
            "conv_size": layout.conv_size, "grad_size": layout.reduce_size,
            "params_size": layout.size}


def _slot_array(slots) -> np.ndarray:
    """Slots (a slice, an array, a number) as an int64 array."""
    if isinstance(slots, slice):
        return np.arange(slots.start, slots.stop, dtype=np.int64)
    return np.atleast_1d(np.asarray(slots, np.int64))


class State(NamedTuple):
    """One wave's progress in the loop (reset by `reset`)."""

    missing: np.ndarray  # per task: sources still to come
    task_round: np.ndarray  # per task: the round it ran in, -1 not (yet)
    control: np.ndarray  # per node: PARAMS and BATCH received (2: started)
    tasks_done: np.ndarray  # per node
    finished: np.ndarray  # per node: the round its last task ran, -1 not yet
    failed: np.ndarray  # per node: failout, acting dead in this wave
    sent: np.ndarray  # per message: sent in this wave
    cur: np.ndarray  # arrivals of this round: message numbers, or -1 - entry (edge's)
    nxt: np.ndarray  # ... of the next
    to_edge: np.ndarray  # messages to the edge sent in the last round run
    stack: np.ndarray  # tasks ready to run
    counts: np.ndarray  # by ARRIVALS, NEXT, TO_EDGE, READY, SENT_COUNT

    @classmethod
    def of(cls, tables: Tables) -> State:
        tasks, nodes, messages = len(tables.task_node), tables.nodes, len(tables.msg_src)
        queue = messages + 2 * len(tables.entry_node) + 8
        return cls(np.zeros(tasks, np.int64), np.zeros(tasks, np.int64),
                   np.zeros(nodes, np.int64), np.zeros(nodes, np.int64),
                   np.zeros(nodes, np.int64), np.zeros(nodes, np.uint8),
                   np.zeros(messages, np.uint8), np.zeros(queue, np.int64),
                   np.zeros(queue, np.int64), np.zeros(messages + 8, np.int64),
                   np.zeros(tasks + 8, np.int64), np.zeros(5, np.int64))

    def reset(self, tables: Tables, failed: np.ndarray) -> None:
        self.missing[:] = tables.task_needs
        self.task_round[:] = -1
        self.control[:] = 0
        self.tasks_done[:] = 0
        self.finished[:] = -1
        self.failed[:] = failed
        self.sent[:] = 0
        self.counts[:] = 0


class WaveArrays(NamedTuple):
    """What one wave computes with: its two arenas of buffers (float32, (slots, channels,
    batch): of the input's channels, of the filters'), the winners of pooling (N,
    filters, batch), every node's gradient vector (N, `Tables.grad_size`), the PARAMS
    vector, this split's readings (N, channels, samples), the samples, whether it
    trains, and with a position bias the column of its table each node reads for each
    map (N, batch; `NodeMachine.position_columns`; (N, 0) without one)."""

    inputs: np.ndarray
    features: np.ndarray
    winners: np.ndarray
    grads: np.ndarray
    params: np.ndarray
    readings: np.ndarray
    indices: np.ndarray
    batch: int
    training: bool
    columns: np.ndarray


_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}

# The loop is one function over local arrays, called once per exchange with the edge:
# a Numba call that takes the tables as a tuple counts a reference up and down for each
# of its ~60 arrays, which cost more than the work itself when it was a call per
# message; the small helper below takes the few arrays it touches and is inlined.


@njit(**_JIT, inline="always")
def _enqueue(m: int, msg_dst: np.ndarray, sent: np.ndarray, nxt: np.ndarray,
             to_edge: np.ndarray, counts: np.ndarray) -> None:
    """Message `m` sent: it arrives in the next round (the edge's: handed out)."""
    sent[m] = 1
    counts[SENT_COUNT] += 1
    if msg_dst[m] == NONE:
        to_edge[counts[TO_EDGE]] = m
        counts[TO_EDGE] += 1
    else:
        nxt[counts[NEXT]] = m
        counts[NEXT] += 1


@njit(**_JIT)
def run_rounds(tb: Tables, st: State, w: WaveArrays, now: int, limit: int,
               pending: np.ndarray) -> int:
    """Deliver rounds from `now` on, the arrivals in `st.cur` at now + 1, and so on: until
    a round sends the edge something (`st.to_edge`), nothing is left to deliver, or the
    round `limit` is passed. `pending`: what the edge sent in round now + 1, arriving in
    the round after. Returns the last round delivered (`now` if none).

    An arrival is a message of the tables or, as -1 - entry, what the edge sent. Nothing
    is copied: a receiver's kernels read an item where its sender made it (`Tables`'
    slots are home slots), which no one writes again in the wave. An arrival counts down
    the tasks waiting for its inbox entry (`NodeMachine._arrived`); PARAMS and BATCH both
    in start the node's wave (`_start_wave`); then every ready task runs, as
    `_run_ready` runs them: a send is queued for the next round, a computation runs in
    the executor (`execute.run_task`) on its operands' arenas and lists."""
    lists = tb.lists
    entry_node, entry_role, entry_waiters = tb.entry_node, tb.entry_role, tb.entry_waiters
    task_node, task_step, task_layer = tb.task_node, tb.task_step, tb.task_layer
    task_train, task_msg, task_made, node_tasks = tb.task_train, tb.task_msg, \
        tb.task_made, tb.node_tasks
    task_kind, task_args = tb.task_kind, tb.task_args
    msg_dst, msg_entry = tb.msg_dst, tb.msg_entry
    forwards, made_input, input_slot, active = tb.forwards, tb.made_input, tb.input_slot, \
        tb.active
    number, by_input = tb.number, tb.by_input
    missing, task_round, control = st.missing, st.task_round, st.control
    tasks_done, finished, failed, sent = st.tasks_done, st.finished, st.failed, st.sent
    cur, nxt, to_edge, stack, counts = st.cur, st.nxt, st.to_edge, st.stack, st.counts
    inputs, features, winners, grads, params = w.inputs, w.features, w.winners, w.grads, \
        w.params
    readings, indices, training, columns = w.readings, w.indices, w.training, w.columns
    channels = tb.in_channels
    mean = params[tb.mean_off:tb.mean_off + channels]
    std = params[tb.std_off:tb.std_off + channels]
    layout = np.empty((tb.layers + 1, 9), np.int64)  # the executor's (`layout_rows`)
    for layer in range(tb.layers + 1):
        layout[layer, 0] = tb.w_off[layer]
        layout[layer, 1:4] = tb.w_shape[layer]
        layout[layer, 4], layout[layer, 5] = tb.b_off[layer], tb.b_len[layer]
        layout[layer, 6] = -1  # not quantized: int8-static waves run on the machines
        layout[layer, 7], layout[layer, 8] = tb.p_off[layer], tb.cells
    which = 0 if training else 1  # `active`'s column

    arenas = (inputs, features)  # by INPUTS, FEATURES: what an operand's kind picks

    # Sources that came, as ranges of waiting tasks (`lists`), still to count down.
    spans = np.empty((2, 2), np.int64)  # (one at a time: they go before tasks)
    counts[TO_EDGE] = 0
    first = True
    while (counts[ARRIVALS] > 0 or (first and pending.size > 0)) and now < limit:
        now += 1
        for i in range(counts[ARRIVALS]):
            item = cur[i]
            e = msg_entry[item] if item >= 0 else -1 - item
            role, n = entry_role[e], entry_node[e]
            if role in (PARAMETERS, SAMPLES):
                control[n] += 1
                if control[n] != 2:  # (each once: the driver drops repeats)
                    continue
                # The wave starts: PARAMS and BATCH on to the tree children, this cell's
                # normalized readings (zeros, failed out), every task already able to run.
                for k in range(forwards[n, 0], forwards[n, 1]):
                    _enqueue(lists[k], msg_dst, sent, nxt, to_edge, counts)
                # (0.0: never quantized; int8-static waves run on the machines)
                start_input(readings[n], indices, mean, std, failed[n] != 0, 0.0,
                            inputs[input_slot[n]])
                for t in range(node_tasks[n, 0], node_tasks[n, 1]):
                    if missing[t] == 0:
                        stack[counts[READY]] = t
                        counts[READY] += 1
                spans[0, 0], spans[0, 1] = made_input[n, 0], made_input[n, 1]
            else:
                spans[0, 0], spans[0, 1] = entry_waiters[e, 0], entry_waiters[e, 1]
            n_spans = 1
            # Count down, run what is ready; what a computation makes counts down more.
            while True:
                if n_spans > 0:
                    n_spans -= 1
                    for k in range(spans[n_spans, 0], spans[n_spans, 1]):
                        t = lists[k]
                        missing[t] -= 1
                        if missing[t] == 0 and control[task_node[t]] >= 2:
                            stack[counts[READY]] = t
                            counts[READY] += 1
                    continue
                if counts[READY] == 0:
                    break
                counts[READY] -= 1
                t = stack[counts[READY]]
                if task_train[t] and not training:
                    continue
                n, step = task_node[t], task_step[t]
                task_round[t] = now
                tasks_done[n] += 1
                if tasks_done[n] == active[n, which]:
                    finished[n] = now
                if step == SEND:
                    _enqueue(task_msg[t], msg_dst, sent, nxt, to_edge, counts)
                    continue
                spans[n_spans, 0], spans[n_spans, 1] = task_made[t, 0], task_made[t, 1]
                n_spans += 1
                run_task(step, task_layer[t], arenas, task_kind[t], lists, task_args[t],
                         params, layout, grads, grads, winners, n, number[n], columns[n],
                         failed[n] != 0, by_input[n] != 0)
                if step == REDUCE:  # its sum is a message up the tree
                    _enqueue(task_msg[t], msg_dst, sent, nxt, to_edge, counts)
        if first:
            for item in pending:
                nxt[counts[NEXT]] = item
                counts[NEXT] += 1
            first = False
        cur[:counts[NEXT]] = nxt[:counts[NEXT]]
        counts[ARRIVALS], counts[NEXT] = counts[NEXT], 0
        if counts[TO_EDGE]:
            break
    return now


def warm_up(tables: Tables, state: State) -> None:
    """Compile (or load from Numba's cache) the loop with a mesh's types."""
    empty = np.zeros(0, np.float32)
    wave = WaveArrays(np.zeros((0, 0, 0), np.float32), np.zeros((0, 0, 0), np.float32),
                      np.zeros((0, 0, 0), np.uint8), np.zeros((0, 0), np.float32), empty,
                      np.zeros((0, 0, 0), np.float32), np.zeros(0, np.int32), 0, False,
                      np.zeros((0, 0), np.int64))
    state.counts[:] = 0
    run_rounds(tables, state, wave, 0, 0, np.zeros(0, np.int64))
