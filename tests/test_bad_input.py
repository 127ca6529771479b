"""Hostile input (issue 29, items 3 and 4): labels that no class can hold are refused in
every mode and transport before a kernel reads them, and a replayed or synthetic reading
that no room can have is an error for its own slot, never a confident alert."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import load_run_config
from meshdl.data.datasets import Dataset, load_dataset, save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.edge.agent import EdgeMachine
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import serve
from meshdl.errors import DataError
from meshdl.model import kernels
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.live import LiveSampler
from meshdl.nodes.sensors import ReplaySensor, SyntheticSensor, read_with_retry
from meshdl.nodes.serve import BackgroundNodeHost, Readings
from meshdl.protocol.spec import MeshSpec, Split
from meshdl.training.loop import train
from tests.helpers import assert_one_line_error, retained_alert

ROWS, COLS = 4, 5
SUBPROCESS_TIMEOUT_S = 300  # a cold Numba cache compiles every kernel first
BAD_LABELS = [7, 2**40]  # one past the classes; far past any array


# --------------------------------------------------------------------------- item 3: labels


@pytest.fixture(scope="module")
def small_lounge() -> Dataset:
    """A 4 x 5 lounge, 36 training and 12 test maps."""
    from meshdl.config import DataConfig

    return generate_lounge(DataConfig(rows=ROWS, cols=COLS, train=36, test=12, seed=5))


def _with_label(ds: Dataset, key: str, label: int) -> Dataset:
    y = getattr(ds, key).copy()
    y[3] = label
    return replace(ds, **{key: y})


def _meshdl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`meshdl ARGS` in a process of its own: a crash (a segfault) is an exit code here,
    not the end of the test run."""
    return subprocess.run([sys.executable, "-m", "meshdl", *map(str, args)],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


@pytest.mark.parametrize("mode", ["mesh", "central"])
@pytest.mark.parametrize("label", BAD_LABELS, ids=["seven", "two-to-the-40"])
def test_train_refuses_a_label_beyond_the_classes_in_one_line(small_lounge, tmp_path, mode,
                                                              label) -> None:
    data = save_dataset(_with_label(small_lounge, "y_train", label), tmp_path / "bad.npz")
    run = tmp_path / "run"
    done = _meshdl("train", "--mode", mode, "--data", data, "--out", run, "--epochs", "1",
                   "--batch", "8", "--hidden", "8")
    assert_one_line_error(done.returncode, done.stderr, 1, str(data), "y_train", str(label),
                          "2 classes")
    assert not run.exists()  # nothing trained, no run directory begun


@pytest.mark.parametrize("label", BAD_LABELS, ids=["seven", "two-to-the-40"])
def test_evaluate_and_infer_refuse_a_label_beyond_the_classes(cli, small_lounge, tmp_path,
                                                              label) -> None:
    model = tmp_path / "model.npz"
    CNN(load_run_config(None, model={"rows": ROWS, "cols": COLS, "hidden": 8}).model
        ).save(model)
    data = save_dataset(_with_label(small_lounge, "y_test", label), tmp_path / "bad.npz")
    for args in (("evaluate", model, data), ("evaluate", model, data, "--split", "all"),
                 ("infer", model, data), ("infer", model, data, "--mode", "central")):
        code, _, err = cli(*args)
        assert_one_line_error(code, err, 1, str(data), "y_test", str(label), "2 classes")


@pytest.mark.parametrize("arrays, needle", [
    ({"y_train": np.array([0, -1] * 18)}, "negative"),
    ({"y_train": np.linspace(0, 1, 36)}, "float64"),
    ({"y_train": np.ones(36, bool)}, "bool"),
    ({"y_train": np.zeros(35, np.int64)}, "35 labels"),
], ids=["negative", "float", "bool", "wrong-length"])
def test_train_refuses_malformed_labels_in_one_line(cli, small_lounge, tmp_path, arrays,
                                                    needle) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **{"X_train": small_lounge.X_train, "y_train": small_lounge.y_train,
                      "X_test": small_lounge.X_test, "y_test": small_lounge.y_test, **arrays})
    code, _, err = cli("train", "--data", path, "--out", tmp_path / "run", "--epochs", "1")
    assert_one_line_error(code, err, 1, str(path), "y_train", needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", ["mesh", "central"])
@pytest.mark.parametrize("key", ["y_train", "y_test"])
def test_training_refuses_labels_beyond_the_classes_before_any_step(small_lounge, mode,
                                                                    key) -> None:
    config = load_run_config(None, mode=mode, model={"rows": ROWS, "cols": COLS,
                                                     "hidden": 8}, train={"epochs": 1})
    with pytest.raises(DataError, match=f"{key} holds 1 label"):
        train(config, _with_label(small_lounge, key, 7))


@pytest.mark.parametrize("label", [*BAD_LABELS, -1])
def test_the_mesh_edge_refuses_labels_beyond_the_classes(label) -> None:
    config = load_run_config(None, model={"rows": ROWS, "cols": COLS, "hidden": 8})
    labels = {Split.TRAIN: np.array([0, 1, label, 0]), Split.TEST: np.array([1, 0])}
    with pytest.raises(DataError, match="y_train holds 1 label"):
        EdgeMachine(MeshSpec(1, config.model), CNN(config.model), labels)


def test_the_mqtt_edge_refuses_bad_labels_before_connecting(small_lounge) -> None:
    """`meshdl edge run` trains through `training.train` with an `MqttEngine`: the
    labels are refused before the engine opens a connection (there is no broker here;
    a connection attempt would fail otherwise, after its timeout)."""
    config = load_run_config(None, model={"rows": ROWS, "cols": COLS, "hidden": 8},
                             train={"epochs": 1})
    data = _with_label(small_lounge, "y_train", 2**40)
    engine = MqttEngine.for_run(config, data, "mqtt://127.0.0.1:9", connect_timeout_s=1.0,
                                nodes_timeout=1.0)
    try:
        with pytest.raises(DataError, match="y_train holds 1 label"):
            train(config, data, engine=engine)
        assert engine.session is None
        with pytest.raises(DataError, match=r"y_train holds \d+ label"):  # its edge too
            engine.spec_for(CNN(config.model))
    finally:
        engine.close()


def _loss(labels: np.ndarray, logits: np.ndarray | None = None,
          dlogits: np.ndarray | None = None) -> float:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3) if logits is None else logits
    dlogits = np.empty_like(logits) if dlogits is None else dlogits
    return kernels.softmax_cross_entropy(logits, labels, dlogits)


