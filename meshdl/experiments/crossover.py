"""`meshdl experiment crossover`: where does the mesh pay? The hottest node's joules a
slot and the first node's death, in the mesh and in the cloud-heavy baseline, over grid
sizes, MACs and radios, and the sizes at which the mesh's hottest node draws as much as
the cloud's (1x), half (2x) and a tenth (10x).

Each trial is one grid on one radio: a live run (sim/studies/live.py) of the install and
one live slot, timed event by event, whose price stands for every live slot (the plan
fixes what a slot sends: `run_mesh`), and the baseline's slot on the same radio; both
sides are priced under every MAC the radio has, on the same traffic, with the scheduled
MAC twice (each crystal's 40 ppm, and 2 ppm left by drift compensation). The readings are
seeded noise maps: what a slot sends, and so what it costs, does not depend on them.
Lifetimes are the first node's death on two AA cells.

Beside each ratio, its floor: the joules of a node that only wakes, takes the slot's
sync (under the scheduled MAC) and sleeps (`floor_j`), over the cloud's hottest node.
No mesh whose nodes run that MAC on that hardware can draw less at its hottest node, so
no design of the wave brings the ratio below the floor; where a target lies below it,
the target needs other hardware (a processor that sleeps on less, a better crystal).

The crossover of a factor k is where mesh_j = cloud_j / k, with each side fitted as a
line in the number of nodes N (least squares over the grids): the cloud's hottest node,
next to the edge, relays every reading (its joules grow with N); the mesh's does the same
work on any grid. So N = (k c - a) / (b - k d) for cloud_j = a + b N and mesh_j = c + d N;
none where the lines never meet at a positive N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from meshdl.experiments.columns import Shown, digits, fixed
from meshdl.experiments.runner import Record, Trial
from meshdl.protocol.activations import STATIC
from meshdl.report.numbers import figure as number
from meshdl.report.plots import pyplot, save_png

GRIDS: tuple[tuple[int, int], ...] = ((17, 25), (30, 40), (50, 50), (100, 100), (150, 150))
RADIOS = ("802.15.4", "ble")
# The MACs priced: a name of sim/radio/mac.py's, or the scheduled MAC with drift
# compensation; a radio without one (BLE has no LPL) leaves its figures out.
MACS = ("lpl", "tsch", "ideal", "scheduled", "scheduled-compensated")
FACTORS = (1, 2, 10)
MEASURES = ("mesh_j", "cloud_j", "ratio", "floor_ratio", "mesh_years", "cloud_years")
FIGURES = ("nodes", "mesh_bytes", "cloud_bytes",
           *(f"{mac}_{measure}" for mac in MACS for measure in (*MEASURES, "floor_j")))
SLOTS = 2  # the install, and the live slot whose price stands for every other


def mac_of(name: str) -> tuple[str, dict[str, Any]]:
    """The MAC of a priced name and its MacParams fields."""
    if name == "scheduled-compensated":
        return "scheduled", {"sched_drift_compensation": True}
    return name, {}


def floor_j(mac: str, radio, device, slot_s: float, params) -> float:
    """A slot's joules of a node with no traffic of its own under `mac`: its MAC's own
    cost (under the scheduled MAC: the sync flood after the slot's sleep, with its guard;
    a node a hop or more from the edge, which the relay counter makes alike), its radio
    asleep and its processor idle or asleep, priced as live prices every node."""
    from meshdl.sim.studies import live

    use = live.IDLE._replace(sync_hops=1)
    return live.radio_joules(mac, radio, use, slot_s, params).total_j + \
        live.processor_j(device, mac, 0.0, slot_s)


def run(trial: Trial) -> Record:
    """One grid on one radio: mesh and cloud priced under every MAC."""
    from meshdl.config import load_run_config
    from meshdl.model.cnn import CNN
    from meshdl.sim.radio.battery import battery
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.mac import MacParams, unsupported_reason
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.studies import live

    rows, cols, radio_name = trial.value
    settings = trial.settings
    # float32 unless the sweep says (a journal from before the option has no key)
    activations = settings.get("activations", "float32")
    config = load_run_config(mode="mesh", model={**settings["model"], "rows": rows,
                                                 "cols": cols},
                             mesh={"activations": activations})
    radio, medium = profile(radio_name), natural_medium(radio_name)
    node, edge = device(natural_device(radio_name)), device("pi4")
    model = CNN(config.model, seed=trial.seed)
    model.set_normalization(20.0, 3.0)
    rng = np.random.default_rng([trial.seed, rows, cols])
    series = rng.normal(20.0, 3.0, (SLOTS, rows, cols)).astype(np.float32)
    if activations == STATIC:  # scales from the slots' own maps: codes cost the same
        model.calibrate(model.with_alive(series))  # bytes whatever the scale
    timed = live.LiveSettings(slots=SLOTS, mac="scheduled", seed=trial.seed)
    spec = live.live_spec(config, model, medium, timed)
    mesh_run = live.LiveMesh(spec, model, radio, medium, node, edge, timed)
    mesh = live.run_mesh(mesh_run, series, lambda _: None)
    cloud = live.run_cloud(spec, model, series, radio, medium, node, edge, timed,
                           mesh_run.cells).side
    bat = battery("2xAA")
    record: Record = {"value": [rows, cols, radio_name], "seed": trial.seed,
                      "nodes": len(mesh_run.cells),
                      "mesh_bytes": mesh.costs[0].bytes, "cloud_bytes": cloud.costs[0].bytes}
    for name in MACS:
        mac, fields = mac_of(name)
        params = MacParams(**fields)
        if unsupported_reason(mac, radio, params) is not None:
            continue
        priced = live.LiveSettings(slots=SLOTS, mac=mac, seed=trial.seed,
                                   mac_params=params)
        memo: live.Memo = {}
        sides = {side: live.side_summary(figures, mesh_run.cells, mac, radio, node, priced,
                                         bat, memo)
                 for side, figures in (("mesh", mesh), ("cloud", cloud))}
        floor = floor_j(mac, radio, node, priced.slot_s, params)
        record.update({
            f"{name}_floor_j": floor,
            f"{name}_floor_ratio": floor / sides["cloud"]["hottest_node_j_per_slot"],
            f"{name}_mesh_j": sides["mesh"]["hottest_node_j_per_slot"],
            f"{name}_cloud_j": sides["cloud"]["hottest_node_j_per_slot"],
            f"{name}_ratio": sides["mesh"]["hottest_node_j_per_slot"]
            / sides["cloud"]["hottest_node_j_per_slot"],
            f"{name}_mesh_years": sides["mesh"]["first_death_years"],
            f"{name}_cloud_years": sides["cloud"]["first_death_years"]})
    return record


# ------------------------------------------------------------------ the crossover
class Line(NamedTuple):
    """y = intercept + slope x."""

    intercept: float
    slope: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line | None:
    """Least squares; None from fewer than two distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mean_x, mean_y = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    slope = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return Line(mean_y - slope * mean_x, slope)


