"""Experiments' plots a reader does not squint at (issue 33, item 11), checked on the
figure objects their `plot` functions save, from small made-up summary rows: every
panel says on its y axis what it shows, the legend sits below the panels rather than on
the data, its text reads at the report's width, and an axis that counts (meshes N)
ticks whole numbers only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshdl.experiments import compression, delta, edge_vs_cloud, faults, meshes, sweep
from meshdl.report.plots import min_font_pt
from tests.helpers import saved_figures

Record = dict[str, Any]


def _fig(mean: float, std: float = 0.0) -> Record:
    return {"mean": mean, "std": std}


def _fault_rows() -> list[Record]:
    rows = [{"value": [0.0, faults.EXACT], "test_acc": _fig(0.95, 0.01),
             "clean_test_acc": _fig(0.96, 0.01), "seconds_per_epoch": _fig(900.0, 5),
             "energy_j_per_epoch": _fig(5000.0, 20)}]
    for share in (0.1, 0.2, 0.3):
        for k, policy in enumerate(("zero", "last", "neighbours", "reliable")):
            rows.append({"value": [share, policy], "test_acc": _fig(0.9 - k * share, 0.02),
                         "clean_test_acc": _fig(0.92 - k * share, 0.02),
                         "seconds_per_epoch": _fig(900 + 3000 * share, 10),
                         "energy_j_per_epoch": _fig(5000 + 20000 * share, 50)})
    return rows


def _mesh_rows() -> list[Record]:
    rows = []
    for k, mode in enumerate(("bsp", "ssp:2", "async")):
        for n in (1, 2, 4, 8):
            for straggler in (False, True) if n > 1 else (False,):
                rate = 0.36 * n * (0.4 + 0.1 * k if straggler else 0.98 - 0.01 * k)
                rows.append({"value": [n, mode, straggler], "samples_per_s": _fig(rate),
                             "test_acc": _fig(0.97 - 0.01 * n)})
    return rows


def _compression_rows() -> list[Record]:
    return [{"value": policy, "test_acc": _fig(acc, 0.004),
             "gradient_bytes_per_step": _fig(size), "epoch_s": _fig(seconds)}
            for policy, acc, size, seconds in (("none", 0.9727, 967_992, 6350),
                                               ("intsum", 0.9709, 521_966, 6234),
                                               ("hylo", 0.9721, 88_830, 6210),
                                               ("plan", 0.9721, 57_722, 4070))]


def _delta_rows() -> list[Record]:
    return [{"value": eps, "halo_bytes_per_slot": _fig(size), "alerts_changed": _fig(c)}
            for eps, size, c in (("full", 230_784, 0), ("0", 222_935, 0),
                                 ("0.1", 211_662, 1))]


def _edge_rows() -> list[Record]:
    rows = []
    for k, radio in enumerate(("802.15.4", "ble", "wifi")):
        row: Record = {"value": radio}
        for i, side in enumerate(edge_vs_cloud.SIDES):
            for measure in edge_vs_cloud.MEASURES:
                row[f"{side}_{measure}"] = _fig(10.0 ** (k + 1) * (i + 1))
        rows.append(row)
    return rows


def _sweep_rows(values: tuple[int, ...]) -> list[Record]:
    return [{"value": v, "train_acc": _fig(0.98, 0.002), "test_acc": _fig(0.97, 0.004),
             "halo_needed": _fig(1000.0 * v), "halo_transmitted": _fig(900.0 * v),
             "halo_formula": _fig(1100.0 * v), "wave_bytes": _fig(2e6 * v)}
            for v in values]


# Each experiment's plot on made-up rows: (module whose save_png draws, the call).
PLOTS: dict[str, tuple[Any, Callable[[Path], Any]]] = {
    "failures": (faults, lambda out: faults.plot(out, "failures", _fault_rows())),
    "loss": (faults, lambda out: faults.plot(out, "loss", _fault_rows())),
    "meshes": (meshes, lambda out: meshes.plot(out, _mesh_rows())),
    "compression": (compression, lambda out: compression.plot(out, _compression_rows())),
    "delta": (delta, lambda out: delta.plot(out, _delta_rows())),
    "edge-vs-cloud": (edge_vs_cloud, lambda out: edge_vs_cloud.plot(out, _edge_rows())),
    "filter-size": (sweep, lambda out: sweep.plot(
        out, "filter-size", _sweep_rows((3, 5)),
        [{"value": 3, "train_acc": 0.944, "test_acc": 0.928}])),
    "grid": (sweep, lambda out: sweep.plot(out, "grid", _sweep_rows((5, 10, 20)), [])),
}


def _saved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> list[Any]:
    """The figures experiment `name`'s plot saves, after saving them (laid out)."""
    module, draw = PLOTS[name]
    saved = saved_figures(monkeypatch, module)
    draw(tmp_path)
    assert saved
    return saved


def _renderer(figure: Any) -> Any:
    """Draw `figure` (closed by save_png) on a fresh Agg canvas: its laid-out places."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas.get_renderer()


def _panels(figure: Any) -> list[Any]:
    """The axes that show data (a twin axis too)."""
    return [axes for axes in figure.axes if axes.has_data()]


@pytest.mark.parametrize("name", list(PLOTS))
def test_every_panel_of_an_experiments_plot_labels_its_y_axis(
        monkeypatch, tmp_path, name) -> None:
    for figure in _saved(monkeypatch, tmp_path, name):
        panels = _panels(figure)
        assert panels
        for axes in panels:
            assert axes.get_ylabel().strip(), (name, axes.get_title())


@pytest.mark.parametrize("name", list(PLOTS))
def test_an_experiments_legend_sits_below_the_panels_clear_of_the_data(
        monkeypatch, tmp_path, name) -> None:
    for figure in _saved(monkeypatch, tmp_path, name):
        assert all(axes.get_legend() is None for axes in figure.axes)
        renderer = _renderer(figure)
        whole = figure.bbox
        for legend in figure.legends:
            box = legend.get_window_extent(renderer)
            assert whole.x0 <= box.x0 and box.x1 <= whole.x1 + 1
            assert whole.y0 <= box.y0 and box.y1 <= whole.y1 + 1
            for axes in figure.axes:
                assert not box.overlaps(axes.get_window_extent(renderer)), name
            floor = min_font_pt(figure)
            assert all(t.get_fontsize() >= floor - 1e-9 for t in legend.get_texts())


def test_the_meshes_plot_ticks_whole_numbers_of_meshes(monkeypatch, tmp_path) -> None:
    (figure,) = _saved(monkeypatch, tmp_path, "meshes")
    _renderer(figure)
    for axes in figure.axes:
        ticks = [t for t in axes.get_xticks() if 1 <= t <= 8]
        assert ticks == [1, 2, 4, 8]
        labels = [label.get_text() for label in axes.get_xticklabels()]
        assert labels == ["1", "2", "4", "8"]