@pytest.mark.parametrize("labels", [
    np.array([0, 2, 1]), np.array([0, -1, 1]), np.array([0, 1, 2**40]),
    np.array([0, 1, 2**63 + 5], np.uint64), np.array([0, 7, 1], np.int32),
    np.array([0.0, 1.0, 1.0]), np.array([0, 1]), np.array([[0, 1, 1]]),
], ids=["two", "negative", "two-to-the-40", "uint64-huge", "int32-seven", "float",
        "short", "2-d"])
def test_the_loss_kernel_refuses_labels_it_cannot_index(labels) -> None:
    with pytest.raises(ValueError, match="label"):
        _loss(labels)


def test_the_loss_kernel_refuses_a_gradient_buffer_of_another_shape() -> None:
    with pytest.raises(ValueError, match="dlogits"):
        _loss(np.array([0, 1, 1]), dlogits=np.empty((2, 2), np.float32))


def test_the_loss_kernel_gives_the_same_bits_for_any_integer_label_type() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 9)).astype(np.float32)
    labels = rng.integers(0, 2, 9)
    grads = [np.empty_like(logits) for _ in range(3)]
    losses = [kernels.softmax_cross_entropy(logits, labels.astype(t), g)
              for t, g in zip((np.int64, np.int32, np.uint8), grads, strict=True)]
    assert losses[0] == losses[1] == losses[2]
    assert all(np.array_equal(grads[0], g) for g in grads[1:])


# --------------------------------------------------------------------------- item 4: live


class Ring:
    """What `LiveSampler` needs of a node: where each slot's reading was recorded."""

    def __init__(self) -> None:
        self.recorded: dict[int, float | None] = {}

    def record(self, split: int, index: int, value: float | None) -> None:
        assert split == Split.LIVE
        self.recorded[index] = value


BAD_READINGS = [math.nan, math.inf, 3e38, -1e30]


def _replay_log(path: Path, slots: int, bad_cell: tuple[int, int],
                bad: dict[int, float]) -> np.ndarray:
    """A 2 x 2 log whose row t reads 20 + t/10 (+1 per cell); `bad` {row: value} at
    `bad_cell`. Saved as float64, so that 3e38 and -1e30 reach the log as written."""
    maps = 20.0 + np.arange(slots)[:, None, None] / 10.0 + np.arange(4).reshape(2, 2)
    for row, value in bad.items():
        maps[(row, *bad_cell)] = value
    np.savez(path, X=maps)
    return maps.astype(np.float32)


def _sampler(sensors: dict, slot_s: float = 0.02) -> tuple[LiveSampler, dict]:
    rings = {cell: Ring() for cell in sensors}
    sampler = LiveSampler(rings, sensors, slot_s=slot_s)
    sampler.timeout_s = 10.0  # a busy machine may make a read slow; these never hang
    return sampler, rings


