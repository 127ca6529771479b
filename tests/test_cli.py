"""The command line end to end: run directories, reports, and one-line errors."""

from __future__ import annotations

import csv
import itertools
import json
import socket
import warnings
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

import meshdl
from meshdl import CNN, load_run_config
from meshdl.data.datasets import load_dataset, save_dataset
from tests.helpers import assert_one_line_error


def _train(cli, data: Path, out: Path, *extra: str):
    epochs = () if "--epochs" in extra else ("--epochs", "2")
    return cli("train", "--data", data, "--out", out, *epochs, "--batch", "32",
               "--hidden", "16", "--json", *extra)


def test_train_writes_model_config_and_metrics(cli, small_data_file, tmp_path) -> None:
    code, out, err = _train(cli, small_data_file, tmp_path / "run")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics == json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics) >= {"mode", "config", "epochs", "final", "wall_s"}
    assert metrics["mode"] == "mesh"  # the default: the virtual mesh
    comm = metrics["comm"]
    assert {"classes", "halo", "total_bytes", "total_messages", "busiest_link",
            "wave_depth"} <= set(comm)
    assert set(comm["halo"]["conv1"]) == {"needed", "transmitted", "formula"}
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert set(metrics["epochs"][0]) == {"epoch", "train_loss", "train_acc", "test_acc",
                                         "skipped_steps"}
    # The epoch line's accuracy is the running one, the last line's the trained model's:
    # a newcomer saw two "train" figures that differed and nothing saying why.
    first = next(line for line in err.splitlines() if line.startswith("epoch   1"))
    assert f"train (running) {metrics['epochs'][0]['train_acc']:.4f}" in first
    done = next(line for line in err.splitlines() if " done in " in line)
    assert f"train acc {metrics['final']['train_acc']:.4f}" in done
    assert set(metrics["final"]) == {"train_acc", "test_acc", "predicted_per_class",
                                     "single_class"}
    assert sum(metrics["final"]["predicted_per_class"]["test"]) == 40
    assert metrics["config"]["model"]["rows"] == 6  # the grid follows the data file
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data_source"] == str(small_data_file)
    model = CNN.load(tmp_path / "run" / "model.npz")
    assert model.config.hidden == 16


def test_mesh_and_central_runs_give_the_same_model(cli, small_data_file, tmp_path) -> None:
    _train(cli, small_data_file, tmp_path / "mesh", "--optimizer", "sgd", "--epochs", "1")
    code, out, _ = _train(cli, small_data_file, tmp_path / "central", "--mode", "central",
                          "--optimizer", "sgd", "--epochs", "1")
    assert code == 0
    assert "comm" not in json.loads(out)
    mesh = CNN.load(tmp_path / "mesh" / "model.npz")
    central = CNN.load(tmp_path / "central" / "model.npz")
    np.testing.assert_allclose(mesh.flat, central.flat, rtol=1e-5, atol=1e-6)


def test_infer_in_the_mesh_matches_evaluate(cli, small_data_file, tmp_path) -> None:
    _train(cli, small_data_file, tmp_path / "run")
    model = tmp_path / "run" / "model.npz"
    code, out, err = cli("infer", model, small_data_file, "--json")
    assert code == 0, err
    mesh = json.loads(out)
    _, out, _ = cli("evaluate", model, small_data_file, "--json")
    assert mesh["confusion"] == json.loads(out)["confusion"]
    assert mesh["comm"]["classes"]["gather"]["messages"] > 0
    assert "reduce" not in mesh["comm"]["classes"]  # inference waves have no backward


