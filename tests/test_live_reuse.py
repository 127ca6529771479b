"""A live run without --delta or loss times slot 1 and reuses its price for every live
slot (sim/studies/live.py, `run_mesh`): timing every slot gives the same sim.json, byte
for byte, but for how many slots were timed and the waves' lengths (which differ with
the backoffs, and are the timed slots'); each timed slot is priced as slot 1 to the
rounding of running totals, and one priced otherwise stops the run. The pricing memo
gives `mac_energy`'s own floats; `--drift-ppm` and `--drift-compensated` set the
scheduled MAC's guard; a live run makes one lounge of data, whose test maps are those
of the global recipe's 17 lounges."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshdl import ModelConfig
from meshdl.config import load_run_config
from meshdl.data.lounge import LOUNGE_TRAIN, generate_lounge
from meshdl.errors import MeshdlError
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.radio.device import device
from meshdl.sim.radio.mac import MacParams, RadioUse, mac_energy
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies import live
from tests.helpers import assert_one_line_error, noise_dataset, normalized_model
from tests.test_cli_simulate import _meshdl

GRID = ("--rows", "4", "--cols", "5", "--pool", "global", "--filters", "3",
        "--slots", "7")


def _run(out: Path, *extra: str) -> tuple[dict[str, Any], bytes]:
    code, _, err = _meshdl("simulate", "live", "--out", out, *GRID, *extra)
    assert code == 0, err
    return json.loads((out / "sim.json").read_text()), (out / "alerts.jsonl").read_bytes()


def _without_timing(record: dict[str, Any]) -> dict[str, Any]:
    """sim.json less what only the timed slots give: their number, their waves' lengths."""
    record = json.loads(json.dumps(record))
    del record["timed_slots"]
    for side in [record["mesh"], *(m["mesh"] for m in record["macs"].values())]:
        del side["makespan_s"], side["fits_slot"]
    return record


@pytest.mark.parametrize("mac", ["lpl", "scheduled"])
def test_reusing_slot_ones_price_gives_the_fully_timed_sim_json_byte_for_byte(
        tmp_path: Path, mac: str) -> None:
    every, every_alerts = _run(tmp_path / "every", "--mac", mac, "--timed-slots", "7")
    reused, reused_alerts = _run(tmp_path / "reused", "--mac", mac, "--timed-slots", "2")
    assert every["timed_slots"] == 7 and reused["timed_slots"] == 2
    assert json.dumps(_without_timing(every)) == json.dumps(_without_timing(reused))
    assert every_alerts == reused_alerts
    # The waves' lengths are the timed slots' own: slot 1's is among them.
    assert every["mesh"]["makespan_s"]["max"] >= reused["mesh"]["makespan_s"]["max"]


def _live_mesh(slots: int) -> tuple[live.LiveMesh, np.ndarray]:
    config = ModelConfig(rows=3, cols=4, filters=3, hidden=4, pool="global")
    spec = MeshSpec(1, config, header="compact")
    data = noise_dataset(config, samples=8)
    mesh = live.LiveMesh(spec, normalized_model(config), profile("802.15.4"), "shared",
                         device("cortex-m4"), device("pi4"),
                         live.LiveSettings(slots=slots, timed_slots=slots))
    series = np.ascontiguousarray(data.X_test[np.arange(slots) % 4], np.float32)
    return mesh, series


def test_every_timed_slot_is_priced_as_slot_one_to_the_rounding_of_running_totals() -> None:
    mesh, series = _live_mesh(6)
    mesh.timed_slot(series, 0)  # the install
    costs = [mesh.timed_slot(series, slot).cost for slot in range(1, 6)]
    first = costs[0]
    for cost in costs[1:]:
        assert live.same_traffic(cost, first) and live.same_price(cost, first)
        for party, use in cost.use.items():
            assert use.tx_s == pytest.approx(first.use[party].tx_s, rel=1e-12, abs=1e-18)
            assert use.rx_s == pytest.approx(first.use[party].rx_s, rel=1e-12, abs=1e-18)
        for party, seconds in cost.cpu_s.items():
            assert seconds == pytest.approx(first.cpu_s[party], rel=1e-12, abs=1e-18)


