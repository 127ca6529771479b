"""Benchmarks: meshdl against a reference measured in the same run.

`bench_kernels` times one training step (forward, backward, optimizer update) of a
configuration on meshdl's Numba kernels and on PyTorch CPU, both limited to the same
number of threads, with the same initial parameters and the same batch. meshdl's step
runs as training runs it (`meshdl.training.loop.CentralEngine`): through a
`ThreadChooser` that picks, call by call, the fastest of 1 and `threads` threads.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from meshdl.config import ModelConfig, TrainConfig
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer
from meshdl.model.threads import ThreadChooser


def time_calls(call: Callable[[], object], repeats: int, warmup: int = 5) -> dict[str, float]:
    """Median, minimum and 90th percentile of `repeats` timed calls, in milliseconds."""
    for _ in range(warmup):
        call()
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    times *= 1e3
    return {"median_ms": float(np.median(times)), "min_ms": float(times.min()),
            "p90_ms": float(np.percentile(times, 90))}


def _batch(config: ModelConfig, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(20.0, 2.0, (batch, config.in_channels, config.rows, config.cols))
    y = rng.integers(0, config.classes, batch)
    return X.astype(np.float32), y


def meshdl_step(config: ModelConfig, train: TrainConfig, X: np.ndarray, y: np.ndarray,
                threads: ThreadChooser | None = None) -> tuple[CNN, Callable[[], None]]:
    """A model and a closure running one full training step on it, through `threads`
    (default: one thread), which the training loop runs its steps through too."""
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 2.0)
    optimizer = Optimizer(train, model.flat.size)
    chooser = ThreadChooser(most=1) if threads is None else threads
    batch = len(y)

    def update() -> None:
        model.gradient_pass(X, y)
        optimizer.step(model.flat, model.grad_flat)

    def step() -> None:
        chooser.run(("step", batch), update)

    return model, step


def torch_step(model: CNN, train: TrainConfig, X: np.ndarray, y: np.ndarray
               ) -> tuple[str, Callable[[], None]] | None:
    """The same step in PyTorch, from the same parameters; None when PyTorch is absent."""
    try:
        import torch
    except ImportError:
        return None
    from meshdl.model.torch_compat import torch_sequential

    net = torch_sequential(model.config)
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.params.items()})
    if train.optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=train.lr, momentum=train.momentum)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=train.lr)
    xt = (torch.from_numpy(X) - 20.0) / 2.0
    yt = torch.from_numpy(y)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()

    return torch.__version__, step


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[list[subprocess.Popen]]:
    """`count` CPU-bound processes running beside what the block times (another user's
    job holding cores), stopped when it ends; the block gets them."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                for _ in range(count)]
    try:
        time.sleep(0.2)  # running, not starting, when the timing begins
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(timeout=10)


def bench_kernels(config: ModelConfig, batch: int = 100, repeats: int = 200,
                  threads: int = 1, optimizer: str = "sgd", busy: int = 0) -> dict[str, Any]:
    """Time one training step in meshdl and in PyTorch (when importable), same threads;
    `busy`: with that many CPU-bound processes beside both (`busy_cores`)."""
    with busy_cores(busy):
        result = _bench_kernels(config, batch, repeats, threads, optimizer)
    result["busy_cores"] = busy
    return result


def _bench_kernels(config: ModelConfig, batch: int, repeats: int, threads: int,
                   optimizer: str) -> dict[str, Any]:
    train = TrainConfig(batch=batch, optimizer=optimizer, lr=0.01)
    X, y = _batch(config, batch, seed=0)
    started = time.perf_counter()
    chooser = ThreadChooser(most=threads)
    model, ours = meshdl_step(config, train, X, y, chooser)
    ours()  # the first call compiles, or loads the kernels from numba's cache
    first_call_s = time.perf_counter() - started
    result: dict[str, Any] = {"config": config.model_dump(), "batch": batch, "threads": threads,
                              "optimizer": optimizer, "repeats": repeats}
    with threadpool_limits(limits=threads):
        result["meshdl"] = {**time_calls(ours, repeats), "first_call_s": round(first_call_s, 3),
                            "calls_per_thread_count": {str(n): c for n, c in
                                                       chooser.runs(("step", batch)).items()}}
        reference = torch_step(model, train, X, y)
        if reference is None:
            result["torch"] = None
            result["speedup_vs_torch"] = None
            return result
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            version, theirs = reference
            result["torch"] = {"version": version, **time_calls(theirs, repeats, warmup=20)}
        finally:
            torch.set_num_threads(previous)
    result["speedup_vs_torch"] = result["torch"]["median_ms"] / result["meshdl"]["median_ms"]
    return result
