"""`meshdl simulate`'s console says what each figure measures and writes it with the
report's formatter (issue 47 item 5), compares with the strongest cloud-heavy variant as
the report does (its main baseline in sim.json), and records whether its model was
trained, for the report's warning (item 4). Tiny runs: a 5 x 6 grid, one epoch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshdl.report.baseline import strongest
from tests.test_cli_simulate import _meshdl

GRID = ("--rows", "5", "--cols", "6")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    run = tmp_path_factory.mktemp("console") / "train"
    code, _, err = _meshdl("simulate", "train", *GRID, "--epochs", "1", "--out", run)
    assert code == 0, err
    return run, " ".join(err.split())


def test_simulate_train_names_the_last_wave_apart_from_the_mean_training_wave(
        trained) -> None:
    run, err = trained
    span = json.loads((run / "sim.json").read_text())["makespan_s"]
    # "forward wave 438.9 s" beside "264.7 s a wave" said nothing of what each was.
    assert re.search(r"the run's last wave \(infer, forward only\): its forward pass "
                     r"[\d,.]+ s, the whole wave [\d,.]+ s", err)
    assert "forward wave" not in err
    mean = span["per_wave_mean"]
    assert f"{_four(mean)} s a train wave on average (its forward pass " \
           f"{_four(span['forward_mean'])} s)" in err


def _four(value: float) -> str:
    from meshdl.report.numbers import figure

    return figure(value)


def test_simulate_train_compares_with_the_strongest_cloud_variant(trained) -> None:
    run, err = trained
    baseline = json.loads((run / "sim.json").read_text())["baseline"]
    best = strongest(baseline)
    assert best is not None and best.variant == "unaggregated"  # training: it pipelines
    assert baseline["cloud_heavy"] == baseline["cloud_heavy_unaggregated"]
    assert "cloud-heavy, strongest of 2 (unaggregated):" in err


@pytest.mark.parametrize("with_model", [False, True])
def test_simulate_infer_and_live_record_whether_the_model_was_trained(
        trained, tmp_path, with_model) -> None:
    model = ("--model", trained[0] / "model.npz") if with_model else ()
    for command in (("infer",), ("live", "--slots", "2", "--timed-slots", "1")):
        run = tmp_path / command[0]
        code, _, err = _meshdl("simulate", *command, *GRID, *model, "--out", run)
        assert code == 0, err
        record = json.loads((run / "sim.json").read_text())["model"]
        assert record["trained"] is with_model
        assert (record["file"] is not None) is with_model


def test_evaluate_keeps_its_title_on_one_line(trained, tmp_path) -> None:
    data = tmp_path / "d.npz"
    code, _, err = _meshdl("data", "generate", *GRID, "--train", "40", "--test", "30",
                           "--out", data)
    assert code == 0, err
    code, out, err = _meshdl("evaluate", trained[0] / "model.npz", data)
    assert code == 0, err
    # A confusion matrix narrower than its title wrapped it: "(561" / "samples)".
    assert re.search(r"test split: accuracy [\d.]+ \(30 samples\)", out)
