"""Failout (ResiliNet, Yousefpour et al. 2020; DDNN's dropped devices, Teerapittayanon et
al. 2017): training with a random share of the cells acting dead, so that the model
learns not to lean on any one of them and loses less when cells really die.

A cell that fails out in a step has no reading and no output: its input and every
conv layer's output there are 0, the values best effort's default policy ("zero")
fills in for a dead cell's, and it holds no pooled maximum (0 never beats a ReLU
output). The central model zeroes those cells (`CNN.gradient_pass`); in the mesh the
edge names them in the wave's BATCH and each of them zeroes its own values
(nodes/execute.py), so both compute the same step. A model with the alive mask
(`ModelConfig.alive`) has that mask among the zeroed inputs: it is told which cells
are gone, and learns from these steps what to make of the live ones around them.

Which cells: `round(share x cells)` of them, drawn for each update from the run's seed
and the update's number alone, so that a run resumed from a checkpoint draws the same.
With a range (`share_max`), the update's share is drawn first, uniformly between the
two, from the same stream: a model then sees few and many dead cells, as a deployment
may. With `clean` (a probability), an update first draws, from the same stream, whether
it is a clean one with no cell dead at all: the model also learns the intact grid it
reads most of the time. One set of cells per update, not per map: the mesh names the
dead of a wave once, in its BATCH, so a step the mesh can run is a step with one mask.
"""

from __future__ import annotations

import numpy as np

FAILOUT_STREAM = 0xFA11  # keeps these draws apart from the seed's other uses


def failout_cells(rows: int, cols: int, share: float, seed: int, update: int,
                  share_max: float | None = None, clean: float = 0.0) -> np.ndarray:
    """The cells (row x cols + col, increasing, int32) that act dead in update
    `update` (counted from 0 over the whole run): `share` of them, or a share drawn
    between `share` and `share_max`; none with probability `clean` (0: the draws are
    those of a run without it)."""
    cells = rows * cols
    rng = np.random.default_rng([seed, FAILOUT_STREAM, update])
    if clean > 0 and rng.uniform() < clean:
        return np.empty(0, np.int32)
    if share_max is not None and share_max > share:
        share = float(rng.uniform(share, share_max))
    count = round(share * cells)
    if count == 0:
        return np.empty(0, np.int32)
    return np.sort(rng.choice(cells, size=count, replace=False)).astype(np.int32)
