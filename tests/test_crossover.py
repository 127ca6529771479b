"""`meshdl experiment crossover`: mesh against cloud by grid size, MAC and radio on small
grids (each point a live run, priced under every MAC the radio has), the fitted
crossover worked out by hand on synthetic points, and a stopped sweep taken up from its
journal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from meshdl.experiments import crossover
from meshdl.experiments.runner import Trial
from tests.helpers import assert_one_line_error
from tests.test_cli_simulate import _meshdl

SMALL = ("--grid", "3x4,4x5", "--radio", "802.15.4,ble", "--filters", "3")


def _sweep(out: Path, *extra: str) -> dict:
    code, stdout, err = _meshdl("experiment", "crossover", "--out", out, "--json", *SMALL,
                                *extra)
    assert code == 0, err
    return json.loads(stdout)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("crossover") / "run"
    return _sweep(out), out


def test_each_point_prices_mesh_and_cloud_under_every_mac_its_radio_has(
        small: tuple[dict, Path]) -> None:
    summary, out = small
    assert [row["value"] for row in summary["rows"]] == [
        [3, 4, "802.15.4"], [4, 5, "802.15.4"], [3, 4, "ble"], [4, 5, "ble"]]
    for row in summary["rows"]:
        radio = row["value"][2]
        assert row["nodes"]["mean"] == row["value"][0] * row["value"][1]
        for mac in crossover.MACS:
            if radio == "ble" and mac == "lpl":  # BLE has no CCA to sample with
                assert row[f"{mac}_ratio"] is None
                continue
            mesh, cloud = row[f"{mac}_mesh_j"]["mean"], row[f"{mac}_cloud_j"]["mean"]
            assert row[f"{mac}_ratio"]["mean"] == pytest.approx(mesh / cloud)
            # More joules a slot, an earlier death.
            assert (mesh > cloud) == (row[f"{mac}_mesh_years"]["mean"]
                                      < row[f"{mac}_cloud_years"]["mean"])
        # Drift compensation shortens the scheduled MAC's guard: less for both sides.
        assert row["scheduled-compensated_mesh_j"]["mean"] < row["scheduled_mesh_j"]["mean"]
        assert row["scheduled-compensated_cloud_j"]["mean"] < \
            row["scheduled_cloud_j"]["mean"]
    assert (out / "crossover.png").stat().st_size > 0
    assert {entry["mac"] for entry in summary["crossover"]} == set(crossover.MACS)
    assert summary["table"]["header"][:4] == ["grid", "nodes", "radio", "MAC"]


def test_a_point_is_the_live_run_of_its_grid(small: tuple[dict, Path], tmp_path: Path
                                             ) -> None:
    """The 4 x 5 point on 802.15.4 is `simulate live --mac scheduled` of that grid."""
    summary, _ = small
    point = next(row for row in summary["rows"] if row["value"] == [4, 5, "802.15.4"])
    code, stdout, err = _meshdl("simulate", "live", "--rows", "4", "--cols", "5", "--pool",
                                "global", "--filters", "3", "--mac", "scheduled",
                                "--slots", "4", "--seed", "0", "--out", tmp_path / "run",
                                "--json")
    assert code == 0, err
    report = json.loads(stdout)
    for side in ("mesh", "cloud"):
        assert point[f"scheduled_{side}_j"]["mean"] == pytest.approx(
            report[side]["hottest_node_j_per_slot"], rel=1e-9)
        assert point[f"tsch_{side}_j"]["mean"] == pytest.approx(
            report["macs"]["tsch"][side]["hottest_node_j_per_slot"], rel=1e-9)


def test_int8_static_points_are_the_live_runs_of_int8_static_with_16_bit_readings(
        small: tuple[dict, Path], tmp_path: Path) -> None:
    """`--activations int8-static`: the mesh's forward messages carry codes, the cloud
    ships 16-bit readings (fewer bytes on both sides than float32), and a point is
    `simulate live --activations int8-static` of its grid."""
    floats, _ = small
    code, stdout, err = _meshdl("experiment", "crossover", "--out", tmp_path / "int8",
                                "--json", "--grid", "4x5", "--radio", "802.15.4",
                                "--filters", "3", "--activations", "int8-static")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["activations"] == "int8-static"
    point = summary["rows"][0]
    before = next(row for row in floats["rows"] if row["value"] == [4, 5, "802.15.4"])
    for side in ("mesh", "cloud"):
        assert point[f"{side}_bytes"]["mean"] < before[f"{side}_bytes"]["mean"]
    code, stdout, err = _meshdl("simulate", "live", "--rows", "4", "--cols", "5", "--pool",
                                "global", "--filters", "3", "--mac", "scheduled",
                                "--slots", "4", "--seed", "0", "--activations",
                                "int8-static", "--out", tmp_path / "run", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    for side in ("mesh", "cloud"):
        assert point[f"{side}_bytes"]["mean"] == report[side]["bytes_per_slot"]
        assert point[f"scheduled_{side}_j"]["mean"] == pytest.approx(
            report[side]["hottest_node_j_per_slot"], rel=1e-9)


def test_the_floor_is_a_node_that_only_syncs_and_sleeps_by_hand() -> None:
    """802.15.4 (CC2420 at 3 V: TX 52.2 mW, RX and listening 56.4 mW, regulator off 0.06
    uW) on a Cortex-M4 node (nRF52832 asleep with RTC and RAM: 2.2 uA at 3 V), a 30-minute
    slot under the scheduled MAC: the sync flood's 2 receptions and 2 sends of a 25-byte
    frame (0.8 ms each), the guard 2 x 40 ppm x 1,800 s = 0.144 s early plus three
    turnarounds listening, the radio asleep the rest, the processor asleep throughout."""
    from meshdl.sim.radio.device import device
    from meshdl.sim.radio.mac import MacParams
    from meshdl.sim.radio.profiles import profile

    air, turn = 8 * 25 / 250e3, 192e-6
    listen = 2 * 40e-6 * 1800 + 3 * turn
    on = 4 * air + listen
    radio_j = 2 * air * 52.2e-3 + 2 * air * 56.4e-3 + listen * 56.4e-3 + (1800 - on) * 6e-8
    processor_j = 1800 * 2.2e-6 * 3
    floor = crossover.floor_j("scheduled", profile("802.15.4"), device("cortex-m4"), 1800.0,
                              MacParams())
    assert floor == pytest.approx(radio_j + processor_j, rel=1e-9)
    compensated = crossover.floor_j("scheduled", profile("802.15.4"), device("cortex-m4"),
                                    1800.0, MacParams(sched_drift_compensation=True))
    assert floor - compensated == pytest.approx(2 * 38e-6 * 1800 * (56.4e-3 - 6e-8))


def test_no_point_draws_less_than_its_floor(small: tuple[dict, Path]) -> None:
    for row in small[0]["rows"]:
        for mac in crossover.MACS:
            if row[f"{mac}_ratio"] is not None:
                assert row[f"{mac}_floor_j"]["mean"] <= row[f"{mac}_mesh_j"]["mean"]
                assert row[f"{mac}_floor_ratio"]["mean"] <= row[f"{mac}_ratio"]["mean"]


def test_the_fitted_crossover_is_where_the_lines_meet_by_hand() -> None:
    """Cloud 0.01 + 2e-5 N, mesh 0.02 flat: equal at N = (0.02 - 0.01) / 2e-5 = 500,
    half at (2 x 0.02 - 0.01) / 2e-5 = 1,500, a tenth at (0.2 - 0.01) / 2e-5 = 9,500."""
    rows = []
    for nodes in (100, 400, 2500):
        row = {"value": [nodes, 1, "802.15.4"], "nodes": {"mean": float(nodes)},
               "tsch_mesh_j": {"mean": 0.02}, "tsch_cloud_j": {"mean": 0.01 + 2e-5 * nodes}}
        rows.append(row)
    [entry] = crossover.crossovers(rows, macs=["tsch"])
    assert entry["mesh_line"] == pytest.approx([0.02, 0.0], abs=1e-15)
    assert entry["cloud_line"] == pytest.approx([0.01, 2e-5])
    for factor, nodes, within in ((1, 500, True), (2, 1500, True), (10, 9500, False)):
        at = entry[f"{factor}x"]
        assert at["nodes"] == pytest.approx(nodes)
        assert at["side"] == pytest.approx(math.sqrt(nodes))
        assert at["within"] is within


def test_lines_that_never_meet_at_a_positive_size_have_no_crossover() -> None:
    mesh = crossover.Line(0.05, 0.0)
    assert crossover.crossing(mesh, crossover.Line(0.01, 0.0), 1) is None  # parallel
    # The mesh above the cloud and growing faster: they met before any node.
    assert crossover.crossing(crossover.Line(0.04, 1e-4), crossover.Line(0.03, 1e-5), 1) \
        is None
    assert crossover.fit_line([5.0, 5.0], [1.0, 2.0]) is None


def test_a_stopped_sweep_takes_up_its_journal(small: tuple[dict, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal with the first point finished (and the next cut mid-line, as a kill
    leaves it): the same command runs the other points only, to the same summary."""
    summary, out = small
    lines = (out / "journal.jsonl").read_text().splitlines()
    again = tmp_path / "again"
    again.mkdir()
    (again / "journal.jsonl").write_text(lines[0] + "\n" + lines[1][:40])
    ran: list[list] = []
    real = crossover.run

    def counted(trial: Trial) -> dict:
        ran.append(trial.value)
        return real(trial)

    monkeypatch.setattr(crossover, "run", counted)
    resumed = _sweep(again)
    first = json.loads(lines[0])["value"]
    assert first not in ran and len(ran) == 3
    assert resumed["rows"] == summary["rows"]
    assert resumed["crossover"] == summary["crossover"]


@pytest.mark.parametrize(("args", "needle"), [
    (("--grid", "4by5"), "--grid"),
    (("--mac", "csma"), "--mac"),
    (("--radio", "wifi"), "wifi"),
    (("--grid", "4x5,4x5"), "distinct"),
])
def test_what_cannot_be_swept_is_a_one_line_error(tmp_path: Path, args: tuple[str, ...],
                                                  needle: str) -> None:
    code, _, err = _meshdl("experiment", "crossover", "--out", tmp_path / "run", *args)
    assert_one_line_error(code, err, 2, needle)


def test_the_commands_defaults_in_help_are_the_experiments_own() -> None:
    from meshdl.cli import experiment as cli

    assert tuple(f"{rows}x{cols}" for rows, cols in crossover.GRIDS) == cli.CROSSOVER_GRIDS
    assert cli.CROSSOVER_RADIOS == crossover.RADIOS
    assert cli.CROSSOVER_MACS == crossover.MACS
