"""The warnings at the top of a report (issue 47 item 4): a run collapsed to one class,
an experiment's trials that did, a model never trained, a console line that compared the
mesh with the weaker cloud-heavy variant. Each is a warning before the first section
when it applies, and absent when it does not."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from meshdl.report.page import build_report
from tests.test_report_baseline import _cloud, _sim_run


def _warnings(run: Path) -> list[str]:
    """The warnings of `run`'s page, each as text, asserted to sit above its first
    section."""
    page = build_report(run)
    found = re.findall(r'<p class="warning" role="alert">(.*?)</p>', page)
    if found:
        assert page.index('class="warning"') < page.index("<h2>")
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", w)).split()) for w in found]


def _train_run(tmp_path: Path, collapsed: bool) -> Path:
    final = {"train_acc": 0.81, "test_acc": 0.8, "single_class": collapsed,
             "predicted_per_class": {"train": [0, 2400] if collapsed else [500, 1900],
                                     "test": [0, 561] if collapsed else [100, 461]}}
    (tmp_path / "metrics.json").write_text(json.dumps({"final": final, "epochs": []}))
    return tmp_path


@pytest.mark.parametrize("collapsed", [True, False])
def test_a_run_collapsed_to_one_class_is_warned_at_the_top(tmp_path, collapsed) -> None:
    said = _warnings(_train_run(tmp_path, collapsed))
    if collapsed:
        assert len(said) == 1 and "collapsed to one class" in said[0]
        assert "predicts class 1 for every sample" in said[0]
    else:
        assert said == []


def test_an_experiments_collapsed_trials_are_warned_by_value_and_seed(tmp_path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(
        {"experiment": "filters", "seeds": 2, "rows": []}))
    records = [{"value": h, "seed": s, "test_acc": 0.8, "single_class": h == 1 and s == 1}
               for h in (1, 5) for s in (0, 1)]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (said,) = _warnings(tmp_path)
    assert said.startswith("Warning: 1 of 4 trials collapsed to one class")
    assert "1 (seed 1)" in said
    records[1]["single_class"] = False
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _warnings(tmp_path) == []


@pytest.mark.parametrize("trained", [False, True, None])
def test_a_model_never_trained_is_warned_at_the_top(tmp_path, trained) -> None:
    run = _sim_run(tmp_path, aggregated=_cloud("aggregated", 1.0, 2.0, 0.1, 50))
    sim = json.loads((run / "sim.json").read_text())
    if trained is not None:  # None: a sim.json of before it was recorded
        sim["model"] = {"trained": trained, "file": "runs/k3/model.npz" if trained else None}
    (run / "sim.json").write_text(json.dumps(sim))
    said = _warnings(run)
    assert bool(said) is (trained is False)
    if said:
        assert "never trained" in said[0] and "--model" in said[0]


def test_a_console_that_compared_with_the_weaker_baseline_is_warned(tmp_path) -> None:
    weaker = tmp_path / "weaker"
    weaker.mkdir()
    _sim_run(weaker, aggregated=_cloud("aggregated", 15.0, 20.0, 1.0, 500),
             unaggregated=_cloud("unaggregated", 7.0, 10.0, 0.5, 400))
    (said,) = _warnings(weaker)
    assert "compared the mesh with the cloud-heavy baseline aggregated, the weaker of " \
           "the 2 variants: unaggregated is cheaper" in said
    stronger = tmp_path / "stronger"
    stronger.mkdir()
    _sim_run(stronger, aggregated=_cloud("aggregated", 1.0, 2.0, 0.1, 50),
             unaggregated=_cloud("unaggregated", 7.0, 10.0, 0.5, 400))
    assert _warnings(stronger) == []
