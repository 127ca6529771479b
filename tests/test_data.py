"""The data layer: label rule, data set files, sensor logs, statistics, and `meshdl data`."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshdl.data.datasets import (
    DATASET_KEYS,
    Dataset,
    dataset_from_log,
    dataset_stats,
    hidden_by_dead,
    label_maps,
    load_dataset,
    load_log,
    max_neighbour_diff,
    save_dataset,
)
from meshdl.errors import DataError, UsageError

# --------------------------------------------------------------------------- helpers


def _maps(*grids: list[list[float]]) -> np.ndarray:
    return np.array(grids, dtype=np.float32)


def _small_dataset(meta: dict[str, Any] | None = None) -> Dataset:
    rng = np.random.default_rng(1)
    X_train = (20 + rng.normal(0, 1, (6, 3, 4))).astype(np.float32)
    X_test = (20 + rng.normal(0, 1, (4, 3, 4))).astype(np.float32)
    return Dataset(
        X_train=X_train,
        y_train=label_maps(X_train),
        X_test=X_test,
        y_test=label_maps(X_test),
        meta=meta if meta is not None else {"generator": "test", "threshold": 3.0},
    )


def _arrays(ds: Dataset) -> dict[str, np.ndarray]:
    return {key: getattr(ds, key) for key in DATASET_KEYS}


def _write_npz(path: Path, **arrays: Any) -> Path:
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _naive_max_diff(X: np.ndarray) -> np.ndarray:
    out = np.zeros(len(X), dtype=np.float32)
    for n, grid in enumerate(X):
        rows, cols = grid.shape
        for r in range(rows):
            for c in range(cols):
                for dr, dc in ((1, 0), (0, 1)):
                    if r + dr < rows and c + dc < cols:
                        out[n] = max(out[n], abs(grid[r, c] - grid[r + dr, c + dc]))
    return out


# --------------------------------------------------------------------------- label rule


def test_label_rule_fires_on_a_vertical_or_horizontal_pair_at_the_threshold() -> None:
    flat = [[20.0, 20.0], [20.0, 20.0]]
    vertical = [[20.0, 20.0], [23.0, 20.0]]
    horizontal = [[20.0, 22.5], [20.0, 20.0]]
    X = _maps(flat, vertical, horizontal)
    assert max_neighbour_diff(X).tolist() == [0.0, 3.0, 2.5]
    assert label_maps(X, threshold=3.0).tolist() == [0, 1, 0]
    assert label_maps(X, threshold=2.5).tolist() == [0, 1, 1]


def test_label_rule_ignores_diagonal_neighbours() -> None:
    X = _maps([[20.0, 21.5], [21.5, 23.0]])  # 3 °C only across the diagonal
    assert max_neighbour_diff(X).tolist() == [1.5]
    assert label_maps(X).tolist() == [0]


def test_label_rule_on_a_1x1_grid_is_always_negative() -> None:
    X = np.array([[[20.0]], [[99.0]]], dtype=np.float32)
    assert max_neighbour_diff(X).tolist() == [0.0, 0.0]
    assert label_maps(X).tolist() == [0, 0]


def test_label_rule_on_single_row_and_single_column_grids() -> None:
    row = np.array([[[20.0, 21.0, 24.5, 24.0]]], dtype=np.float32)
    col = row.transpose(0, 2, 1)
    assert max_neighbour_diff(row).tolist() == [3.5]
    assert max_neighbour_diff(col).tolist() == [3.5]
    assert label_maps(row).tolist() == label_maps(col).tolist() == [1]


def test_label_rule_returns_int64_labels_and_float32_diffs() -> None:
    X = np.zeros((3, 2, 2), dtype=np.float64)
    assert label_maps(X).dtype == np.int64
    assert max_neighbour_diff(X).dtype == np.float32


def test_label_rule_keeps_leading_batch_axes() -> None:
    X = np.zeros((2, 3, 4, 5), dtype=np.float32)
    X[1, 2, 0, 0] = 4.0
    assert max_neighbour_diff(X).shape == (2, 3)
    assert label_maps(X)[1, 2] == 1
    assert label_maps(X).sum() == 1


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5)),
        elements=st.floats(-40, 60, width=32),
    ),
    st.floats(0.1, 10.0),
)
def test_label_rule_matches_a_naive_loop_over_neighbour_pairs(
    X: np.ndarray, threshold: float
) -> None:
    naive = _naive_max_diff(X)
    np.testing.assert_array_equal(max_neighbour_diff(X), naive)
    np.testing.assert_array_equal(label_maps(X, threshold), naive >= np.float32(threshold))


# --------------------------------------------------------------------------- data set files


def test_save_then_load_round_trips_arrays_and_meta(tmp_path: Path) -> None:
    ds = _small_dataset(meta={"generator": "test", "threshold": 3.0, "nested": {"a": [1, 2]}})
    path = save_dataset(ds, tmp_path / "sub" / "dir" / "ds.npz")
    back = load_dataset(path)
    for key in DATASET_KEYS:
        np.testing.assert_array_equal(getattr(back, key), getattr(ds, key))
        assert getattr(back, key).dtype == getattr(ds, key).dtype
    assert back.meta == ds.meta
    assert (back.rows, back.cols) == (3, 4)


def test_saved_file_loads_without_pickle_and_holds_exactly_the_documented_keys(
    tmp_path: Path,
) -> None:
    path = save_dataset(_small_dataset(), tmp_path / "ds.npz")
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted([*DATASET_KEYS, "meta"])
        assert archive["meta"].ndim == 0
        assert json.loads(archive["meta"].item())["generator"] == "test"
    assert not list(tmp_path.glob("*.partial"))


def test_dataset_converts_float64_maps_and_int32_labels() -> None:
    ds = _small_dataset()
    arrays = _arrays(ds)
    arrays["X_train"] = arrays["X_train"].astype(np.float64)
    arrays["y_train"] = arrays["y_train"].astype(np.int32)
    converted = Dataset(**arrays)
    assert converted.X_train.dtype == np.float32
    assert converted.y_train.dtype == np.int64


def test_dataset_refuses_meta_that_is_not_json() -> None:
    with pytest.raises(DataError, match="meta is not JSON-able"):
        _small_dataset(meta={"bad": np.float32(1.0)})


def test_dataset_refuses_nan_maps_on_construction() -> None:
    arrays = _arrays(_small_dataset())
    arrays["X_train"] = arrays["X_train"].copy()
    arrays["X_train"][0, 0, 0] = np.nan
    with pytest.raises(DataError, match="train split"):
        Dataset(**arrays)


def test_load_dataset_rejects_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data set not found"):
        load_dataset(tmp_path / "nope.npz")


def test_load_dataset_rejects_a_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a directory"):
        load_dataset(tmp_path)


def test_load_dataset_rejects_a_text_file(tmp_path: Path) -> None:
    path = tmp_path / "ds.npz"
    path.write_text("timestamp,row,col,value\n")
    with pytest.raises(DataError, match=r"not an \.npz file"):
        load_dataset(path)


def test_load_dataset_rejects_a_single_npy_array(tmp_path: Path) -> None:
    path = tmp_path / "ds.npz"
    with open(path, "wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(DataError, match=r"single \.npy array"):
        load_dataset(path)


def test_load_dataset_rejects_a_truncated_file(tmp_path: Path) -> None:
    path = save_dataset(_small_dataset(), tmp_path / "ds.npz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupt"):
        load_dataset(path)


def test_load_dataset_refuses_pickled_objects(tmp_path: Path) -> None:
    arrays = _arrays(_small_dataset())
    arrays["meta"] = np.array([{"evil": True}], dtype=object)
    path = _write_npz(tmp_path / "ds.npz", **arrays)
    with pytest.raises(DataError, match="pickled"):
        load_dataset(path)


def test_load_dataset_names_missing_keys(tmp_path: Path) -> None:
    arrays = _arrays(_small_dataset())
    del arrays["y_test"]
    path = _write_npz(tmp_path / "ds.npz", **arrays)
    with pytest.raises(DataError, match="missing key\\(s\\) y_test"):
        load_dataset(path)


def test_load_dataset_points_a_sensor_log_to_load_log(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "log.npz", X=np.zeros((3, 2, 2), dtype=np.float32))
    with pytest.raises(DataError, match="looks like a sensor log"):
        load_dataset(path)


def test_load_dataset_loads_a_file_without_meta_with_empty_meta(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "ds.npz", **_arrays(_small_dataset()))
    assert load_dataset(path).meta == {}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("X_train", np.zeros((6, 3, 4), dtype=np.int64), "X_train has dtype int64"),
        ("y_train", np.zeros(6, dtype=np.float64), "y_train has dtype float64"),
        ("X_test", np.zeros((4, 12), dtype=np.float32), "X_test must be 3-D"),
        ("y_test", np.zeros((4, 1), dtype=np.int64), "y_test must be 1-D"),
        ("y_train", np.zeros(5, dtype=np.int64), "X_train holds 6 maps but y_train 5 labels"),
        ("X_test", np.zeros((4, 3, 5), dtype=np.float32), "train maps are 3 x 4 but test maps"),
        ("y_test", np.array([0, 1, -1, 0]), "y_test holds 1 negative label"),
        ("X_test", np.zeros((0, 3, 4), dtype=np.float32), "X_test holds 0 maps but y_test 4"),
    ],
)
def test_load_dataset_rejects_malformed_arrays_with_one_line(
    tmp_path: Path, key: str, value: np.ndarray, message: str
) -> None:
    arrays = _arrays(_small_dataset())
    arrays[key] = value
    path = _write_npz(tmp_path / "ds.npz", **arrays)
    with pytest.raises(DataError, match=message) as caught:
        load_dataset(path)
    assert "\n" not in str(caught.value)
    assert str(path) in str(caught.value)


def test_load_dataset_rejects_an_empty_split(tmp_path: Path) -> None:
    arrays = _arrays(_small_dataset())
    arrays["X_test"] = np.zeros((0, 3, 4), dtype=np.float32)
    arrays["y_test"] = np.zeros(0, dtype=np.int64)
    path = _write_npz(tmp_path / "ds.npz", **arrays)
    with pytest.raises(DataError, match="the test split holds no maps"):
        load_dataset(path)


def test_load_dataset_rejects_nan_readings_naming_the_split(tmp_path: Path) -> None:
    arrays = _arrays(_small_dataset())
    X_test = arrays["X_test"].copy()
    X_test[1, 0, 0] = np.nan
    X_test[1, 2, 3] = np.nan
    X_test[3, 1, 1] = np.inf
    arrays["X_test"] = X_test
    path = _write_npz(tmp_path / "ds.npz", **arrays)
    with pytest.raises(DataError, match=r"test split \(X_test\) holds 2 NaN and 1 inf") as caught:
        load_dataset(path)
    assert "in 2 of 4 maps" in str(caught.value)


def test_load_dataset_rejects_meta_that_is_not_a_json_object(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "ds.npz", **_arrays(_small_dataset()), meta=np.array("[1, 2"))
    with pytest.raises(DataError, match="meta is not valid JSON"):
        load_dataset(path)


# --------------------------------------------------------------------------- sensor logs


LONG_CSV = """timestamp,row,col,value
2024-04-01T00:30,0,0,21.0
2024-04-01T00:30,0,1,21.5
2024-04-01T00:30,1,0,20.5
2024-04-01T00:30,1,1,
2024-04-01T00:00,0,0,20.0
2024-04-01T00:00,0,1,20.5
2024-04-01T00:00,1,0,24.0
2024-04-01T00:00,1,1,20.0
2024-04-01T01:00,0,0,21.0
2024-04-01T01:00,1,0,NA
2024-04-01T01:00,1,1,21.2
2024-04-01T01:30,0,0,21.0
2024-04-01T01:30,0,1,21.0
2024-04-01T01:30,1,0,21.0
2024-04-01T01:30,1,1,21.0
2024-04-01T02:00,0,0,22.0
2024-04-01T02:00,0,1,21.0
2024-04-01T02:00,1,0,21.0
2024-04-01T02:00,1,1,21.0
"""


def _long_log(tmp_path: Path, text: str = LONG_CSV) -> Path:
    path = tmp_path / "log.csv"
    path.write_text(text)
    return path


def test_load_log_reports_absent_empty_and_na_readings_as_missing(tmp_path: Path) -> None:
    log = load_log(_long_log(tmp_path))
    assert (log.slots, log.rows, log.cols) == (5, 2, 2)
    assert log.maps.dtype == np.float32
    assert log.missing == 3  # (00:30, 1,1) empty; (01:00, 0,1) absent; (01:00, 1,0) "NA"
    assert log.missing_by_cell.tolist() == [[0, 1], [1, 1]]
    assert log.missing_by_slot.tolist() == [0, 1, 2, 0, 0]
    assert log.complete.tolist() == [True, False, False, True, True]
    assert np.isnan(log.maps[2, 0, 1]) and np.isnan(log.maps[2, 1, 0])
    summary = log.summary()
    assert summary["missing"] == 3
    assert summary["complete_slots"] == 3
    assert summary["worst_slots"][0] == {"timestamp": "2024-04-01T01:00", "missing": 2}


def test_load_log_sorts_slots_by_time(tmp_path: Path) -> None:
    log = load_log(_long_log(tmp_path))
    assert log.timestamps[:2] == ["2024-04-01T00:00", "2024-04-01T00:30"]
    assert log.maps[0, 1, 0] == pytest.approx(24.0)


def test_load_log_with_a_fixed_grid_counts_never_reporting_sensors(tmp_path: Path) -> None:
    log = load_log(_long_log(tmp_path), rows=3, cols=2)
    assert log.rows == 3
    assert log.missing_by_cell[2].tolist() == [5, 5]
    assert not log.complete.any()


def test_load_log_rejects_a_reading_outside_the_given_grid(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="line 4: row 1 is outside a grid of 1 rows"):
        load_log(_long_log(tmp_path), rows=1)


def test_load_log_rejects_two_readings_for_one_slot_and_cell(tmp_path: Path) -> None:
    text = LONG_CSV + "2024-04-01T02:00,1,1,25.0\n"
    with pytest.raises(DataError, match=r"2 readings for slot '2024-04-01T02:00' cell \(1, 1\)"):
        load_log(_long_log(tmp_path, text))


def test_load_log_names_the_line_of_a_value_that_is_not_a_number(tmp_path: Path) -> None:
    text = LONG_CSV.replace("2024-04-01T01:30,0,1,21.0", "2024-04-01T01:30,0,1,warm")
    with pytest.raises(DataError, match="line 14: value 'warm' is not a number"):
        load_log(_long_log(tmp_path, text))


def test_load_log_rejects_an_unknown_header(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown CSV header"):
        load_log(_long_log(tmp_path, "time,x,y,temp\n1,0,0,20\n"))


def test_load_log_rejects_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="sensor log not found"):
        load_log(tmp_path / "log.csv")


def test_load_log_reads_the_wide_format(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_text("timestamp,r0c0,r0c1,r1c0,r1c1\n10,20,21,22,\n20,20,nan,22,23\n5,1,2,3,4\n")
    log = load_log(path)
    assert log.timestamps == ["5", "10", "20"]  # numeric stamps are sorted
    assert log.missing == 2
    assert log.complete.tolist() == [True, False, False]
    assert log.maps[0].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_load_log_reads_an_npz_with_nan_and_timestamps(tmp_path: Path) -> None:
    X = np.full((4, 2, 3), 21.0, dtype=np.float32)
    X[2, 1, 1] = np.nan
    stamps = np.array(["2024-01-01T00:00", "2024-01-01T00:30", "2024-01-01T01:00",
                       "2024-01-01T01:30"])
    path = _write_npz(tmp_path / "log.npz", maps=X, timestamps=stamps)
    log = load_log(path, rows=2, cols=3)
    assert log.missing == 1
    assert log.timestamps == stamps.tolist()
    assert log.format == "npz"


def test_load_log_npz_rejects_a_grid_other_than_the_expected_one(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "log.npz", X=np.zeros((2, 2, 3), dtype=np.float32))
    with pytest.raises(DataError, match="the log has 3 cols, expected 4"):
        load_log(path, cols=4)


def test_load_log_npz_without_maps_points_a_dataset_to_load_dataset(tmp_path: Path) -> None:
    path = save_dataset(_small_dataset(), tmp_path / "ds.npz")
    with pytest.raises(DataError, match=r"no key X or maps.*use load_dataset"):
        load_log(path)


# --------------------------------------------------------------------------- log -> data set


def _hourly_log(tmp_path: Path, slots: int = 20) -> Path:
    rng = np.random.default_rng(3)
    X = (21 + rng.normal(0, 1.2, (slots, 3, 3))).astype(np.float32)
    X[5, 0, 0] = np.nan
    X[6, 2, 2] = np.nan
    stamps = np.array([f"2024-04-01T{h:02d}:00" for h in range(slots)])
    return _write_npz(tmp_path / "log.npz", X=X, timestamps=stamps)


def test_dataset_from_log_uses_only_complete_slots_and_says_why(tmp_path: Path) -> None:
    log = load_log(_hourly_log(tmp_path))
    ds = dataset_from_log(log, threshold=3.0, test_fraction=0.25)
    assert len(ds.X_train) + len(ds.X_test) == 18
    assert ds.meta["slots_dropped"] == 2
    assert "missing reading" in ds.meta["dropped_reason"]
    assert ds.meta["slot_minutes"] == 60.0
    assert not np.isnan(ds.X_train).any()


def test_dataset_from_log_tests_on_the_last_slots_in_time_order(tmp_path: Path) -> None:
    log = load_log(_hourly_log(tmp_path))
    ds = dataset_from_log(log, test_fraction=0.25)
    complete = log.maps[log.complete]
    np.testing.assert_array_equal(ds.X_test, complete[-len(ds.X_test):])
    assert len(ds.X_test) == 4  # round(18 * 0.25) = 4
    assert ds.meta["test_period"] == ["2024-04-01T16:00", "2024-04-01T19:00"]
    # The training maps are the earlier ones, only reordered.
    train_sorted = np.sort(ds.X_train.reshape(len(ds.X_train), -1), axis=0)
    early = np.sort(complete[: len(ds.X_train)].reshape(len(ds.X_train), -1), axis=0)
    np.testing.assert_array_equal(train_sorted, early)


def test_dataset_from_log_labels_by_the_rule(tmp_path: Path) -> None:
    ds = dataset_from_log(load_log(_hourly_log(tmp_path)), threshold=2.0)
    np.testing.assert_array_equal(ds.y_train, label_maps(ds.X_train, 2.0))
    np.testing.assert_array_equal(ds.y_test, label_maps(ds.X_test, 2.0))


def test_dataset_from_log_needs_two_complete_slots(tmp_path: Path) -> None:
    X = np.full((3, 2, 2), 20.0, dtype=np.float32)
    X[:2, 0, 0] = np.nan
    log = load_log(_write_npz(tmp_path / "log.npz", X=X))
    with pytest.raises(DataError, match="only 1 of 3 slots are complete"):
        dataset_from_log(log)


def test_dataset_from_log_rejects_a_test_fraction_outside_0_1(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="test_fraction"):
        dataset_from_log(load_log(_hourly_log(tmp_path)), test_fraction=1.0)


# --------------------------------------------------------------------------- statistics


def _dataset_with_diffs(train: list[float], test: list[float]) -> Dataset:
    """1 x 2 maps whose largest neighbour difference is exactly the given value."""

    def maps(diffs: list[float]) -> np.ndarray:
        return np.array([[[20.0, 20.0 + d]] for d in diffs], dtype=np.float32)

    X_train, X_test = maps(train), maps(test)
    return Dataset(X_train, label_maps(X_train), X_test, label_maps(X_test), {"threshold": 3.0})


def test_dataset_stats_measures_near_threshold_fractions_per_class() -> None:
    ds = _dataset_with_diffs(
        train=[3.25, 5.0, 2.75, 1.0, 0.5, 3.0], test=[3.5, 6.0, 2.5, 2.25]
    )
    stats = dataset_stats(ds)
    assert stats["threshold"] == 3.0
    train, test = stats["train"], stats["test"]
    assert train["positives"] == 3 and train["positive_fraction"] == 0.5
    assert train["near_threshold_positive_fraction"] == pytest.approx(2 / 3)  # 3.25 and 3.0
    assert train["near_threshold_negative_fraction"] == pytest.approx(1 / 3)  # 2.75
    assert test["near_threshold_positive_fraction"] == 0.5
    assert test["near_threshold_negative_fraction"] == 0.5  # 2.5, not 2.25
    assert train["temp_min"] == 20.0 and train["temp_max"] == 25.0
    assert train["labels_match_rule"] == 1.0
    assert stats["checks"] == {
        "positives_20_to_80_percent": True,
        "near_threshold_positives_at_least_25_percent": True,
        "near_threshold_negatives_at_least_25_percent": True,
    }


def test_dataset_stats_fails_the_checks_for_an_absent_class() -> None:
    stats = dataset_stats(_dataset_with_diffs(train=[1.0, 2.0], test=[0.5]))
    assert stats["train"]["near_threshold_positive_fraction"] is None
    assert not stats["checks"]["positives_20_to_80_percent"]
    assert not stats["checks"]["near_threshold_positives_at_least_25_percent"]


def test_dataset_stats_at_another_threshold_reports_label_disagreement() -> None:
    ds = _dataset_with_diffs(train=[3.25, 2.0], test=[2.5])
    stats = dataset_stats(ds, threshold=2.0)
    assert stats["threshold"] == 2.0
    assert stats["train"]["labels_match_rule"] == 0.5
    json.dumps(stats)  # JSON-able as it is


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def data_cli() -> Any:
    """The `meshdl data` sub-app (imported here so that only the CLI tests need the CLI)."""
    from meshdl.cli import data

    return data.app


def test_cli_generate_keeps_an_existing_data_set_unless_forced(tmp_path: Path, cli) -> None:
    """A 12 x 20 lounge written to the default path replaced a user's 17 x 25 one."""
    from tests.helpers import assert_one_line_error

    out = tmp_path / "lounge.npz"
    small = ("--out", out, "--train", "20", "--test", "10", "--cols", "5")
    code, _, err = cli("data", "generate", *small, "--rows", "4")
    assert code == 0, err
    before = out.read_bytes()
    code, _, err = cli("data", "generate", *small, "--rows", "3")
    assert_one_line_error(code, err, 1, "exists; pass --force")
    assert out.read_bytes() == before
    code, _, err = cli("data", "generate", *small, "--rows", "3", "--force")
    assert code == 0, err
    assert out.read_bytes() != before


