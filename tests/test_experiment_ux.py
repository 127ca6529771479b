"""`meshdl experiment` as a researcher meets it (issue 33, items 3, 4 and 6): list flags
that repeat or take a comma list, defaults in --help, the trials and the time left said
as the sweep runs, one line on Ctrl-C, and tables people read: one title per figure
everywhere, units and separators, `±` only where seeds differ, the headline first, and
a table.csv with one column per swept variable."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from meshdl.experiments.runner import Trial
from tests.helpers import assert_one_line_error
from tests.test_cli_simulate import _meshdl

DOCS = Path(__file__).resolve().parent.parent / "docs" / "experiments.md"
# Three small grids, cost only (a mesh wave each): a sweep of three trials in a second.
# Repeated rather than a comma list, so that today's main meets the behaviour each test
# is about rather than the list syntax.
THREE_GRIDS = ("--values", "3", "--values", "5", "--values", "7")


# ------------------------------------------------------------------ item 4: list flags
def test_a_list_flag_takes_a_comma_list_as_well_as_repetition(tmp_path) -> None:
    """`--values 3,5` is `--values 3 --values 5` (grid: cost only, two waves)."""
    code, out, err = _meshdl("experiment", "grid", "--values", "3,5", "--out",
                             tmp_path / "commas", "--json")
    assert code == 0, err
    code, again, err = _meshdl("experiment", "grid", "--values", "3", "--values", "5",
                               "--out", tmp_path / "repeated", "--json")
    assert code == 0, err
    assert [row["value"] for row in json.loads(out)["rows"]] == [3, 5]
    assert json.loads(out)["rows"] == json.loads(again)["rows"]


@pytest.mark.parametrize(("flags", "needle"), [
    (("--fractions", "0,0.95"), "distinct shares from 0 to 0.9"),  # parsed, then checked
    (("--policies", "zero,reliable"), "need best effort")])
def test_fault_shares_and_policies_parse_as_comma_lists(tmp_path, flags, needle) -> None:
    code, _, err = _meshdl("experiment", "failures", *flags, "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("command", "flag", "first", "second"), [
    ("filter-size", "--sizes", "3", "4"), ("failures", "--fractions", "0", "0.1"),
    ("edge-position", "--cells", "0,0", "0,4")])
def test_a_list_flag_given_two_values_at_once_says_it_repeats_or_takes_a_comma_list(
        tmp_path, command, flag, first, second) -> None:
    code, _, err = _meshdl("experiment", command, flag, first, second, "--out",
                           tmp_path / "run")
    assert_one_line_error(code, err, 2, f"{flag} {first} {flag} {second}",
                          f"{flag} {first},{second}")
    assert not (tmp_path / "run").exists()


def test_a_value_that_is_no_number_names_itself_and_the_list_forms(tmp_path) -> None:
    code, _, err = _meshdl("experiment", "loss", "--rates", "0,x", "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "'x'", "not a number", "--rates repeats or takes "
                          "a comma list")


def test_help_shows_the_grid_and_epochs_an_unset_flag_leaves(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    code, out, err = _meshdl("experiment", "failures", "--help")
    assert code == 0, err
    text = " ".join(out.split())
    for shown in ("[default: 17, or the --data set's grid]",
                  "[default: 25, or the --data set's grid]",
                  "Training epochs. [default: 20; with --pool global 40 on 2,400 maps or "
                  "fewer, 12 on the default 163,200]",
                  "Filters per conv layer. [default: 5; 16 with --pool global]",
                  "Conv layers. [default: 2; 3 with --pool global on more than 2,400 maps]",
                  "[default: 0.0; 0.05-0.25 (30% clean) with --pool global]",
                  "[default: 0.0, 0.05, 0.1, 0.2]", "Repeat the flag or give a comma list"):
        assert shown in text, shown


# ------------------------------------------------------------------ item 4: time left
def test_a_sweep_says_its_trials_up_front_and_the_time_left_after_each(
        tmp_path, monkeypatch) -> None:
    import meshdl.cli.experiment as experiment

    works = []
    real = experiment.Estimate

    def estimate(to_run, jobs, clock=None, work=None):  # the time left's weights, kept
        works.append(work)
        return real(to_run, jobs, work=work)

    monkeypatch.setattr(experiment, "Estimate", estimate)
    code, _, err = _meshdl("experiment", "grid", *THREE_GRIDS, "--out", tmp_path / "run")
    assert code == 0, err
    assert works == [3 * 3 + 5 * 5 + 7 * 7]  # each grid's trial weighs its cells
    lines = err.replace("\n/", " /").splitlines()  # the run directory may wrap
    first = " ".join(err.split())
    assert first.startswith("grid: 3 trials") and \
        "the time left shows once the first trial has finished" in first
    trial_lines = [line for line in lines if line.startswith("trial ")]
    assert [line.split(":")[0] for line in trial_lines] == ["trial 1/3", "trial 2/3",
                                                            "trial 3/3"]
    assert all(line.endswith(" left") for line in trial_lines[:2])  # not after the last
    assert "left" not in trial_lines[2]


class Clock:
    """A clock the test moves: durations without waiting for them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_time_left_is_the_measured_trial_time_spread_over_the_jobs() -> None:
    from meshdl.cli.sweep_progress import Estimate, Left, about

    clock = Clock()
    estimate = Estimate(to_run=10, jobs=2, clock=clock)
    assert estimate.left() is None and "after the first trial" in estimate.said()
    clock.now += 120  # the first trial, with one beside it: 120 s a trial, 2 at once
    estimate.finished()
    assert estimate.left() == pytest.approx(120 * 9 / 2)
    assert estimate.said() == "about 9 min left"
    clock.now += 60  # counts down between trials
    assert estimate.said() == "about 8 min left"
    assert Left(estimate).render(None).plain == "about 8 min left"  # the bar's column
    clock.now += 0  # the second of the first pair, at once: 90 s a trial now
    estimate.finished()
    assert estimate.left() == pytest.approx(180 * 8 / 2)
    assert [about(s) for s in (20, 90, 3600, 3900, 7500)] == [
        "under a minute", "about 2 min", "about 1 h", "about 1 h 5 min", "about 2 h 5 min"]


