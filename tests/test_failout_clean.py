"""Clean updates in failout (`[train] failout_clean`): a share of the updates with no cell
dead, drawn from the update's own stream, so that a run draws the same again, resumed or
not, and the mesh learns what the central model learns."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import TrainConfig, load_run_config
from meshdl.data.datasets import Dataset
from meshdl.training.failout import failout_cells
from meshdl.training.loop import train


def _maps(rows: int, cols: int, samples: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    X = rng.normal(21.0, 2.0, (samples, rows, cols)).astype(np.float32)
    y = rng.integers(0, 2, samples)
    return Dataset(X, y, X[: samples // 2], y[: samples // 2], {})


def test_a_share_of_the_updates_is_clean_and_the_same_for_the_same_update() -> None:
    draws = [failout_cells(17, 25, 0.05, 0, update, 0.25, clean=0.5) for update in range(400)]
    clean = sum(len(d) == 0 for d in draws)
    assert 150 < clean < 250  # about half of them
    assert all(round(0.05 * 425) <= len(d) <= round(0.25 * 425) for d in draws if len(d))
    for update in (0, 7, 399):
        np.testing.assert_array_equal(draws[update],
                                      failout_cells(17, 25, 0.05, 0, update, 0.25, clean=0.5))
    # Without it, the draws are a run's without the setting.
    np.testing.assert_array_equal(failout_cells(17, 25, 0.05, 3, 9, 0.25, clean=0.0),
                                  failout_cells(17, 25, 0.05, 3, 9, 0.25))
    assert TrainConfig().failout_clean == 0.0
    with pytest.raises(ValueError, match="failout_clean"):
        TrainConfig(failout=0.1, failout_clean=1.0)


def test_the_training_loop_draws_clean_updates_and_the_mesh_trains_as_centrally() -> None:
    data = _maps(4, 5, 24, 4)
    runs = {}
    for mode in ("mesh", "central"):
        config = load_run_config(mode=mode, data_grid=(4, 5),
                                 model={"pool": "global", "filters": 2, "hidden": 4},
                                 train={"epochs": 3, "batch": 8, "failout_clean": 0.5})
        assert config.train.failout_clean == 0.5
        runs[mode], _ = train(config, data)
    np.testing.assert_allclose(runs["mesh"].flat, runs["central"].flat, rtol=1e-4, atol=1e-5)
    # The setting changes the run: some updates lost their dead cells.
    plain = load_run_config(mode="central", data_grid=(4, 5),
                            model={"pool": "global", "filters": 2, "hidden": 4},
                            train={"epochs": 3, "batch": 8, "failout_clean": 0.0})
    model, _ = train(plain, data)
    assert not np.allclose(model.flat, runs["central"].flat)
