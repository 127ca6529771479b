"""`meshdl experiment`: trials over a swept value and seeds, their summary, the run
directory, and the same summary whatever the number of worker processes."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

from meshdl.experiments.runner import Trial, run_trials, summarize
from tests.helpers import assert_one_line_error


def _square(trial: Trial) -> dict:  # module level: a worker process gets it by name
    return {"value": trial.value, "seed": trial.seed, "y": trial.value ** 2 + trial.seed}


def test_summarize_gives_each_values_mean_and_sample_deviation_in_sweep_order() -> None:
    trials = [Trial(i, v, s, {}) for i, (v, s) in enumerate(
        [(5, 0), (5, 1), (5, 2), (2, 0), (2, 1), (2, 2)])]
    records = [_square(t) for t in trials]
    rows = summarize(trials, records, ["y", "absent"])
    assert [row["value"] for row in rows] == [5, 2]
    assert rows[0]["y"] == {"mean": 26.0, "std": 1.0} and rows[0]["seeds"] == 3
    assert rows[1]["y"]["std"] == pytest.approx(math.sqrt(1.0))
    assert rows[0]["absent"] is None
    one = summarize(trials[:1], records[:1], ["y"])
    assert one[0]["y"] == {"mean": 25.0, "std": 0.0}


def test_worker_processes_give_the_records_in_trial_order() -> None:
    trials = [Trial(i, v, 0, {}) for i, v in enumerate([3, 1, 2, 5])]
    heard = []
    records = run_trials(_square, trials, jobs=2, on_done=lambda t, _: heard.append(t.index))
    assert [r["value"] for r in records] == [3, 1, 2, 5]
    assert sorted(heard) == [0, 1, 2, 3]
    assert records == run_trials(_square, trials, jobs=1)


def _never(trial: Trial) -> dict:
    raise AssertionError(f"trial {trial.index} ran again")


def test_a_journal_takes_up_the_finished_trials_of_the_same_settings_only(tmp_path) -> None:
    journal = tmp_path / "run" / "journal.jsonl"
    trials = [Trial(i, v, 0, {"lr": 0.1}) for i, v in enumerate([3, 1, 2])]
    first = run_trials(_square, trials[:2], journal=journal)
    with journal.open("a") as lines:
        lines.write('{"value": 2, "seed": 0, "settings": {"lr": 0.1}, "rec')  # killed
    heard: list[int] = []
    again = run_trials(_square, trials, on_done=lambda t, _: heard.append(t.index),
                       journal=journal)
    assert again[:2] == first and heard == [2]  # only the unfinished trial ran
    assert run_trials(_never, trials, journal=journal) == again  # all three journaled
    other = [Trial(i, v, 0, {"lr": 0.2}) for i, v in enumerate([3, 1, 2])]
    with pytest.raises(AssertionError, match="ran again"):  # other settings: run afresh
        run_trials(_never, other, journal=journal)


def test_a_journaled_trial_whose_data_file_changed_runs_again(tmp_path) -> None:
    journal, data = tmp_path / "run" / "journal.jsonl", tmp_path / "data.npz"
    data.write_bytes(b"the data of the first sweep")
    trials = [Trial(0, 3, 0, {"data_file": str(data)})]
    run_trials(_square, trials, journal=journal)
    assert run_trials(_never, trials, journal=journal)  # the same file: taken
    data.write_bytes(b"other data at the same path")
    with pytest.raises(AssertionError, match="ran again"):
        run_trials(_never, trials, journal=journal)


@pytest.fixture(scope="module")
def small_runs(small_data_file, tmp_path_factory):
    """The filter-size experiment on the small data set, with one job and with two."""
    from tests.test_cli_simulate import _meshdl

    runs = {}
    backends = {1: (), 2: ("--jobs", "2")}
    if importlib.util.find_spec("ray") is not None:
        backends["ray"] = ("--jobs", "2", "--ray")  # a local cluster of 2 CPUs
    for backend, flags in backends.items():
        out = tmp_path_factory.mktemp(f"backend{backend}")
        code, stdout, err = _meshdl("experiment", "filter-size", "--sizes", "1",
                                    "--sizes", "3", "--seeds", "2", "--epochs", "2",
                                    "--batch", "40", "--hidden", "8", "--data",
                                    small_data_file, "--out", out, "--json", *flags)
        assert code == 0, err
        runs[backend] = (out, json.loads(stdout), err)
    return runs


def test_filter_size_writes_its_run_directory_and_prints_its_summary(small_runs) -> None:
    out, summary, err = small_runs[1]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert [row["value"] for row in summary["rows"]] == [1, 3]
    assert all(row["seeds"] == 2 for row in summary["rows"])
    k1, k3 = summary["rows"]
    assert k1["halo_transmitted"]["mean"] == 0 < k3["halo_transmitted"]["mean"]  # 1x1: none
    assert k3["halo_formula"]["mean"] == 8 * 6 * 8 * (1 + 5)  # (k²-1) m n c_in, 2 layers
    assert k3["wave_bytes"]["mean"] > k1["wave_bytes"]["mean"]
    assert summary["paper"] == [{"value": 3, "train_acc": 0.944, "test_acc": 0.928}]
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert [(t["value"], t["seed"]) for t in trials] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    table = list(csv.DictReader((out / "table.csv").open()))
    assert [row["value"] for row in table] == ["1", "3"]
    assert float(table[1]["test_acc_mean"]) == pytest.approx(k3["test_acc"]["mean"],
                                                             rel=1e-5)
    config = json.loads((out / "config.json").read_text())
    assert config["values"] == [1, 3] and config["seeds"] == [0, 1]
    for plot in ("accuracy.png", "cost.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "trial 4/4" in err  # progress as the trials finish


@pytest.mark.parametrize("backend", [2, "ray"])
def test_the_same_seeds_give_the_same_summary_on_one_job_two_or_ray(small_runs,
                                                                    backend) -> None:
    if backend not in small_runs:
        pytest.skip("Ray is not installed (the extra meshdl[ray]; ./bootstrap --dev "
                    "installs it)")
    one, other = small_runs[1][0], small_runs[backend][0]
    assert (one / "summary.json").read_bytes() == (other / "summary.json").read_bytes()
    assert (one / "trials.jsonl").read_bytes() == (other / "trials.jsonl").read_bytes()


@pytest.mark.parametrize(("flags", "needle"), [
    (("--sizes", "0"), "--sizes"), (("--sizes", "3", "--sizes", "3"), "--sizes"),
    (("--sizes", "40"), "kernel")])
def test_an_impossible_sweep_is_refused_before_any_trial(tmp_path, flags, needle) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "filter-size", *flags, "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, needle)
    assert not (tmp_path / "run").exists()


def test_edge_position_measures_the_cost_only_and_a_middle_edge_waves_shallower(
        tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, out, err = _meshdl("experiment", "edge-position", "--rows", "6", "--cols", "9",
                             "--cells", "0,0", "--cells", "0,4", "--out", tmp_path / "run",
                             "--json")
    assert code == 0, err
    summary = json.loads(out)
    corner, middle = summary["rows"]
    assert corner["value"] == [0, 0] and middle["value"] == [0, 4]
    assert "test_acc" not in corner and summary["seeds"] == 1
    assert middle["wave_rounds"]["mean"] < corner["wave_rounds"]["mean"]
    assert middle["halo_transmitted"] == corner["halo_transmitted"]  # the same convs
    assert not (tmp_path / "run" / "accuracy.png").exists()
    assert (tmp_path / "run" / "cost.png").is_file()


@pytest.mark.parametrize(("command", "flag"), [("filters", "--values"),
                                               ("hidden", "--values")])
def test_filters_and_hidden_sweep_their_setting_with_accuracy(
        small_data_file, tmp_path, command, flag) -> None:
    from tests.test_cli_simulate import _meshdl

    code, out, err = _meshdl("experiment", command, flag, "2", flag, "4", "--seeds", "1",
                             "--epochs", "1", "--batch", "40", "--data", small_data_file,
                             "--out", tmp_path / "run", "--json")
    assert code == 0, err
    small, large = json.loads(out)["rows"]
    assert (small["value"], large["value"]) == (2, 4)
    assert "test_acc" in small
    if command == "filters":  # halos and gathered features grow with h
        assert large["wave_bytes"]["mean"] > small["wave_bytes"]["mean"]
    else:  # the head is the edge's: the mesh's traffic does not change
        assert large["wave_bytes"] == small["wave_bytes"]


def test_a_grid_whose_messages_cannot_carry_the_batch_is_refused_before_any_trial(
        tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "grid", "--values", "5", "--values", "100",
                           "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, "= 100", "at most 20 fit")
    assert not (tmp_path / "run").exists()


def test_an_edge_away_from_the_border_is_refused(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "edge-position", "--cells", "5,5", "--out",
                           tmp_path / "run")
    assert_one_line_error(code, err, 2, "border cell")


def test_grid_fits_a_waves_bytes_against_the_meshs_cells(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, out, err = _meshdl("experiment", "grid", "--values", "3", "--values", "5",
                             "--values", "7", "--out", tmp_path / "run", "--json")
    assert code == 0, err
    summary = json.loads(out)
    sizes = [row["wave_bytes"]["mean"] for row in summary["rows"]]
    assert sizes == sorted(sizes) and sizes[0] > 0
    fit = summary["fit"]
    assert fit["bytes_per_cell"] > 0 and 0.9 < fit["r2"] <= 1.0
    cells = [9, 25, 49]
    predicted = [fit["bytes_per_cell"] * c + fit["intercept"] for c in cells]
    residuals = [abs(p - s) for p, s in zip(predicted, sizes, strict=True)]
    assert max(residuals) < 0.2 * max(sizes)


def test_ray_without_an_address_means_a_local_cluster() -> None:
    from meshdl.cli import _optional_values

    assert _optional_values(["experiment", "grid", "--ray"])[-1] == "local"
    assert _optional_values(["--ray", "--jobs", "2"]) == ["--ray", "local", "--jobs", "2"]
    assert _optional_values(["--ray", "ray://head:10001"]) == ["--ray", "ray://head:10001"]


def test_edge_vs_cloud_puts_each_radios_slot_beside_shipping_its_readings(tmp_path):
    from meshdl.config import ModelConfig
    from meshdl.sim.radio.device import device
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.studies.compare import inference_slot
    from tests.test_cli_simulate import _meshdl

    code, out, err = _meshdl("experiment", "edge-vs-cloud", "--radio", "802.15.4",
                             "--radio", "wifi", "--seeds", "2", "--rows", "4", "--cols",
                             "5", "--out", tmp_path / "run", "--json")
    assert code == 0, err
    mesh_radio, star = json.loads(out)["rows"]
    assert (mesh_radio["value"], star["value"]) == ("802.15.4", "wifi")
    assert mesh_radio["mesh_bytes"]["std"] == 0  # the seeds move times, not bytes
    assert star["cloud_aggregated_bytes"] is None  # no tree to aggregate along
    assert mesh_radio["cloud_aggregated_bytes"]["mean"] < \
        mesh_radio["cloud_unaggregated_bytes"]["mean"]
    one = inference_slot(ModelConfig(rows=4, cols=5), profile("802.15.4"), "shared",
                         device("cortex-m4"), device("pi4"), batch=1, seed=0)
    trial = json.loads((tmp_path / "run" / "trials.jsonl").read_text().splitlines()[0])
    assert trial["mesh_makespan_s"] == one["in_mesh"]["makespan_s"]
    assert trial["mesh_bytes"] == one["in_mesh"]["bytes"]
    assert (tmp_path / "run" / "edge-vs-cloud.png").is_file()


def test_edge_vs_cloud_refuses_an_unknown_radio(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "edge-vs-cloud", "--radio", "zigbee-9000",
                           "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, "zigbee-9000", "802.15.4")
    assert not (tmp_path / "run").exists()


def test_the_printed_table_fits_a_log_of_eighty_columns(small_data_file, tmp_path) -> None:
    """What a CI log or `| tee` shows (80 columns): every figure whole, none cut short."""
    from tests.test_cli_simulate import _meshdl

    code, out, err = _meshdl("experiment", "filter-size", "--sizes", "3", "--seeds", "2",
                             "--epochs", "1", "--batch", "40", "--hidden", "8", "--data",
                             small_data_file, "--out", tmp_path / "run")
    assert code == 0, err
    assert "…" not in out and "±" in out and "92.8/94.4" in out


def test_loss_trains_each_rate_and_policy_from_the_exact_run(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    run = tmp_path / "run"
    code, out, err = _meshdl("experiment", "loss", "--rows", "4", "--cols", "5",
                             "--epochs", "1", "--hidden", "8", "--rates", "0",
                             "--rates", "0.3", "--policies", "zero", "--policies",
                             "reliable", "--seeds", "1", "--out", run, "--json")
    assert code == 0, err
    summary = json.loads(out)
    rows = {tuple(row["value"]): row for row in summary["rows"]}
    assert set(rows) == {(0.0, "exact"), (0.3, "zero"), (0.3, "reliable")}
    exact, reliable = rows[(0.0, "exact")], rows[(0.3, "reliable")]
    # Reliable recovery trains the exact model, at a price in time and frames.
    assert reliable["clean_test_acc"]["mean"] == exact["clean_test_acc"]["mean"]
    assert reliable["seconds_per_epoch"]["mean"] > exact["seconds_per_epoch"]["mean"]
    assert reliable["substituted"]["mean"] == 0 < rows[(0.3, "zero")]["substituted"]["mean"]
    assert exact["frames_lost"]["mean"] == 0
    assert (run / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_a_stopped_sweep_given_its_run_directory_runs_only_what_it_had_not_finished(
        small_data_file, tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    run = tmp_path / "run"
    flags = ("experiment", "filter-size", "--seeds", "1", "--epochs", "1", "--batch", "40",
             "--hidden", "8", "--data", small_data_file, "--out", run, "--json")
    code, _, err = _meshdl(*flags, "--sizes", "1")
    assert code == 0, err
    journal = (run / "journal.jsonl").read_text()
    code, out, err = _meshdl(*flags, "--sizes", "1", "--sizes", "3")
    assert code == 0, err
    assert "taking 1 of 2 trials" in err and "trial 2/2" in err and "trial 1/2" not in err
    assert (run / "journal.jsonl").read_text().startswith(journal)
    assert [row["value"] for row in json.loads(out)["rows"]] == [1, 3]


@pytest.mark.parametrize(("flags", "needle"), [
    (("--rates", "0.95"), "--rates"), (("--policies", "mean"), "--policies"),
    (("--rates", "0.3", "--burst", "0.5"), "--burst")])
def test_an_impossible_loss_experiment_is_refused_before_any_trial(tmp_path, flags,
                                                                    needle) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "loss", *flags, "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, needle)
    assert not (tmp_path / "run").exists()


def test_failures_trains_with_dead_nodes_the_protocol_finds(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    run = tmp_path / "run"
    code, out, err = _meshdl("experiment", "failures", "--rows", "4", "--cols", "5",
                             "--epochs", "1", "--hidden", "8", "--fractions", "0",
                             "--fractions", "0.2", "--policies", "neighbours",
                             "--seeds", "1", "--out", run, "--json")
    assert code == 0, err
    rows = {tuple(row["value"]): row for row in json.loads(out)["rows"]}
    assert set(rows) == {(0.0, "exact"), (0.2, "neighbours")}
    dead = rows[(0.2, "neighbours")]
    assert dead["dead_found"]["mean"] == 4  # 20 % of 20 cells, every one found
    assert dead["absent_filled"]["mean"] > 0 == rows[(0.0, "exact")]["absent_filled"]["mean"]
    assert (run / "failures.png").read_bytes().startswith(b"\x89PNG")
    # Beside it, the model trained with every cell alive whose cells die after training:
    # with none dead, the exact run's model (the mesh trains the central model).
    exact = rows[(0.0, "exact")]
    assert abs(exact["deployed_acc"]["mean"] - exact["test_acc"]["mean"]) <= 0.05
    assert 0 <= dead["deployed_acc"]["mean"] <= 1
    assert "deployed %" in json.loads(out)["table"]["header"]


def test_failures_refuses_reliable_recovery(tmp_path) -> None:
    from tests.test_cli_simulate import _meshdl

    code, _, err = _meshdl("experiment", "failures", "--policies", "reliable", "--out",
                           tmp_path / "run")
    assert_one_line_error(code, err, 2, "best effort")


def _sleepy_trial(trial):
    import time as _time

    _time.sleep(600)
    return {"value": trial.value}


_SWEEP_THAT_SLEEPS = """
import multiprocessing, sys, threading, time
from meshdl.experiments.runner import Trial, run_trials
from tests.test_experiments import _sleepy_trial

