"""Thread counts for a training step: the one that has been fastest lately on this machine.

On the 2-core machine of issue 34 (`meshdl bench kernels`, batch 100, seed model) the
conv kernels' parallel twins (`kernels.using_threads`) made a step 10-20 % faster with
the other core idle, and 2-3 times *slower* with another process holding it: numba's
OpenMP threads wait for a core that the other process owns. No rule on batch size or
core count can tell the two cases apart, and which holds changes while a run goes on
(another job starts or ends), so `ThreadChooser` measures: it times every call, runs
the count whose recent calls were fastest, and now and then tries the other one again.

BLAS runs on one thread inside a step, whatever the choice (meshdl/blas.py): with 2
threads OpenBLAS (0.3.31, numpy's) gave other bits than with 1 for the seed's fc1
product (585 inputs) at batches of 64 and more, and for the optimizer's float64 norm (a
dot product, which it splits in halves); the kernels' own twins give the same bits.
The fully-connected layers are a small part of a step (about 0.6 of 2 ms at batch
100, 0.4 on 2 threads), and OpenBLAS's threads busy-wait between calls: with the other
core busy, 2 BLAS threads made the step 2.5 times slower (6.8 against 2.75 ms).
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from statistics import median
from typing import TypeVar

from threadpoolctl import ThreadpoolController

from meshdl.model import kernels

T = TypeVar("T")

SAMPLES = 3  # recent timings per count a choice compares (medians: one hiccup is ignored)
FIRST_PROBE = 16  # calls between tries of the other count, after a change of choice
LAST_PROBE = 1024  # ... doubling after each try that does not change it, up to this


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class _Track:
    """What a chooser knows about one kind of call (one batch size)."""

    counts: tuple[int, ...]
    times: dict[int, deque[float]] = field(init=False)
    unwarmed: set[int] = field(init=False)  # counts whose first call is still to come
    runs: Counter[int] = field(default_factory=Counter)  # calls run with each count
    current: int = 1
    interval: int = FIRST_PROBE
    until_probe: int = FIRST_PROBE

    def __post_init__(self) -> None:
        self.times = {n: deque(maxlen=SAMPLES) for n in self.counts}
        self.unwarmed = set(self.counts)

    def exploring(self) -> int | None:
        """The count still short of timings (fewest first), or None once all have them."""
        short = [n for n in self.counts if len(self.times[n]) < SAMPLES]
        return min(short, key=lambda n: (len(self.times[n]), n)) if short else None

    def fastest(self) -> int:
        """The count with the lowest median of its recent timings (fewer threads on ties)."""
        return min(self.counts, key=lambda n: (median(self.times[n]), n))


class ThreadChooser:
    """Runs repeated calls (training steps) each with the thread count that has been
    fastest for calls of its kind lately: 1 or `most` threads for the conv kernels,
    one for BLAS.

    Each kind of call (`key`: a batch size) is tracked on its own. First every count is
    timed `SAMPLES` times (after one call each that is not counted: it allocates buffers
    or wakes the threads); then the fastest runs, its timings kept up to date, so that
    when it slows down (a process takes the other core) the choice moves at once. The
    other count is tried again after `FIRST_PROBE` calls, then twice as many each time it
    loses, up to `LAST_PROBE`: on a busy core a try costs one slow call in hundreds.

    The results are the same bits whatever the choice (`kernels.using_threads`); only
    the time differs. `clock` is for tests.
    """

    def __init__(self, most: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        most = usable_cores() if most is None else most
        self.counts = tuple(sorted({1, max(1, most)}))
        self.clock = clock
        self.tracks: dict[Hashable, _Track] = {}
        self._blas = ThreadpoolController()  # found once: a lookup costs ~0.5 ms

    def run(self, key: Hashable, call: Callable[[], T]) -> T:
        """`call()` under the thread count chosen for calls of kind `key`, timed."""
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = _Track(self.counts, current=self.counts[0])
        count = self.choose(track)
        track.runs[count] += 1
        with self._blas.limit(limits=1, user_api="blas"), kernels.using_threads(count):
            started = self.clock()
            result = call()
            elapsed = self.clock() - started
        self.record(track, count, elapsed)
        return result

    def chosen(self, key: Hashable) -> int:
        """The count calls of kind `key` run with now (1 before any)."""
        track = self.tracks.get(key)
        return track.current if track is not None else self.counts[0]

    def runs(self, key: Hashable) -> dict[int, int]:
        """How many calls of kind `key` ran with each count."""
        track = self.tracks.get(key)
        return {n: track.runs[n] if track else 0 for n in self.counts}

    def choose(self, track: _Track) -> int:
        """The count for the next call: one still to be timed, a due try, or the fastest."""
        if len(self.counts) == 1:
            return self.counts[0]
        short = track.exploring()
        if short is not None:
            return short
        track.until_probe -= 1
        if track.until_probe > 0:
            return track.current
        track.until_probe = track.interval
        return next(n for n in self.counts if n != track.current)  # one rival with 2 counts

    def record(self, track: _Track, count: int, elapsed: float) -> None:
        """Keep a call's time and choose again; a first call per count is not kept."""
        if count in track.unwarmed:
            track.unwarmed.discard(count)
            return
        track.times[count].append(elapsed)
        if track.exploring() is not None:
            return
        probed = count != track.current
        best = track.fastest()
        if best != track.current:
            track.current = best
            track.interval = track.until_probe = FIRST_PROBE
        elif probed:
            track.interval = min(2 * track.interval, LAST_PROBE)
            track.until_probe = track.interval
