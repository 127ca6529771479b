"""`meshdl simulate live` end to end, in process, on small grids: the parameters go once,
the slots' alerts are central inference's, under loss too; what sim.json promises; the
repeating slots priced as the timed ones; delta suppression on both sides; one-line
errors for what cannot be simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshdl.protocol.compact import COMPACT_HEADER_BYTES
from tests.helpers import assert_one_line_error
from tests.test_cli_simulate import _meshdl

SIDE_KEYS = {"bytes_per_slot", "frames_per_slot", "hottest_node_j_per_slot",
             "first_death_years", "median_years", "first_cell"}


def _live(out: Path, *extra: str) -> dict:
    code, stdout, err = _meshdl("simulate", "live", "--out", out, "--json", *extra)
    assert code == 0, err
    return json.loads(stdout)


@pytest.fixture(scope="module")
def seed_like(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Six slots on a 6 x 8 grid of the seed network's shape, 802.15.4, default MAC."""
    return _live(tmp_path_factory.mktemp("live") / "run", "--rows", "6", "--cols", "8",
                 "--slots", "6")


def test_after_the_first_slot_no_parameter_goes_on_air_and_alerts_are_central(
        seed_like: dict) -> None:
    mesh = seed_like["mesh"]
    assert mesh["params_bytes"] == 0
    assert mesh["install_bytes"] > 2 * mesh["bytes_per_slot"]  # the PARAMS flood, once
    assert "params" not in mesh["bytes_per_slot_by_class"]
    assert seed_like["alerts_equal_central"] is True
    assert seed_like["alerts"]["mesh_differ_from_central"] == 0


def test_sim_json_holds_what_the_issue_promises(seed_like: dict, tmp_path: Path) -> None:
    assert {"slots", "mac", "battery", "alerts_equal_central", "mesh", "cloud"} <= \
        set(seed_like)
    # The default on a radio with a deep sleep: wake for the slot, sleep in between.
    assert seed_like["slots"] == 6 and seed_like["mac"] == "scheduled"
    assert seed_like["battery"]["name"] == "2xAA"
    for side in ("mesh", "cloud"):
        assert set(seed_like[side]) >= SIDE_KEYS
        figures = seed_like[side]
        assert 0 < figures["first_death_years"] <= figures["median_years"]
    # Compact radio headers: 6 bytes where the MQTT-era header had 48.
    assert seed_like["header_bytes"] == COMPACT_HEADER_BYTES == 6
    # Every MAC the radio has, priced on the same traffic.
    assert set(seed_like["macs"]) == {"always-on", "ideal", "lpl", "tsch", "scheduled"}
    macs = seed_like["macs"]
    for side in ("mesh", "cloud"):
        joules = {mac: macs[mac][side]["hottest_node_j_per_slot"] for mac in macs}
        assert joules["ideal"] < joules["tsch"] < joules["always-on"]
        assert joules["ideal"] < joules["lpl"] < joules["always-on"]
        assert joules["scheduled"] < joules["ideal"]  # the radio off, not idle, between


