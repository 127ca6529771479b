"""The one name of each figure an experiment reports, and how a table shows it.

A figure keeps its key in trials.jsonl, summary.json and table.csv (`clean_test_acc`);
wherever people read it (the console's table, summary.json's "columns" and "table" that
`meshdl report` can show, docs/experiments.md) it has the title `TITLES` gives it, and
only that one. A table cell is the mean over the seeds, with `± std` only from two seeds
up and where the seeds differ (one seed has no spread to show, and `± 0` of seeds that
agree says nothing the mean does not), numbers with thousands separators, bytes with
their unit (B, kB, MB, GB: powers of 1000). Every number is written by
meshdl/report/numbers.py, the one formatter (its rule: significant digits with their
zeros, ties half away from zero).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from meshdl.report.numbers import figure, places, plus_minus

Record = dict[str, Any]
# A mean and its deviation (None: fewer than two seeds) as one table cell.
Format = Callable[[float, float | None], str]

TITLES = {
    # Accuracy: training's own, then through the mesh, then of the trained model alone.
    "test_acc": "test %", "train_acc": "train %", "clean_test_acc": "clean test %",
    # Failures: the model trained all alive, cells dead after training; the bound model.
    "deployed_acc": "deployed %", "bound_acc": "bound %",
    "train_loss": "train loss", "accuracy_cost": "cost (points)",
    # What one mesh wave carries (the sweeps of the network's settings).
    "halo_transmitted": "halo sent", "halo_needed": "halo needed",
    "halo_formula": "(k²-1) mn·c_in", "wave_bytes": "wave bytes",
    "wave_messages": "wave messages", "wave_radio_bytes": "wave radio bytes",
    "wave_rounds": "rounds", "busiest_link_bytes": "busiest link",
    "bytes_per_cell": "bytes per cell",  # grid's fit (summary.json "fit")
    # Time and energy under simulated time.
    "seconds_per_epoch": "s/epoch", "epoch_s": "s/epoch",
    "energy_j_per_epoch": "J/epoch", "step_s": "step s", "compute_s": "compute s",
    "communication_s": "communication s", "ideal_step_s": "ideal step s",
    # Faults and what best effort filled in.
    "substituted": "filled", "substituted_per_wave": "filled/wave",
    "skipped_steps": "skipped steps", "messages_lost": "messages lost",
    "frames_lost": "frames lost", "frames": "frames", "dead_found": "dead found",
    "absent_filled": "absent filled",
    # Several meshes.
    "samples_per_s": "samples/s", "efficiency": "efficiency",
    "staleness_max": "staleness max", "staleness_mean": "staleness mean",
    "waited_share": "waited share", "updates": "updates",
    "backhaul_bytes": "backhaul bytes",
    # Compression and delta halos.
    "reduce_bytes_per_step": "REDUCE/step", "push_bytes_per_step": "PUSH/step",
    "gradient_bytes_per_step": "gradient/step", "gradient_ratio": "gradient ratio",
    "forward_bytes_per_step": "forward/step", "mesh_bytes_per_step": "mesh/step",
    "halo_bytes_per_slot": "HALO/slot", "mesh_bytes_per_slot": "mesh/slot",
    "halo_ratio": "of full %", "alerts": "alerts", "alerts_changed": "alerts changed",
}
# In the mesh and shipped to the edge (edge-vs-cloud): side x measure.
_SIDES = {"mesh": "mesh", "cloud_aggregated": "cloud aggregated",
          "cloud_unaggregated": "cloud unaggregated", "cloud": "cloud"}
_MEASURES = {"bytes": "bytes", "makespan_s": "s", "energy_j": "J",
             "ideal_mac_j": "ideal-MAC J", "max_node_airtime_s": "busiest airtime s"}
TITLES.update({f"{side}_{measure}": f"{name} {unit}" for side, name in _SIDES.items()
               for measure, unit in _MEASURES.items()})


def title(key: str) -> str:
    """The figure's one name in a table (its key, spaced, if it has none yet)."""
    return TITLES.get(key, key.replace("_", " "))


