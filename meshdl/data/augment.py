"""Mirror augmentation: the training maps flipped up-down, left-right and both.

The label rule (some 4-neighbour pair differs by >= the threshold) is symmetric under
both flips, so a mirrored map is a valid sample with the same label. Without mirrors the
fc head only learns anomalies where the training period had them: on a data set whose
test period puts a heat source somewhere new (data seeds 11 and 12 of the synthetic
lounge) it misses even 5 °C steps there, and test accuracy stays near 92 %.

Every holder of readings builds the same view (`training_data`): the training split
becomes [original, up-down, left-right, both], 4 N maps, and the test split is untouched.
An epoch still shows each original map once, in one orientation drawn at random
(`training.batches`), so a run has as many waves as without mirrors. In the mesh, node
(r, c) then also holds the logged readings of its mirror cells (R-1-r, c), (r, C-1-c) and
(R-1-r, C-1-c): free when a data set is replayed; on live nodes it would be a one-time
exchange of the training log, which nothing here counts.
"""

from __future__ import annotations

import numpy as np

from meshdl.config import ModelConfig, TrainConfig
from meshdl.data.datasets import Dataset

# The mirrors, in the training view's order, as (flip up-down, flip left-right): as is,
# up-down, left-right, both. The one definition: mirror banks and the position bias
# read it too.
FLIPS = ((False, False), (True, False), (False, True), (True, True))
ORIENTATIONS = len(FLIPS)


def flip(a: np.ndarray, up_down: bool, left_right: bool) -> np.ndarray:
    """`a` (..., rows, cols) flipped on its last two axes as a mirror of `FLIPS` does."""
    if up_down:
        a = a[..., ::-1, :]
    if left_right:
        a = a[..., ::-1]
    return a


_MARK = "augment"  # the meta key that says a data set already holds its mirrors
_INPUTS = "inputs"  # the meta key that says a data set's maps carry the alive mask


def mirrored(data: Dataset) -> Dataset:
    """`data` with the three mirror images of every training map appended, in that order."""
    X, y = data.X_train, data.y_train
    maps = np.concatenate([flip(X, ud, lr) for ud, lr in FLIPS])
    return Dataset(maps, np.tile(y, ORIENTATIONS), data.X_test, data.y_test,
                   {**data.meta, _MARK: "mirror"})


def training_data(config: TrainConfig, data: Dataset,
                  model: ModelConfig | None = None) -> Dataset:
    """What a run with `config` trains on: `data`, with mirrors when it asks for them,
    and with the alive mask as every map's last channel when `model` reads one
    (`with_alive`). Every holder of readings (the nodes, a mesh engine) must hold this
    view: a model with the mask reads two values per cell."""
    view = data if config.augment == "none" or data.meta.get(_MARK) == "mirror" \
        else mirrored(data)
    return view if model is None else as_read_by(view, model)


def as_read_by(data: Dataset, model: ModelConfig) -> Dataset:
    """`data` as `model` reads it: with the alive mask as every map's last channel when
    the model takes one and the data does not hold it yet (`with_alive`), else as it is."""
    if model.alive and data.meta.get(_INPUTS) != "alive":
        return with_alive(data)
    return data


def with_alive(data: Dataset) -> Dataset:
    """`data` with the alive mask after each cell's readings: maps (N, C + 1, rows, cols)
    whose last channel is 1 (a live node's; a dead one's input, mask included, is
    zeroed by failout or left out by the mesh). What a node of a model with
    `ModelConfig.alive` holds: its reading and a 1."""
    def add(X: np.ndarray) -> np.ndarray:
        maps = X[:, None] if X.ndim == 3 else X
        out = np.ones((maps.shape[0], maps.shape[1] + 1, *maps.shape[2:]), np.float32)
        out[:, :-1] = maps
        return out

    return Dataset(add(data.X_train), data.y_train, add(data.X_test), data.y_test,
                   {**data.meta, _INPUTS: "alive"})


def originals(data: Dataset) -> int:
    """How many training maps of `data` (a `training_data` view) are not mirror images."""
    n = len(data.y_train)
    return n // ORIENTATIONS if data.meta.get(_MARK) == "mirror" else n


def mirror_cells(numbers: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(len(FLIPS), len(numbers)) int64: for each mirror o, the cell (row x cols + col)
    whose value mirror o puts at each of `numbers` (a mirror is its own inverse): the
    column of a position bias a node at that cell reads for a map in mirror o: the cell
    numbers of the grid, mirrored as a map is (`flip`)."""
    grid = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    numbers = np.asarray(numbers, np.int64)
    return np.stack([flip(grid, up_down, left_right).ravel()[numbers]
                     for up_down, left_right in FLIPS])


def mirror_orientations(indices: np.ndarray, originals: int | None) -> np.ndarray:
    """Which mirror each training sample of a mirrored view is (index o x originals +
    i); all 0 without mirrors (`originals` None). Indices past the four mirrors give
    orientations past `FLIPS`: the caller holds indices within its readings."""
    indices = np.asarray(indices, np.int64)
    return np.zeros(len(indices), np.int64) if originals is None else indices // originals


def mirrors_of(data: Dataset) -> int | None:
    """Maps per mirror of a mirrored training view (sample o x n + i is map i in mirror
    o), what a node holding it tells its maps' orientations by; None: no mirrors."""
    meta = getattr(data, "meta", {})
    return originals(data) if meta.get(_MARK) == "mirror" else None


def orientations(config: TrainConfig) -> int:
    """Orientations an epoch draws each training map in: 4 with mirrors, else 1."""
    return ORIENTATIONS if config.augment == "mirror" else 1
