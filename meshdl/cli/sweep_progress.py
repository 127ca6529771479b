"""What a sweep says while it runs: its trials taken from the journal, a bar with the
time left, a line per finished trial, and one line when it is interrupted.

The time left is measured, not assumed: nothing in the configuration says how long a
trial takes on this machine, so the first trial to finish gives the first estimate and
every later one refines it ("about", since trials of one sweep differ: 0 % faults
trains once and exactly). The estimate counts down between trials. rich's own
TimeRemainingColumn reads the speed of the last 30 s, which for trials of minutes is
none most of the time; `Left` reads `Estimate`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from rich.progress import ProgressColumn, Task
from rich.text import Text

Clock = Callable[[], float]


def about(seconds: float) -> str:
    """A duration as people say it: "under a minute", "about 12 min", "about 1 h 5
    min"."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    hours, rest = divmod(round(seconds / 300) * 5, 60)  # to 5 minutes past the hour
    return f"about {hours} h" + (f" {rest} min" if rest else "")


class Estimate:
    """The time left of a sweep that runs `to_run` trials `jobs` at a time, from the
    trials it has finished (those taken from a journal took no time and do not count).
    Trials of different sizes say so by their `work` (a grid's nodes: a 150 x 150 live
    run takes 50 times a 17 x 25 one), `work` the sum of theirs to run: the time left is
    then the work left at the pace so far, not the trials left at the mean trial's."""

    def __init__(self, to_run: int, jobs: int, clock: Clock = time.monotonic,
                 work: float | None = None) -> None:
        self.to_run = to_run
        self.jobs = max(1, min(jobs, to_run))
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.work_left = float(to_run) if work is None else work
        self.work_done = 0.0
        self._left: float | None = None
        self._at = self.start

    def finished(self, work: float = 1.0) -> None:
        """One more trial done, of `work`: estimate again. `jobs` trials run side by
        side, so after k of them each took the elapsed time over the rounds of `jobs`
        so far, and a unit of work that over the mean work of a trial."""
        self.done += 1
        self.work_done += work
        self.work_left = max(0.0, self.work_left - work)
        self._at = self.clock()
        per_trial = (self._at - self.start) / math.ceil(self.done / self.jobs)
        per_work = per_trial / (self.work_done / self.done) if self.work_done > 0 else 0.0
        self._left = per_work * self.work_left / self.jobs

    def left(self) -> float | None:
        """Seconds left, counting down since the last estimate; None before the first
        trial has finished."""
        if self._left is None:
            return None
        return max(0.0, self._left - (self.clock() - self._at))

    def said(self) -> str:
        """The time left in words, for a line or the bar."""
        left = self.left()
        if left is None:
            return "time left: after the first trial"
        return "done" if self.done >= self.to_run else f"{about(left)} left"


class Left(ProgressColumn):
    """The bar's time left, from an `Estimate`."""

    def __init__(self, estimate: Estimate) -> None:
        super().__init__()
        self.estimate = estimate

    def render(self, task: Task) -> Text:
        return Text(self.estimate.said(), style="progress.remaining")


def taking(taken: int, total: int, journal: Path) -> str:
    """The line of a sweep that takes trials an earlier run of it finished."""
    if taken == total:
        return f"taking all {total} trials from {journal}: every one finished earlier"
    return (f"taking {taken} of {total} trials from {journal} (finished earlier with the "
            f"same settings); running the other {total - taken}")


def interrupted(finished: int, total: int, run_dir: Path) -> str:
    """The one line of a sweep stopped by Ctrl-C: what is kept and how to go on."""
    rest = f"the same command with --out {run_dir} runs only the other {total - finished}"
    if not finished:
        return f"interrupted before any of {total} trials finished; {rest}"
    return (f"interrupted: {finished} of {total} trials finished, kept in "
            f"{run_dir / 'journal.jsonl'}; {rest}")
