"""`meshdl experiment meshes`: several meshes training one model (seeds 002 and 004),
under simulated time: throughput, step time and test accuracy by the number of meshes
N and the sync mode, with and without a straggler mesh.

Each trial trains the configured network on N simulated meshes of the configured radio
(each its own backoffs), their edges linked to the parameter server by the backhaul.
`--batch` is each mesh's share (weak scaling: N meshes take N times the samples a
step); the samples of an epoch stay the data set's, so large N make fewer, larger
steps. The default, 50, cuts the seed's 2,400 maps into whole steps for every N up to
16 (with 100, 16 meshes would end each epoch on a half-empty step). The straggler is
the last mesh with lossy links (`--straggler-loss`, reliable recovery: it computes the
same values, slower, as a mesh in a noisy room would).

Scaling efficiency at N is N meshes' throughput (training samples per simulated
second, end to end) over N times one mesh's (same mode): 1 when N meshes learn from N
times the samples in the same time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from meshdl.experiments import columns
from meshdl.experiments.columns import Shown, digits, figures_table, fixed, percent
from meshdl.experiments.runner import Record, Trial
from meshdl.report.plots import pyplot, save_png

MODES = ("bsp", "bsp+overlap", "ssp:2", "async")
COUNTS = (1, 2, 4, 8, 16)
VARIABLES = ("meshes", "mode", "straggler")  # table.csv's columns of a swept value
FIGURES = ("test_acc", "train_loss", "samples_per_s", "step_s", "compute_s",
           "communication_s", "ideal_step_s", "staleness_max", "staleness_mean",
           "waited_share", "updates", "backhaul_bytes", "epoch_s")


def values(counts: list[int], modes: list[str], straggler: bool) -> list[list[Any]]:
    """The swept [N, mode, straggler] triples: one mesh without a straggler (a single
    mesh cannot wait for another); N >= 2 without and, if asked, with one."""
    out: list[list[Any]] = []
    for n in counts:
        for mode in modes:
            out.append([n, mode, False])
            if straggler and n >= 2:
                out.append([n, mode, True])
    return out


def run(trial: Trial) -> Record:
    """Train on the trial's N meshes in its mode; accuracy, throughput, step times."""
    from meshdl.config import RunConfig
    from meshdl.data.augment import training_data
    from meshdl.experiments.sweep import dataset
    from meshdl.sim.radio.backhaul import backhaul_profile
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.loss import FrameLoss
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.simulate import SimEngine
    from meshdl.training.parallel import train_parallel

    n, mode, straggler = trial.value
    settings = trial.settings
    sync, _, overlap = mode.partition("+")
    config = RunConfig.model_validate({
        "mode": "mesh", "model": settings["model"], "train": settings["train"],
        "mesh": settings["mesh"], "data": settings["data"],
        "parallel": {"meshes": n, "sync": sync, "overlap": overlap == "overlap"}})
    data = dataset(config.data, settings.get("data_file"))
    view = training_data(config.train, data, config.model)
    radio = settings["radio"]
    medium = natural_medium(radio)

    def mesh(i: int) -> SimEngine:
        slow = straggler and i == n - 1
        return SimEngine(view, profile(radio), medium, device(natural_device(radio)),
                         device("pi4"), seed=config.train.seed + i,
                         mesh_id=config.parallel.first_mesh_id + i,
                         edge_at=config.mesh.edge_at,
                         params_via="tree" if medium == "shared" else "broadcast",
                         loss=FrameLoss(settings["straggler_loss"], None, trial.seed)
                         if slow else None)

    _, history = train_parallel(config, data, [mesh(i) for i in range(n)],
                                wave_time=lambda engines, i: engines[i].last_wave_shape,
                                time_unit="s",
                                backhaul=backhaul_profile(settings["backhaul"]))
    p = history.parallel
    link = p["backhaul"]
    busy = sum(m["busy"] for m in p["per_mesh"])
    return {
        "value": [n, mode, straggler], "seed": trial.seed,
        "test_acc": history.final["test_acc"],
        "train_loss": history.epochs[-1].train_loss,
        "samples_per_s": p["samples_per_time"],
        "epoch_s": p["elapsed"] / config.train.epochs,
        "step_s": p["step"]["mean"], "compute_s": p["step"]["compute"],
        "communication_s": p["step"]["communication"], "ideal_step_s": p["step"]["ideal"],
        "staleness_max": p["staleness"]["max"], "staleness_mean": p["staleness"]["mean"],
        "waited_share": sum(m["waited"] for m in p["per_mesh"]) / busy if busy else 0.0,
        "updates": p["updates"], "backhaul_bytes": link["bytes_up"] + link["bytes_down"],
        "test_acc_per_epoch": [e.test_acc for e in history.epochs],
    }


