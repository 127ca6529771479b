"""Dead nodes: a share of the cells that never come up, picked reproducibly by seed.

In best effort the edge knows them before the first wave: the roll call at
commissioning (`TimedMesh.roll_call`) answers for the nodes up and linked to the edge
only. The plan goes around the others (meshdl/protocol/topology.py): the tree, the
pooling leaders and their routes, the halo relays (column first where the row-first
relay is dead). Their readings, and values only they could relay, are missing inputs
the nodes fill in where a kernel reads them; a pooling block left without a live cell
reads zeros at the edge, as the central model reads a dead cell. The cell the edge is
attached to is never picked.

`dead_cells` is the one draw of a dead-cell set from (grid, share, seed): `meshdl evaluate
--dead`, `simulate infer|train --dead`, `experiment failures` and (by `DeadCells.pick`)
`data inspect --dead` all take it, so that the same seed leaves out the same cells
wherever it is given and a central evaluation can be set beside a mesh run cell for cell.
(Training's failout, new cells every update, is another draw: meshdl/training/failout.py.)
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from meshdl.protocol.topology import Cell

EDGE_CELL: Cell = (0, 0)  # the edge's cell when none is given ([mesh] edge_at's default)


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


def dead_cells(rows: int, cols: int, share: float, seed: int,
               edge_at: Cell = EDGE_CELL) -> frozenset[Cell]:
    """The cells of a rows x cols grid that `share` and `seed` leave dead (never
    `edge_at`): the draw every command makes."""
    grid = [(r, c) for r in range(rows) for c in range(cols)]
    return DeadCells(fraction=share, seed=seed).pick(grid, edge_at)


def cell_numbers(cells: Iterable[Cell], cols: int) -> np.ndarray:
    """`cells` as the model names them (row x cols + col, increasing, int32): the
    `failout` argument of `CNN.predict` and `CNN.forward`."""
    return np.array(sorted(r * cols + c for r, c in cells), np.int32)


def found_line(down: Iterable[Cell], found_at: dict[Cell, int]) -> str:
    """The dead cells an inference run found, in one line: how many were down, which the
    edge found (planned around) and at which wave (1 = the first), how many it never
    found, and any it planned around while they were up. `found_at`: each cell the edge
    planned around, with the wave it first did."""
    from meshdl.protocol.topics import name_of

    down = set(down)
    found = sorted((wave, cell) for cell, wave in found_at.items() if cell in down)
    line = f"dead cells: {len(down)} down, {len(found)} found"
    if found:
        line += f" ({', '.join(f'{name_of(cell)} at wave {wave}' for wave, cell in found)})"
    line += f", {len(down) - len(found)} not found by the end"
    if wrong := sorted(cell for cell in found_at if cell not in down):
        line += f"; planned around though up: {', '.join(map(name_of, wrong))}"
    return line
