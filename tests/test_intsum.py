"""The in-network sum (intsum): Rice-coded whole numbers round-trip and nothing else is
read, the edge's scale reaches every node with PARAMS, the tree adds whole numbers
exactly, and the policy keeps the REDUCE all summed or not at all."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl import CNN, ModelConfig
from meshdl.compress.intsum import SumChannel, SumCodec, SumShare
from meshdl.compress.policy import CompressionPolicy, reduce_segments
from meshdl.data.datasets import Dataset
from meshdl.errors import CodecError, CodecReason, UsageError
from meshdl.protocol.messages import FLOAT32, Kind, make
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.mesh import MeshEngine
from meshdl.training.loop import CentralEngine
from tests.helpers import noise_dataset, normalized_model

CONFIG = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=8)
SEGMENTS = reduce_segments(CONFIG)
CODEC = SumCodec(SEGMENTS, (7, 3))


def _share(rng: np.random.Generator, cells: int, spread: float) -> SumShare:
    bound = np.concatenate([np.full(p.segment.size, p.levels * cells) for p in CODEC.parts])
    ints = np.clip(np.rint(rng.standard_normal(CODEC.size) * spread), -bound, bound)
    return SumShare(ints.astype(np.int32), rng.uniform(0, 2, len(CODEC.parts)).astype(
        np.float32))


@settings(max_examples=100, deadline=None)  # the first call compiles the kernels
@given(seed=st.integers(0, 2**16), cells=st.integers(1, 500),
       spread=st.sampled_from([0.0, 0.3, 2.0, 40.0, 1e4]))
def test_sums_round_trip_in_at_most_the_bytes_a_subtree_may_send(seed, cells, spread):
    share = _share(np.random.default_rng(seed), cells, spread)
    payload = CODEC.encode(share)
    assert payload.size <= CODEC.max_nbytes(cells)
    back = CODEC.decode(payload, cells)
    assert np.array_equal(back.ints, share.ints) and np.array_equal(back.peaks, share.peaks)


def test_sums_of_a_huge_subtree_still_fit_their_layer_code():
    codec = SumCodec((SEGMENTS[1],), (127,))
    cells = 1_000_000
    ints = np.full(codec.size, 127 * cells, np.int32)
    ints[::2] *= -1
    payload = codec.encode(SumShare(ints, np.zeros(1, np.float32)))
    assert payload.size <= codec.max_nbytes(cells)
    assert np.array_equal(codec.decode(payload, cells).ints, ints)


def test_mostly_zero_sums_take_about_a_bit_a_value():
    ints = np.zeros(CODEC.size, np.int32)
    ints[::10] = 1
    payload = CODEC.encode(SumShare(ints, np.ones(2, np.float32)))
    assert payload.size <= 2 * 7 + (CODEC.size * 1.2) / 8 + 2


@pytest.mark.parametrize("forge", ["beyond_bound", "trailing_byte", "padding_bit",
                                   "cut_short", "nan_peak", "negative_peak", "bad_p",
                                   "long_quotient"])
def test_a_forged_sum_is_refused(forge):
    rng = np.random.default_rng(3)
    share = _share(rng, 4, 2.0)
    payload = CODEC.encode(share).copy()
    cells = 4
    first = CODEC.parts[0].segment.size
    if forge == "beyond_bound":  # sums of 4 shares in 7 levels, read as of 1 cell
        share.ints[0] = 28
        payload, cells = CODEC.encode(share), 1
    elif forge == "trailing_byte":
        payload = np.concatenate([payload, np.zeros(1, np.uint8)])
    elif forge == "padding_bit":
        share.ints[:] = 0  # first layer: `first` zero bits, the rest of its byte padding
        payload = CODEC.encode(share).copy()
        assert first % 8
        payload[7 + first // 8] |= 0x80
    elif forge == "cut_short":
        payload = payload[:-1]
    elif forge == "nan_peak":
        payload[0:4] = np.array([np.nan], "<f4").view(np.uint8)
    elif forge == "negative_peak":
        payload[0:4] = np.array([-1.0], "<f4").view(np.uint8)
    elif forge == "bad_p":
        payload[4] = 32
    elif forge == "long_quotient":  # unary 1s far past any sum in bounds
        payload[7:] = 0xFF
    with pytest.raises(CodecError) as caught:
        CODEC.decode(payload, cells)
    assert caught.value.reason == CodecReason.BAD_COMPRESSED


def test_a_share_is_whole_numbers_of_the_scale_and_the_residual_keeps_the_rest():
    channel = SumChannel(CODEC)
    own = np.linspace(-1, 1, CODEC.size).astype(np.float32)
    first = channel.quantize(own, np.zeros(2, np.float32))  # no scale yet: all kept
    assert not first.ints.any() and np.array_equal(channel.residual, own)
    assert first.peaks[0] == pytest.approx(np.abs(own[CODEC.parts[0].values]).max())
    scales = first.peaks / np.array(CODEC.levels, np.float32)
    second = channel.quantize(np.zeros_like(own), scales)
    per_value = CODEC.per_value(scales)
    assert np.all(np.abs(second.ints) <= CODEC.per_value(np.array(CODEC.levels)))
    np.testing.assert_allclose(second.ints * per_value + channel.residual, own, atol=1e-6)
    assert np.all(np.abs(channel.residual) <= per_value / 2 + 1e-6)


def _data(samples: int = 24) -> Dataset:
    return noise_dataset(CONFIG, samples)


def _model() -> CNN:
    return normalized_model(CONFIG)


@pytest.mark.parametrize("wire", [False, True], ids=["objects", "bytes"])
def test_the_edge_sends_the_scales_it_learnt_and_gets_the_exact_sum_of_the_shares(wire):
    """Wave 1 has no scale: nothing comes and every node keeps its share. The peaks it
    brought give wave 2's scales, which every node reads from PARAMS; what the edge
    gets then is the exact sum of the nodes' whole numbers times the scale."""
    data, model = _data(), _model()
    engine = MeshEngine(data, wire=wire, compress="intsum:3")
    central = CentralEngine(data)
    spec = engine.spec_for(model)
    conv = spec.conv_size
    _, _, grads = engine.loss_and_grads(model, np.arange(4))
    assert not grads[:conv].any()
    nodes = [n for h in engine.mesh.hosts.values() for n in h.nodes.values()]
    peaks = np.max([[np.abs(n.sum_channel.residual[p.values]).max()
                     for p in spec.reduce_sum.parts] for n in nodes], axis=0)
    learnt = engine.mesh.edge.sum_scales.scales
    np.testing.assert_allclose(learnt, peaks / 3, rtol=1e-6)
    before = {n.cell: n.sum_channel.residual.copy() for n in nodes}
    grads = engine.loss_and_grads(model, np.arange(4, 8))[2].copy()  # the model's buffer
    for node in nodes:
        assert np.array_equal(node.wave.params_vector[node.layout.scales], learnt)
    exact = central.loss_and_grads(model, np.arange(4, 8))[2][:conv]
    sent = sum(before[n.cell].astype(np.float64) - n.sum_channel.residual for n in nodes)
    np.testing.assert_allclose(grads[:conv], sent + exact, rtol=1e-4, atol=1e-6)
    per_value = spec.reduce_sum.per_value(learnt)
    whole = grads[:conv] / np.where(per_value > 0, per_value, 1)
    np.testing.assert_allclose(whole, np.rint(whole), atol=1e-3)  # whole numbers


