"""A node's small kernels (pooling, max routing, ReLU backward, input normalization) give
numpy's results, NaN and ties included: the mesh must equal the central model. And
`warm_up` compiles every kernel signature a wave uses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.nodes import compute

# Few distinct values, so that ties and NaNs are common.
VALUES = st.sampled_from([np.nan, -1.0, 0.0, 0.5, 2.0])


@st.composite
def blocks(draw) -> np.ndarray:
    cells, filters, batch = draw(st.integers(1, 9)), draw(st.integers(1, 3)), \
        draw(st.integers(1, 4))
    flat = draw(st.lists(VALUES, min_size=cells * filters * batch,
                         max_size=cells * filters * batch))
    return np.array(flat, np.float32).reshape(cells, filters, batch)


@settings(max_examples=200, deadline=None)
@given(block=blocks(), extra=st.integers(0, 3))
def test_max_pool_equals_numpy_max_and_first_argmax(block: np.ndarray, extra: int) -> None:
    # The block's cells sit at scattered slots of a larger field buffer.
    slots = np.arange(len(block), dtype=np.intp) * (extra + 1)
    buffer = np.full((slots[-1] + 1, *block.shape[1:]), 7.0, np.float32)
    buffer[slots] = block
    out = np.empty(block.shape[1:], np.float32)
    winners = np.empty(block.shape[1:], np.intp)
    compute.max_pool(buffer, slots, out, winners)
    np.testing.assert_array_equal(out, block.max(axis=0))
    np.testing.assert_array_equal(winners, block.argmax(axis=0))


@settings(max_examples=100, deadline=None)
@given(block=blocks())
def test_route_max_gives_each_cell_the_gradient_where_it_won(block: np.ndarray) -> None:
    winners = block.argmax(axis=0)
    grad = np.arange(winners.size, dtype=np.float32).reshape(winners.shape) + 1
    slots = np.arange(len(block), dtype=np.intp)[::-1].copy()
    out = np.full(block.shape, -5.0, np.float32)
    compute.route_max(grad, winners, slots, out)
    for t, slot in enumerate(slots):
        np.testing.assert_array_equal(out[slot], np.where(winners == t, grad, 0))


def test_relu_backward_gives_zero_where_the_relu_was_off_even_for_nan() -> None:
    activation = np.array([[0.0, 1.0, -2.0, 3.0]], np.float32)
    grad = np.array([[np.nan, np.nan, 5.0, 6.0]], np.float32)
    out = np.empty_like(grad)
    compute.relu_backward(activation, grad, out)
    np.testing.assert_array_equal(out, [[0.0, np.nan, 0.0, 6.0]])


def test_normalize_equals_numpy_in_float32() -> None:
    rng = np.random.default_rng(0)
    readings = rng.normal(20, 3, (2, 50)).astype(np.float32)
    indices = np.array([4, 0, 49, 4], np.int32)
    mean, std = np.float32([19.5, 21.0]), np.float32([2.5, 3.5])
    out = np.empty((2, 4), np.float32)
    compute.normalize(readings, indices, mean, std, out)
    np.testing.assert_array_equal(out, (readings[:, indices] - mean[:, None]) / std[:, None])


WAVES_AFTER_WARM_UP = """
import numpy as np
from numba.core.dispatcher import Dispatcher
from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.nodes import compute
from meshdl.sim.mesh import MeshEngine

compute.warm_up()
kernels = [k for k in vars(compute).values() if isinstance(k, Dispatcher)]
before = {k.__name__: set(k.signatures) for k in kernels}
config = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=4, conv_layers=2)
rng = np.random.default_rng(1)
X = rng.normal(20, 3, (6, 4, 5)).astype(np.float32)
y = rng.integers(0, 2, 6)
model = CNN(config, seed=0)
model.set_normalization(20.0, 3.0)
for wire in (False, True):
    engine = MeshEngine(Dataset(X, y, X, y, {}), wire=wire)
    engine.loss_and_grads(model, np.arange(4))
    engine.logits(model, "test", np.arange(6))
    engine.close()
new = {k.__name__: set(k.signatures) - before[k.__name__] for k in kernels}
print({name: [str(s) for s in sigs] for name, sigs in new.items() if sigs})
"""


def test_warm_up_compiles_every_signature_a_wave_uses() -> None:
    """A live slot's wave must not wait for Numba: after `warm_up`, training and
    inference waves (messages as objects or decoded from bytes) need no new kernel
    signature. In a fresh process, since signatures are per process."""
    run = subprocess.run([sys.executable, "-c", WAVES_AFTER_WARM_UP], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "{}", f"compiled during the waves: {run.stdout}"
