"""`meshdl report` takes every run directory the CLI writes (issue 33, item 5): a
`simulate infer` one (sim.json, no metrics.json), a `simulate train` one with the
cloud-heavy baseline beside the mesh (the answer to "mesh or cloud?") and its dead
cells, a data-parallel run's, and a run that has not finished."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from meshdl.report.baseline import strongest
from tests.test_cli_simulate import _meshdl

SMALL = ("--epochs", "1", "--batch", "60", "--hidden", "8")
DEAD = ("--dead", "0.1", "--recovery", "best-effort")


def _report(run: Path) -> str:
    """`meshdl report RUN`'s page as text, its tags stripped."""
    code, _, err = _meshdl("report", run)
    assert code == 0, err
    page = (run / "report.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.fixture(scope="module")
def runs(small_data_file, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    commands = {
        "infer": ("simulate", "infer", *DEAD),
        "simulate": ("simulate", "train", *SMALL, *DEAD),
        "meshes": ("train", *SMALL, "--meshes", "2")}
    for name, command in commands.items():
        code, _, err = _meshdl(*command, "--data", small_data_file, "--out", root / name)
        assert code == 0, err
    return {name: root / name for name in commands}


def _figures(page: str, label: str, count: int) -> list[float]:
    """The first `count` numbers after `label` on the page."""
    after = page[page.index(label) + len(label):]
    return [float(n.replace(",", "")) for n in re.findall(r"-?[\d,]*\.?\d+", after)[:count]]


def test_report_takes_a_simulate_infer_directory(runs) -> None:
    assert not (runs["infer"] / "metrics.json").exists()
    page = _report(runs["infer"])
    sim = json.loads((runs["infer"] / "sim.json").read_text())
    assert "Under simulated time" in page
    assert "infer, 1 wave" in page
    assert _figures(page, "makespan, total (s)", 1) == [
        pytest.approx(sim["makespan_s"]["total"], rel=1e-3)]


def test_a_simulate_train_report_sets_the_mesh_beside_the_cloud_heavy_baseline(runs) -> None:
    page = _report(runs["simulate"])
    sim = json.loads((runs["simulate"] / "sim.json").read_text())
    assert "In the mesh, or in the cloud?" in page
    for variant in ("aggregated", "unaggregated"):
        cloud = sim["baseline"][f"cloud_heavy_{variant}"]
        assert _figures(page, f"cloud-heavy, {variant}", 2) == pytest.approx(
            [cloud["makespan_s"], cloud["energy_j"]["total"]], rel=1e-3)
    # The answer in words: how many times the strongest cloud-heavy variant's figures
    # the mesh takes (tests/test_report_baseline.py: which one that is).
    best = strongest(sim["baseline"])
    assert best is not None
    assert f"the strongest cloud-heavy baseline, {best.variant}" in " ".join(page.split())
    cloud = sim["baseline"][f"cloud_heavy_{best.variant}"]
    ratio = sim["makespan_s"]["total"] / cloud["makespan_s"]
    assert _figures(page, "The mesh takes", 1) == [pytest.approx(ratio, rel=1e-2)]


def test_a_simulate_train_report_names_the_dead_cells(runs) -> None:
    page = " ".join(_report(runs["simulate"]).split())
    faults = json.loads((runs["simulate"] / "sim.json").read_text())["faults"]
    assert faults["down_cells"]
    assert f"dead cells (down at the end) {', '.join(faults['down_cells'])}" in page
    found = ", ".join(faults["dead_cells"]) or "none"
    assert f"found and planned around {found}" in page


def test_a_data_parallel_run_report_shows_its_meshes(runs) -> None:
    page = " ".join(_report(runs["meshes"]).split())
    parallel = json.loads((runs["meshes"] / "metrics.json").read_text())["parallel"]
    assert "Several meshes" in page
    assert f"meshes {parallel['meshes']}" in page
    assert f"sync {parallel['sync']}" in page


def test_report_takes_a_run_that_has_not_finished(runs, tmp_path) -> None:
    run = tmp_path / "stopped"
    run.mkdir()
    for name in ("config.json", "checkpoint.npz"):
        shutil.copy(runs["meshes"] / name, run / name)
    page = " ".join(_report(run).split())
    assert "not finished" in page
    assert f"--resume {run}" in page
    assert "Configuration" in page


def test_an_epoch_without_a_test_accuracy_is_left_out_of_the_curves(tmp_path) -> None:
    """A run's epochs as a parameter server may log them: figures may be missing."""
    (tmp_path / "metrics.json").write_text(json.dumps({
        "mode": "mesh", "epochs": [{"epoch": 1, "train_loss": 0.7, "train_acc": 0.5,
                                    "test_acc": None},
                                   {"epoch": 2, "train_loss": 0.6, "train_acc": 0.6}],
        "final": {"train_acc": 0.6}, "parallel": {"meshes": 2, "sync": "bsp",
                                                  "staleness": {"0": 4}}}))
    page = " ".join(_report(tmp_path).split())
    assert "Training curves" in page and "meshes 2" in page


def test_report_takes_an_experiment_stopped_before_its_summary(tmp_path) -> None:
    (tmp_path / "journal.jsonl").write_text('{"trial": 1}\n{"trial": 2}\n{"tri')
    page = " ".join(_report(tmp_path).split())
    assert "2 trials are in its journal.jsonl" in page
    assert "same --out" in page
