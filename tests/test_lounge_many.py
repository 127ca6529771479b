"""A training split larger than one lounge's 50 days: the training periods of more
lounges of the same design, so that the data stay a fair test however many maps are
asked for; the default generated data set is the global recipe's 163,200 maps, and the
recipe trains fewer epochs on it and as before on a smaller one."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from meshdl.cli.data import data_config
from meshdl.config import DataConfig, load_run_config, recipe_epochs
from meshdl.data import datasets, lounge
from meshdl.data.datasets import data_digest, dataset_stats, label_maps
from meshdl.data.lounge import LOUNGE_TRAIN, generate_lounge

T = TypeVar("T")


def test_a_large_training_split_stays_a_fair_test() -> None:
    """Before, 12,000 maps were one lounge logged for 250 days: its weather warmed past
    any spring and its drifting sensors drifted degrees, and every test map crossed
    the threshold."""
    ds = generate_lounge(DataConfig(train=12_000, seed=100))
    assert ds.X_train.shape == (12_000, 17, 25)
    for y in (ds.y_train, ds.y_test):
        assert 0.3 <= y.mean() <= 0.45  # before: 45 % of the training maps, all 561 test
    np.testing.assert_array_equal(ds.y_train, label_maps(ds.X_train, 3.0))
    assert len(ds.meta["more_lounges"]) == 12_000 // LOUNGE_TRAIN - 1


def test_more_maps_add_lounges_and_keep_the_first_lounges_test_split() -> None:
    small = generate_lounge(DataConfig(train=LOUNGE_TRAIN, test=50, rows=6, cols=8, seed=4))
    large = generate_lounge(DataConfig(train=LOUNGE_TRAIN + 700, test=50, rows=6, cols=8,
                                       seed=4))
    np.testing.assert_array_equal(large.X_test, small.X_test)
    first = {m.tobytes() for m in small.X_train}
    kept = [m.tobytes() in first for m in large.X_train]
    assert sum(kept) == LOUNGE_TRAIN  # the first lounge's maps, and 700 of another
    again = generate_lounge(DataConfig(train=LOUNGE_TRAIN + 700, test=50, rows=6, cols=8,
                                       seed=4))
    assert data_digest(again) == data_digest(large)


def test_the_default_generated_data_set_is_the_global_recipes() -> None:
    assert data_config(None, {}).train == 163_200
    assert data_config(None, {"train": 600}).train == 600
    assert DataConfig().train == 2400  # `meshdl train`'s own data: the source paper's


def test_the_recipe_trains_fewer_epochs_on_more_maps_and_as_before_on_fewer() -> None:
    assert recipe_epochs(2400) == recipe_epochs(500) == 40
    assert recipe_epochs(4800) == 20 and recipe_epochs(163_200) == recipe_epochs(12_000) == 12
    assert load_run_config(model={"pool": "global"}).train.epochs == 12  # 163,200 generated
    assert load_run_config(model={"pool": "global"}, data_maps=1000).train.epochs == 40
    assert load_run_config(model={"pool": "global"}, train={"epochs": 9}).train.epochs == 9
    # A data set whose size the caller does not say: a user's own, 40 as before.
    assert load_run_config(model={"pool": "global"}, data_grid=(6, 8)).train.epochs == 40
    assert load_run_config().train.epochs == 20  # the seed network's own


def test_experiments_and_simulate_train_take_the_epochs_of_the_data_set_they_are_given(
        tmp_path) -> None:
    """`experiment ... --data` and `simulate train --data` gave the data set's grid but not
    its size: a global head trained the epochs of the default 163,200 maps (12) on 2,400,
    or 40 on 163,200."""
    from meshdl.cli.experiment import _with_data_grid
    from meshdl.cli.simulate import _data_and_config
    from meshdl.data.datasets import save_dataset

    path = save_dataset(generate_lounge(DataConfig(rows=4, cols=5, train=300, test=20)),
                        tmp_path / "small.npz")
    flags = _with_data_grid({"model": {"pool": "global"}}, path)
    assert load_run_config(mode="mesh", **flags).train.epochs == recipe_epochs(300) == 40
    _, config, _ = _data_and_config(path, None, {"model": {"pool": "global"}})
    assert config.train.epochs == 40
    _, config, _ = _data_and_config(None, None, {"model": {"pool": "global", "rows": 4,
                                                           "cols": 5},
                                                 "data": {"train": 4800}})
    assert config.train.epochs == recipe_epochs(4800) == 20


def _with_peak(call: Callable[..., T], *args: Any) -> tuple[T, int]:
    """What `call(*args)` returns, and the most it allocated at once (tracemalloc)."""
    tracemalloc.start()
    try:
        return call(*args), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_many_lounges_hold_the_data_set_and_one_lounge_at_their_peak() -> None:
    """The lounges were concatenated and then shuffled into a copy: three times the data
    set at once, so the default 163,200 maps of a 100 x 100 grid (6.5 GB) did not fit in
    24 GiB. Each lounge now goes straight to its shuffled places."""
    cfg = DataConfig(rows=24, cols=30, train=8 * LOUNGE_TRAIN, test=100, seed=2)
    generate_lounge(DataConfig(rows=3, cols=3, train=4, test=2))  # compiled
    ds, peak = _with_peak(generate_lounge, cfg)
    data_set = ds.X_train.nbytes + ds.X_test.nbytes + ds.y_train.nbytes + ds.y_test.nbytes
    # Before: 3.2 x the data set, above this bound; now what one lounge holds at most.
    assert data_set + lounge._working_bytes(cfg) > peak > data_set


def test_a_request_beyond_the_machines_memory_is_refused_before_any_lounge(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What is asked counts its peak, the maps and one lounge's working arrays, so the
    refusal comes before minutes of lounges and not as the kernel's kill at the last."""
    page = os.sysconf("SC_PAGE_SIZE")
    cfg = DataConfig(rows=100, cols=100, train=163_200)
    maps_only = (cfg.train + cfg.test) * 100 * 100 * 4
    pages = (maps_only + lounge._working_bytes(cfg) // 2) // page  # the maps fit, the peak not
    monkeypatch.setattr(lounge.os, "sysconf",
                        lambda name: pages if name == "SC_PHYS_PAGES" else page)
    monkeypatch.setattr(lounge, "_lounge", lambda *a: pytest.fail("a lounge was drawn"))
    with pytest.raises(MemoryError, match="163,761 maps of 100 x 100"):
        generate_lounge(cfg)


def test_the_statistics_of_a_data_set_take_no_copy_of_its_maps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`data generate` and `data inspect` read each split's largest differences twice
    (statistics and labels): two temporaries the size of the maps each time, before."""
    monkeypatch.setattr(datasets, "DIFF_BLOCK_BYTES", 1 << 20)  # blocks of a small set
    ds = generate_lounge(DataConfig(rows=24, cols=30, train=6000, test=100, seed=1))
    stats, peak = _with_peak(dataset_stats, ds)
    assert stats["train"]["labels_match_rule"] == 1.0
    assert peak < 0.5 * ds.X_train.nbytes


def test_reads_in_blocks_are_the_reads_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block boundary must not change a map's largest difference or what dead cells
    hide: the blocks split maps, never a map."""
    ds = generate_lounge(DataConfig(rows=9, cols=11, train=400, test=50, seed=5))
    dead = np.random.default_rng(5).uniform(size=(9, 11)) < 0.15
    whole = (datasets.max_neighbour_diff(ds.X_train),
             datasets.hidden_by_dead(ds.X_train, dead))
    assert whole[1].any()  # some anomaly only dead cells show
    monkeypatch.setattr(datasets, "DIFF_BLOCK_BYTES", 7 * ds.X_train[0].nbytes + 5)
    np.testing.assert_array_equal(datasets.max_neighbour_diff(ds.X_train), whole[0])
    np.testing.assert_array_equal(datasets.hidden_by_dead(ds.X_train, dead), whole[1])