# ------------------------------------------------------------------ formats
def fixed(decimals: int, scale: float = 1.0) -> Format:
    """Separated thousands, `decimals` after the point (both mean and deviation)."""
    def show(mean: float, std: float | None) -> str:
        return plus_minus(places(mean * scale, decimals), None if std is None else std * scale)

    return show


def percent(decimals: int) -> Format:
    """A share (0.9712) as percent (97.12 at two decimals)."""
    return fixed(decimals, 100.0)


def digits(count: int) -> Format:
    """`count` significant digits of the mean (1.121e+04 -> 11,210); the deviation to
    the same decimals."""
    def show(mean: float, std: float | None) -> str:
        return plus_minus(figure(float(mean), count), std)

    return show


_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def size(mean: float, std: float | None) -> str:
    """Bytes in the unit of the mean, three significant digits with their zeros:
    26,812,345 -> "26.8 MB", 13,000 -> "13.0 kB" (beside "16.1 kB"); with a deviation
    "26.8 ± 0.1 MB". Under 1 kB bytes are counted whole: "512 B"."""
    divisor, unit = next(((d, u) for d, u in _UNITS if abs(mean) >= d), (1.0, "B"))
    text = figure(float(mean) / divisor, 3) if divisor > 1 else places(float(mean), 0)
    return f"{plus_minus(text, None if std is None else std / divisor)} {unit}"


# ------------------------------------------------------------------ cells and tables
def cell(row: Record, key: str, show: Format) -> str:
    """A summary row's figure as a cell: its mean, `± std` from two seeds up where they
    differ; empty where the figure is missing."""
    figure = row.get(key)
    return "" if figure is None else show(figure["mean"], spread(figure, row.get("seeds", 1)))


def spread(figure: Record, seeds: int) -> float | None:
    """The deviation a table shows: none for one seed, none where the seeds agree."""
    std = figure.get("std")
    return std if seeds >= 2 and std else None


def over(seeds: int, what: str = "seed") -> str:
    """What a table's cells are: "mean ± std over 3 seeds", or "one seed"."""
    return f"mean ± std over {seeds} {what}s" if seeds >= 2 else f"one {what}"


class Shown(NamedTuple):
    """A table people read: its titles, its rows of cells, and the keys of the figures
    its columns show, in their order (what leads table.csv and summary.json's
    "columns")."""

    header: list[str]
    rows: list[list[str]]
    keys: list[str]


def figures_table(rows: Sequence[Record], labels: Sequence[tuple[str, Callable[[Any], str]]],
                  shown: Sequence[tuple[str, Format]], seeds_column: bool = False) -> Shown:
    """A table of summary rows: the swept variables (`labels`: title, cell from the
    row's value), the number of seeds if asked, then each (key, format) of `shown`."""
    header = [name for name, _ in labels] + (["seeds"] if seeds_column else []) + \
        [title(key) for key, _ in shown]
    body = [[label(row["value"]) for _, label in labels]
            + ([str(row.get("seeds", 1))] if seeds_column else [])
            + [cell(row, key, show) for key, show in shown] for row in rows]
    return Shown(header, body, [key for key, _ in shown])


def ordered(keys: Iterable[str], figures: Iterable[str]) -> list[str]:
    """Every figure, those a table shows first in its order, then the rest as given."""
    every = list(figures)
    first = [key for key in keys if key in every]
    return first + [f for f in every if f not in first]


def columns(keys: Iterable[str]) -> list[Record]:
    """summary.json's "columns": each figure's key and its one title, in table order."""
    return [{"key": key, "title": title(key)} for key in keys]


def said(record: Record, shown: Sequence[tuple[str, Format]]) -> str:
    """A trial's figures in a progress line, by their titles: "test % 97.12, s/epoch
    1,171" (a figure the record lacks is left out)."""
    return ", ".join(f"{title(key)} {show(record[key], None)}" for key, show in shown
                     if record.get(key) is not None)
