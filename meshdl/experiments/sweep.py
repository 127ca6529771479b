"""The experiments that sweep one setting of the network (`meshdl experiment NAME`):
each trial runs one value with one seed.

Trials that measure accuracy train in central mode: the mesh is proven to train exactly
the same model (tests/test_mesh.py), so its accuracy is the mesh's, at a fraction of the
time. Every trial measures the communication on a real mesh wave of its network
(`meshdl cost`'s dry training wave, batch as configured): the halo values each layer
sends per sample next to the formula (k^2 - 1) m n c_in, the bytes, messages and radio
bytes of one training wave, its depth in rounds and its busiest link. Settings that do
not change what is learned (the edge's position, the grid's size on the cost question)
measure the cost only.

filter-size is the source paper's question (seed 001): its own accuracies are shown
beside ours; its data (a real lounge's log) differ from our synthetic lounge, so only
the trends compare.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from meshdl.config import DataConfig, RunConfig, load_run_config
from meshdl.data.datasets import Dataset
from meshdl.experiments.columns import Shown, figures_table, fixed, percent, size
from meshdl.experiments.runner import Record, Trial
from meshdl.report.numbers import figure as number
from meshdl.report.plots import plain_ticks, pyplot, save_png

# Seed 001's single-machine runs (17 x 25, 2,400 / 561 maps, batch 100, 200 hidden
# units, 5 filters, 20 epochs): train and test accuracy by filter size.
PAPER = {3: (0.944, 0.928), 4: (0.950, 0.937), 5: (0.945, 0.934), 6: (0.930, 0.900)}

ACCURACY = ("train_acc", "test_acc")
COST = ("halo_needed", "halo_transmitted", "halo_formula", "wave_bytes", "wave_messages",
        "wave_radio_bytes", "wave_rounds", "busiest_link_bytes")


class Sweep(NamedTuple):
    """One experiment: the setting it sweeps and what it asks."""

    setting: str  # "model.kernel", "mesh.edge_at", ...
    axis: str  # the plots' x label
    trains: bool  # accuracy too (else the cost only)
    default: tuple[Any, ...]
    heading: str  # the swept value's title in a table


SWEEPS = {
    "filter-size": Sweep("model.kernel", "filter size k", True, (3, 4, 5, 6), "k"),
    "filters": Sweep("model.filters", "filters per conv layer h", True, (1, 2, 5, 8), "h"),
    "hidden": Sweep("model.hidden", "hidden units", True, (50, 100, 200, 400),
                    "hidden units"),
    "edge-position": Sweep("mesh.edge_at", "the edge's cell", False,
                           ((0, 0), (0, 12), (8, 0), (16, 24)), "edge at"),
    "grid": Sweep("model.grid", "grid n x n", False, (5, 10, 20, 40), "n x n"),
}


def figures(name: str) -> tuple[str, ...]:
    return (ACCURACY if SWEEPS[name].trains else ()) + COST


def variables(name: str) -> tuple[str, ...]:
    """table.csv's columns of a swept value: a cell's row and column, else the value."""
    return ("edge_row", "edge_col") if name == "edge-position" else ("value",)


def trial_config(settings: Record, value: Any, seed: int) -> RunConfig:
    """The run of one trial: the experiment's configuration with this value and seed."""
    section, field = SWEEPS[settings["experiment"]].setting.split(".")
    chosen = {key: dict(settings[key]) for key in ("model", "train", "mesh", "data")}
    if field == "grid":  # an n x n mesh, its data of the same grid
        for part in ("model", "data"):
            chosen[part].update(rows=value, cols=value)
    else:
        chosen[section][field] = tuple(value) if isinstance(value, list) else value
    chosen["train"]["seed"] = seed
    return load_run_config(mode="central", **chosen)


