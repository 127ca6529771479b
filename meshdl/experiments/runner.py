"""Running an experiment's trials and writing its run directory.

An experiment is a list of trials (one swept value and one seed each) and a function
that runs one trial to a JSON-able record. The runner runs them here or in worker
processes (`jobs`), always collecting the records in trial order, so that the same seeds
give the same `summary.json` whatever the number of jobs. The run directory holds:

    config.json     the experiment, its swept values, seeds and the resolved run config
    journal.jsonl   each trial as it finishes (value, seed, settings, record): a sweep
                    given the directory of one that was stopped takes up the trials it
                    finished with the same settings, and runs only the rest
    trials.jsonl    one line per trial, in trial order
    summary.json    per swept value: each figure's mean and standard deviation
    table.csv       the summary as a table
    *.png           the experiment's plots
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, NamedTuple

Record = dict[str, Any]


class Trial(NamedTuple):
    """One run of an experiment: the swept value, the seed, and the experiment's settings
    (JSON-able: a worker process gets them with the trial)."""

    index: int
    value: Any
    seed: int
    settings: Record


def run_trials(run: Callable[[Trial], Record], trials: Sequence[Trial], jobs: int = 1,
               on_done: Callable[[Trial, Record], None] | None = None,
               ray: str | None = None, journal: Path | None = None) -> list[Record]:
    """Every trial's record, in trial order. `jobs` > 1 runs them in that many worker
    processes (`run` must be a module-level function: it is sent by name); `ray` runs
    them as Ray tasks instead (an address, or "local" for a cluster on this machine);
    `on_done` hears of each as it finishes, in whatever order they do. `journal`: a
    file where each finished trial is added at once; the trials it already holds (same
    value, seed and settings) are taken from it rather than run again."""
    records: list[Record | None] = [None] * len(trials)
    if journal is not None:
        finished, stamps = read_journal(journal), {}
        for trial in trials:
            record = finished.get(journal_key(trial, stamps))
            if record is not None:
                records[trial.index] = record
        trials = [trial for trial in trials if records[trial.index] is None]
        if not trials:  # every one journaled: start no workers, no cluster
            return [record for record in records if record is not None]
        on_done = _journaling(journal, on_done)
    if ray is not None:
        for trial, record in _on_ray(run, trials, ray, jobs):
            records[trial.index] = record
            if on_done:
                on_done(trial, record)
    elif jobs <= 1:
        for trial in trials:
            records[trial.index] = run(trial)
            if on_done:
                on_done(trial, records[trial.index])
    else:
        # spawn, not fork: a worker starts clean (no copy of this process's threads or
        # locks) and loads the compiled kernels from Numba's cache.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                                 initializer=start_worker,
                                 initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(run, trial): trial for trial in trials}
            try:
                for future in as_completed(futures):
                    trial = futures[future]
                    records[trial.index] = future.result()
                    if on_done:
                        on_done(trial, records[trial.index])
            except BaseException:  # Ctrl-C, or a trial that failed: stop the others now
                stop_workers(pool)
                raise
    return [record for record in records if record is not None]


def start_worker(parent: int) -> None:
    """In a worker: leave Ctrl-C to the sweep (the terminal sends it to the workers too:
    each would print its own traceback, and a pool worker goes on to its next trial
    after one), and end with the sweep's process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End a pool's trials now: queued ones are cancelled, running ones killed (a pool
    shutting down waits for every running trial, minutes each). The pool keeps its
    processes private; without them, the workers end with the sweep (exit_with_parent)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown
    pool.shutdown(wait=False, cancel_futures=True)  # forgets them
    for process in processes:
        if process.is_alive():
            process.terminate()


def read_journal(path: Path) -> dict[str, Record]:
    """The records a journal holds, by trial (`journal_key`); none if there is no
    journal. A line that is not a whole entry (the sweep was killed while writing it)
    is skipped: its trial runs again."""
    finished: dict[str, Record] = {}
    if not path.exists():
        return finished
    stamps: dict[str, str | None] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            inputs = entry.get("inputs", {})  # (none in a journal of before they were)
            key = _entry_key(entry["value"], entry["seed"], entry["settings"], inputs)
            record = entry["record"]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        # Taken only while the files it read are still what they were then.
        if isinstance(record, dict) and inputs == _inputs(entry["settings"], stamps):
            finished[key] = record
    return finished


def journal_key(trial: Trial, stamps: dict[str, str | None]) -> str:
    """What makes a trial the same one: its value, seed, settings, and the contents
    of the files its settings name (a data set or model file rewritten at the same
    path makes it another trial); `stamps` keeps the files' digests once read."""
    return _entry_key(trial.value, trial.seed, trial.settings, _inputs(trial.settings, stamps))