def test_alerts_jsonl_has_one_line_per_slot_and_the_report_puts_mesh_against_cloud(
        tmp_path: Path) -> None:
    _live(tmp_path / "run", "--rows", "4", "--cols", "5", "--slots", "3")
    lines = (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()
    assert [json.loads(line)["slot"] for line in lines] == [0, 1, 2]
    assert json.loads(lines[1])["timestamp"] == "2026-01-01T00:30:00Z"
    assert set(json.loads(lines[0])) >= {"mesh", "cloud", "central"}
    code, _, err = _meshdl("report", tmp_path / "run")
    assert code == 0, err
    page = (tmp_path / "run" / "report.html").read_text()
    assert "MAC scheduled (the run&#x27;s)" in page or "MAC scheduled (the run's)" in page
    assert page.count("first death (years)") == 5  # one table per MAC of 802.15.4


def test_another_shape_under_ten_percent_frame_loss_alerts_as_central(tmp_path: Path) -> None:
    """Reliable mode: the link layer and the senders recover every lost frame, so the
    slots' values are exact; the bytes grow by what was sent again."""
    lossless = _live(tmp_path / "clean", "--rows", "5", "--cols", "7", "--slots", "4")
    lossy = _live(tmp_path / "lossy", "--rows", "5", "--cols", "7", "--slots", "4",
                  "--loss", "0.1", "--fault-seed", "3")
    assert lossy["alerts_equal_central"] is True
    assert lossy["mesh"]["params_bytes"] == 0
    assert lossy["timed_slots"] == 4  # under loss every slot is timed
    assert lossy["mesh"]["frames_per_slot"] > lossless["mesh"]["frames_per_slot"]
    # The cloud's links lose frames too, and it sends them again as the mesh does.
    assert lossy["cloud"]["frames_per_slot"] > lossless["cloud"]["frames_per_slot"]


def test_repeating_slots_are_priced_as_the_timed_ones(tmp_path: Path) -> None:
    """Without loss or delta, two timed slots stand for eight: the same figures as timing
    all eight (only the backoffs' timing differs between slots)."""
    grid = ("--rows", "4", "--cols", "6", "--slots", "8")
    all_timed = _live(tmp_path / "all", *grid, "--timed-slots", "8")
    two_timed = _live(tmp_path / "two", *grid, "--timed-slots", "2")
    assert all_timed["timed_slots"] == 8 and two_timed["timed_slots"] == 2
    for side in ("mesh", "cloud"):
        for key in ("bytes_per_slot", "frames_per_slot", "first_cell"):
            assert two_timed[side][key] == all_timed[side][key]
        for key in ("hottest_node_j_per_slot", "first_death_years", "median_years"):
            assert two_timed[side][key] == pytest.approx(all_timed[side][key], rel=1e-9)
    assert two_timed["alerts"] == all_timed["alerts"]


def test_delta_suppression_saves_bytes_on_both_sides_and_says_what_alerts_it_cost(
        tmp_path: Path) -> None:
    grid = ("--rows", "5", "--cols", "6", "--slots", "8")
    whole = _live(tmp_path / "whole", *grid)
    delta = _live(tmp_path / "delta", *grid, "--delta", "0.5")
    assert delta["delta"] == 0.5
    assert delta["mesh"]["bytes_per_slot"] < whole["mesh"]["bytes_per_slot"]
    assert delta["cloud"]["bytes_per_slot"] < whole["cloud"]["bytes_per_slot"]
    alerts = delta["alerts"]
    assert {"mesh_differ_from_central", "cloud_differ_from_central"} <= set(alerts)
    assert delta["alerts_equal_central"] == (alerts["mesh_differ_from_central"] == 0)


@pytest.mark.parametrize(("args", "needle"), [
    (("--radio", "lora-sf7", "--mac", "tsch"), "--mac tsch"),
    (("--recovery", "best-effort"), "reliable mode"),
    (("--slots", "1"), "--slots"),
    (("--slot-seconds", "-5"), "--slot-seconds"),
    (("--delta", "-1"), "--delta"),
])
def test_what_cannot_be_simulated_is_a_one_line_error(tmp_path: Path, args: tuple[str, ...],
                                                      needle: str) -> None:
    code, _, err = _meshdl("simulate", "live", "--rows", "3", "--cols", "4", "--out",
                           tmp_path / "run", *args)
    assert_one_line_error(code, err, 2, needle)


def test_always_on_nodes_last_what_their_battery_holds_over_their_listening_power(
        seed_like: dict) -> None:
    """A node that listens all the time draws the radio's listening power and its
    processor's idle power, give or take its few milliseconds of traffic and computing
    (on the CC2420 sending draws a little less than listening)."""
    from meshdl.sim.radio.battery import battery, lifetime_years
    from meshdl.sim.radio.device import device
    from meshdl.sim.radio.profiles import profile

    floor = profile("802.15.4").idle_w + device("cortex-m4").idle_w
    expected = lifetime_years(battery("2xAA"), floor)
    for side in ("mesh", "cloud"):
        always_on = seed_like["macs"]["always-on"][side]
        assert always_on["median_years"] == pytest.approx(expected, rel=1e-3)
