"""The sensor node as a sans-I/O state machine: `handle(message, now) -> messages to send`.

A node holds its own readings (one value per sample and input channel) and nothing
else. Per wave it:
  1. takes PARAMS and BATCH from its tree parent and forwards them to its children (or,
     when the edge broadcasts them through a broker, takes them from the edge);
  2. for each conv layer, exchanges halo strips with its one-hop neighbours and computes
     its cell's output as soon as its window is complete;
  3. sends its last conv output towards its pooling block's leader; a leader pools its
     block and the pooled features converge up the BFS tree to the edge;
  4. (training) routes d(loss)/d(pooled) back down to each block's max positions,
     exchanges output gradients for each layer's transposed convolution, computes its
     partial filter gradients and adds its children's on the way up (REDUCE).
Every send and computation is a *task* that needs a list of items (cells' or blocks'
values). Items come from *sources*: a message of the plan (all the items it carries) or
one of the node's own computations. A task waits for its sources and runs when the last
one arrives. Values live in one (slots, channels, batch) array per field (`NodePlan`),
reused from wave to wave. No sockets, clocks or asyncio: transports call `handle`; `now`
only stamps when each stage finished. Bad messages are counted in `stats` and dropped;
they never raise.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from meshdl.messages import (
    ALL,
    EDGE,
    FLOAT32,
    INT32,
    ITEM_BYTES,
    Header,
    Kind,
    Message,
    make,
    newer,
    seal,
)
from meshdl.nodes import compute
from meshdl.nodes.deadlines import (
    SILENT_WAVES,
    Arrivals,
    Deadline,
    Learning,
    Margins,
    Policy,
    Schedule,
)
from meshdl.payloads import BATCH_HEAD, HEALTH_MAX, BatchOrder, PlanTail, health_entries
from meshdl.protocol import Field, MeshSpec, Mode, Send, Split
from meshdl.topology import Cell
from meshdl.work import Work, node_work

Item = tuple[Field, Hashable]
Source = Hashable  # an inbox key (kind, layer, phase, src), or the item a computation makes
Rows = slice | np.ndarray  # buffer slots: a run of them, or any (a send's items)


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

    method: str  # the NodeMachine step: conv, pool, route, dz_top, grad, dinput, reduce
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


class Job(NamedTuple):
    """One task of a node's plan, ready to run: a send, or a computation's method."""

    train_only: bool
    send: SendJob | None
    run: Callable[[Wave, int, list[Message]], None] | None
    layer: int
    stage: str
    work: Work = Work(0)  # a computation's floating-point operations (meshdl/work.py)


class Expect(NamedTuple):
    """A message this node's plan receives, keyed by (kind, layer, phase, source)."""

    role: Role  # how `NodeMachine._accept` takes it
    dst: Cell  # the header's destination: this cell, or ALL for the edge's broadcasts
    rows: int = 0  # ITEMS: items carried, a payload row each ...
    channels: int = 0  # ... of (channels, batch) values
    train_only: bool = False
    buffer: int = -1  # ITEMS: the field buffer its rows go to ...
    slots: Rows = slice(0)  # ... and where in it
    index: int = 0  # its flag in a wave's `seen`
    waiters: tuple[int, ...] = ()  # the tasks waiting for it


GRADIENTS = ("dz", "route", "dpooled")  # fields filled with zeros whatever the policy
# `Wave.seen`: a message came; its deadline passed; it came after its deadline.
RECEIVED, FILLED_IN, LATE = 1, 2, 3

EARLY_PER_SENDER = 64  # messages kept per neighbour until their wave can use them
KEPT_PLANS = 4  # a node's plans of recent meshes (dead cells come back)


