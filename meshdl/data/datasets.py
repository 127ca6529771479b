"""The data layer: temperature-map data sets, the anomaly label rule, and their files.

A data set is a stack of 2-D temperature maps in °C (one map per time slot, one value per
sensor node) with one integer label per map. The label rule of the seed experiment is
"1 if any up/down/left/right neighbour pair differs by >= threshold °C". This module owns
that rule (`max_neighbour_diff`, `label_maps`), the `Dataset` container and its `.npz`
file (never pickled), the loader of real sensor logs (`load_log`: NPZ or CSV, with every
missing reading counted and reported, never silently used), the conversion of a log into a
data set (`dataset_from_log`) and the statistics that tell whether a data set is a fair
test of a classifier (`dataset_stats`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from meshdl.data.npzfile import ArrayHeader, read_npz
from meshdl.errors import DataError, UsageError

__all__ = [
    "DATASET_KEYS",
    "NEAR_BAND",
    "Dataset",
    "LogData",
    "check_label_range",
    "dataset_from_log",
    "dataset_stats",
    "hidden_by_dead",
    "label_maps",
    "load_dataset",
    "load_log",
    "max_neighbour_diff",
    "save_dataset",
]

#: Width (°C) of the bands just above and just below the threshold in which a data set must
#: hold many of its maps, so that a classifier cannot separate the classes by a wide margin.
NEAR_BAND = 0.6
#: Acceptance rules a data set is measured against (see `dataset_stats`).
MIN_NEAR_FRACTION = 0.25
POSITIVE_FRACTION_RANGE = (0.20, 0.80)

#: The array keys of a data set file; `meta` (a JSON string) is written too, but optional
#: on load so that files made by other tools can be read.
DATASET_KEYS = ("X_train", "y_train", "X_test", "y_test")
_SPLITS = (("train", "X_train", "y_train"), ("test", "X_test", "y_test"))
_MISSING_TOKENS = frozenset({"", "nan", "na", "n/a", "null", "none", "-"})


# --------------------------------------------------------------------------- label rule


def cell_series(X: np.ndarray, cell: tuple[int, int]) -> np.ndarray:
    """One cell's readings, (samples, channels) float32, from maps (N, rows, cols) or
    (N, channels, rows, cols): what the sensor node of that cell holds."""
    maps = X[:, None] if X.ndim == 3 else X
    return np.ascontiguousarray(maps[:, :, cell[0], cell[1]], np.float32)


def max_neighbour_diff(X: np.ndarray) -> np.ndarray:
    """Largest |difference| of any up/down/left/right neighbour pair in each map.

    `X` has shape (..., rows, cols); the result has shape `X.shape[:-2]` (so (N,) for a
    stack of N maps), float32. Differences are taken on the float32 readings, i.e. on the
    very values a data set stores, so `label_maps(ds.X_train)` reproduces `ds.y_train`
    bit for bit. A 1 x 1 grid has no neighbour pair: its value is 0. A NaN reading makes
    the map's value NaN (the loaders refuse NaN maps, so this only matters for raw arrays).
    """
    maps = np.asarray(X, dtype=np.float32)
    if maps.ndim < 2:
        raise ValueError(f"maps need at least 2 dimensions (rows, cols), got shape {maps.shape}")
    out = np.zeros(maps.shape[:-2], dtype=np.float32)
    for block, largest in _blocks(maps, out):
        if maps.shape[-2] > 1:
            np.maximum(largest, np.abs(np.diff(block, axis=-2)).max(axis=(-2, -1)),
                       out=largest)
        if maps.shape[-1] > 1:
            np.maximum(largest, np.abs(np.diff(block, axis=-1)).max(axis=(-2, -1)),
                       out=largest)
    return out


DIFF_BLOCK_BYTES = 1 << 25  # 32 MiB of maps a block (`_blocks`)


def _blocks(maps: np.ndarray, out: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`maps` (..., rows, cols) a block of maps at a time, each with its part of `out`
    (shape `maps.shape[:-2]`, written through): differences of a whole data set are
    temporaries its size, and a data set may be most of the machine's memory."""
    flat, flat_out = maps.reshape(-1, *maps.shape[-2:]), out.reshape(-1)
    step = max(1, DIFF_BLOCK_BYTES // max(1, flat[:1].nbytes))
    for start in range(0, len(flat), step):
        yield flat[start:start + step], flat_out[start:start + step]


def label_maps(X: np.ndarray, threshold: float = 3.0) -> np.ndarray:
    """The seed's label rule: 1 where some 4-neighbour pair differs by >= `threshold` °C."""
    return (max_neighbour_diff(X) >= np.float32(threshold)).astype(np.int64)


def hidden_by_dead(X: np.ndarray, dead: np.ndarray, threshold: float = 3.0) -> np.ndarray:
    """Which maps hold an anomaly that only dead cells show: labelled 1 by `label_maps`,
    while every pair differing by >= `threshold` °C has a cell in `dead` ((rows, cols)
    bools). No mesh with those cells dead reads such a map's deciding pair; a model can
    only guess it from what the live cells around it show. (A map labelled 0 has no such
    pair, dead or alive.)"""
    maps = np.asarray(X, dtype=np.float32)
    live = ~np.asarray(dead, dtype=bool)
    limit = np.float32(threshold)
    seen = np.zeros(maps.shape[:-2], dtype=bool)
    for block, part in _blocks(maps, seen):
        if maps.shape[-2] > 1:
            both = live[1:, :] & live[:-1, :]
            part |= ((np.abs(np.diff(block, axis=-2)) >= limit) & both).any(axis=(-2, -1))
        if maps.shape[-1] > 1:
            both = live[:, 1:] & live[:, :-1]
            part |= ((np.abs(np.diff(block, axis=-1)) >= limit) & both).any(axis=(-2, -1))
    return (label_maps(maps, threshold) == 1) & ~seen


# --------------------------------------------------------------------------- the container


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train and test maps with their labels, plus a JSON-able record of where they came from.

    `X_*` are (N, rows, cols) float32 °C, `y_*` are (N,) int64 >= 0. Construction checks
    everything a file could get wrong (shapes, dtypes, NaN, labels) and raises `DataError`,
    so a `Dataset` in hand is always usable. Floating maps are converted to float32 and
    integer labels to int64; anything else is refused rather than guessed at.
    `meta` records the generator or source, its configuration, seed, slot minutes,
    threshold and counts; it must survive `json.dumps`.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = {key: getattr(self, key) for key in DATASET_KEYS}
        for key, value in _checked_arrays(given, where="data set", channels=True).items():
            object.__setattr__(self, key, value)
        if not isinstance(self.meta, dict):
            raise DataError(f"data set: meta must be a dict, got {type(self.meta).__name__}")
        try:
            json.dumps(self.meta)
        except (TypeError, ValueError) as exc:
            raise DataError(f"data set: meta is not JSON-able ({exc})") from None

    def require_classes(self, classes: int, where: str = "data set") -> None:
        """Refuse (`DataError`) a label of either split outside [0, `classes`): a model
        of `classes` outputs cannot learn or score it, and the loss kernel must never
        be handed one (it indexes the logits with it). Construction only knows that
        labels are integers >= 0; how many classes there are is the model's to say."""
        for key in ("y_train", "y_test"):
            check_label_range(getattr(self, key), classes, key, where)

    @property
    def rows(self) -> int:
        """Grid rows (sensor nodes per column)."""
        return int(self.X_train.shape[-2])

    @property
    def cols(self) -> int:
        """Grid columns."""
        return int(self.X_train.shape[-1])

    @property
    def channels(self) -> int:
        """Values per cell and map: 1 for maps (N, rows, cols), C for a model's view of
        them (N, C, rows, cols), such as the readings with the alive mask
        (`meshdl.data.augment.model_view`)."""
        return 1 if self.X_train.ndim == 3 else int(self.X_train.shape[1])

    @property
    def threshold(self) -> float:
        """The label threshold (°C) its `meta` records, else the seed's 3."""
        return float(self.meta.get("threshold", 3.0))


def data_digest(ds: Dataset) -> str:
    """A short fingerprint of a data set's arrays (shapes and bytes, labels included):
    what a node host and the edge compare to know they replay the same data."""
    h = hashlib.sha256()
    for key in DATASET_KEYS:
        array = getattr(ds, key)
        h.update(f"{key}{array.shape}{array.dtype.str}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def load_split(path: str | os.PathLike[str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """The maps and labels of one split ("train" or "test") of a data set file, checked as
    `load_dataset` checks them, except that the other split's readings may have gaps: a
    caller that reads only this split (`meshdl evaluate`) need not refuse a NaN there."""
    source = Path(path)
    checked = _checked_arrays(_dataset_arrays(source), where=str(source), finite=(split,))
    return checked[f"X_{split}"], checked[f"y_{split}"]


def _dataset_arrays(source: Path) -> dict[str, np.ndarray]:
    """The arrays of a data set file, all four keys present, their shapes and dtypes
    checked on the file's headers before any is read."""

    def check(headers: Mapping[str, ArrayHeader]) -> None:
        missing = [key for key in DATASET_KEYS if key not in headers]
        if missing:
            hint = ""
            if "X" in headers or "maps" in headers:
                hint = " (it looks like a sensor log: use load_log / `meshdl data inspect`)"
            raise DataError(
                f"{source}: missing key(s) {', '.join(missing)}; a data set needs "
                f"{', '.join(DATASET_KEYS)} (found: {', '.join(sorted(headers)) or 'nothing'})"
                f"{hint}"
            )
        _check_forms(headers, str(source))

    return read_npz(source, "data set", DataError, check)


class _Shaped(Protocol):
    """An array, or the header that describes one (`npzfile.ArrayHeader`)."""

    shape: tuple[int, ...]
    ndim: int
    dtype: np.dtype


def _check_forms(arrays: Mapping[str, _Shaped], where: str, channels: bool = False) -> None:
    """One-line `DataError` unless the four data set arrays have a data set's ranks,
    dtypes, lengths and grids: what their headers alone tell, so a file is refused
    before its arrays are read. `channels`: maps may also be (N, C, rows, cols), a
    model's view of them in memory (a file holds maps)."""
    for split, x_key, y_key in _SPLITS:
        X, y = arrays[x_key], arrays[y_key]
        _check_maps_form(X, x_key, where, channels)
        _check_labels_form(y, y_key, where)
        if X.shape[0] != y.shape[0]:
            raise DataError(f"{where}: {x_key} holds {X.shape[0]} maps but {y_key} "
                            f"{y.shape[0]} labels")
        if X.shape[0] == 0:
            raise DataError(f"{where}: the {split} split holds no maps")
    train_grid, test_grid = arrays["X_train"].shape[1:], arrays["X_test"].shape[1:]
    if train_grid != test_grid:
        raise DataError(
            f"{where}: train maps are {' x '.join(map(str, train_grid))} but test maps are "
            f"{' x '.join(map(str, test_grid))}"
        )


def _checked_arrays(arrays: Mapping[str, Any], where: str,
                    finite: Sequence[str] = ("train", "test"),
                    channels: bool = False) -> dict[str, np.ndarray]:
    """The four data set arrays, converted and checked (the readings of the `finite`
    splits for NaN and inf too); one-line `DataError` on a problem. `channels`: see
    `_check_forms`."""
    given = {key: np.asarray(arrays[key]) for key in DATASET_KEYS}
    _check_forms(given, where, channels)
    out: dict[str, np.ndarray] = {}
    for _split, x_key, y_key in _SPLITS:
        out[x_key] = _as_maps(given[x_key], x_key, where)
        out[y_key] = _as_labels(given[y_key], y_key, where)
    for split, x_key, y_key in _SPLITS:
        if split in finite:
            _check_finite(out[x_key], split, x_key, where)
        _check_labels(out[y_key], y_key, where)
    return out


def _check_maps_form(X: _Shaped, key: str, where: str, channels: bool = False) -> None:
    if X.ndim != 3 and not (channels and X.ndim == 4 and X.shape[1] > 0):
        raise DataError(f"{where}: {key} must be 3-D (maps, rows, cols), got shape {X.shape}")
    if X.dtype.kind != "f":
        raise DataError(
            f"{where}: {key} has dtype {X.dtype}; temperatures must be floating point (°C)"
        )
    if X.shape[-2] == 0 or X.shape[-1] == 0:
        raise DataError(f"{where}: {key} maps are {X.shape[-2]} x {X.shape[-1]}; a grid needs "
                        "at least one row and one column")


def _check_labels_form(y: _Shaped, key: str, where: str) -> None:
    if y.ndim != 1:
        raise DataError(f"{where}: {key} must be 1-D (one label per map), got shape {y.shape}")
    if y.dtype.kind not in "iu":
        raise DataError(f"{where}: {key} has dtype {y.dtype}; labels must be integers >= 0")


def _as_maps(X: np.ndarray, key: str, where: str) -> np.ndarray:
    """Maps of a checked form as float32."""
    if X.dtype.itemsize > 4:  # float64 (or wider): what float32 cannot hold would turn
        # into inf in the cast below, with numpy's overflow warning ahead of any error
        beyond = np.isfinite(X) & (np.abs(X) > np.finfo(np.float32).max)
        if beyond.any():
            raise DataError(f"{where}: {key} holds {int(beyond.sum())} reading(s) beyond "
                            f"float32's range (e.g. {X[beyond].flat[0]:g}); temperatures "
                            "are stored as float32 (°C)")
    return np.ascontiguousarray(X, dtype=np.float32)


def _as_labels(y: np.ndarray, key: str, where: str) -> np.ndarray:
    """Labels of a checked form as int64."""
    if y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
        raise DataError(f"{where}: {key} holds labels too large for int64")
    return np.ascontiguousarray(y, dtype=np.int64)


def _check_finite(X: np.ndarray, split: str, key: str, where: str) -> None:
    if X.size == 0 or (X.dtype.kind == "f" and np.isfinite(X.min()) and np.isfinite(X.max())):
        return  # NaN wins a float min and max, an inf is one of them: no mask of the maps
    bad = ~np.isfinite(X)
    n_nan = int(np.isnan(X).sum())
    n_inf = int(bad.sum()) - n_nan
    kinds = " and ".join(
        f"{n} {name}" for n, name in ((n_nan, "NaN"), (n_inf, "inf")) if n
    )
    maps_hit = int(bad.reshape(len(X), -1).any(axis=1).sum())
    raise DataError(
        f"{where}: the {split} split ({key}) holds {kinds} reading(s) in {maps_hit} of "
        f"{len(X)} maps; a data set must be complete (drop or repair those maps)"
    )


def _check_labels(y: np.ndarray, key: str, where: str) -> None:
    negative = y < 0
    if negative.any():
        raise DataError(
            f"{where}: {key} holds {int(negative.sum())} negative label(s) (min "
            f"{int(y.min())}); labels must be integers >= 0"
        )


def check_label_range(y: np.ndarray, classes: int, key: str, where: str) -> None:
    """One-line `DataError` unless `y` is a 1-D integer array with every label in
    [0, `classes`): what every caller that scores or learns from labels checks first
    (training in any mode or transport, the mesh edge, `evaluate`, `infer`)."""
    y = np.asarray(y)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DataError(f"{where}: {key} must be 1-D integer labels, got {y.dtype} of "
                        f"shape {y.shape}")
    if not y.size:
        return
    low, high = int(y.min()), int(y.max())
    if low >= 0 and high < classes:
        return
    outside = int(np.count_nonzero((y < 0) | (y >= classes)))
    worst = low if low < 0 else high
    raise DataError(f"{where}: {key} holds {outside} label(s) outside 0..{classes - 1} "
                    f"(e.g. {worst}); the model has {classes} classes")


# --------------------------------------------------------------------------- data set files


def save_dataset(ds: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write `ds` as a compressed .npz (keys X_train, y_train, X_test, y_test, meta).

    `meta` is stored as a JSON string in a 0-d unicode array, so the file loads with
    `np.load(path, allow_pickle=False)` in any numpy, and nothing in it can run code. The
    file is written next to its final name and moved into place, so an interrupted run
    never leaves a truncated data set behind. Parent directories are created.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        with open(partial, "wb") as fh:
            np.savez_compressed(
                fh,
                X_train=ds.X_train,
                y_train=ds.y_train,
                X_test=ds.X_test,
                y_test=ds.y_test,
                meta=np.array(json.dumps(ds.meta, sort_keys=True)),
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def load_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Read a data set written by `save_dataset` (or any .npz with the same four arrays).

    Every problem is a `DataError` with one line naming the file and what is wrong: missing
    file, not an .npz, corrupt archive, missing keys, wrong dtype or ndim, length or grid
    mismatch, NaN/inf readings (how many, in which split), negative or non-integer labels.
    A file without `meta` loads with an empty meta record.
    """
    source = Path(path)
    arrays = _dataset_arrays(source)
    checked = _checked_arrays(arrays, where=str(source))
    meta = _parse_meta(arrays.get("meta"), source)
    return Dataset(**checked, meta=meta)


def _parse_meta(value: np.ndarray | None, source: Path) -> dict[str, Any]:
    if value is None:
        return {}
    if value.ndim != 0 or value.dtype.kind not in "US":
        raise DataError(f"{source}: meta must be a 0-d string array holding JSON")
    text = value.item()
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{source}: meta is not valid JSON ({exc.msg} at {exc.pos})") from None
    except RecursionError:  # the file's fault, not the request's (cli's mapping of it)
        raise DataError(f"{source}: meta is JSON nested too deeply to read") from None
    if not isinstance(meta, dict):
        raise DataError(f"{source}: meta must be a JSON object, got {type(meta).__name__}")
    return meta


# --------------------------------------------------------------------------- sensor logs


@dataclass(frozen=True, eq=False)
class LogData:
    """A real sensor log: one map per time slot, NaN where a reading is missing.

    `maps` is (T, rows, cols) float32 °C and `timestamps` the T slot labels, in
    chronological order when they parse as numbers or ISO 8601 times (file order
    otherwise). A reading is missing when its line is absent, its value is empty or
    NaN-like ("nan", "NA", "null", "-"), or it is infinite; all of them are NaN here and
    counted below, so no caller can use them without noticing.
    """

    maps: np.ndarray
    timestamps: list[str]
    source: str = ""
    format: str = ""

    @property
    def rows(self) -> int:
        """Grid rows."""
        return int(self.maps.shape[1])

    @property
    def cols(self) -> int:
        """Grid columns."""
        return int(self.maps.shape[2])

    @property
    def slots(self) -> int:
        """Number of time slots T."""
        return int(self.maps.shape[0])

    @property
    def missing(self) -> int:
        """Missing readings in the whole log."""
        return int(np.isnan(self.maps).sum())

    @property
    def missing_by_cell(self) -> np.ndarray:
        """(rows, cols) int64: how many slots each sensor missed (find dead sensors)."""
        return np.isnan(self.maps).sum(axis=0).astype(np.int64)

    @property
    def missing_by_slot(self) -> np.ndarray:
        """(T,) int64: how many readings each slot misses (find outages)."""
        return np.isnan(self.maps).sum(axis=(1, 2)).astype(np.int64)

    @property
    def complete(self) -> np.ndarray:
        """(T,) bool: the slots with every reading present, the only ones a data set uses."""
        return ~np.isnan(self.maps).any(axis=(1, 2))

    def summary(self, worst: int = 5) -> dict[str, Any]:
        """A JSON-able report of the log and of what is missing (the `worst` cells/slots)."""
        by_cell = self.missing_by_cell
        by_slot = self.missing_by_slot
        cell_order = np.argsort(-by_cell, axis=None, kind="stable")[:worst]
        worst_cells = [
            {"row": int(r), "col": int(c), "missing": int(by_cell[r, c])}
            for r, c in zip(*np.unravel_index(cell_order, by_cell.shape), strict=True)
            if by_cell[r, c] > 0
        ]
        worst_slots = [
            {"timestamp": self.timestamps[i], "missing": int(by_slot[i])}
            for i in np.argsort(-by_slot, kind="stable")[:worst]
            if by_slot[i] > 0
        ]
        readings = self.maps.size
        return {
            "source": self.source,
            "format": self.format,
            "grid": [self.rows, self.cols],
            "slots": self.slots,
            "complete_slots": int(self.complete.sum()),
            "readings": int(readings),
            "missing": self.missing,
            "missing_fraction": self.missing / readings if readings else 0.0,
            "sensors_with_missing": int((by_cell > 0).sum()),
            "worst_cells": worst_cells,
            "worst_slots": worst_slots,
            "first_timestamp": self.timestamps[0] if self.timestamps else None,
            "last_timestamp": self.timestamps[-1] if self.timestamps else None,
        }


def load_log(
    path: str | os.PathLike[str], rows: int | None = None, cols: int | None = None
) -> LogData:
    """Load a real sensor log (time x rows x cols) from .npz or .csv; see `LogData`.

    NPZ: key `X` or `maps` of shape (T, rows, cols), numeric, NaN for missing readings;
    optional `timestamps` (T,) of strings or numbers.

    CSV, long format (preferred: one line per reading, what a logger naturally appends):

        timestamp,row,col,value
        2024-04-01T00:00,0,0,21.4
        2024-04-01T00:00,0,1,
        ...

    `row`/`col` are 0-based grid indices; the column order is free. A missing line or an
    empty/NaN value is a missing reading. Two lines for the same slot and cell are an error
    (which one is right cannot be known).

    CSV, wide format (one line per slot): `timestamp,r0c0,r0c1,...,r16c24`; a cell without
    a column or with an empty value is missing.

    `rows`/`cols` fix the grid (needed when the last row or column never reported); a
    reading outside it, or an NPZ of another shape, is a `DataError`.
    """
    source = Path(path)
    if not source.exists():
        raise DataError(f"sensor log not found: {source}")
    if source.is_dir():
        raise DataError(f"{source}: is a directory, not a sensor log")
    with open(source, "rb") as fh:
        is_zip = fh.read(4) == b"PK\x03\x04"
    if is_zip or source.suffix.lower() == ".npz":
        log = _load_log_npz(source)
    else:
        log = _load_log_csv(source, rows, cols)
    _check_log_grid(log, rows, cols)
    return log


def _check_log_grid(log: LogData, rows: int | None, cols: int | None) -> None:
    for name, want, have in (("rows", rows, log.rows), ("cols", cols, log.cols)):
        if want is not None and want != have:
            raise DataError(f"{log.source}: the log has {have} {name}, expected {want}")


def _log_key(source: Path, arrays: Mapping[str, _Shaped]) -> str:
    """The key of a log's maps, `X` or `maps`, checked on the file's headers (before any
    array is read): 3-D, numeric, not empty, as many timestamps as maps."""
    key = "X" if "X" in arrays else "maps" if "maps" in arrays else None
    if key is None:
        hint = " (it is a data set: use load_dataset)" if "X_train" in arrays else ""
        raise DataError(
            f"{source}: no key X or maps in the log (found: "
            f"{', '.join(sorted(arrays)) or 'nothing'}){hint}"
        )
    maps = arrays[key]
    if maps.ndim != 3:
        raise DataError(f"{source}: {key} must be 3-D (time, rows, cols), got shape {maps.shape}")
    if maps.dtype.kind not in "fiu" or 0 in maps.shape:
        raise DataError(f"{source}: {key} must be a non-empty numeric array, got {maps.dtype} "
                        f"of shape {maps.shape}")
    if "timestamps" in arrays:
        stamps = math.prod(arrays["timestamps"].shape)
        if stamps != maps.shape[0]:
            raise DataError(
                f"{source}: {stamps} timestamps for {maps.shape[0]} maps; they must match"
            )
    return key


def _load_log_npz(source: Path) -> LogData:
    arrays = read_npz(source, "sensor log", DataError, partial(_log_key, source))
    maps = arrays[_log_key(source, arrays)].astype(np.float32)
    maps[~np.isfinite(maps)] = np.nan
    if "timestamps" in arrays:
        stamps = arrays["timestamps"].reshape(-1)
        timestamps = [_stamp_text(s) for s in stamps.tolist()]
    else:
        timestamps = [str(i) for i in range(len(maps))]
    order = _chronological_order(timestamps)
    return LogData(
        maps=np.ascontiguousarray(maps[order]),
        timestamps=[timestamps[i] for i in order],
        source=str(source),
        format="npz",
    )


def _stamp_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _load_log_csv(source: Path, rows: int | None, cols: int | None) -> LogData:
    try:
        with open(source, encoding="utf-8-sig", newline="") as fh:
            records = [rec for rec in csv.reader(fh)]
    except UnicodeDecodeError as exc:
        raise DataError(f"{source}: not a UTF-8 text CSV file ({exc.reason})") from None
    except csv.Error as exc:
        raise DataError(f"{source}: unreadable CSV ({exc})") from None
    numbered = [(i + 1, rec) for i, rec in enumerate(records) if any(f.strip() for f in rec)]
    if not numbered:
        raise DataError(f"{source}: empty file; expected a header timestamp,row,col,value")
    header = [name.strip().lower() for name in numbered[0][1]]
    body = numbered[1:]
    if sorted(header) == ["col", "row", "timestamp", "value"]:
        return _parse_long(source, header, body, rows, cols)
    if header and header[0] == "timestamp" and len(header) > 1 and all(
        _WIDE_CELL.fullmatch(name) for name in header[1:]
    ):
        return _parse_wide(source, header, body, rows, cols)
    raise DataError(
        f"{source}: unknown CSV header {','.join(header)!r}; expected the long format "
        "'timestamp,row,col,value' or the wide format 'timestamp,r0c0,r0c1,...'"
    )


_WIDE_CELL = re.compile(r"r(\d+)c(\d+)")


def _parse_long(
    source: Path,
    header: list[str],
    body: list[tuple[int, list[str]]],
    rows: int | None,
    cols: int | None,
) -> LogData:
    if not body:
        raise DataError(f"{source}: the log holds a header but no readings")
    for line, rec in body:
        if len(rec) != 4:
            raise DataError(f"{source}: line {line}: expected 4 fields, got {len(rec)}")
    lines = np.array([line for line, _ in body])
    columns = {name: [rec[i].strip() for _, rec in body] for i, name in enumerate(header)}
    row = _int_column(source, "row", columns["row"], lines)
    col = _int_column(source, "col", columns["col"], lines)
    value = _value_column(source, columns["value"], lines)
    n_rows = _grid_extent(source, "row", row, rows, lines)
    n_cols = _grid_extent(source, "col", col, cols, lines)
    slot_of: dict[str, int] = {}
    slot = np.array([slot_of.setdefault(t, len(slot_of)) for t in columns["timestamp"]])
    timestamps = list(slot_of)
    seen = np.zeros((len(timestamps), n_rows, n_cols), dtype=np.int64)
    np.add.at(seen, (slot, row, col), 1)
    if seen.max() > 1:
        s, r, c = (int(v[0]) for v in np.nonzero(seen > 1))
        first = lines[(slot == s) & (row == r) & (col == c)]
        raise DataError(
            f"{source}: {int(seen.max())} readings for slot {timestamps[s]!r} cell ({r}, {c}) "
            f"(lines {', '.join(map(str, first[:3]))}); keep one per slot and cell"
        )
    maps = np.full(seen.shape, np.nan, dtype=np.float32)
    maps[slot, row, col] = value
    return _ordered_log(maps, timestamps, source, "csv-long")


def _parse_wide(
    source: Path,
    header: list[str],
    body: list[tuple[int, list[str]]],
    rows: int | None,
    cols: int | None,
) -> LogData:
    if not body:
        raise DataError(f"{source}: the log holds a header but no readings")
    cells = [tuple(int(g) for g in _WIDE_CELL.fullmatch(name).groups()) for name in header[1:]]
    if len(set(cells)) != len(cells):
        raise DataError(f"{source}: a cell appears twice in the CSV header")
    lines = np.array([line for line, _ in body])
    for line, rec in body:
        if len(rec) != len(header):
            raise DataError(
                f"{source}: line {line}: expected {len(header)} fields, got {len(rec)}"
            )
    cell_rows = np.array([r for r, _ in cells])
    cell_cols = np.array([c for _, c in cells])
    header_line = np.full(len(cells), 1)
    n_rows = _grid_extent(source, "row", cell_rows, rows, header_line)
    n_cols = _grid_extent(source, "col", cell_cols, cols, header_line)
    timestamps = [rec[0].strip() for _, rec in body]
    if len(set(timestamps)) != len(timestamps):
        dup = next(t for i, t in enumerate(timestamps) if t in timestamps[:i])
        raise DataError(f"{source}: timestamp {dup!r} appears on two lines; keep one per slot")
    flat = [field.strip() for _, rec in body for field in rec[1:]]
    value_lines = np.repeat(lines, len(cells))
    values = _value_column(source, flat, value_lines).reshape(len(body), len(cells))
    maps = np.full((len(body), n_rows, n_cols), np.nan, dtype=np.float32)
    maps[:, cell_rows, cell_cols] = values
    return _ordered_log(maps, timestamps, source, "csv-wide")


def _int_column(source: Path, name: str, texts: list[str], lines: np.ndarray) -> np.ndarray:
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        try:
            out[i] = int(text)
        except (ValueError, OverflowError):
            raise DataError(
                f"{source}: line {lines[i]}: {name} {text!r} is not an integer index"
            ) from None
    return out


def _value_column(source: Path, texts: list[str], lines: np.ndarray) -> np.ndarray:
    """Readings as float32; NaN-like tokens and inf become NaN (= missing)."""
    cleaned = ["nan" if t.lower() in _MISSING_TOKENS else t for t in texts]
    try:
        values = np.array(cleaned, dtype=np.float64)
    except ValueError:
        for i, text in enumerate(cleaned):
            try:
                float(text)
            except ValueError:
                raise DataError(
                    f"{source}: line {lines[i]}: value {texts[i]!r} is not a number"
                ) from None
        raise
    values[~np.isfinite(values)] = np.nan
    return values.astype(np.float32)


def _grid_extent(
    source: Path, name: str, index: np.ndarray, size: int | None, lines: np.ndarray
) -> int:
    """The number of rows (or cols): `size` if given, else the largest index + 1."""
    if index.size and int(index.min()) < 0:
        i = int(np.argmin(index))
        raise DataError(f"{source}: line {lines[i]}: negative {name} index {int(index[i])}")
    extent = int(index.max()) + 1 if index.size else 0
    if size is not None:
        if extent > size:
            i = int(np.argmax(index))
            raise DataError(
                f"{source}: line {lines[i]}: {name} {int(index[i])} is outside a grid of "
                f"{size} {name}s"
            )
        return size
    return extent


def _ordered_log(maps: np.ndarray, timestamps: list[str], source: Path, fmt: str) -> LogData:
    order = _chronological_order(timestamps)
    return LogData(
        maps=np.ascontiguousarray(maps[order]),
        timestamps=[timestamps[i] for i in order],
        source=str(source),
        format=fmt,
    )


def _chronological_order(timestamps: Sequence[str]) -> list[int]:
    """Indices that sort the slots by time when every stamp parses; else file order.

    Numbers (e.g. Unix seconds) and ISO 8601 times are understood. A log whose stamps are
    neither is assumed to be written in time order, as loggers append.
    """
    keys = _parse_all(timestamps, float) or _parse_all(timestamps, _iso_time)
    if keys is None:
        return list(range(len(timestamps)))
    try:
        return sorted(range(len(timestamps)), key=keys.__getitem__)
    except TypeError:  # naive and timezone-aware times mixed
        return list(range(len(timestamps)))


def _parse_all(texts: Sequence[str], parse: Any) -> list[Any] | None:
    try:
        return [parse(t) for t in texts]
    except (TypeError, ValueError):
        return None


def _iso_time(text: str) -> datetime:
    text = text.strip()
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


# --------------------------------------------------------------------------- log -> data set


def dataset_from_log(
    log: LogData, threshold: float = 3.0, test_fraction: float = 0.19, seed: int = 0
) -> Dataset:
    """A labelled data set from the complete slots of a log, split by time.

    Only complete slots are used: the label rule looks at every neighbour pair, and any
    imputed value could create or hide a `threshold` difference, so a slot missing even
    one reading is dropped (meta says how many and why). Labels follow `label_maps`.

    The split is chronological: the last `test_fraction` of the complete slots is the test
    split, in time order. Neighbouring slots of a real log are near duplicates, so a random
    split would leak the test maps into training and overstate accuracy; testing on the
    future is also how a deployed model is used. The training maps are shuffled with
    `seed` (only their order depends on it) so that a trainer that walks the file in order
    still sees every time of day in each batch. The default 0.19 matches the seed
    experiment's 561 of 2,961 maps.
    """
    if not 0.0 < test_fraction < 1.0:
        raise UsageError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    complete = log.complete
    used = int(complete.sum())
    if used < 2:
        raise DataError(
            f"{log.source}: only {used} of {log.slots} slots are complete (every reading "
            "present); a data set needs at least 2"
        )
    X = log.maps[complete]
    stamps = [t for t, ok in zip(log.timestamps, complete, strict=True) if ok]
    n_test = min(max(1, round(used * test_fraction)), used - 1)
    n_train = used - n_test
    order = np.random.default_rng(seed).permutation(n_train)
    X_train, X_test = X[:n_train][order], X[n_train:]
    meta = {
        "generator": "meshdl.data.datasets.dataset_from_log",
        "source": log.source,
        "format": log.format,
        "threshold": float(threshold),
        "test_fraction": float(test_fraction),
        "seed": int(seed),
        "slot_minutes": _slot_minutes(stamps),
        "grid": [log.rows, log.cols],
        "slots_in_log": log.slots,
        "slots_used": used,
        "slots_dropped": log.slots - used,
        "dropped_reason": (
            "slots with any missing reading (absent, empty, NaN or inf) are dropped: the "
            "label rule needs every neighbour pair and imputing could fake or hide an anomaly"
        ),
        "missing_readings": log.missing,
        "split": "chronological: the last test_fraction of complete slots is the test split "
        "(in time order); training maps are shuffled with seed",
        "train_period": [stamps[0], stamps[n_train - 1]],
        "test_period": [stamps[n_train], stamps[-1]],
        "counts": {"train": n_train, "test": n_test},
    }
    return Dataset(
        X_train=X_train,
        y_train=label_maps(X_train, threshold),
        X_test=X_test,
        y_test=label_maps(X_test, threshold),
        meta=meta,
    )


def _slot_minutes(stamps: Sequence[str]) -> float | None:
    """The median spacing of ISO 8601 timestamps in minutes, or None when not times."""
    times = _parse_all(stamps, _iso_time)
    if times is None or len(times) < 2:
        return None
    try:
        gaps = [(b - a).total_seconds() / 60.0 for a, b in pairwise(times)]
    except TypeError:
        return None
    return float(np.median(gaps))


# --------------------------------------------------------------------------- statistics


def dataset_stats(ds: Dataset, threshold: float | None = None) -> dict[str, Any]:
    """Per-split statistics and the three acceptance checks, as a JSON-able dict.

    `threshold` defaults to the one recorded in `ds.meta` (else 3.0). Positives and
    negatives are the stored labels; `labels_match_rule` says how many agree with
    `label_maps` at this threshold. The checks, required in BOTH splits:
    - `positives_20_to_80_percent`: the classes are not badly unbalanced;
    - `near_threshold_positives_at_least_25_percent`: at least 25 % of the positives
      have their largest neighbour difference in [threshold, threshold + 0.6) °C;
    - `near_threshold_negatives_at_least_25_percent`: at least 25 % of the negatives have
      it in [threshold - 0.6, threshold) °C.
    Together they make sure a classifier must resolve the rule to a fraction of a degree
    instead of separating two far-apart clusters. A fraction over an empty class is None
    and its check fails.
    """
    if threshold is None:
        threshold = ds.threshold
    splits = {
        name: _split_stats(getattr(ds, x_key), getattr(ds, y_key), threshold)
        for name, x_key, y_key in _SPLITS
    }
    lo, hi = POSITIVE_FRACTION_RANGE

    def all_splits(key: str, ok: Any) -> bool:
        return all(s[key] is not None and ok(s[key]) for s in splits.values())

    checks = {
        "positives_20_to_80_percent": all_splits("positive_fraction", lambda f: lo <= f <= hi),
        "near_threshold_positives_at_least_25_percent": all_splits(
            "near_threshold_positive_fraction", lambda f: f >= MIN_NEAR_FRACTION
        ),
        "near_threshold_negatives_at_least_25_percent": all_splits(
            "near_threshold_negative_fraction", lambda f: f >= MIN_NEAR_FRACTION
        ),
    }
    return {
        "threshold": float(threshold),
        "band": NEAR_BAND,
        "grid": [ds.rows, ds.cols],
        **splits,
        "checks": checks,
    }


def _split_stats(X: np.ndarray, y: np.ndarray, threshold: float) -> dict[str, Any]:
    diff = max_neighbour_diff(X).astype(np.float64)
    positive = y > 0
    t = float(np.float32(threshold))
    near_pos = (diff >= t) & (diff < t + NEAR_BAND)
    near_neg = (diff >= t - NEAR_BAND) & (diff < t)
    return {
        "count": len(y),
        "positives": int(positive.sum()),
        "positive_fraction": float(positive.mean()),
        "near_threshold_positive_fraction": _fraction(near_pos, positive),
        "near_threshold_negative_fraction": _fraction(near_neg, ~positive),
        "labels_match_rule": float((label_maps(X, threshold) == y).mean()),
        "max_diff_mean": float(diff.mean()),
        "max_diff_max": float(diff.max()),
        "temp_min": float(X.min()),
        "temp_mean": float(X.mean(dtype=np.float64)),
        "temp_max": float(X.max()),
    }


def _fraction(hit: np.ndarray, within: np.ndarray) -> float | None:
    n = int(within.sum())
    return None if n == 0 else float((hit & within).sum() / n)
