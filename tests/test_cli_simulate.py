"""`meshdl simulate train|infer` end to end, in process, on a 4 x 5 grid: what sim.json,
trace.jsonl and energy.png hold, that the same command gives the same files, the MQTT
star, the one-line errors of a wrong request, and a user's radio profile."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from meshdl.cli import main
from meshdl.protocol.messages import EDGE, HEADER_BYTES, ITEM_BYTES, Kind
from meshdl.protocol.topics import topic
from meshdl.report.baseline import strongest
from meshdl.sim.timed import publish_bytes
from tests.helpers import assert_one_line_error

GRID = ("--rows", "4", "--cols", "5")
CELLS = [f"r{r}c{c}" for r in range(4) for c in range(5)]
# The 4 x 5 BFS tree from (0, 0): the depths of its cells (1 for r0c0) add up to 90,
# and so do its subtree sizes (each cell counted once per hop it is away).
HOPS = 90
RADIO_KEYS = {"name", "bitrate_bps", "max_frame_bytes", "frame_overhead_bytes", "tx_w",
              "rx_w", "idle_w", "sleep_w", "duty_cycle", "source"}
TRACE_KEYS = {"t0", "t1", "src", "dst", "kind", "layer", "bytes", "frames", "outcome"}
PNG = b"\x89PNG\r\n\x1a\n"
TINY_DATA = """\
[data]
train = 48
test = 16
seed = 5
"""


def _meshdl(*args: str | Path) -> tuple[int, str, str]:
    """`meshdl ARGS...` in this process: (exit code, stdout, stderr). Usable from
    module-scoped fixtures, where pytest's capsys is not."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _infer(out: Path, *extra: str | Path) -> tuple[int, str, str]:
    return _meshdl("simulate", "infer", *GRID, "--out", out, "--json", *extra)


def _train(out: Path, config: Path, *extra: str | Path) -> tuple[int, str, str]:
    return _meshdl("simulate", "train", *GRID, "--epochs", "1", "--batch", "16",
                   "--hidden", "8", "--config", config, "--out", out, "--json", *extra)


def _config(directory: Path, text: str = TINY_DATA) -> Path:
    path = directory / "tiny.toml"
    path.write_text(text)
    return path


