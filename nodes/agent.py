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
one arrives. The plan (`NodePlan`, nodes/plan.py) lays the tasks out as a program
(`Program`): integer rows per task, run one at a time here by the executor the compiled
loop runs too (nodes/execute.py, through nodes/steps.py). Values live in one (slots,
channels, batch) array per field, reused from wave to wave. No sockets, clocks or asyncio:
transports call `handle`, and `tick` for deadlines; `now` only stamps when each stage
finished (and, in best effort, what is overdue: nodes/besteffort.py). Bad messages are
counted in `stats` and dropped; they never raise.
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from meshdl.compress.codec import Channel, read_or_count
from meshdl.compress.intsum import SumChannel
from meshdl.data.augment import FLIPS, mirror_cells, mirror_orientations
from meshdl.errors import MeshdlError
from meshdl.nodes import compute, execute
from meshdl.nodes.besteffort import BestEffort
from meshdl.nodes.compiled import validate_program
from meshdl.nodes.delta import FLOAT32_ROWS, CodedRows, DeltaReceiver, DeltaSender, RowForm
from meshdl.nodes.memory import MemoryPlan
from meshdl.nodes.plan import (
    FILLED_IN,
    ITEMS,
    MODES,
    RECEIVED,
    Expect,
    NodePlan,
    Role,
    Wave,
)
from meshdl.nodes.steps import run as run_computation
from meshdl.protocol.activations import (
    FORWARD_KINDS,
    StaticCodes,
    activation_bytes,
    encode_activations,
    read_activations,
    valid_act_scales,
)
from meshdl.protocol.deadlines import Learning, Margins, Policy
from meshdl.protocol.lifecycle import (
    NodeEvent,
    NodePhase,
    next_node_phase,
    node_phase_after,
    node_wave_events,
)
from meshdl.protocol.messages import (
    ALL,
    BYTES,
    EDGE,
    FLOAT32,
    INT32,
    Header,
    Kind,
    Message,
    make,
    newer,
    seal,
)
from meshdl.protocol.payloads import BATCH_HEAD, REPAIR, BatchOrder, PlanTail
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.protocol.topology import Cell

EARLY_PER_SENDER = 64  # messages kept per neighbour until their wave can use them
SESSIONS_SEEN = 8  # edge sessions a node remembers the order of (`_take_repair`)
KEPT_PLANS = 4  # a node's plans of recent meshes (dead cells come back)



class CachedParams(NamedTuple):
    """The parameters a node keeps for scheduled slots: the PARAMS payload of the wave
    (edge session and step: the version) that last brought them."""

    session: int
    step: int
    payload: np.ndarray  # the whole PARAMS payload (read-only, as received)
    vector: np.ndarray  # its conv weights, mean and std (`MeshSpec.params_layout`)


