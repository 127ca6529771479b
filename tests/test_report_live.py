"""A `simulate live` report has the pictures its question needs (issue 47 item 1):
each node's lifetime over the grid (mesh and cloud on one colour scale), the hottest
node's joules by part, the mesh against the cloud under each MAC as bars from zero; the
grid in its table. Checked on the figure objects drawn from a real live run's sim.json
(4 x 5 nodes, 3 slots: a second)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from meshdl.report import page
from meshdl.report.live import PART_LABELS, lifetime_figure, mac_figure, parts_figure
from tests.test_cli_simulate import _meshdl

ROWS, COLS = 4, 5


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("live") / "run"
    code, _, err = _meshdl("simulate", "live", "--rows", ROWS, "--cols", COLS, "--slots", 3,
                           "--timed-slots", 2, "--out", run)
    assert code == 0, err
    return run


def _sim(run: Path) -> dict[str, Any]:
    return json.loads((run / "sim.json").read_text())


def test_a_live_run_records_each_nodes_lifetime_and_the_hottest_nodes_joules_by_part(
        live_run) -> None:
    sim = _sim(live_run)
    for side in ("mesh", "cloud"):
        nodes = sim["nodes"][side]
        assert len(nodes["years"]) == len(nodes["j_per_slot"]) == ROWS * COLS
        assert min(nodes["years"].values()) == pytest.approx(sim[side]["first_death_years"])
        parts = nodes["hottest_parts_j_per_slot"]
        assert set(parts) == set(PART_LABELS)
        assert sum(parts.values()) == pytest.approx(sim[side]["hottest_node_j_per_slot"])


def test_the_lifetime_map_shows_both_sides_on_one_scale_over_the_nodes_range(
        live_run) -> None:
    sim = _sim(live_run)
    figure = lifetime_figure(sim, ROWS, COLS, "r0c0")
    maps = [axes for axes in figure.axes if axes.images]
    assert len(maps) == 2
    years = [y for side in ("mesh", "cloud") for y in sim["nodes"][side]["years"].values()]
    for axes in maps:
        assert axes.images[0].get_clim() == (pytest.approx(min(years)),
                                             pytest.approx(max(years)))
        assert axes.images[0].get_array().shape == (ROWS, COLS)
    first = sim["mesh"]["first_cell"]
    assert f"first death {page.number(sim['mesh']['first_death_years'])} y ({first})" in \
        maps[0].get_title()


def test_the_hottest_nodes_joules_stack_by_part_to_its_joules_a_slot(live_run) -> None:
    sim = _sim(live_run)
    (axes,) = parts_figure(sim).axes
    stacks = [c for c in axes.containers if hasattr(c, "patches")]
    assert len(stacks) == len(PART_LABELS)
    for y, side in enumerate(("mesh", "cloud")):
        ends = max(bars.patches[y].get_x() + bars.patches[y].get_width() for bars in stacks)
        assert ends == pytest.approx(sim[side]["hottest_node_j_per_slot"])
    assert axes.get_xlim()[0] == 0


def test_the_mesh_and_the_cloud_are_bars_from_zero_under_each_mac(live_run) -> None:
    sim = _sim(live_run)
    (axes,) = mac_figure(sim).axes
    bars = [p for c in axes.containers if hasattr(c, "patches") for p in c.patches]
    assert len(bars) == 2 * len(sim["macs"])
    assert axes.get_ylim()[0] == 0
    heights = sorted(round(p.get_height(), 9) for p in bars)
    assert heights == sorted(round(sides[side]["first_death_years"], 9)
                             for sides in sim["macs"].values() for side in ("mesh", "cloud"))
    ticks = [t.get_text() for t in axes.get_xticklabels()]
    assert [t for t in ticks if "the run's" in t] == [f"{sim['mac']}\n(the run's)"]


def test_a_live_report_shows_its_pictures_and_its_grid(live_run) -> None:
    text = page.build_report(live_run)
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', text)) == 3
    plain = html.unescape(re.sub(r"<[^>]+>", " ", text))
    assert f"grid {ROWS} x {COLS} nodes" in " ".join(plain.split())


def test_the_live_console_line_writes_both_sides_to_the_same_digits(live_run) -> None:
    from meshdl.sim.studies.live import summary_line

    report = _sim(live_run)
    report["mesh"].update(first_death_years=2.3, bytes_per_slot=110650.0)
    report["cloud"]["first_death_years"] = 2.2186
    line = summary_line(report, live_run)
    # ".3g" wrote "2.3 y" beside "2.22 y", and a 4-digit rule 110,600 bytes.
    assert "first death 2.300 y" in line and "first death 2.219 y" in line
    assert "mesh 110,650 B/slot" in line
