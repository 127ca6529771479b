"""int8-static inference: the mesh computes what the central int8 emulation computes, to
the bit (each value quantized where it is made by its layer's calibrated scale), its
forward messages carry the codes alone, and forged codes or scales are refused."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.errors import UsageError
from meshdl.model.quantize import calibrate_scales, calibration_batch
from meshdl.protocol.activations import StaticCodes
from meshdl.protocol.messages import BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.mesh import MeshEngine
from tests.helpers import noise_dataset, normalized_model

SAMPLES = np.arange(4)


def _setup(pool, alive: bool = False, rows: int = 4, cols: int = 5
           ) -> tuple[CNN, Dataset]:
    config = ModelConfig(rows=rows, cols=cols, kernel=3, filters=3, hidden=8, pool=pool,
                         alive=alive)
    model = normalized_model(config)
    raw = noise_dataset(config, 24)
    X = model.with_alive(raw.X_train)  # the mask travels as the cell's second value
    data = Dataset(X, raw.y_train, X[:4], raw.y_train[:4], {})
    model.calibrate(data.X_train)
    return model, data


@pytest.mark.parametrize(("pool", "alive"), [(2, False), ("global", True), (3, True)],
                         ids=["windowed", "global", "windowed-3"])
@pytest.mark.parametrize("wire", [False, True], ids=["objects", "bytes"])
def test_the_mesh_equals_the_central_int8_emulation_to_the_bit(pool, alive, wire):
    model, data = _setup(pool, alive)
    engine = MeshEngine(data, activations="int8-static", wire=wire)
    mesh = engine.logits(model, "test", SAMPLES)
    central = model.forward(data.X_test[SAMPLES], quantized=True)
    assert np.array_equal(mesh, central)
    assert not np.array_equal(central, model.forward(data.X_test[SAMPLES]))  # quantized


def test_the_central_emulation_computes_on_whole_numbers_of_each_layers_scale():
    model, data = _setup("global", True)
    trace = model.forward_trace(model.to_batch_last(data.X_test), quantized=True)
    for layer, act in enumerate(trace.activations):
        codes = np.rint(act / model.act_scales[layer])
        assert np.array_equal(codes.astype(np.float32) * model.act_scales[layer], act)
        assert np.abs(codes).max() <= (32767 if layer == 0 else 255)
    assert np.array_equal(model.act_scales, calibrate_scales(model, data.X_train))


def test_calibration_holds_a_bounded_batch_and_its_scales_do_not_depend_on_it():
    model, data = _setup("global", True)
    assert np.array_equal(calibrate_scales(model, data.X_train, batch=1),
                          calibrate_scales(model, data.X_train, batch=1000))
    big = CNN(ModelConfig(rows=100, cols=100, filters=16, pool="global", alive=True))
    # 100 x 100 x 16 float32 activations a map: 1,000 maps at once were 640 MB a layer
    assert calibration_batch(big) * 100 * 100 * 16 * 4 <= 32 << 20
    assert calibration_batch(model) == 1000  # 4 x 5 x 3: far under the bound


def test_forward_messages_carry_the_codes_one_byte_an_activation_two_a_reading():
    model, data = _setup(2)
    plain = MeshEngine(data, wire=True)
    static = MeshEngine(data, wire=True, activations="int8-static")
    plain.logits(model, "test", SAMPLES)
    static.logits(model, "test", SAMPLES)
    a, b = plain.report()["classes"], static.report()["classes"]
    spec = static.spec_for(model)
    for name, per_value in (("halo/conv1", 2), ("halo/conv2", 1), ("pool", 1),
                            ("gather", 1)):
        assert a[name]["messages"] == b[name]["messages"]
        values = (a[name]["bytes"] - a[name]["messages"] * spec.overhead(Kind.HALO)) // 4
        # float32 -> codes: exactly 4 - per_value bytes fewer per value, headers alike
        assert a[name]["bytes"] - b[name]["bytes"] == values * (4 - per_value)
    # each PARAMS (one per tree link; the class counts BATCH too) carries one scale per
    # layer more: 3 float32
    links = model.config.rows * model.config.cols
    assert b["params"]["bytes"] - a["params"]["bytes"] == \
        links * 4 * (model.config.conv_layers + 1)


def test_a_halo_is_its_codes_and_decodes_to_the_senders_values():
    codec = StaticCodes(2)
    scales = np.array([0.001, 0.02, 0.03], np.float32)
    values = (np.arange(12, dtype=np.float32).reshape(2, 3, 2) * scales[1])
    payload = codec.encode(values, scales, Kind.HALO, 2)
    assert payload.dtype == np.uint8 and payload.size == 12
    assert np.array_equal(payload, np.arange(12, dtype=np.uint8))
    assert np.array_equal(codec.decode(payload, (2, 3, 2), scales, Kind.HALO, 2), values)
    readings = np.array([-32767, -1, 0, 5, 32767, 7], np.float32).reshape(1, 2, 3) * \
        scales[0]
    payload = codec.encode(readings, scales, Kind.HALO, 1)  # conv1's window: int16
    assert payload.size == 12
    assert np.array_equal(payload.view("<i2"), [-32767, -1, 0, 5, 32767, 7])
    forged = payload.copy()
    forged[:2] = np.array([-32768], "<i2").view(np.uint8)  # a code no node makes
    assert codec.decode(forged, (1, 2, 3), scales, Kind.HALO, 1) is None
    assert codec.decode(payload[:-1], (1, 2, 3), scales, Kind.HALO, 1) is None


def _params_message(engine, model):
    mesh = engine.mesh_for(model)
    return mesh, mesh.edge._params()


@pytest.mark.parametrize("scale", [0.0, -0.01, np.nan, np.inf])
def test_params_with_a_forged_activation_scale_are_refused(scale):
    from meshdl.nodes.agent import NodeMachine
    from meshdl.protocol.messages import EDGE, FLOAT32, make

    model, data = _setup(2)
    spec = MeshSpec(1, model.config, activations="int8-static")
    node = NodeMachine(spec, (0, 0), {0: data.X_train[:, :1, 0].astype(np.float32)})
    payload = spec.params_layout.pack(model.flat, model.norm_mean, model.norm_std,
                                      None, model.act_scales)
    ok = make(Kind.PARAMS, 1, 1, EDGE, (0, 0), payload)
    assert ok.header.dtype == FLOAT32
    forged = payload.copy()
    forged[spec.params_layout.act_scales.start + 1] = scale
    node.handle(make(Kind.PARAMS, 1, 1, EDGE, (0, 0), forged), 0.0)
    assert node.stats["rejected:bad_params"] == 1
    node.handle(ok, 0.0)
    assert node.stats["rejected:bad_params"] == 1


def test_a_float32_halo_is_refused_where_codes_are_expected():
    from meshdl.protocol.activations import read_activations
    from meshdl.protocol.messages import make

    codec = StaticCodes(2)
    values = np.zeros((1, 3, 2), np.float32)
    message = make(Kind.HALO, 1, 1, (0, 1), (0, 0), values, layer=2)
    assert read_activations(codec, message.header, message.payload, (1, 3, 2),
                            np.ones(3, np.float32)) is None
    coded = make(Kind.HALO, 1, 1, (0, 1), (0, 0), np.zeros(6, np.uint8), layer=2)
    assert coded.header.dtype == BYTES
    assert np.array_equal(read_activations(codec, coded.header, coded.payload, (1, 3, 2),
                                           np.ones(3, np.float32)), values)


def test_int8_static_is_inference_only():
    from meshdl.config import RunConfig
    from meshdl.training.loop import train

    model, data = _setup(2)
    config = RunConfig(model=model.config.model_dump(), mode="mesh",
                       mesh={"activations": "int8-static"})
    with pytest.raises(UsageError, match="inference only"):
        train(config, data)
    uncalibrated = normalized_model(model.config)
    engine = MeshEngine(data, activations="int8-static")
    with pytest.raises(UsageError, match="calibrate"):
        engine.logits(uncalibrated, "test", SAMPLES)


def test_a_saved_model_keeps_its_scales(tmp_path):
    model, _ = _setup("global", True)
    model.save(tmp_path / "model.npz")
    again = CNN.load(tmp_path / "model.npz")
    assert np.array_equal(again.act_scales, model.act_scales)


def test_a_nodes_own_readings_are_the_central_emulations_int16_input():
    """What a node computes on at its own cell (and sends its neighbours the codes of)
    is the central emulation's quantized input there, not its exact reading."""
    from meshdl.nodes.execute import start_input

    model, data = _setup("global", True)
    maps = data.X_test[SAMPLES]  # (B, 2, rows, cols): reading and alive mask
    central = model.forward_trace(model.to_batch_last(maps), quantized=True).activations[0]
    exact = model.to_batch_last(maps)
    for r, c in ((0, 0), (2, 3)):
        readings = np.ascontiguousarray(maps[:, :, r, c].T, np.float32)  # (channels, B)
        out = np.empty_like(readings)
        start_input(readings, SAMPLES.astype(np.int64), model.norm_mean, model.norm_std,
                    False, float(model.act_scales[0]), out)
        assert np.array_equal(out, central[:, r, c])
        assert not np.array_equal(out, exact[:, r, c])