def _entry_key(value: Any, seed: Any, settings: Any, inputs: Any) -> str:
    return json.dumps([value, seed, settings, inputs], sort_keys=True)


def _inputs(settings: Any, stamps: dict[str, str | None]) -> dict[str, str | None]:
    """The SHA-256 of each file a trial's settings name (`*_file`; None for one that
    is gone), by path; `stamps` keeps those already read."""
    if not isinstance(settings, dict):
        return {}
    out: dict[str, str | None] = {}
    for name, path in sorted(settings.items()):
        if name.endswith("_file") and isinstance(path, str):
            if path not in stamps:
                try:
                    stamps[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                except OSError:
                    stamps[path] = None
            out[path] = stamps[path]
    return out


def _journaling(path: Path, on_done: Callable[[Trial, Record], None] | None
                ) -> Callable[[Trial, Record], None]:
    """`on_done`, after adding the trial to the journal (one line, flushed at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as journal:  # end the line a killed sweep left unfinished
            journal.seek(-1, os.SEEK_END)
            if journal.read(1) != b"\n":
                journal.write(b"\n")
    stamps: dict[str, str | None] = {}

    def done(trial: Trial, record: Record) -> None:
        with path.open("a") as journal:
            journal.write(json.dumps({"value": trial.value, "seed": trial.seed,
                                      "settings": trial.settings,
                                      "inputs": _inputs(trial.settings, stamps),
                                      "record": record}, sort_keys=True) + "\n")
        if on_done:
            on_done(trial, record)

    return done


def exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """In a worker: end this process as soon as `parent` is gone (killed, even with
    SIGKILL), rather than compute orphaned trials for nobody. A daemon thread looks
    once a second; an orphan is adopted by another process, so its parent id changes."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _on_ray(run: Callable[[Trial], Record], trials: Sequence[Trial], address: str,
            jobs: int) -> Any:
    """The trials as Ray tasks (the optional extra `meshdl[ray]`), yielded as they
    finish. "local" starts a cluster on this machine for the sweep (`jobs` CPUs) and
    stops it after; an address joins that cluster."""
    try:
        import ray
    except ImportError:
        from meshdl.errors import UsageError

        raise UsageError("--ray needs Ray: pip install 'meshdl[ray]'") from None
    local = address == "local"
    if local:
        ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(run)
        pending = {task.remote(trial): trial for trial in trials}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        ray.shutdown()


def summarize(trials: Sequence[Trial], records: Sequence[Record],
              figures: Sequence[str]) -> list[Record]:
    """Per swept value (in the order first swept): the number of seeds and each
    figure's mean and sample standard deviation (0 for one seed; None where a figure is
    missing)."""
    by_value: dict[Any, list[Record]] = {}
    for trial, record in zip(trials, records, strict=True):
        by_value.setdefault(_key(trial.value), []).append(record)
    rows = []
    for value, group in by_value.items():
        row: Record = {"value": value, "seeds": len(group)}
        for name in figures:
            values = [r[name] for r in group if r.get(name) is not None]
            row[name] = _mean_std(values)
        rows.append(row)
    return rows


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _mean_std(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return {"mean": mean, "std": 0.0}
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return {"mean": mean, "std": math.sqrt(variance)}


def write_run(out: Path, config: Record, records: Sequence[Record], summary: Record,
              columns: Sequence[str], variables: Sequence[str] = ("value",)) -> None:
    """config.json, trials.jsonl, summary.json and table.csv in `out`. table.csv has one
    column per swept variable (`variables`: a list value is split into them, so that a
    spreadsheet sorts and filters by each), the seeds, then the mean and deviation of
    each of `columns` in that order (no deviation for one seed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with (out / "trials.jsonl").open("w") as lines:
        for record in records:
            lines.write(json.dumps(record, sort_keys=True) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with (out / "table.csv").open("w", newline="") as table:
        writer = csv.writer(table)
        writer.writerow([*variables, "seeds", *(f"{c}_{s}" for c in columns
                                                for s in ("mean", "std"))])
        for row in summary["rows"]:
            cells = []
            for column in columns:
                figure = row.get(column)
                if figure is None:
                    cells += ["", ""]
                    continue
                cells += [_number(figure["mean"]),
                          _number(figure["std"]) if row["seeds"] >= 2 else ""]
            writer.writerow([*_split(row["value"], variables), row["seeds"], *cells])


def _split(value: Any, variables: Sequence[str]) -> list[Any]:
    """A swept value as its variables' cells: [0.1, "zero"] -> 0.1, zero."""
    if len(variables) == 1:
        return [value]
    parts = list(value)
    if len(parts) != len(variables):
        raise ValueError(f"swept value {value!r} is not one of {', '.join(variables)}")
    return parts


def _number(value: float) -> str:
    return f"{value:.6g}"