ITEMS = Role.ITEMS  # the hot path's comparison, without an attribute lookup
_MODES = tuple(Mode)  # by value, without the enum's lookup


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
        if cell not in topo.members:  # left out of this mesh: nothing to do in it
            self._empty()
            return
        before, after = spec.offsets
        block = topo.block_of(cell)
        leads = topo.leader.get(block) == cell
        members = topo.pool_members(block)
        self.writer: dict[Item, Source] = {}
        received = spec.expects[cell]
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
        orphaned = {(f, c) for f, items in self.orphans.items() for c in items}
        fields: dict[Field, list[Hashable]] = {}
        for f, item in self.writer:
            fields.setdefault(f, []).append(item)
        self.buffers = {f: index for index, f in enumerate(fields)}  # field -> buffer
        self.slots = [{item: slot for slot, item in enumerate(sorted(items))}
                      for items in fields.values()]  # per buffer: item -> slot
        self.buffer_channels = [spec.item_shape(f, 0)[0] for f in fields]

        self.inbox: dict[tuple, Expect] = {
            key: Expect(Role.ITEMS, cell, len(send.items), spec.item_shape(send.field, 0)[0],
                        send.train_only, self.buffers[send.field],
                        self.rows(send.field, send.items))
            for key, send in received.items()}
        control, to = spec.control_source(cell), spec.control_destination or cell
        self.inbox[(Kind.PARAMS, 0, 0, control)] = Expect(Role.PARAMETERS, to)
        self.inbox[(Kind.BATCH, 0, 0, control)] = Expect(Role.SAMPLES, to)
        for child in topo.children[cell]:
            key = (Kind.REDUCE, 0, 0, child)
            self.inbox[key] = Expect(Role.PARTIAL_GRADIENTS, cell, train_only=True)
            self.writer[(("reduce",), child)] = key  # no buffer: REDUCE is a vector

        # (task, needs, train only): computations, then sends, in a fixed order. A
        # computation needs every item its kernel reads, so it runs only once they all
        # exist, in whatever order messages arrive (a message may come early, forged or
        # not: it fills its slot and waits). Own results stand for what they were made
        # from: ("a", layer) of this cell for the window conv `layer` read.
        tasks: list[tuple[Computation | Send, list[Item], bool]] = []
        for layer in range(1, layers + 1):
            needs = [(("a", layer - 1), c) for c in topo.window(cell, before, after)
                     if (("a", layer - 1), c) not in orphaned]
            tasks.append((Computation("conv", layer, f"conv{layer}"), needs, False))
        if leads:
            needs = [(("a", layers), c) for c in members]
            tasks.append((Computation("pool", layers, "pool"), needs, False))
            needs = [(("dpooled",), block), (("pooled",), block)]  # and pool's winners
            tasks.append((Computation("route", layers, "route"), needs, True))
        needs = [(("route",), cell)] if cell in members else []
        needs.append((("a", layers), cell))  # ReLU's mask
        tasks.append((Computation("dz_top", layers, "dz_top"), needs, True))
        for layer in range(layers, 0, -1):
            needs = [(("dz", layer), cell), (("a", layer), cell)]  # the input window
            tasks.append((Computation("grad", layer, f"grad{layer}"), needs, True))
            if layer > 1:
                needs = [(("dz", layer), c) for c in topo.window(cell, after, before)
                         if (("dz", layer), c) not in orphaned]
                needs.append((("a", layer - 1), cell))  # ReLU's mask below
                tasks.append((Computation("dinput", layer, f"dinput{layer}"), needs, True))
        needs = [(("grad", layer), cell) for layer in range(1, layers + 1)]
        needs += [(("reduce",), child) for child in topo.children[cell]]
        tasks.append((Computation("reduce", 0, "reduce"), needs, True))
        for send in spec.sends[cell]:
            tasks.append((send, [(send.field, i) for i in send.items], send.train_only))

        self.tasks = [task for task, _, _ in tasks]
        # A send's values: (buffer, slots) of its items.
        self.send_rows: list[tuple[int, Rows] | None] = [
            (self.buffers[task.field], self.rows(task.field, task.items))
            if isinstance(task, Send) else None for task, _, _ in tasks]
        self.train_only = [train for _, _, train in tasks]
        self.waiters: dict[Source, list[int]] = {}
        self.needs_count: list[int] = []
        for index, (_, needs, _) in enumerate(tasks):
            # An item nobody writes is a computation's marker (("grad", layer), cell).
            sources = dict.fromkeys(self.writer.get(item, item) for item in needs)
            self.needs_count.append(len(sources))
            for source in sources:
                self.waiters.setdefault(source, []).append(index)
        self.inbox = {key: expect._replace(index=index, waiters=self.waiting_for(key))
                      for index, (key, expect) in enumerate(self.inbox.items())}
        self.keys = list(self.inbox)  # by `Expect.index`
        self.expected = list(self.inbox.values())
        # What each message carries (field, items): a best-effort node fills them in
        # when one misses its deadline (nodes/deadlines.py).
        self.carries: list[tuple[Field, tuple[Hashable, ...]]] = [
            (received[key].field, tuple(received[key].items)) if key in received else
            (("reduce",), ()) for key in self.keys]
        # Which task makes each of this node's own items (its own readings are there
        # from the wave's start): a neighbour's value is usable once it is made.
        self.maker: dict[Item, int] = {}
        for index, (task, _, _) in enumerate(tasks):
            if isinstance(task, Computation):
                for item in _made_by(task, cell, block, members):
                    self.maker[item] = index
        self.active = {mode: sum(1 for t in self.train_only if mode == Mode.TRAIN or not t)
                       for mode in Mode}
        self.ready_at_start = [i for i, n in enumerate(self.needs_count) if n == 0]
        # What a sender may have waiting here: two waves' worth of its messages, each at
        # the largest batch (an honest sender is at most one wave ahead).
        self.early_bytes: dict[Cell, int] = {}
        for (_, _, _, src), expect in self.inbox.items():
            values = {Role.ITEMS: expect.rows * expect.channels * spec.max_batch,
                      Role.PARTIAL_GRADIENTS: spec.conv_size,
                      Role.PARAMETERS: spec.params_size,
                      Role.SAMPLES: spec.max_batch + BATCH_HEAD}[expect.role]
            self.early_bytes[src] = self.early_bytes.get(src, 0) + 2 * ITEM_BYTES * values
        self.buffer_shapes = [(len(s), c) for s, c in zip(self.slots, self.buffer_channels,
                                                          strict=True)]

    def _empty(self) -> None:
        """The plan of a cell the mesh leaves out: no messages, no tasks."""
        self.writer, self.buffers, self.slots, self.buffer_channels = {}, {}, [], []
        self.inbox, self.keys, self.expected, self.carries = {}, [], [], []
        self.maker, self.orphans, self.tasks, self.send_rows = {}, {}, [], []
        self.train_only, self.waiters, self.needs_count = [], {}, []
        self.active = dict.fromkeys(Mode, 0)
        self.ready_at_start, self.early_bytes, self.buffer_shapes = [], {}, []

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

    def _write(self, f: Field, items: Iterable[Hashable], writer: Source | None = None
               ) -> None:
        """Record who writes `items` of field `f`: a message (its inbox key), or (None)
        this node's own computations, each known by the item it makes."""
        for item in items:
            if (f, item) in self.writer:  # the plan would write a slot twice in a wave
                raise ValueError(f"item {(f, item)} has two writers")
            self.writer[(f, item)] = (f, item) if writer is None else writer

    def waiting_for(self, source: Source) -> tuple[int, ...]:
        """The tasks that wait for a message (its inbox key) or a computation (the item
        it makes)."""
        return tuple(self.waiters.get(source, ()))

    def slot(self, f: Field, item: Hashable) -> int:
        return self.slots[self.buffers[f]][item]

    def rows(self, f: Field, items: Iterable[Hashable]) -> Rows:
        """The slots of `items` in field `f`'s buffer: a slice when they are a run."""
        slots = [self.slot(f, item) for item in items]
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[0] + len(slots))
        return np.array(slots, np.intp)


class Wave:
    """Everything a node knows about one wave (one step number of one edge session)."""

    def __init__(self, step: int, session: int, plan: NodePlan) -> None:
        self.step = step
        self.session = session
        self.mode: Mode | None = None
        self.training = False
        self.params_vector: np.ndarray | None = None  # PARAMS: conv weights, mean, std
        self.params_payload: np.ndarray | None = None  # all of it (the plan's tail too)
        self.batch_payload: np.ndarray | None = None
        self.batch = 0
        self.buffers: list[np.ndarray] = []  # per field: (slots, channels, batch)
        self.reduce: dict[Cell, np.ndarray] = {}  # children's REDUCE payloads
        self.missing = list(plan.needs_count)  # per task: sources still to come
        self.ready: list[int] = list(plan.ready_at_start)
        self.tasks_done = 0
        self.grad: np.ndarray | None = None  # training: this subtree's conv gradients
        self.weights: dict[int, np.ndarray] = {}  # layer -> (h, c_in, k * k)
        self.biases: dict[int, np.ndarray] = {}  # layer -> (h,)
        self.winners: np.ndarray | None = None  # leader: argmax over its block's cells
        self.seen = bytearray(len(plan.inbox))  # per inbox key: RECEIVED or FILLED_IN
        self.done = bytearray(len(plan.tasks))  # per task: has run
        self.finished_at: dict[str, float] = {}
        # Best effort (nodes/deadlines.py): this wave's deadlines, from when each phase
        # began (as a list by time, and per inbox entry); how far each list has been
        # gone through; messages filled in.
        self.arrivals: Arrivals | None = None
        self.schedule: Schedule | None = None
        self.learnt: dict[int, float] | None = None  # learning: when each message came
        self.after: dict[int, float] = {}
        self.started_at = 0.0
        self.backward_at: float | None = None
        self.next_forward = self.next_backward = 0


