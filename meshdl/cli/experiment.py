"""`meshdl experiment NAME`: an experiment over a swept value and several seeds, written
to a run directory (meshdl/experiments/runner.py says what it holds)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from meshdl.cli.common import (
    BATCH,
    COLS,
    CONV_LAYERS,
    EPOCHS,
    FILTERS,
    HIDDEN,
    LR,
    POOL,
    ROWS,
    emit_json,
    err_console,
    out_console,
)
from meshdl.config import load_run_config
from meshdl.data import load_dataset
from meshdl.errors import UsageError
from meshdl.experiments import filter_size
from meshdl.experiments.runner import Record, Trial, run_trials, summarize, write_run
from meshdl.runs import new_run_dir

app = typer.Typer(help="Experiments over a swept value and several seeds: tables, "
                  "plots and a summary in a run directory.", no_args_is_help=True)


@app.command("filter-size")
def filter_size_command(
    sizes: list[int] = typer.Option([3, 4, 5, 6], "--sizes", help="Filter sizes k "
                                    "(repeat: --sizes 3 --sizes 5)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per size (0, 1, ...)."),
    rows: int | None = ROWS,
    cols: int | None = COLS,
    epochs: int | None = EPOCHS,
    batch: int | None = BATCH,
    lr: float | None = LR,
    filters: int | None = FILTERS,
    conv_layers: int | None = CONV_LAYERS,
    pool: int | None = POOL,
    hidden: int | None = HIDDEN,
    data: Path | None = typer.Option(None, "--data", help="Data set .npz (default: the "
                                     "synthetic lounge)."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Trials at once, in worker "
                             "processes (the same summary whatever the number)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-filter-size/)."),
    json_out: bool = typer.Option(False, "--json", help="Print summary.json on stdout."),
) -> None:
    """Accuracy and communication cost by filter size k, next to the source paper's."""
    if not sizes or any(k < 1 for k in sizes) or len(set(sizes)) != len(sizes):
        raise UsageError(f"--sizes {' '.join(map(str, sizes))}: distinct sizes of at "
                         "least 1")
    if data is not None:  # its grid is the network's
        grid = load_dataset(data)
        rows, cols = rows or grid.rows, cols or grid.cols
    model = {"rows": rows, "cols": cols, "filters": filters, "conv_layers": conv_layers,
             "pool": pool, "hidden": hidden}
    train = {"epochs": epochs, "batch": batch, "lr": lr}
    base = load_run_config(mode="central", model=model, train=train)
    settings: Record = {
        "model": {k: v for k, v in base.model.model_dump().items() if k != "kernel"},
        "train": base.train.model_dump(exclude={"seed"}), "data": base.data.model_dump(),
        "data_file": str(data) if data is not None else None}
    for k in sizes:  # an impossible k fails here, before any trial
        filter_size.trial_config(settings, k, 0)
    trials = [Trial(i, k, seed, settings) for i, (k, seed) in
              enumerate((k, s) for k in sizes for s in range(seeds))]
    run_dir = out or new_run_dir(name="filter-size")
    err_console.print(f"filter-size: {len(trials)} trials ({len(sizes)} sizes x {seeds} "
                      f"seeds, {base.train.epochs} epochs each) on {jobs} job(s) -> "
                      f"{run_dir}", highlight=False)
    done = [0]

    def on_done(trial: Trial, record: Record) -> None:
        done[0] += 1
        err_console.print(f"trial {done[0]}/{len(trials)}: k {trial.value} seed "
                          f"{trial.seed}: test {record['test_acc']:.4f}", highlight=False)

    records = run_trials(filter_size.run, trials, jobs, on_done)
    rows = summarize(trials, records, filter_size.FIGURES)
    summary = {"experiment": "filter-size", "mode": "central (accuracy); one mesh "
               "training wave per size (cost)", "sizes": sizes, "seeds": seeds,
               "rows": rows, "paper": filter_size.paper_rows(sizes),
               "seeds_differ": filter_size.seeds_differ(records)}
    config = {"experiment": "filter-size", "sizes": sizes, "seeds": list(range(seeds)),
              "settings": settings}
    write_run(run_dir, config, records, summary, filter_size.FIGURES)
    filter_size.plot(run_dir, rows, summary["paper"])
    if json_out:
        emit_json(json.loads((run_dir / "summary.json").read_text()))
        return
    table = Table(title=f"filter size: mean ± std over {seeds} seed(s); paper: seed 001's "
                        "own data")
    for column in ("k", "train %", "test %", "paper %", "halo sent", "(k²-1)mnc",
                   "MB/wave"):
        table.add_column(column, justify="right")
    for row in filter_size.table_rows(rows):
        table.add_row(*map(str, row))
    out_console.print(table)
    err_console.print(f"wrote {run_dir}: summary.json, table.csv, trials.jsonl, "
                      "accuracy.png, cost.png", highlight=False)
