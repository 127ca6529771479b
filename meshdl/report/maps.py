"""Maps of the grid: one figure per node, a colour per cell (energy.png of `simulate
train|infer`, the lifetime and J/slot maps of a `simulate live` report).

The colours span the nodes' own range, not 0 to the top: nodes 0.53 % apart drawn from
0 J were one uniform yellow field (issue 47 item 2), which said nothing a reader could
not read in the title. The level (how many joules, how many years) is in the title and
the colour bar's labels, the spread in words; a node with no figure (down all run) is
hatched grey and named in the legend.

meshdl.report sits below meshdl.protocol (tests/test_layering.py): cells are parsed from
their names ("r2c1") here, as sim.json writes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from meshdl.report.numbers import figure as number
from meshdl.report.plots import integer_ticks, pyplot

_CELL = re.compile(r"r(\d+)c(\d+)")


class Mark(NamedTuple):
    """A cell to point out on a map (the hottest node, the edge), with its legend text."""

    cell: str
    label: str
    marker: str  # "s": a square around the cell, "^": a triangle on it
    colour: str


def cell_of(name: str) -> tuple[int, int]:
    """"r2c1" -> (2, 1)."""
    found = _CELL.fullmatch(name)
    if found is None:
        raise ValueError(f"not a cell name: {name!r}")
    return int(found[1]), int(found[2])


def grid_of(values: Mapping[str, float], rows: int, cols: int) -> np.ndarray:
    """Figures by cell name as a rows x cols grid; NaN where a node has none (the edge
    and other parties than cells are left out)."""
    grid = np.full((rows, cols), np.nan)
    for name, value in values.items():
        if _CELL.fullmatch(name):
            r, c = cell_of(name)
            if r < rows and c < cols:
                grid[r, c] = value
    return grid


def spread(grid: np.ndarray, unit: str) -> str:
    """The nodes' range in words: "nodes 0.2943 to 0.2948 J (spread 0.17 %)"."""
    live = grid[np.isfinite(grid)]
    if not live.size:
        return "no node has a figure"
    low, high = float(live.min()), float(live.max())
    share = 100 * (high - low) / high if high else 0.0
    return f"nodes {number(low)} to {number(high)} {unit} (spread {number(share, 2)} %)"


def scale(grids: Sequence[np.ndarray]) -> tuple[float, float]:
    """The colour scale of maps drawn side by side: their nodes' lowest to highest
    figure (a span around a single value when every node has the same)."""
    live = np.concatenate([g[np.isfinite(g)] for g in grids])
    if not live.size:
        return 0.0, 1.0
    low, high = float(live.min()), float(live.max())
    if high > low:
        return low, high
    pad = abs(low) * 1e-3 or 1.0
    return low - pad, high + pad


def draw_map(figure: Any, axes: Any, grid: np.ndarray, limits: tuple[float, float],
             colour_label: str, marks: Sequence[Mark] = (), cmap: str = "inferno",
             colour_bar: bool = True) -> list[Any]:
    """`grid` on `axes`, coloured over `limits` (`scale`), rows and columns numbered on
    whole numbers, cells without a figure hatched; its legend handles (the marks, the
    cells without a figure)."""
    plt = pyplot()
    image = axes.imshow(np.ma.masked_invalid(grid), origin="upper", vmin=limits[0],
                        vmax=limits[1],
                        cmap=plt.get_cmap(cmap).with_extremes(bad="lightgrey"))
    if colour_bar:
        bar = figure.colorbar(image, ax=axes, label=colour_label, shrink=0.9)
        digits = _digits(limits)
        bar.ax.yaxis.set_major_formatter(lambda value, _: number(float(value), digits))
    axes.set_xlabel("column c")
    axes.set_ylabel("row r")
    integer_ticks(axes.xaxis)
    integer_ticks(axes.yaxis)
    handles = _hatch_missing(axes, grid)
    for mark in marks:
        r, c = cell_of(mark.cell)
        square = mark.marker == "s"
        handles += axes.plot(c, r, linestyle="none", marker=mark.marker,
                             markersize=14 if square else 8,
                             markerfacecolor="none" if square else mark.colour,
                             markeredgecolor=mark.colour if square else "white",
                             markeredgewidth=2.5 if square else 1.0, label=mark.label)
    return handles


def _digits(limits: tuple[float, float]) -> int:
    """Significant digits that tell a colour bar's ticks apart over `limits`: four, more
    when the span is a small share of the level (0.2943 to 0.2948: four; 2.3710 to
    2.3712: five)."""
    low, high = limits
    level = max(abs(low), abs(high))
    if not level or high <= low:
        return 4
    return max(4, math.ceil(math.log10(level / (high - low))) + 2)


def _hatch_missing(axes: Any, grid: np.ndarray) -> list[Any]:
    """Hatch the cells without a figure (nodes down all run); their legend entry."""
    from matplotlib.patches import Patch, Rectangle

    missing = [(int(r), int(c)) for r, c in zip(*np.nonzero(np.isnan(grid)), strict=True)]
    for r, c in missing:
        axes.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch="xx",
                                 edgecolor="dimgrey", linewidth=0))
    if not missing:
        return []
    return [Patch(facecolor="lightgrey", edgecolor="dimgrey", hatch="xx",
                  label=f"dead (down all run): {_names(missing)}")]


def _names(cells: list[tuple[int, int]], at_most: int = 6) -> str:
    """Cells by name, the first `at_most` of a long list and how many more."""
    names = [f"r{r}c{c}" for r, c in cells]
    more = len(names) - at_most
    return ", ".join(names[:at_most]) + (f" and {more} more" if more > 0 else "")


def energy_figure(mesh_report: Mapping[str, Any], rows: int, cols: int) -> Any:
    """energy.png: joules per node of a simulated run (sim.json's energy_j.per_node),
    the colours over the nodes' spread, the level and the spread in the title, the
    hottest node and the edge's cell marked, the nodes down all run hatched and named."""
    plt = pyplot()
    energy = mesh_report["energy_j"]
    grid = grid_of(energy["per_node"], rows, cols)
    # Cells of about half an inch, the heat map at most 7 inches wide or 6 tall (a
    # 17 x 25 grid), with room for the colour bar, the title and the legend below.
    side = min(0.55, 7.0 / cols, 6.0 / rows)
    fig, ax = plt.subplots(figsize=(max(6.4, cols * side + 2.4), rows * side + 2.4),
                           layout="constrained")
    marks = [Mark(energy["max_node_cell"], f"hottest node {energy['max_node_cell']} "
                  f"({number(energy['max_node'])} J)", "s", "tab:cyan")]
    edge_at = (mesh_report.get("faults") or {}).get("edge_at")
    if edge_at:
        marks.append(Mark(edge_at, f"edge attached at {edge_at}", "^", "tab:blue"))
    handles = draw_map(fig, ax, grid, scale([grid]), "joules per node (J)", marks)
    live = grid[np.isfinite(grid)]
    level = f"about {number(float(np.mean(live)), 3)} J a node" if live.size else "no energy"
    ax.set_title(f"energy per node, {mesh_report['radio']['name']} "
                 f"({mesh_report['medium']}): {level}\n{spread(grid, 'J')},\n"
                 "the colours over that range")
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 2),
               frameon=False)
    return fig
