"""Mirror augmentation: mirrored maps keep their labels, every holder of readings builds
the same view, and an epoch still shows each original map exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig, TrainConfig
from meshdl.data.augment import ORIENTATIONS, mirrored, originals, training_data
from meshdl.data.datasets import label_maps
from meshdl.data.lounge import generate_lounge
from meshdl.errors import MeshdlError
from meshdl.training.loop import CentralEngine, batches, train


@pytest.fixture(scope="module")
def lounge():
    return generate_lounge(DataConfig(rows=6, cols=8, train=60, test=20, seed=2))


def test_mirror_images_keep_the_label_of_their_map(lounge) -> None:
    view = mirrored(lounge)
    n = len(lounge.y_train)
    assert view.X_train.shape == (ORIENTATIONS * n, 6, 8)
    np.testing.assert_array_equal(view.y_train, label_maps(view.X_train))
    np.testing.assert_array_equal(view.X_train[:n], lounge.X_train)  # originals first
    np.testing.assert_array_equal(view.X_train[n + 3, 0], lounge.X_train[3, -1])  # up-down
    np.testing.assert_array_equal(view.X_train[2 * n + 3, :, 0], lounge.X_train[3, :, -1])
    np.testing.assert_array_equal(view.X_train[3 * n + 3], lounge.X_train[3, ::-1, ::-1])
    assert view.X_test is lounge.X_test  # evaluation sees the maps as they are


def test_training_view_is_built_once_however_often_it_is_asked_for(lounge) -> None:
    mirror = TrainConfig(augment="mirror")
    view = training_data(mirror, lounge)
    assert training_data(mirror, view) is view  # an engine built on the view is not mirrored twice
    assert originals(view) == originals(lounge) == len(lounge.y_train)
    assert training_data(TrainConfig(augment="none"), lounge) is lounge


def test_an_epoch_shows_each_original_map_once_in_one_orientation() -> None:
    rng = np.random.default_rng(0)
    epoch = np.concatenate(batches(250, 100, rng, orientations=ORIENTATIONS))
    assert len(epoch) == 250 and epoch.max() < ORIENTATIONS * 250
    assert sorted((epoch % 250).tolist()) == list(range(250))
    assert len(set((epoch // 250).tolist())) == ORIENTATIONS  # every orientation drawn


def test_mesh_trains_on_mirrors_exactly_as_central_training(lounge) -> None:
    # The whole default recipe (mirrors, warm-up, cosine, clipping) through `train`.
    models = {}
    for mode in ("central", "mesh"):
        config = load_run_config(mode=mode, model={"rows": 6, "cols": 8, "hidden": 16},
                                 train={"epochs": 2, "batch": 16})
        assert config.train.augment == "mirror"
        models[mode], _ = train(config, lounge)
    np.testing.assert_allclose(models["mesh"].flat, models["central"].flat, rtol=1e-5,
                               atol=1e-6)


def test_an_engine_without_the_mirrors_is_refused_with_the_fix_named(lounge) -> None:
    config = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                             train={"epochs": 1, "batch": 16})
    with pytest.raises(MeshdlError, match=r"holds 60 training maps but this run trains on "
                       r"240 .*augment.training_data"):
        train(config, lounge, engine=CentralEngine(lounge))
    train(config, lounge, engine=CentralEngine(training_data(config.train, lounge)))
