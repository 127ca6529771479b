"""BLAS on one thread: the same bits on any machine, and no spinning threads.

OpenBLAS (numpy's) splits some operations among its threads: a dot product in halves,
other bits than one thread's; products of some shapes too (the seed's fc1 at batches of
64 and more). Its idle threads busy-wait between calls, so with another process holding
the second core a training step ran 2.5 times slower and the 100 x 100 lounge generator
5-9 times (issue 34: meshdl/model/threads.py, docs/results/benchmarks.md). Training and
data generation hold BLAS to one thread with `one_blas_thread`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")
P = ParamSpec("P")


def one_blas_thread(function: Callable[P, T]) -> Callable[P, T]:
    """`function` with BLAS held to one thread while it runs: a training run (its
    optimizer's float64 norm is a BLAS dot, which 2 threads add up in two halves, other
    bits than one) or the lounge generator; BLAS's busy-waiting threads slow either down
    several times when another process holds a core."""

    @functools.wraps(function)
    def held(*args: P.args, **kwargs: P.kwargs) -> T:
        with threadpool_limits(limits=1, user_api="blas"):
            return function(*args, **kwargs)

    return held
