"""Compressors and error feedback: payloads of the announced size, round trips, strict
decoding, and error feedback that loses nothing over a run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.compress.codec import Channel, VectorCodec
from meshdl.compress.compressors import (
    COMPRESSORS,
    ChannelState,
    Int8,
    KernelTopK,
    Segment,
    TopK,
    TwoBit,
    parse_compressor,
)
from meshdl.compress.policy import CompressionPolicy, model_segments, reduce_segments
from meshdl.config import ModelConfig
from meshdl.errors import CodecError, CodecReason, UsageError

CONV = Segment("conv2", "conv", (5, 5, 3, 3), 5)
FC = Segment("fc1", "fc", (20, 30), 20)
SPECS = ["none", "fp16", "int8", "2bit", "2bit:0.05", "2bitmean:2.5", "ternary", "topk",
         "topk:0.1",
         "randk:0.2",
         "ktopk", "ktopk:0.5", "powersgd", "powersgd:2"]


def _values(seed: int, segment: Segment, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(segment.size) * scale
            ).astype(np.float32)


def _state(seed: int = 0) -> ChannelState:
    return ChannelState(np.random.default_rng(seed))


@pytest.mark.parametrize("spec, segment", [
    (spec, segment) for spec in SPECS for segment in (CONV, FC)
    if parse_compressor(spec).applies_to(segment)])
def test_every_payload_has_the_announced_size_and_decodes_to_the_segment(spec, segment):
    compressor = parse_compressor(spec)
    for seed in range(3):
        payload = compressor.encode(_values(seed, segment), segment, _state(seed))
        assert payload.dtype == np.uint8 and payload.size == compressor.nbytes(segment)
        decoded = compressor.decode(payload, segment)
        assert decoded.dtype == np.float32 and decoded.shape == (segment.size,)
        assert np.all(np.isfinite(decoded))


@given(st.lists(st.floats(-3, 3, width=32), min_size=1, max_size=70),
       st.floats(0.0625, 2, width=32))
def test_two_bit_round_trips_exactly_on_minus_tau_zero_plus_tau(picks, tau):
    segment = Segment("fc", "fc", (len(picks), 1), 0)
    tau = np.float32(tau)
    values = np.array([tau * np.sign(p) if abs(p) > 1 else 0.0 for p in picks], np.float32)
    compressor = TwoBit(float(tau))
    decoded = compressor.decode(compressor.encode(values, segment, _state()), segment)
    assert np.array_equal(decoded, values)


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "topk:1", "randk:1", "ktopk:1"])
def test_exact_cases_round_trip(spec):
    """Values a compressor represents exactly come back unchanged: dense float32,
    halves, multiples of the int8 scale, and top-k / random-k / kernel top-k keeping
    everything."""
    compressor = parse_compressor(spec)
    values = (np.arange(CONV.size, dtype=np.float32) - 100) / 8  # exact in fp16
    if spec == "int8":
        values = np.round(values / np.abs(values).max() * 127) * (np.abs(values).max() / 127)
        values = values.astype(np.float32)
    decoded = compressor.decode(compressor.encode(values, CONV, _state()), CONV)
    np.testing.assert_allclose(decoded, values, rtol=1e-6, atol=1e-6)


def test_powersgd_recovers_a_matrix_of_its_rank_after_warm_start():
    rng = np.random.default_rng(3)
    weight = np.outer(rng.standard_normal(20), rng.standard_normal(30))
    values = np.concatenate([weight.reshape(-1), rng.standard_normal(20)]).astype(np.float32)
    compressor, state = parse_compressor("powersgd:1"), _state()
    for _ in range(2):  # the first step starts from a random Q
        decoded = compressor.decode(compressor.encode(values, FC, state), FC)
    np.testing.assert_allclose(decoded, values, rtol=1e-4, atol=1e-4)


def test_top_k_keeps_the_largest_and_kernel_top_k_the_strongest_kernels():
    values = np.zeros(CONV.size, np.float32)
    values[[7, 100, 200]] = [5.0, -9.0, 3.0]
    decoded = TopK(3 / CONV.size).decode(TopK(3 / CONV.size).encode(values, CONV, _state()),
                                          CONV)
    assert np.array_equal(decoded, values)
    kernels = np.zeros((25, 9), np.float32)
    kernels[4] = 1.0
    kernels[17] = -2.0
    kernels[9, 0] = 0.5
    values = np.concatenate([kernels.reshape(-1), np.arange(5, dtype=np.float32)])
    compressor = KernelTopK(2 / 25)
    decoded = compressor.decode(compressor.encode(values, CONV, _state()), CONV)
    expected = values.copy()
    expected[9 * 9] = 0.0  # the weakest kernel waits; the bias always goes
    assert np.array_equal(decoded, expected)


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "none"])
def test_error_feedback_loses_nothing_over_a_run(spec):
    """Sum of what was sent (decoded) plus the final residual = sum of the raw
    gradients, for every compressor."""
    segments = (CONV, FC) if parse_compressor(spec).applies_to(FC) else (CONV,)
    codec = VectorCodec(segments, tuple(parse_compressor(spec) for _ in segments))
    channel = Channel(codec, seed=5)
    raw_sum = np.zeros(codec.size, np.float64)
    sent_sum = np.zeros(codec.size, np.float64)
    for step in range(40):
        gradient = (np.random.default_rng(step).standard_normal(codec.size) * 0.01
                    ).astype(np.float32)
        raw_sum += gradient
        sent_sum += codec.decode(channel.send(gradient))
    np.testing.assert_allclose(sent_sum + channel.residual, raw_sum, rtol=0, atol=2e-5)
    assert channel.sent == 40


def _corrupt_cases(compressor, segment):
    good = compressor.encode(_values(1, segment), segment, _state())
    yield "short", good[:-1]
    yield "long", np.concatenate([good, np.zeros(1, np.uint8)])
    yield "wrong dtype", good.view(np.int8)
    name = compressor.name
    if name in ("int8", "2bit", "2bitmean", "ternary"):
        bad = good.copy()
        bad[:4] = np.frombuffer(np.array([np.nan], "<f4").tobytes(), np.uint8)
        yield "nan scale", bad
    if name == "int8":
        bad = good.copy()
        bad[4] = 0x80
        yield "code -128", bad
    if name in ("2bit", "2bitmean", "ternary"):
        bad = good.copy()
        bad[4] = 0xFF
        yield "code 11", bad
    if name in ("topk", "randk", "ktopk"):
        bad = good.copy()
        bad[0:2] = 0xFF
        yield "index out of range", bad
        bad = good.copy()
        bad[2:4] = bad[0:2]
        yield "repeated index", bad
    if name in ("none", "fp16", "powersgd"):
        bad = good.copy()
        bad[-2:] = [0x00, 0x7C] if name == "fp16" else [0xC0, 0x7F]
        yield "non-finite value", bad


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "2bit", "2bitmean", "ternary",
                                  "topk", "randk", "ktopk", "powersgd"])
def test_decoding_refuses_what_no_encoder_sends(spec):
    compressor = parse_compressor(spec)
    for what, data in _corrupt_cases(compressor, CONV):
        with pytest.raises(CodecError) as caught:
            compressor.decode(data, CONV)
        assert caught.value.reason == CodecReason.BAD_COMPRESSED, what


@settings(max_examples=200)
@given(st.sampled_from(["fp16", "int8", "2bit", "topk", "randk", "ktopk", "powersgd"]),
       st.binary(min_size=0, max_size=400))
def test_random_bytes_either_decode_to_finite_values_or_are_refused(spec, data):
    compressor = parse_compressor(spec)
    payload = np.frombuffer(data, np.uint8)
    try:
        decoded = compressor.decode(payload, CONV)
    except CodecError as exc:
        assert exc.reason == CodecReason.BAD_COMPRESSED
    else:
        assert decoded.shape == (CONV.size,) and np.all(np.isfinite(decoded))


def test_int8_and_two_bit_scale_zero_gradients_to_zero():
    zeros = np.zeros(FC.size, np.float32)
    for compressor in (Int8(), TwoBit()):
        assert not np.any(compressor.decode(compressor.encode(zeros, FC, _state()), FC))


def test_hylos_adaptive_threshold_is_the_mean_magnitude_times_its_factor():
    values = _values(3, FC)
    mean = np.float32(np.mean(np.abs(values)))
    assert parse_compressor("2bit").threshold(values) == mean
    assert parse_compressor("2bitmean").threshold(values) == mean
    assert parse_compressor("2bitmean:2.5").threshold(values) == np.float32(2.5 * mean)
    payload = parse_compressor("2bitmean:2.5").encode(values, FC, _state())
    decoded = np.unique(parse_compressor("2bitmean:2.5").decode(payload, FC))
    assert decoded.tolist() == [-np.float32(2.5 * mean), 0.0, np.float32(2.5 * mean)]


def test_every_registered_compressor_parses_by_name():
    assert {parse_compressor(name).name for name in COMPRESSORS} == set(COMPRESSORS)


@pytest.mark.parametrize("spec, says", [
    ("zip", "unknown compressor"), ("topk:2", "density"), ("topk:x", "not a number"),
    ("powersgd:1.5", "whole rank"), ("none:3", "takes no argument"),
    ("2bit:-1", "threshold"), ("2bitmean:0", "factor")])
def test_impossible_compressors_are_named_errors(spec, says):
    with pytest.raises(UsageError, match=says):
        parse_compressor(spec)


def test_policies_choose_per_layer():
    model = ModelConfig()
    hylo = CompressionPolicy.parse("hylo", model)
    # Above 64 parameters: conv layers send 64 values' worth of kernels (conv1, 50
    # values, goes dense; 6 of conv2's 25 kernels), fc layers 2 bits a value with
    # tau = 2 x mean |x|.
    assert hylo.describe == {"conv1": "none", "conv2": "ktopk:0.24", "fc1": "2bitmean:2",
                             "fc2": "2bitmean:2"}
    assert CompressionPolicy.parse("hylo:16", model).describe["conv2"] == "ktopk:0.04"
    scaled = CompressionPolicy.parse("hylo:64:2.5", model).describe  # tau = 2.5 mean |x|
    assert scaled == {**hylo.describe, "fc1": "2bitmean:2.5", "fc2": "2bitmean:2.5"}
    for bad in ("hylo:x", "hylo:64:0", "hylo:64:x"):
        with pytest.raises(UsageError):
            CompressionPolicy.parse(bad, model)
    assert CompressionPolicy.parse("hylo:100", model).describe["conv1"] == "none"
    assert CompressionPolicy.parse("hylo:100", model).describe["conv2"] == "ktopk:0.4"
    uniform = CompressionPolicy.parse("ktopk", model).describe
    assert uniform == {"conv1": "ktopk", "conv2": "ktopk", "fc1": "none", "fc2": "none"}
    per_layer = CompressionPolicy.parse("conv2=int8,fc1=powersgd:2", model).describe
    assert per_layer == {"conv1": "none", "conv2": "int8", "fc1": "powersgd:2",
                         "fc2": "none"}
    assert not CompressionPolicy.parse("none", model).active
    with pytest.raises(UsageError, match="does not apply"):
        CompressionPolicy.parse("fc1=ktopk", model)
    with pytest.raises(UsageError, match="no layer"):
        CompressionPolicy.parse("conv9=int8", model)
    assert [s.name for s in reduce_segments(model)] == ["conv1", "conv2"]
    assert sum(s.size for s in model_segments(model)) == 117_882


def test_ternary_is_unbiased_over_many_draws():
    """TernGrad's stochastic rounding: the mean of many decodings is the input."""
    from meshdl.compress.compressors import Ternary

    values = np.linspace(-1.0, 0.5, FC.size).astype(np.float32)
    state, compressor = _state(3), Ternary()
    mean = np.mean([compressor.compress(values, FC, state)[1] for _ in range(4000)], axis=0)
    np.testing.assert_allclose(mean, values, atol=0.06)
