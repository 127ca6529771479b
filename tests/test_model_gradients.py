"""The Numba model equals an independent float64 reference, and its gradients equal
finite differences of that reference to 1e-4 relative."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.model.cnn import views
from meshdl.training.failout import failout_cells
from tests import reference

CONFIGS = {
    "seed-batch-100": (ModelConfig(), 100),
    "seed-batch-1": (ModelConfig(), 1),
    "even-k4-uneven-grid": (ModelConfig(rows=7, cols=9, kernel=4, filters=3, hidden=16), 8),
    "even-k2-pool3": (ModelConfig(rows=8, cols=5, kernel=2, filters=2, pool=3, hidden=8), 5),
    "k5-two-channels": (ModelConfig(rows=6, cols=7, kernel=5, in_channels=2, filters=3,
                                    hidden=12, classes=3), 4),
    "three-conv-layers-pool1": (ModelConfig(rows=4, cols=6, kernel=3, conv_layers=3,
                                            filters=2, pool=1, hidden=10), 3),
    "one-by-one-grid": (ModelConfig(rows=1, cols=1, kernel=1, filters=2, hidden=4), 6),
    "one-row": (ModelConfig(rows=1, cols=7, kernel=3, filters=2, hidden=5), 2),
    "global-pool-seed": (ModelConfig(pool="global"), 100),
    "global-pool-k4-three-layers": (ModelConfig(rows=5, cols=7, kernel=4, conv_layers=3,
                                                filters=3, pool="global", hidden=9), 4),
    "global-pool-one-cell": (ModelConfig(rows=1, cols=1, kernel=1, filters=2, pool="global",
                                         hidden=4), 3),
}


def _problem(config: ModelConfig, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(batch, config.in_channels, config.rows, config.cols)).astype(np.float32)
    y = rng.integers(0, config.classes, batch)
    model = CNN(config, seed=seed + 1)
    return model, X, y


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_matches_float64_reference(name: str) -> None:
    config, batch = CONFIGS[name]
    model, X, y = _problem(config, batch)
    params64 = {k: v.astype(np.float64) for k, v in model.params.items()}
    expected = reference.logits(params64, config, X)
    np.testing.assert_allclose(model.forward(X), expected, rtol=1e-5, atol=1e-5)
    loss, _ = model.loss_and_grads(X, y)
    assert loss == pytest.approx(reference.loss(params64, config, X, y), rel=1e-5)


@pytest.mark.parametrize("name", ["seed-batch-100", "three-conv-layers-pool1",
                                  "global-pool-k4-three-layers"])
def test_failed_out_cells_give_the_reference_with_their_values_zeroed(name: str) -> None:
    config, batch = CONFIGS[name]
    model, X, y = _problem(config, batch)
    failout = failout_cells(config.rows, config.cols, 0.3, seed=4, update=0)
    dead = np.zeros((config.rows, config.cols), bool)
    dead.flat[failout] = True
    params64 = {k: v.astype(np.float64) for k, v in model.params.items()}
    loss, _ = model.gradient_pass(X, y, failout)
    assert loss == pytest.approx(reference.loss(params64, config, X, y, dead), rel=1e-5)
    _assert_finite_differences(model, config, X, y, dead)


@pytest.mark.parametrize("name", CONFIGS)
def test_gradients_match_finite_differences(name: str) -> None:
    config, batch = CONFIGS[name]
    model, X, y = _problem(config, batch)
    model.gradient_pass(X, y)
    _assert_finite_differences(model, config, X, y, None)


def _assert_finite_differences(model: CNN, config: ModelConfig, X: np.ndarray,
                               y: np.ndarray, dead: np.ndarray | None) -> None:
    """The gradient of the model's last pass against the reference's central
    differences, at a dozen picks per parameter."""
    grads = {name: g.copy() for name, g in views(model.grad_flat, model.shapes).items()}
    params64 = {k: v.astype(np.float64) for k, v in model.params.items()}
    rng = np.random.default_rng(7)
    eps = 1e-7  # small: fewer ReLU kinks crossed; float64 keeps round-off at ~1e-9
    for pname, value in params64.items():
        flat = value.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
        numeric = np.empty(len(picks))
        for n, j in enumerate(picks):
            saved = flat[j]
            flat[j] = saved + eps
            up = reference.loss(params64, config, X, y, dead)
            flat[j] = saved - eps
            down = reference.loss(params64, config, X, y, dead)
            flat[j] = saved
            numeric[n] = (up - down) / (2 * eps)
        analytic = grads[pname].reshape(-1)[picks].astype(np.float64)
        scale = max(np.linalg.norm(numeric), 1e-6)
        error = np.linalg.norm(analytic - numeric) / scale
        assert error < 1e-4, f"{pname}: relative error {error:.2e}"


def test_even_kernel_pads_bottom_right_as_pytorch() -> None:
    # A 2x2 kernel that only weighs the bottom-right tap reads the next row/column:
    # at the last row/column that neighbour is outside the grid and reads 0.
    config = ModelConfig(rows=3, cols=3, kernel=2, filters=1, conv_layers=1, pool=1, hidden=1)
    model = CNN(config)
    model.params["conv1.weight"][...] = [[[[0.0, 0.0], [0.0, 1.0]]]]
    model.params["conv1.bias"][...] = 0.0
    X = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3)
    trace = model.forward_trace(model.to_batch_last(X))
    out = trace.activations[1][0, :, :, 0]
    np.testing.assert_array_equal(out, [[5, 6, 0], [8, 9, 0], [0, 0, 0]])


def test_max_pool_covers_every_cell_in_ceil_mode() -> None:
    config = ModelConfig(rows=17, cols=25)
    assert config.pooled_shape == (9, 13)
    assert config.features == 5 * 9 * 13


def test_the_heads_backward_written_over_its_inputs_gives_the_same_bits() -> None:
    """The edge's memory plan: d(hidden) over hidden, d(pooled) over pooled."""
    config = ModelConfig(rows=6, cols=5, kernel=3, filters=3, hidden=7)
    rng = np.random.default_rng(3)
    pooled = rng.normal(size=(3, *config.pooled_shape, 9)).astype(np.float32)
    dlogits = rng.normal(size=(config.classes, 9)).astype(np.float32)
    figures = []
    for overwrite in (False, True):
        model = CNN(config, seed=1)
        trace = model.head_forward(pooled.copy())
        dpooled = model.head_backward(trace, dlogits, overwrite=overwrite)
        assert (dpooled is trace.pooled) == overwrite  # no new array when overwriting
        figures.append((dpooled.copy(), model.grad_flat.copy()))
    (plain, plain_grads), (reused, reused_grads) = figures
    np.testing.assert_array_equal(reused, plain)
    np.testing.assert_array_equal(reused_grads, plain_grads)
    assert (plain != 0).any()
