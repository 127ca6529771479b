"""Plots a reader does not squint at (issue 33, item 11), checked on the figure objects
their functions save: energy.png on a 6 x 8 grid (the whole title, clear of the colour
bar; a colour scale over the nodes' spread, the level and the spread in words (issue
47); dead cells in the legend; rows and columns numbered on whole numbers), the
training curves on whole epochs, and the legends of failures.png and loss.png readable
at the report's width."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshdl.experiments import faults
from meshdl.report import page
from meshdl.report.page import build_report
from meshdl.sim import simulate
from tests.helpers import saved_figures

ROWS, COLS = 6, 8
DEAD = ("r2c1", "r3c1", "r0c3")
# The report's column is 60em: 960 px at 16 px an em; a wider PNG shows shrunk there.
REPORT_PX, MIN_TEXT_PX = 960, 11.0


def _sim_report(dead: tuple[str, ...] = ()) -> dict[str, Any]:
    """sim.json's figures energy.png reads: nodes 0.2943 to 0.2948 J (0.2 % apart)."""
    cells = [f"r{r}c{c}" for r in range(ROWS) for c in range(COLS)]
    joules = dict(zip(cells, np.linspace(0.2943, 0.2948, len(cells)), strict=True))
    per_node = {cell: float(j) for cell, j in joules.items() if cell not in dead}
    hottest = max(per_node, key=per_node.__getitem__)
    return {"radio": {"name": "802.15.4"}, "medium": "shared",
            "energy_j": {"per_node": per_node, "max_node_cell": hottest,
                         "max_node": per_node[hottest]},
            "faults": {"down_cells": sorted(dead), "edge_at": "r0c0"}}


def _energy_figure(monkeypatch, tmp_path: Path, dead: tuple[str, ...] = ()) -> Any:
    saved = saved_figures(monkeypatch, simulate)
    simulate.plot_energy(_sim_report(dead), ROWS, COLS, tmp_path / "energy.png")
    assert (tmp_path / "energy.png").read_bytes().startswith(b"\x89PNG")
    return saved[0]


def _heat_map(figure: Any) -> Any:
    return next(axes for axes in figure.axes if axes.images and axes.get_title())