class NodeMachine:
    """One cell of the mesh."""

    def __init__(self, spec: MeshSpec, cell: Cell, readings: dict[int, np.ndarray]) -> None:
        """`readings[split]` is (samples, in_channels) float32: this sensor's own log."""
        self.cell = cell
        # Channel-major, as the node's activations are (channels, batch).
        self.readings = {split: np.ascontiguousarray(x.T, np.float32)
                         for split, x in readings.items()}
        self.wave: Wave | None = None
        # Messages that came before their wave could use them, per sender (a bounded
        # queue each: a misbehaving neighbour can only push out its own).
        self.early: dict[Cell, deque[Message]] = {}
        self.stats: Counter[str] = Counter()
        self.seq = 0
        # Best effort (nodes/deadlines.py): None waits for every message (exact);
        # else arrival times per (plan, mode, batch), and what fills in a missed message.
        self.policy: Policy | None = None
        self.arrivals: dict[tuple, Arrivals] = {}
        self.learning: Learning | None = None  # deadlines from a first wave, waited out
        # The mesh may be replanned (dead cells): a later wave's message of a shape this
        # plan does not expect is kept, for the plan its PARAMS will bring.
        self.plans_change = False
        self.last_level: dict[Item, np.ndarray] = {}  # policy "last": (channels,) an item
        # Floating-point operations of every computation run so far: simulated time
        # turns them into CPU time on a device profile (sim/device.py).
        self.flops = 0
        self._plans: dict[tuple, NodePlan] = {}  # by `MeshSpec.plan_key`, a few
        # Dead neighbours (best effort): consecutive waves each gave nothing in, and
        # the report for the edge; saying hello when no PARAMS came for `hello_after`
        # seconds (None: never), as a node that booted or was left out does.
        self.silent: Counter[Cell] = Counter()
        self._suspects: list[Cell] = []
        self._judged = (0, 0)  # the (step, session) of the wave they were found in
        self.hello_after: float | None = None
        self.heard_at = 0.0  # the last PARAMS taken, or the boot
        self._hello_at: float | None = None
        self._adopt(spec)

    def _plan_for(self, spec: MeshSpec) -> NodePlan:
        """This cell's plan in `spec`'s mesh (kept: the mesh may come back to it)."""
        plan = self._plans.get(spec.plan_key)
        if plan is None:
            if len(self._plans) >= KEPT_PLANS:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[spec.plan_key] = NodePlan(spec, self.cell)
        return plan

    def _adopt(self, spec: MeshSpec) -> None:
        """Take `spec`'s plan: who this node hears from and sends to, its buffers, its
        tasks. A cell `spec` leaves out (dead, or cut off) has none: it only waits for
        PARAMS that take it back in."""
        cell = self.cell
        self.spec = spec
        self.mesh_id = spec.mesh_id
        self.layout = spec.params_layout  # where each layer's parameters sit in PARAMS
        self.params_size = self.layout.size
        self.wave = None  # the PARAMS that brought the new plan start a new wave
        self._storage: list[np.ndarray] = []  # the field buffers of the last wave
        topo = spec.topology
        self.plan = plan = self._plan_for(spec)
        self.inbox = plan.inbox
        self.parent = topo.parent.get(cell)
        self.neighbours = set(topo.neighbours(cell)) if cell in topo.members else set()
        self.children = topo.children.get(cell, [])
        self.jobs: list[Job] = []
        self.silent.clear()  # a new plan: who is expected from starts afresh
        self._suspects = []
        if cell not in topo.members:
            return
        layers = spec.model.conv_layers
        before, after = spec.offsets
        forward = _slots(cell, topo.window(cell, before, after), before, spec.model.kernel)
        backward = _slots(cell, topo.window(cell, after, before), after, spec.model.kernel)
        # Buffers and slots the computations read and write. A window lists the cells
        # inside the grid with their taps (flat kernel positions); cells outside the grid
        # are absent, i.e. read 0.
        self.a = [plan.buffers[("a", layer)] for layer in range(layers + 1)]
        self.dz = [-1] + [plan.buffers[("dz", layer)] for layer in range(1, layers + 1)]
        self.own_a = [plan.slot(("a", layer), cell) for layer in range(layers + 1)]
        self.own_dz = [-1] + [plan.slot(("dz", layer), cell) for layer in range(1, layers + 1)]
        self.conv_slots = [np.empty(0, np.intp)] + [
            np.array([plan.slot(("a", layer - 1), c) for c, _ in forward], np.intp)
            for layer in range(1, layers + 1)]
        self.conv_taps = np.array([tap for _, tap in forward], np.int64)
        self.grad_slots = [np.empty(0, np.intp)] * 2 + [
            np.array([plan.slot(("dz", layer), c) for c, _ in backward], np.intp)
            for layer in range(2, layers + 1)]
        self.grad_taps = np.array([tap for _, tap in backward], np.int64)
        self.block = topo.block_of(cell)
        self.block_cells = topo.pool_members(self.block)
        # Per field: the slots of its orphans (`NodePlan.orphans`), filled in per wave.
        self.orphan_rows = {f: np.array([plan.slot(f, c) for c in items], np.intp)
                            for f, items in plan.orphans.items()}
        if topo.leader.get(self.block) == cell:  # pooling, and max routing back
            self.block_slots = np.array([plan.slot(("a", layers), c)
                                         for c in self.block_cells], np.intp)
            self.pooled = plan.buffers[("pooled",)]
            self.pooled_slot = plan.slot(("pooled",), self.block)
            self.dpooled = plan.buffers[("dpooled",)]
            self.dpooled_slot = plan.slot(("dpooled",), self.block)
            self.route_slots = np.array([plan.slot(("route",), c)
                                         for c in self.block_cells], np.intp)
        self.route = plan.buffers[("route",)]
        self.own_route = plan.slot(("route",), cell)
        # The tasks waiting for each of this node's computations.
        self.made_a = [plan.waiting_for((("a", layer), cell)) for layer in range(layers + 1)]
        self.made_dz = [()] + [plan.waiting_for((("dz", layer), cell))
                               for layer in range(1, layers + 1)]
        self.made_grad = [()] + [plan.waiting_for((("grad", layer), cell))
                                 for layer in range(1, layers + 1)]
        self.made_pooled = plan.waiting_for((("pooled",), self.block))
        self.made_route = [plan.waiting_for((("route",), c)) for c in self.block_cells]
        steps: dict[str, Callable[[Wave, int, list[Message]], None]] = {
            "conv": self._conv_forward, "pool": self._pool, "route": self._route,
            "dz_top": self._dz_top, "grad": self._weight_grad, "dinput": self._input_grad,
            "reduce": self._reduce}
        for task, train_only, rows in zip(plan.tasks, plan.train_only, plan.send_rows,
                                          strict=True):
            if isinstance(task, Send):
                send = SendJob(task.kind, task.dst, *rows, task.layer, task.phase)
                self.jobs.append(Job(train_only, send, None, 0, ""))
            else:
                self.jobs.append(Job(train_only, None, steps[task.method], task.layer,
                                     task.stage, node_work(spec, cell, task.method,
                                                           task.layer)))

    # ------------------------------------------------------------- messages in
    def handle(self, message: Message, now: float = 0.0) -> list[Message]:
        """Take one decoded message; return the messages this node sends in response."""
        h = message.header
        if h.kind == Kind.PARAMS and not self._take_plan_from_params(message):
            return []
        if h.kind == Kind.HEALTH:
            return self._health(message)
        expect = self.inbox.get((h.kind, h.layer, h.phase, h.src))
        if expect is None or h.mesh != self.mesh_id or h.dst != expect.dst:
            if self.plans_change and h.kind != Kind.PARAMS and \
                    h.mesh == self.mesh_id and h.dst == self.cell and self._ahead(h) and \
                    self._adjacent(h.src):
                # Of a wave whose PARAMS, still to come, may bring another plan.
                return self._keep(message, "buffered_unplanned")
            self.stats[f"rejected:{self._reject_reason(message)}"] += 1
            return []
        wave = self.wave
        if expect.role == ITEMS and wave is not None and h.step == wave.step and \
                h.session == wave.session:
            return self._take_items(wave, message, expect, now)  # most messages
        return self._handle_wave_event(message, expect, now)

    def _take_items(self, wave: Wave, message: Message, expect: Expect,
                    now: float) -> list[Message]:
        """A neighbour's items for the current wave: stored in their slots, and what they
        complete runs (kept for later if the wave has not started yet)."""
        if wave.mode is None:  # before this wave's BATCH: wait for it
            return self._buffer(message, expect, "buffered_early")
        if wave.seen[expect.index]:
            if wave.seen[expect.index] == FILLED_IN:
                return self._late(wave, expect, now)
            self.stats["duplicates"] += 1
            return []
        if expect.train_only and not wave.training:
            self.stats["rejected:unexpected"] += 1
            return []
        payload = message.payload
        if message.header.dtype != FLOAT32 or \
                payload.shape != (expect.rows, expect.channels, wave.batch):
            self.stats["rejected:bad_shape"] += 1
            return []
        wave.buffers[expect.buffer][expect.slots] = payload
        wave.seen[expect.index] = RECEIVED
        self.stats["accepted"] += 1
        if wave.schedule is not None or wave.learnt is not None:
            self._took(wave, expect, now)
        self._arrived(wave, expect.waiters)
        out: list[Message] = []
        if wave.ready:
            self._run_ready(wave, now, out)
        return out

    def _handle_wave_event(self, message: Message, expect: Expect,
                           now: float) -> list[Message]:
        """Everything but the current wave's items: control messages (which may begin a
        wave), REDUCE, and messages of another wave."""
        h = message.header
        wave, new_wave = self.wave, False
        # A later wave of this edge session, or any wave of another: an edge that
        # restarted (new session, maybe lower steps) takes the mesh back with its PARAMS.
        if wave is None or h.session != wave.session or newer(h.step, wave.step):
            if expect.role != Role.PARAMETERS:  # a neighbour is already in the next wave
                return self._buffer(message, expect, "buffered_future")
            if wave is not None and not self._finished(wave):
                self.stats["abandoned_waves"] += 1
            if wave is not None and wave.schedule is not None:
                self._judge(wave)
            if wave is not None and h.session != wave.session:
                self.stats["resynchronised"] += 1
            self.wave = wave = Wave(h.step, h.session, self.plan)
            new_wave = True
        if h.step != wave.step:  # an earlier wave of this session
            self.stats["stale"] += 1
            return []
        if wave.seen[expect.index]:
            if wave.seen[expect.index] == FILLED_IN:
                return self._late(wave, expect, now)
            self.stats["duplicates"] += 1
            return []
        started_before = wave.mode is not None
        out: list[Message] = []
        if not self._accept(wave, message, expect, out, now):
            return []
        wave.seen[expect.index] = RECEIVED
        self.stats["accepted"] += 1
        if wave.schedule is not None or wave.learnt is not None:
            self._took(wave, expect, now)
        if wave.ready:
            self._run_ready(wave, now, out)
        if self.early and (new_wave or (not started_before and wave.mode is not None)):
            for early in self._due(wave):
                out.extend(self.handle(early, now))
        return out

    def _take_plan_from_params(self, message: Message) -> bool:
        """PARAMS say which mesh the wave runs in (`PlanTail`; none: the configured
        one): take that plan if it is not this node's, when the sender is who sends
        this node its PARAMS there and the wave is not older than this node's. False
        if the message is to be dropped."""
        h, payload = message.header, message.payload
        if h.dtype != FLOAT32 or payload.ndim != 1 or payload.size < self.params_size or \
                h.mesh != self.mesh_id or h.dst not in (self.cell, ALL) or \
                not self._adjacent(h.src) or not self._ahead(h):
            return True  # not PARAMS of a wave to come: the usual checks see to it
        spec = self.spec
        if payload.size == self.params_size:
            plan = (spec.home or spec.edge_at, frozenset())
        else:
            tail = PlanTail.read(payload[self.params_size:], spec.model.rows, spec.model.cols)
            if tail is None or tail.edge_at in tail.dead or not \
                    spec.topology.on_border(tail.edge_at):
                self.stats["rejected:bad_params"] += 1
                return False
            plan = (tail.edge_at, tail.dead)
        if plan == spec.plan_key:
            return True
        other = spec.replanned(*plan)
        if (Kind.PARAMS, 0, 0, h.src) not in self._plan_for(other).inbox:
            self.stats["rejected:not_from_parent"] += 1
            return False
        self._adopt(other)
        self.stats["replanned"] += 1
        return True

    def _reject_reason(self, message: Message) -> str:
        """Why a message is not one this node's plan receives (the slow path)."""
        h = message.header
        if h.mesh != self.spec.mesh_id:
            return "other_mesh"
        if h.kind in (Kind.PARAMS, Kind.BATCH):
            if h.src != self.spec.control_source(self.cell):
                return "not_from_parent" if self.spec.params_via == "tree" else "not_from_edge"
            return "not_for_me"
        if h.dst != self.cell:
            return "not_for_me"
        if h.src not in self.neighbours:
            return "not_a_neighbour"
        if h.kind == Kind.REDUCE:
            return "bad_reduce"
        return "unexpected"

    def _buffer(self, message: Message, expect: Expect, why: str) -> list[Message]:
        """Keep a message that arrived before the wave it belongs to could use it, if it
        has a shape the plan could use (a later wave's may bring another plan: then
        any shape)."""
        if not self._plausible(message, expect):
            if why == "buffered_future" and self.plans_change:
                return self._keep(message, "buffered_unplanned")
            self.stats["rejected:bad_shape"] += 1
            return []
        return self._keep(message, why)

    def _ahead(self, h: Header) -> bool:
        """Is `h` of a wave after this node's current one (or of another session)?"""
        wave = self.wave
        return wave is None or h.session != wave.session or newer(h.step, wave.step)

    def _adjacent(self, src: Cell) -> bool:
        """A grid neighbour, or the edge: who may send this node anything in some plan."""
        return src == EDGE or abs(src[0] - self.cell[0]) + abs(src[1] - self.cell[1]) == 1

    def _keep(self, message: Message, why: str) -> list[Message]:
        """Hold a message until its wave: a sender's queue holds at most
        `EARLY_PER_SENDER` messages and two waves' worth of its bytes (the oldest go;
        two of the largest messages for a sender this plan does not hear from)."""
        src = message.header.src
        queue = self.early.setdefault(src, deque(maxlen=EARLY_PER_SENDER))
        if len(queue) == queue.maxlen:
            self.stats["dropped:early_overflow"] += 1  # the oldest goes
        queue.append(message)
        held = sum(m.payload.nbytes for m in queue)
        budget = self.plan.early_bytes.get(src, 2 * self.spec.max_message_bytes)
        while held > budget:
            held -= queue.popleft().payload.nbytes
            self.stats["dropped:early_overflow"] += 1
        self.stats[why] += 1
        return []

    def _plausible(self, message: Message, expect: Expect) -> bool:
        """Could this message, by dtype and shape, be what the plan expects of it?"""
        h, shape = message.header, message.payload.shape
        if expect.role == Role.ITEMS:
            return h.dtype == FLOAT32 and len(shape) == 3 and \
                shape[:2] == (expect.rows, expect.channels) and \
                1 <= shape[2] <= self.spec.max_batch
        if expect.role == Role.PARTIAL_GRADIENTS:
            return h.dtype == FLOAT32 and shape == (self.spec.conv_size,)
        if expect.role == Role.SAMPLES:
            return h.dtype == INT32 and len(shape) == 1 and \
                BATCH_HEAD < shape[0] <= self.spec.max_batch + BATCH_HEAD
        return h.dtype == FLOAT32 and self._params_shaped(message.payload)

    def _params_shaped(self, payload: np.ndarray) -> bool:
        """The parameters, and the plan's tail when this mesh's plan has one."""
        if self.spec.planned:
            return payload.ndim == 1 and payload.size > self.params_size
        return payload.shape == (self.params_size,)

    def _due(self, wave: Wave) -> list[Message]:
        """Take the buffered messages of `wave`; keep those of later waves of its
        session, forget the rest (older waves, other sessions)."""
        due: list[Message] = []
        for src, queue in list(self.early.items()):
            keep = deque(maxlen=queue.maxlen)
            for message in queue:
                h = message.header
                if h.session == wave.session and h.step == wave.step:
                    due.append(message)
                elif h.session == wave.session and newer(h.step, wave.step):
                    keep.append(message)
                else:
                    self.stats["stale"] += 1
            if keep:
                self.early[src] = keep
            else:
                del self.early[src]
        return due

    def _accept(self, wave: Wave, message: Message, expect: Expect,
                out: list[Message], now: float) -> bool:
        """Take a control or REDUCE message into the wave, or count why it does not fit."""
        h, payload = message.header, message.payload
        if expect.role.starts_wave:
            return self._accept_control(wave, message, expect, out, now)
        if wave.mode is None:  # before this wave's BATCH: wait for it
            self._buffer(message, expect, "buffered_early")
            return False
        if not wave.training:
            self.stats["rejected:unexpected"] += 1
            return False
        if h.dtype != FLOAT32:
            self.stats["rejected:bad_shape"] += 1
            return False
        if payload.shape != (self.spec.conv_size,):
            self.stats["rejected:bad_reduce"] += 1
            return False
        wave.reduce[h.src] = payload
        self._arrived(wave, expect.waiters)
        return True

    def _accept_control(self, wave: Wave, message: Message, expect: Expect,
                        out: list[Message], now: float) -> bool:
        """PARAMS and BATCH (from the tree parent or the edge): both in hand, the wave
        starts."""
        h, payload = message.header, message.payload
        if expect.role == Role.PARAMETERS:
            if h.dtype != FLOAT32 or not self._params_shaped(payload) or \
                    not compute.all_positive(payload[self.layout.std]):
                self.stats["rejected:bad_params"] += 1
                return False
            wave.params_payload, wave.params_vector = payload, payload[:self.params_size]
        else:
            if h.dtype != INT32 or not self._valid_batch(payload):
                self.stats["rejected:bad_batch"] += 1
                return False
            _, split, indices = BatchOrder.read(payload)
            if split == Split.LIVE and not np.isfinite(self.readings[split][:, indices]).all():
                # The sensor gave nothing usable for that slot: never send a made-up
                # number; the wave cannot finish and the edge reports the slot.
                self.stats["rejected:no_reading"] += 1
                return False
            wave.batch_payload = payload
        if wave.params_vector is not None and wave.batch_payload is not None:
            self._start(wave, out, now)
        return True

    def _valid_batch(self, payload: np.ndarray) -> bool:
        # No more samples than the messages of a wave can carry: a forged BATCH of
        # 100,000 indices would otherwise make every node allocate for them.
        if payload.ndim != 1 or \
                not BATCH_HEAD < payload.size <= self.spec.max_batch + BATCH_HEAD:
            return False
        mode, split, indices = BatchOrder.read(payload)
        if mode not in (Mode.TRAIN, Mode.INFER) or split not in self.readings:
            return False
        return compute.indices_within(indices, self.readings[split].shape[1])

    def _start(self, wave: Wave, out: list[Message], now: float) -> None:
        payload = wave.batch_payload
        mode, split, indices = BatchOrder.read(payload)
        wave.mode = _MODES[mode]
        wave.training = wave.mode == Mode.TRAIN
        wave.batch = len(indices)
        wave.started_at = self.heard_at = now
        if self._suspects and self.parent is not None:  # dated by the wave judged
            suspects = np.array([c[0] * self.spec.model.cols + c[1] + 1
                                 for c in self._suspects[:HEALTH_MAX]], np.int32)
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            out.append(make(Kind.HEALTH, self.mesh_id, self._judged[0], self.cell,
                            self.parent, suspects, seq=self.seq, session=self._judged[1]))
        if self.policy is not None:
            key = (self.spec.plan_key, wave.mode, wave.batch)
            arrivals = self.arrivals.get(key)
            if arrivals is None and self.learning is not None:
                arrivals = self._carried_over(wave.mode, wave.batch)
                if arrivals is not None:
                    self.arrivals[key] = arrivals
            wave.arrivals = arrivals
            if arrivals is None and self.learning is not None:
                wave.learnt = {}  # this wave is waited out, and teaches the deadlines
            if arrivals is not None:
                wave.schedule = arrivals.schedule()
                wave.after = {d.index: d.after for d in wave.schedule.forward}
                wave.after.update((d.index, d.after) for d in wave.schedule.backward)
        params = wave.params_vector
        for layer, where in self.layout.layers.items():
            wave.weights[layer] = params[where.weight].reshape(where.kernel_shape)
            wave.biases[layer] = params[where.bias]
        wave.buffers = self._field_buffers(wave.batch)
        if wave.training:
            wave.grad = np.empty(self.spec.conv_size, np.float32)
        for child in self.children if self.spec.params_via == "tree" else ():
            out.append(self._message(wave, Kind.PARAMS, child, wave.params_payload))
            out.append(self._message(wave, Kind.BATCH, child, payload))
        compute.normalize(self.readings[split], indices, params[self.layout.mean],
                          params[self.layout.std], wave.buffers[self.a[0]][self.own_a[0]])
        self.flops += 2 * self.spec.model.in_channels * wave.batch  # (x - mean) / std
        self._arrived(wave, self.made_a[0])

    def _field_buffers(self, batch: int) -> list[np.ndarray]:
        """A wave's field buffers: the last wave's again, unless a view of them still
        lives outside this node (a sent payload in flight, or kept by a receiver that
        has not started that wave) or the batch size changed. Reuse matters: allocating
        and freeing them for every wave of every node costs about 8 % of a wave."""
        storage = self._storage
        if not storage or storage[0].shape[2] != batch or _outside_refs(storage):
            self._storage = storage = [np.empty((slots, channels, batch), np.float32)
                                       for slots, channels in self.plan.buffer_shapes]
        return storage

    def record(self, split: int, index: int, values: np.ndarray | float | None) -> None:
        """Store this sensor's reading(s) of one sample (a live time slot), or NaN for a
        reading that failed."""
        column = self.readings[split][:, index]
        column[...] = np.nan if values is None else values

    # --------------------------------------------------------------- deadlines
    def set_deadlines(self, policy: Policy, mode: Mode, batch: int,
                      first: dict[tuple, float], margins: Margins, k: float,
                      spec: MeshSpec | None = None) -> None:
        """Best effort: in waves of `mode` and `batch` (of `spec`'s plan, by default
        this node's), give up on a message of the plan (by inbox key) at its deadline
        and fill it in by `policy`. Deadlines start from `first` (seconds into its
        phase each came in a loss-free wave) and follow the arrivals
        (nodes/deadlines.py); a message without one is waited for."""
        self.policy, self.plans_change = policy, True
        spec = spec or self.spec
        inbox = self._plan_for(spec).inbox
        measured = {inbox[key].index: seconds for key, seconds in first.items()
                    if not inbox[key].role.starts_wave}  # without them, no wave
        backward = {e.index for e in inbox.values() if e.train_only}
        self.arrivals[(spec.plan_key, mode, batch)] = Arrivals(len(inbox), measured,
                                                               backward, margins, k)

    def due(self, h: Header) -> float | None:
        """When this node stops waiting for the message of header `h`, if it is of its
        current wave and its phase has begun (a sender's radio stops recovering it
        then)."""
        wave = self.wave
        if wave is None or wave.schedule is None or h.step != wave.step or \
                h.session != wave.session:
            return None
        expect = self.inbox.get((h.kind, h.layer, h.phase, h.src))
        after = None if expect is None else wave.after.get(expect.index)
        if after is None:
            return None
        if expect.train_only:
            return None if wave.backward_at is None else wave.backward_at + after
        return wave.started_at + after

    def next_deadline(self) -> float | None:
        """When this node next gives up on a message of its current wave, or says
        hello, if it will."""
        wave = self.wave
        hello = self._hello_due()
        if wave is None or wave.schedule is None or self._finished(wave):
            return hello
        due = self._wave_deadline(wave)
        return hello if due is None else due if hello is None else min(due, hello)

    def _wave_deadline(self, wave: Wave) -> float | None:
        """The current wave's next deadline of a message not yet here, if any. (Moves
        the wave's cursors past messages that came: they never need looking at again.)"""
        seen, forward, backward = wave.seen, wave.schedule.forward, wave.schedule.backward
        while wave.next_forward < len(forward) and seen[forward[wave.next_forward].index]:
            wave.next_forward += 1
        due = wave.started_at + forward[wave.next_forward].after \
            if wave.next_forward < len(forward) else None
        if wave.backward_at is not None:
            while wave.next_backward < len(backward) and \
                    seen[backward[wave.next_backward].index]:
                wave.next_backward += 1
            if wave.next_backward < len(backward):
                at = wave.backward_at + backward[wave.next_backward].after
                due = at if due is None else min(due, at)
        return due

    def tick(self, now: float) -> list[Message]:
        """Fill in every message whose deadline has passed, and run what that
        completes; say hello if no PARAMS came for long; returns what this node sends
        in consequence."""
        wave = self.wave
        out: list[Message] = []
        hello = self._hello_due()
        if hello is not None and now >= hello:
            out.extend(self._hello(now))
        if wave is None or wave.schedule is None or self._finished(wave):
            return out
        for index in self._overdue(wave, now):
            self._fill_in(wave, index)
        if wave.ready:
            self._run_ready(wave, now, out)
        return out

    def _overdue(self, wave: Wave, now: float) -> list[int]:
        """The messages not yet here whose deadlines are at or before `now`."""
        overdue: list[int] = []
        wave.next_forward = _passed(wave.schedule.forward, wave.next_forward,
                                    wave.started_at, now, wave.seen, overdue)
        if wave.backward_at is not None:
            wave.next_backward = _passed(wave.schedule.backward, wave.next_backward,
                                         wave.backward_at, now, wave.seen, overdue)
        return overdue

    def _took(self, wave: Wave, expect: Expect, now: float) -> None:
        """Best effort: a message came. It tells when such messages come; the first
        backward one starts the backward deadlines; under policy "last" a forward
        one's level is remembered."""
        if expect.role.starts_wave:
            return  # never waited for: without them there is no wave
        if expect.train_only and wave.backward_at is None:
            wave.backward_at = now
        self._timed(wave, expect, now)
        if not expect.train_only and self.policy == Policy.LAST and expect.role == ITEMS:
            f, items = self.plan.carries[expect.index]
            levels = wave.buffers[expect.buffer][expect.slots].mean(axis=2)
            for item, level in zip(items, levels, strict=True):
                self.last_level[(f, item)] = level

    # ---------------------------------------------------------------- health
    def _judge(self, wave: Wave) -> None:
        """A best-effort wave is over: a neighbour all of whose messages in it had to be
        filled in was silent; after `SILENT_WAVES` such waves in a row it is reported
        (with the next wave's start) until the edge's plan leaves it out."""
        heard: dict[Cell, bool] = {}
        for index, seen in enumerate(wave.seen):
            expect, src = self.plan.expected[index], self.plan.keys[index][3]
            if seen and src in self.neighbours and src != EDGE and \
                    not expect.role.starts_wave:
                heard[src] = heard.get(src, False) or seen != FILLED_IN
        for neighbour, got in heard.items():
            self.silent[neighbour] = 0 if got else self.silent[neighbour] + 1
        self._suspects = sorted(n for n, waves in self.silent.items()
                                if waves >= SILENT_WAVES and n not in self.spec.dead)
        self._judged = (wave.step, wave.session)

    def _health(self, message: Message) -> list[Message]:
        """A HEALTH on its way to the edge: from a tree child, passed on to the parent;
        a hello from a grid neighbour (its own cell, back), passed on too."""
        h, payload = message.header, message.payload
        if h.dst != self.cell or health_entries(payload, self.spec.model.rows,
                                                self.spec.model.cols) is None:
            self.stats["rejected:bad_health"] += 1
            return []
        own = h.src[0] * self.spec.model.cols + h.src[1] + 1
        hello = payload.size == 1 and payload[0] == -own and \
            abs(h.src[0] - self.cell[0]) + abs(h.src[1] - self.cell[1]) == 1
        if self.parent is None or not (hello or h.src in self.children):
            self.stats["rejected:bad_health"] += 1
            return []
        self.stats["health_relayed"] += 1
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return [make(Kind.HEALTH, self.mesh_id, h.step, self.cell, self.parent, payload,
                     seq=self.seq, session=h.session)]

    def _hello_due(self) -> float | None:
        """When this node says hello next: `hello_after` without PARAMS, and again
        that long after each hello; only while it has no wave (it booted) or its mesh
        leaves it out (found dead, though alive). A node of the mesh whose waves merely
        run long never says it."""
        if self.hello_after is None or \
                (self.wave is not None and self.cell in self.spec.topology.members):
            return None
        since = self.heard_at if self._hello_at is None else max(self.heard_at,
                                                                  self._hello_at)
        return since + self.hello_after

    def _hello(self, now: float) -> list[Message]:
        """"I am here" to every grid neighbour: one in the mesh passes it to the edge,
        which takes this cell back in with its next PARAMS."""
        self._hello_at = now
        self.stats["hellos"] += 1
        r, c = self.cell
        hello = np.array([-(r * self.spec.model.cols + c + 1)], np.int32)
        out = []
        for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if self.spec.topology.inside(n):
                self.seq = (self.seq + 1) & 0xFFFFFFFF
                out.append(make(Kind.HEALTH, self.mesh_id, 0, self.cell, n, hello,
                                seq=self.seq))
        return out

    def _timed(self, wave: Wave, expect: Expect, now: float) -> None:
        """One more arrival time for the deadlines of this kind of wave."""
        began = wave.backward_at if expect.train_only else wave.started_at
        if began is None:
            return
        if wave.learnt is not None:
            wave.learnt[expect.index] = max(now - began, 0.0)
        else:
            wave.arrivals.sample(expect.index, max(now - began, 0.0))

    def learn_deadlines(self, policy: Policy, learning: Learning) -> None:
        """Best effort, learning each kind of wave's first deadlines from its first
        wave, waited out whole (over MQTT: no probe to measure them)."""
        self.policy, self.learning, self.plans_change = policy, learning, True

    def _carried_over(self, mode: Mode, batch: int) -> Arrivals | None:
        """A new plan's deadlines from the same kind of wave in an earlier plan, message
        by message (a message new to this plan: the latest of its phase). Waiting a wave
        out to learn them could wait for ever: the plan may still hold dead cells."""
        for (plan_key, other_mode, other_batch), old in self.arrivals.items():
            old_plan = self._plans.get(plan_key)
            if (other_mode, other_batch) != (mode, batch) or old_plan is None or \
                    old_plan is self.plan:
                continue
            latest = {phase: max((old.smoothed[i] + old.deviation[i] for i, m in
                                  enumerate(old.measured) if m and
                                  (i in old.backward) == phase), default=0.0)
                      for phase in (False, True)}
            first: dict[int, float] = {}
            for key, expect in self.inbox.items():
                if expect.role.starts_wave:
                    continue
                index = old_plan.inbox[key].index if key in old_plan.inbox else None
                first[expect.index] = old.smoothed[index] if index is not None and \
                    old.measured[index] else latest[expect.train_only]
            backward = {e.index for e in self.inbox.values() if e.train_only}
            return Arrivals(len(self.inbox), first, backward, old.margins, old.k)
        return None

    def _learnt(self, wave: Wave) -> None:
        """A wave waited out whole: its arrival times start its kind's deadlines."""
        learnt, plan = wave.learnt, self.plan
        wave.learnt = None
        backward = {i for i in learnt if plan.expected[i].train_only}
        spans = (max((t for i, t in learnt.items() if i not in backward), default=0.0),
                 max((learnt[i] for i in backward), default=0.0))
        self.arrivals[(self.spec.plan_key, wave.mode, wave.batch)] = Arrivals(
            len(plan.inbox), learnt, backward, self.learning.margins(*spans),
            self.learning.k)

    def _late(self, wave: Wave, expect: Expect, now: float) -> list[Message]:
        """A message that came after its deadline: filled in already, so only its
        arrival time counts (the deadline was short), and that its sender is alive."""
        self.stats["late"] += 1
        wave.seen[expect.index] = LATE
        self._timed(wave, expect, now)
        return []

    def _fill_in(self, wave: Wave, index: int) -> None:
        """Put values in place of a message that missed its deadline (the policy's for
        forward values, zeros for gradients), and go on as if it had come."""
        expect, (kind, _, _, _) = self.plan.expected[index], self.plan.keys[index]
        if expect.role == Role.PARTIAL_GRADIENTS:
            wave.reduce[self.plan.keys[index][3]] = np.zeros(self.spec.conv_size, np.float32)
        elif expect.role == ITEMS:
            f, items = self.plan.carries[index]
            wave.buffers[expect.buffer][expect.slots] = \
                0.0 if expect.train_only else self._filling(wave, f, items)
        else:  # PARAMS or BATCH: never scheduled (no wave without them)
            return
        wave.seen[index] = FILLED_IN
        self.stats["filled_in"] += 1
        self.stats[f"filled_in:{Kind(kind).name.lower()}"] += 1
        self._arrived(wave, expect.waiters)

    def _fill_orphans(self, wave: Wave, f: Field) -> None:
        """Put the policy's values in the slots of `f`'s orphans (zeros for gradients
        and without a policy) before a kernel reads them."""
        rows = self.orphan_rows.get(f)
        if rows is None:
            return
        buffer = wave.buffers[self.plan.buffers[f]]
        buffer[rows] = 0.0 if f[0] in GRADIENTS or self.policy in (None, Policy.ZERO) \
            else self._filling(wave, f, self.plan.orphans[f])
        self.stats["absent_filled"] += len(rows)

    def _filling(self, wave: Wave, f: Field, items: Sequence[Hashable]
                 ) -> np.ndarray | float:
        """Forward values for missing items of field `f`, by the policy."""
        if self.policy == Policy.LAST:
            buffer = wave.buffers[self.plan.buffers[f]]
            values = np.zeros((len(items), buffer.shape[1], buffer.shape[2]), np.float32)
            for row, item in enumerate(items):
                level = self.last_level.get((f, item))
                if level is not None:
                    values[row] = level[:, None]
            return values
        if self.policy == Policy.NEIGHBOURS:
            return self._neighbours_mean(wave, f, items)
        return 0.0

    def _neighbours_mean(self, wave: Wave, f: Field, items: Sequence[Hashable]
                         ) -> np.ndarray:
        """Each of `items` of field `f`: the mean of its 4-neighbours (in the item's own
        grid: cells, or pooling blocks) that this node holds and has; 0 without any."""
        buffer, slots = wave.buffers[self.plan.buffers[f]], self.plan.slots[self.plan.buffers[f]]
        values = np.zeros((len(items), buffer.shape[1], buffer.shape[2]), np.float32)
        for row, (r, c) in enumerate(items):
            near = [slots[n] for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
                    if n in slots and self.plan.usable(wave, f, n)]
            if near:
                values[row] = buffer[near].mean(axis=0)
        return values

    # ---------------------------------------------------------------- progress
    def _arrived(self, wave: Wave, waiters: tuple[int, ...]) -> None:
        """A source came: `waiters` are the tasks that waited for it."""
        missing = wave.missing
        for task in waiters:
            missing[task] -= 1
            if missing[task] == 0:
                wave.ready.append(task)

    def _run_ready(self, wave: Wave, now: float, out: list[Message]) -> None:
        """Run every task whose sources have arrived (running one may ready others)."""
        if wave.mode is None:
            return
        jobs, buffers, training, ready = self.jobs, wave.buffers, wave.training, wave.ready
        mesh, step, session, cell = self.mesh_id, wave.step, wave.session, self.cell
        done = wave.done
        while ready:
            task = ready.pop()
            train_only, send, run, layer, stage, work = jobs[task]
            if train_only and not training:
                continue
            done[task] = 1
            if send is None:
                run(wave, layer, out)
                wave.finished_at[stage] = now
                self.flops += work.per_sample * wave.batch + work.per_wave
            else:
                kind, dst, buffer, rows, layer, phase = send
                self.seq = (self.seq + 1) & 0xFFFFFFFF
                out.append(seal(kind, mesh, step, cell, dst, buffers[buffer][rows], layer,
                                phase, self.seq, FLOAT32, session))
            wave.tasks_done += 1
        if wave.tasks_done == self.plan.active[wave.mode]:
            wave.finished_at.setdefault("finished", now)
            if wave.learnt is not None:
                self._learnt(wave)

    def _finished(self, wave: Wave) -> bool:
        return wave.mode is not None and wave.tasks_done == self.plan.active[wave.mode]

    # ------------------------------------------------------------ computation
    def _conv_forward(self, wave: Wave, layer: int, out: list[Message]) -> None:
        if self.orphan_rows:
            self._fill_orphans(wave, ("a", layer - 1))
        z = wave.buffers[self.a[layer]][self.own_a[layer]]
        compute.conv_relu(wave.buffers[self.a[layer - 1]], self.conv_slots[layer],
                          self.conv_taps, wave.weights[layer], wave.biases[layer], z)
        self._arrived(wave, self.made_a[layer])

    def _pool(self, wave: Wave, layers: int, out: list[Message]) -> None:
        """The block's maximum and, for the backward pass, which member held it (the
        first in row-major order, as PyTorch)."""
        pooled = wave.buffers[self.pooled][self.pooled_slot]
        wave.winners = np.empty(pooled.shape, np.intp)
        compute.max_pool(wave.buffers[self.a[layers]], self.block_slots, pooled, wave.winners)
        self._arrived(wave, self.made_pooled)

    def _route(self, wave: Wave, layers: int, out: list[Message]) -> None:
        """Max-pool backward at the leader: each member gets the gradient where it won."""
        grad = wave.buffers[self.dpooled][self.dpooled_slot]
        compute.route_max(grad, wave.winners, self.route_slots, wave.buffers[self.route])
        for made in self.made_route:
            self._arrived(wave, made)

    def _dz_top(self, wave: Wave, layers: int, out: list[Message]) -> None:
        """d(loss)/d(last conv's pre-activation): the routed gradient where ReLU passed."""
        if self.orphan_rows:
            self._fill_orphans(wave, ("route",))
        compute.relu_backward(wave.buffers[self.a[layers]][self.own_a[layers]],
                              wave.buffers[self.route][self.own_route],
                              wave.buffers[self.dz[layers]][self.own_dz[layers]])
        self._arrived(wave, self.made_dz[layers])

    def _weight_grad(self, wave: Wave, layer: int, out: list[Message]) -> None:
        """This cell's share of d(loss)/d(conv weights, bias): its output times its window."""
        dz = wave.buffers[self.dz[layer]][self.own_dz[layer]]  # (h, B)
        where = self.layout.layers[layer]
        compute.weight_grad(dz, wave.buffers[self.a[layer - 1]], self.conv_slots[layer],
                            self.conv_taps, wave.grad[where.weight].reshape(where.kernel_shape),
                            wave.grad[where.bias])
        self._arrived(wave, self.made_grad[layer])  # the reduce task waits for it

    def _input_grad(self, wave: Wave, layer: int, out: list[Message]) -> None:
        """d(loss)/d(this cell's input to `layer`): transposed convolution of the dz halo."""
        below = layer - 1
        if self.orphan_rows:
            self._fill_orphans(wave, ("dz", layer))
        compute.input_grad(wave.buffers[self.dz[layer]], self.grad_slots[layer],
                           self.grad_taps, wave.weights[layer],
                           wave.buffers[self.a[below]][self.own_a[below]],
                           wave.buffers[self.dz[below]][self.own_dz[below]])
        self._arrived(wave, self.made_dz[below])

    def _reduce(self, wave: Wave, _: int, out: list[Message]) -> None:
        """Own partial gradients plus the children's, as one message to the parent."""
        total = wave.grad  # the own layers' shares, written in place by _weight_grad
        # In process a child's payload is its own `wave.grad`, read-only here and never
        # written again by the child: REDUCE is its wave's last task.
        for child in self.children:
            total += wave.reduce[child]
        out.append(self._message(wave, Kind.REDUCE, self.parent, total))

    def _message(self, wave: Wave, kind: Kind, dst: Cell, payload: np.ndarray,
                 layer: int = 0, phase: int = 0) -> Message:
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return make(kind, self.mesh_id, wave.step, self.cell, dst, payload,
                    layer=layer, phase=phase, seq=self.seq, session=wave.session)

    # -------------------------------------------------------------- reporting
    @property
    def finish_times(self) -> dict[str, float]:
        """When (in transport time) this node finished each stage of its last wave; the
        wave's own dict, not a copy (the transport keeps it after the wave)."""
        return self.wave.finished_at if self.wave else {}