DEFAULT_BATCH = 50


def efficiencies(rows: list[Record]) -> dict[tuple[int, str, bool], float]:
    """Scaling efficiency of each row: its throughput over N times the single mesh's
    (same mode)."""
    single = {row["value"][1]: _mean(row["samples_per_s"]) for row in rows
              if row["value"][0] == 1}
    out = {}
    for row in rows:
        n, mode, straggler = row["value"]
        rate, one = _mean(row["samples_per_s"]), single.get(mode)
        if rate and one:
            out[(n, mode, straggler)] = rate / (n * one)
    return out


# meshes.png's panels: title and y label.
_PANELS = (("throughput", "training samples per simulated second"),
           ("scaling efficiency", "throughput / (N x one mesh's)"),
           ("accuracy", "test accuracy (%)"))


def plot(out: Path, rows: list[Record]) -> list[Path]:
    """meshes.png: throughput (samples per simulated second, with the ideal N times one
    mesh), scaling efficiency and test accuracy against N; one colour per mode, dashed
    with a straggler; the legend below the panels, off the data."""
    plt = pyplot()
    efficiency = efficiencies(rows)
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.8), dpi=100, layout="constrained")
    modes = list(dict.fromkeys(row["value"][1] for row in rows))
    stragglers = False
    for index, mode in enumerate(modes):
        colour = f"C{index}"
        for straggler, style in ((False, "-o"), (True, "--x")):
            series = sorted((row for row in rows if row["value"][1] == mode and
                             (row["value"][2] == straggler or row["value"][0] == 1)),
                            key=lambda row: row["value"][0])
            if not any(row["value"][2] == straggler for row in series):
                continue
            stragglers |= straggler
            counts = [row["value"][0] for row in series]
            axes[0].plot(counts, [_mean(row["samples_per_s"]) for row in series],
                         style, color=colour)
            axes[1].plot(counts, [efficiency.get(tuple(row["value"]), np.nan)
                                  for row in series], style, color=colour)
            axes[2].plot(counts, [_percent(row.get("test_acc")) for row in series],
                         style, color=colour)
    single = [row for row in rows if row["value"][0] == 1]
    top = max(row["value"][0] for row in rows)
    if single:
        one = max(_mean(row["samples_per_s"]) for row in single)
        axes[0].plot([1, top], [one, top * one], ":", color="grey")
    axes[1].axhline(0.9, color="grey", linestyle=":", linewidth=1)
    counts = sorted({row["value"][0] for row in rows})
    for axis, (title, ylabel) in zip(axes, _PANELS, strict=True):
        axis.set_xscale("log", base=2)
        # Whole meshes, as numbers (not 2^3): the N the sweep ran.
        axis.set_xticks(counts, [str(n) for n in counts])
        axis.minorticks_off()
        axis.set(xlabel="meshes N", ylabel=ylabel, title=title)
    handles = _legend(plt, modes, stragglers, bool(single))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    figure.suptitle("several meshes training one model")
    path = out / "meshes.png"
    save_png(figure, path)
    return [path]


def _legend(plt: Any, modes: list[str], stragglers: bool, ideal: bool) -> list[Any]:
    """The legend's entries: a colour per mode, then what the dashed line (a straggler)
    and the dotted one (N times one mesh's throughput) are."""
    line = plt.Line2D
    handles = [line([], [], color=f"C{i}", marker="o", label=m) for i, m in enumerate(modes)]
    if stragglers:
        handles.append(line([], [], color="black", linestyle="--", marker="x",
                            label="with a straggler"))
    if ideal:
        handles.append(line([], [], color="grey", linestyle=":", label="ideal (N x one)"))
    return handles


def _percent(figure: Record | None) -> float:
    return np.nan if figure is None else 100.0 * figure["mean"]


def table(rows: list[Record]) -> Shown:
    """The printed table: N, mode and straggler; throughput and its scaling
    efficiency (the question), step times, staleness and the test accuracy."""
    out = figures_table(rows, [("N", lambda v: str(v[0])), ("mode", lambda v: str(v[1])),
                               ("straggler", lambda v: "yes" if v[2] else "")],
                        [("samples_per_s", digits(4)), ("step_s", fixed(1)),
                         ("ideal_step_s", fixed(1)), ("staleness_max", fixed(0)),
                         ("test_acc", percent(2))])
    efficiency = efficiencies(rows)
    out.header.insert(4, columns.title("efficiency"))
    for row, cells in zip(rows, out.rows, strict=True):
        eff = efficiency.get(tuple(row["value"]))
        cells.insert(4, "" if eff is None else f"{eff:.3f}")
    return out


def _mean(figure: dict[str, float] | None) -> float | None:
    return None if figure is None else figure["mean"]
