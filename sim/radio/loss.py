"""Frame loss on the links of a simulated radio, reproducible by seed.

- Bernoulli: every frame on every link is lost with probability `rate`.
- Gilbert-Elliott (bursty): each directed link is in a good state (nothing lost) or a
  bad one (everything lost); after each frame it goes good -> bad with probability p and
  bad -> good with r. Given as a mean loss rate L and a mean burst length B (frames):
  r = 1 / B and p = L r / (1 - L), so that the stationary share of bad frames,
  p / (p + r), is L (E. N. Gilbert, "Capacity of a burst-noise channel", Bell System
  Technical Journal 39, 1960; E. O. Elliott, "Estimates of error rates for codes on
  burst-noise channels", BSTJ 42, 1963). Measured 802.15.4 links are mostly bursty
  (Srinivasan et al., "The beta-factor", SenSys 2008); there is no canonical parameter
  set, hence both.

Draws come from a generator of their own (`seed`), frame by frame as each transmission
starts, so a run with the same seeds loses the same frames whatever else is random. A
link's bursts are counted in frames, not in time: a pause between frames does not end
one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from meshdl.errors import UsageError
from meshdl.protocol.topology import Cell


class Links(Protocol):
    """What the link layer asks of the links: is the next frame from `src` to `dst`
    lost?"""

    def lost(self, src: Cell, dst: Cell) -> bool: ...


MAX_RATE = 0.9  # beyond, a frame takes over a hundred tries on average (data and ACK)


@dataclass
class FrameLoss:
    """Which frames the links lose: `lost(src, dst)` draws one frame's fate."""

    rate: float
    burst: float | None = None  # mean burst length in frames: Gilbert-Elliott; None: Bernoulli
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _bad: dict[tuple[Cell, Cell], bool] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and 0.0 <= self.rate <= MAX_RATE):
            raise UsageError(f"--loss {self.rate}: a loss rate is from 0 to {MAX_RATE} (a "
                             "link losing more is not one the link layer can use)")
        if self.burst is not None and not (math.isfinite(self.burst) and self.burst >= 1.0):
            raise UsageError(f"--burst {self.burst}: a mean burst is a finite number of "
                             "frames, at least one")
        self._rng = random.Random(self.seed)
        if self.burst is not None:
            self._r = 1.0 / self.burst
            self._p = self.rate * self._r / (1.0 - self.rate)
            if self._p > 1.0:
                raise UsageError(f"--loss {self.rate} with --burst {self.burst}: bursts "
                                 "that short cannot lose that much (p would exceed 1)")
        elif self.rate > 0.0 and type(self) is FrameLoss:
            # The hot path of lossy runs (a million frames a training wave of the seed
            # mesh): Bernoulli's draw alone, the same draws as `lost` makes.
            draw, rate = self._rng.random, self.rate
            self.lost = lambda src, dst: draw() < rate  # type: ignore[method-assign]

    def lost(self, src: Cell, dst: Cell) -> bool:
        """Is the next frame from `src` to `dst` lost?"""
        if self.rate == 0.0:
            return False
        if self.burst is None:
            return self._rng.random() < self.rate
        link = (src, dst)
        bad = self._bad.get(link)
        if bad is None:  # a link starts in its stationary distribution
            bad = self._rng.random() < self.rate
        lost = bad
        self._bad[link] = (self._rng.random() >= self._r) if bad else \
            (self._rng.random() < self._p)
        return lost


NO_LOSS = FrameLoss(0.0)  # lossless links (where only a node that is down loses frames)


class DownLinks:
    """`loss`'s links, on which every frame to or from a node that is down is lost."""

    def __init__(self, loss: FrameLoss, down: set[Cell]) -> None:
        self.loss, self.down = loss, down

    def lost(self, src: Cell, dst: Cell) -> bool:
        return dst in self.down or src in self.down or self.loss.lost(src, dst)