def test_simulate_live_under_int8_static_alerts_as_the_int8_model_on_fewer_bytes(tmp_path):
    """The global head (alive mask, 16 filters): the slots' alerts are the central int8
    emulation's; halos and GATHER carry codes, the cloud 16-bit readings."""
    from tests.test_cli_live import _live

    runs = {a: _live(tmp_path / a, "--rows", "5", "--cols", "6", "--slots", "5",
                     "--pool", "global", "--activations", a)
            for a in ("float32", "int8-static")}
    for run in runs.values():
        assert run["alerts_equal_central"] is True
    plain, static = (runs[a]["mesh"]["bytes_per_slot_by_class"]
                     for a in ("float32", "int8-static"))
    for name in ("halo/conv1", "halo/conv2", "gather"):
        assert static[name] < plain[name]
    assert runs["int8-static"]["cloud"]["bytes_per_slot"] < \
        runs["float32"]["cloud"]["bytes_per_slot"]


def test_int8_static_inference_over_mqtt_equals_the_central_int8_emulation(mosquitto):
    """Node hosts and the edge through a real broker: the spec's activations say
    int8-static on both sides, PARAMS bring the scales, the logits are the emulation's."""
    from meshdl.config import load_run_config
    from meshdl.edge.remote import MqttEngine
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.nodes.serve import BackgroundNodeHost

    model, data = _setup("global", True)
    config = load_run_config(None, model=model.config.model_dump(),
                             mesh={"activations": "int8-static"})
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    with BackgroundNodeHost(config, cells, address, data):
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        try:
            logits = engine.logits(model, "test", SAMPLES)
        finally:
            engine.close()
    assert np.array_equal(logits, model.forward(data.X_test[SAMPLES], quantized=True))


