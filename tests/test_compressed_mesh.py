"""Compressed gradients in the mesh: the REDUCE re-compressed at every hop loses
nothing over a run (what reached the edge plus every node's residual is the exact
gradient sum), the ledger counts the bytes encoded, forged payloads are refused."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig, TrainConfig
from meshdl.compress.codec import Channel
from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset
from meshdl.errors import CodecError, CodecReason
from meshdl.model.optim import Optimizer
from meshdl.nodes.agent import NodeMachine
from meshdl.protocol.activations import (
    activation_bytes,
    activation_compressor,
    decode_activations,
    encode_activations,
)
from meshdl.protocol.messages import BYTES, EDGE, HEADER_BYTES, SERVER, Kind, make
from meshdl.protocol.parts import Part, part_codecs
from meshdl.protocol.payloads import Push
from meshdl.protocol.spec import MeshSpec
from meshdl.server.machine import ParameterServer
from meshdl.server.worker import Learnt, MeshWorker
from meshdl.sim.faults.chaos import Chaos
from meshdl.sim.mesh import MeshEngine
from meshdl.sync import Sync
from meshdl.training.loop import CentralEngine
from meshdl.training.parallel import train_parallel
from tests.helpers import noise_dataset, normalized_model

CONFIG = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=8)


def _data(samples: int = 24) -> Dataset:
    return noise_dataset(CONFIG, samples)


def _model() -> CNN:
    return normalized_model(CONFIG)


@pytest.mark.parametrize("spec", ["2bit", "int8", "topk:0.2", "ktopk", "powersgd",
                                  "conv1=randk:0.3,conv2=fp16", "intsum", "intsum:1"])
@pytest.mark.parametrize("wire", [False, True], ids=["objects", "bytes"])
def test_reduce_through_the_tree_loses_nothing_over_a_run(spec, wire):
    """Weights held still, 6 waves: the REDUCEs the edge decoded plus the residual every
    node keeps add up to the central conv gradients of the 6 batches."""
    data, model = _data(), _model()
    engine = MeshEngine(data, wire=wire, compress=spec)
    central = CentralEngine(data)
    conv = MeshSpec(1, CONFIG).conv_size
    received, exact = np.zeros(conv), np.zeros(conv)
    for step in range(6):
        indices = np.arange(4 * step, 4 * step + 4)
        _, _, grads = engine.loss_and_grads(model, indices)
        received += grads[:conv]
        exact += central.loss_and_grads(model, indices)[2][:conv]
    residuals = sum((node.reduce_channel or node.sum_channel).residual.astype(np.float64)
                    for node in _nodes(engine))
    np.testing.assert_allclose(received + residuals, exact, rtol=1e-4, atol=1e-5)
    assert not np.allclose(received, exact, atol=1e-6)  # it did compress


def _nodes(engine: MeshEngine) -> list[NodeMachine]:
    return [node for host in engine.mesh.hosts.values() for node in host.nodes.values()]


def test_the_ledger_counts_the_compressed_bytes_sent():
    data, model = _data(), _model()
    engine = MeshEngine(data, compress="2bit")
    engine.loss_and_grads(model, np.arange(4))
    spec = engine.spec_for(model)
    reduce = engine.report()["classes"]["reduce"]
    links = CONFIG.rows * CONFIG.cols  # one REDUCE per tree link, the edge's included
    assert reduce["messages"] == links
    assert reduce["bytes"] == links * (HEADER_BYTES + spec.reduce_codec.nbytes)
    assert spec.reduce_codec.nbytes < 4 * spec.conv_size / 8


def test_a_compressed_reduce_is_read_only_in_the_form_the_mesh_sends():
    spec = MeshSpec(1, CONFIG, compress="2bit")
    child = spec.topology.children[(0, 0)][0]
    codes = np.full(spec.reduce_codec.nbytes, 0xFF, np.uint8)  # code 11: never sent
    forged = make(Kind.REDUCE, 1, 1, child, (0, 0), codes)
    assert forged.header.dtype == BYTES
    with pytest.raises(CodecError) as caught:
        spec.read_reduce(forged.header, forged.payload)
    assert caught.value.reason == CodecReason.BAD_COMPRESSED
    plain = make(Kind.REDUCE, 1, 1, child, (0, 0), np.zeros(spec.conv_size, np.float32))
    assert spec.read_reduce(plain.header, plain.payload) is None  # float32: not this mesh's
    short = make(Kind.REDUCE, 1, 1, child, (0, 0), codes[:-1])
    assert spec.read_reduce(short.header, short.payload) is None
    uncompressed = MeshSpec(1, CONFIG)
    assert uncompressed.read_reduce(forged.header, forged.payload) is None


def test_a_compressed_mesh_under_chaos_trains_exactly_as_a_clean_one():
    """Duplicated, delayed, corrupted, truncated and stale copies change nothing: the
    compressed REDUCE is checked on receipt like every message, and error feedback
    only ever sees the one copy a node sums."""
    data = _data()
    results = []
    for chaos in (None, Chaos(seed=4, duplicate=0.2, corrupt=0.2, truncate=0.1, stale=0.1,
                              delay=0.2, shuffle=True)):
        model = _model()
        engine = MeshEngine(data, wire=True, chaos=chaos, compress="hylo:4")
        grads = [engine.loss_and_grads(model, np.arange(4 * s, 4 * s + 4))[2].copy()
                 for s in range(4)]
        results.append(grads)
        if chaos is not None:
            assert sum(v for k, v in engine.mesh.node_stats().items()
                       if k.startswith("rejected")) > 0
    for clean, chaotic in zip(*results, strict=True):
        assert np.array_equal(clean, chaotic)


# -- edge -> parameter server ----------------------------------------------------------

def test_compressed_pushes_lose_nothing_over_a_run_and_are_read_back():
    """What the server decodes from a worker's PUSHes plus the worker's residual is the
    sum of the gradients it learnt."""
    model = _model()
    codecs = part_codecs("hylo:4", CONFIG)
    channel = Channel(codecs[Part.WHOLE], seed=1)
    rng = np.random.default_rng(0)
    raw = np.zeros(model.flat.size)
    decoded = np.zeros(model.flat.size)
    for based_on in range(8):
        gradient = (rng.standard_normal(model.flat.size) * 0.01).astype(np.float32)
        raw += gradient
        payload = Push(based_on, 4, 3, 0.25, gradient).pack_compressed(channel)
        assert payload.nbytes == 16 + codecs[Part.WHOLE].nbytes
        push = Push.read_compressed(payload, codecs[Part.WHOLE])
        assert (push.based_on, push.samples, push.correct, push.loss) == (based_on, 4, 3,
                                                                           0.25)
        decoded += push.gradient
    np.testing.assert_allclose(decoded + channel.residual, raw, atol=2e-5)
    # A push with nothing to learn from leaves the residual alone.
    residual = channel.residual.copy()
    Push(8, 0, 0, 0.0, np.zeros(model.flat.size, np.float32)).pack_compressed(channel)
    assert np.array_equal(channel.residual, residual)


def test_the_server_refuses_a_forged_compressed_push_and_takes_a_real_one():
    model = _model()
    sync = Sync.parse("bsp")
    server = ParameterServer(model, Optimizer(TrainConfig(), model.flat.size), [1], sync,
                             lambda _: 0.1, compress="2bit")
    worker = MeshWorker(1, sync, _model(), compress="2bit")
    worker.assign([np.arange(4)])
    worker.begin()
    gradient = np.full(model.flat.size, 0.5, np.float32)
    real = worker.push(Learnt(3, 0.5, gradient))
    forged_payload = real.payload.copy()
    forged_payload[20] = 0xFF  # a 2-bit code 11
    forged = make(Kind.PUSH, 1, 1, EDGE, SERVER, forged_payload)
    assert server.handle(forged) == [] and server.version == 0
    assert server.stats["rejected:bad_compressed"] == 1
    plain = make(Kind.PUSH, 1, 1, EDGE, SERVER,
                 Push(0, 4, 3, 0.5, gradient).pack())  # float32: not this policy's form
    assert server.handle(plain) == [] and server.stats["rejected:bad_push"] == 1
    out = server.handle(real)
    assert server.version == 1 and out[0].kind == Kind.WEIGHTS


def test_several_compressed_meshes_train_and_count_the_bytes_they_push():
    data = _data(48)
    runs = {}
    for compress in ("none", "hylo:4"):
        config = RunConfig(model=CONFIG.model_dump(),
                           train={"epochs": 2, "batch": 4, "lr": 0.05},
                           parallel={"meshes": 2, "sync": "bsp"},
                           mesh={"compress": compress})
        model, history = train_parallel(config, data)
        assert np.all(np.isfinite(model.flat))
        runs[compress] = history.parallel["per_mesh"]
    codec = part_codecs("hylo:4", CONFIG)[Part.WHOLE]
    for plain, compressed in zip(runs["none"], runs["hylo:4"], strict=True):
        # Every PUSH weighs the header, the four head values and the encoded gradient.
        assert compressed["pushed_bytes"] == compressed["steps"] * (
            HEADER_BYTES + 16 + codec.nbytes)
        assert plain["pushed_bytes"] == plain["steps"] * (HEADER_BYTES + 4 * (4 + codec.size))
        assert compressed["mesh_bytes"] < plain["mesh_bytes"]


# -- lossy forward activations ---------------------------------------------------------

@pytest.mark.parametrize("activations", ["fp16", "int8"])
def test_lossy_activations_stay_close_to_exact_and_shrink_the_forward_classes(activations):
    data, exact_model, lossy_model = _data(), _model(), _model()
    exact = MeshEngine(data, wire=True)
    lossy = MeshEngine(data, wire=True, activations=activations)
    indices = np.arange(4)
    logits_exact = exact.loss_and_grads(exact_model, indices)[1]
    logits_lossy = lossy.loss_and_grads(lossy_model, indices)[1]
    tolerance = 2e-2 if activations == "int8" else 2e-3
    np.testing.assert_allclose(logits_lossy, logits_exact, rtol=tolerance, atol=tolerance)
    assert not np.array_equal(logits_lossy, logits_exact)
    plain, small = exact.report()["classes"], lossy.report()["classes"]
    for name in ("halo/conv1", "halo/conv2", "pool", "gather"):
        assert small[name]["messages"] == plain[name]["messages"]
        assert small[name]["bytes"] < plain[name]["bytes"]
    for name in ("scatter", "grad-halo/conv2", "reduce"):  # gradients stay float32
        assert small[name]["bytes"] == plain[name]["bytes"]


def test_int8_activations_under_chaos_compute_what_a_clean_int8_run_does():
    data = _data()
    runs = []
    for chaos in (None, Chaos(seed=2, corrupt=0.3, duplicate=0.2, stale=0.1, shuffle=True)):
        engine = MeshEngine(data, wire=True, chaos=chaos, activations="int8")
        runs.append(engine.loss_and_grads(_model(), np.arange(4))[2].copy())
    assert np.array_equal(*runs)


def test_activation_payloads_are_read_only_in_their_exact_form():
    compressor = activation_compressor("int8")
    values = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    payload = encode_activations(compressor, values)
    assert payload.size == activation_bytes(compressor, (2, 3, 4)) == 4 + 24
    np.testing.assert_allclose(decode_activations(compressor, payload, (2, 3, 4)), values,
                               atol=1 / 127)
    assert decode_activations(compressor, payload, (2, 3, 5)) is None
    assert decode_activations(compressor, payload.view(np.int8), (2, 3, 4)) is None
    forged = payload.copy()
    forged[10] = 0x80  # int8 -128: never sent
    with pytest.raises(CodecError):
        decode_activations(compressor, forged, (2, 3, 4))
    assert activation_compressor("float32") is None


def test_the_compression_benchmark_times_every_policy_against_the_plain_mesh():
    from meshdl.bench.compress import POLICIES, bench_compress

    # 4 filters: conv2 (148 values) above Hylo's threshold, so every policy compresses.
    config = RunConfig(model={**CONFIG.model_dump(), "filters": 4}, train={"batch": 4})
    result = bench_compress(config, _data(), waves=2)
    assert [row["policy"] for row in result["policies"]] == list(POLICIES)
    plain = result["policies"][0]
    assert plain["ratio_to_plain"] == 1.0 and plain["reduce_us"] is None
    for row in result["policies"][1:]:
        assert row["waves_wall_s"] > 0 and row["reduce_us"] > 0 and row["push_us"] > 0
