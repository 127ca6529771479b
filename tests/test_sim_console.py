"""`meshdl simulate train|infer` on the console and in sim.json's headline: the dead
cells are named where a user reads (issue 33, item 7), and several meshes report the
run's real elapsed simulated time, so that `--overlap` shows (item 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_simulate import _meshdl

DEAD = ("--dead", "0.1", "--recovery", "best-effort")


def _run(*args: str | Path) -> tuple[dict, str]:
    """`meshdl simulate ARGS` on the 6 x 8 test data: (sim.json, stderr as one line)."""
    code, _, err = _meshdl("simulate", *args)
    assert code == 0, err
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / "sim.json").read_text()), " ".join(err.split())


@pytest.mark.parametrize("command", [
    ("train", "--epochs", "1", "--batch", "60", "--hidden", "8"), ("infer",)])
def test_simulate_with_dead_nodes_names_the_dead_cells_on_the_console(
        small_data_file, tmp_path, command) -> None:
    sim, err = _run(*command, "--data", small_data_file, *DEAD, "--out", tmp_path / "run")
    down = sim["faults"]["down_cells"]
    assert down  # 10 % of 48 cells
    line = err[err.index("dead cells: "):]
    for cell in down:
        assert cell in line
    # Every down cell found (the roll call, before the first wave): named once, as such.
    planned = line if "(found and planned around)" in line else \
        line[line.index("planned around"):]
    for cell in sim["faults"]["dead_cells"]:
        assert cell in planned


def test_the_dead_cells_line_tells_found_from_not_found() -> None:
    from meshdl.cli.simulate import dead_cells_line

    faults = {"down_cells": ["r0c3", "r3c3"], "dead_cells": ["r0c3"],
              "cut_off_cells": [], "edge_at": "r0c0"}
    assert dead_cells_line(faults) == ("dead cells: r0c3, r3c3; planned around: r0c3; "
                                       "not found by the end: r3c3; edge at r0c0")
    faults["dead_cells"] = ["r0c3", "r3c3"]
    assert dead_cells_line(faults) == ("dead cells: r0c3, r3c3 (found and planned "
                                       "around); edge at r0c0")
    assert dead_cells_line({"down_cells": [], "dead_cells": []}) is None


def test_a_run_without_dead_nodes_prints_no_dead_cells_line(small_data_file, tmp_path) -> None:
    _, err = _run("infer", "--data", small_data_file, "--out", tmp_path / "run")
    assert "dead cells" not in err


@pytest.fixture(scope="module")
def overlapped(small_data_file, tmp_path_factory) -> dict[bool, dict]:
    """Two meshes, one epoch of 2 steps each, with and without --overlap: sim.json."""
    root = tmp_path_factory.mktemp("meshes")
    return {on: _run("train", "--data", small_data_file, "--epochs", "1", "--batch", "60",
                     "--hidden", "8", "--meshes", "2",
                     "--overlap" if on else "--no-overlap", "--out", root / str(on))[0]
            for on in (True, False)}


def test_several_meshes_makespan_total_is_the_runs_elapsed_time(overlapped) -> None:
    for sim in overlapped.values():
        span = sim["makespan_s"]
        assert span["total"] == sim["parallel"]["elapsed"]
        assert span["per_epoch_mean"] == sim["parallel"]["elapsed"]  # one epoch
        # The first mesh's own waves, the figure `total` held before, are kept.
        assert span["first_mesh_waves"] == sim["meshes"][0]["makespan_s"]


def test_overlap_shows_in_the_headline_makespan(overlapped) -> None:
    # The meshes compute the same waves either way; only the run's elapsed time moves.
    assert (overlapped[True]["makespan_s"]["first_mesh_waves"]
            == overlapped[False]["makespan_s"]["first_mesh_waves"])
    assert overlapped[True]["makespan_s"]["total"] != overlapped[False]["makespan_s"]["total"]


def test_one_mesh_keeps_its_makespan_fields_as_they_were(small_data_file, tmp_path) -> None:
    sim, _ = _run("train", "--data", small_data_file, "--epochs", "1", "--batch", "60",
                  "--hidden", "8", "--out", tmp_path / "run")
    assert list(sim["makespan_s"]) == ["per_wave_mean", "forward_mean", "total",
                                       "per_epoch_mean"]
    assert "parallel" not in sim
