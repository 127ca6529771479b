"""PARAMS, BATCH and REDUCE layouts (meshdl/protocol/payloads.py): one definition for edge and
nodes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl import CNN, ModelConfig
from meshdl.protocol.payloads import BatchOrder, ParamsLayout


@settings(max_examples=20, deadline=None)
@given(kernel=st.integers(1, 4), filters=st.integers(1, 4), layers=st.integers(1, 3),
       channels=st.integers(1, 3))
def test_params_layout_finds_each_conv_tensor_of_the_model_in_pytorch_order(
        kernel, filters, layers, channels) -> None:
    config = ModelConfig(rows=5, cols=6, kernel=kernel, filters=filters, conv_layers=layers,
                         in_channels=channels, hidden=3)
    model = CNN(config, seed=1)
    model.set_normalization(np.arange(channels) + 20.0, np.arange(channels) + 2.0)
    layout = ParamsLayout.of(config)
    params = layout.pack(model.flat, model.norm_mean, model.norm_std)
    assert params.dtype == np.float32 and params.shape == (layout.size,)
    for layer, where in layout.layers.items():
        weight = model.params[f"conv{layer}.weight"]
        np.testing.assert_array_equal(params[where.weight].reshape(weight.shape), weight)
        np.testing.assert_array_equal(params[where.bias], model.params[f"conv{layer}.bias"])
        assert where.kernel_shape == (*weight.shape[:2], kernel * kernel)
    np.testing.assert_array_equal(params[layout.mean], model.norm_mean)
    np.testing.assert_array_equal(params[layout.std], model.norm_std)
    assert layout.conv_size == layout.mean.start


def test_a_batch_order_reads_back_what_was_packed() -> None:
    order = BatchOrder(1, 0, np.array([5, 3, 9], np.int32))
    payload = order.pack()
    assert payload.dtype == np.int32 and payload.tolist() == [1, 0, 5, 3, 9]
    mode, split, indices, failout = BatchOrder.read(payload)
    assert (mode, split, indices.tolist(), failout.tolist()) == (1, 0, [5, 3, 9], [])
    order = BatchOrder(0, 0, np.array([5, 3], np.int32), np.array([0, 7], np.int32))
    payload = order.pack()
    assert payload.tolist() == [0, 0, 5, 3, -1, -8]  # failout cells as -(n + 1)
    read = BatchOrder.read(payload)
    assert read.indices.tolist() == [5, 3] and read.failout.tolist() == [0, 7]
    assert read.valid_failout(8) and not read.valid_failout(7)
