"""Failout (ResiliNet, Yousefpour et al. 2020; DDNN's dropped devices, Teerapittayanon et
al. 2017): training with a random share of the cells acting dead, so that the model
learns not to lean on any one of them and loses less when cells really die.

A cell that fails out in a step has no reading and no output: its input and every
conv layer's output there are 0, the values best effort's default policy ("zero")
fills in for a dead cell's, and it holds no pooled maximum (0 never beats a ReLU
output). The central model zeroes those cells (`CNN.gradient_pass`); in the mesh the
edge names them in the wave's BATCH and each of them zeroes its own values
(nodes/steps.py), so both compute the same step.

Which cells: `round(share x cells)` of them, drawn for each update from the run's seed
and the update's number alone, so that a run resumed from a checkpoint draws the same.
"""

from __future__ import annotations

import numpy as np

FAILOUT_STREAM = 0xFA11  # keeps these draws apart from the seed's other uses


def failout_cells(rows: int, cols: int, share: float, seed: int, update: int) -> np.ndarray:
    """The cells (row x cols + col, increasing, int32) that act dead in update
    `update` (counted from 0 over the whole run)."""
    cells = rows * cols
    count = round(share * cells)
    if count == 0:
        return np.empty(0, np.int32)
    rng = np.random.default_rng([seed, FAILOUT_STREAM, update])
    return np.sort(rng.choice(cells, size=count, replace=False)).astype(np.int32)