def _drawn(figure: Any) -> Any:
    """Draw `figure` (closed by save_png: on a fresh Agg canvas) and return the
    renderer, with which its laid-out positions are measured."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas.get_renderer()


def _integers(values: Any) -> bool:
    return all(float(v).is_integer() for v in values)


def test_energy_map_title_is_whole_and_clear_of_the_colour_bar(monkeypatch, tmp_path) -> None:
    figure = _energy_figure(monkeypatch, tmp_path)
    renderer = _drawn(figure)
    heat = _heat_map(figure)
    title = heat.title.get_window_extent(renderer)
    whole = figure.bbox
    assert whole.x0 <= title.x0 and title.x1 <= whole.x1
    assert whole.y0 <= title.y0 and title.y1 <= whole.y1
    for other in figure.axes:
        if other is not heat:  # the colour bar
            assert not title.overlaps(other.get_window_extent(renderer))


def test_energy_map_colours_span_the_nodes_spread_with_the_level_in_the_title(
        monkeypatch, tmp_path) -> None:
    # Nodes 0.17 % apart drawn from 0 J were one uniform colour (issue 47 item 2).
    figure = _energy_figure(monkeypatch, tmp_path)
    heat = _heat_map(figure)
    low, high = heat.images[0].get_clim()
    assert (low, high) == (pytest.approx(0.2943), pytest.approx(0.2948))
    colours = heat.images[0].to_rgba(heat.images[0].get_array())
    assert np.ptp(colours[..., :3]) > 0.5  # the lowest node and the highest look apart
    assert "about 0.295 J a node" in heat.get_title()
    assert "nodes 0.2943 to 0.2948 J (spread 0.17 %)" in heat.get_title()
    _drawn(figure)
    bar = next(axes for axes in figure.axes if axes is not heat)
    ticks = [t.get_text() for t in bar.get_yticklabels() if t.get_text()]
    assert len(set(ticks)) == len(ticks) > 1  # the colour bar's ticks tell levels apart


def test_energy_map_names_its_dead_cells_in_the_legend(monkeypatch, tmp_path) -> None:
    figure = _energy_figure(monkeypatch, tmp_path, DEAD)
    legends = figure.legends + [a.get_legend() for a in figure.axes if a.get_legend()]
    texts = [t.get_text() for legend in legends for t in legend.get_texts()]
    dead = [t for t in texts if "dead" in t]
    assert len(dead) == 1
    assert all(cell in dead[0] for cell in DEAD)
    # A dead cell is no cold node: it is left out of the colours.
    heat = _heat_map(figure)
    grid = heat.images[0].get_array()
    assert np.ma.is_masked(grid[2, 1]) and not np.ma.is_masked(grid[0, 0])


def test_energy_map_numbers_rows_and_columns_on_whole_numbers(monkeypatch, tmp_path) -> None:
    figure = _energy_figure(monkeypatch, tmp_path)
    _drawn(figure)
    heat = _heat_map(figure)
    assert heat.get_xlabel() and heat.get_ylabel()
    assert _integers(heat.get_xticks()) and _integers(heat.get_yticks())


@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_training_curves_tick_whole_epochs(monkeypatch, tmp_path, n) -> None:
    epochs = [{"epoch": e, "train_loss": 1 / e, "train_acc": 0.5, "test_acc": 0.6}
              for e in range(1, n + 1)]
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"mode": "mesh", "epochs": epochs, "final": {"test_acc": 0.6}}))
    saved = saved_figures(monkeypatch, page)
    build_report(tmp_path)
    (figure,) = saved
    _drawn(figure)
    for axes in figure.axes:
        assert axes.get_xlabel() == "epoch"
        low, high = axes.get_xlim()  # every tick shown (one epoch: 0.945, 0.96, ...)
        ticks = [t for t in axes.get_xticks() if low <= t <= high]
        assert ticks and _integers(ticks)


def _fault_rows() -> list[dict[str, Any]]:
    def fig(mean: float) -> dict[str, float]:
        return {"mean": mean, "std": 0.01}
    rows = [{"value": [0.0, faults.EXACT], "test_acc": fig(0.95), "clean_test_acc": fig(0.96),
             "seconds_per_epoch": fig(900.0), "energy_j_per_epoch": fig(5000.0)}]
    for share in (0.1, 0.2):
        for k, policy in enumerate(("zero", "last", "neighbours")):
            rows.append({"value": [share, policy], "test_acc": fig(0.9 - k * share),
                         "clean_test_acc": fig(0.92 - k * share),
                         "seconds_per_epoch": fig(900 + 3000 * share),
                         "energy_j_per_epoch": fig(5000 + 20000 * share)})
    return rows


@pytest.mark.parametrize("name", ["failures", "loss"])
def test_fault_sweep_legends_and_labels_read_at_the_reports_width(
        monkeypatch, tmp_path, name) -> None:
    saved = saved_figures(monkeypatch, faults)
    faults.plot(tmp_path, name, _fault_rows())
    (figure,) = saved
    dpi = 100  # save_png's
    shrink = min(1.0, REPORT_PX / (figure.get_figwidth() * dpi))
    texts = [t for axes in figure.axes if axes.get_legend()
             for t in axes.get_legend().get_texts()]
    texts += [axes.title for axes in figure.axes]
    texts += [label for axes in figure.axes for label in axes.get_xticklabels()]
    assert texts
    for text in texts:
        assert text.get_fontsize() * dpi / 72 * shrink >= MIN_TEXT_PX - 1e-9, text


def test_the_report_draws_the_energy_map_from_sim_json_over_the_spread(
        monkeypatch, tmp_path) -> None:
    # An energy.png of an older meshdl (colours from 0 J) is not what the page shows.
    (tmp_path / "sim.json").write_text(json.dumps({**_sim_report(), "mode": "infer"}))
    (tmp_path / "config.json").write_text(json.dumps({"model": {"rows": ROWS, "cols": COLS}}))
    (tmp_path / "energy.png").write_bytes(b"\x89PNG old")
    saved = saved_figures(monkeypatch, page)
    text = build_report(tmp_path)
    (figure,) = saved
    low, high = _heat_map(figure).images[0].get_clim()
    assert (low, high) == (pytest.approx(0.2943), pytest.approx(0.2948))
    assert 'alt="energy per node"' in text and "energy.png" not in text
