"""What a live run holds in memory (issue 46 item 4: 100 x 100 in 1.5 GB). The lounge
adds its sensor offsets and noise in place and makes its maps in float32 directly, so
it holds about three float64 maps' worth (its base, gradients and anomalies), not six
and a half; its test maps are their own array, not a view keeping every map of the
lounge; `simulate live` hands the run the test maps alone (the training maps made the
model's normalization and go); and a live run works out central inference and the
cloud before it builds the mesh, so what they used is free before the mesh takes the
most of the run's memory. The values are the same (the data sets by digest, the live
runs' sim.json by bytes: checked when the change was made)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import DataConfig, load_run_config
from meshdl.data import lounge
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies import live
from tests.helpers import normalized_model
from tests.test_cli_simulate import _meshdl


@pytest.mark.parametrize(("rows", "cols", "train", "test"),
                         [(24, 30, 600, 200), (40, 40, 300, 100)])
def test_the_lounge_holds_its_three_working_maps_and_float32_ones_at_most(
        rows: int, cols: int, train: int, test: int) -> None:
    """Base, gradients and anomalies in float64, the maps in float32 and the stuck
    sensors' mask: 3.7-3.9 maps of float64 here (6.6 before the change)."""
    lounge.generate_lounge(DataConfig(rows=3, cols=3, train=4, test=2))  # compiled
    cfg = DataConfig(rows=rows, cols=cols, train=train, test=test)
    tracemalloc.start()
    try:
        data = lounge.generate_lounge(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_map = (cfg.train + cfg.test) * cfg.rows * cfg.cols * np.dtype(np.float64).itemsize
    assert peak < 4.5 * one_map
    assert data.X_train.dtype == data.X_test.dtype == np.float32


def test_the_test_maps_keep_no_other_map_alive() -> None:
    data = lounge.generate_lounge(DataConfig(rows=5, cols=6, train=30, test=10))
    assert data.X_test.base is None and data.X_test.shape == (10, 5, 6)
    assert data.X_train.base is None


def test_simulate_live_hands_the_run_the_test_maps_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[object] = []

    class Stop(Exception):
        pass

    def simulate(maps, *args, **kwargs):
        handed.append(maps)
        raise Stop

    monkeypatch.setattr(live, "simulate", simulate)
    code, _, _ = _meshdl("simulate", "live", "--rows", "4", "--cols", "5", "--pool",
                         "global", "--slots", "3", "--out", tmp_path / "run")
    assert code != 0 and len(handed) == 1  # stopped there, as the stand-in does
    expected = lounge.generate_lounge(DataConfig(rows=4, cols=5)).X_test
    assert isinstance(handed[0], np.ndarray)
    assert handed[0].tobytes() == expected.tobytes()


def test_central_inference_and_the_cloud_run_before_the_mesh_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []

    def noted(name: str, real):
        def call(*args, **kwargs):
            order.append(name)
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(live, "central_labels", noted("central", live.central_labels))
    monkeypatch.setattr(live, "run_cloud", noted("cloud", live.run_cloud))
    monkeypatch.setattr(live, "LiveMesh", noted("mesh", live.LiveMesh))
    config = load_run_config(mode="mesh", model={"rows": 3, "cols": 4, "pool": "global",
                                                 "filters": 2})
    maps = np.random.default_rng(0).normal(20.0, 2.0, (5, 3, 4)).astype(np.float32)
    settings = live.LiveSettings(slots=3, mac="scheduled")
    report = live.simulate(maps, normalized_model(config.model), config,
                           profile("802.15.4"), "shared", device("cortex-m4"),
                           device("pi4"), settings)
    assert order[0] == "central" and order.index("cloud") < order.index("mesh")
    assert report["alerts_equal_central"]


def test_the_mesh_is_kept_out_of_the_cyclic_collector_while_the_run_uses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its objects frozen once built (no collection traverses them again) and thawed as
    the run returns, so nothing of it stays frozen."""
    import gc

    frozen: list[int] = []
    real = live.run_mesh

    def run_mesh(*args, **kwargs):
        frozen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr(live, "run_mesh", run_mesh)
    config = load_run_config(mode="mesh", model={"rows": 3, "cols": 4, "pool": "global",
                                                 "filters": 2})
    maps = np.random.default_rng(0).normal(20.0, 2.0, (5, 3, 4)).astype(np.float32)
    before = gc.get_freeze_count()
    live.simulate(maps, normalized_model(config.model), config, profile("802.15.4"),
                  "shared", device("cortex-m4"), device("pi4"),
                  live.LiveSettings(slots=3, mac="scheduled"))
    assert frozen[0] > before
    assert gc.get_freeze_count() == 0