def fit_bytes(rows: list[Record]) -> Record:
    """Least squares of a training wave's bytes against the mesh's cells (m n): bytes
    per cell, the intercept, and R² (how well a line explains the growth)."""
    cells = [float(row["value"]) ** 2 for row in rows]
    sizes = [row["wave_bytes"]["mean"] for row in rows]
    n = len(cells)
    mean_x, mean_y = sum(cells) / n, sum(sizes) / n
    sxx = sum((x - mean_x) ** 2 for x in cells)
    if n < 2 or sxx == 0:
        return {"bytes_per_cell": None, "intercept": None, "r2": None}
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(cells, sizes, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in sizes)
    residual = sum((y - slope * x - intercept) ** 2 for x, y in zip(cells, sizes, strict=True))
    return {"bytes_per_cell": slope, "intercept": intercept,
            "r2": 1.0 - residual / total if total else 1.0}


def run(trial: Trial) -> Record:
    """Train with one value and seed (where the sweep asks for accuracy); measure one
    mesh training wave of that network."""
    from meshdl.sim.mesh import dry_wave  # the virtual mesh: loaded where it runs
    from meshdl.training.loop import train

    settings, seed = trial.settings, trial.seed
    config = trial_config(settings, trial.value, seed)
    record: Record = {"value": trial.value, "seed": seed}
    if SWEEPS[settings["experiment"]].trains:
        _, history = train(config, dataset(config.data, settings.get("data_file")))
        record.update(train_acc=history.final["train_acc"],
                      test_acc=history.final["test_acc"],
                      single_class=history.final["single_class"])
    comm = dry_wave(config.model, config.train.batch, config.mesh.edge_at)
    halo = comm["halo"].values()
    record.update(
        halo_needed=sum(h["needed"] for h in halo),
        halo_transmitted=sum(h["transmitted"] for h in halo),
        halo_formula=sum(h["formula"] for h in halo),
        wave_bytes=comm["total_bytes"], wave_messages=comm["total_messages"],
        wave_radio_bytes=comm["broadcast_bytes"],
        wave_rounds=comm["wave_depth"]["wave_rounds"],
        busiest_link_bytes=(comm.get("busiest_link") or {}).get("bytes"))
    return record


@cache
def dataset(config: DataConfig, data_file: str | None) -> Dataset:
    """The data set, made once per process (every trial of a worker shares it)."""
    if data_file is not None:
        from meshdl.data.datasets import load_dataset

        return load_dataset(Path(data_file))
    from meshdl.data.lounge import generate_lounge

    return generate_lounge(config)


def paper_rows(name: str, values: list[Any]) -> list[Record]:
    """The source paper's figures for the swept values it reports (filter-size only)."""
    if name != "filter-size":
        return []
    return [{"value": k, "train_acc": PAPER[k][0], "test_acc": PAPER[k][1]}
            for k in values if k in PAPER]


