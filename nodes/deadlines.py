"""Best-effort waves: when a node stops waiting for a message, and what it puts in its
place.

In best-effort mode a lost message stays lost, so every message a node's plan receives
has a deadline. A forward message's deadline counts from the node's wave start (PARAMS
and BATCH in hand); a backward one's from the first backward message the node takes,
because the backward pass starts only once the edge has gathered the whole mesh, and a
node that never hears of it (the edge skipped the step) should not compute a backward
pass of zeros for nobody. The offsets come from a loss-free wave of the same mode and
batch (the transport measures them, as a deployment would at commissioning), times a
slack, plus a margin.

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


class Deadline(NamedTuple):
    """One message of a node's plan: how long after its phase began the node waits."""

    after: float  # seconds after the wave start (forward) or first backward message
    index: int  # the message's inbox entry (`Expect.index`)


class Schedule(NamedTuple):
    """A node's deadlines in one kind of wave (mode and batch), each list by `after`."""

    forward: tuple[Deadline, ...]
    backward: tuple[Deadline, ...]

    @classmethod
    def of(cls, forward: Iterable[Deadline], backward: Iterable[Deadline]) -> Schedule:
        return cls(tuple(sorted(forward)), tuple(sorted(backward)))


class EdgeSchedule(NamedTuple):
    """The edge's deadlines in one kind of wave: the GATHER, from the wave's start; the
    REDUCE, from the SCATTER."""

    gather: float
    reduce: float


def deadline(offset: float, slack: float, margin: float) -> float:
    """A message seen `offset` seconds into its phase in a loss-free wave is waited for
    `slack` times as long, plus `margin`."""
    return slack * offset + margin