def crossing(mesh: Line, cloud: Line, factor: float) -> float | None:
    """The N where mesh(N) = cloud(N) / factor; None where the lines never meet at a
    positive N (parallel, or meeting at N <= 0)."""
    gain = cloud.slope - factor * mesh.slope
    if gain == 0:
        return None
    nodes = (factor * mesh.intercept - cloud.intercept) / gain
    return nodes if nodes > 0 else None


def crossovers(rows: Sequence[Record], macs: Sequence[str] = MACS,
               factors: Sequence[int] = FACTORS) -> list[Record]:
    """Per radio and MAC: the fitted lines and each factor's crossover, in nodes and as
    the side of a square grid; `within` says whether it falls inside the grids swept
    (else it is extrapolated)."""
    radios = list(dict.fromkeys(row["value"][2] for row in rows))
    out = []
    for radio in radios:
        points = [row for row in rows if row["value"][2] == radio]
        for mac in macs:
            kept = [row for row in points if row.get(f"{mac}_mesh_j") is not None]
            if len(kept) < 2:
                continue
            nodes = [row["nodes"]["mean"] for row in kept]
            mesh = fit_line(nodes, [row[f"{mac}_mesh_j"]["mean"] for row in kept])
            cloud = fit_line(nodes, [row[f"{mac}_cloud_j"]["mean"] for row in kept])
            if mesh is None or cloud is None:
                continue
            entry: Record = {"radio": radio, "mac": mac, "mesh_line": list(mesh),
                             "cloud_line": list(cloud)}
            for factor in factors:
                at = crossing(mesh, cloud, factor)
                entry[f"{factor}x"] = None if at is None else {
                    "nodes": at, "side": math.sqrt(at),
                    "within": min(nodes) <= at <= max(nodes)}
            out.append(entry)
    return out


# ------------------------------------------------------------------ tables and plot
def _grid(value: Sequence[Any]) -> str:
    return f"{value[0]} x {value[1]}"


def _floor(row: Record, mac: str) -> str:
    """The floor's ratio, or n/a in a journal written before the floor was priced."""
    floor = row.get(f"{mac}_floor_ratio")
    return "n/a" if floor is None else digits(3)(floor["mean"], None)


