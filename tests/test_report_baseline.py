"""A simulated run's report answers "in the mesh, or in the cloud?" against the strongest
cloud-heavy variant on its page, and names it (issue 43 item 11: the page compared the
mesh with the aggregated cloud while the unaggregated one beside it was cheaper)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from meshdl.report.baseline import strongest
from meshdl.report.page import build_report


def _cloud(variant: str, seconds: float, joules: float, hottest: float, sent: int
           ) -> dict[str, Any]:
    return {"variant": variant, "makespan_s": seconds, "bytes": sent,
            "energy_j": {"total": joules, "max_node": hottest}}


def _sim_run(tmp_path: Path, **variants: dict[str, Any]) -> Path:
    """A `simulate train` run directory whose sim.json has these cloud-heavy variants,
    the aggregated one as `cloud_heavy` (what `simulate train` records as its main)."""
    baseline = {"cloud_heavy": variants["aggregated"], "lossless_links": True,
                **{f"cloud_heavy_{name}": record for name, record in variants.items()}}
    sim = {"mode": "train", "waves": 10, "radio": {"name": "802.15.4"},
           "medium": "shared", "device": "cortex-m4",
           "makespan_s": {"total": 100.0, "per_wave_mean": 10.0},
           "energy_j": {"total": 50.0, "max_node": 2.0, "max_node_cell": "r0c0"},
           "bytes": {"PARAMS": 600, "REDUCE": 400}, "baseline": baseline}
    (tmp_path / "sim.json").write_text(json.dumps(sim))
    return tmp_path


def _verdict(run: Path) -> str:
    page = html.unescape(re.sub(r"<[^>]+>", " ", build_report(run)))
    return " ".join(page[page.index("Against"):].split())


def test_the_report_compares_the_mesh_with_the_cheapest_cloud_variant_and_names_it(
        tmp_path: Path) -> None:
    run = _sim_run(tmp_path, aggregated=_cloud("aggregated", 15.0, 20.0, 1.0, 500),
                   unaggregated=_cloud("unaggregated", 7.0, 10.0, 0.5, 400))
    verdict = _verdict(run)
    assert verdict.startswith("Against the strongest cloud-heavy baseline, unaggregated "
                              "(the strongest of the 2 variants below, the cheapest in time, "
                              "energy, hottest node's energy and bytes)")
    # 100 s against the unaggregated cloud's 7 s, not the aggregated one's 15 s.
    assert "The mesh takes 14.3 times the time, 5.00 times the energy, 4.00 times the " \
           "hottest node's energy, 2.50 times the bytes" in verdict
    assert "cloud-heavy, unaggregated (the strongest)" in verdict


def test_the_report_keeps_the_aggregated_cloud_where_it_is_the_cheaper(
        tmp_path: Path) -> None:
    run = _sim_run(tmp_path, aggregated=_cloud("aggregated", 1.0, 25.0, 0.06, 56_100),
                   unaggregated=_cloud("unaggregated", 9.2, 220.0, 0.52, 464_100))
    assert _verdict(run).startswith("Against the strongest cloud-heavy baseline, aggregated")


def test_the_strongest_variant_is_the_cheapest_in_the_most_figures() -> None:
    # Faster but dearer in energy, the hottest node and bytes: not the strongest.
    baseline = {"cloud_heavy_aggregated": _cloud("aggregated", 20.0, 10.0, 0.5, 100),
                "cloud_heavy_unaggregated": _cloud("unaggregated", 5.0, 30.0, 1.0, 900)}
    best = strongest(baseline)
    assert best is not None
    assert (best.variant, best.cheapest_in, best.of) == (
        "aggregated", ("energy", "hottest node's energy", "bytes"), 2)


def test_a_tie_in_figures_goes_to_the_faster_variant() -> None:
    baseline = {"cloud_heavy_aggregated": _cloud("aggregated", 20.0, 10.0, 1.0, 100),
                "cloud_heavy_unaggregated": _cloud("unaggregated", 5.0, 30.0, 0.5, 900)}
    best = strongest(baseline)
    assert best is not None and best.variant == "unaggregated"


def test_a_sim_json_with_one_unnamed_baseline_still_gets_a_verdict(tmp_path: Path) -> None:
    sim = {"mode": "infer", "waves": 1, "makespan_s": {"total": 4.0},
           "energy_j": {"total": 1.0, "max_node": 0.1}, "bytes": {"PARAMS": 10},
           "baseline": {"cloud_heavy": _cloud("unaggregated", 2.0, 0.5, 0.1, 20)}}
    (tmp_path / "sim.json").write_text(json.dumps(sim))
    assert strongest(sim["baseline"]) is None
    assert _verdict(tmp_path).startswith(
        "Against the cloud-heavy baseline, unaggregated: every reading shipped to the edge")
