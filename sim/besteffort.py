"""Best-effort mode's first deadlines, measured as a deployment would at commissioning:
a few loss-free waves of each kind (mode and batch) on the same radio, devices and
stragglers, and every party's receipts in them.

A node's forward messages are timed from its wave start (PARAMS and BATCH both handled),
its backward ones from the first backward message it handled; the edge's GATHER from the
wave's start and its REDUCE from its SCATTER. The latest of `PROBE_WAVES` waves starts
each message's arrival estimate; the parties then follow their links as they are
(meshdl/protocol/deadlines.py). Deadlines are never shorter than a margin: one frame's whole retry
budget, and a share of the phase's span for the jitter of a shared channel (a
neighbour's wave may start later than this node's, behind other transmissions). The
probe's waves are not the run's: they cost the run no simulated time, traffic or energy
(commissioning is left out of every figure), and the probe's model is a copy, so the
run's parameters never see them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from meshdl.errors import UsageError
from meshdl.protocol.deadlines import DEFAULT_K, JITTER_SHARE, Margins, Policy
from meshdl.protocol.messages import EDGE, Header, Kind
from meshdl.protocol.topology import Cell
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party

if TYPE_CHECKING:
    from meshdl.nodes.agent import NodeMachine

# Loss-free waves measured per kind of wave: their order on the air changes with each
# wave's random backoffs, and so does when a message comes (by 2x on small meshes).
PROBE_WAVES = 3


@dataclass(frozen=True)
class BestEffort:
    """Best-effort mode: what fills in a missed message, and how patient parties are
    (deviations past the smoothed arrival time, RFC 6298's K)."""

    policy: Policy = Policy.ZERO
    patience: float = DEFAULT_K

    def __post_init__(self) -> None:
        if not 1.0 <= self.patience <= 100.0:
            raise UsageError(f"--patience {self.patience}: parties wait from 1 to 100 mean "
                             "deviations past a message's smoothed arrival time")


class Receipt(NamedTuple):
    """A message as its receiver took it (kept with the trace). Here, where the probe
    reads the receipts, rather than in sim/timed.py, which keeps them: the timed mesh
    imports this module, so this one names it without importing the timed mesh back."""

    at: float
    party: Party
    header: Header


class Offsets(NamedTuple):
    """When each message came in loss-free waves, from when its phase began: per cell
    and inbox key; the edge's GATHER and REDUCE (None: an inference wave)."""

    nodes: dict[Cell, dict[tuple, float]]
    gather: float
    reduce: float | None

    def margins(self, radio: RadioProfile) -> Margins:
        """The least margin of forward and of backward deadlines."""
        least = retry_budget(radio)
        return Margins(max(least, JITTER_SHARE * self.gather),
                       max(least, JITTER_SHARE * (self.reduce or 0.0)))


def retry_budget(radio: RadioProfile) -> float:
    """One full frame sent until the retry limit (at most 3 retries: BLE's limit is a
    timeout, not a count), each try waiting out its ACK."""
    tries = 1 + min(radio.retry_limit, 3)
    return tries * (radio.frame_airtime(radio.max_frame_bytes) + radio.ack_timeout_s) \
        + radio.hop_latency_s


def offsets_from(receipts: Iterable[Receipt], nodes: dict[Cell, NodeMachine],
                 start: float, scatter_at: float | None) -> Offsets:
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
    return Offsets(per_node, gather, reduce)


def latest(measured: list[Offsets]) -> Offsets:
    """The latest of several waves' offsets, message by message."""
    nodes: dict[Cell, dict[tuple, float]] = {}
    for found in measured:
        for cell, offsets in found.nodes.items():
            mine = nodes.setdefault(cell, {})
            for key, after in offsets.items():
                mine[key] = max(mine.get(key, 0.0), after)
    reduces = [m.reduce for m in measured if m.reduce is not None]
    return Offsets(nodes, max(m.gather for m in measured), max(reduces, default=None))