def plot(out: Path, name: str, rows: list[Record], paper: list[Record]) -> list[Path]:
    """accuracy.png (where the sweep trains) and cost.png: means with one standard
    deviation as error bars, against the swept value."""
    plt = pyplot()
    axis = SWEEPS[name].axis
    labels = [_label(row["value"]) for row in rows]
    xs = list(range(len(rows)))  # categories: cells, or sizes not evenly spaced

    def series(figure: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        return ([row[figure]["mean"] * scale for row in rows],
                [row[figure]["std"] * scale for row in rows])

    written = []
    if SWEEPS[name].trains:
        figure, axes = plt.subplots(figsize=(6, 4.8), dpi=100, layout="constrained")
        for key, label in (("train_acc", "train"), ("test_acc", "test")):
            mean, std = series(key, 100)
            axes.errorbar(xs, mean, yerr=std, marker="o", capsize=4, label=f"{label} (ours)")
        where = {row["value"]: x for x, row in zip(xs, rows, strict=True)}
        for key, label, marker in (("train_acc", "train", "s"), ("test_acc", "test", "^")):
            axes.plot([where[p["value"]] for p in paper], [p[key] * 100 for p in paper],
                      linestyle="none", marker=marker, color="grey",
                      label=f"{label} (paper, its own data)")
        axes.set(xlabel=axis, ylabel="accuracy (%)", title=f"accuracy by {axis} "
                 "(mean ± std over seeds)")
        axes.set_xticks(xs, labels)
        figure.legend(loc="outside lower center", ncols=2)  # below, off the points
        save_png(figure, out / "accuracy.png")
        written.append(out / "accuracy.png")

    save_png(cost_figure(name, rows), out / "cost.png")
    written.append(out / "cost.png")
    return written


# The halo values of a wave side by side (needed, sent, the formula), each its own bar:
# drawn as lines, "needed" hid under "transmitted" where they are equal.
HALO_BARS = (("halo_needed", "needed"), ("halo_transmitted", "transmitted"),
             ("halo_formula", "(k²-1)·m·n·c_in"))


def cost_figure(name: str, rows: list[Record]) -> Any:
    """cost.png: the halo values a sample needs, sends and the formula's count (left),
    and the megabytes of a training wave (right), as bars from zero over the swept
    values: those are categories (an edge's cells, sizes not evenly spaced), which a line
    would join as if something lay between them, and an axis cut above zero made a 5 %
    difference look like a deep V (issue 47 item 3). Error bars: one standard deviation
    over the seeds."""
    plt = pyplot()
    axis = SWEEPS[name].axis
    labels = [_cell_label(row["value"]) for row in rows]  # as the table names them
    xs = np.arange(len(rows))
    figure, (halo, wave) = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100,
                                        layout="constrained")
    width = 0.8 / len(HALO_BARS)
    for i, (key, label) in enumerate(HALO_BARS):
        halo.bar(xs + (i - (len(HALO_BARS) - 1) / 2) * width,
                 [row[key]["mean"] for row in rows], width,
                 yerr=[row[key]["std"] for row in rows], capsize=3, label=label)
    halo.set(xlabel=axis, ylabel="halo values per sample (all conv layers)",
             title=f"halo values by {axis}")
    plain_ticks(halo.yaxis)  # 5,500 values
    megabytes = [row["wave_bytes"]["mean"] / 1e6 for row in rows]
    bars = wave.bar(xs, megabytes, 0.6, yerr=[row["wave_bytes"]["std"] / 1e6 for row in rows],
                    capsize=3, color="dimgrey")
    wave.bar_label(bars, labels=[number(mb, 3) for mb in megabytes], padding=2)
    wave.set(xlabel=axis, ylabel="MB per training wave", title=f"a training wave by {axis}")
    for panel in (halo, wave):
        panel.set_xticks(xs, labels)
        panel.set_ylim(bottom=0)
        panel.margins(y=0.12)  # room for the bars' labels
    figure.legend(*halo.get_legend_handles_labels(), loc="outside lower center", ncols=3)
    return figure


def _label(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def seeds_differ(records: list[Record]) -> bool:
    """Whether the seeds gave different accuracies (else a std of 0 means nothing)."""
    if "test_acc" not in records[0]:
        return False
    return len({(_label(r["value"]), r["test_acc"]) for r in records}) > len(
        {_label(r["value"]) for r in records})


def table(name: str, rows: list[Record]) -> Shown:
    """The printed table: the value, then where the sweep trains the test accuracy
    first (the headline), the train accuracy and the paper's; the halo values sent per
    sample against the formula and the bytes of a training wave; for the cost-only
    sweeps the wave's rounds and busiest link (no room for them on 80 columns beside
    the accuracies; summary.json and table.csv have every figure)."""
    trains = SWEEPS[name].trains
    shown = [*([("test_acc", percent(1)), ("train_acc", percent(1))] if trains else []),
             ("halo_transmitted", fixed(0)), ("halo_formula", fixed(0)),
             ("wave_bytes", size),
             *([] if trains else [("wave_rounds", fixed(0)), ("busiest_link_bytes", size)])]
    out = figures_table(rows, [(SWEEPS[name].heading, _cell_label)], shown)
    if name == "filter-size":  # the paper's own, in our columns' order
        out.header.insert(3, "paper test/train %")
        for row, cells in zip(rows, out.rows, strict=True):
            paper = PAPER.get(row["value"])
            cells.insert(3, f"{paper[1] * 100:.1f}/{paper[0] * 100:.1f}" if paper else "-")
    return out


def _cell_label(value: Any) -> str:
    """A swept value as a table shows it: a cell as r0c12, a number as it is."""
    if isinstance(value, (list, tuple)):
        return f"r{value[0]}c{value[1]}"
    return str(value)
