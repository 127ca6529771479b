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

from meshdl.experiments import compression, crossover, delta, edge_vs_cloud, faults, meshes, sweep
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


def _crossover_rows(radios: tuple[str, ...]) -> list[Record]:
    """Made-up crossover points: each MAC's ratio falling with the nodes, its floor
    a fifth below it."""
    rows = []
    for radio in radios:
        for k, (r, c) in enumerate(((17, 25), (30, 40), (100, 100))):
            row: Record = {"value": [r, c, radio], "nodes": _fig(float(r * c))}
            for m, mac in enumerate(crossover.MACS):
                ratio = 1.0 - 0.1 * m - 0.2 * k
                row[f"{mac}_ratio"] = _fig(ratio)
                row[f"{mac}_floor_ratio"] = _fig(0.8 * ratio)
            rows.append(row)
    return rows


# Each experiment's plot on made-up rows: (module whose save_png draws, the call).
PLOTS: dict[str, tuple[Any, Callable[[Path], Any]]] = {
    "failures": (faults, lambda out: faults.plot(out, "failures", _fault_rows())),
    "loss": (faults, lambda out: faults.plot(out, "loss", _fault_rows())),
    "failures-compare": (faults, lambda out: faults.compare_plot(
        out / "heads.png", "failures", [faults.Sweep("pool 2", _fault_rows()),
                                        faults.Sweep("pool global", _fault_rows())])),
    "meshes": (meshes, lambda out: meshes.plot(out, _mesh_rows())),
    "compression": (compression, lambda out: compression.plot(out, _compression_rows())),
    "delta": (delta, lambda out: delta.plot(out, _delta_rows())),
    "edge-vs-cloud": (edge_vs_cloud, lambda out: edge_vs_cloud.plot(out, _edge_rows())),
    "filter-size": (sweep, lambda out: sweep.plot(
        out, "filter-size", _sweep_rows((3, 5)),
        [{"value": 3, "train_acc": 0.944, "test_acc": 0.928}])),
    "grid": (sweep, lambda out: sweep.plot(out, "grid", _sweep_rows((5, 10, 20)), [])),
    "crossover": (crossover, lambda out: crossover.plot(
        out, _crossover_rows(("802.15.4", "ble")))),
    "crossover-one-radio": (crossover, lambda out: crossover.plot(
        out, _crossover_rows(("802.15.4",)))),
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


def _run_dir(path: Path, pool: Any, rows: list[Record], experiment: str = "failures") -> Path:
    """A finished sweep's run directory as `meshdl experiment compare` reads it."""
    import json

    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "experiment": experiment, "seeds": [0, 1, 2], "values": [r["value"] for r in rows],
        "settings": {"model": {"pool": pool}, "train": {"failout": 0.02}}}))
    (path / "summary.json").write_text(json.dumps({"experiment": experiment, "rows": rows}))
    return path