def test_cost_reports_measured_and_formula_halo(cli) -> None:
    code, out, err = cli("cost", "--rows", "6", "--cols", "7", "--batch", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    conv1 = report["halo"]["conv1"]
    assert conv1["transmitted"] == conv1["needed"] < conv1["formula"] == 8 * 6 * 7


def test_train_warns_in_one_line_when_the_model_predicts_one_class(
        cli, small_data_file, tmp_path) -> None:
    data = load_dataset(small_data_file)
    no_anomalies = replace(data, y_train=np.zeros_like(data.y_train),
                           y_test=np.zeros_like(data.y_test))
    path = save_dataset(no_anomalies, tmp_path / "no-anomalies.npz")
    code, out, err = _train(cli, path, tmp_path / "run", "--mode", "central")
    assert code == 0, err
    assert json.loads(out)["final"]["single_class"] is True
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [line for line in err.splitlines()
                        if "predicts class 0 for every sample" in line]
    assert len(warnings) == 1
    code, out, err = _train(cli, small_data_file, tmp_path / "working", "--mode", "central",
                            "--epochs", "20")
    assert json.loads(out)["final"]["single_class"] is False
    assert "warning:" not in err


def test_train_is_deterministic_for_a_seed(cli, small_data_file, tmp_path) -> None:
    _train(cli, small_data_file, tmp_path / "a", "--seed", "4")
    _train(cli, small_data_file, tmp_path / "b", "--seed", "4")
    a = CNN.load(tmp_path / "a" / "model.npz")
    b = CNN.load(tmp_path / "b" / "model.npz")
    np.testing.assert_array_equal(a.flat, b.flat)


def test_train_without_out_creates_a_timestamped_run_dir(cli, small_data_file, tmp_path,
                                                         monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("train", "--data", small_data_file, "--epochs", "1", "--hidden", "8",
                       "--name", "smoke test")
    assert code == 0, err
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-smoke-test")
    assert (run / "model.npz").is_file()


def test_evaluate_reports_accuracy_and_confusion(cli, small_data_file, tmp_path) -> None:
    _train(cli, small_data_file, tmp_path / "run")
    code, out, err = cli("evaluate", tmp_path / "run" / "model.npz", small_data_file, "--json")
    assert code == 0, err
    report = json.loads(out)
    data = load_dataset(small_data_file)
    assert report["samples"] == len(data.y_test)
    assert np.sum(report["confusion"]) == len(data.y_test)
    predicted = CNN.load(tmp_path / "run" / "model.npz").predict(data.X_test)
    assert report["accuracy"] == pytest.approx(np.mean(predicted == data.y_test))


def test_evaluate_prints_a_table_without_json(cli, small_data_file, tmp_path) -> None:
    _train(cli, small_data_file, tmp_path / "run")
    code, out, _ = cli("evaluate", tmp_path / "run" / "model.npz", small_data_file)
    assert code == 0
    assert "accuracy" in out


# --------------------------------------------------------------------------- bad input

def test_missing_data_file_isassert_one_line_error(cli, tmp_path) -> None:
    code, _, err = cli("train", "--data", tmp_path / "absent.npz")
    assert_one_line_error(code, err, 1, "absent.npz")


def test_corrupt_data_file_isassert_one_line_error(cli, tmp_path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 this is not a zip archive")
    code, _, err = cli("train", "--data", bad)
    assert_one_line_error(code, err, 1, "bad.npz")


def test_nan_readings_are_refused(cli, small_data_file, tmp_path) -> None:
    with np.load(small_data_file) as npz:
        arrays = dict(npz)
    arrays["X_train"][3, 2, 2] = np.nan
    bad = tmp_path / "nan.npz"
    np.savez(bad, **arrays)
    code, _, err = cli("train", "--data", bad)
    assert_one_line_error(code, err, 1, "NaN")


def test_wrong_shape_input_to_model_is_refused() -> None:
    from meshdl import ModelConfig
    from meshdl.errors import UsageError

    model = CNN(ModelConfig(rows=4, cols=4, hidden=4))
    with pytest.raises(UsageError, match="shape"):
        model.forward(np.zeros((2, 5, 4), np.float32))
    with pytest.raises(UsageError, match="NaN"):
        model.forward(np.full((2, 4, 4), np.nan, np.float32))


def test_impossible_config_is_usage_error_naming_the_field(cli, small_data_file) -> None:
    code, _, err = cli("train", "--data", small_data_file, "--kernel", "30")
    assert_one_line_error(code, err, 2, "kernel")
    code, _, err = cli("train", "--data", small_data_file, "--lr", "-1")
    assert_one_line_error(code, err, 2, "train.lr")


def test_mistyped_flag_is_one_line_naming_the_likely_option(cli) -> None:
    code, _, err = cli("train", "--epoch", "3")
    assert_one_line_error(code, err, 2, "--epoch", "--epochs", "meshdl train --help")


def test_what_the_user_typed_is_shown_as_typed_never_as_markup(cli) -> None:
    code, _, err = cli("train", "--x[bold]y")
    assert_one_line_error(code, err, 2, "--x[bold]y")
    code, _, err = cli("[/b]")
    assert_one_line_error(code, err, 2, "[/b]")


def test_missing_required_option_is_one_line(cli) -> None:
    code, _, err = cli("nodes", "run")
    assert_one_line_error(code, err, 2, "--cells")


def test_missing_model_file_isassert_one_line_error(cli, small_data_file, tmp_path) -> None:
    code, _, err = cli("evaluate", tmp_path / "none.npz", small_data_file)
    assert_one_line_error(code, err, 1, "none.npz")


def test_corrupt_model_file_isassert_one_line_error(cli, small_data_file, tmp_path) -> None:
    bad = tmp_path / "model.npz"
    np.savez(bad, **{"conv1.weight": np.zeros(3)})
    code, _, err = cli("evaluate", bad, small_data_file)
    assert_one_line_error(code, err, 1, "config")


def test_model_and_data_grids_must_match(cli, small_data_file, tmp_path) -> None:
    CNN(__import__("meshdl").ModelConfig(rows=3, cols=3, hidden=4)).save(tmp_path / "m.npz")
    code, _, err = cli("evaluate", tmp_path / "m.npz", small_data_file)
    assert_one_line_error(code, err, 2, "grid")


def test_debug_flag_shows_the_traceback(cli, tmp_path) -> None:
    with pytest.raises(Exception, match="absent"):
        cli("--debug", "train", "--data", tmp_path / "absent.npz")


def test_bench_mesh_reports_both_modes_and_their_ratio(cli, tmp_path) -> None:
    config = tmp_path / "small.toml"
    config.write_text("[model]\nrows = 4\ncols = 5\nhidden = 8\n"
                      "[data]\ntrain = 40\ntest = 10\n[train]\nbatch = 20\n")
    code, out, err = cli("bench", "mesh", "--config", config, "--epochs", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["grid"] == [4, 5] and result["epochs"] == 2
    mesh, central = result["mesh"], result["central"]
    assert mesh["test_acc"] == pytest.approx(central["test_acc"])  # the same model
    assert mesh["waves"] == 2 * (2 + 1) + 1  # per epoch 2 steps and a test pass; final
    assert mesh["messages_per_s"] == pytest.approx(mesh["messages"] / mesh["wall_s"])
    assert result["ratio_to_central"] == pytest.approx(mesh["wall_s"] / central["wall_s"])
    assert "machines" not in result


def test_bench_mesh_through_the_node_machines_ends_with_the_compiled_dispatchs_model(
        cli, tmp_path) -> None:
    config = tmp_path / "small.toml"
    config.write_text("[model]\nrows = 4\ncols = 5\nhidden = 8\n"
                      "[data]\ntrain = 40\ntest = 10\n[train]\nbatch = 20\n")
    code, out, err = cli("bench", "mesh", "--config", config, "--epochs", "1", "--machines",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    machines = result["machines"]
    assert machines["same_model"] is True
    assert machines["test_acc"] == result["mesh"]["test_acc"]
    assert machines["ratio_to_central"] == pytest.approx(machines["wall_s"]
                                                         / result["central"]["wall_s"])


def test_bench_kernels_reports_a_step_time(cli) -> None:
    code, out, err = cli("bench", "kernels", "--rows", "5", "--cols", "5", "--hidden", "8",
                         "--batch", "4", "--repeats", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["meshdl"]["median_ms"] > 0
    if result["torch"] is not None:
        assert result["speedup_vs_torch"] == pytest.approx(
            result["torch"]["median_ms"] / result["meshdl"]["median_ms"])


def test_bench_kernels_busy_runs_cpu_bound_processes_beside_and_stops_them() -> None:
    """`--busy N`: N spinning processes hold cores while both sides are timed, and none
    outlives the benchmark."""
    from meshdl.bench.kernels import busy_cores

    with busy_cores(2) as spinners:
        assert len(spinners) == 2
        assert all(spinner.poll() is None for spinner in spinners)  # still spinning
    assert all(spinner.poll() is not None for spinner in spinners)


def test_bench_kernels_reports_busy_cores(cli) -> None:
    code, out, err = cli("bench", "kernels", "--rows", "5", "--cols", "5", "--hidden", "8",
                         "--batch", "4", "--repeats", "3", "--busy", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["busy_cores"] == 1


def test_a_killed_run_resumes_to_the_parameters_of_an_uninterrupted_one(
        cli, small_data_file, tmp_path) -> None:
    import signal
    import subprocess
    import sys
    import time

    flags = ["--data", str(small_data_file), "--epochs", "12", "--batch", "16",
             "--hidden", "16", "--seed", "5"]
    killed = tmp_path / "killed"
    run = subprocess.Popen([sys.executable, "-m", "meshdl", "train", *flags, "--out",
                            str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120  # a hang limit, not a timing assertion
    while not (killed / "checkpoint.npz").exists() and run.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    # The first checkpoint is written: the run is in epoch 2 of 12 (~0.1 s each here).
    run.send_signal(signal.SIGKILL)
    assert run.wait(30) == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (killed / "model.npz").exists()
    code, out, err = cli("train", "--resume", killed, "--json")
    assert code == 0, err
    assert "resuming" in err and len(json.loads(out)["epochs"]) == 12
    code, _, err = cli("train", *flags, "--out", tmp_path / "whole")
    assert code == 0, err
    resumed = CNN.load(killed / "model.npz")
    np.testing.assert_array_equal(resumed.flat, CNN.load(tmp_path / "whole" / "model.npz").flat)
    code, _, err = cli("train", "--resume", killed, "--epochs", "3")
    assert code == 2 and "drop --epochs" in err


def test_a_failed_run_with_a_checkpoint_says_how_to_go_on(cli, small_data_file,
                                                           tmp_path) -> None:
    from meshdl.errors import MeshdlError
    from meshdl.training.runs import with_resume_hint

    failure = MeshdlError("wave 7 got no result")
    assert with_resume_hint(failure, tmp_path, "meshdl train") is failure  # nothing to resume
    code, _, err = _train(cli, small_data_file, tmp_path / "run", "--epochs", "1")
    assert code == 0, err
    hinted = with_resume_hint(failure, tmp_path / "run", "meshdl train")
    assert str(hinted) == (f"wave 7 got no result; the run can go on from its checkpoint "
                           f"(every update it finished): meshdl train --resume "
                           f"{tmp_path / 'run'}")


# ------------------------------------------------------- the CLI as a person meets it
def test_version_prints_the_package_version(cli) -> None:
    code, out, _ = cli("--version")
    assert code == 0
    assert out.strip() == f"meshdl {meshdl.__version__}" == f"meshdl {version('meshdl')}"


def test_a_garbage_model_file_is_refused_without_suggesting_to_unpickle_it(
        cli, small_data_file, tmp_path) -> None:
    garbage = tmp_path / "model.npz"
    garbage.write_bytes(b"this is not a model\n")
    for command in ("evaluate", "infer"):
        code, _, err = cli(command, garbage, small_data_file)
        assert_one_line_error(code, err, 1, str(garbage), "not an .npz file")
        assert "pickle" not in err.lower()


def test_a_broken_toml_file_is_a_usage_error_naming_the_file(cli, tmp_path) -> None:
    broken = tmp_path / "run.toml"
    broken.write_text("[train\nlr = 0.1\n")
    code, _, err = cli("train", "--config", broken, "--epochs", "1")
    assert_one_line_error(code, err, 2, str(broken), "not valid TOML")
    broken.write_text("[train]\nlr = -1\n")
    code, _, err = cli("train", "--config", broken, "--epochs", "1")
    assert_one_line_error(code, err, 2, str(broken), "train.lr")


@pytest.mark.parametrize("mode", ["central", "mesh"])
def test_a_diverging_run_is_one_clean_error_with_no_numpy_warning_before_it(
        cli, small_data_file, tmp_path, mode) -> None:
    with warnings.catch_warnings(record=True) as caught:  # what a terminal would show
        warnings.simplefilter("always")
        code, _, err = _train(cli, small_data_file, tmp_path / "run", "--lr", "1e6",
                              "--clip-norm", "0", "--mode", mode)
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == []
    assert_one_line_error(code, err, 1, "diverged", "lower the learning rate")


def test_training_on_data_of_another_grid_is_a_usage_error(cli, small_data_file,
                                                           tmp_path) -> None:
    code, _, err = _train(cli, small_data_file, tmp_path / "run", "--rows", "5",
                          "--cols", "5")
    assert_one_line_error(code, err, 2, "grid 6 x 8", "5 x 5")


def test_evaluate_reads_only_the_split_it_is_asked_for(cli, small_data_file, tmp_path) -> None:
    """A gap in the training log does not stop evaluating on the test split."""
    code, _, err = _train(cli, small_data_file, tmp_path / "run", "--epochs", "1",
                          "--mode", "central")
    assert code == 0, err
    data = load_dataset(small_data_file)
    X_train = data.X_train.copy()
    X_train[3, 2, 2] = np.nan
    gappy = tmp_path / "gappy.npz"
    np.savez(gappy, X_train=X_train, y_train=data.y_train, X_test=data.X_test,
             y_test=data.y_test)
    model = tmp_path / "run" / "model.npz"
    code, out, err = cli("evaluate", model, gappy, "--json")
    assert code == 0, err
    code, clean, _ = cli("evaluate", model, small_data_file, "--json")
    assert json.loads(out)["accuracy"] == json.loads(clean)["accuracy"]
    for split in ("train", "all"):
        code, _, err = cli("evaluate", model, gappy, "--split", split)
        assert_one_line_error(code, err, 1, "X_train", "NaN")


def test_each_epoch_line_is_printed_when_its_epoch_ends_before_the_summary(
        small_data_file, capsys, tmp_path) -> None:
    """Not collected for the end: a CI log or `| tee` sees the run go."""
    from meshdl.cli.train import Fit, fit_with_progress
    from meshdl.data.augment import training_data
    from meshdl.training.loop import engine_for

    config = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                             train={"epochs": 3, "batch": 40})
    data = load_dataset(small_data_file)
    printed_by_step: list[str] = []

    class Watching:  # the engine, noting what stderr showed before each step
        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        def loss_and_grads(self, model, idx):
            printed_by_step.append(capsys.readouterr().err)
            return self.inner.loss_and_grads(model, idx)

    engine = Watching(engine_for(config, training_data(config.train, data)))
    fit_with_progress(config, data, Fit(checkpoints=tmp_path), engine)
    so_far = list(itertools.accumulate(printed_by_step))
    steps = len(printed_by_step) // 3
    assert "epoch   1" not in so_far[steps - 1] and "epoch   1" in so_far[steps]
    assert "epoch   2" in so_far[2 * steps] and "epoch   3" not in so_far[-1]


def test_config_init_writes_a_commented_file_that_reads_back_as_the_defaults(cli,
                                                                              tmp_path):
    path = tmp_path / "mesh.toml"
    code, _, err = cli("config", "init", path)
    assert code == 0, err
    text = path.read_text()
    assert text.count("\n# ") > 20  # each setting under its description
    for section in ("[model]", "[data]", "[train]", "[mesh]"):
        assert section in text
    code, written, _ = cli("config", "show", "--config", path, "--json")
    code, defaults, _ = cli("config", "show", "--json")
    assert json.loads(written) == json.loads(defaults)
    path.write_text(text.replace("edge_at = [0, 0]", "edge_at = [0, 3]"))
    code, edited, _ = cli("config", "show", "--config", path, "--json")
    assert json.loads(edited)["mesh"]["edge_at"] == [0, 3]
    code, _, err = cli("config", "init", path)
    assert_one_line_error(code, err, 1, "exists", "--force")
    assert cli("config", "init", path, "--force")[0] == 0
    assert "edge_at = [0, 0]" in path.read_text()


def test_infer_writes_each_samples_prediction_the_same_in_the_mesh_and_centrally(
        cli, small_data_file, tmp_path) -> None:
    code, _, err = _train(cli, small_data_file, tmp_path / "run", "--epochs", "1",
                          "--mode", "central")
    assert code == 0, err
    model = tmp_path / "run" / "model.npz"
    files = {}
    for mode in ("mesh", "central"):
        files[mode] = tmp_path / mode / "predictions.csv"
        code, out, err = cli("infer", model, small_data_file, "--mode", mode,
                             "--predictions", files[mode], "--json")
        assert code == 0, err
        report = json.loads(out)
    rows, central = (list(csv.DictReader(files[m].open())) for m in ("mesh", "central"))
    assert [r["label"] for r in rows] == [r["label"] for r in central]
    assert [float(r["probability"]) for r in rows] == pytest.approx(
        [float(r["probability"]) for r in central], abs=2e-6)  # the head's BLAS batches
    assert [int(r["sample"]) for r in rows] == list(range(report["samples"]))
    assert all(0.0 <= float(r["probability"]) <= 1.0 for r in rows)
    assert all(int(r["label"]) == int(float(r["probability"]) > 0.5) for r in rows)
    hits = sum(r["label"] == r["true_label"] for r in rows)
    assert hits / len(rows) == report["accuracy"]
    assert [int(r["true_label"]) for r in rows] == load_dataset(small_data_file).y_test.tolist()


def test_train_over_an_unreachable_broker_fails_at_once_without_starting_a_run(
        cli, small_data_file, tmp_path, monkeypatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = []
    monkeypatch.setattr(meshdl.cli.train, "_fit_over_mqtt", lambda *a: started.append(a))
    code, _, err = cli("train", "--transport", "mqtt", "--broker", f"mqtt://127.0.0.1:{port}",
                       "--data", small_data_file, "--epochs", "1", "--out", tmp_path / "run")
    assert_one_line_error(code, err, 1, f"127.0.0.1:{port}", "meshdl broker")
    assert err.startswith("error:")  # no progress bar, not even a blank line before it
    assert started == [] and not (tmp_path / "run").exists()


def test_the_summary_of_an_mqtt_run_says_nothing_of_wave_depth_it_cannot_see(
        cli, small_data_file, tmp_path) -> None:
    from rich.console import Console

    from meshdl.cli.cost import print_comm_summary

    code, out, err = _train(cli, small_data_file, tmp_path / "run")
    assert code == 0, err
    comm = json.loads(out)["comm"]
    del comm["wave_depth"]  # over MQTT the edge sees no rounds inside the mesh
    console = Console(record=True, width=200)
    print_comm_summary(comm, console)
    text = console.export_text()
    assert "busiest link" in text and "None" not in text and "depth" not in text


def test_config_show_of_the_seed_network_says_what_a_global_head_takes(cli) -> None:
    """`data generate` makes the global recipe's 163,200 maps while `config show` of the
    seed network says data.train 2400: the table says why (a new user asked)."""
    code, out, _ = cli("config", "show")
    assert code == 0
    said = " ".join(out.split())
    assert "global head" in said and "163,200 training maps" in said
    assert "12 on the default 163,200" in said
