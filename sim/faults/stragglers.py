"""Stragglers: cells whose processor runs slower than their device profile says (a board
that is throttled, busy with other work, or simply older), picked reproducibly by seed.

A straggler computes the same values; every message it handles takes `slowdown` times
the device's time (bookkeeping and kernels alike), and its CPU draws the device's
computing power for that longer time. In reliable mode nothing else changes: the wave
waits for it, and the figures show what it costs (the cells downstream of a straggler
wait on the critical path; the straggler itself spends more energy).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from meshdl.protocol.topology import Cell


class Stragglers(BaseModel):
    """A share of the cells, slowed down by one factor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of the cells")
    slowdown: float = Field(10.0, ge=1.0, le=1e6, description="times the device's time")
    seed: int = 0  # any integer, as --fault-seed is for the frames lost

    def pick(self, cells: list[Cell]) -> dict[Cell, float]:
        """The stragglers among `cells` (round(fraction x cells) of them, drawn by seed)
        and their slowdown each; the same seed and cells give the same ones."""
        count = round(self.fraction * len(cells))
        chosen = random.Random(self.seed).sample(sorted(cells), count)
        return dict.fromkeys(sorted(chosen), self.slowdown)
