"""The edge as a sans-I/O state machine: it starts waves and runs the network's head.

The edge is linked to one border cell (`edge_at`). For each wave it sends the conv
parameters and the batch (which samples, which split) into the mesh, receives the
pooled features gathered up the tree, runs fc1 -> ReLU -> fc2, and then either reports
the logits (inference) or computes the loss, sends d(loss)/d(pooled) back down and
waits for the summed conv-parameter gradients (training). Applying the optimizer is the
caller's job (the training loop runs at the edge), so that every mode shares one loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from meshdl.compress.codec import read_or_count
from meshdl.compress.intsum import SharedScales
from meshdl.data.datasets import check_label_range
from meshdl.errors import MeshdlError, StepSkipped, UsageError
from meshdl.model import kernels
from meshdl.model.cnn import CNN, Trace
from meshdl.protocol.activations import StaticCodes, read_activations
from meshdl.protocol.deadlines import (
    EDGE_SILENT_WAVES,
    GATHER_ENTRY,
    REDUCE_ENTRY,
    Arrivals,
    Learning,
    Margins,
    Policy,
)
from meshdl.protocol.lifecycle import (
    FINISHED,
    GAVE_UP_GATHER,
    GAVE_UP_REDUCE,
    HEAD_RAN,
    UNDER_WAY,
    EdgeEvent,
    EdgePhase,
    next_edge_phase,
)
from meshdl.protocol.messages import EDGE, Header, Kind, Message, make, newer
from meshdl.protocol.payloads import NO_CELLS, REPAIR, BatchOrder, PlanTail, health_entries
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.protocol.topology import Cell
from meshdl.protocol.work import head_work

# A wave still making progress is restarted anyway once it is this many wave timeouts
# old: its idle timeout alone would let a trickle of messages hold it for ever.
WAVE_CAP_TIMEOUTS = 3


@dataclass
class WaveResult:
    """What one finished wave gives the caller."""

    step: int
    mode: Mode
    logits: np.ndarray  # (B, classes)
    loss: float | None = None  # training waves
    grads: np.ndarray | None = None  # flat gradient of all parameters, training waves
    # Best effort: no pooled features came in time, so there is nothing to learn from
    # (training waves; the loop applies no update).
    skipped: bool = False


class WaveEngine:
    """The training loop's `Engine` for a mesh, whatever carries its messages: every
    batch is one wave of an `EdgeMachine`. Subclasses say how a wave runs (`_run`)."""

    def _run(self, model: CNN, mode: Mode, split: Split, indices: np.ndarray,
             failout: np.ndarray | None = None) -> WaveResult:
        raise NotImplementedError

    def spec_for(self, model: CNN) -> MeshSpec:
        """The mesh `model` runs in."""
        raise NotImplementedError

    def loss_and_grads(self, model: CNN, indices: np.ndarray,
                       failout: np.ndarray | None = None
                       ) -> tuple[float, np.ndarray, np.ndarray]:
        spec = self.spec_for(model)
        if len(indices) > spec.max_batch:  # one step is one wave: it cannot be cut
            raise UsageError(
                f"a training batch of {len(indices)} samples needs messages above the "
                f"mesh's max_message_bytes ({spec.max_message_bytes}): at most "
                f"{spec.max_batch} samples fit (lower --batch or raise the limit)")
        result = self._run(model, Mode.TRAIN, Split.TRAIN, indices, failout)
        if result.skipped:
            raise StepSkipped(f"wave {result.step}: no pooled features by the deadline")
        return result.loss, result.logits, result.grads

    def logits(self, model: CNN, split: str, indices: np.ndarray) -> np.ndarray:
        """Inference on `indices`, in as many waves as the message size limit needs."""
        which = Split.TRAIN if split == "train" else Split.TEST
        most = self.spec_for(model).max_batch
        return np.concatenate([  # copies: a wave's result may live in reused buffers
            self._run(model, Mode.INFER, which, indices[i:i + most]).logits.copy()
            for i in range(0, len(indices), most)])


class EdgeMachine:
    """The edge of one mesh, holding the model whose head it runs. Its wave moves
    through the phases of meshdl/protocol/lifecycle.py, only by `_move`."""

    def __init__(self, spec: MeshSpec, model: CNN, labels: dict[int, np.ndarray],
                 first_step: int = 1, wave_timeout: float | None = None,
                 session: int = 0, wave_cap: float | None = None,
                 memory_plan: bool = True) -> None:
        """`first_step` numbers the first wave; `session` (u16) names this edge run in
        every message of its waves: nodes follow the PARAMS of another session whatever
        its step, so an edge that restarts with a new session takes its mesh back even
        below its predecessor's steps. A wave that hears nothing of its own for
        `wave_timeout` (since its start or its GATHER), or is `wave_cap` old (default
        WAVE_CAP_TIMEOUTS timeouts), is restarted by `tick`. `memory_plan`: the head's
        backward writes each input gradient over its dead input (`CNN.head_backward`);
        False only to measure it (`meshdl bench memory`) or to test without it."""
        self.spec = spec
        self.memory_plan = memory_plan
        self.model = model
        # Checked once here, before any wave (over MQTT: before connecting): the loss
        # kernel indexes the logits with each label of a batch.
        for split, y in labels.items():
            check_label_range(y, model.config.classes, f"y_{Split(split).name.lower()}",
                              "the edge's labels")
        self.labels = labels
        self.step = (first_step - 1) & 0xFFFFFFFF
        self.session = session
        self.batch = 0  # samples in the current wave
        self.wave_timeout = wave_timeout
        self.wave_cap = wave_cap if wave_cap is not None or wave_timeout is None else \
            WAVE_CAP_TIMEOUTS * wave_timeout
        self.started_at = 0.0
        self.heard_at = 0.0  # the current wave's start or its last message
        self.attempts = 0  # of the current request: 1, then 2, ... after each restart
        self.phase = EdgePhase.IDLE
        self.event: EdgeEvent | None = None  # the one that moved it there
        self._request: BatchOrder | None = None
        self.mode: Mode | None = None
        self.batch_labels: np.ndarray | None = None
        self.trace: Trace | None = None  # set once the head ran (phases HEAD_RAN)
        self.logits: np.ndarray | None = None
        self.loss: float | None = None
        self._result: WaveResult | None = None
        self._adopt(spec)
        # Dead cells (best effort): reported, back, and the cells the edge can attach
        # to, in order of preference; off unless `watch_health`.
        self.watch_health = False
        self.suspects: set[Cell] = set()
        self.comebacks: set[Cell] = set()
        self.attach_options: tuple[Cell, ...] = (spec.edge_at,)
        self.heard_from_mesh, self.silent_waves = True, 0
        self._weighed = False
        # The edge's own view of which configured cells are down (`view_down`): those
        # nobody answered for at commissioning, those whose node host's last will came.
        self.viewed_down: frozenset[Cell] = frozenset()
        self.plan_since = first_step & 0xFFFFFFFF  # the first wave of the current plan
        self.stats: Counter[str] = Counter()
        self.seq = 0
        # The last PARAMS sent (scheduled slots, and their repair): the parameters, the
        # whole payload (the plan's tail too) and the wave's step.
        self.sent_params: np.ndarray | None = None
        self.sent_payload: np.ndarray | None = None
        self.sent_step = 0
        self.sent_plan = spec.plan_key  # the plan the last PARAMS carried
        self.repaired_step: int | None = None  # the slot of the last repair answered
        # Floating-point operations of the head so far (simulated time's CPU time).
        self.flops = 0
        # Under intsum (compress/intsum.py): the scales it sends with PARAMS, learnt
        # from each REDUCE, and those of the current wave, which its REDUCE is in.
        summed = spec.reduce_sum
        self.sum_scales = None if summed is None else SharedScales(summed)
        self.wave_scales = np.zeros(0, np.float32)
        # Best effort (meshdl/protocol/deadlines.py): None waits for the mesh (exact); else the
        # GATHER's and REDUCE's arrival times per (mode, batch), and the current wave's
        # deadlines (from its start; from its SCATTER).
        self.policy: Policy | None = None
        self.arrivals: dict[tuple, Arrivals] = {}  # by (plan, mode, batch)
        self.due_gather = self.due_reduce = 0.0
        self.backward_at = 0.0  # when this wave's SCATTER went
        self.last_level: dict[tuple[int, int], np.ndarray] = {}  # "last": block -> (h,)
        self._timed: Arrivals | None = None  # the current wave's kind's arrival times
        self.learning: Learning | None = None  # deadlines from a first wave, waited out
        self._learnt: dict[int, float] | None = None

    def _move(self, event: EdgeEvent) -> None:
        """The one way the wave changes phase: by `event`, as EDGE_TRANSITIONS allows
        (else `IllegalTransition`)."""
        self.phase = next_edge_phase(self.phase, event)
        self.event = event

    @property
    def result(self) -> WaveResult | None:
        """The current wave's result once it is DONE or SKIPPED, else None."""
        return self._result if self.phase in FINISHED else None

    @property
    def _gave_up(self) -> Kind | None:
        """What the current wave gave up waiting for (it times the late copy)."""
        return Kind.GATHER if self.event in GAVE_UP_GATHER else \
            Kind.REDUCE if self.event in GAVE_UP_REDUCE else None

    def _adopt(self, spec: MeshSpec) -> None:
        """Run the waves in `spec`'s mesh (its PARAMS say which, when it is not the
        configured one): which blocks its GATHER brings, which it never can."""
        self.spec = spec
        # Under global pooling one item comes, the whole mesh's maxima: the one feature
        # "block" (0, 0).
        self.gather_blocks = [(0, 0)] if spec.model.global_pool else \
            spec.topology.tree_blocks(spec.edge_at)
        # Blocks without a live member (meshdl/protocol/topology.py): no features come for them;
        # the head reads the policy's (zeros without one).
        prow, pcol = spec.model.pooled_shape
        gathered = set(self.gather_blocks)
        self.absent_blocks = [(i, j) for i in range(prow) for j in range(pcol)
                              if (i, j) not in gathered]

    def _health(self, message: Message) -> list[Message]:
        """Reports from the mesh: cells its nodes found silent (dead, or cut off behind
        a dead one) and cells that said hello (back). Weighed at the next wave."""
        h = message.header
        entries = health_entries(message.payload, self.spec.model.rows,
                                 self.spec.model.cols)
        if entries is None:
            self.stats["rejected:bad_health"] += 1
            return []
        self.heard_from_mesh = True
        if h.phase == REPAIR:  # only the cell it is linked to asks the edge, for itself
            if entries != [(self.spec.edge_at, True)]:
                self.stats["rejected:bad_health"] += 1
                return []
            return self._repair(h)
        # Silence found in a wave of an older plan says nothing of this one (a cell cut
        # off behind a dead one then has a parent now).
        current = h.session == self.session and not newer(self.plan_since, h.step)
        for cell, back in entries:
            if back:
                self.comebacks.add(cell)
            elif current:
                self.suspects.add(cell)
            else:
                self.stats["stale_health"] += 1
        self.stats["health_reports"] += 1
        return []

    def _repair(self, h: Header) -> list[Message]:
        """The cell it is linked to booted after the parameters came and asks for them
        (its HEALTH's only entry, checked by `_health`, names it: nodes/agent.py,
        "Repair"): the PARAMS it last sent, to it alone; once per slot, and not while
        they are on their way in a flood of that very slot."""
        if self.sent_payload is None or h.step in (self.repaired_step, self.sent_step):
            self.stats["repair_not_answered"] += 1
            return []
        self.repaired_step = h.step
        self.stats["params_repairs_sent"] += 1
        self.seq += 1
        return [make(Kind.PARAMS, self.spec.mesh_id, self.sent_step, EDGE, self.spec.edge_at,
                     self.sent_payload, phase=REPAIR, seq=self.seq & 0xFFFFFFFF,
                     session=self.session)]

    def weigh_health(self) -> None:
        """Before a wave (once; `_begin` does it if the transport has not): take the
        reported cells out of the plan, and those that said hello back in. Where PARAMS
        flood down the tree, a reported cell whose tree parent is reported too may only
        be cut off behind it: it is kept for now (it hears from another parent once the
        dead one is planned around, or is reported again). The edge moves to its next
        attachment cell when nothing came from its own for `EDGE_SILENT_WAVES` waves."""
        if not self.watch_health or self._weighed:
            return
        self._weighed = True
        spec, dead = self.spec, set(self.spec.dead)
        parent = spec.topology.parent
        # Down the tree, a dead cell's children hear no PARAMS either: they wait for
        # the next round (found again, or heard from once planned around it).
        dead |= {c for c in self.suspects if c != spec.edge_at and
                 (spec.params_via == "broadcast" or parent.get(c) not in self.suspects)}
        dead -= self.comebacks
        edge_at = spec.edge_at
        self.silent_waves = 0 if self.heard_from_mesh else self.silent_waves + 1
        if self.silent_waves >= EDGE_SILENT_WAVES:
            moved = [c for c in self.attach_options if c not in dead and c != edge_at]
            if moved:
                dead.add(edge_at)
                edge_at = moved[0]
                self.silent_waves = 0
                self.stats["reattached"] += 1
        self.suspects, self.comebacks, self.heard_from_mesh = set(), set(), False
        self.replan(edge_at, frozenset(dead))

    def view_down(self, cells: Iterable[Cell]) -> None:
        """The edge's own view: `cells` (of the configured grid) are down now, those it
        said before and not now are up again. A roll call at commissioning (the cells
        nobody answered for), a node host's last will or status record (over MQTT)
        tell it, not silence: no wave is waited out to find them. From the next wave
        the plan goes around them (with what HEALTH found); when the edge's own cell is
        down it attaches to the next of `attach_options` that is up."""
        cells = frozenset(cells)
        if cells == self.viewed_down:
            return
        back = self.viewed_down - cells
        self.viewed_down = cells
        self.comebacks -= cells
        dead = (set(self.spec.dead) - back) | cells
        edge_at = self.spec.edge_at
        if edge_at in dead:
            up = [c for c in self.attach_options if c not in dead]
            if not up:
                raise MeshdlError(f"the cell the edge is linked to, {edge_at}, is down, and "
                                  "so is every other it may attach to")
            edge_at = up[0]
            self.stats["reattached"] += 1
        self.stats["viewed_down"] = len(cells)
        self.replan(edge_at, frozenset(dead))

    def replan(self, edge_at: Cell, dead: frozenset[Cell]) -> None:
        """From the next wave on, the mesh without `dead` cells, the edge attached to
        `edge_at`: every node takes that plan from the PARAMS that start the wave."""
        if (edge_at, dead) != self.spec.plan_key:
            self._adopt(self.spec.replanned(edge_at, frozenset(dead)))
            self.plan_since = (self.step + 1) & 0xFFFFFFFF  # the next wave's
            self.stats["replanned"] += 1

    def start(self, mode: Mode, split: Split, indices: np.ndarray,
              now: float = 0.0, step: int | None = None,
              failout: np.ndarray | None = None) -> list[Message]:
        """Begin a new wave over samples `indices` of `split`; returns what to send.
        `step`: the wave's number (a live slot's PARAMS: the slot's); default the next.
        `failout` (training): cell numbers (row x cols + col, increasing) that act dead
        in the wave."""
        cells = NO_CELLS if failout is None else np.asarray(failout, np.int32)
        self._request, self.attempts = BatchOrder(mode, split, np.asarray(indices), cells), 0
        self._move(EdgeEvent.START)
        return self._begin(now, step)

    def start_slot(self, slot: int, now: float = 0.0) -> list[Message]:
        """Live inference on a schedule: the wave of time slot `slot`, which every node
        starts by its own clock on the parameters it cached (`NodeMachine.begin_slot`).
        Nothing goes out: the edge only waits for the slot's GATHER. Its step is the slot
        number, as the nodes number it. The nodes hold the parameters of this edge's last
        PARAMS: if the model or the plan changed since (cells found dead, or back), a
        wave with PARAMS must carry the new ones first (`start`), else `MeshdlError`."""
        self.weigh_health()  # the plan of this slot
        if self.sent_params is None or not np.array_equal(self._params(), self.sent_params):
            raise MeshdlError("the nodes do not hold this model's parameters: start a wave "
                              "with PARAMS before scheduled slots")
        if self.sent_plan != self.spec.plan_key:
            raise MeshdlError("the nodes do not hold this plan (cells went down or came "
                              "back): start a wave with PARAMS before scheduled slots")
        self._request, self.attempts = BatchOrder(Mode.INFER, Split.LIVE,
                                                  np.array([slot % LIVE_SLOTS], np.int32)), 0
        self._move(EdgeEvent.START)
        self._begin(now, slot & 0xFFFFFFFF, scheduled=True)
        return []

    def tick(self, now: float) -> list[Message]:
        """Best effort: give up on what missed its deadline. Else restart the current
        wave if nothing of it came for `wave_timeout`, or it is `wave_cap` old (messages
        were lost, say while the broker restarted): the same batch under a new step
        number, so the nodes drop what is left of the old wave. Nothing was applied for
        it: a step's gradients only leave the edge in a result. The timeout counts from
        the wave's last message, not its start: over a lossy link TCP may take long to
        deliver a wave that loses nothing, and restarting it would only start over."""
        if self.phase not in UNDER_WAY:
            return []
        if self._timed is not None:
            return self._overdue(now)
        if self.wave_timeout is None or (
                now - self.heard_at < self.wave_timeout and
                (self.wave_cap is None or now - self.started_at < self.wave_cap)):
            return []
        self.stats["restarted_waves"] += 1
        self._move(EdgeEvent.RESTART)
        return self._begin(now)

    def set_deadlines(self, policy: Policy, mode: Mode, batch: int, gather: float,
                      reduce: float | None, margins: Margins, k: float,
                      spec: MeshSpec | None = None) -> None:
        """Best effort: in waves of `mode` and `batch`, give up on the GATHER and the
        REDUCE at their deadlines, starting from when they came in a loss-free wave
        (`gather` seconds after its start, `reduce` after its SCATTER) and following
        their arrivals (meshdl/protocol/deadlines.py)."""
        self.policy = policy
        first = {GATHER_ENTRY: gather}
        if reduce is not None:
            first[REDUCE_ENTRY] = reduce
        key = (spec or self.spec).plan_key
        self.arrivals[(key, mode, batch)] = Arrivals(2, first, {REDUCE_ENTRY}, margins, k)

    def next_deadline(self) -> float | None:
        """When the current wave next gives up on something, if it will."""
        if self._timed is None or self.phase not in UNDER_WAY:
            return None
        if self.phase == EdgePhase.AWAITING_GATHER:
            return self.started_at + self.due_gather
        return self.backward_at + self.due_reduce

    def due(self, h: Header) -> float | None:
        """When the edge stops waiting for the message of header `h`, if it is of the
        current wave (a sender's radio stops recovering it then)."""
        if self._timed is None or h.step != self.step or h.session != self.session:
            return None
        if h.kind == Kind.GATHER:
            return self.started_at + self.due_gather
        if h.kind == Kind.REDUCE and self.phase in HEAD_RAN:
            return self.backward_at + self.due_reduce
        return None

    def _arrival(self, kind: Kind, now: float) -> None:
        """Best effort: one more arrival time of the GATHER or the REDUCE (learnt, in
        the first wave of a kind)."""
        index, seconds = (GATHER_ENTRY, now - self.started_at) if kind == Kind.GATHER else \
            (REDUCE_ENTRY, now - self.backward_at)
        if kind == Kind.REDUCE and self.phase not in HEAD_RAN:
            return
        if self._learnt is not None:
            self._learnt[index] = seconds
        else:
            self._timed.sample(index, seconds)

    def learn_deadlines(self, policy: Policy, learning: Learning) -> None:
        """Best effort, learning each kind of wave's first deadlines from its first
        wave, waited out whole (over MQTT: no probe to measure them)."""
        self.policy, self.learning = policy, learning

    def _learnt_wave(self) -> None:
        """A wave waited out whole: its arrival times start its kind's deadlines."""
        learnt, self._learnt = self._learnt, None
        margins = self.learning.margins(learnt.get(GATHER_ENTRY, 0.0),
                                        learnt.get(REDUCE_ENTRY, 0.0))
        self.arrivals[(self.spec.plan_key, self.mode, self.batch)] = Arrivals(
            2, learnt, {REDUCE_ENTRY}, margins, self.learning.k)

    def _overdue(self, now: float) -> list[Message]:
        """No GATHER by its deadline: a training step is skipped (its loss would be of
        made-up features); an inference wave's head runs on the policy's features
        (the last gathered level of each block, or zeros). No REDUCE by its deadline:
        the conv layers get no gradient this step, the head its own."""
        due = self.next_deadline()
        if due is None or now < due:
            return []
        if self.phase == EdgePhase.AWAITING_GATHER:
            if self.mode == Mode.TRAIN:
                self.stats["skipped_steps"] += 1
                self._result = WaveResult(self.step, Mode.TRAIN, np.empty((self.batch, 0)),
                                          skipped=True)
                self._move(EdgeEvent.GATHER_MISSED)
                return []
            self.stats["filled_in:gather"] += 1
            self._move(EdgeEvent.GATHER_FILLED)
            shape = (len(self.gather_blocks), self.spec.model.filters, self.batch)
            gathered = np.zeros(shape, np.float32)
            if self.policy == Policy.LAST:
                for row, block in enumerate(self.gather_blocks):
                    if block in self.last_level:
                        gathered[row] = self.last_level[block][:, None]
            return self._head(gathered, now)
        self.stats["filled_in:reduce"] += 1
        grads = self._take_gradients(np.zeros(self.spec.reduce_size, np.float32))
        self._result = WaveResult(self.step, Mode.TRAIN, self.logits, self.loss, grads)
        self._move(EdgeEvent.REDUCE_MISSED)
        return []

    def _take_gradients(self, reduced: np.ndarray) -> np.ndarray:
        """The model's flat gradient with the mesh's part from the root's REDUCE (the
        head's the edge computed itself): the conv layers' first, and a position bias's
        last, where the model's flat vector holds it too (`config.param_shapes`)."""
        grads, conv = self.model.grad_flat, self.spec.conv_size
        if reduced.size != self.spec.reduce_size:  # (read_reduce holds a REDUCE to it)
            raise MeshdlError(f"a reduced gradient of {reduced.size} values, not the "
                              f"mesh's {self.spec.reduce_size}")
        grads[:conv] = reduced[:conv]
        table = reduced.size - conv
        if table:
            grads[grads.size - table:] = reduced[conv:]
        return grads

    def _params(self) -> np.ndarray:
        """The PARAMS payload of the model as it is (without the plan's tail)."""
        return self.spec.params_layout.pack(self.model.flat, self.model.norm_mean,
                                            self.model.norm_std, self.wave_scales,
                                            self._act_scales(),
                                            self.model.params.get("position"))

    def _act_scales(self) -> np.ndarray | None:
        """Under int8-static, the model's calibrated activation scales (PARAMS carry
        them: nodes quantize by them and read codes with them); UsageError if it has
        none."""
        if not isinstance(self.spec.activation_codec, StaticCodes):
            return None
        return self.model.scales_for_inference()

    def _begin(self, now: float, step: int | None = None,
               scheduled: bool = False) -> list[Message]:
        """The current request's next attempt (after START or RESTART): its PARAMS and
        BATCH under a new step (or `step`); a scheduled slot's sends nothing."""
        self.weigh_health()
        self._weighed = False  # the next wave weighs what this one brings
        mode, split, indices, failout = self._request
        self.attempts += 1
        self.started_at = self.heard_at = now
        self.step = (self.step + 1) & 0xFFFFFFFF if step is None else step  # the header's u32
        self.mode, self._result, self.trace = mode, None, None
        indices = np.asarray(indices, np.int32)
        self.batch = len(indices)
        self.batch_labels = self.labels[split][indices] if mode == Mode.TRAIN else None
        # Best effort: this kind of wave's arrival times, and the deadlines they give.
        self._timed = self.arrivals.get((self.spec.plan_key, mode, self.batch)) \
            if self.policy else None
        if self._timed is None and self.learning is not None:  # from an earlier plan
            self._timed = next((old for (_, m, b), old in self.arrivals.items()
                                if (m, b) == (mode, self.batch)), None)
        self._learnt = {} if self._timed is None and self.policy is not None and \
            self.learning is not None else None
        if self._timed is not None:
            self.due_gather = self._timed.deadline(GATHER_ENTRY)
            self.due_reduce = self._timed.deadline(REDUCE_ENTRY) if mode == Mode.TRAIN else 0.0
        if scheduled:  # the nodes start it on their own
            return []
        if self.sum_scales is not None:
            self.wave_scales = self.sum_scales.scales
        params = self._params()
        self.sent_params, self.sent_step, self.sent_plan = params, self.step, \
            self.spec.plan_key
        if self.spec.planned:  # the mesh the wave runs in, for every node to plan it
            tail = PlanTail(self.spec.edge_at, self.spec.dead).pack(self.spec.model.cols)
            params = np.concatenate([params, tail])
        self.sent_payload = params
        batch = BatchOrder(mode, split, indices, failout).pack()
        # To every node at once, or into the tree at `edge_at` (`MeshSpec.relays`).
        body = {Kind.PARAMS: params, Kind.BATCH: batch}
        return [self._message(s.kind, body[s.kind], s.dst) for s in self.spec.relays[EDGE]]

    def handle(self, message: Message, now: float = 0.0) -> list[Message]:
        """Take one decoded message from the mesh; return what to send in response."""
        h, payload = message.header, message.payload
        if h.mesh != self.spec.mesh_id or h.dst != EDGE or h.src != self.spec.edge_at:
            self.stats["rejected:not_for_me"] += 1
            return []
        self.heard_from_mesh = True
        if h.kind == Kind.HEALTH:
            return self._health(message)
        if h.step != self.step or h.session != self.session or \
                self.phase not in UNDER_WAY:
            if h.kind == self._gave_up and h.step == self.step and \
                    h.session == self.session:
                self.stats["late"] += 1  # given up on already: it says how late
                self._arrival(Kind(h.kind), now)
                return []
            self.stats["stale"] += 1
            return []
        if h.kind == Kind.GATHER and self.phase == EdgePhase.AWAITING_GATHER:
            shape = (len(self.gather_blocks), self.spec.model.filters, self.batch)
            payload = read_or_count(
                lambda: read_activations(self.spec.activation_codec, h, message.payload,
                                         shape, self._act_scales()),
                self.stats, "rejected:bad_shape")
            if payload is None:
                return []
            self.stats["accepted"] += 1
            self.heard_at = max(self.heard_at, now)  # under way: the idle timeout restarts
            if self._timed is not None or self._learnt is not None:
                self._arrival(Kind.GATHER, now)
            if self.policy == Policy.LAST:
                self.last_level.update(zip(self.gather_blocks, payload.mean(axis=2),
                                           strict=True))
            self._move(EdgeEvent.GATHERED_TRAIN if self.mode == Mode.TRAIN else
                       EdgeEvent.GATHERED_INFER)
            return self._head(payload, now)
        if h.kind == Kind.REDUCE and self.phase == EdgePhase.AWAITING_REDUCE:
            payload = read_or_count(lambda: self.spec.read_reduce(h, message.payload),
                                    self.stats, "rejected:bad_shape")
            if payload is None:
                return []
            self.flops += self.spec.reduce_operations // 2  # the decoding
            if self.sum_scales is not None:  # whole numbers of this wave's scales
                share = payload
                payload = self.sum_scales.gradient(share, self.wave_scales)
                self.sum_scales.learn(share.peaks)
            self.stats["accepted"] += 1
            if self._timed is not None or self._learnt is not None:
                self._arrival(Kind.REDUCE, now)
            grads = self._take_gradients(payload)
            self._result = WaveResult(self.step, Mode.TRAIN, self.logits, self.loss, grads)
            self._move(EdgeEvent.REDUCED)
            if self._learnt is not None:
                self._learnt_wave()
            return []
        self.stats["duplicates" if h.kind in (Kind.GATHER, Kind.REDUCE) else
                   "rejected:unexpected"] += 1
        return []

    def _head(self, gathered: np.ndarray, now: float) -> list[Message]:
        """Pooled features -> logits; in training also loss and d(loss)/d(pooled).
        The caller has moved the wave on (GATHERED_*, GATHER_FILLED)."""
        filters, batch = self.spec.model.filters, gathered.shape[2]
        prow, pcol = self.spec.model.pooled_shape
        pooled = np.empty((filters, prow, pcol, batch), np.float32)
        for (i, j), values in zip(self.gather_blocks, gathered, strict=True):
            pooled[:, i, j] = values
        if self.absent_blocks:
            self._fill_absent(pooled)
        self.flops += head_work(self.spec.model, self.mode == Mode.TRAIN).at(batch)
        self.trace = self.model.head_forward(pooled)
        self.logits = np.ascontiguousarray(self.trace.logits.T)
        if self.mode == Mode.INFER:
            self._result = WaveResult(self.step, Mode.INFER, self.logits)
            if self._learnt is not None:
                self._learnt_wave()
            return []
        dlogits = np.empty_like(self.trace.logits)
        self.loss = float(kernels.softmax_cross_entropy(self.trace.logits,
                                                        self.batch_labels, dlogits))
        dpooled = self.model.head_backward(self.trace, dlogits, overwrite=self.memory_plan)
        values = np.stack([dpooled[:, i, j] for i, j in self.gather_blocks])
        self.backward_at = now
        return [self._message(Kind.SCATTER, values)]

    def _fill_absent(self, pooled: np.ndarray) -> None:
        """Features of the blocks no live cell pools: zeros, whatever the policy. The
        plan left their cells out, and a cell left out has no output (the central
        model's dead cell, `CNN.forward(X, cells)`): the block's maximum over its
        ReLU outputs is 0. A neighbour's level or an old one would be a made-up
        feature the model never saw for a dead block."""
        for i, j in self.absent_blocks:
            pooled[:, i, j] = 0.0
        self.stats["absent_blocks_filled"] += len(self.absent_blocks)

    def _message(self, kind: Kind, payload: np.ndarray, dst: Cell | None = None) -> Message:
        self.seq += 1
        return make(kind, self.spec.mesh_id, self.step, EDGE, dst or self.spec.edge_at,
                    payload, seq=self.seq & 0xFFFFFFFF, session=self.session)
