"""Dead nodes: a share of the cells that never come up, picked reproducibly by seed.

The plan goes around them (meshdl/protocol/topology.py): the tree, the pooling leaders and their
routes, the halo relays. Their readings, and values only they could relay, are missing
inputs that each node fills in by its policy; a pooling block left without a live cell
is filled in at the edge. The cell the edge is attached to is never picked.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from meshdl.protocol.topology import Cell


class DeadCells(BaseModel):
    """A share of the cells, dead from the start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of the cells")
    seed: int = 0  # any integer, as --fault-seed is for the frames lost

    def pick(self, cells: list[Cell], edge_at: Cell) -> frozenset[Cell]:
        """round(fraction x cells) of `cells`, never `edge_at`, drawn by seed."""
        count = min(round(self.fraction * len(cells)), len(cells) - 1)
        candidates = sorted(c for c in cells if c != edge_at)
        return frozenset(random.Random(self.seed).sample(candidates, count))
