"""Best-effort mode's deadlines, measured as a deployment would at commissioning: one
loss-free wave of each kind (mode and batch) on the same radio, devices and stragglers,
and every party's receipts in it.

A node's forward messages are timed from its wave start (PARAMS and BATCH both handled),
its backward ones from the first backward message it handled; the edge's GATHER from the
wave's start and its REDUCE from its SCATTER, each the latest of `PROBE_WAVES` waves.
Each offset becomes a deadline: `slack` times as long, plus a margin for the jitter of
a shared channel (a neighbour's wave may start later than this node's, behind other
transmissions): a share of its phase's span (the edge's GATHER, or REDUCE, offset), at
least one frame's whole retry budget. The probe's waves are not the run's: they
cost the run no simulated time, traffic or energy (commissioning is left out of every
figure), and the probe's model is a copy, so the run's parameters never see them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from meshdl.errors import UsageError
from meshdl.messages import EDGE, Kind
from meshdl.nodes.deadlines import EdgeSchedule, Policy, deadline
from meshdl.sim.radio import RadioProfile
from meshdl.topology import Cell

if TYPE_CHECKING:
    from meshdl.nodes.agent import NodeMachine
    from meshdl.sim.timed import Receipt

DEFAULT_SLACK = 2.0
# Loss-free waves measured per kind of wave: their order on the air changes with each
# wave's random backoffs, and so does when a message comes (by 2x on small meshes).
PROBE_WAVES = 3
JITTER_SHARE = 0.2  # of a phase's span: each deadline's margin


@dataclass(frozen=True)
class BestEffort:
    """Best-effort mode: what fills in a missed message, and how long parties wait."""

    policy: Policy = Policy.ZERO
    slack: float = DEFAULT_SLACK

    def __post_init__(self) -> None:
        if not 1.0 <= self.slack <= 100.0:
            raise UsageError(f"--deadline-slack {self.slack}: parties wait from 1 to 100 "
                             "times as long as a loss-free wave took")


class Deadlines(NamedTuple):
    """One kind of wave's deadlines: per cell, per inbox key; and the edge's."""

    nodes: dict[Cell, dict[tuple, float]]
    edge: EdgeSchedule


def retry_budget(radio: RadioProfile) -> float:
    """One full frame sent until the retry limit (at most 3 retries: BLE's limit is a
    timeout, not a count), each try waiting out its ACK."""
    tries = 1 + min(radio.retry_limit, 3)
    return tries * (radio.frame_airtime(radio.max_frame_bytes) + radio.ack_timeout_s) \
        + radio.hop_latency_s


def offsets_from(receipts: Iterable[Receipt], nodes: dict[Cell, NodeMachine],
                 start: float, scatter_at: float | None) -> Deadlines:
    """When each message came in one loss-free wave (which began at `start`; the edge
    sent its SCATTER at `scatter_at`, training waves), from when its phase began."""
    taken: dict[Cell, list[tuple[float, tuple]]] = {}
    gather = reduce = None
    for at, party, h in receipts:
        if party == EDGE:
            if h.kind == Kind.GATHER:
                gather = at - start
            elif h.kind == Kind.REDUCE and scatter_at is not None:
                reduce = at - scatter_at
        elif party in nodes:
            taken.setdefault(party, []).append((at, (h.kind, h.layer, h.phase, h.src)))
    if gather is None:
        raise UsageError("the loss-free probe wave brought the edge no pooled features: "
                         "best-effort deadlines cannot be measured")
    per_node: dict[Cell, dict[tuple, float]] = {}
    for cell, receipts_here in taken.items():
        inbox = nodes[cell].inbox
        starts = [at for at, key in receipts_here if key in inbox and
                  inbox[key].role.starts_wave]
        if not starts:
            continue
        began = max(starts)
        backward = [at for at, key in receipts_here if key in inbox and inbox[key].train_only]
        backward_began = min(backward, default=began)
        # A message that came before its phase began (a neighbour ahead) waited for
        # it: its offset is nil.
        per_node[cell] = {
            key: max(at - (backward_began if inbox[key].train_only else began), 0.0)
            for at, key in receipts_here if key in inbox and not inbox[key].role.starts_wave}
    return Deadlines(per_node, EdgeSchedule(gather, reduce or 0.0))


def widen(offsets: Deadlines, nodes: dict[Cell, NodeMachine], slack: float,
          least_margin: float) -> Deadlines:
    """Deadlines from measured offsets: `slack` times as long, plus a margin of
    `JITTER_SHARE` of the phase's span, at least `least_margin`."""
    forward = max(JITTER_SHARE * offsets.edge.gather, least_margin)
    backward = max(JITTER_SHARE * offsets.edge.reduce, least_margin)
    per_node = {cell: {key: deadline(after, slack, backward if nodes[cell].inbox[key]
                                     .train_only else forward)
                       for key, after in mine.items()}
                for cell, mine in offsets.nodes.items()}
    return Deadlines(per_node, EdgeSchedule(deadline(offsets.edge.gather, slack, forward),
                                            deadline(offsets.edge.reduce, slack, backward)))


def latest(measured: list[Deadlines]) -> Deadlines:
    """The latest of several waves' offsets, message by message."""
    nodes: dict[Cell, dict[tuple, float]] = {}
    for found in measured:
        for cell, offsets in found.nodes.items():
            mine = nodes.setdefault(cell, {})
            for key, after in offsets.items():
                mine[key] = max(mine.get(key, 0.0), after)
    return Deadlines(nodes, EdgeSchedule(max(m.edge.gather for m in measured),
                                         max(m.edge.reduce for m in measured)))
