"""Best effort in a node: deadlines, what fills in a missed message, and the health of
the neighbours (meshdl/protocol/deadlines.py has the model, PROTOCOL.md the messages).

`BestEffort` is a part of every `NodeMachine` (nodes/agent.py), `node.effort`, that acts
only in best effort: it gives up on a message at its deadline (`tick`), fills in what is
missing by its policy, learns when messages come, reports neighbours that went silent
(HEALTH) and says hello when the mesh has left its node out. In reliable mode (no
policy, no `hello_after`) none of it runs. It holds its own state; of its node it reads
the current plan, wave and spec, and hands back what a fill-in readied (`_arrived`,
`_run_ready`). The node calls it where a wave starts (`start`), a message of it comes
(`took`, `late`), a kernel reads orphans (`fill_orphans`), a wave ends (`judge`,
`learnt`) and a HEALTH passes (`relay_health`). What it reads and calls of its node is
`NodeForEffort` (below), not the machine's class: nodes/agent.py imports this module,
and an import back would close a circle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

from meshdl.nodes.plan import (
    FILLED_IN,
    ITEMS,
    LATE,
    Expect,
    InboxKey,
    Item,
    NodePlan,
    Role,
    Wave,
)
from meshdl.protocol.deadlines import (
    SILENT_WAVES,
    Arrivals,
    Deadline,
    Learning,
    Margins,
    Policy,
)
from meshdl.protocol.lifecycle import NodePhase
from meshdl.protocol.messages import EDGE, Header, Kind, Message, make
from meshdl.protocol.payloads import HEALTH_MAX, health_entries
from meshdl.protocol.spec import Field, MeshSpec, Mode
from meshdl.protocol.topology import Cell


class NodeForEffort(Protocol):
    """What the best effort reads and calls of its node (`NodeMachine`, nodes/agent.py,
    which imports this module). The underscored names are the machine's own: the best
    effort is a part of it."""

    cell: Cell
    spec: MeshSpec
    mesh_id: int
    plan: NodePlan
    inbox: dict[InboxKey, Expect]  # the plan's
    wave: Wave | None
    neighbours: set[Cell]
    children: list[Cell]
    stats: Counter[str]
    seq: int
    plans_change: bool
    _plans: dict[tuple, NodePlan]

    def _plan_for(self, spec: MeshSpec) -> NodePlan: ...

    def _arrived(self, wave: Wave, waiters: tuple[int, ...]) -> None: ...

    def _run_ready(self, wave: Wave, now: float, out: list[Message]) -> None: ...


class BestEffort:
    """Deadlines, fill-ins and health of one node (`NodeMachine.effort`)."""

    def __init__(self, node: NodeForEffort) -> None:
        self.node = node
        # None waits for every message (exact); else arrival times per (plan, mode,
        # batch), and what fills in a missed message.
        self.policy: Policy | None = None
        self.arrivals: dict[tuple, Arrivals] = {}
        self.learning: Learning | None = None  # deadlines from a first wave, waited out
        self.last_level: dict[Item, np.ndarray] = {}  # policy "last": (channels,) an item
        # Dead neighbours: consecutive waves each gave nothing in, and the report for
        # the edge; saying hello when no PARAMS came for `hello_after` seconds (None:
        # never), as a node that booted or was left out does.
        self.silent: Counter[Cell] = Counter()
        self.suspects: list[Cell] = []
        self.judged = (0, 0)  # the (step, session) of the wave they were found in
        self.judged_wave: Wave | None = None  # ... and the wave itself
        self.hello_after: float | None = None
        self.heard_at = 0.0  # the last PARAMS taken, or the boot
        self.hello_at: float | None = None

    def new_plan(self) -> None:
        """The node took another plan: who is expected from starts afresh."""
        self.silent.clear()
        self.suspects = []

    def start(self, wave: Wave, now: float, out: list[Message]) -> None:
        """A wave starts: the HEALTH report of the last wave judged goes up the tree,
        and the wave gets its deadlines (or, learning, is waited out to teach them)."""
        node = self.node
        self.heard_at = now
        self._report(out)  # dated by the wave judged
        if self.policy is None:
            return
        key = (node.spec.plan_key, wave.mode, wave.batch)
        arrivals = self.arrivals.get(key)
        if arrivals is None and self.learning is not None:
            arrivals = self._carried_over(wave.mode, wave.batch)
            if arrivals is not None:
                self.arrivals[key] = arrivals
        wave.arrivals = arrivals
        if arrivals is None and self.learning is not None:
            wave.learnt = {}  # this wave is waited out, and teaches the deadlines
            wave.timing = True
        if arrivals is not None:
            wave.schedule = arrivals.schedule()
            wave.timing = True
            wave.after = {d.index: d.after for d in wave.schedule.forward}
            wave.after.update((d.index, d.after) for d in wave.schedule.backward)

    def set_deadlines(self, policy: Policy, mode: Mode, batch: int,
                      first: dict[tuple, float], margins: Margins, k: float,
                      spec: MeshSpec | None = None) -> None:
        """Best effort: in waves of `mode` and `batch` (of `spec`'s plan, by default
        this node's), give up on a message of the plan (by inbox key) at its deadline
        and fill it in by `policy`. Deadlines start from `first` (seconds into its
        phase each came in a loss-free wave) and follow the arrivals
        (meshdl/protocol/deadlines.py); a message without one is waited for."""
        self.policy, self.node.plans_change = policy, True
        spec = spec or self.node.spec
        inbox = self.node._plan_for(spec).inbox
        measured = {inbox[key].index: seconds for key, seconds in first.items()
                    if not inbox[key].role.starts_wave}  # without them, no wave
        backward = {e.index for e in inbox.values() if e.train_only}
        self.arrivals[(spec.plan_key, mode, batch)] = Arrivals(len(inbox), measured,
                                                               backward, margins, k)

    def due(self, h: Header) -> float | None:
        """When this node stops waiting for the message of header `h`, if it is of its
        current wave and its phase has begun (a sender's radio stops recovering it
        then)."""
        wave = self.node.wave
        if wave is None or wave.schedule is None or h.step != wave.step or \
                h.session != wave.session:
            return None
        expect = self.node.inbox.get((h.kind, h.layer, h.phase, h.src))
        after = None if expect is None else wave.after.get(expect.index)
        if after is None:
            return None
        if expect.train_only:
            return None if wave.backward_at is None else wave.backward_at + after
        return wave.started_at + after

    def next_deadline(self) -> float | None:
        """When this node next gives up on a message of its current wave, or says
        hello, if it will."""
        wave = self.node.wave
        hello = self._hello_due()
        if wave is None or wave.schedule is None or wave.phase is NodePhase.DONE:
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
        wave = self.node.wave
        out: list[Message] = []
        hello = self._hello_due()
        if hello is not None and now >= hello:
            out.extend(self._hello(now))
        if wave is None or wave.schedule is None or wave.phase is NodePhase.DONE:
            return out
        for index in self._overdue(wave, now):
            self._fill_in(wave, index)
        if wave.ready:
            self.node._run_ready(wave, now, out)
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

    def took(self, wave: Wave, expect: Expect, now: float) -> None:
        """Best effort: a message came. It tells when such messages come; the first
        backward one starts the backward deadlines; under policy "last" a forward
        one's level is remembered."""
        if expect.role.starts_wave:
            return  # never waited for: without them there is no wave
        if expect.train_only and wave.backward_at is None:
            wave.backward_at = now
        self._timed(wave, expect, now)
        if not expect.train_only and self.policy == Policy.LAST and expect.role == ITEMS:
            f, items = self.node.plan.carries[expect.index]
            # The batch's mean (ndarray.mean's sum and division, without its Python
            # wrapper: this runs for every message of a wave).
            block = wave.buffers[expect.buffer][expect.slots]
            levels = np.add.reduce(block, axis=2)
            np.true_divide(levels, block.shape[2], out=levels, casting="unsafe")
            for item, level in zip(items, levels, strict=True):
                self.last_level[(f, item)] = level

    # ---------------------------------------------------------------- health
    def finished(self, wave: Wave, now: float) -> list[Message]:
        """This node's part of a best-effort wave is done: judge it now, and report a
        neighbour found silent at once (HEALTH up the tree), so that the edge hears of
        it before its next wave, not one wave later; `start` says it again with each
        wave until the edge's plan leaves it out."""
        if wave.schedule is None or wave is self.judged_wave:
            return []
        before = list(self.suspects)
        self.judge(wave)
        if not self.suspects or self.suspects == before:
            return []
        out: list[Message] = []
        self._report(out)
        return out

    def _report(self, out: list[Message]) -> None:
        """The HEALTH of the last wave judged, to the tree parent."""
        node = self.node
        if not self.suspects or node.plan.health_to is None:
            return
        suspects = np.array([c[0] * node.spec.model.cols + c[1] + 1
                             for c in self.suspects[:HEALTH_MAX]], np.int32)
        node.seq = (node.seq + 1) & 0xFFFFFFFF
        out.append(make(Kind.HEALTH, node.mesh_id, self.judged[0], node.cell,
                        node.plan.health_to, suspects, seq=node.seq,
                        session=self.judged[1]))

    def judge(self, wave: Wave) -> None:
        """A best-effort wave is over: a neighbour all of whose messages in it had to be
        filled in was silent; after `SILENT_WAVES` such waves in a row it is reported
        (at once, and with each wave's start) until the edge's plan leaves it out."""
        if wave is self.judged_wave:  # at its end already
            return
        self.judged_wave = wave
        heard: dict[Cell, bool] = {}
        for index, seen in enumerate(wave.seen):
            expect, src = self.node.plan.expected[index], self.node.plan.keys[index].src
            if seen and src in self.node.neighbours and src != EDGE and \
                    not expect.role.starts_wave:
                heard[src] = heard.get(src, False) or seen != FILLED_IN
        for neighbour, got in heard.items():
            self.silent[neighbour] = 0 if got else self.silent[neighbour] + 1
        self.suspects = sorted(n for n, waves in self.silent.items()
                                if waves >= SILENT_WAVES and n not in self.node.spec.dead)
        self.judged = (wave.step, wave.session)

    def relay_health(self, message: Message) -> list[Message]:
        """A HEALTH on its way to the edge: from a tree child, passed on to the parent;
        a hello from a grid neighbour (its own cell, back), passed on too."""
        h, payload = message.header, message.payload
        if h.dst != self.node.cell or health_entries(payload, self.node.spec.model.rows,
                                                self.node.spec.model.cols) is None:
            self.node.stats["rejected:bad_health"] += 1
            return []
        own = h.src[0] * self.node.spec.model.cols + h.src[1] + 1
        hello = payload.size == 1 and payload[0] == -own and \
            abs(h.src[0] - self.node.cell[0]) + abs(h.src[1] - self.node.cell[1]) == 1
        up = self.node.plan.health_to
        if up is None or not (hello or h.src in self.node.children):
            self.node.stats["rejected:bad_health"] += 1
            return []
        self.node.stats["health_relayed"] += 1
        self.node.seq = (self.node.seq + 1) & 0xFFFFFFFF
        return [make(Kind.HEALTH, self.node.mesh_id, h.step, self.node.cell, up, payload,
                     seq=self.node.seq, session=h.session)]

    def _hello_due(self) -> float | None:
        """When this node says hello next: `hello_after` without PARAMS, and again
        that long after each hello; only while it has no wave (it booted) or its mesh
        leaves it out (found dead, though alive). A node of the mesh whose waves merely
        run long never says it."""
        if self.hello_after is None or \
                (self.node.wave is not None and self.node.cell in self.node.spec.topology.members):
            return None
        since = self.heard_at if self.hello_at is None else max(self.heard_at,
                                                                  self.hello_at)
        return since + self.hello_after

    def _hello(self, now: float) -> list[Message]:
        """"I am here" to every grid neighbour: one in the mesh passes it to the edge,
        which takes this cell back in with its next PARAMS."""
        self.hello_at = now
        self.node.stats["hellos"] += 1
        r, c = self.node.cell
        hello = np.array([-(r * self.node.spec.model.cols + c + 1)], np.int32)
        out = []
        for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if self.node.spec.topology.inside(n):
                self.node.seq = (self.node.seq + 1) & 0xFFFFFFFF
                out.append(make(Kind.HEALTH, self.node.mesh_id, 0, self.node.cell, n, hello,
                                seq=self.node.seq))
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
        self.policy, self.learning, self.node.plans_change = policy, learning, True

    def _carried_over(self, mode: Mode, batch: int) -> Arrivals | None:
        """A new plan's deadlines from the same kind of wave in an earlier plan, message
        by message (a message new to this plan: the latest of its phase). Waiting a wave
        out to learn them could wait for ever: the plan may still hold dead cells."""
        for (plan_key, other_mode, other_batch), old in self.arrivals.items():
            old_plan = self.node._plans.get(plan_key)
            if (other_mode, other_batch) != (mode, batch) or old_plan is None or \
                    old_plan is self.node.plan:
                continue
            latest = {phase: max((old.smoothed[i] + old.deviation[i] for i, m in
                                  enumerate(old.measured) if m and
                                  (i in old.backward) == phase), default=0.0)
                      for phase in (False, True)}
            first: dict[int, float] = {}
            for key, expect in self.node.inbox.items():
                if expect.role.starts_wave:
                    continue
                index = old_plan.inbox[key].index if key in old_plan.inbox else None
                first[expect.index] = old.smoothed[index] if index is not None and \
                    old.measured[index] else latest[expect.train_only]
            backward = {e.index for e in self.node.inbox.values() if e.train_only}
            return Arrivals(len(self.node.inbox), first, backward, old.margins, old.k)
        return None

    def learnt(self, wave: Wave) -> None:
        """A wave waited out whole: its arrival times start its kind's deadlines."""
        learnt, plan = wave.learnt, self.node.plan
        wave.learnt = None
        backward = {i for i in learnt if plan.expected[i].train_only}
        spans = (max((t for i, t in learnt.items() if i not in backward), default=0.0),
                 max((learnt[i] for i in backward), default=0.0))
        self.arrivals[(self.node.spec.plan_key, wave.mode, wave.batch)] = Arrivals(
            len(plan.inbox), learnt, backward, self.learning.margins(*spans),
            self.learning.k)

    def late(self, wave: Wave, expect: Expect, now: float) -> list[Message]:
        """A message that came after its deadline: filled in already, so only its
        arrival time counts (the deadline was short), and that its sender is alive."""
        self.node.stats["late"] += 1
        wave.seen[expect.index] = LATE
        self._timed(wave, expect, now)
        return []

    def _fill_in(self, wave: Wave, index: int) -> None:
        """Put values in place of a message that missed its deadline (the policy's for
        forward values, zeros for gradients), and go on as if it had come."""
        expect, key = self.node.plan.expected[index], self.node.plan.keys[index]
        if expect.role == Role.PARTIAL_GRADIENTS:
            wave.reduce[key.src] = self.node.spec.empty_reduce()
        elif expect.role == ITEMS:
            f, items = self.node.plan.carries[index]
            wave.buffers[expect.buffer][expect.slots] = \
                0.0 if expect.train_only else self._filling(wave, f, items)
        else:  # PARAMS or BATCH: never scheduled (no wave without them)
            return
        wave.seen[index] = FILLED_IN
        self.node.stats["filled_in"] += 1
        self.node.stats[f"filled_in:{Kind(key.kind).name.lower()}"] += 1
        self.node._arrived(wave, expect.waiters)

    def fill_orphans(self, wave: Wave, f: Field) -> None:
        """Put zeros in the slots of `f`'s orphans before a kernel reads them, whatever
        the policy: they are values the plan left out (a cell known dead or cut off,
        or a value only such cells relay), and the central model reads a cell left
        out as zeros (`CNN.forward(X, cells)`); a neighbour's or an old value would be
        a made-up one, a false step beside a dead cell."""
        rows = self.node.plan.orphan_rows.get(f)
        if rows is None:
            return
        wave.buffers[self.node.plan.buffers[f]][rows] = 0.0
        self.node.stats["absent_filled"] += len(rows)

    def _filling(self, wave: Wave, f: Field, items: Sequence[Hashable]
                 ) -> np.ndarray | float:
        """Forward values for missing items of field `f`, by the policy."""
        if self.policy == Policy.LAST:
            buffer = wave.buffers[self.node.plan.buffers[f]]
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
        plan = self.node.plan
        buffer, slots = wave.buffers[plan.buffers[f]], plan.slots[plan.buffers[f]]
        values = np.zeros((len(items), buffer.shape[1], buffer.shape[2]), np.float32)
        for row, (r, c) in enumerate(items):
            near = [slots[n] for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
                    if n in slots and self.node.plan.usable(wave, f, n)]
            if near:
                values[row] = buffer[near].mean(axis=0)
        return values


def _passed(deadlines: tuple[Deadline, ...], cursor: int, began: float, now: float,
            seen: bytearray, overdue: list[int]) -> int:
    """Move `cursor` past the deadlines (by time) at or before `now` of a phase that
    began at `began`, adding to `overdue` the messages among them not yet seen."""
    while cursor < len(deadlines) and began + deadlines[cursor].after <= now:
        if not seen[deadlines[cursor].index]:
            overdue.append(deadlines[cursor].index)
        cursor += 1
    return cursor