def test_cli_generate_refuses_a_directory_before_drawing_any_lounge(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out DIR --force` drew the whole data set, wrote DIR.partial and then failed on
    "Is a directory: DIR.partial" (exit 1, a path the user never typed); without
    --force it advised --force. Both are a wrong request, refused before any work."""
    from meshdl.data import lounge
    from tests.helpers import assert_one_line_error

    monkeypatch.setattr(lounge, "generate_lounge", lambda cfg: pytest.fail("generated"))
    (tmp_path / "kept.txt").write_text("mine")
    for force in ((), ("--force",)):
        code, _, err = cli("data", "generate", "--out", tmp_path, *force)
        assert_one_line_error(code, err, 2, f"{tmp_path} is a directory")
        code, _, err = cli("data", "generate", "--out", tmp_path / "kept.txt" / "x.npz", *force)
        assert_one_line_error(code, err, 2, "kept.txt is a file, not a directory")
    code, _, err = cli("config", "init", tmp_path, "--force")
    assert_one_line_error(code, err, 2, "is a directory")
    assert [path.name for path in tmp_path.iterdir()] == ["kept.txt"]


def test_cli_generate_then_inspect_json_reports_the_passing_checks(
    tmp_path: Path, data_cli: Any
) -> None:
    from typer.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "nested" / "lounge.npz"
    args = ["generate", "--out", str(out), "--rows", "8", "--cols", "9", "--train", "300",
            "--test", "120", "--seed", "4", "--json"]
    made = runner.invoke(data_cli, args)
    assert made.exit_code == 0, made.output
    assert out.is_file()
    generated = json.loads(made.stdout)
    assert generated["config"]["rows"] == 8
    assert "wrote" in made.stderr

    shown = runner.invoke(data_cli, ["inspect", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["kind"] == "dataset"
    assert report["stats"] == generated["stats"]
    assert report["meta"]["seed"] == 4
    assert all(report["stats"]["checks"].values())


def test_cli_inspect_prints_a_table_for_a_data_set(tmp_path: Path, data_cli: Any) -> None:
    from typer.testing import CliRunner

    path = save_dataset(_small_dataset(), tmp_path / "ds.npz")
    shown = CliRunner().invoke(data_cli, ["inspect", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "acceptance checks" in shown.stdout
    assert "positives" in shown.stdout


def test_cli_inspect_reports_missing_readings_of_a_log(tmp_path: Path, data_cli: Any) -> None:
    from typer.testing import CliRunner

    shown = CliRunner().invoke(data_cli, ["inspect", str(_long_log(tmp_path)), "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["kind"] == "log"
    assert report["log"]["missing"] == 3
    assert report["as_dataset"]["train"]["count"] + report["as_dataset"]["test"]["count"] == 3
    assert "3 of 20 readings are missing" in shown.stderr


def test_cli_inspect_raises_data_error_for_a_missing_file(tmp_path: Path, data_cli: Any) -> None:
    from typer.testing import CliRunner

    shown = CliRunner().invoke(data_cli, ["inspect", str(tmp_path / "none.npz")])
    assert isinstance(shown.exception, DataError)


def test_cli_inspect_reads_a_log_npz_as_a_log(tmp_path: Path, data_cli: Any) -> None:
    from typer.testing import CliRunner

    shown = CliRunner().invoke(data_cli, ["inspect", str(_hourly_log(tmp_path)), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["log"]["missing"] == 2


def test_zip_member_names_match_what_the_cli_sniffs(tmp_path: Path) -> None:
    """`meshdl data inspect` tells data sets from logs by the archive's member names."""
    path = save_dataset(_small_dataset(), tmp_path / "ds.npz")
    with zipfile.ZipFile(path) as archive:
        assert "X_train.npy" in archive.namelist()


# --------------------------------------------------------------------------- dead cells


def test_an_anomaly_is_hidden_only_when_every_deciding_pair_has_a_dead_cell() -> None:
    maps = _maps(
        [[20.0, 24.0, 20.0], [20.0, 20.0, 20.0]],  # (0,1) differs from three neighbours
        [[20.0, 20.0, 20.0], [20.0, 20.0, 25.0]],  # (1,2) against (0,2) and (1,1)
        [[20.0, 21.0, 22.0], [20.0, 20.0, 20.0]],  # no anomaly at all
    )
    dead = np.zeros((2, 3), dtype=bool)
    dead[0, 1] = True  # every pair of the first map's anomaly
    assert hidden_by_dead(maps, dead).tolist() == [True, False, False]
    dead[:] = False
    dead[0, 2] = True  # one of the second map's two pairs: the other still shows it
    assert hidden_by_dead(maps, dead).tolist() == [False, False, False]
    dead[1, 1] = True
    assert hidden_by_dead(maps, dead).tolist() == [False, True, False]


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, (3, 4, 5), elements=st.floats(15, 30, width=32)),
       hnp.arrays(np.bool_, (4, 5)))
def test_hidden_anomalies_are_those_labelled_that_the_live_cells_alone_would_not_be(
    maps: np.ndarray, dead: np.ndarray
) -> None:
    by_hand = []
    for full in maps:
        shown = any(abs(full[r, c] - full[r2, c2]) >= np.float32(3.0)
                    for r in range(4) for c in range(5)
                    for r2, c2 in ((r + 1, c), (r, c + 1)) if r2 < 4 and c2 < 5
                    and not dead[r, c] and not dead[r2, c2])
        by_hand.append(bool(label_maps(full[None])[0]) and not shown)
    assert hidden_by_dead(maps, dead).tolist() == by_hand


def test_cli_inspect_counts_the_anomalies_the_failures_experiments_dead_cells_hide(
    tmp_path: Path, data_cli: Any
) -> None:
    from typer.testing import CliRunner

    from meshdl.sim.faults.dead import DeadCells

    rng = np.random.default_rng(5)  # rough maps: many anomalies, some of them hidden
    X_train, X_test = (20 + rng.normal(0, 2, (60, 3, 4)) for _ in range(2))
    ds = Dataset(X_train=X_train, y_train=label_maps(X_train), X_test=X_test,
                 y_test=label_maps(X_test), meta={"generator": "test", "threshold": 3.0})
    path = save_dataset(ds, tmp_path / "ds.npz")
    shown = CliRunner().invoke(data_cli, ["inspect", str(path), "--dead", "0.5",
                                          "--dead-seed", "3", "--edge-at", "0,0", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)["dead"]
    cells = [(r, c) for r in range(ds.rows) for c in range(ds.cols)]
    dead = np.zeros((ds.rows, ds.cols), dtype=bool)
    for r, c in DeadCells(fraction=0.5, seed=3).pick(cells, (0, 0)):
        dead[r, c] = True
    assert report["cells"] == dead.sum() and not dead[0, 0]
    assert report["test"] == hidden_by_dead(ds.X_test, dead).sum()
    assert report["train"] == hidden_by_dead(ds.X_train, dead).sum()
    assert 0 < report["test"] < ds.y_test.sum()  # some anomalies hidden, not all
    printed = CliRunner().invoke(data_cli, ["inspect", str(path), "--dead", "0.5"])
    assert f"{report['cells']} dead cells" in printed.stdout


def test_cli_inspect_refuses_dead_cells_for_a_log(tmp_path: Path, data_cli: Any) -> None:
    from typer.testing import CliRunner

    shown = CliRunner().invoke(data_cli, ["inspect", str(_long_log(tmp_path)), "--dead", "0.1"])
    assert isinstance(shown.exception, UsageError)
    assert "--dead takes a data set" in str(shown.exception)