def test_a_bad_replayed_reading_is_an_error_of_its_own_slot_and_shifts_nothing(
        tmp_path) -> None:
    bad_cell = (0, 1)
    bad = {1: math.nan, 2: math.inf, 4: 3e38, 5: -1e30}
    maps = _replay_log(tmp_path / "log.npz", 8, bad_cell, bad)
    cells = [(r, c) for r in range(2) for c in range(2)]
    sampler, rings = _sampler({c: ReplaySensor(tmp_path / "log.npz", c) for c in cells})
    first = 5_000  # a Unix-clock slot number: the replay starts at its first row
    for slot in range(first, first + 8):
        readings = asyncio.run(sampler.sample(slot))
        assert readings[bad_cell].ok == (slot - first not in bad)
    for cell in cells:
        for row in range(8):
            got = rings[cell].recorded[(first + row) % 64]
            if cell == bad_cell and row in bad:
                assert got is None, (cell, row, got)  # an error for that slot alone
            else:
                assert got == pytest.approx(float(maps[(row, *cell)])), (cell, row)
    assert sampler.stats == {"readings": 28, "failed_readings": 4}


@pytest.mark.parametrize("value", BAD_READINGS, ids=["nan", "inf", "3e38", "-1e30"])
def test_read_with_retry_reads_a_replayed_slot_once_however_it_fails(tmp_path,
                                                                      value) -> None:
    _replay_log(tmp_path / "log.npz", 3, (1, 1), {0: value})
    sensor = ReplaySensor(tmp_path / "log.npz", (1, 1))
    # A looping replay reads row (slot mod 3): slot 69 is row 0, the bad one.
    first = asyncio.run(read_with_retry(sensor, attempts=3, backoff_s=0.0, slot=69))
    assert not first.ok and first.value is None
    again = asyncio.run(read_with_retry(sensor, attempts=3, backoff_s=0.0, slot=69))
    assert again == first  # the same slot, the same error
    after = asyncio.run(read_with_retry(sensor, attempts=3, backoff_s=0.0, slot=70))
    assert after.ok and after.value == pytest.approx(23.1)  # row 1, not row 2


def test_a_skipped_slot_skips_its_row(tmp_path) -> None:
    maps = _replay_log(tmp_path / "log.npz", 5, (0, 0), {})
    sensor = ReplaySensor(tmp_path / "log.npz", (0, 0))
    assert sensor.read_slot(100) == pytest.approx(float(maps[0, 0, 0]))
    assert sensor.read_slot(103) == pytest.approx(float(maps[3, 0, 0]))
    assert sensor.read_slot(106) == pytest.approx(float(maps[1, 0, 0]))  # looped


def test_replay_range_is_the_room_range_unless_given(tmp_path) -> None:
    from meshdl.nodes.sensors import ValidRange

    _replay_log(tmp_path / "log.npz", 2, (0, 0), {0: 70.0})
    assert not asyncio.run(read_with_retry(ReplaySensor(tmp_path / "log.npz", (0, 0)),
                                           attempts=1, slot=0)).ok
    hot = ReplaySensor(tmp_path / "log.npz", (0, 0), valid_c=ValidRange(-30.0, 90.0))
    assert asyncio.run(read_with_retry(hot, attempts=1, slot=0)).value == 70.0


def test_synthetic_readings_stay_on_the_slot_clock_and_in_range() -> None:
    from meshdl.nodes.sensors import ValidRange

    plain = SyntheticSensor((1, 2), seed=4)
    expected = [plain.read() for _ in range(4)]
    slotted = SyntheticSensor((1, 2), seed=4)
    # Slot 900 read three times (retries, a late timed-out read), then 901 and 903.
    got = [slotted.read_slot(s) for s in (900, 900, 900, 901, 903)]
    assert got == [expected[0]] * 3 + [expected[1], expected[3]]
    assert slotted.read_slot(902) == expected[2]  # an earlier slot: the same value
    cold = SyntheticSensor((1, 2), seed=4, valid_c=ValidRange(-30.0, 0.0))
    reading = asyncio.run(read_with_retry(cold, attempts=3, backoff_s=0.0, slot=0))
    assert not reading.ok and "outside the sensor's range" in reading.error


@pytest.mark.parametrize("value", [3e38, -1e30, 126.0, math.nan])
def test_any_sensor_out_of_its_range_is_no_reading(value) -> None:
    class Glitchy:  # a driver of one's own, declaring no range
        def read(self) -> float:
            return value

    reading = asyncio.run(read_with_retry(Glitchy(), attempts=2, backoff_s=0.0))
    assert not reading.ok and reading.value is None