def test_trials_of_different_sizes_leave_the_work_left_at_the_pace_so_far() -> None:
    """A crossover sweep's first trial, 17 x 25, is over in seconds; its 150 x 150 takes
    minutes: the time left is the nodes left at the pace of the nodes done, not the
    trials left at the first trial's time."""
    from meshdl.cli.sweep_progress import Estimate

    clock = Clock()
    nodes = [425, 1_200, 22_500]
    estimate = Estimate(to_run=3, jobs=1, clock=clock, work=sum(nodes))
    clock.now += 4.25  # 10 ms a node
    estimate.finished(nodes[0])
    assert estimate.left() == pytest.approx(0.01 * (1_200 + 22_500))
    assert estimate.said() == "about 4 min left"  # 2 trials at 4.25 s: "under a minute"
    clock.now += 24.0  # 20 ms a node: the pace is the work's, 28.25 s over 1,625 nodes
    estimate.finished(nodes[1])
    assert estimate.left() == pytest.approx(28.25 / 1_625 * 22_500)


# ------------------------------------------------------------------ item 3: Ctrl-C, reruns
def test_ctrl_c_during_a_sweep_says_in_one_line_what_finished_and_how_to_go_on(
        tmp_path, monkeypatch) -> None:
    import meshdl.cli.experiment as experiment

    def two_then_ctrl_c(run, trials, jobs, on_done, ray=None, journal=None):
        for trial in trials[:2]:
            on_done(trial, run(trial))
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_trials", two_then_ctrl_c)
    run_dir = tmp_path / "run"
    code, out, err = _meshdl("experiment", "grid", *THREE_GRIDS, "--out", run_dir)
    assert code == 130 and out == ""
    last = err.strip().split("\ntrial 2/3")[-1].split("\n", 1)[-1]
    said = " ".join(last.split())
    assert said == (f"interrupted: 2 of 3 trials finished, kept in {run_dir}/journal.jsonl; "
                    f"the same command with --out {run_dir} runs only the other 1")
    assert "Traceback" not in err


def test_a_rerun_says_it_takes_the_journals_finished_trials(tmp_path) -> None:
    run_dir = tmp_path / "run"
    code, _, err = _meshdl("experiment", "grid", "--values", "3", "--out", run_dir)
    assert code == 0, err
    code, _, err = _meshdl("experiment", "grid", "--values", "3", "--values", "5", "--out", run_dir)
    assert code == 0, err
    said = " ".join(err.split())
    assert (f"taking 1 of 2 trials from {run_dir}/journal.jsonl (finished earlier with the "
            "same settings); running the other 1") in said
    assert "trial 2/2" in said and "trial 1/2" not in said


