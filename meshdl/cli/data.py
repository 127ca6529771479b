"""`meshdl data`: make the synthetic lounge data set, and inspect data sets and sensor logs.

`generate` writes a data set file and reports the statistics that say whether it is a
fair test (`meshdl.data.datasets.dataset_stats`); `inspect` reads a data set, or a real sensor log
(CSV, or an .npz holding `X`/`maps`) and reports what is in it, missing readings first.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from meshdl.cli.common import emit_json, err_console, file_to_write, parse_cell
from meshdl.cli.options import EdgeAt, JsonReport, json_option
from meshdl.config import GLOBAL_RECIPE, DataConfig, load_run_config
from meshdl.errors import UsageError

# The data sets and the generator (numpy, Numba) load when a command runs, not for
# `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.data.datasets import Dataset, LogData

app = typer.Typer(
    help="Generate the synthetic lounge data set; inspect data sets and sensor logs.",
    no_args_is_help=True,
)


def _help(text: str, field: str) -> str:
    """An option's help with its default: the configuration's."""
    return f"{text} (default: {generated_default(field):,}, or --config's)."


def generated_default(field: str) -> Any:
    """What `generate` makes of an unset `field` without --config: the data set the
    global head's recipe needs to reach its ceiling (163,200 training maps: 68 lounges),
    else the field's default."""
    return GLOBAL_RECIPE["data"].get(field, DataConfig.model_fields[field].default)


