"""The pictures of a `simulate live` report (issue 47 item 1): where the batteries die
first, what the hottest node's joules go to, and the mesh against the cloud under each
MAC. Drawn from sim.json (its "nodes", written since issue 47, and "macs"); a sim.json
without "nodes" gets the MAC bars alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from meshdl.report.maps import Mark, draw_map, grid_of, scale, spread
from meshdl.report.numbers import figure as number
from meshdl.report.plots import pyplot

SIDES = (("mesh", "in the mesh"), ("cloud", "cloud-heavy"))
# The parts of a node's joules a slot (sim/studies/live.py's PARTS), as a legend says
# them, in the order they stack.
PART_LABELS = {"MAC floor": "MAC floor (checks, strobes, beacons, idle listening)",
               "sleep": "radio asleep", "traffic": "traffic (frames and ACKs)",
               "processor": "processor (computing, idle)"}


def lifetime_figure(sim: Mapping[str, Any], rows: int, cols: int,
                    edge_at: str | None = None) -> Any:
    """Each node's battery lifetime in years, in the mesh and cloud-heavy side by side
    on one colour scale (the nodes' range over both), the first to die and the edge
    marked."""
    plt = pyplot()
    nodes = sim["nodes"]
    grids = [grid_of(nodes[side]["years"], rows, cols) for side, _ in SIDES]
    limits = scale(grids)
    side_in = min(0.45, 4.2 / cols, 5.0 / rows)
    figure, panels = plt.subplots(1, 2, figsize=(max(9.6, 2 * cols * side_in + 3.0),
                                                 rows * side_in + 2.6),
                                  layout="constrained")
    handles: list[Any] = []
    for (side, title), panel, grid in zip(SIDES, panels, grids, strict=True):
        record = sim.get(side) or {}
        first = record.get("first_cell")
        marks = [Mark(first, "first to die", "s", "tab:cyan")] if first else []
        if edge_at:
            marks.append(Mark(edge_at, f"edge at {edge_at}", "^", "tab:blue"))
        drawn = draw_map(figure, panel, grid, limits, "years on the battery", marks,
                         cmap="viridis", colour_bar=panel is panels[-1])
        handles = handles or drawn
        panel.set_title(f"{title}: first death {number(record.get('first_death_years', 0))}"
                        f" y ({first})\n{spread(grid, 'y')}")
    battery = (sim.get("battery") or {}).get("name", "?")
    figure.suptitle(f"each node's lifetime on {battery}, MAC {sim.get('mac')} (colours over "
                    "both maps' range)")
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                  frameon=False)
    return figure


def mac_figure(sim: Mapping[str, Any]) -> Any:
    """The mesh against the cloud: the first battery's death under each MAC the radio
    has, as bars from zero, each with its years, the run's MAC named."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(9.6, 4.2), layout="constrained")
    _first_death_by_mac(axes, sim)
    axes.legend(loc="upper left", frameon=False)
    return figure


def parts_figure(sim: Mapping[str, Any]) -> Any:
    """Each side's hottest node's joules a slot, split by part (sim.json's "nodes")."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(9.6, 3.6), layout="constrained")
    _hottest_parts(axes, sim, sim["nodes"])
    return figure


def _first_death_by_mac(axes: Any, sim: Mapping[str, Any]) -> None:
    macs = list((sim.get("macs") or {}).items())
    xs = np.arange(len(macs))
    width = 0.38
    for i, (side, title) in enumerate(SIDES):
        years = [sides[side].get("first_death_years", 0.0) for _, sides in macs]
        bars = axes.bar(xs + (i - 0.5) * width, years, width, label=title,
                        color=("tab:green", "tab:grey")[i])
        axes.bar_label(bars, labels=[number(y) for y in years], padding=2)
    axes.set_xticks(xs, [f"{mac}\n(the run's)" if mac == sim.get("mac") else mac
                         for mac, _ in macs])
    top = max((sides[side].get("first_death_years", 0.0) for _, sides in macs
               for side, _ in SIDES), default=0.0)
    axes.set_ylim(0, top * 1.15 or 1.0)  # room for the bars' years under the title
    axes.set(xlabel="MAC", ylabel="first battery's death (years)",
             title="first death, mesh and cloud-heavy, by MAC")


def _hottest_parts(axes: Any, sim: Mapping[str, Any], nodes: Mapping[str, Any]) -> None:
    """Stacked bars: each side's hottest node's joules a slot, by part."""
    names = [title for _, title in SIDES]
    left = np.zeros(len(SIDES))
    colours = ("tab:red", "tab:purple", "tab:orange", "tab:blue")
    for colour, (part, label) in zip(colours, PART_LABELS.items(), strict=True):
        joules = np.array([nodes[side]["hottest_parts_j_per_slot"].get(part, 0.0)
                           for side, _ in SIDES])
        axes.barh(names, joules, left=left, color=colour,
                  label=f"{label}: {' / '.join(number(j, 3) for j in joules)} J")
        left += joules
    for y, (side, _) in enumerate(SIDES):
        cell = (sim.get(side) or {}).get("hottest_cell", "?")
        axes.annotate(f"{cell}: {number(float(left[y]), 4)} J", (left[y], y),
                      xytext=(4, 0), textcoords="offset points", va="center")
    axes.set_xlim(0, float(left.max()) * 1.25 or 1.0)
    axes.invert_yaxis()
    axes.set(xlabel="hottest node's joules a slot", title="the hottest node's joules by part")
    figure = axes.get_figure()
    figure.legend(*axes.get_legend_handles_labels(), loc="outside lower center", ncols=2,
                  frameon=False, title="in the mesh / cloud-heavy")