class NodeMachine:
    """One cell of the mesh."""

    def __init__(self, spec: MeshSpec, cell: Cell, readings: dict[int, np.ndarray],
                 memory_plan: bool = True, originals: int | None = None) -> None:
        """`readings[split]` is (samples, in_channels) float32: this sensor's own log.
        `memory_plan`: lay each wave's buffers out by the memory plan (nodes/memory.py);
        False, every field its own buffer in every wave, as before the plan (only to
        measure what the plan saves, `meshdl bench memory`, or to test without it).
        `originals`: the training readings hold mirrors (`augment.training_data`), sample
        o x originals + i being map i in mirror o; a position bias flips with the map,
        so this cell then reads the mirrored cell's column (`position_columns`). None:
        no mirrors."""
        train = readings.get(Split.TRAIN)
        if originals is not None and (train is None or originals < 1 or
                                      len(train) != len(FLIPS) * originals):
            raise ValueError(f"mirrored training readings hold {len(FLIPS)} x originals "
                             f"samples ({originals} originals)")
        self.cell = cell
        self.originals = originals
        self.memory_plan = memory_plan  # read at each wave's start
        # Channel-major, as the node's activations are (channels, batch).
        self.readings = {split: np.ascontiguousarray(x.T, np.float32)
                         for split, x in readings.items()}
        self.wave: Wave | None = None
        # Messages that came before their wave could use them, per sender (a bounded
        # queue each: a misbehaving neighbour can only push out its own).
        self.early: dict[Cell, deque[Message]] = {}
        self.stats: Counter[str] = Counter()
        self.seq = 0
        # Best effort (nodes/besteffort.py): deadlines, fill-ins, health and hello.
        self.effort = BestEffort(self)
        # The mesh may be replanned (dead cells): a later wave's message of a shape this
        # plan does not expect is kept, for the plan its PARAMS will bring.
        self.plans_change = False
        # Floating-point operations of every computation run so far: simulated time
        # turns them into CPU time on a device profile (sim/radio/device.py).
        self.flops = 0
        self._plans: dict[tuple, NodePlan] = {}  # by `MeshSpec.plan_key`, a few
        # Compressed REDUCE (meshdl/compress): this node's stream up the tree, with the
        # error feedback that carries what one wave's message left out into the next.
        codec = spec.reduce_codec
        self.reduce_channel = None if codec is None else \
            Channel(codec, seed=cell[0] * spec.model.cols + cell[1])
        # Or, under intsum, its own share in whole numbers of the mesh's scales
        # (meshdl/compress/intsum.py): the REDUCE then adds its children's exactly.
        self.sum_channel = None if spec.reduce_sum is None else SumChannel(spec.reduce_sum)
        self.activation_codec = spec.activation_codec  # lossy HALO, POOL, GATHER
        # Live inference: HALOs as changes since the last wave (nodes/delta.py).
        self.delta_out = None if spec.delta is None else DeltaSender(spec.delta)
        self.delta_in = None if spec.delta is None else DeltaReceiver()
        # The parameters of the last wave that brought them, for scheduled slots.
        self.cached: CachedParams | None = None
        self.pending_slot: int | None = None  # a slot waiting for repaired parameters
        self.asking: set[Cell] = set()  # tree children waiting for them too
        # The edge sessions this node has had waves of, in the order first seen (the
        # numbers are random: there is no other order), the newest last.
        self.sessions: deque[int] = deque(maxlen=SESSIONS_SEEN)
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
        tasks (its program's rows, as the hot path reads them). A cell `spec` leaves out
        (dead, or cut off) has none: it only waits for PARAMS that take it back in."""
        cell = self.cell
        self.spec = spec
        self.mesh_id = spec.mesh_id
        self.layout = spec.params_layout  # where each layer's parameters sit in PARAMS
        self.params_size = self.layout.size
        if self.wave is not None and self.wave.phase is not NodePhase.DONE:
            self._move(self.wave, NodeEvent.SUPERSEDED)
        self.wave = None  # the PARAMS that brought the new plan start a new wave
        self._storage: list[np.ndarray] = []  # the field buffers of the last wave ...
        self._kept: list[np.ndarray | None] = []  # ... its kept activations ...
        self._owned: list[np.ndarray] = []  # ... the distinct arrays (arena slots) ...
        self._lent: list[weakref.ref[np.ndarray]] = []  # ... payloads that view them ...
        self._memory: MemoryPlan | None = None  # ... their plan ...
        self._storage_key: tuple = ()  # ... and for which (batch, MemoryPlan)
        topo = spec.topology
        self.plan = plan = self._plan_for(spec)
        self.number = plan.number if cell in topo.members else \
            cell[0] * spec.model.cols + cell[1]  # as BATCH and WINNER name it
        self.inbox = plan.inbox
        self.parent = topo.parent.get(cell)
        self.neighbours = set(topo.neighbours(cell)) if cell in topo.members else set()
        self.children = topo.children.get(cell, [])
        self.effort.new_plan()
        for delta in (self.delta_out, self.delta_in):  # and delta halos from whole strips
            if delta is not None:
                delta.reset()
        self.jobs = plan.jobs

    # ------------------------------------------------------------ best effort
    # What a transport asks of the node's best effort (nodes/besteffort.py).
    def set_deadlines(self, policy: Policy, mode: Mode, batch: int,
                      first: dict[tuple, float], margins: Margins, k: float,
                      spec: MeshSpec | None = None) -> None:
        """See `BestEffort.set_deadlines`."""
        self.effort.set_deadlines(policy, mode, batch, first, margins, k, spec)

    def learn_deadlines(self, policy: Policy, learning: Learning) -> None:
        """See `BestEffort.learn_deadlines`."""
        self.effort.learn_deadlines(policy, learning)

    def tick(self, now: float) -> list[Message]:
        """Fill in every message whose deadline has passed, and say hello when due;
        returns what this node sends in consequence."""
        return self.effort.tick(now)

    def next_deadline(self) -> float | None:
        """When `tick` next has something to do, if ever."""
        return self.effort.next_deadline()

    def due(self, h: Header) -> float | None:
        """When this node stops waiting for the message of header `h` (see
        `BestEffort.due`)."""
        return self.effort.due(h)

    # ------------------------------------------------------------- messages in
    # Every message goes through `handle`, and from there by its kind through
    # `_HANDLERS` (below the class) to one `_on_<kind>` method:
    #   HALO POOL GATHER SCATTER ROUTE GRAD_HALO  the current wave's: `_take_items`, at
    #                                             once; else `_on_items` (another wave's)
    #   PARAMS, BATCH, REDUCE  `_on_params` / `_on_batch` / `_on_reduce`: the payload
    #                          checked and stored (`_store_params`, `_store_batch`,
    #                          `_add_reduce`) inside the wave bookkeeping they share,
    #                          `_accept`, which starts the wave (`_start_wave`)
    #   HEALTH                 `_on_health`: relayed up the tree, no wave involved
    # A message the plan does not receive ends in `_not_planned` (kept, or counted and
    # dropped). Each kind has one role in the plan's inbox (`Expect.role`): HALO ..
    # GRAD_HALO ITEMS, PARAMS PARAMETERS, BATCH SAMPLES, REDUCE PARTIAL_GRADIENTS.
    def handle(self, message: Message, now: float = 0.0) -> list[Message]:
        """Take one decoded message; return the messages this node sends in response."""
        h = message.header
        expect = self.inbox.get((h.kind, h.layer, h.phase, h.src))
        wave = self.wave
        # Most messages are a neighbour's items for the current wave: stored straight
        # away, before the kind table (this is the hot path).
        if expect is not None and expect.role == ITEMS and wave is not None and \
                h.step == wave.step and h.session == wave.session and \
                h.mesh == self.mesh_id and h.dst == expect.dst:
            return self._take_items(wave, message, expect, now)
        return _HANDLERS.get(h.kind, _ON_OTHER)(self, message, expect, now)

    def _on_items(self, message: Message, expect: Expect | None,
                  now: float) -> list[Message]:
        """Items `handle` could not store: not this plan's, or of another wave than the
        current one (any kind outside the table comes here too, and is not planned)."""
        h = message.header
        if expect is None or h.mesh != self.mesh_id or h.dst != expect.dst:
            return self._not_planned(message)
        # `handle` stores those of the current wave, so these are of a later wave (or
        # there is no wave yet) or of an earlier one.
        if self._ahead(h):  # a neighbour is already in the next wave
            return self._buffer(message, expect, "buffered_future")
        self.stats["stale"] += 1
        return []

    def _on_params(self, message: Message, expect: Expect | None,
                   now: float) -> list[Message]:
        """PARAMS: may bring another plan (dead cells), and with BATCH start a wave; or,
        from the tree parent, repair a missing cache (`_take_repair`)."""
        if message.header.phase == REPAIR:
            return self._take_repair(message, now)
        if not self._take_plan_from_params(message):
            return []
        h = message.header
        # Looked up again: the plan just taken may hear its PARAMS from another sender.
        expect = self.inbox.get((h.kind, h.layer, h.phase, h.src))
        if expect is None or h.mesh != self.mesh_id or h.dst != expect.dst:
            return self._not_planned(message)
        return self._accept(message, expect, now, self._store_params)

    def _on_batch(self, message: Message, expect: Expect | None,
                  now: float) -> list[Message]:
        """BATCH: with PARAMS, starts a wave."""
        h = message.header
        if expect is None or h.mesh != self.mesh_id or h.dst != expect.dst:
            return self._not_planned(message)
        return self._accept(message, expect, now, self._store_batch)

    def _on_reduce(self, message: Message, expect: Expect | None,
                   now: float) -> list[Message]:
        """REDUCE: a tree child's partial gradients, added to this node's own."""
        h = message.header
        if expect is None or h.mesh != self.mesh_id or h.dst != expect.dst:
            return self._not_planned(message)
        return self._accept(message, expect, now, self._add_reduce)

    def _on_health(self, message: Message, expect: Expect | None,
                   now: float) -> list[Message]:
        """HEALTH: never in the plan's inbox; relayed towards the edge (besteffort.py),
        unless it is a tree child's ask for parameters (`_answer_repair`)."""
        if message.header.phase == REPAIR:
            return self._answer_repair(message)
        return self.effort.relay_health(message)

    def _not_planned(self, message: Message) -> list[Message]:
        """A message this node's plan does not receive (no inbox entry, another mesh, or
        another destination than the plan's): kept when a later wave's PARAMS may bring
        a plan that does, else counted by why and dropped."""
        h = message.header
        if self.plans_change and h.kind != Kind.PARAMS and \
                h.mesh == self.mesh_id and h.dst == self.cell and self._ahead(h) and \
                self._adjacent(h.src):
            # Of a wave whose PARAMS, still to come, may bring another plan.
            return self._keep(message, "buffered_unplanned")
        self.stats[f"rejected:{self._reject_reason(message)}"] += 1
        return []

    def _accept(self, message: Message, expect: Expect, now: float,
                store: Callable[[Wave, Message, Expect], bool]) -> list[Message]:
        """The wave bookkeeping PARAMS, BATCH and REDUCE share: find (or, for PARAMS,
        begin) the message's wave, drop what is stale or a duplicate, `store` its
        payload (False: it did not fit, and `store` counted why), start the wave once
        PARAMS and BATCH are both in, run what it readied, and replay the messages
        that came early for a wave that just began or started."""
        h = message.header
        wave, new_wave = self.wave, False
        # A later wave of this edge session, or any wave of another: an edge that
        # restarted (new session, maybe lower steps) takes the mesh back with its PARAMS.
        if wave is None or h.session != wave.session or newer(h.step, wave.step):
            if expect.role != Role.PARAMETERS:  # a neighbour is already in the next wave
                return self._buffer(message, expect, "buffered_future")
            wave = self._new_wave(h.step, h.session)
            new_wave = True
        if h.step != wave.step:  # an earlier wave of this session
            self.stats["stale"] += 1
            return []
        if wave.seen[expect.index]:
            if wave.seen[expect.index] == FILLED_IN:
                return self.effort.late(wave, expect, now)
            self.stats["duplicates"] += 1
            if wave.scheduled and h.kind == Kind.PARAMS and self.cached is not None and \
                    not np.array_equal(message.payload, self.cached.payload):
                # The edge resent a slot this node began on its own, with other
                # parameters (its model changed): they are not taken mid-slot, and the
                # stale ones go, so that the next slot asks for the new (`begin_slot`).
                self.cached = None
                self.stats["params_changed"] += 1
            return []
        started_before = wave.phase is not NodePhase.AWAITING_CONTROL
        out: list[Message] = []
        if not store(wave, message, expect):
            return []
        # Started before the message is marked taken: `_start_wave` may turn timing on,
        # and then this last control message is timed too.
        if expect.role.starts_wave and wave.params_vector is not None and \
                wave.batch_payload is not None:
            self._start_wave(wave, out, now)
        wave.seen[expect.index] = RECEIVED
        self.stats["accepted"] += 1
        if wave.timing:
            self.effort.took(wave, expect, now)
        if wave.ready:
            self._run_ready(wave, now, out)
        if self.early and (new_wave or (not started_before and
                                        wave.phase is not NodePhase.AWAITING_CONTROL)):
            for early in self._due(wave):
                out.extend(self.handle(early, now))
        return out

    def _new_wave(self, step: int, session: int) -> Wave:
        """Leave the current wave (superseded if unfinished) for wave `step` of `session`."""
        wave = self.wave
        if wave is not None and not self._finished(wave):
            self.stats["abandoned_waves"] += 1
            self._move(wave, NodeEvent.SUPERSEDED)
        if wave is not None and wave.schedule is not None:
            self.effort.judge(wave)
        if wave is not None and session != wave.session:
            self.stats["resynchronised"] += 1
        if session not in self.sessions:  # seen again (a replay, say): not newer for it
            self.sessions.append(session)
        if not self.plan.checked:  # its program, once, before any task of it runs:
            # the executor indexes without bounds checks (nodes/execute.py), so the
            # program is held to what it indexes by the checks the compiled loop's
            # tables pass (nodes/compiled.py), and refused in one line
            validate_program(self.plan, self.spec, self.cell)
            self.plan.checked = True
        self.wave = Wave(step, session, self.plan)
        return self.wave

    # ---------------------------------------------------------- scheduled slots
    # Live inference on a schedule: the parameters come once and are cached; every time
    # slot's wave then starts at the slot boundary by each node's own clock, with no
    # PARAMS and no BATCH on the air (PROTOCOL.md, "Scheduled slots").
    def begin_slot(self, slot: int, now: float = 0.0) -> list[Message]:
        """Start the inference wave of time slot `slot` on the cached parameters: its step
        is the slot number, its one sample the slot's place in the LIVE ring. Returns what
        this node sends (its first halo strips; the messages its neighbours sent before
        this node's clock reached the slot, kept until now, are taken too)."""
        cached = self.cached
        if cached is None or self.cell not in self.spec.topology.members:
            self.stats["rejected:slot_without_params"] += 1
            return self._ask_for_params(slot)
        if self.began(slot):
            self.stats["rejected:stale_slot"] += 1  # this slot, or a later one, began
            return []
        batch = BatchOrder(Mode.INFER, Split.LIVE, np.array([slot % LIVE_SLOTS])).pack()
        if not self._valid_batch(batch) or \
                not np.isfinite(self.readings[Split.LIVE][:, slot % LIVE_SLOTS]).all():
            # No usable reading for the slot: never a made-up number (as `_store_batch`).
            self.stats["rejected:no_reading"] += 1
            return []
        wave = self._new_wave(slot & 0xFFFFFFFF, cached.session)
        wave.scheduled = True
        for (kind, *_), expect in self.inbox.items():  # as if they came: a copy that
            if kind in (Kind.PARAMS, Kind.BATCH):  # does (the edge resent the slot) is
                wave.seen[expect.index] = RECEIVED  # a duplicate

        wave.params_payload, wave.params_vector = cached.payload, cached.vector
        wave.batch_payload = batch
        out: list[Message] = []
        self._start_wave(wave, out, now)
        self.stats["scheduled_slots"] += 1
        if wave.ready:
            self._run_ready(wave, now, out)
        if self.early:
            for early in self._due(wave):
                out.extend(self.handle(early, now))
        return out

    # Repair: a node that reaches a slot without parameters (it booted after they came)
    # asks its tree parent for them with a hello (HEALTH, phase REPAIR); the parent
    # answers with the PARAMS it cached (phase REPAIR: not a wave's), or, holding none
    # itself, asks its own parent and answers once repaired; the edge answers the cell it
    # is linked to with the ones it sent. One message each way per link, where a flood
    # would reach every node: Trickle's polite repair (RFC 6206).
    def began(self, slot: int) -> bool:
        """Is this node in the wave of `slot`, or a later one, on its cached parameters'
        edge session (started by its clock, or by that slot's PARAMS and BATCH)?"""
        wave, cached = self.wave, self.cached
        return wave is not None and cached is not None and wave.session == cached.session \
            and not newer(slot & 0xFFFFFFFF, wave.step)

    def _ask_for_params(self, slot: int) -> list[Message]:
        """The hello that asks for parameters, once per slot."""
        up = self.plan.health_to if self.cell in self.spec.topology.members else None
        if up is None or self.pending_slot == slot:
            return []
        self.pending_slot = slot
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        own = self.cell[0] * self.spec.model.cols + self.cell[1] + 1
        return [make(Kind.HEALTH, self.mesh_id, slot & 0xFFFFFFFF, self.cell, up,
                     np.array([-own], np.int32), phase=REPAIR, seq=self.seq)]

    def _answer_repair(self, message: Message) -> list[Message]:
        """A tree child's hello asking for parameters: this node's cached PARAMS; when it
        holds none, the child waits for this node's own repair (`_take_repair`)."""
        h = message.header
        own = h.src[0] * self.spec.model.cols + h.src[1] + 1
        if h.src not in self.children or h.dst != self.cell or h.mesh != self.mesh_id or \
                message.payload.shape != (1,) or message.payload[0] != -own:
            self.stats["rejected:bad_health"] += 1
            return []
        if self.cached is None:
            self.asking.add(h.src)
            return []
        return self._repairs([h.src])

    def _repairs(self, children: list[Cell]) -> list[Message]:
        """The cached PARAMS, to each of `children` alone."""
        cached, out = self.cached, []
        assert cached is not None
        for child in children:
            self.stats["params_repairs_sent"] += 1
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            out.append(make(Kind.PARAMS, self.mesh_id, cached.step, self.cell, child,
                            cached.payload, phase=REPAIR, seq=self.seq,
                            session=cached.session))
        return out

    def _take_repair(self, message: Message, now: float) -> list[Message]:
        """PARAMS of a repair from the tree parent, asked for and still missing: cached,
        then the children that asked meanwhile answered and the waiting slot started.
        Parameters of another plan than this node's are not taken (the edge's next
        flood brings that plan), nor those of an edge session older than the newest this
        node has seen: a neighbour's login may replay an earlier edge run's parameters,
        which still carry a valid signature."""
        h, payload = message.header, message.payload
        if h.src != self.parent or h.dst != self.cell or h.mesh != self.mesh_id or \
                h.dtype != FLOAT32 or not self._params_shaped(payload) or \
                not compute.all_positive(payload[self.layout.std]) or \
                not _scales_valid(payload[self.layout.scales]) or \
                not self._act_scales_valid(payload) or \
                not self._of_this_plan(payload):
            self.stats["rejected:bad_params"] += 1
            return []
        if h.session in self.sessions and h.session != self.sessions[-1]:
            self.stats["rejected:stale_repair"] += 1
            return []
        if self.pending_slot is None or self.cached is not None:
            # Not asked for, or a flood brought the parameters first.
            self.stats["rejected:unasked_repair"] += 1
            return []
        self.cached = CachedParams(h.session, h.step, payload, payload[:self.params_size])
        self.stats["params_repaired"] += 1
        slot = self.pending_slot
        return self._repaired() + self.begin_slot(slot, now)

    def _repaired(self) -> list[Message]:
        """The parameters are in: answer the children that asked for them, and ask no
        more."""
        out = self._repairs(sorted(self.asking))
        self.asking.clear()
        self.pending_slot = None
        return out

    def _act_scales_valid(self, payload: np.ndarray) -> bool:
        """Under int8-static, PARAMS' activation scales are finite and positive."""
        return not isinstance(self.activation_codec, StaticCodes) or \
            valid_act_scales(payload[self.layout.act_scales])

    def _of_this_plan(self, payload: np.ndarray) -> bool:
        """Do PARAMS say this node's plan (no tail: the configured one)?"""
        spec = self.spec
        if payload.size == self.params_size:
            return spec.plan_key == (spec.home or spec.edge_at, frozenset())
        tail = PlanTail.read(payload[self.params_size:], spec.model.rows, spec.model.cols)
        return tail is not None and (tail.edge_at, tail.dead) == spec.plan_key

    def takes_control(self, params: Message, batch: Message) -> bool:
        """Would this node take `params` and `batch` as a wave's PARAMS and BATCH, by their
        dtypes, shapes and values (`_store_params`, `_store_batch`; a live slot's
        readings aside)? The compiled dispatch asks before it runs a wave without the
        machines (sim/compiled.py)."""
        return self._params_valid(params) and self._batch_valid(batch)

    def _params_valid(self, message: Message) -> bool:
        h, payload = message.header, message.payload
        return h.dtype == FLOAT32 and self._params_shaped(payload) and \
            compute.all_positive(payload[self.layout.std]) and \
            _scales_valid(payload[self.layout.scales]) and self._act_scales_valid(payload)

    def _batch_valid(self, message: Message) -> bool:
        return message.header.dtype == INT32 and self._valid_batch(message.payload)

    def keep_params(self, session: int, step: int, payload: np.ndarray) -> None:
        """Keep the PARAMS `payload` of wave `step` of edge session `session` for the
        scheduled slots to come: the last parameters this node had (a wave it started,
        or one the compiled dispatch ran for it: sim/compiled.py). Asks for parameters
        this flood overtook are void: the children that asked get the flood too (from
        this node down the tree, or from the edge's broadcast), so none is answered and
        none waits."""
        self.cached = CachedParams(session, step, payload, payload[:self.params_size])
        self.asking.clear()
        self.pending_slot = None

    def ran_compiled(self, wave: Wave) -> None:
        """`wave` ran for this cell in the compiled dispatch (sim/compiled.py), without
        this machine: from now on it is this node's current wave, over (DONE), every
        message of it taken (a copy that comes late is a duplicate), its lifecycle moved
        by the table once for every node (`compiled_wave`). The messages it took the
        dispatch counts (`count_accepted`)."""
        if wave.session not in self.sessions:
            self.sessions.append(wave.session)
        self.wave = wave

    def count_accepted(self, messages: int) -> None:
        """Count `messages` taken in compiled waves as this machine counts its own."""
        self.stats["accepted"] += messages

    def wave_flops(self, training: bool, batch: int) -> int:
        """The operations this machine counts in an exact wave of its plan (`_run_ready`:
        each computation's `work`, a training wave's too; `_start_wave`: its readings
        normalized): what a compiled wave ran for it (`count_flops`)."""
        per_sample, per_wave = 2 * self.spec.model.in_channels, 0
        for train_only, send, _, _, work in self.jobs:
            if send is None and (training or not train_only):
                per_sample += work.per_sample
                per_wave += work.per_wave
        return per_sample * batch + per_wave

    def count_flops(self, flops: int) -> None:
        """Count the operations of compiled waves as this machine counts its own."""
        self.flops += flops

    def _store_params(self, wave: Wave, message: Message, expect: Expect) -> bool:
        """PARAMS (from the tree parent or the edge) into `wave`, if they are valid."""
        if not self._params_valid(message):
            self.stats["rejected:bad_params"] += 1
            return False
        payload = message.payload
        wave.params_payload, wave.params_vector = payload, payload[:self.params_size]
        return True

    def _store_batch(self, wave: Wave, message: Message, expect: Expect) -> bool:
        """BATCH (from the tree parent or the edge) into `wave`, if it is valid and this
        sensor has readings for its samples."""
        if not self._batch_valid(message):
            self.stats["rejected:bad_batch"] += 1
            return False
        payload = message.payload
        _, split, indices, _ = BatchOrder.read(payload)
        if split == Split.LIVE and not np.isfinite(self.readings[split][:, indices]).all():
            # The sensor gave nothing usable for that slot: never send a made-up
            # number; the wave cannot finish and the edge reports the slot.
            self.stats["rejected:no_reading"] += 1
            return False
        wave.batch_payload = payload
        return True

    def _add_reduce(self, wave: Wave, message: Message, expect: Expect) -> bool:
        """A child's REDUCE into a started training wave; before the wave's BATCH it is
        kept for later."""
        h, payload = message.header, message.payload
        if wave.phase is NodePhase.AWAITING_CONTROL:  # before its BATCH: wait for it
            self._buffer(message, expect, "buffered_early")
            return False
        if not wave.training:
            self.stats["rejected:unexpected"] += 1
            return False
        values = read_or_count(lambda: self.spec.read_reduce(h, payload), self.stats,
                               "rejected:bad_reduce")
        if values is None:
            return False
        self.flops += self.spec.reduce_operations // 2  # the decoding
        wave.reduce[h.src] = values
        self._arrived(wave, expect.waiters)
        return True

    def _take_items(self, wave: Wave, message: Message, expect: Expect,
                    now: float) -> list[Message]:
        """A neighbour's items for the current wave: stored in their slots, and what they
        complete runs (kept for later if the wave has not started yet)."""
        if wave.phase is NodePhase.AWAITING_CONTROL:  # before its BATCH: wait for it
            return self._buffer(message, expect, "buffered_early")
        if wave.seen[expect.index]:
            if wave.seen[expect.index] == FILLED_IN:
                # Too late for this wave, but a delta HALO still moves what this node
                # holds of its sender's strip: the sender's next delta is against it.
                # One refused is not taken as come: a good copy may follow.
                if self._is_delta(wave, message) and \
                        self._decode_delta(wave, message, expect) is None:
                    return []
                return self.effort.late(wave, expect, now)
            self.stats["duplicates"] += 1
            return []
        if expect.train_only and not wave.training:
            self.stats["rejected:unexpected"] += 1
            return []
        payload = message.payload
        h = message.header
        if self._is_delta(wave, message):
            payload = self._decode_delta(wave, message, expect)
            if payload is None:
                return []
        else:
            shape = (expect.rows, expect.channels, wave.batch)
            payload = read_or_count(
                lambda: read_activations(self.activation_codec, h, message.payload, shape,
                                         wave.params_vector[self.layout.act_scales]),
                self.stats, "rejected:bad_shape")
            if payload is None:
                return []
        wave.seen[expect.index] = RECEIVED
        self.stats["accepted"] += 1
        if wave.holding and expect.train_only:  # the first gradient: is its memory free?
            if wave.forward_left:
                wave.held.append((expect, payload))  # not yet: this node still reads it
                return []
            self._take_shared_memory(wave)
        wave.buffers[expect.buffer][expect.slots] = payload
        if wave.timing:
            self.effort.took(wave, expect, now)
        self._arrived(wave, expect.waiters)
        out: list[Message] = []
        if wave.ready:
            self._run_ready(wave, now, out)
        return out

    def _take_shared_memory(self, wave: Wave) -> None:
        """The wave's first gradient is to be written (a message, or a backward task),
        its forward tasks done: gradients go over the forward values they share memory
        with, unless a payload this node sent still views them (a receiver keeps it, a
        link layer may resend it). In an honest wave every forward message was taken
        long before a gradient comes; else, for this wave, the gradients get memory of
        their own."""
        wave.holding = False
        if self._lent_out():
            self.stats["gradients_unshared"] += 1
            for index in self._memory.later:  # type: ignore[union-attr]
                self._storage[index] = np.empty_like(self._storage[index])
            self._storage_key = ()  # the next wave lays its memory out afresh

    def _lent_out(self) -> bool:
        """Does a payload this node lent from its buffers (`_lend`) still live: sent
        and in flight, or kept by a receiver? (Those gone are forgotten here.)"""
        lent = self._lent
        lent[:] = [ref for ref in lent if ref() is not None]
        return bool(lent)

    def _release(self, wave: Wave) -> None:
        """This node's forward tasks are done: take the gradients that came before, and
        run the backward tasks that were ready before (a cell no routed gradient
        reaches computes its dz_top from zeros as soon as its conv is done)."""
        self._take_shared_memory(wave)
        for expect, payload in wave.held:
            wave.buffers[expect.buffer][expect.slots] = payload
            self._arrived(wave, expect.waiters)
        wave.held.clear()
        wave.ready.extend(wave.deferred)
        wave.deferred.clear()

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
            if h.dtype == BYTES and self.delta_in is not None and h.kind == Kind.HALO:
                return len(shape) == 1  # its rows are known once its wave has started
            if h.dtype == BYTES and self.activation_codec is not None and \
                    h.kind in FORWARD_KINDS and len(shape) == 1:
                return self._compressed_batch(shape[0], expect, h) is not None
            return h.dtype == FLOAT32 and len(shape) == 3 and \
                shape[:2] == (expect.rows, expect.channels) and \
                1 <= shape[2] <= self.spec.max_batch
        if expect.role == Role.PARTIAL_GRADIENTS:
            summed = self.spec.reduce_sum
            if summed is not None:  # its size depends on its values, up to a bound
                cells = self.spec.topology.subtree_sizes.get(h.src, 0)
                return h.dtype == BYTES and len(shape) == 1 and \
                    shape[0] <= summed.max_nbytes(cells)
            codec = self.spec.reduce_codec
            if codec is not None:
                return h.dtype == BYTES and shape == (codec.nbytes,)
            return h.dtype == FLOAT32 and shape == (self.spec.reduce_size,)
        if expect.role == Role.SAMPLES:
            return h.dtype == INT32 and len(shape) == 1 and \
                BATCH_HEAD < shape[0] <= self.spec.max_batch_values
        return h.dtype == FLOAT32 and self._params_shaped(message.payload)

    def _compressed_batch(self, size: int, expect: Expect, h: Header) -> int | None:
        """The batch whose compressed activations for `expect` take `size` bytes, if
        one within the mesh's limits does (their size is linear in the batch)."""
        assert self.activation_codec is not None
        one = activation_bytes(self.activation_codec, (expect.rows, expect.channels, 1),
                               h.kind, h.layer)
        per_sample = activation_bytes(self.activation_codec,
                                      (expect.rows, expect.channels, 2), h.kind,
                                      h.layer) - one
        batch, rest = divmod(size - one + per_sample, per_sample)
        return batch if rest == 0 and 1 <= batch <= self.spec.max_batch else None

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

    def _valid_batch(self, payload: np.ndarray) -> bool:
        # No more samples than the messages of a wave can carry: a forged BATCH of
        # 100,000 indices would otherwise make every node allocate for them.
        if payload.ndim != 1 or \
                not BATCH_HEAD < payload.size <= self.spec.max_batch_values:
            return False
        order = BatchOrder.read(payload)
        mode, split, indices = order.mode, order.split, order.indices
        if mode not in (Mode.TRAIN, Mode.INFER) or split not in self.readings or \
                not 0 < indices.size <= self.spec.max_batch:
            return False
        if mode == Mode.TRAIN and isinstance(self.activation_codec, StaticCodes):
            return False  # int8-static is inference only: training runs in float32
        return order.valid_failout(self.spec.model.rows * self.spec.model.cols) and \
            compute.indices_within(indices, self.readings[split].shape[1])

    def _start_wave(self, wave: Wave, out: list[Message], now: float) -> None:
        """PARAMS and BATCH both in: the wave's mode, weights and buffers; the HEALTH
        report of the last wave judged; PARAMS and BATCH on to the tree children; and
        this cell's own normalized readings, the first source of its tasks."""
        payload = wave.batch_payload
        mode, split, indices, failout = BatchOrder.read(payload)
        wave.mode = MODES[mode]
        # Failout: this cell acts dead in this training wave (`execute.run_task`).
        wave.failed_out = bool(failout.size) and self.number in failout
        wave.training = wave.mode == Mode.TRAIN
        self._move(wave, NodeEvent.STARTED)
        wave.batch = len(indices)
        wave.started_at = now
        self.effort.start(wave, now, out)  # best effort: HEALTH report, deadlines
        params = wave.params_vector
        for layer, where in self.layout.layers.items():
            wave.weights[layer] = params[where.weight].reshape(where.kernel_shape)
            wave.biases[layer] = params[where.bias]
        self._field_buffers(wave)
        wave.columns = self.position_columns(split, indices)
        if wave.training:
            wave.grad = np.empty(self.spec.reduce_size, np.float32)
        if not wave.scheduled:
            self.keep_params(wave.session, wave.step, wave.params_payload)
            for send in self.plan.forwards:  # PARAMS and BATCH on to the tree children
                body = wave.params_payload if send.kind == Kind.PARAMS else payload
                out.append(self._message(wave, send.kind, send.dst, body))
        buffer, slot, waiting = self.plan.input  # (`Program.input`, `Program.started`)
        scales = params[self.layout.act_scales]  # int8-static's, else none
        execute.start_input(self.readings[split], indices, params[self.layout.mean],
                            params[self.layout.std], wave.failed_out,
                            float(scales[0]) if scales.size else 0.0,
                            wave.buffers[buffer][slot])
        self.flops += 2 * self.spec.model.in_channels * wave.batch  # (x - mean) / std
        self._arrived(wave, waiting)

    def position_columns(self, split: int, indices: np.ndarray) -> np.ndarray | None:
        """With a position bias, the column of its table this cell reads for each map of
        the wave: its own number, or for a mirrored training map (`originals`) the cell
        its mirror puts here, as the central model flips the table with the map
        (`cnn.oriented_position`). None without a table."""
        if self.layout.position.stop == self.layout.position.start:
            return None
        return self.mirrored_columns(split, indices, np.array([self.number]))[0]

    def mirrored_columns(self, split: int, indices: np.ndarray,
                         numbers: np.ndarray) -> np.ndarray:
        """(len(numbers), batch): `position_columns` of the cells `numbers` whose
        readings are laid out as this node's (the compiled dispatch's nodes, all at
        once). The executor reads the table at them unchecked: each is a cell of the
        grid by construction (`augment.mirror_cells`), and checked here all the same."""
        model = self.spec.model
        originals = self.originals if split == Split.TRAIN else None
        orientation = mirror_orientations(indices, originals)
        if orientation.size and not (orientation.min() >= 0 and
                                     orientation.max() < len(FLIPS)):  # (BATCH indices
            # are held within the readings, 4 x originals: never, but unchecked columns
            # would index past the table)
            raise MeshdlError(f"a training sample past the {len(FLIPS)} mirrors of "
                              f"{originals} maps")
        columns = mirror_cells(numbers, model.rows, model.cols)[orientation].T
        if columns.size and not (columns.min() >= 0 and
                                 columns.max() < model.rows * model.cols):
            raise MeshdlError("a position bias column outside the grid")
        return np.ascontiguousarray(columns)

    def _field_buffers(self, wave: Wave) -> None:
        """A wave's field buffers (and kept activations), laid out by the memory plan of
        its mode (nodes/memory.py). The last wave's again, unless a view of them still
        lives outside this node (a sent payload in flight, or kept by a receiver that
        has not started that wave) or the batch size or the plan changed. Reuse matters:
        allocating and freeing them for every wave of every node costs about 8 % of a
        wave."""
        memory = self.plan.memory(wave.mode, self.effort.policy is None) if self.memory_plan \
            else self.plan.unplanned
        key = (wave.batch, memory)
        if key != self._storage_key or self._lent_out():
            arenas = [np.empty((*shape, wave.batch), np.float32) for shape in memory.arenas]
            self._owned = [arenas[k][first:first + slots] for (k, first), (slots, _) in
                           zip(memory.places, memory.arrays, strict=True)]
            self._lent.clear()  # (they view the arrays of before)
            self._storage = [None if index is None else self._owned[index]  # type: ignore[misc]
                             for index in memory.fields]
            self._kept = [None if index is None else self._owned[index]  # (1, channels, batch)
                          for index in memory.kept]
            self._storage_key = key
        self._memory = memory
        wave.buffers, wave.kept = self._storage, self._kept
        wave.by_input_cell = memory.by_input_cell
        wave.forward_left = self.plan.active[Mode.INFER]  # the tasks of every wave
        wave.holding = memory.shares and wave.forward_left > 0
        if wave.training and wave.forward_left == 0:  # (a cell without forward tasks)
            self._move(wave, NodeEvent.FORWARD_DONE)

    def record(self, split: int, index: int, values: np.ndarray | float | None) -> None:
        """Store this sensor's reading(s) of one sample (a live time slot), or NaN for a
        reading that failed."""
        column = self.readings[split][:, index]
        column[...] = np.nan if values is None else values

    # ---------------------------------------------------------------- progress
    def _move(self, wave: Wave, event: NodeEvent) -> None:
        """The one way a wave changes phase: by `event`, as NODE_TRANSITIONS allows
        (else `IllegalTransition`)."""
        wave.phase = next_node_phase(wave.phase, event)

    def _arrived(self, wave: Wave, waiters: tuple[int, ...]) -> None:
        """A source came: `waiters` are the tasks that waited for it."""
        missing = wave.missing
        for task in waiters:
            missing[task] -= 1
            if missing[task] == 0:
                wave.ready.append(task)

    def _run_ready(self, wave: Wave, now: float, out: list[Message]) -> None:
        """Run every task whose sources have arrived (running one may ready others)."""
        if wave.phase is NodePhase.AWAITING_CONTROL:
            return
        jobs, buffers, training, ready = self.jobs, wave.buffers, wave.training, wave.ready
        mesh, step, session, cell = self.mesh_id, wave.step, wave.session, self.cell
        done, run = wave.done, run_computation
        while ready:
            task = ready.pop()
            train_only, send, operation, stage, work = jobs[task]
            if train_only and not training:
                continue
            if train_only and wave.holding:  # its writes may land on memory still read
                if wave.forward_left:
                    wave.deferred.append(task)
                    continue
                self._take_shared_memory(wave)
            done[task] = 1
            if send is None:
                run(self, wave, operation, out)  # `steps.run`
                wave.finished_at[stage] = now
                self.flops += work.per_sample * wave.batch + work.per_wave
            else:
                kind, dst, buffer, rows, layer, phase = send
                self.seq = (self.seq + 1) & 0xFFFFFFFF
                values, dtype = buffers[buffer][rows], FLOAT32
                if self.delta_out is not None and kind == Kind.HALO and not training:
                    values = self.delta_out.encode((kind, layer, phase, dst), values,
                                                   self._delta_rows(wave, kind, layer))
                    dtype = BYTES
                elif self.activation_codec is not None and kind in FORWARD_KINDS:
                    values = encode_activations(self.activation_codec, values,
                                                wave.params_vector[self.layout.act_scales],
                                                kind, layer)
                    dtype = BYTES
                elif type(rows) is slice:  # a view of the buffer: lent (`_lend`)
                    values = _lend(values, self._lent)
                out.append(seal(kind, mesh, step, cell, dst, values, layer, phase, self.seq,
                                dtype, session))
            wave.tasks_done += 1
            if not train_only:
                wave.forward_left -= 1
                if wave.forward_left == 0:
                    if training:
                        self._move(wave, NodeEvent.FORWARD_DONE)
                    if wave.held or wave.deferred:
                        self._release(wave)
        if wave.tasks_done == self.plan.active[wave.mode]:
            if wave.phase is not NodePhase.DONE:
                self._move(wave, NodeEvent.FINISHED)
            wave.finished_at.setdefault("finished", now)
            if wave.learnt is not None:
                self.effort.learnt(wave)
            out.extend(self.effort.finished(wave, now))  # best effort: silence, at once

    def _is_delta(self, wave: Wave, message: Message) -> bool:
        """Does `message` carry a delta HALO (nodes/delta.py)? Inference waves only."""
        h = message.header
        return h.dtype == BYTES and self.delta_in is not None and h.kind == Kind.HALO and \
            not wave.training

    def _decode_delta(self, wave: Wave, message: Message, expect: Expect
                      ) -> np.ndarray | None:
        """The values a delta HALO brings, applied to what this node holds of its
        sender's strip; None (counted as bad_delta) if it is not a well-formed one for
        this wave, or a delta with nothing to apply it to."""
        h = message.header
        assert self.delta_in is not None
        values = self.delta_in.decode((h.kind, h.layer, h.phase, h.src), message.payload,
                                      (expect.rows, expect.channels, wave.batch),
                                      self._delta_rows(wave, h.kind, h.layer))
        if values is None:
            self.stats["rejected:bad_delta"] += 1
        return values

    def _delta_rows(self, wave: Wave, kind: Kind, layer: int) -> RowForm:
        """How a delta HALO carries its rows' values: under int8-static the codes a
        whole HALO carries (exact: its values were quantized where they were made),
        else float32 (a lossy codec's rounding would part sender and receiver)."""
        if isinstance(self.activation_codec, StaticCodes):
            assert wave.params_vector is not None  # (a wave starts with its PARAMS)
            return CodedRows(self.activation_codec,
                             wave.params_vector[self.layout.act_scales], kind, layer)
        return FLOAT32_ROWS

    def _finished(self, wave: Wave) -> bool:
        return wave.phase is NodePhase.DONE

    # ------------------------------------------------------------ computation
    # (the steps themselves: nodes/execute.py, run through nodes/steps.py)
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


def compiled_wave(mode: Mode, batch: int, plans: list[NodePlan]) -> Wave:
    """A wave of `mode` and `batch` the compiled dispatch runs for the nodes of `plans`,
    as their machines see it once it is over (`NodeMachine.ran_compiled`): its
    lifecycle moved by the table through a whole wave's events (`node_wave_events`),
    every message of every inbox taken and every task run. One such wave stands for
    every node's, and for every wave of its mode and batch (`Wave.renumber`): none of
    them reads its buffers, it is over."""
    wave = Wave(0, 0, plans[0])
    wave.mode, wave.training, wave.batch = mode, mode == Mode.TRAIN, batch
    wave.phase = node_phase_after(node_wave_events(wave.training))
    wave.seen = bytearray([RECEIVED]) * max(len(plan.inbox) for plan in plans)
    wave.done = bytearray([1]) * max(len(plan.tasks) for plan in plans)
    return wave


def _lend(view: np.ndarray, lent: list[weakref.ref[np.ndarray]]) -> np.ndarray:
    """`view` (of a node's buffer) as a payload to send, noted in `lent`: in process the
    receiver gets this very array, and may keep it, or views of it, for a while. The
    payload is made over a memoryview of `view`, so that it is the base of every view
    taken of it (numpy collapses a view's base to the first array that owns its memory
    or stands on another object): while any of them lives, so does the payload, and its
    weak reference in `lent` says so, on any Python (a lazy collector only keeps
    buffers apart for longer)."""
    payload = np.asarray(memoryview(view))
    lent.append(weakref.ref(payload))
    return payload


def _scales_valid(scales: np.ndarray) -> bool:
    """Sum scales (intsum) are finite and not negative (0: no scale yet)."""
    return bool(np.all(np.isfinite(scales)) and np.all(scales >= 0.0))


# `NodeMachine.handle`'s dispatch, by message kind (one dict lookup on the slow path).
_HANDLERS: dict[Kind, Callable[[NodeMachine, Message, Expect | None, float], list[Message]]] = {
    Kind.PARAMS: NodeMachine._on_params,
    Kind.BATCH: NodeMachine._on_batch,
    Kind.REDUCE: NodeMachine._on_reduce,
    Kind.HEALTH: NodeMachine._on_health,
    **dict.fromkeys((Kind.HALO, Kind.POOL, Kind.GATHER, Kind.SCATTER, Kind.ROUTE,
                     Kind.GRAD_HALO), NodeMachine._on_items),
}
_ON_OTHER = NodeMachine._on_items  # PUSH, WEIGHTS, unknown: never planned for a node
