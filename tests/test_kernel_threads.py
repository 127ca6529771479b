"""Thread counts change how fast a step runs, never its bits (issue 34).

The conv kernels' parallel twins give the same bits as the serial kernels; BLAS runs on
one thread inside a step and a training run; `ThreadChooser` runs the count that has
been fastest lately, and moves off one that slows down (another process on the core).
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from meshdl import load_run_config
from meshdl.bench.kernels import bench_kernels
from meshdl.blas import one_blas_thread
from meshdl.config import ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.model import kernels, threads
from meshdl.model.cnn import CNN
from meshdl.model.threads import LAST_PROBE, SAMPLES, ThreadChooser
from meshdl.training.loop import train
from tests.helpers import blas_threads

# Grids, kernels and batches whose conv stacks cut into several blocks (one block runs
# serial code whatever the threads): the seed, an even kernel, a wide kernel, a single
# filter (a scratch channel), a grid of many short rows, a grid of one long row.
CONFIGS = [
    (dict(rows=17, cols=25, kernel=3, filters=5, hidden=200), (16, 100)),
    (dict(rows=8, cols=9, kernel=4, filters=3, hidden=50), (64, 333)),
    (dict(rows=30, cols=40, kernel=5, filters=8, hidden=40), (7, 64)),
    (dict(rows=17, cols=25, kernel=2, filters=1, hidden=20), (32,)),
    (dict(rows=5, cols=300, kernel=3, filters=4, hidden=30), (3, 20)),
]


def _batch(config: ModelConfig, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    X = rng.normal(20.0, 2.0, (batch, 1, config.rows, config.cols)).astype(np.float32)
    return X, rng.integers(0, config.classes, batch)


def _two_steps(config: ModelConfig, X: np.ndarray, y: np.ndarray, count: int) -> np.ndarray:
    """Loss, logits, gradients of two SGD steps and the logits after, under `count`
    kernel threads, as one float64 vector."""
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 2.0)
    parts = []
    with threadpool_limits(limits=1, user_api="blas"), kernels.using_threads(count):
        for _ in range(2):
            loss, logits = model.gradient_pass(X, y)
            parts += [np.array([loss]), logits.ravel(), model.grad_flat.copy()]
            model.flat -= np.float32(0.01) * model.grad_flat
        parts.append(model.forward(X).ravel())
    return np.concatenate(parts).astype(np.float64)


@pytest.mark.parametrize(("shape", "batches"), CONFIGS)
def test_parallel_conv_kernels_give_the_same_bits_as_the_serial_ones(
        shape: dict, batches: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "PARALLEL_MIN_FMAS", 0)  # twins on every multi-block call
    calls = []
    for name in ("correlate_planes_parallel", "conv_weight_grad_parallel"):
        twin = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _twin=twin: calls.append(1) or _twin(*a))
    config = ModelConfig(**shape)
    twin_calls = 0
    for batch in batches:
        X, y = _batch(config, batch)
        calls.clear()
        serial = _two_steps(config, X, y, count=1)
        assert not calls
        parallel = _two_steps(config, X, y, count=2)
        twin_calls += len(calls)
        assert np.array_equal(serial.view(np.uint64), parallel.view(np.uint64)), batch
    if kernels.numba.config.NUMBA_NUM_THREADS > 1:
        assert twin_calls  # the twins ran


def test_a_conv_kernel_runs_its_parallel_twin_only_with_threads_blocks_and_work() -> None:
    seed = kernels.ConvPlanes(17, 25, 100, 3, 1, 5, 2, 2)  # 17 blocks, 1.9 M FMAs per input
    small = kernels.ConvPlanes(17, 25, 32, 3, 1, 5, 2, 2)  # 5 blocks, 0.65 M per input
    one_block = kernels.ConvPlanes(17, 25, 4, 3, 1, 5, 2, 2)
    assert not seed._parallel(5)  # no `using_threads`: serial
    with kernels.using_threads(2) as count:
        assert seed._parallel(1) == seed._parallel(5) == (count > 1)
        assert small._parallel(5) == (count > 1)
        assert not small._parallel(1)  # 0.65 M < PARALLEL_MIN_FMAS
        assert not one_block._parallel(5)


def test_using_threads_is_undone_after_the_block_and_never_exceeds_numba_threads() -> None:
    before = kernels.numba.get_num_threads()
    with kernels.using_threads(10_000) as count:
        assert count == kernels.numba.config.NUMBA_NUM_THREADS == kernels.kernel_threads()
    assert kernels.kernel_threads() == 1
    assert kernels.numba.get_num_threads() == before


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 100, 2500, 4093])
def test_the_gated_sum_of_the_input_gradient_adds_in_the_order_it_documents(n: int) -> None:
    """LANES running sums, folded in halves, then the tail: not the order LLVM would pick."""
    rng = np.random.default_rng(n)
    out = rng.normal(0.0, 1.0, (2, n + 9)).astype(np.float32)
    gate = rng.normal(0.0, 1.0, (2, n + 12)).astype(np.float32)
    at, gate_at = 5, 11
    kept = np.where(gate[1, gate_at : gate_at + n] > 0, out[1, at : at + n], np.float32(0))
    full = n - n % kernels.LANES
    lanes = np.zeros(kernels.LANES, np.float32)
    for row in kept[:full].reshape(-1, kernels.LANES):
        lanes = lanes + row  # float32, lane by lane, row after row
    while len(lanes) > 1:
        lanes = lanes[: len(lanes) // 2] + lanes[len(lanes) // 2 :]
    expected = lanes[0]
    for v in kept[full:]:
        expected = np.float32(expected + v)
    scratch = np.empty(kernels.LANES, np.float32)
    got = kernels._gate_and_sum(out, 1, at, gate, gate_at, n, scratch)
    assert np.float32(got).view(np.uint32) == expected.view(np.uint32)
    assert np.array_equal(out[1, at : at + n], kept)


def test_a_chosen_step_and_a_training_run_hold_blas_to_one_thread() -> None:
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        ThreadChooser(most=2).run("k", lambda: seen.append(blas_threads()))
        one_blas_thread(lambda: seen.append(blas_threads()))()
        seen.append(blas_threads())
    assert seen[:2] == [1, 1]
    assert seen[2] == min(2, seen[2])  # restored after (the machine may have 1 core)


def _seed_grid_run(batch: int) -> tuple:
    config = load_run_config(mode="central", model={"rows": 17, "cols": 25, "hidden": 200},
                             train={"epochs": 1, "batch": batch})
    rng = np.random.default_rng(5)
    X = rng.normal(20.0, 3.0, (2 * batch, 17, 25)).astype(np.float32)
    y = rng.integers(0, config.model.classes, 2 * batch)
    return config, Dataset(X, y, X[:8], y[:8], {})


def test_central_training_gives_the_same_bits_whatever_the_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """BLAS's threads (fc1's sums at batch 64 differ between 1 and 2 of them) and the
    conv kernels' threads, whichever the chooser picks."""
    config, data = _seed_grid_run(batch=64)
    monkeypatch.setattr(kernels, "PARALLEL_MIN_FMAS", 0)
    results = []
    for blas, most in ((1, 1), (2, 2)):
        monkeypatch.setattr(threads, "usable_cores", lambda _most=most: _most)
        # every call on the most threads: the test must not depend on timings
        monkeypatch.setattr(ThreadChooser, "choose", lambda self, track: self.counts[-1])
        with threadpool_limits(limits=blas, user_api="blas"):
            model, _ = train(config, data)
        results.append(model.flat.copy())
    assert np.array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