def test_a_node_refuses_params_whose_scales_are_not_finite_and_positive():
    data, model = _data(), _model()
    engine = MeshEngine(data, compress="intsum")
    engine.loss_and_grads(model, np.arange(4))
    spec = engine.spec_for(model)
    node = engine.mesh.nodes[(0, 0)]
    params = spec.params_layout.pack(model.flat, np.full(1, 20.0), np.full(1, 3.0),
                                     np.array([np.nan, 1.0]))
    message = make(Kind.PARAMS, spec.mesh_id, 9, spec.control_source((0, 0)), (0, 0), params)
    assert message.header.dtype == FLOAT32
    before = node.stats["rejected:bad_params"]
    node.handle(message, 0.0)
    assert node.stats["rejected:bad_params"] == before + 1


def test_a_sum_from_a_larger_subtree_than_its_sender_has_is_refused():
    spec = MeshSpec(1, CONFIG, compress="intsum:1")
    leaf = next(c for c, size in spec.topology.subtree_sizes.items() if size == 1)
    ints = np.zeros(spec.conv_size, np.int32)
    ints[0] = 2  # two shares' worth from a subtree of one
    payload = spec.reduce_sum.encode(SumShare(ints, np.zeros(2, np.float32)))
    message = make(Kind.REDUCE, 1, 1, leaf, spec.topology.parent[leaf], payload)
    with pytest.raises(CodecError):
        spec.read_reduce(message.header, message.payload)


def test_intsum_is_for_every_conv_layer_or_none_and_hylo_sums_the_reduce():
    with pytest.raises(UsageError, match="every conv layer"):
        CompressionPolicy.parse("conv1=intsum,conv2=int8", CONFIG)
    with pytest.raises(UsageError):
        CompressionPolicy.parse("fc1=intsum", CONFIG)
    with pytest.raises(UsageError):
        CompressionPolicy.parse("intsum:0", CONFIG)
    wide = ModelConfig(rows=4, cols=5, kernel=3, filters=64, conv_layers=2, hidden=8)
    with pytest.raises(UsageError, match="at most 16,000"):
        CompressionPolicy.parse("intsum", wide)  # conv2: 64 x 64 x 9 weights
    hylo = CompressionPolicy.parse("hylo:4", CONFIG)
    assert hylo.describe_reduce == {"conv1": "intsum:7", "conv2": "intsum:7"}
    assert hylo.describe["conv2"].startswith("ktopk")  # Hylo's rule: the PUSH
    lean = CompressionPolicy.parse("hylo:30", CONFIG)  # conv1 (20 values) kept dense
    assert lean.describe_reduce == {"conv1": "intsum:127", "conv2": "intsum:7"}
    assert CompressionPolicy.parse("hylo:100", CONFIG).describe_reduce == \
        {"conv1": "none", "conv2": "none"}  # nothing above the threshold: all dense
    assert MeshSpec(1, CONFIG, compress="intsum").reduce_codec is None
    assert MeshSpec(1, CONFIG, compress="intsum").params_size == \
        MeshSpec(1, CONFIG).params_size + 2