def _sleepy(trial: Trial) -> dict:  # module level: a worker process gets it by name
    import time

    time.sleep(600)
    return {"value": trial.value}


_SWEEP = """
import multiprocessing, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the shell ignores it
from meshdl.experiments.runner import Trial, run_trials
from tests.test_experiment_ux import _sleepy

def say_workers():
    while len(multiprocessing.active_children()) < 2:
        time.sleep(0.1)
    open(sys.argv[1], "w").write(" ".join(str(c.pid) for c in multiprocessing.active_children()))

if __name__ == "__main__":
    threading.Thread(target=say_workers, daemon=True).start()
    try:
        run_trials(_sleepy, [Trial(i, i, 0, {}) for i in range(6)], jobs=2)
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_ctrl_c_stops_a_pool_of_trials_rather_than_waiting_for_them(tmp_path) -> None:
    """The sweep ends its workers on Ctrl-C: a pool shutting down would wait for every
    running trial (here ten minutes each; the test's wait is a hang guard)."""
    import os
    import signal
    import subprocess
    import sys
    import time as _time

    pids, script = tmp_path / "pids", tmp_path / "sweep.py"
    script.write_text(_SWEEP)
    root = Path(__file__).resolve().parent.parent
    parent = subprocess.Popen([sys.executable, str(script), str(pids)], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    deadline = _time.monotonic() + 120
    while not pids.exists() and _time.monotonic() < deadline:
        _time.sleep(0.2)
    workers = [int(pid) for pid in pids.read_text().split()]
    try:
        parent.send_signal(signal.SIGINT)
        assert parent.wait(timeout=120) == 130  # a hang guard, not a duration
        assert not [pid for pid in workers if _alive(pid)]
    finally:
        for pid in [parent.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ------------------------------------------------------------------ item 6: tables
def _figure(mean: float, std: float = 0.0) -> dict:
    return {"mean": mean, "std": std}


def test_a_table_shows_plus_minus_only_from_two_seeds_up_and_where_they_differ() -> None:
    from meshdl.experiments import sweep

    def row(seeds: int, std: float) -> dict:
        return {"value": 3, "seeds": seeds, "test_acc": _figure(0.9712, std),
                "train_acc": _figure(0.98, std), "halo_transmitted": _figure(18912),
                "halo_formula": _figure(20400), "wave_bytes": _figure(26.8e6)}

    one, agree, differ = (sweep.table("filters", [row(*args)]).rows[0]
                          for args in ((1, 0.0), (3, 0.0), (3, 0.004)))
    assert one[1] == agree[1] == "97.1"
    assert differ[1] == "97.1 ± 0.4"
    assert "±" not in "".join(one + agree)


def test_bytes_have_units_and_numbers_thousands_separators() -> None:
    from meshdl.experiments.columns import digits, fixed, size

    assert size(3033900768, None) == "3.03 GB"
    assert size(26_812_345, 104_000) == "26.8 ± 0.1 MB"
    assert size(236_000, None) == "236 kB" and size(512, None) == "512 B"
    assert fixed(0)(169189.0, 62.4) == "169,189 ± 62"
    assert digits(4)(11210.0, None) == "11,210"


def test_the_headline_accuracy_leads_the_table_and_every_figure_has_its_title(
        small_data_file, tmp_path) -> None:
    from meshdl.experiments.columns import TITLES

    run = tmp_path / "run"
    code, out, err = _meshdl("experiment", "filter-size", "--sizes", "3", "--seeds", "1",
                             "--epochs", "1", "--batch", "40", "--hidden", "8", "--data",
                             small_data_file, "--out", run, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["table"]["header"][:3] == ["k", "test %", "train %"]
    assert summary["columns"][0] == {"key": "test_acc", "title": "test %"}
    assert all(column["title"] == TITLES[column["key"]] for column in summary["columns"])
    assert "±" not in json.dumps(summary["table"]["rows"], ensure_ascii=False)  # one seed
    header = next(csv.reader((run / "table.csv").open()))
    assert header[:4] == ["value", "seeds", "test_acc_mean", "test_acc_std"]
    assert next(csv.DictReader((run / "table.csv").open()))["test_acc_std"] == ""


def test_the_console_table_is_the_one_summary_json_keeps(tmp_path) -> None:
    run = tmp_path / "run"
    code, out, err = _meshdl("experiment", "grid", "--values", "3", "--values", "5", "--out", run)
    assert code == 0, err
    table = json.loads((run / "summary.json").read_text())["table"]
    assert table["header"] == ["n x n", "halo sent", "(k²-1) mn·c_in", "wave bytes",
                               "rounds", "busiest link"]
    printed = [[cell.strip() for cell in line.split("│")] for line in out.splitlines()
               if "│" in line]
    assert printed == table["rows"]
    assert table["rows"][0][3].endswith(" kB") and table["title"] in out


def test_table_csv_has_one_column_per_swept_variable(tmp_path) -> None:
    from meshdl.experiments.runner import write_run

    summary = {"rows": [{"value": [0.1, "zero"], "seeds": 3, "test_acc": _figure(0.9, 0.01)},
                        {"value": [0.0, "exact"], "seeds": 1, "test_acc": _figure(0.95)}]}
    write_run(tmp_path, {}, [], summary, ["test_acc"], ("loss", "policy"))
    rows = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert [(r["loss"], r["policy"], r["test_acc_mean"], r["test_acc_std"]) for r in rows] \
        == [("0.1", "zero", "0.9", "0.01"), ("0.0", "exact", "0.95", "")]


def test_edge_position_writes_the_edges_row_and_column_apart(tmp_path) -> None:
    run = tmp_path / "run"
    code, _, err = _meshdl("experiment", "edge-position", "--rows", "6", "--cols", "9",
                           "--cells", "0,0", "--cells", "0,4", "--out", run, "--json")
    assert code == 0, err
    rows = list(csv.DictReader((run / "table.csv").open()))
    assert [(r["edge_row"], r["edge_col"]) for r in rows] == [("0", "0"), ("0", "4")]


# A table's column headings people read as figures' names: a figure's title, a swept
# variable's heading, the seeds.
VARIABLES = {"seeds", "policy", "loss %", "dead %", "radio", "N", "mode", "straggler",
             "epsilon"}


def _headers(doc: Path) -> list[list[str]]:
    """The column headings of every table of `doc`, table by table."""
    lines = doc.read_text().splitlines()
    return [[cell.strip() for cell in lines[i].strip().strip("|").split("|")]
            for i in range(len(lines) - 1)
            if lines[i].startswith("|") and re.match(r"\|\s*-", lines[i + 1])]


def _known() -> set[str]:
    from meshdl.experiments.columns import TITLES
    from meshdl.experiments.sweep import SWEEPS

    return {*TITLES.values(), *(s.heading for s in SWEEPS.values()), *VARIABLES}


def test_the_docs_tables_use_the_figures_titles() -> None:
    """docs/experiments.md names each figure as the console does: every column of its
    tables is a figure's title, a swept variable's heading, or the seeds (the first
    table lists the run directory's files)."""
    known = _known() | {"paper test/train %", "file", "what"}
    headers = _headers(DOCS)
    titles = {cell for header in headers for cell in header}
    assert len(headers) > 5 and titles <= known, titles - known


@pytest.mark.parametrize(("doc", "tables", "derived"), [
    ("parallel.md", 3, {"exposed, hidden by overlap"}), ("compression.md", 3, set())])
def test_the_parallel_and_compression_docs_name_figures_by_their_titles(
        doc, tables, derived) -> None:
    """docs/parallel.md and docs/compression.md name an experiment's figures as its
    table does. Their experiments' tables (those whose first column is a swept
    variable: N, mode, policy, epsilon) head each column with a figure's title, a
    variable, a mode whose figures the column holds ("bsp+overlap"), or a title for one
    mode ("step s, bsp"); `derived` are figures of the doc's own, said in its text.
    Tables of other things (compressors, radios, plans) keep their own headings."""
    from meshdl.experiments.meshes import MODES

    known = _known() | set(MODES)
    ours = [h for h in _headers(DOCS.parent / doc) if h[0] in VARIABLES]
    strays = {cell for header in ours for cell in header[1:] if cell not in known | derived
              and not (cell.rpartition(", ")[0] in known and cell.rpartition(", ")[2]
                       in MODES)}
    assert len(ours) == tables and not strays, strays