def table(rows: Sequence[Record], macs: Sequence[str] = MACS) -> Shown:
    """One line per grid, radio and MAC: the hottest node's joules a slot and the first
    death in the mesh and the cloud, and the mesh's share of the cloud's joules."""
    header = ["grid", "nodes", "radio", "MAC", "mesh J/slot", "cloud J/slot", "mesh / cloud",
              "floor", "mesh years", "cloud years"]
    show, years = digits(4), digits(4)
    body = []
    for row in rows:
        for mac in macs:
            if row.get(f"{mac}_mesh_j") is None:
                continue
            body.append([_grid(row["value"]), fixed(0)(row["nodes"]["mean"], None),
                         row["value"][2], mac,
                         show(row[f"{mac}_mesh_j"]["mean"], None),
                         show(row[f"{mac}_cloud_j"]["mean"], None),
                         digits(3)(row[f"{mac}_ratio"]["mean"], None),
                         _floor(row, mac),
                         years(row[f"{mac}_mesh_years"]["mean"], None),
                         years(row[f"{mac}_cloud_years"]["mean"], None)])
    keys = [f"{mac}_{m}" for mac in macs for m in MEASURES]
    return Shown(header, body, ["nodes", *keys])


def crossover_table(entries: Sequence[Record], factors: Sequence[int] = FACTORS) -> Shown:
    """Per radio and MAC, each factor's crossover: nodes (side of a square grid), with
    `*` where it lies beyond the grids swept (extrapolated)."""
    header = ["radio", "MAC", *(f"{factor}x nodes (side)" for factor in factors)]
    body = []
    for entry in entries:
        cells = [entry["radio"], entry["mac"]]
        for factor in factors:
            at = entry[f"{factor}x"]
            cells.append("never" if at is None else
                         f"{number(at['nodes'], 3)} ({number(at['side'], 3)})"
                         + ("" if at["within"] else "*"))
        body.append(cells)
    return Shown(header, body, [])


def plot(out: Path, rows: Sequence[Record], macs: Sequence[str] = MACS) -> list[Path]:
    """crossover.png: the mesh's hottest node's joules over the cloud's against the
    nodes (log x, ticked at the grids swept), one line per MAC in one colour on every
    panel, a panel per radio; 1, 1/2 and 1/10 marked. Beneath each MAC's line, dashed
    in its colour, its floor (`floor_j` over the cloud's hottest node): how far the
    wave's own cost could still fall is the gap between the two, read at a glance."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    from meshdl.report.numbers import given

    plt = pyplot()
    radios = list(dict.fromkeys(row["value"][2] for row in rows))
    colour = {mac: f"C{i}" for i, mac in enumerate(MACS)}
    figure, axes = plt.subplots(1, len(radios), figsize=(6 * len(radios), 4.8), dpi=100,
                                layout="constrained", squeeze=False)
    for panel, radio in zip(axes[0], radios, strict=True):
        points = sorted((row for row in rows if row["value"][2] == radio),
                        key=lambda row: row["nodes"]["mean"])
        for mac in macs:
            kept = [row for row in points if row.get(f"{mac}_ratio") is not None]
            if kept:
                panel.plot([row["nodes"]["mean"] for row in kept],
                           [row[f"{mac}_ratio"]["mean"] for row in kept], marker="o",
                           color=colour[mac])
            floored = [row for row in kept if row.get(f"{mac}_floor_ratio") is not None]
            if floored:  # a journal written before the floor was priced has none
                panel.plot([row["nodes"]["mean"] for row in floored],
                           [row[f"{mac}_floor_ratio"]["mean"] for row in floored],
                           color=colour[mac], linestyle="--", linewidth=0.9)
        for level, text in ((1.0, "1x"), (0.5, "2x"), (0.1, "10x")):
            panel.axhline(level, color="grey", linewidth=0.8, linestyle=":")
            panel.annotate(text, (1.0, level), xycoords=("axes fraction", "data"),
                           xytext=(3, 0), textcoords="offset points", va="center",
                           color="grey")
        panel.set_xscale("log")
        nodes = sorted({row["nodes"]["mean"] for row in points})
        panel.set_xticks(nodes, [given(n) for n in nodes])
        panel.xaxis.set_minor_formatter(NullFormatter())
        panel.set_ylim(bottom=0)
        panel.set(xlabel="nodes (log scale)", ylabel="mesh / cloud, hottest node's J/slot",
                  title=radio)
    handles = [Line2D([], [], color=colour[mac], marker="o", label=mac) for mac in macs]
    if any(row.get(f"{mac}_floor_ratio") is not None for row in rows for mac in macs):
        handles.append(Line2D([], [], color="grey", linestyle="--", linewidth=0.9,
                              label="floor: its MAC with no traffic"))
    per_panel = 3  # legend entries one 6-inch panel holds: one radio's legend wraps
    figure.legend(handles=handles, loc="outside lower center",
                  ncols=min(len(handles), per_panel * len(radios)))
    figure.suptitle("where the mesh pays: its hottest node against the cloud's")
    path = out / "crossover.png"
    save_png(figure, path)
    return [path]
