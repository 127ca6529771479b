"""Central training: it learns, it is reproducible, and the seed experiment reaches
the accuracy the product promises."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.errors import MeshdlError
from meshdl.model.optim import learning_rate
from meshdl.training.loop import CentralEngine, batches, final_metrics, normalization, train


def test_batches_cover_every_sample_once_per_epoch() -> None:
    rng = np.random.default_rng(0)
    parts = batches(250, 100, rng)
    assert [len(p) for p in parts] == [100, 100, 50]
    assert sorted(np.concatenate(parts).tolist()) == list(range(250))


def test_normalization_is_one_mean_and_std_for_all_cells() -> None:
    X = np.array([[[10.0, 20.0]], [[30.0, 40.0]]], np.float32)
    mean, std = normalization(X)
    assert mean == pytest.approx(25.0)
    assert std == pytest.approx(np.std([10, 20, 30, 40]))
    assert normalization(np.ones((3, 2, 2), np.float32))[1] == 1.0  # constant field


def test_training_lowers_the_loss_on_a_small_lounge() -> None:
    config = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 32},
                             train={"epochs": 6, "batch": 32})
    data = generate_lounge(DataConfig(rows=6, cols=8, train=300, test=60, seed=1))
    model, history = train(config, data)
    assert history.epochs[-1].train_loss < history.epochs[0].train_loss
    assert model.norm_std[0] == pytest.approx(normalization(data.X_train)[1], rel=1e-6)


def test_warmup_ramps_linearly_to_the_peak_then_the_schedule_starts_there() -> None:
    config = load_run_config(train={"lr": 0.2, "warmup_fraction": 0.25}).train
    rates = [learning_rate(config, step, 16) for step in range(16)]
    assert rates[:5] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2])  # then cosine from 0.2
    assert all(a > b for a, b in itertools.pairwise(rates[4:]))
    assert rates[-1] == pytest.approx(0.1 * (1 + np.cos(np.pi * 11 / 12)))


def test_final_metrics_count_predictions_per_class_and_flag_a_single_class() -> None:
    y = np.array([0, 1, 1, 0])
    collapsed = final_metrics(2, np.zeros(4, np.int64), y, np.zeros(2, np.int64), y[:2])
    assert collapsed["train_acc"] == 0.5
    assert collapsed["predicted_per_class"] == {"train": [4, 0], "test": [2, 0]}
    assert collapsed["single_class"] is True
    working = final_metrics(3, np.array([0, 1, 1, 0]), y, np.array([0, 0]), y[:2])
    assert working["predicted_per_class"] == {"train": [2, 2, 0], "test": [2, 0, 0]}
    assert working["single_class"] is False  # one class on the test split alone is no sign


@pytest.mark.parametrize(("mode", "optimizer", "clip_norm"),
                         [("central", "sgd", 0), ("mesh", "sgd", 0),
                          ("central", "adam", 1.0)])  # Adam's kernel raised ZeroDivisionError
@pytest.mark.filterwarnings("ignore:.*encountered in matmul:RuntimeWarning")  # diverging
def test_divergence_is_reported_not_silently_trained_on(mode: str, optimizer: str,
                                                        clip_norm: float) -> None:
    config = load_run_config(mode=mode, model={"rows": 6, "cols": 8, "hidden": 32},
                             train={"epochs": 3, "batch": 32, "optimizer": optimizer,
                                    "lr": 1e9, "warmup_fraction": 0, "clip_norm": clip_norm})
    data = generate_lounge(DataConfig(rows=6, cols=8, train=100, test=20, seed=1))
    with pytest.raises(MeshdlError, match="diverged"):
        train(config, data)


@pytest.mark.slow
def test_seed_experiment_reaches_95_percent_test_accuracy() -> None:
    # The seed paper's single-machine run: k 3, 5 filters, 200 hidden, batch 100,
    # 20 epochs, 2,400 + 561 maps of 17 x 25 (it reports 92.8 % on its own data).
    config = load_run_config(mode="central")
    data = generate_lounge(config.data)
    _, history = train(config, data)
    assert history.final["test_acc"] >= 0.95, history.final


@pytest.mark.slow
def test_default_recipe_trains_where_the_old_one_collapsed() -> None:
    # Data seed 11, training seed 0: the old recipe (no warm-up, lr 0.15 from step 1)
    # killed every conv2 channel within 120 steps and predicted the majority (62.6 %).
    config = load_run_config(mode="central", data={"seed": 11})
    _, history = train(config, generate_lounge(config.data))
    assert not history.final["single_class"]
    assert history.final["test_acc"] >= 0.93, history.final


class _Stopped(Exception):
    """Stands for a kill: the run ends wherever it is."""


@pytest.mark.parametrize(("mode", "stop_at"), [("central", (2, 1)), ("central", (3, 4)),
                                               ("mesh", (2, 3))])
def test_a_run_stopped_anywhere_and_resumed_ends_with_the_uninterrupted_parameters(
        mode: str, stop_at: tuple[int, int], tmp_path) -> None:
    from meshdl.training.checkpoint import load_checkpoint

    config = load_run_config(mode=mode, model={"rows": 6, "cols": 8, "hidden": 16},
                             train={"epochs": 3, "batch": 16})
    data = generate_lounge(DataConfig(rows=6, cols=8, train=64, test=20, seed=1))
    whole, whole_history = train(config, data)

    def kill(epoch: int, step: int, _steps: int, _loss: float) -> None:
        if (epoch, step) == stop_at:
            raise _Stopped

    with pytest.raises(_Stopped):
        train(config, data, progress=kill, checkpoints=tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.epochs_done == stop_at[0] - 1  # the last finished epoch
    resumed, history = train(config, data, checkpoints=tmp_path, resume=checkpoint)
    np.testing.assert_array_equal(resumed.flat, whole.flat)
    assert history.epochs == whole_history.epochs
    assert history.final == whole_history.final


class _FailingEngine(CentralEngine):
    """Central training whose `fail_at`-th update (counting from 1), or its first
    evaluation after `fail_at` updates, gives up as a broker gone for good would."""

    def __init__(self, data, fail_at: int, in_evaluation: bool = False) -> None:
        super().__init__(data)
        self.updates, self.fail_at, self.in_evaluation = 0, fail_at, in_evaluation

    def loss_and_grads(self, model, indices):
        self.updates += 1
        if self.updates == self.fail_at and not self.in_evaluation:
            raise MeshdlError("cannot reach the broker")
        return super().loss_and_grads(model, indices)

    def logits(self, model, split, indices):
        if self.in_evaluation and self.updates == self.fail_at:
            raise MeshdlError("cannot reach the broker")
        return super().logits(model, split, indices)


@pytest.mark.parametrize(("fail_at", "in_evaluation"), [(1, False), (7, False), (4, True)])
def test_an_engine_that_gives_up_mid_epoch_leaves_a_checkpoint_of_exactly_what_is_done(
        fail_at: int, in_evaluation: bool, tmp_path) -> None:
    """4 updates per epoch: the 7th is epoch 2's third; the evaluation after the 4th is
    epoch 1's. The checkpoint holds the updates applied, and resuming from it ends with
    the uninterrupted run's parameters and metrics."""
    from meshdl.training.checkpoint import load_checkpoint

    config = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                             train={"epochs": 3, "batch": 16})
    data = generate_lounge(DataConfig(rows=6, cols=8, train=64, test=20, seed=1))
    whole, whole_history = train(config, data)
    with pytest.raises(MeshdlError, match="cannot reach the broker"):
        train(config, data, engine=_FailingEngine(training_data(config.train, data), fail_at,
                                                  in_evaluation), checkpoints=tmp_path)
    if fail_at == 1:  # nothing done yet: nothing to keep
        assert not (tmp_path / "checkpoint.npz").exists()
        return
    checkpoint = load_checkpoint(tmp_path)
    # (epochs done, updates done of the next): an epoch is done once evaluated.
    expected = (0, 4) if in_evaluation else divmod(fail_at - 1, 4)
    assert (checkpoint.epochs_done, checkpoint.steps_done) == expected
    resumed, history = train(config, data, checkpoints=tmp_path, resume=checkpoint)
    np.testing.assert_array_equal(resumed.flat, whole.flat)
    assert history.epochs == whole_history.epochs
    assert history.final == whole_history.final


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path) -> None:
    from meshdl.training.checkpoint import load_checkpoint

    config = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                             train={"epochs": 1, "batch": 16})
    data = generate_lounge(DataConfig(rows=6, cols=8, train=32, test=8, seed=1))
    train(config, data, checkpoints=tmp_path)
    other = load_run_config(mode="central", model={"rows": 6, "cols": 8, "hidden": 16},
                            train={"epochs": 2, "batch": 16, "lr": 0.01})
    with pytest.raises(MeshdlError, match="another configuration"):
        train(other, data, resume=load_checkpoint(tmp_path))
    (tmp_path / "checkpoint.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(MeshdlError, match=r"checkpoint\.npz: not a valid \.npz file or corrupt"):
        load_checkpoint(tmp_path)