class _Machine:
    """A fake clock and a call whose duration depends on the threads it runs with and on
    whether another process holds a core."""

    def __init__(self, serial: float = 2.0, parallel: float = 1.6, contended: float = 6.0):
        self.now, self.busy = 0.0, False
        self.serial, self.parallel, self.contended = serial, parallel, contended
        self.ran: list[int] = []

    def clock(self) -> float:
        return self.now

    def call(self) -> None:
        count = kernels.kernel_threads()
        self.ran.append(count)
        if count == 1:
            self.now += self.serial
        else:
            self.now += self.contended if self.busy else self.parallel


def _chooser(machine: _Machine) -> ThreadChooser:
    chooser = ThreadChooser(most=2, clock=machine.clock)
    chooser.counts = (1, 2)  # as on 2 cores, also where numba has fewer threads
    return chooser


def test_the_chooser_runs_the_faster_count_once_both_are_timed() -> None:
    machine = _Machine()
    chooser = _chooser(machine)
    for _ in range(200):
        chooser.run(100, machine.call)
    assert chooser.chosen(100) == 2
    warm_and_timed = 2 * (SAMPLES + 1)
    assert machine.ran[warm_and_timed:].count(1) <= 5  # only the tries of the other count


def test_the_chooser_leaves_a_count_that_slows_down_at_once_and_comes_back_later() -> None:
    machine = _Machine()
    chooser = _chooser(machine)
    for _ in range(50):
        chooser.run(100, machine.call)
    machine.busy = True
    machine.ran.clear()
    for _ in range(2000):
        chooser.run(100, machine.call)
    assert chooser.chosen(100) == 1
    assert machine.ran[:SAMPLES].count(1) >= 1  # moved within SAMPLES calls
    assert machine.ran.count(2) <= 2 + 2 * 2000 // 16  # a try now and then, never more
    assert machine.ran[-LAST_PROBE:].count(2) <= 2  # ... and rarer as they keep losing
    machine.busy = False
    for _ in range(3 * LAST_PROBE):
        chooser.run(100, machine.call)
    assert chooser.chosen(100) == 2


def test_the_chooser_tracks_each_batch_size_on_its_own() -> None:
    machine = _Machine()
    chooser = _chooser(machine)
    for _ in range(30):
        chooser.run(100, machine.call)
    assert chooser.chosen(100) == 2
    assert chooser.chosen(7) == 1  # not run yet
    assert sum(chooser.runs(100).values()) == 30


def test_a_chooser_of_one_thread_never_runs_more() -> None:
    machine = _Machine(serial=9.0, parallel=1.0)
    chooser = ThreadChooser(most=1, clock=machine.clock)
    for _ in range(100):
        chooser.run(100, machine.call)
    assert set(machine.ran) == {1}


def test_bench_kernels_reports_the_calls_each_thread_count_ran() -> None:
    config = ModelConfig(rows=5, cols=5, hidden=8)
    result = bench_kernels(config, batch=4, repeats=3, threads=2)
    calls = result["meshdl"]["calls_per_thread_count"]
    assert set(calls) == {"1", "2"}
    assert sum(calls.values()) == 1 + 5 + 3  # first call, warm-up, timed
