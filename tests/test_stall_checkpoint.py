"""A run keeps its checkpoint while the edge waits out a flood (issue 43, item 3).

Over MQTT a wave that fails only for loss is tried on past its attempts for up to
`edge run --patience` seconds (edge/remote.py, `Patience`); the engine says so through
its `on_stall` hook (`meshdl.training.loop.Stalls`), and the loop then saves a
checkpoint of every update done. A run stopped while the edge waits (killed, or its
patience run out) goes on from there to the uninterrupted run's parameters."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.training.checkpoint import CHECKPOINT, load_checkpoint
from meshdl.training.loop import CentralEngine, Stalls, train

CONFIG = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                         train={"epochs": 3, "batch": 16})  # 4 updates an epoch
DATA = generate_lounge(DataConfig(rows=6, cols=8, train=64, test=20, seed=1))


class _Killed(Exception):
    """Stands for a kill while the engine waits."""


class _StallingEngine(CentralEngine):
    """Central training that, at its `stall_at`-th update (or the evaluation after it),
    begins to wait as the MQTT engine does under a flood: it calls `on_stall`, then
    is killed while it waits."""

    def __init__(self, data, stall_at: int, in_evaluation: bool = False) -> None:
        super().__init__(data)
        self.on_stall: Callable[[], None] | None = None
        self.updates, self.stall_at, self.in_evaluation = 0, stall_at, in_evaluation

    def _wait(self) -> None:
        if self.on_stall is not None:
            self.on_stall()
        raise _Killed

    def loss_and_grads(self, model, indices, failout=None):
        self.updates += 1
        if self.updates == self.stall_at and not self.in_evaluation:
            self._wait()
        return super().loss_and_grads(model, indices, failout)

    def logits(self, model, split, indices):
        if self.in_evaluation and self.updates == self.stall_at:
            self._wait()
        return super().logits(model, split, indices)


def test_the_mqtt_engine_declares_the_stall_hook() -> None:
    from meshdl.edge.remote import MqttEngine

    engine = MqttEngine(None, "mqtt://127.0.0.1:1")
    try:
        assert isinstance(engine, Stalls)
    finally:
        engine.close()


@pytest.mark.parametrize(("stall_at", "in_evaluation", "expected"),
                         [(3, False, (0, 2)), (7, False, (1, 2)), (4, True, (0, 4))],
                         ids=["epoch1-step3", "epoch2-step3", "epoch1-evaluation"])
def test_a_run_killed_while_the_engine_waits_goes_on_from_the_updates_done(
        stall_at, in_evaluation, expected, tmp_path) -> None:
    whole, whole_history = train(CONFIG, DATA)
    engine = _StallingEngine(training_data(CONFIG.train, DATA), stall_at, in_evaluation)
    # Between two epochs' checkpoints: the last one written at an epoch's end (if any)
    # would lose the updates of this one.
    with pytest.raises(_Killed):
        train(CONFIG, DATA, engine=engine, checkpoints=tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    assert (checkpoint.epochs_done, checkpoint.steps_done) == expected
    assert engine.on_stall is None  # the run let go of the engine it was given
    resumed, history = train(CONFIG, DATA, checkpoints=tmp_path, resume=checkpoint)
    np.testing.assert_array_equal(resumed.flat, whole.flat)
    assert history.epochs == whole_history.epochs
    assert history.final == whole_history.final


def test_a_stall_before_any_update_keeps_nothing(tmp_path) -> None:
    engine = _StallingEngine(training_data(CONFIG.train, DATA), stall_at=1)
    with pytest.raises(_Killed):
        train(CONFIG, DATA, engine=engine, checkpoints=tmp_path)
    assert not (tmp_path / CHECKPOINT).exists()


def test_a_stall_the_engine_outlasts_leaves_the_run_as_it_would_be(tmp_path) -> None:
    """The engine waits, the flood ends, the wave finishes: the run goes on, the same."""
    class _Outlasting(_StallingEngine):
        def _wait(self) -> None:
            assert self.on_stall is not None
            self.on_stall()
            shutil.copy(tmp_path / CHECKPOINT, tmp_path / "at-stall.npz")

    whole, _ = train(CONFIG, DATA)
    model, _ = train(CONFIG, DATA, engine=_Outlasting(training_data(CONFIG.train, DATA), 6),
                     checkpoints=tmp_path)
    np.testing.assert_array_equal(model.flat, whole.flat)
    (tmp_path / "stall").mkdir()
    shutil.copy(tmp_path / "at-stall.npz", tmp_path / "stall" / CHECKPOINT)
    at_stall = load_checkpoint(tmp_path / "stall")
    assert (at_stall.epochs_done, at_stall.steps_done) == (1, 1)