def say_workers():
    while len(multiprocessing.active_children()) < 2:
        time.sleep(0.1)
    pids = " ".join(str(c.pid) for c in multiprocessing.active_children())
    open(sys.argv[1], "w").write(pids)

threading.Thread(target=say_workers, daemon=True).start()
run_trials(_sleepy_trial, [Trial(i, i, 0, {}) for i in range(2)], jobs=2)
"""


def test_trial_workers_end_when_the_experiment_process_is_killed(tmp_path):
    """A sweep killed with SIGKILL leaves no worker computing orphaned trials."""
    import os
    import signal
    import subprocess
    import sys
    import time as _time

    pids = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", _SWEEP_THAT_SLEEPS, str(pids)])
    deadline = _time.monotonic() + 120
    while not pids.exists() and _time.monotonic() < deadline:
        _time.sleep(0.2)
    workers = [int(pid) for pid in pids.read_text().split()]
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)

    def alive(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            state = stat.rsplit(")", 1)[-1].split()[0]
        except FileNotFoundError:
            return False
        return state != "Z"  # a zombie has exited, only not yet been reaped

    try:
        while any(alive(pid) for pid in workers) and _time.monotonic() < deadline:
            _time.sleep(0.2)
        assert not any(alive(pid) for pid in workers)
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_bound_models_line_is_drawn_only_on_the_data_it_was_measured_on() -> None:
    """Its figures are the bound model's on one data set and the cells each fault seed
    kills: another data set, or another edge (other cells die), has none."""
    from meshdl.config import DataConfig
    from meshdl.data.datasets import data_digest
    from meshdl.data.lounge import generate_lounge
    from meshdl.experiments.faults import BOUND, bound_accuracy

    data = generate_lounge(DataConfig(rows=6, cols=8, train=2400))
    measured = BOUND[data_digest(data)]
    at = {"mesh": {"edge_at": (0, 0)}}
    assert bound_accuracy(data, at, 0.1, 3) == measured["0.1"][3]
    assert bound_accuracy(data, at, 0.0, 0) == measured["0"][0]
    assert bound_accuracy(data, {"mesh": {"edge_at": (0, 1)}}, 0.1, 3) is None
    other = generate_lounge(DataConfig(rows=6, cols=8, train=2400, seed=1))
    assert bound_accuracy(other, at, 0.1, 3) is None