def test_compare_draws_each_runs_policies_in_its_own_colour_from_its_exact_run(
        monkeypatch, tmp_path) -> None:
    from typer.testing import CliRunner

    from meshdl.cli.experiment import app

    saved = saved_figures(monkeypatch, faults)
    seed_rows = _fault_rows()
    global_rows = [{**row, "test_acc": _fig(row["test_acc"]["mean"] - 0.01, 0.01)}
                   for row in _fault_rows()]
    runs = [_run_dir(tmp_path / "seed", 2, seed_rows),
            _run_dir(tmp_path / "global", "global", global_rows)]
    result = CliRunner().invoke(app, ["compare", *map(str, runs), "--out",
                                      str(tmp_path / "heads.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "heads.png").stat().st_size > 0
    (axis,) = _panels(saved[0])
    lines = {bars.get_label(): bars.lines[0] for bars in axis.containers}  # data lines
    assert set(lines) == {f"pool {pool}, failout 0.02, {policy}" for pool in (2, "global")
                          for policy in ("zero", "last", "neighbours", "reliable")}
    seed_zero, global_zero = lines["pool 2, failout 0.02, zero"], \
        lines["pool global, failout 0.02, zero"]
    assert list(seed_zero.get_xdata()) == [0.0, 10.0, 20.0, 30.0]  # from the exact run
    assert global_zero.get_ydata()[0] == pytest.approx(94.0)
    assert seed_zero.get_color() != global_zero.get_color()
    assert seed_zero.get_linestyle() == global_zero.get_linestyle()  # policy: the style


@pytest.mark.parametrize(("args", "says", "usage"), [
    (["one"], "at least two run directories", True),
    (["seed", "global", "--label", "only one"], "give one per run or none", True),
    (["seed", "loss"], "runs of one of", True),
    # A missing run directory is a missing file: exit 1, not a wrong request (README).
    (["seed", "nothing"], "not a finished experiment's run directory", False),
    (["seed", "deep"], "not a finished experiment's run directory", False),  # corrupt
])
def test_compare_refuses_what_it_cannot_overlay_in_one_line(tmp_path, args, says,
                                                            usage) -> None:
    from typer.testing import CliRunner

    from meshdl.cli.experiment import app
    from meshdl.errors import MeshdlError, UsageError

    _run_dir(tmp_path / "seed", 2, _fault_rows())
    _run_dir(tmp_path / "global", "global", _fault_rows())
    _run_dir(tmp_path / "loss", 2, _fault_rows(), experiment="loss")
    (tmp_path / "one").mkdir()
    _run_dir(tmp_path / "deep", 2, _fault_rows())
    (tmp_path / "deep" / "summary.json").write_text("[" * 200_000)  # nested past the parser
    named = [str(tmp_path / a) if not a.startswith("-") and a != "only one" else a
             for a in args]
    result = CliRunner().invoke(app, ["compare", *named, "--out", str(tmp_path / "c.png")])
    assert isinstance(result.exception, MeshdlError), result.output
    assert isinstance(result.exception, UsageError) == usage
    assert says in str(result.exception)


def _edge_position_rows() -> list[Record]:
    """edge-position's cost rows: four cells, a training wave 51.5 to 54 MB (5 % apart),
    needed equal to transmitted (the mesh sends no halo value it need not)."""
    return [{"value": cell, "halo_needed": _fig(4000.0 + 100 * i),
             "halo_transmitted": _fig(4000.0 + 100 * i), "halo_formula": _fig(5600.0),
             "wave_bytes": _fig(mb * 1e6)}
            for i, (cell, mb) in enumerate((([0, 0], 54.0), ([0, 12], 51.5),
                                             ([8, 0], 52.0), ([16, 24], 54.0)))]


def test_the_edge_position_cost_plot_draws_its_cells_as_bars_from_zero(
        monkeypatch, tmp_path) -> None:
    saved = saved_figures(monkeypatch, sweep)
    sweep.plot(tmp_path, "edge-position", _edge_position_rows(), [])
    (cost,) = saved
    panels = _panels(cost)
    assert len(panels) == 2  # halo values, and a wave's MB: no twin axis cut at 51.5 MB
    for axes in panels:
        bars = [p for container in axes.containers if hasattr(container, "patches")
                for p in container.patches]
        assert bars, "categories are bars"
        assert axes.get_ylim()[0] == 0  # from zero: 5 % looks like 5 %
        # No line joins one cell to the next (error bars are segments of one cell).
        assert all(len(line.get_xdata()) < 2 or line.get_linestyle() == "None"
                   for line in axes.get_lines())
        assert [t.get_text() for t in axes.get_xticklabels()] == \
            ["r0c0", "r0c12", "r8c0", "r16c24"]  # as the table names them
    _renderer(cost)
    ticks = [t.get_text() for t in panels[0].get_yticklabels()]
    assert "5,000" in ticks and not any(".0" in t for t in ticks)  # a place, not a figure
    halo = panels[0]
    # needed, transmitted and the formula: each its own bars, side by side, none hidden.
    series = [c for c in halo.containers if hasattr(c, "patches")]
    assert len(series) == 3
    xs = [{round(p.get_x(), 6) for p in c.patches} for c in series]
    assert not set.intersection(*xs)
    labels = [t.get_text() for t in cost.legends[0].texts]
    assert labels == ["needed", "transmitted", "(k²-1)·m·n·c_in"]


def test_the_crossover_plot_draws_each_macs_floor_dashed_beneath_its_ratio(
        monkeypatch, tmp_path) -> None:
    rows = _crossover_rows(("802.15.4",))
    (figure,) = _saved(monkeypatch, tmp_path, "crossover-one-radio")
    (panel,) = _panels(figure)
    solid = [line for line in panel.get_lines() if line.get_linestyle() == "-"]
    dashed = [line for line in panel.get_lines() if line.get_linestyle() == "--"]
    assert len(solid) == len(dashed) == len(crossover.MACS)
    for mac, ratio, floor in zip(crossover.MACS, solid, dashed, strict=True):
        assert floor.get_color() == ratio.get_color()
        assert list(floor.get_ydata()) == [row[f"{mac}_floor_ratio"]["mean"] for row in rows]
        assert all(f < r for f, r in zip(floor.get_ydata(), ratio.get_ydata(), strict=True))
    labels = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert "floor: its MAC with no traffic" in labels