def test_live_inference_on_an_impossible_replayed_value_alerts_an_error(mosquitto,
                                                                        tmp_path) -> None:
    """Cell (1, 2) logs 3e38, -1e30, NaN or inf in every slot: whichever slot the edge
    serves, its alert is an error, never a probability."""
    rows, cols, slot_s = 3, 4, 1.0
    maps = 21.0 + 0.1 * np.arange(8 * rows * cols, dtype=np.float64).reshape(8, rows, cols)
    maps[:, 1, 2] = [3e38, -1e30, math.nan, math.inf] * 2
    log = tmp_path / "log.npz"
    np.savez(log, X=maps)
    config = load_run_config(None, model={"rows": rows, "cols": cols, "hidden": 6})
    model = CNN(config.model, seed=3)
    model.set_normalization(21.0, 2.0)
    cells = [(r, c) for r in range(rows) for c in range(cols)]
    address = BrokerAddress.parse(mosquitto.url)
    host = BackgroundNodeHost(config, cells, address, Readings(
        sensors={c: ReplaySensor(log, c) for c in cells}, slot_s=slot_s))
    host.sampler.timeout_s = 10 * slot_s
    with host:
        engine = MqttEngine(None, address, wave_timeout=slot_s / 2, max_attempts=1,
                            nodes_timeout=20)
        try:
            alerts = serve(engine, model, slot_s, slots=2)
        finally:
            engine.close()
    assert len(alerts) == 2
    for alert in alerts:
        assert "error" in alert and "probability" not in alert, alert
    assert set(host.sampler.last_errors) == {(1, 2)}  # the cell whose value is impossible
    retained = retained_alert(mosquitto.host, mosquitto.port)
    assert "error" in retained and "probability" not in retained


def test_a_dataset_round_trip_keeps_valid_labels(small_lounge, tmp_path) -> None:
    """The checks refuse nothing valid: a data set that trains loads as it was."""
    path = save_dataset(small_lounge, tmp_path / "ok.npz")
    loaded = load_dataset(path)
    loaded.require_classes(2)
    np.testing.assert_array_equal(loaded.y_train, small_lounge.y_train)


# ------------------------------ issue 43, item 10: names and sizes a request cannot have
@pytest.mark.parametrize(("name", "why"), [("bad name/#", "use a letter"),
                                           ("edge", "is taken"), ("ps", "is taken"),
                                           ("r0c0", "is taken"), ("bridge-1", "is taken")])
def test_a_node_host_name_no_host_may_have_is_a_usage_line(cli, tmp_path, name,
                                                           why) -> None:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(f"[model]\nrows = {ROWS}\ncols = {COLS}\n")
    code, _, err = cli("nodes", "run", "--cells", "all", "--broker", "mqtt://127.0.0.1:1",
                       "--mesh", mesh, "--name", name)
    assert_one_line_error(code, err, 2, "--name", repr(name), why)


def test_a_request_too_large_for_memory_is_a_usage_line(cli, tmp_path) -> None:
    code, _, err = cli("data", "generate", "--rows", "4096", "--cols", "4096", "--train",
                       "100000", "--out", tmp_path / "huge.npz")  # 12 TiB of maps
    assert_one_line_error(code, err, 2, "not enough memory", "TiB", "smaller grid")
    assert not (tmp_path / "huge.npz").exists()


def test_a_file_nested_too_deep_for_recursion_is_a_usage_line(cli, tmp_path) -> None:
    toml = tmp_path / "deep.toml"
    toml.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, _, err = cli("config", "show", "--config", toml)
    assert_one_line_error(code, err, 2, "too deeply nested", "recursion")


def test_a_data_sets_meta_nested_too_deep_is_the_files_fault(small_lounge,
                                                              tmp_path) -> None:
    path = save_dataset(replace(small_lounge, meta={}), tmp_path / "deep.npz")
    with np.load(path) as stored:
        arrays = {key: stored[key] for key in stored.files}
    arrays["meta"] = np.array("[" * 100_000 + "]" * 100_000)
    np.savez(path, **arrays)
    with pytest.raises(DataError, match="meta is JSON nested too deeply"):
        load_dataset(path)


@pytest.mark.parametrize("shortage", [MemoryError, RecursionError])
def test_a_service_short_of_memory_while_running_exits_1_for_its_restart(
        cli, tmp_path, monkeypatch, shortage) -> None:
    """A node host, node or edge service that runs short while serving (a Pi under a
    flood) exits 1, not the usage code 2 its systemd unit never restarts on
    (RestartPreventExitStatus=2)."""
    import meshdl.nodes.serve as node_serve

    def short(*_args, **_kwargs) -> None:
        raise shortage()

    monkeypatch.setattr(node_serve, "serve_cells", short)
    mesh = tmp_path / "mesh.toml"
    mesh.write_text("[model]\nrows = 2\ncols = 3\n")
    code, _, err = cli("nodes", "run", "--cells", "0-1,0-2", "--broker",
                       "mqtt://127.0.0.1:1", "--mesh", mesh, "--sensor", "synthetic")
    assert_one_line_error(code, err, 1, "while running", "starts it again")