def _trace(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def inferred(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """One inference slot on the synthetic lounge: (run dir, stdout's JSON, stderr)."""
    run = tmp_path_factory.mktemp("infer") / "run"
    code, out, err = _infer(run)
    assert code == 0, err
    return run, json.loads(out), err


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """One epoch of 48 training maps (3 steps of 16), mirrors on (the default)."""
    base = tmp_path_factory.mktemp("train")
    run = base / "run"
    code, out, err = _train(run, _config(base))
    assert code == 0, err
    return run, json.loads(out), err


# ------------------------------------------------------------------ infer
def test_infer_json_holds_the_sim_contract(inferred) -> None:
    report = inferred[1]
    assert report["mode"] == "infer"
    assert report["waves"] == 1
    assert set(report["radio"]) >= RADIO_KEYS
    assert report["radio"]["name"] == "802.15.4"
    assert report["medium"] == "shared"
    assert report["device"] == "cortex-m4"  # a mote's computer on a low-power radio
    span = report["makespan_s"]
    assert set(span) >= {"per_wave_mean", "forward_mean", "total"}
    assert 0 < span["forward_mean"] <= span["per_wave_mean"] == span["total"]
    energy = report["energy_j"]
    assert set(energy) >= {"total", "max_node", "per_node"}
    assert sorted(energy["per_node"]) == sorted(CELLS)
    assert energy["max_node"] == max(energy["per_node"].values())
    assert energy["total"] > sum(energy["per_node"].values())  # the edge's joules too
    # Bytes and frames per message class; an inference wave has no backward.
    assert set(report["bytes"]) == set(report["frames"])
    assert {"params", "halo/conv1", "pool", "gather"} <= set(report["bytes"])
    assert not {"reduce", "scatter"} & set(report["bytes"])
    assert all(report["bytes"][c] > 0 and report["frames"][c] > 0 for c in report["bytes"])
    cloud_heavy = report["baseline"]["cloud_heavy"]
    assert cloud_heavy["makespan_s"] > 0
    assert {"total", "max_node"} <= set(cloud_heavy["energy_j"])


def test_infer_baseline_is_the_hand_count_of_one_reading_a_cell(inferred) -> None:
    baseline = inferred[1]["baseline"]
    # The main baseline is the strongest variant: one reading a cell goes up the tree
    # fastest aggregated.
    assert strongest(baseline).variant == "aggregated"
    assert baseline["cloud_heavy"] == baseline["cloud_heavy_aggregated"]
    aggregated, unaggregated = (baseline["cloud_heavy_aggregated"],
                                baseline["cloud_heavy_unaggregated"])
    # Aggregated: one message per tree link, each with its subtree's readings.
    assert aggregated["transmissions"] == 20
    assert aggregated["bytes"] == 20 * HEADER_BYTES + ITEM_BYTES * HOPS == 1320
    # Unaggregated: each cell's 52-byte message relayed hop by hop.
    assert unaggregated["transmissions"] == HOPS
    assert unaggregated["bytes"] == HOPS * (HEADER_BYTES + ITEM_BYTES) == 4680


def test_infer_writes_sim_json_trace_and_energy_png(inferred) -> None:
    run, report, _ = inferred
    sim = json.loads((run / "sim.json").read_text())
    assert report == sim
    assert (run / "energy.png").read_bytes().startswith(PNG)
    trace = _trace(run)
    assert len(trace) == sim["transmissions"]
    broadcasts = 0
    for line in trace:
        assert set(line) >= TRACE_KEYS, line
        assert line["t1"] >= line["t0"] >= 0
        assert line["outcome"] == "ok"
        assert line["bytes"] > 0 and line["frames"] >= 1
        if line["dst"] == "*":  # a broadcast: one frame for several neighbours
            broadcasts += 1
        else:
            assert line["to"] == [line["dst"]]
    assert broadcasts > 0  # the parameters and halo strips
    assert sum(line["bytes"] for line in trace) == sum(sim["bytes"].values())
    assert sum(line["frames"] for line in trace) == sum(sim["frames"].values()) == \
        sim["frames_total"]
    assert {line["src"] for line in trace} == {"edge", *CELLS}
    assert trace[-1]["dst"] == "edge" and trace[-1]["kind"] == "gather"


def test_infer_json_on_stdout_is_sim_json(inferred) -> None:
    run, report, _ = inferred
    assert report == json.loads((run / "sim.json").read_text())


def test_the_same_infer_command_gives_the_same_files(inferred, tmp_path) -> None:
    first, _, _ = inferred
    code, _, err = _infer(tmp_path / "again")
    assert code == 0, err
    for name in ("sim.json", "trace.jsonl"):
        assert (tmp_path / "again" / name).read_bytes() == (first / name).read_bytes(), name


def test_infer_over_the_star_goes_through_the_broker(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "star", "--medium", "star", "--radio", "wifi")
    assert code == 0, err
    report = json.loads(out)
    assert report["medium"] == "star"
    assert report["radio"]["name"] == "wifi"
    assert report["device"] == "pi-zero-2w"
    # No tree to aggregate along: every cell's message up to the broker and down.
    baseline = report["baseline"]
    assert set(baseline) == {"cloud_heavy", "cloud_heavy_unaggregated", "lossless_links"}
    assert baseline["cloud_heavy"]["variant"] == "unaggregated"
    publish = publish_bytes(len(topic(1, (0, 0), EDGE, Kind.GATHER)),
                            HEADER_BYTES + ITEM_BYTES)
    assert baseline["cloud_heavy"]["transmissions"] == 2 * 20
    assert baseline["cloud_heavy"]["bytes"] == 2 * 20 * publish == 3280
    trace = _trace(tmp_path / "star")
    assert all("broker" in (line["src"], line["dst"]) for line in trace)
    assert {line["src"] for line in trace} == {"edge", "broker", *CELLS}


@pytest.mark.parametrize("radio", ["ble", "802.15.4"])
def test_a_low_power_radio_may_be_the_stars_channel_too(tmp_path, radio) -> None:
    """No radio is tied to a medium: any profile may carry the star's one channel (the
    radio only picks the nodes' default computer: a mote's unless it is wifi)."""
    code, out, err = _infer(tmp_path / "run", "--medium", "star", "--radio", radio,
                            "--no-trace")
    assert code == 0, err
    report = json.loads(out)
    assert (report["medium"], report["radio"]["name"], report["device"]) == \
        ("star", radio, "cortex-m4")
    assert not (tmp_path / "run" / "trace.jsonl").exists()


# ------------------------------------------------------------------ train
def test_train_writes_the_run_and_sim_json(trained) -> None:
    run, report, _ = trained
    for name in ("model.npz", "metrics.json", "config.json", "sim.json", "energy.png"):
        assert (run / name).is_file(), name
    sim = json.loads((run / "sim.json").read_text())
    assert report == sim
    assert sim["mode"] == "train"
    assert sim["waves"] == 3  # 48 maps in batches of 16
    assert {"reduce", "scatter", "gather", "params"} <= set(sim["bytes"])
    assert sim["evaluation"]["waves"] > 0  # the test set after the epoch
    assert json.loads((run / "metrics.json").read_text())["sim"] == sim
    assert (run / "energy.png").read_bytes().startswith(PNG)
    assert not (run / "trace.jsonl").exists()  # off by default in training
    config = json.loads((run / "config.json").read_text())
    assert (config["model"]["rows"], config["data"]["train"]) == (4, 48)


def test_train_baseline_ships_the_training_set_once(tmp_path) -> None:
    """Without mirrors, the 48 raw maps go up the tree once: 20 messages, each with its
    subtree's 48 readings."""
    config = _config(tmp_path, TINY_DATA + '\n[train]\naugment = "none"\n')
    code, out, err = _train(tmp_path / "run", config)
    assert code == 0, err
    baseline = json.loads(out)["baseline"]["cloud_heavy"]
    assert baseline["variant"] == "aggregated"
    assert baseline["transmissions"] == 20
    assert baseline["bytes"] == 20 * HEADER_BYTES + ITEM_BYTES * 48 * HOPS == 18240
    assert baseline["compute_s"] > 0


def test_train_baseline_ships_the_raw_maps_not_their_mirror_images(trained) -> None:
    baseline = trained[1]["baseline"]["cloud_heavy"]
    assert baseline["bytes"] == 20 * HEADER_BYTES + ITEM_BYTES * 48 * HOPS == 18240


def test_train_summary_names_no_missing_figure(trained) -> None:
    assert "None" not in trained[2]


def test_train_refuses_a_broadcast_params_via_on_the_shared_radio(tmp_path) -> None:
    config = _config(tmp_path, TINY_DATA + '\n[mesh]\nparams_via = "broadcast"\n')
    code, _, err = _train(tmp_path / "run", config, "--medium", "shared")
    assert_one_line_error(code, err, 2, "params_via")


# ------------------------------------------------------------------ bad input
def test_an_unknown_radio_is_a_usage_error_naming_the_known_ones(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "run", "--radio", "zigbee-pro")
    assert_one_line_error(code, err, 2, "'zigbee-pro'", "802.15.4", "ble", "wifi")
    assert out == ""
    assert not (tmp_path / "run").exists()


def test_an_unknown_medium_is_a_usage_error(tmp_path) -> None:
    code, _, err = _infer(tmp_path / "run", "--medium", "foo")
    assert_one_line_error(code, err, 2, "--medium", "shared", "star", "'foo'")
    assert not (tmp_path / "run").exists()


def test_train_rejects_an_unknown_radio_before_training(tmp_path) -> None:
    code, _, err = _train(tmp_path / "run", _config(tmp_path), "--radio", "nope")
    assert_one_line_error(code, err, 2, "'nope'", "known")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("flags", "needle"), [
    (("--batch", "0"), "at least 1"), (("--waves", "0"), "at least 1"),
    (("--batch", "100000"), "at most")])
def test_infer_rejects_a_batch_or_waves_it_cannot_run(tmp_path, flags, needle) -> None:
    code, _, err = _infer(tmp_path / "run", *flags)
    assert_one_line_error(code, err, 2, needle)


# ------------------------------------------------------------------ radio profiles
def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)  # a TOML basic string


