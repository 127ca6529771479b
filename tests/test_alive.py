"""A head that knows which cells are gone: the alive mask is one more input channel, 1 at
a live cell and zeroed with the rest of a dead cell's input, never normalized; the mesh
computes with it what the central model computes, dead cells and all."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.config import TrainConfig, load_run_config
from meshdl.data.augment import training_data, with_alive
from meshdl.data.datasets import Dataset
from meshdl.sim.mesh import MeshEngine
from meshdl.training.failout import failout_cells
from meshdl.training.loop import CentralEngine, normalization, train


def _maps(rows: int, cols: int, samples: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    X = rng.normal(21.0, 2.0, (samples, rows, cols)).astype(np.float32)
    y = rng.integers(0, 2, samples)
    return Dataset(X, y, X[: samples // 2], y[: samples // 2], {})


def test_the_alive_mask_is_an_input_channel_of_its_own_never_normalized() -> None:
    config = ModelConfig(rows=4, cols=5, pool="global", alive=True, filters=2, hidden=3)
    assert (config.in_channels, config.readings) == (2, 1)  # one reading, then the mask
    model = CNN(config)
    model.set_normalization(20.0, 4.0)
    assert model.norm_mean.tolist() == [20.0, 0.0] and model.norm_std.tolist() == [4.0, 1.0]
    X = np.full((3, 4, 5), 24.0, np.float32)
    x = model.to_batch_last(X)  # the readings alone get the mask
    assert x.shape == (2, 4, 5, 3)
    assert np.all(x[0] == 1.0) and np.all(x[1] == 1.0)  # (24 - 20) / 4, and a live 1
    np.testing.assert_array_equal(model.to_batch_last(with_alive(_maps(4, 5, 6, 0)).X_train),
                                  model.to_batch_last(_maps(4, 5, 6, 0).X_train))
    with pytest.raises(ValueError, match="alive"):
        ModelConfig(alive=True, in_channels=1)


def test_a_dead_cell_reads_zero_in_its_mask_too() -> None:
    """Failout zeroes a dead cell's whole input, so the model sees its mask at 0: a dead
    cell is not a cell at the readings' mean."""
    config = ModelConfig(rows=3, cols=4, pool="global", alive=True, filters=2, hidden=3)
    model = CNN(config, seed=1)
    model.set_normalization(20.0, 2.0)
    x = model.to_batch_last(_maps(3, 4, 2, 1).X_train)
    model.forward_trace(x, np.array([5], np.int32))
    assert np.all(x[:, 1, 1] == 0.0)  # cell 5 = (1, 1): reading and mask
    assert np.all(x[1, 0, 0] == 1.0)


def test_the_alive_head_trains_in_the_mesh_as_centrally_with_the_same_dead_cells() -> None:
    """Step by step, each with its own draw of dead cells (a share between 5 and 30 %):
    the mesh's loss, logits and gradients are the central model's to float32 rounding
    (the mesh sums in another order), on the readings with the mask each node holds."""
    config = ModelConfig(rows=5, cols=6, pool="global", alive=True, filters=3, hidden=4)
    data = _maps(5, 6, 40, 2)
    view = training_data(TrainConfig(augment="none"), data, config)
    assert view.X_train.shape == (40, 2, 5, 6) and np.all(view.X_train[:, 1] == 1.0)
    mesh_engine, central = MeshEngine(view, edge_at=(0, 0)), CentralEngine(data)
    model = CNN(config, seed=3)
    model.set_normalization(*normalization(view.X_train, alive=True))
    dead_counts = set()
    for step in range(5):
        batch = np.arange(step * 8, (step + 1) * 8)
        dead = failout_cells(5, 6, 0.05, 7, step, 0.3)
        dead_counts.add(len(dead))
        loss_m, logits_m, grads_m = (np.copy(v) for v in
                                     mesh_engine.loss_and_grads(model, batch, dead))
        loss_c, logits_c, grads_c = central.loss_and_grads(model, batch, dead)
        np.testing.assert_allclose(loss_m, loss_c, rtol=1e-5)
        np.testing.assert_allclose(logits_m, logits_c, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads_m, grads_c, rtol=1e-4, atol=1e-6)
        model.flat -= 0.1 * grads_c
    assert len(dead_counts) > 1  # the share is drawn anew for each update
    np.testing.assert_allclose(mesh_engine.logits(model, "test", np.arange(20)),
                               central.logits(model, "test", np.arange(20)),
                               rtol=1e-4, atol=1e-5)


def test_a_run_of_the_global_recipe_in_the_mesh_ends_as_the_central_run() -> None:
    """The training loop gives the mesh the readings with the mask (and the failout
    range of the recipe): the two runs end with the same model to float32 rounding."""
    data = _maps(4, 5, 24, 4)
    runs = {}
    for mode in ("mesh", "central"):
        config = load_run_config(mode=mode, data_grid=(4, 5),
                                 model={"pool": "global", "filters": 2, "hidden": 4},
                                 train={"epochs": 2, "batch": 8})
        assert config.model.alive and config.train.failout_max
        runs[mode], _ = train(config, data)
    np.testing.assert_allclose(runs["mesh"].flat, runs["central"].flat, rtol=1e-4, atol=1e-5)
    assert runs["mesh"].norm_mean[-1] == 0.0 and runs["mesh"].norm_std[-1] == 1.0


def test_a_failout_range_draws_a_share_for_each_update_and_one_share_draws_as_before() -> None:
    counts = {len(failout_cells(17, 25, 0.05, 0, update, 0.25)) for update in range(50)}
    assert min(counts) >= round(0.05 * 425) and max(counts) <= round(0.25 * 425)
    assert len(counts) > 10
    np.testing.assert_array_equal(failout_cells(17, 25, 0.1, 3, 9, None),
                                  failout_cells(17, 25, 0.1, 3, 9, 0.1))
    with pytest.raises(ValueError, match="failout_max"):
        TrainConfig(failout=0.2, failout_max=0.1)

