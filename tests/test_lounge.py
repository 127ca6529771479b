"""The synthetic lounge generator: determinism, shape, plausibility, acceptance rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import DataConfig
from meshdl.data.datasets import Dataset, dataset_stats, label_maps, load_dataset, save_dataset
from meshdl.data.lounge import generate_lounge

_CACHE: dict[int, Dataset] = {}


def _default(seed: int) -> Dataset:
    """The default-size data set for `seed`, generated once per test session."""
    if seed not in _CACHE:
        _CACHE[seed] = generate_lounge(DataConfig(seed=seed))
    return _CACHE[seed]


def test_default_config_has_the_seed_experiment_shapes_and_dtypes() -> None:
    ds = _default(0)
    assert ds.X_train.shape == (2400, 17, 25)
    assert ds.X_test.shape == (561, 17, 25)
    assert ds.X_train.dtype == ds.X_test.dtype == np.float32
    assert ds.y_train.dtype == ds.y_test.dtype == np.int64
    assert (ds.rows, ds.cols) == (17, 25)


def test_labels_follow_the_neighbour_rule_exactly() -> None:
    ds = _default(0)
    np.testing.assert_array_equal(ds.y_train, label_maps(ds.X_train, 3.0))
    np.testing.assert_array_equal(ds.y_test, label_maps(ds.X_test, 3.0))


def test_same_seed_gives_identical_data_and_another_seed_does_not() -> None:
    cfg = DataConfig(rows=9, cols=11, train=300, test=80, seed=7)
    first, second = generate_lounge(cfg), generate_lounge(cfg)
    for key in ("X_train", "y_train", "X_test", "y_test"):
        np.testing.assert_array_equal(getattr(first, key), getattr(second, key))
    assert first.meta == second.meta
    other = generate_lounge(cfg.model_copy(update={"seed": 8}))
    assert not np.array_equal(first.X_train, other.X_train)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_acceptance_rules_hold_for_the_default_config(seed: int) -> None:
    stats = dataset_stats(_default(seed), 3.0)
    for split in ("train", "test"):
        s = stats[split]
        assert 0.20 <= s["positive_fraction"] <= 0.80, (split, s)
        assert s["near_threshold_positive_fraction"] >= 0.25, (split, s)
        assert s["near_threshold_negative_fraction"] >= 0.25, (split, s)
    assert all(stats["checks"].values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperatures_stay_plausible_for_a_lounge(seed: int) -> None:
    ds = _default(seed)
    both = np.concatenate([ds.X_train, ds.X_test])
    assert both.min() > 5.0 and both.max() < 40.0
    assert 19.0 < both.mean() < 24.0
    # Noise alone must not cross the threshold: many maps are calm.
    stats = dataset_stats(ds, 3.0)
    assert stats["train"]["max_diff_mean"] < 3.0


def test_the_map_is_spatially_smooth_away_from_features() -> None:
    """Most neighbour differences are small: maps are fields, not white noise."""
    X = _default(0).X_test
    diffs = np.abs(np.diff(X, axis=2))
    assert np.median(diffs) < 0.3


def test_the_room_follows_a_daily_cycle() -> None:
    """Test maps are in time order: the room is warmer by day (HVAC) than before dawn."""
    X = _default(0).X_test
    means = X.mean(axis=(1, 2))
    hours = (np.arange(len(X)) * 0.5) % 24  # the test split starts at midnight (2400 slots)
    assert means[(hours >= 12) & (hours < 16)].mean() > means[(hours >= 3) & (hours < 6)].mean()


def test_meta_records_how_the_data_was_made() -> None:
    meta = _default(0).meta
    json.dumps(meta)
    assert meta["generator"] == "meshdl.data.lounge.generate_lounge"
    assert meta["config"] == DataConfig().model_dump()
    assert meta["slot_minutes"] == 30 and meta["threshold"] == 3.0 and meta["seed"] == 0
    assert meta["counts"]["train"] == 2400 and meta["counts"]["test"] == 561
    assert meta["counts"]["train_positives"] == int(_default(0).y_train.sum())
    assert sum(meta["anomaly_slots"]["train"].values()) > 0


@pytest.mark.parametrize(
    ("rows", "cols", "train", "test"),
    [(1, 1, 1, 1), (1, 1, 40, 10), (1, 6, 3, 2), (6, 1, 5, 1), (2, 2, 30, 7), (3, 3, 1, 1)],
)
def test_tiny_grids_and_splits_generate_without_crashing(
    rows: int, cols: int, train: int, test: int
) -> None:
    ds = generate_lounge(DataConfig(rows=rows, cols=cols, train=train, test=test))
    assert ds.X_train.shape == (train, rows, cols)
    assert ds.X_test.shape == (test, rows, cols)
    assert np.isfinite(ds.X_train).all() and np.isfinite(ds.X_test).all()
    stats = dataset_stats(ds, 3.0)
    assert set(stats["checks"]) == {
        "positives_20_to_80_percent",
        "near_threshold_positives_at_least_25_percent",
        "near_threshold_negatives_at_least_25_percent",
    }


def test_a_1x1_grid_has_only_negatives_and_reports_failed_checks() -> None:
    ds = generate_lounge(DataConfig(rows=1, cols=1, train=20, test=5))
    assert ds.y_train.sum() == ds.y_test.sum() == 0
    assert not any(dataset_stats(ds, 3.0)["checks"].values())


def test_a_medium_grid_with_another_threshold_still_meets_the_rules() -> None:
    cfg = DataConfig(rows=10, cols=12, train=600, test=200, threshold=2.0, seed=5)
    stats = dataset_stats(generate_lounge(cfg), cfg.threshold)
    assert all(stats["checks"].values()), stats


def test_generated_data_set_survives_a_file_round_trip(tmp_path: Path) -> None:
    ds = generate_lounge(DataConfig(rows=5, cols=6, train=20, test=10, seed=3))
    back = load_dataset(save_dataset(ds, tmp_path / "lounge.npz"))
    np.testing.assert_array_equal(back.X_test, ds.X_test)
    np.testing.assert_array_equal(back.y_train, ds.y_train)
    assert back.meta == ds.meta