def test_a_slot_priced_otherwise_than_slot_one_stops_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same messages, but a party on air a millionth longer: not slot 1's price."""
    mesh, series = _live_mesh(4)
    real = live.LiveMesh.timed_slot

    def longer_in_slot_2(self: live.LiveMesh, series: np.ndarray, slot: int
                         ) -> live.TimedSlot:
        timed = real(self, series, slot)
        if slot != 2:
            return timed
        use = {party: u._replace(tx_s=u.tx_s * (1 + 1e-6)) for party, u in
               timed.cost.use.items()}
        return timed._replace(cost=timed.cost._replace(use=use))

    monkeypatch.setattr(live.LiveMesh, "timed_slot", longer_in_slot_2)
    with pytest.raises(MeshdlError, match="slot 2 was priced other than slot 1"):
        live.run_mesh(mesh, series, lambda _: None)


def test_pricing_a_use_once_gives_mac_energys_own_floats() -> None:
    radio, params, memo = profile("802.15.4"), MacParams(), {}
    uses = [RadioUse(0.01, 0.02, 3, 1, 5, 4, 6, 2, 1, 2, 3, 4, 2),
            RadioUse(1e-3, 0.0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 5)]
    for mac in ("lpl", "tsch", "ideal", "scheduled"):
        for use in uses:
            first = live.radio_joules(mac, radio, use, 1800.0, params, memo)
            assert first == mac_energy(mac, radio, use, 1800.0, params)
            assert live.radio_joules(mac, radio, use, 1800.0, params, memo) is first
    assert len(memo) == 8


def test_drift_flags_set_the_scheduled_macs_guard(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path / "plain", "--mac", "scheduled")
    tight, _ = _run(tmp_path / "tight", "--mac", "scheduled", "--drift-ppm", "10")
    learnt, _ = _run(tmp_path / "learnt", "--mac", "scheduled", "--drift-compensated")
    assert plain["mac_params"]["sched_drift_ppm"] == 40.0
    assert tight["mac_params"]["sched_drift_ppm"] == 10.0
    assert learnt["mac_params"]["sched_drift_compensation"] is True
    assert learnt["mac_params"]["sched_compensated_ppm"] == 2.0
    j = [run["mesh"]["hottest_node_j_per_slot"] for run in (plain, tight, learnt)]
    assert j[0] > j[1] > j[2]
    # The guard is 2 x ppm x the slot on the radio's receive power: 30 ppm less is
    # 2 x 30e-6 x 1800 s = 108 ms less listening at the hottest node.
    rx_w = profile("802.15.4").rx_w
    assert j[0] - j[1] == pytest.approx(2 * 30e-6 * 1800 * rx_w, rel=0.02)


@pytest.mark.parametrize(("args", "needle"), [
    (("--drift-ppm", "5"), "--mac scheduled"),
    (("--mac", "lpl", "--drift-compensated"), "--mac scheduled"),
    (("--mac", "scheduled", "--drift-ppm", "-1"), "--drift-ppm"),
])
def test_drift_flags_without_the_scheduled_mac_are_a_one_line_error(
        tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    code, _, err = _meshdl("simulate", "live", "--rows", "3", "--cols", "4", "--out",
                           tmp_path / "run", *args)
    assert_one_line_error(code, err, 2, needle)


def test_a_live_run_makes_one_lounge_whose_test_maps_are_the_recipes(tmp_path: Path) -> None:
    config = load_run_config(None, mode="mesh", model={"rows": 3, "cols": 4,
                                                       "pool": "global"})
    assert config.data.train > LOUNGE_TRAIN  # the global recipe's 68 lounges
    # Two lounges stand for them all: each adds training maps, none test maps.
    whole = generate_lounge(config.data.model_copy(update={"train": 2 * LOUNGE_TRAIN}))
    one = generate_lounge(config.data.model_copy(update={"train": LOUNGE_TRAIN}))
    assert np.array_equal(whole.X_test, one.X_test)
    code, _, err = _meshdl("simulate", "live", "--rows", "3", "--cols", "4", "--pool",
                           "global", "--slots", "2", "--out", tmp_path / "run")
    assert code == 0, err
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["data"]["train"] == LOUNGE_TRAIN
    assert math.isfinite(json.loads((tmp_path / "run" / "sim.json").read_text())[
        "mesh"]["hottest_node_j_per_slot"])
