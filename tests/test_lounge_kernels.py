"""The synthetic lounge's compiled kernels (meshdl/data/lounge.py) give the bits of the
numpy formulas the data set was first made with, and the generator holds a few maps in
memory at once, not one per candidate occupant or neighbour pair."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from meshdl.config import DataConfig
from meshdl.data import lounge
from tests.helpers import blas_threads


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# The first version's formulas, as references.
def _pair_diffs(maps: np.ndarray) -> np.ndarray:
    n = maps.shape[0]
    return np.concatenate(
        [np.diff(maps, axis=1).reshape(n, -1), np.diff(maps, axis=2).reshape(n, -1)], axis=1)


def _max_diff(maps: np.ndarray) -> np.ndarray:
    diffs = _pair_diffs(maps)
    return np.abs(diffs).max(axis=1) if diffs.shape[1] else np.zeros(len(maps))


def _scale_to_target(base, feature, target, cap):
    a, b = _pair_diffs(base), _pair_diffs(feature)
    if a.shape[1] == 0:
        return np.minimum(np.ones(base.shape[0]), cap)
    moving = np.abs(b) > 1e-9
    safe = np.where(moving, np.abs(b), 1.0)
    bound = np.where(moving, (target[:, None] - np.sign(b) * a) / safe, np.inf)
    s = bound.min(axis=1)
    return np.clip(np.where(np.isfinite(s), s, 1.0), 0.0, cap)


def _random_maps(rows: int, cols: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = 40
    base = rng.normal(21.0, 1.5, (n, rows, cols))
    f1 = rng.normal(0.0, 1.0, (n, rows, cols))
    f2 = rng.normal(0.0, 2.0, (n, rows, cols)) * (rng.random((n, 1, 1)) < 0.7)
    f2[:, :, : cols // 2] = 0.0  # flat stretches: pairs that do not move
    s1, s2 = rng.uniform(0.0, 3.0, n), rng.uniform(0.0, 8.0, n)
    target = rng.uniform(0.5, 6.0, n)
    return base, f1, f2, s1, s2, target


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (1, 5), (4, 1), (3, 3), (17, 25)])
def test_the_calibration_kernels_give_the_numpy_formulas_bits(rows, cols) -> None:
    base, f1, f2, s1, s2, target = _random_maps(rows, cols, rows * 100 + cols)
    rows_all = np.arange(len(base))
    field = (base + s1[:, None, None] * f1) + s2[:, None, None] * f2
    maps = lounge._Maps(base, f1, s1, f2, s2)
    assert _same_bits(maps.made(), field)
    assert _same_bits(lounge._max_diff(maps, rows_all), _max_diff(field))
    assert _same_bits(lounge._max_diff(lounge._Maps(base, f1), rows_all), _max_diff(base))
    caps = np.full(len(base), 3.0)
    for feature, cap in ((f2, 3.0), (f1, caps * 2.0)):
        expected = _scale_to_target(field, feature, target, cap)
        assert _same_bits(lounge._scale_to_target(maps, feature, target, cap, rows_all),
                          expected)
    some = rows_all[::3]  # only the rows asked for are looked at
    got = lounge._max_diff(maps, some)
    assert _same_bits(got[some], _max_diff(field)[some]) and not got[1:3].any()


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 7), (17, 25)])
def test_occupants_and_features_give_the_numpy_formulas_bits(rows, cols) -> None:
    grid = lounge._Grid(rows, cols)
    rng = np.random.default_rng(rows + cols)
    n, most = 60, 30
    count = rng.integers(0, most + 1, n)
    count[::4] = 0  # empty slots
    present = np.arange(most)[None, :] < count[:, None]
    amp = rng.uniform(0.3, 0.8, (n, most)) * present
    sigma = rng.uniform(0.6, 1.2, (n, most))
    cy, cx = rng.uniform(0.0, rows - 1, (n, most)), rng.uniform(0.0, cols - 1, (n, most))
    gy = lounge._gauss(grid.y, cy, sigma) * amp[..., None]
    gx = lounge._gauss(grid.x, cx, sigma)
    assert _same_bits(lounge._blobs(grid, present, amp, sigma, cy, cx),
                      np.matmul(gy.transpose(0, 2, 1), gx))
    p, q, r, m = (rng.normal(0.0, 1.0, shape) for shape in ((n, rows), (n, cols), (n, rows), n))
    out = np.empty((n, rows, cols))
    lounge._row_times_col_plus(p, q, r, out)
    assert _same_bits(out, p[:, :, None] * q[:, None, :] + r[:, :, None])
    lounge._outer_times(p, q, m, out)
    assert _same_bits(out, p[:, :, None] * q[:, None, :] * m[:, None, None])


def test_the_lounge_holds_a_few_maps_not_one_per_occupant_or_pair() -> None:
    """The first version held about 16 maps' worth at once (every candidate occupant's
    Gaussians, every neighbour pair's bounds); what is left is the maps themselves."""
    cfg = DataConfig(rows=24, cols=30, train=600, test=200)
    lounge.generate_lounge(DataConfig(rows=3, cols=3, train=4, test=2))  # compiled
    tracemalloc.start()
    try:
        lounge.generate_lounge(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_map = (cfg.train + cfg.test) * cfg.rows * cfg.cols * 8
    assert peak < 8 * one_map


def test_the_generator_runs_blas_on_one_thread_with_the_bits_of_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """BLAS's spinning threads made a 100 x 100 lounge take 20-40 s instead of 4 s when
    another process held a core; one thread gives the same maps (here on a small grid,
    whose products BLAS may not split: the 17 x 25, 12 x 20, 30 x 40 and 100 x 100 sets
    were compared by hash when the change was made, docs/results/benchmarks.md)."""
    cfg = DataConfig(rows=9, cols=11, train=40, test=20, seed=3)
    with threadpool_limits(limits=2, user_api="blas"):
        before = lounge.generate_lounge.__wrapped__(cfg)  # as it ran before: BLAS's own count
        seen: list[int] = []
        blobs = lounge._blobs
        monkeypatch.setattr(lounge, "_blobs",
                            lambda *a: (seen.append(blas_threads()), blobs(*a))[1])
        after = lounge.generate_lounge(cfg)
    assert seen == [1]
    for name in ("X_train", "y_train", "X_test", "y_test"):
        assert _same_bits(getattr(before, name), getattr(after, name))
