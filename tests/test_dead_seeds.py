"""One seed, the same dead cells in every command (issue 45): `evaluate --dead` and
`simulate infer --dead` draw them by `sim.faults.dead.dead_cells`, evaluate over several
fault seeds gives the mean and spread, and simulate infer says its accuracy beside the
central one with the same cells left out, and which dead cells it found and when."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import ModelConfig
from meshdl.data.datasets import load_dataset
from meshdl.model.cnn import CNN
from meshdl.protocol.topics import name_of
from meshdl.sim.faults.dead import cell_numbers, dead_cells, found_line
from tests.test_cli_simulate import _meshdl


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh global-pooling model for the 6 x 8 test data (the draw is what is
    tested, not the weights)."""
    path = tmp_path_factory.mktemp("model") / "model.npz"
    CNN(ModelConfig(rows=6, cols=8, pool="global", filters=4, hidden=8), seed=1).save(path)
    return path


def _evaluate(model: Path, data: Path, *extra: str) -> dict:
    code, out, err = _meshdl("evaluate", model, data, "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def _accuracy(model: Path, data: Path, down: list[str], samples: slice = slice(None)) -> float:
    """The model's accuracy on the test split with the cells named `down` left out."""
    test = load_dataset(data)
    cells = [(int(r), int(c)) for r, c in (name[1:].split("c") for name in down)]
    predicted = CNN.load(model).predict(test.X_test[samples], cell_numbers(cells, 8))
    return float(np.mean(predicted == test.y_test[samples]))


def test_evaluate_and_simulate_infer_leave_out_the_same_cells_for_the_same_seed(
        small_data_file, model_file, tmp_path) -> None:
    """Before, evaluate drew its cells from numpy's failout stream and simulate from
    DeadCells.pick: seed 5 named different cells in the two."""
    code, _, err = _meshdl("simulate", "infer", "--model", model_file, "--data",
                           small_data_file, "--dead", "0.25", "--fault-seed", "5",
                           "--recovery", "best-effort", "--batch", "4", "--out",
                           tmp_path / "run")
    assert code == 0, err
    down = json.loads((tmp_path / "run" / "sim.json").read_text())["faults"]["down_cells"]
    assert len(down) == 12  # a quarter of 6 x 8
    evaluated = _evaluate(model_file, small_data_file, "--dead", "0.25", "--dead-seed", "5")
    assert evaluated.get("down_cells") == down and evaluated["dead_cells"] == 12
    assert evaluated["accuracy"] == _accuracy(model_file, small_data_file, down)
    # --fault-seed, simulate's name, is the same draw as --dead-seed, the older one
    assert _evaluate(model_file, small_data_file, "--dead", "0.25",
                     "--fault-seed", "5")["down_cells"] == down


def test_evaluate_over_several_fault_seeds_reports_their_mean_and_spread(
        small_data_file, model_file) -> None:
    report = _evaluate(model_file, small_data_file, "--dead", "0.3", "--fault-seeds", "2-4,7")
    assert report["fault_seeds"] == [2, 3, 4, 7]
    runs = report["per_seed"]
    for seed, run in zip((2, 3, 4, 7), runs, strict=True):
        assert run["down_cells"] == [name_of(c) for c in sorted(dead_cells(6, 8, 0.3, seed))]
        assert run["accuracy"] == _accuracy(model_file, small_data_file, run["down_cells"])
    accuracy = np.array([run["accuracy"] for run in runs])
    assert report["accuracy_mean"] == pytest.approx(accuracy.mean())
    assert report["accuracy"] == pytest.approx(accuracy.mean())  # every draw's predictions
    assert report["accuracy_std"] == pytest.approx(accuracy.std(ddof=1))
    assert (report["accuracy_min"], report["accuracy_max"]) == (accuracy.min(), accuracy.max())
    assert report["samples"] == 4 * 40


def test_evaluate_dead_without_a_seed_takes_ten_draws_and_says_so(
        small_data_file, model_file) -> None:
    assert _evaluate(model_file, small_data_file, "--dead", "0.2")["fault_seeds"] == \
        list(range(10))
    code, out, err = _meshdl("evaluate", model_file, small_data_file, "--dead", "0.2")
    assert code == 0, err
    said = " ".join(out.split())
    assert "10 draws (fault seeds 0-9): accuracy mean" in said and "std" in said


@pytest.mark.parametrize("seeds", [["--fault-seeds", "3-1"], ["--fault-seeds", "a"],
                                   ["--fault-seeds", "0-2", "--fault-seed", "1"]])
def test_evaluate_refuses_fault_seeds_it_cannot_read_in_one_line(
        small_data_file, model_file, seeds) -> None:
    code, out, err = _meshdl("evaluate", model_file, small_data_file, "--dead", "0.2", *seeds)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1


def test_simulate_infer_says_its_accuracy_beside_the_central_one_and_the_cells_it_found(
        small_data_file, model_file, tmp_path) -> None:
    code, _, err = _meshdl("simulate", "infer", "--model", model_file, "--data",
                           small_data_file, "--dead", "0.25", "--fault-seed", "1",
                           "--recovery", "best-effort", "--batch", "4", "--waves", "3",
                           "--out", tmp_path / "run")
    assert code == 0, err
    sim = json.loads((tmp_path / "run" / "sim.json").read_text())
    down = sim["faults"]["down_cells"]
    central = _accuracy(model_file, small_data_file, down, slice(0, 12))
    assert sim["central_accuracy"] == central
    said = " ".join(err.split())
    assert (f"accuracy {sim['accuracy']:.4f} over 12 samples; the model run centrally "
            f"with the same 12 cells left out: {central:.4f}") in said
    found = sim["dead_found_at_wave"]
    assert set(found) == set(sim["faults"]["dead_cells"])
    assert all(1 <= wave <= 3 for wave in found.values())
    assert f"dead cells: 12 down, {len(set(found) & set(down))} found" in said


def test_the_found_line_names_each_found_cell_with_its_wave_and_counts_the_rest() -> None:
    line = found_line({(0, 1), (2, 3), (4, 5)}, {(2, 3): 2, (0, 1): 1, (1, 1): 3})
    assert line == ("dead cells: 3 down, 2 found (r0c1 at wave 1, r2c3 at wave 2), 1 not "
                    "found by the end; planned around though up: r1c1")
    assert found_line({(0, 1)}, {}) == "dead cells: 1 down, 0 found, 1 not found by the end"


def test_simulate_infer_with_every_cell_alive_says_its_accuracy_alone(
        small_data_file, model_file, tmp_path) -> None:
    code, _, err = _meshdl("simulate", "infer", "--model", model_file, "--data",
                           small_data_file, "--batch", "4", "--out", tmp_path / "run")
    assert code == 0, err
    sim = json.loads((tmp_path / "run" / "sim.json").read_text())
    said = " ".join(err.split())
    assert f"accuracy {sim['accuracy']:.4f} over 4 samples" in said
    assert "centrally" not in said and "dead cells" not in said
    assert sim["central_accuracy"] == sim["accuracy"]  # nothing lost, nothing left out