def test_a_users_radio_profile_simulates_like_the_builtin_it_copies(inferred,
                                                                   tmp_path) -> None:
    code, out, err = _meshdl("radio", "list", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert {"802.15.4", "ble", "wifi"} <= {r["name"] for r in listed}
    builtin = next(r for r in listed if r["name"] == "802.15.4")
    mine = {**builtin, "name": "mine"}
    lines = ["[[radio]]"] + [f"{key} = {_toml_value(value)}" for key, value in mine.items()
                             if value is not None]
    radios = tmp_path / "radios.toml"
    radios.write_text("\n".join(lines) + "\n")

    code, out, err = _meshdl("radio", "list", "--file", radios, "--json")
    assert code == 0, err
    assert next(r for r in json.loads(out) if r["name"] == "mine") == mine

    code, out, err = _infer(tmp_path / "run", "--radios", radios, "--radio", "mine")
    assert code == 0, err
    report = json.loads(out)
    assert report["radio"] == mine
    # The same figures as the built-in gives: the same trace, the same sim.json but for
    # the radio's name.
    run, builtin_report, _ = inferred
    assert {**report, "radio": builtin} == builtin_report
    assert (tmp_path / "run" / "trace.jsonl").read_bytes() == \
        (run / "trace.jsonl").read_bytes()


def test_an_unknown_radio_error_lists_the_users_profiles_too(tmp_path) -> None:
    radios = tmp_path / "radios.toml"
    code, out, _ = _meshdl("radio", "list", "--json")
    wifi = next(r for r in json.loads(out) if r["name"] == "wifi")
    radios.write_text("[[radio]]\n" + "\n".join(
        f"{k} = {_toml_value('lab-wifi' if k == 'name' else v)}" for k, v in wifi.items()
        if v is not None) + "\n")
    code, _, err = _infer(tmp_path / "run", "--radios", radios, "--radio", "nope")
    assert_one_line_error(code, err, 2, "'nope'", "lab-wifi", "802.15.4")


@pytest.mark.parametrize("command", [("simulate", "infer"), ("simulate", "train"),
                                     ("radio", "list")])
def test_help_names_the_radio_tables(command) -> None:
    code, out, _ = _meshdl(*command, "--help")
    assert code == 0
    assert "[[radio]]" in out


def test_lossy_links_cost_frames_and_time_and_say_so_in_sim_json(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "clean")
    assert code == 0, err
    clean = json.loads(out)
    assert clean["faults"]["lost"] == clean["faults"]["recovered"] == 0
    code, out, err = _infer(tmp_path / "lossy", "--loss", "0.3", "--burst", "3",
                            "--fault-seed", "4")
    assert code == 0, err
    lossy = json.loads(out)
    faults = lossy["faults"]
    assert faults["lost"] > 0 and faults["retransmitted"] > 0
    assert faults["loss"] == {"rate": 0.3, "burst": 3.0, "seed": 4}
    assert faults["substituted"] == 0 and faults["dead_cells"] == []
    assert lossy["frames_total"] > clean["frames_total"]
    assert lossy["makespan_s"]["total"] > clean["makespan_s"]["total"]
    assert lossy["accuracy"] == clean["accuracy"]  # reliable: the same predictions
    assert faults["recovered"] == faults["frames_recovered"] + faults["messages_resent"]
    outcomes = {json.loads(line)["outcome"] for line in
                (tmp_path / "lossy" / "trace.jsonl").read_text().splitlines()}
    assert "ok" in outcomes and any(o.startswith("missed by") for o in outcomes)
    assert any(o.startswith("ok after") for o in outcomes)


def test_a_loss_of_one_or_more_is_a_usage_error(tmp_path) -> None:
    code, _, err = _infer(tmp_path / "run", "--loss", "1.0")
    assert_one_line_error(code, err, 2, "--loss")


def test_stragglers_are_named_in_sim_json_and_cost_cpu_not_accuracy(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "clean")
    assert code == 0, err
    clean = json.loads(out)
    assert clean["faults"]["stragglers"] == [] and clean["faults"]["straggler_slowdown"] is None
    code, out, err = _infer(tmp_path / "slow", "--stragglers", "0.5",
                            "--straggler-slowdown", "1000", "--fault-seed", "2")
    assert code == 0, err
    slow = json.loads(out)
    assert len(slow["faults"]["stragglers"]) == round(0.5 * len(slow["energy_j"]["per_node"]))
    assert slow["faults"]["straggler_slowdown"] == 1000
    assert slow["makespan_s"]["total"] > clean["makespan_s"]["total"]
    assert slow["accuracy"] == clean["accuracy"]
    # Every node listens longer in a longer run; a straggler also computes longer.
    grown = {cell: slow["energy_j"]["per_node"][cell] - clean["energy_j"]["per_node"][cell]
             for cell in clean["energy_j"]["per_node"]}
    stragglers = set(slow["faults"]["stragglers"])
    assert min(grown[c] for c in stragglers) > max(grown[c] for c in grown
                                                   if c not in stragglers)


@pytest.mark.parametrize("flags", [("--stragglers", "1.5"), ("--stragglers", "-0.1"),
                                   ("--straggler-slowdown", "0.5")])
def test_an_impossible_straggler_flag_is_a_usage_error(tmp_path, flags) -> None:
    code, _, err = _infer(tmp_path / "run", *flags)
    assert_one_line_error(code, err, 2, "--stragglers")


def test_any_fault_seed_is_taken_negative_ones_too(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "run", "--fault-seed", "-1", "--stragglers", "0.5")
    assert code == 0, err
    assert len(json.loads(out)["faults"]["stragglers"]) == 10


def test_best_effort_inference_fills_in_what_it_lost_and_says_so(tmp_path) -> None:
    code, out, err = _infer(tmp_path / "run", "--loss", "0.3", "--waves", "3",
                            "--recovery", "best-effort", "--policy", "neighbours",
                            "--fault-seed", "2")
    assert code == 0, err
    faults = json.loads(out)["faults"]
    assert faults["recovery"] == "best-effort" and faults["policy"] == "neighbours"
    assert faults["patience"] == 4.0
    assert faults["substituted"] == sum(faults["substituted_by_kind"].values())
    assert set(faults) >= {"lost", "retransmitted", "recovered", "substituted",
                           "dead_cells", "messages_lost", "late", "skipped_steps"}


@pytest.mark.parametrize(("flags", "needle"), [
    (("--recovery", "maybe"), "--recovery"), (("--policy", "mean"), "--policy"),
    (("--policy", "last"), "--policy"),  # reliable recovery never fills in
    (("--recovery", "best-effort", "--patience", "0.5"), "--patience")])
def test_an_impossible_recovery_flag_is_a_usage_error(tmp_path, flags, needle) -> None:
    code, _, err = _infer(tmp_path / "run", *flags)
    assert_one_line_error(code, err, 2, needle)


def test_dead_nodes_are_found_and_named_in_sim_json(tmp_path) -> None:
    # Three epochs of three steps: time for a silent wave, a report and a replan.
    code, out, err = _meshdl("simulate", "train", *GRID, "--epochs", "3", "--batch", "16",
                             "--hidden", "8", "--config", _config(tmp_path), "--dead", "0.2",
                             "--recovery", "best-effort", "--fault-seed", "3",
                             "--out", tmp_path / "run", "--json")
    assert code == 0, err
    faults = json.loads(out)["faults"]
    assert len(faults["down_cells"]) == 4 and faults["dead_cells"] == faults["down_cells"]
    assert faults["absent_filled"] > 0
    assert not set(faults["down_cells"]) & set(json.loads(out)["energy_j"]["per_node"])


@pytest.mark.parametrize(("flags", "needle"), [
    (("--dead", "0.2"), "best-effort"), (("--dead", "1.0", "--recovery", "best-effort"),
                                         "--dead"),
    (("--attach", "1,1", "--recovery", "best-effort"), "border"),
    (("--attach", "0,4"), "best-effort")])
def test_an_impossible_dead_or_attach_flag_is_a_usage_error(tmp_path, flags, needle) -> None:
    code, _, err = _infer(tmp_path / "run", *flags)
    assert_one_line_error(code, err, 2, needle)


# ------------------------------------------ issue 43, item 8: the model's grid and the run's
def _saved_model(directory: Path, pool: str | int, rows: int = 6, cols: int = 8) -> Path:
    """A fresh model of `rows` x `cols`, pooled by `pool`, saved as model.npz."""
    from meshdl import CNN, ModelConfig

    path = directory / f"model-{pool}.npz"
    CNN(ModelConfig(rows=rows, cols=cols, pool=pool, filters=2, hidden=4), seed=0).save(path)
    return path


def _data_file(directory: Path, rows: int, cols: int) -> Path:
    from meshdl.config import DataConfig
    from meshdl.data.datasets import save_dataset
    from meshdl.data.lounge import generate_lounge

    return save_dataset(generate_lounge(DataConfig(rows=rows, cols=cols, train=16, test=8,
                                                   seed=1)), directory / "data.npz")


@pytest.mark.parametrize("command", ["live", "infer"])
def test_a_globally_pooled_model_runs_on_the_grid_asked(tmp_path, command) -> None:
    model = _saved_model(tmp_path, "global")  # trained on 6 x 8
    data = _data_file(tmp_path, 4, 5)
    extra = ("--slots", "2", "--timed-slots", "2") if command == "live" else ()
    for run, asked in ((tmp_path / "flags", GRID), (tmp_path / "data", ("--data", data))):
        code, out, err = _meshdl("simulate", command, "--model", model, *asked, "--out", run,
                                 "--json", *extra)
        assert code == 0, err
        config = json.loads((run / "config.json").read_text())["model"]
        assert (config["rows"], config["cols"], config["pool"], config["filters"]) \
            == (4, 5, "global", 2)
        report = json.loads(out)
        cells = report["mesh"]["hottest_cell"] if command == "live" else \
            report["energy_j"]["max_node_cell"]
        assert cells in CELLS  # the figures are the 4 x 5 mesh's


@pytest.mark.parametrize("command", ["live", "infer"])
def test_a_windowed_model_on_another_grid_is_refused_before_any_run_directory(
        tmp_path, command) -> None:
    model = _saved_model(tmp_path, 2)  # fc1 reads the pooled blocks of 6 x 8
    data = _data_file(tmp_path, 4, 5)
    extra = ("--slots", "2") if command == "live" else ()
    for asked in (GRID, ("--data", data)):
        code, _, err = _meshdl("simulate", command, "--model", model, *asked, "--out",
                               tmp_path / "run", *extra)
        assert_one_line_error(code, err, 2, str(model), "6 x 8", "4 x 5")
        assert not (tmp_path / "run").exists()


def test_data_of_another_grid_than_the_flags_or_network_flags_a_model_lacks_are_refused(
        tmp_path) -> None:
    data = _data_file(tmp_path, 4, 5)
    code, _, err = _meshdl("simulate", "infer", "--data", data, "--rows", "6", "--out",
                           tmp_path / "run")
    assert_one_line_error(code, err, 2, str(data), "4 x 5", "6 x 5")
    model = _saved_model(tmp_path, "global")
    code, _, err = _meshdl("simulate", "infer", "--model", model, "--kernel", "5", "--out",
                           tmp_path / "run")
    assert_one_line_error(code, err, 2, "--kernel 5", "the model's: 3")
    assert not (tmp_path / "run").exists()