def test_calibrate_writes_the_scales_and_evaluate_runs_the_int8_emulation(tmp_path):
    import json

    from meshdl.data.datasets import save_dataset
    from tests.test_cli_simulate import _meshdl

    model, data = _setup("global", True)
    model.act_scales = None  # a model trained before int8-static
    model.save(tmp_path / "model.npz")
    raw = Dataset(data.X_train[:, 0], data.y_train, data.X_test[:, 0], data.y_test, {})
    save_dataset(raw, tmp_path / "data.npz")
    code, _, err = _meshdl("evaluate", tmp_path / "model.npz", tmp_path / "data.npz",
                           "--int8-static")
    assert code == 2 and "calibrate" in err  # a usage error, in one line
    code, out, err = _meshdl("calibrate", tmp_path / "model.npz", tmp_path / "data.npz",
                             "--json")
    assert code == 0, err
    scales = json.loads(out)["scales"]
    assert np.allclose(scales, calibrate_scales(model, data.X_train))
    assert np.array_equal(CNN.load(tmp_path / "model.npz").act_scales,
                          np.array(scales, np.float32))
    code, out, err = _meshdl("evaluate", tmp_path / "model.npz", tmp_path / "data.npz",
                             "--int8-static", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["activations"] == "int8-static"
    model.act_scales = np.array(scales, np.float32)
    expected = np.mean(model.predict(data.X_test, quantized=True) == data.y_test)
    assert report["accuracy"] == pytest.approx(expected)


def test_int8_static_under_chaos_computes_what_a_clean_run_does():
    """Corrupted, duplicated, stale and shuffled messages on the wire: the waves that
    finish give the clean run's logits, the emulation's."""
    from meshdl.sim.faults.chaos import Chaos

    model, data = _setup(2)
    chaos = Chaos(seed=2, corrupt=0.3, duplicate=0.2, stale=0.1, shuffle=True)
    engine = MeshEngine(data, wire=True, chaos=chaos, activations="int8-static")
    logits = engine.logits(model, "test", SAMPLES)
    assert np.array_equal(logits, model.forward(data.X_test[SAMPLES], quantized=True))
    assert engine.report()["rejected"]["rejected:codec:checksum"] > 0  # it did corrupt


def test_infer_under_int8_static_predicts_alike_in_the_mesh_and_centrally(tmp_path):
    import json

    from meshdl.data.datasets import save_dataset
    from tests.test_cli_simulate import _meshdl

    model, data = _setup(2)
    model.save(tmp_path / "model.npz")
    save_dataset(data, tmp_path / "data.npz")
    reports = {}
    for mode in ("mesh", "central"):
        code, out, err = _meshdl("infer", tmp_path / "model.npz", tmp_path / "data.npz",
                                 "--mode", mode, "--activations", "int8-static",
                                 "--predictions", tmp_path / f"{mode}.csv", "--json")
        assert code == 0, err
        reports[mode] = json.loads(out)
    assert reports["mesh"]["activations"] == "int8-static"
    assert (tmp_path / "mesh.csv").read_text() == (tmp_path / "central.csv").read_text()
    expected = np.mean(model.predict(data.X_test, quantized=True) == data.y_test)
    assert reports["central"]["accuracy"] == pytest.approx(expected)


def test_the_emulations_conv_is_the_nodes_arithmetic_to_the_bit():
    """The central emulation convolves in the node's order (`compute.conv_relu`), so a
    value on a rounding boundary rounds alike on both sides; the planes' kernels
    (fastmath) may differ from it by an ulp."""
    from meshdl.model.kernels import conv_relu_node_order
    from meshdl.nodes.compute import conv_relu

    rng = np.random.default_rng(7)
    rows, cols, c, h, k, batch = 5, 6, 2, 4, 3, 7
    x = rng.normal(size=(c, rows, cols, batch)).astype(np.float32)
    weight = rng.normal(size=(h, c, k, k)).astype(np.float32)
    bias = rng.normal(size=h).astype(np.float32)
    # each cell's bias: the layer's plus a position bias, added as a node adds them
    position = rng.normal(size=(h, rows, cols)).astype(np.float32)
    cell_bias = bias[:, None, None] + position
    out = np.empty((h, rows, cols, batch), np.float32)
    conv_relu_node_order(x, weight, cell_bias, 1, out)
    for r in range(rows):
        for q in range(cols):
            window = [(i, j) for i in range(max(0, r - 1), min(rows, r + 2))
                      for j in range(max(0, q - 1), min(cols, q + 2))]
            values = np.stack([x[:, i, j] for i, j in window])  # (slots, c, batch)
            taps = np.array([(i - r + 1) * k + j - q + 1 for i, j in window], np.int64)
            cell = np.empty((h, batch), np.float32)
            conv_relu(values, np.arange(len(window), dtype=np.int64), taps,
                      weight.reshape(h, c, k * k), bias + position[:, r, q], cell)
            assert np.array_equal(cell, out[:, r, q])


def test_a_wide_global_head_equals_the_emulation_on_many_maps():
    """16 filters, 20 maps at once, on 9 x 11: the logits to the bit."""
    model, data = _setup("global", True, rows=9, cols=11)
    model = CNN(model.config.model_copy(update={"filters": 16}), seed=4)
    model.set_normalization(20.0, 3.0)
    model.calibrate(data.X_train)
    maps = Dataset(data.X_train, data.y_train, data.X_train[:20], data.y_train[:20], {})
    engine = MeshEngine(maps, activations="int8-static")
    assert np.array_equal(engine.logits(model, "test", np.arange(20)),
                          model.forward(maps.X_test, quantized=True))