def _passed(deadlines: tuple[Deadline, ...], cursor: int, began: float, now: float,
            seen: bytearray, overdue: list[int]) -> int:
    """Move `cursor` past the deadlines (by time) at or before `now` of a phase that
    began at `began`, adding to `overdue` the messages among them not yet seen."""
    while cursor < len(deadlines) and began + deadlines[cursor].after <= now:
        if not seen[deadlines[cursor].index]:
            overdue.append(deadlines[cursor].index)
        cursor += 1
    return cursor


def _made_by(task: Computation, cell: Cell, block: Cell, members: list[Cell]
             ) -> list[Item]:
    """The items a computation writes (grad and reduce write none: their results are
    the wave's gradient vector)."""
    if task.method == "conv":
        return [(("a", task.layer), cell)]
    if task.method == "pool":
        return [(("pooled",), block)]
    if task.method == "route":
        return [(("route",), c) for c in members]
    if task.method == "dz_top":
        return [(("dz", task.layer), cell)]
    if task.method == "dinput":
        return [(("dz", task.layer - 1), cell)]
    return []


def _outside_refs(arrays: list[np.ndarray]) -> int:
    """References to the arrays of a list besides the list's own; every view of an
    array holds one (numpy views refer to the array that owns the memory)."""
    return sum(sys.getrefcount(a) for a in arrays) - len(arrays) * _LISTED


_LISTED = sum(sys.getrefcount(a) for a in [np.empty(0)])  # an array only a list holds


def _slots(cell: Cell, window: list[Cell], before: int, kernel: int) -> list[tuple[Cell, int]]:
    """Each window cell with its tap: the flat index into the k x k kernel positions."""
    return [(c, (c[0] - cell[0] + before) * kernel + c[1] - cell[1] + before) for c in window]