@app.command()
def generate(
    out: Path = typer.Option(
        Path("data/lounges.npz"), "--out", "-o", help="Data set file to write (dirs are created)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="A run configuration (the mesh file): its [data] section, "
        "on its [model] grid unless [data] sets one; the flags below override it."),
    rows: int | None = typer.Option(None, "--rows", help=_help("Grid rows", "rows")),
    cols: int | None = typer.Option(None, "--cols", help=_help("Grid columns", "cols")),
    train: int | None = typer.Option(None, help=_help(
        "Training maps: up to 2,400 one lounge's, more from more lounges of its design "
        "(the test split stays the first's)", "train")),
    test: int | None = typer.Option(None, help=_help("Test maps", "test")),
    seed: int | None = typer.Option(None, help=_help("Random seed: the same seed, the "
                                                     "same data set", "seed")),
    threshold: float | None = typer.Option(
        None, help=_help("Anomaly: a 4-neighbour pair differs by >= this many °C",
                         "threshold")),
    slot_minutes: int | None = typer.Option(None, help=_help("Minutes per time slot",
                                                             "slot_minutes")),
    as_json: json_option("Print the statistics as JSON on stdout.") = False,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Simulate the lounge (one map per time slot) and write the labelled data set."""
    from meshdl.data.datasets import dataset_stats, save_dataset
    from meshdl.data.lounge import generate_lounge

    # Before minutes of lounges: another grid's or seed's data set would be lost, and a
    # directory (or a path under a file) could not take the data set at all.
    file_to_write(out, force, ", or --out another file")
    flags = {"rows": rows, "cols": cols, "train": train, "test": test, "seed": seed,
             "threshold": threshold, "slot_minutes": slot_minutes}
    cfg = data_config(config, flags)
    started = time.perf_counter()
    ds = generate_lounge(cfg)
    seconds = time.perf_counter() - started
    path = save_dataset(ds, out)
    written = time.perf_counter() - started - seconds  # compressing: most of a large set's
    stats = dataset_stats(ds, cfg.threshold)
    err_console.print(
        f"wrote {path}: {cfg.train} train + {cfg.test} test maps of {cfg.rows} x {cfg.cols}, "
        f"seed {cfg.seed}, threshold {cfg.threshold:g} °C, generated in {seconds:.2f} s, "
        f"written in {written:.2f} s",
        highlight=False,
    )
    err_console.print(_one_line_stats(stats), highlight=False)
    _warn_failed_checks(stats)
    if as_json:
        emit_json(
            {
                "path": str(path),
                "config": cfg.model_dump(),
                "seconds": round(seconds, 3),
                "stats": stats,
            }
        )


def data_config(config: Path | None, flags: dict[str, Any]) -> DataConfig:
    """The data set to make: the global recipe's (`generated_default`), or the run
    configuration's [data] section (on its model's grid; MESHDL_* environment
    included), then the flags that are set."""
    base = DataConfig(**GLOBAL_RECIPE["data"]) if config is None else \
        load_run_config(config).data
    given = {name: value for name, value in flags.items() if value is not None}
    return DataConfig(**{**base.model_dump(), **given})


@app.command()
def inspect(
    file: Path = typer.Argument(
        ..., help="A data set .npz, or a sensor log (.csv, or .npz with X or maps)."
    ),
    threshold: float | None = typer.Option(
        None, help="Label threshold in °C (default: the data set's own, else 3.0)."
    ),
    dead: float = typer.Option(
        0.0, "--dead", min=0.0, max=0.99, metavar="SHARE",
        help="Also count the anomalies this share of dead cells hides (a data set: "
        "positive maps whose every deciding pair has a dead cell), the cells drawn as "
        "`meshdl experiment failures` draws them."),
    dead_seed: int = typer.Option(0, "--dead-seed", min=0,
                                  help="Which cells --dead takes (the experiment's fault seed)."),
    edge_at: EdgeAt = "0,0",
    as_json: JsonReport = False,
) -> None:
    """Report what a data set or sensor log holds: classes, near-threshold maps, gaps."""
    from meshdl.data.datasets import load_dataset, load_log

    if threshold is not None and threshold <= 0:
        raise UsageError(f"--threshold must be > 0, got {threshold:g}")
    if _is_dataset_file(file):
        ds = load_dataset(file)
        hidden = _hidden(ds, threshold, dead, dead_seed, parse_cell(edge_at)) if dead else None
        _inspect_dataset(file, ds, threshold, as_json, hidden)
    else:
        if dead:
            raise UsageError("--dead takes a data set (a log has no labels to hide)")
        _inspect_log(file, load_log(file), threshold, as_json)


def _is_dataset_file(file: Path) -> bool:
    """A data set if it is an .npz holding X_train; a log if it holds X/maps or is text.

    Unreadable .npz files go to `load_dataset`, whose error names the problem.
    """
    if file.suffix.lower() in (".csv", ".txt", ".tsv"):
        return False
    if file.is_file() and zipfile.is_zipfile(file):
        try:
            with zipfile.ZipFile(file) as archive:
                names = set(archive.namelist())
        except (OSError, zipfile.BadZipFile):
            return True
        return "X_train.npy" in names or not ({"X.npy", "maps.npy"} & names)
    return file.suffix.lower() == ".npz" or not file.exists()


def _inspect_dataset(file: Path, ds: Dataset, threshold: float | None, as_json: bool,
                     hidden: dict[str, Any] | None = None) -> None:
    from meshdl.data.datasets import dataset_stats

    stats = dataset_stats(ds, threshold)
    if as_json:
        emit_json({"path": str(file), "kind": "dataset", "meta": ds.meta, "stats": stats}
                  | ({"dead": hidden} if hidden else {}))
        return
    out = Console()
    source = ds.meta.get("generator", "unknown source")
    out.print(f"[bold]{file}[/]: data set, {ds.rows} x {ds.cols} grid, from {source}")
    out.print(_stats_table(stats))
    out.print(_checks_table(stats))
    if hidden:
        out.print(
            f"{hidden['cells']} dead cells (share {hidden['share']:g}, seed "
            f"{hidden['seed']}) hide the anomaly of "
            + ", ".join(f"{hidden[s]} of {hidden[s + '_maps']} {s} maps "
                        f"({_pct(hidden[s + '_fraction'])})" for s in ("train", "test"))
            + ": every pair that decides their label has a dead cell", highlight=False)


def _hidden(ds: Dataset, threshold: float | None, share: float, seed: int,
            edge_at: tuple[int, int]) -> dict[str, Any]:
    """The anomalies `share` of dead cells hides, per split, with the cells the
    failures experiment would draw for fault seed `seed` (never the edge's cell): why
    a mesh with dead cells loses accuracy that no model can win back by computing."""
    import numpy as np

    from meshdl.data.datasets import hidden_by_dead
    from meshdl.sim.faults.dead import dead_cells

    if not (0 <= edge_at[0] < ds.rows and 0 <= edge_at[1] < ds.cols):
        raise UsageError(f"--edge-at {edge_at[0]},{edge_at[1]} is outside the "
                         f"{ds.rows} x {ds.cols} grid")
    thr = ds.threshold if threshold is None else threshold
    dead = np.zeros((ds.rows, ds.cols), dtype=bool)
    for r, c in dead_cells(ds.rows, ds.cols, share, seed, edge_at):
        dead[r, c] = True
    out: dict[str, Any] = {"share": share, "seed": seed, "edge_at": list(edge_at),
                           "cells": int(dead.sum()), "threshold": thr}
    for split, X in (("train", ds.X_train), ("test", ds.X_test)):
        count = int(hidden_by_dead(X, dead, thr).sum())
        out[split], out[f"{split}_maps"] = count, len(X)
        out[f"{split}_fraction"] = count / len(X) if len(X) else 0.0
    return out


def _inspect_log(file: Path, log: LogData, threshold: float | None, as_json: bool) -> None:
    from meshdl.data.datasets import dataset_from_log, dataset_stats

    summary = log.summary()
    thr = 3.0 if threshold is None else threshold
    stats = None
    if summary["complete_slots"] >= 2:
        stats = dataset_stats(dataset_from_log(log, threshold=thr), thr)
    if summary["missing"]:
        err_console.print(
            f"[yellow]warning:[/] {summary['missing']} of {summary['readings']} readings are "
            f"missing ({summary['missing_fraction']:.1%}); "
            f"{log.slots - summary['complete_slots']} of {log.slots} slots are incomplete "
            "and would be dropped from a data set",
            highlight=False,
        )
    if as_json:
        emit_json({"path": str(file), "kind": "log", "log": summary, "as_dataset": stats})
        return
    out = Console()
    out.print(f"[bold]{file}[/]: sensor log ({log.format}), {log.rows} x {log.cols} grid")
    out.print(_log_table(summary))
    if stats is None:
        out.print("fewer than 2 complete slots: no data set can be made from this log")
        return
    out.print(f"as a data set (complete slots only, chronological split, threshold {thr:g} °C):")
    out.print(_stats_table(stats))
    out.print(_checks_table(stats))


# --------------------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _one_line_stats(stats: dict[str, Any]) -> str:
    from meshdl.data.datasets import NEAR_BAND

    train, test = stats["train"], stats["test"]
    return (
        f"positives {_pct(train['positive_fraction'])} / {_pct(test['positive_fraction'])} "
        f"(train / test); within {NEAR_BAND:g} °C of the threshold: positives "
        f"{_pct(train['near_threshold_positive_fraction'])} / "
        f"{_pct(test['near_threshold_positive_fraction'])}, negatives "
        f"{_pct(train['near_threshold_negative_fraction'])} / "
        f"{_pct(test['near_threshold_negative_fraction'])}"
    )


def _warn_failed_checks(stats: dict[str, Any]) -> None:
    failed = [name for name, ok in stats["checks"].items() if not ok]
    if failed:
        err_console.print(
            f"[yellow]note:[/] acceptance checks not met: {', '.join(failed)} (expected for "
            "very small grids or splits)",
            highlight=False,
        )


def _stats_table(stats: dict[str, Any]) -> Table:
    thr, band = stats["threshold"], stats["band"]
    table = Table(
        title=f"per split (°C; max neighbour diff vs threshold {thr:g}, band {band:g})"
    )
    table.add_column("")
    table.add_column("train", justify="right")
    table.add_column("test", justify="right")
    rows: list[tuple[str, Any]] = [
        ("maps", lambda s: str(s["count"])),
        ("positives", lambda s: f"{s['positives']} ({_pct(s['positive_fraction'])})"),
        (
            f"positives in [{thr:g}, {thr + band:g}) °C",
            lambda s: _pct(s["near_threshold_positive_fraction"]),
        ),
        (
            f"negatives in [{thr - band:g}, {thr:g}) °C",
            lambda s: _pct(s["near_threshold_negative_fraction"]),
        ),
        ("labels that follow the rule", lambda s: _pct(s["labels_match_rule"])),
        ("largest neighbour diff, mean / max",
         lambda s: f"{s['max_diff_mean']:.2f} / {s['max_diff_max']:.2f}"),
        ("temperature min / mean / max",
         lambda s: f"{s['temp_min']:.1f} / {s['temp_mean']:.1f} / {s['temp_max']:.1f}"),
    ]
    for label, cell in rows:
        table.add_row(label, cell(stats["train"]), cell(stats["test"]))
    return table


def _checks_table(stats: dict[str, Any]) -> Table:
    table = Table(title="acceptance checks (both splits)")
    table.add_column("check")
    table.add_column("result")
    for name, ok in stats["checks"].items():
        table.add_row(name.replace("_", " "), "[green]pass[/]" if ok else "[red]FAIL[/]")
    return table


def _log_table(summary: dict[str, Any]) -> Table:
    table = Table(title="sensor log")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("time slots", str(summary["slots"]))
    table.add_row("first / last", f"{summary['first_timestamp']} / {summary['last_timestamp']}")
    table.add_row("complete slots", str(summary["complete_slots"]))
    table.add_row(
        "missing readings",
        f"{summary['missing']} of {summary['readings']} ({_pct(summary['missing_fraction'])})",
    )
    table.add_row("sensors with gaps", str(summary["sensors_with_missing"]))
    for cell in summary["worst_cells"]:
        where = f"  sensor ({cell['row']}, {cell['col']})"
        table.add_row(where, f"{cell['missing']} slot(s) missed")
    for slot in summary["worst_slots"]:
        table.add_row(f"  slot {slot['timestamp']}", f"{slot['missing']} reading(s) missing")
    return table
