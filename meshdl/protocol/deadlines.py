"""Best-effort waves: when a node stops waiting for a message, and what it puts in its
place.

In best-effort mode a lost message may stay lost, so every message a node's plan
receives has a deadline. A forward message's deadline counts from the node's wave start
(PARAMS and BATCH in hand); a backward one's from the first backward message the node
takes, because the backward pass starts only once the edge has gathered the whole mesh,
and a node that never hears of it (the edge skipped the step) should not compute a
backward pass of zeros for nobody.

Deadlines adapt as TCP's retransmission timeout does (RFC 6298): per message and kind of
wave (mode, batch), a smoothed arrival time S and mean deviation V, updated by every
arrival (a late one too: it says the deadline was short), and the deadline S + max(G,
K V). They start from loss-free arrival times R (S = R, V = R / 2, as RFC 6298 starts
from its first sample): the latest of a few waves the simulator runs on a probe mesh, as a
deployment would at commissioning, or learnt by the party itself from the first wave of
each kind, waited out whole (over MQTT); then they follow the links as they are. The
least margin G is a share of the phase's span (`JITTER_SHARE`: a neighbour's wave can
start well after this party's, behind other messages).

What a missing message's values become (`Policy`):
  - zero: 0, the readings' mean after normalization, and no activation further up;
  - last: each missing item's last level, the mean over the batch of the last wave that
    carried it (in a live slot after slot, the previous slot's value);
  - neighbours: the mean of the item's 4-neighbours (cells, or pooling blocks) this node
    holds and already has; 0 where it holds none.
Gradients are always zero-filled: a missing gradient is no gradient, and a neighbour's or
an older batch's would push the parameters where this batch does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple


class Policy(StrEnum):
    """What fills a forward message that missed its deadline."""

    ZERO = "zero"
    LAST = "last"
    NEIGHBOURS = "neighbours"


ALPHA, BETA = 1 / 8, 1 / 4  # RFC 6298's gains for the smoothed time and deviation
DEFAULT_K = 4.0  # deviations of patience past the smoothed arrival time (RFC 6298's K)
JITTER_SHARE = 0.25  # of a phase's span: the least margin of its deadlines
# Waves a neighbour gives nothing in before it is reported dead: one. A live neighbour
# whose every message of a wave was lost past the link layer's retries is rare; reported
# by mistake it is planned out and says hello back in, where waiting a second wave
# delays every real death by a wave, its neighbours filling in all along.
SILENT_WAVES = 1
# Waves without a word from its own cell before the edge attaches to the next: a lost
# GATHER alone must not move it.
EDGE_SILENT_WAVES = 2


class Deadline(NamedTuple):
    """One message of a node's plan: how long after its phase began the node waits."""

    after: float  # seconds after the wave start (forward) or first backward message
    index: int  # the message's inbox entry (`Expect.index`)


class Margins(NamedTuple):
    """The least a deadline is past the smoothed arrival time (RFC 6298's G), by phase."""

    forward: float
    backward: float


class Learning(NamedTuple):
    """Best effort without measured first deadlines: learn them from the first wave of
    each kind (patience K; a least margin G in seconds)."""

    k: float
    least_margin: float

    def margins(self, forward_span: float, backward_span: float) -> Margins:
        return Margins(max(self.least_margin, JITTER_SHARE * forward_span),
                       max(self.least_margin, JITTER_SHARE * backward_span))


class Arrivals:
    """When a party's messages come in one kind of wave, smoothed (RFC 6298), and the
    deadlines that follow. Indexed by inbox entry; entries never measured have none."""

    def __init__(self, size: int, first: dict[int, float], backward: set[int],
                 margins: Margins, k: float) -> None:
        self.smoothed = [0.0] * size
        self.deviation = [0.0] * size
        self.measured = [False] * size
        for index, seconds in first.items():
            self.smoothed[index], self.deviation[index] = seconds, seconds / 2
            self.measured[index] = True
        self.backward = backward
        self.margins, self.k = margins, k

    def deadline(self, index: int) -> float:
        least = self.margins.backward if index in self.backward else self.margins.forward
        return self.smoothed[index] + max(least, self.k * self.deviation[index])

    def sample(self, index: int, seconds: float) -> None:
        """A message came `seconds` into its phase."""
        if not self.measured[index]:
            self.smoothed[index], self.deviation[index] = seconds, seconds / 2
            self.measured[index] = True
            return
        error = seconds - self.smoothed[index]
        self.deviation[index] += BETA * (abs(error) - self.deviation[index])
        self.smoothed[index] += ALPHA * error

    def schedule(self) -> Schedule:
        """The deadlines as they stand, for a wave about to start."""
        forward, backward = [], []
        for index, measured in enumerate(self.measured):
            if measured:
                (backward if index in self.backward else forward).append(
                    Deadline(self.deadline(index), index))
        return Schedule.of(forward, backward)


class Schedule(NamedTuple):
    """A node's deadlines in one kind of wave (mode and batch), each list by `after`."""

    forward: tuple[Deadline, ...]
    backward: tuple[Deadline, ...]

    @classmethod
    def of(cls, forward: Iterable[Deadline], backward: Iterable[Deadline]) -> Schedule:
        return cls(tuple(sorted(forward)), tuple(sorted(backward)))


GATHER_ENTRY, REDUCE_ENTRY = 0, 1  # the edge's `Arrivals` entries
