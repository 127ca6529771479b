"""Several meshes under simulated time: the backhaul's arithmetic against hand
calculations, bsp still exact, and what a straggler mesh does to each sync mode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshdl.config import DataConfig, load_run_config
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.sim.radio.backhaul import Backhaul, backhaul_profile, builtin_backhauls
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine
from meshdl.training.parallel import train_parallel
from tests.test_parallel import _central_steps


def test_a_transfer_takes_its_bytes_at_the_rate_then_the_latency() -> None:
    link = Backhaul(backhaul_profile("ethernet"))
    arrives = link.send(10.0, 1_000_000, mesh=0, up=True)
    assert arrives == pytest.approx(10.0 + 8e6 / 94_140_000.0 + 0.000123)


def test_on_wifi_every_transfer_waits_for_the_one_before_it() -> None:
    link = Backhaul(backhaul_profile("wifi"))
    hold = 8 * 50_000 / 25_200_000.0
    first = link.send(0.0, 50_000, mesh=0, up=True)
    second = link.send(0.0, 50_000, mesh=1, up=True)
    reply = link.send(0.0, 50_000, mesh=0, up=False)  # half-duplex: the same channel
    assert second - first == pytest.approx(hold)
    assert reply - second == pytest.approx(hold)
    assert link.queued_s == pytest.approx(hold + 2 * hold)


def test_switched_ethernet_queues_uplinks_at_the_servers_port_but_not_the_other_way() -> None:
    link = Backhaul(backhaul_profile("ethernet"))
    first = link.send(0.0, 100_000, mesh=0, up=True)
    second = link.send(0.0, 100_000, mesh=1, up=True)
    down = link.send(0.0, 100_000, mesh=0, up=False)  # full duplex: its own direction
    assert second > first and down == pytest.approx(first)


def test_over_lte_each_edge_has_its_own_link() -> None:
    link = Backhaul(backhaul_profile("lte"))
    a, b = link.send(0.0, 10_000, 0, up=True), link.send(0.0, 10_000, 1, up=True)
    assert a == b == pytest.approx(8e4 / 1.7e6 + 0.0115)
    assert link.send(0.0, 10_000, 0, up=True) == pytest.approx(a + 8e4 / 1.7e6)


def test_every_backhaul_profile_names_its_source() -> None:
    for name, one in builtin_backhauls().items():
        assert one.source, name


def _engines(config, data, radios):
    view = training_data(config.train, data)
    return [SimEngine(view, profile(radio), "shared", device("cortex-m4"), device("pi4"),
                      seed=i, mesh_id=1 + i) for i, radio in enumerate(radios)]


def _run(sync: str, radios: list[str], epochs: int = 1):
    config = load_run_config(model={"rows": 3, "cols": 4, "hidden": 6, "filters": 2},
                             train={"epochs": epochs, "batch": 4, "seed": 2},
                             parallel={"meshes": len(radios), "sync": sync})
    data = generate_lounge(DataConfig(rows=3, cols=4, train=24, test=8, seed=3))
    after: list[np.ndarray] = []
    _, history = train_parallel(config, data, _engines(config, data, radios),
                                wave_time=lambda engines, i: engines[i].last_wave_shape,
                                time_unit="s", backhaul=backhaul_profile("wifi"),
                                on_update=lambda _, p: after.append(p.copy()))
    return config, data, after, history.parallel


def test_bsp_under_simulated_time_is_still_one_model_with_the_summed_batch() -> None:
    config, data, after, report = _run("bsp", ["802.15.4"] * 3)
    expected = _central_steps(config, data, 3 * 4)
    assert len(after) == len(expected)
    for mine, theirs in zip(after, expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert report["time_unit"] == "s" and report["elapsed"] > 0


def test_a_straggler_mesh_holds_bsp_back_but_not_async() -> None:  # (the seed 004 case)
    radios = ["ble", "ble", "802.15.4"]  # the last mesh's radio is four times slower
    _, _, _, bsp = _run("bsp", radios)
    _, _, _, asynchronous = _run("async", radios)
    fast = bsp["per_mesh"][0]
    assert fast["waited"] > fast["busy"]  # most of its time spent waiting
    # Waiting only for its own answer: the backhaul's round trip, no other mesh.
    assert all(mesh["waited"] < 0.01 * mesh["busy"] for mesh in asynchronous["per_mesh"])
    assert asynchronous["elapsed"] < bsp["elapsed"]
    assert asynchronous["staleness"]["max"] > 0 == bsp["staleness"]["max"]


def test_simulate_train_on_several_meshes_reports_each_mesh_and_the_backhaul(
        cli, tmp_path) -> None:
    code, out, err = cli("simulate", "train", "--rows", "3", "--cols", "4", "--epochs", "1",
                         "--batch", "400", "--meshes", "2", "--sync", "async", "--backhaul",
                         "ethernet", "--straggler-radio", "ble", "--out", tmp_path / "run",
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [m["radio"] for m in report["meshes"]] == ["802.15.4", "ble"]
    assert report["parallel"]["backhaul"]["name"] == "ethernet"
    assert report["parallel"]["backhaul"]["bytes_up"] > 0
    assert "2 meshes (async, ethernet backhaul)" in err
    code, _, err = cli("simulate", "train", "--backhaul", "carrier-pigeon")
    assert code == 2 and "'--backhaul'" in err and "'wifi', 'ethernet', 'lte'" in err


def test_overlap_brings_the_step_time_towards_the_ideal_and_never_below_it() -> None:
    config = load_run_config(model={"rows": 3, "cols": 4, "hidden": 4000, "filters": 2},
                             train={"epochs": 1, "batch": 4, "seed": 2},
                             parallel={"meshes": 3, "sync": "bsp"})
    data = generate_lounge(DataConfig(rows=3, cols=4, train=48, test=8, seed=3))
    steps = {}
    for on in (False, True):
        run = config.model_copy(update={"parallel": config.parallel.model_copy(
            update={"overlap": on})})
        _, history = train_parallel(run, data, _engines(run, data, ["802.15.4"] * 3),
                                    wave_time=lambda engines, i: engines[i].last_wave_shape,
                                    time_unit="s", backhaul=backhaul_profile("lte"))
        steps[on] = history.parallel["step"]
    # A big head over a slow uplink: communication is a large share of the step.
    assert steps[False]["communication"] > 0.2 * steps[False]["compute"]
    assert steps[True]["mean"] < steps[False]["mean"]
    assert steps[True]["mean"] >= steps[True]["ideal"]
