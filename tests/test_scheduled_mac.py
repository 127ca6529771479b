"""The scheduled wake-up MAC (sim/radio/mac.py, `--mac scheduled`): every party wakes for
a Glossy sync flood at the slot's boundary, runs the wave and sleeps in its deepest state
until the next slot; the cloud baseline sleeps alike.

The expected joules are worked out here by hand from the datasheets' and standards'
figures typed in (250 kbit/s: 32 us a byte; BLE's 1 Mbit/s: 8 us a byte; the CC2420's
and nRF52832's currents; the guard from the crystals' ppm), on 1 x 2 and 3 x 3 meshes
whose traffic is counted by hand too (a 1 x 1 kernel and a global head: each node sends
its parent one GATHER of a header and a value per filter), for the mesh and the cloud
on 802.15.4 and BLE; `test_the_hand_figures_are_the_profiles` checks the typed figures
against the profiles. Only the processor's seconds of computing (microseconds, the
kernels' exact operation counts) come from the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl import ModelConfig
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topology import Cell
from meshdl.sim.radio.device import device
from meshdl.sim.radio.mac import MacParams, RadioUse, mac_energy, unsupported_reason
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies import live
from meshdl.sim.studies.cloud import ship_readings
from tests.helpers import assert_one_line_error, noise_dataset, normalized_model
from tests.test_cli_simulate import _meshdl

SLOT = 1800.0  # s: one live slot
N = 2  # Glossy's N: each node sends the sync frame twice, and takes it twice
# 40 ppm a crystal, the two (node and initiator) drifting apart opposite ways over the slot
GUARD = 2 * 40e-6 * SLOT  # 144 ms
GUARD_COMPENSATED = 2 * 2e-6 * SLOT  # 7.2 ms: 2 ppm left after drift compensation
WINDOW = 1.1e-3  # listening before each message expected: half of TSCH's macTsRxWait
SYNC_PAYLOAD = 8  # Glossy header and relay counter 2, slot time 4, slot number 2

# The nRF52832 (cortex-m4): CPU 3.7 mA, asleep with RTC and all RAM 1.9 + 0.3 uA, at 3 V.
CPU_W = 3.7e-3 * 3
ASLEEP_W = 2.2e-6 * 3


class Radio:
    """One radio's figures, typed in from its standard and datasheet."""

    def __init__(self, name: str, byte_s: float, overhead: int, ack_bytes: int,
                 turn: float, cca: float, tx_w: float, rx_w: float, deep_w: float) -> None:
        self.name, self.byte_s, self.overhead = name, byte_s, overhead
        self.ack = ack_bytes * byte_s
        self.turn, self.cca, self.tx_w, self.rx_w, self.deep_w = turn, cca, tx_w, rx_w, deep_w
        self.sync = (overhead + SYNC_PAYLOAD) * byte_s  # the sync frame's airtime

    def frame(self, message_bytes: int) -> float:
        """Airtime of a one-frame message."""
        return (self.overhead + message_bytes) * self.byte_s


# CC2420: TX 17.4 mA, RX (and listening) 18.8 mA, regulator off 0.02 uA, at 3 V; 17 bytes
# of PHY + MAC header + FCS, an 11-byte ACK, aTurnaroundTime 192 us, CCA 128 us.
IEEE = Radio("802.15.4", 8 / 250e3, 17, 11, 192e-6, 128e-6, 17.4e-3 * 3, 18.8e-3 * 3,
             0.02e-6 * 3)
# nRF52832: TX 7.1 mA, RX 6.5 mA, at 3 V; the radio off adds nothing to the chip's sleep
# (the device's); 14 bytes of LL and L2CAP overhead, the peer's 10-byte empty PDU as the
# ACK, T_IFS 150 us; no CCA.
BLE = Radio("ble", 8 / 1e6, 14, 10, 150e-6, 0.0, 7.1e-3 * 3, 6.5e-3 * 3, 0.0)


def test_the_hand_figures_are_the_profiles() -> None:
    for hand in (IEEE, BLE):
        radio = profile(hand.name)
        assert radio.frame_airtime(100) == pytest.approx(100 * hand.byte_s, rel=1e-12)
        assert radio.frame_overhead_bytes == hand.overhead
        assert radio.ack_airtime == pytest.approx(hand.ack, rel=1e-12)
        assert radio.turnaround_s == pytest.approx(hand.turn)
        assert radio.cca_s == pytest.approx(hand.cca)
        assert (radio.tx_w, radio.rx_w, radio.idle_w) == \
            pytest.approx((hand.tx_w, hand.rx_w, hand.rx_w))
        assert radio.deep_sleep_w == pytest.approx(hand.deep_w, abs=1e-15)
    node = device("cortex-m4")
    assert (node.cpu_w, node.deep_sleep_w) == pytest.approx((CPU_W, ASLEEP_W))
    params = MacParams()
    assert (params.sched_sync_transmissions, params.sched_sync_payload_bytes,
            params.sched_rx_window_s) == (N, SYNC_PAYLOAD, pytest.approx(WINDOW))
    assert params.sched_guard_s(SLOT) == pytest.approx(GUARD)
    assert MacParams(sched_drift_compensation=True).sched_guard_s(SLOT) == \
        pytest.approx(GUARD_COMPENSATED)


def test_every_low_power_radio_has_a_deep_sleep_and_wifi_is_refused() -> None:
    # The CC2420 with its regulator off sleeps a thousand times below its power-down.
    assert profile("802.15.4").deep_sleep_w * 1000 == pytest.approx(profile("802.15.4").sleep_w)
    assert profile("lora-sf7").deep_sleep_w == pytest.approx(0.2e-6 * 3.3)
    for name in ("802.15.4", "ble", "lora-sf7"):
        assert unsupported_reason("scheduled", profile(name)) is None
    assert "deep-sleep" in unsupported_reason("scheduled", profile("wifi"))


# ------------------------------------------------------------------ one party, by hand
def _mixed_use(hops: int) -> RadioUse:
    """802.15.4: 2 unicasts of 2 full frames (133 B: 4.256 ms each) and a 50-byte
    broadcast sent; a unicast of 2 full frames and 2 broadcasts of 60 bytes taken."""
    full, ack = 133 * IEEE.byte_s, IEEE.ack
    tx = 4 * full + 50 * IEEE.byte_s + 2 * ack  # its frames, and the ACKs of the 2 it took
    rx = 2 * full + 2 * 60 * IEEE.byte_s + 4 * ack  # what it took, and 4 ACKs of its own
    return RadioUse(tx, rx, unicasts=2, broadcasts=1, frames_sent=5, received=3,
                    frames_received=4, broadcast_frames_sent=1, broadcasts_received=2,
                    broadcast_frames_received=2, sync_hops=hops)


def _mixed_by_hand(guard: float, waited_hops: int = 0) -> float:
    use = _mixed_use(3)
    tx = use.tx_s + N * IEEE.sync  # its frames, then the sync frame twice
    rx = use.rx_s + N * IEEE.sync
    listen = (guard + (2 * N - 1) * IEEE.turn  # the guard, then a turnaround between relays
              + waited_hops * (IEEE.sync + IEEE.turn)  # awake from the flood's start
              + 5 * (IEEE.turn + IEEE.cca)  # a CCA before each of its 5 frames
              + 4 * IEEE.turn  # waiting for the ACK of each of its 4 unicast frames
              + 3 * WINDOW  # a window before each of the 3 messages it took
              + 1 * 640e-6  # LIFS before the second frame of the unicast it took
              + 2 * IEEE.turn)  # turning around before the 2 ACKs it sent
    asleep = SLOT - tx - rx - listen
    return tx * IEEE.tx_w + rx * IEEE.rx_w + listen * IEEE.rx_w + asleep * IEEE.deep_w


@pytest.mark.parametrize(("params", "guard", "waited"), [
    (MacParams(), GUARD, 0),
    (MacParams(sched_drift_compensation=True), GUARD_COMPENSATED, 0),
    (MacParams(sched_wake_by_relay_counter=False), GUARD, 3 - 1)])
def test_a_scheduled_party_pays_the_sync_flood_guard_windows_and_deep_sleep(
        params: MacParams, guard: float, waited: int) -> None:
    energy = mac_energy("scheduled", profile("802.15.4"), _mixed_use(3), SLOT, params)
    assert energy.total_j == pytest.approx(_mixed_by_hand(guard, waited), rel=1e-9)
    # Uncompensated, the guard is most of it: 144 ms listening, 8.1 mJ of some 8.9.
    assert energy.listen_j > guard * IEEE.rx_w


def test_the_flood_initiator_neither_guards_nor_waits() -> None:
    energy = mac_energy("scheduled", profile("802.15.4"), RadioUse(0, 0, 0, 0, 0, 0, 0),
                        SLOT)
    # It sends the sync frame twice and takes its neighbours' first relay between.
    tx, rx, listen = N * IEEE.sync, (N - 1) * IEEE.sync, (2 * N - 2) * IEEE.turn
    assert energy.total_j == pytest.approx(
        tx * IEEE.tx_w + (rx + listen) * IEEE.rx_w
        + (SLOT - tx - rx - listen) * IEEE.deep_w, rel=1e-9)


USES = st.tuples(st.integers(0, 5), st.integers(1, 3), st.integers(0, 5), st.integers(0, 8),
                 st.integers(1, 30))


@settings(max_examples=40, deadline=None)
@given(USES, st.sampled_from([0, 2, 3]))
def test_scheduled_costs_more_with_more_traffic_and_less_than_tsch(
        traffic: tuple, more: int) -> None:
    radio = profile("802.15.4")

    def use(unicasts: int, frames: int, broadcasts: int, taken: int, hops: int
            ) -> RadioUse:
        air, ack = radio.frame_airtime(100), radio.ack_airtime
        return RadioUse((unicasts * frames + broadcasts) * air + taken * ack,
                        taken * air + unicasts * frames * ack, unicasts, broadcasts,
                        unicasts * frames + broadcasts, taken, taken,
                        broadcast_frames_sent=broadcasts, sync_hops=hops)

    bigger = list(traffic)
    bigger[more] += 1
    small = mac_energy("scheduled", radio, use(*traffic), SLOT)
    assert mac_energy("scheduled", radio, use(*bigger), SLOT).total_j > small.total_j
    assert small.total_j < mac_energy("tsch", radio, use(*traffic), SLOT).total_j


# ------------------------------------------------------------------ meshes, by hand
VALUES = 2  # filters: the GATHER's values, float32
GATHER_BYTES = 6 + 4 * VALUES  # compact header + the subtree's maximum of each channel


def _spec(rows: int, cols: int) -> MeshSpec:
    # A 1 x 1 kernel and a global head: no halos, one GATHER a node up the BFS tree.
    config = ModelConfig(rows=rows, cols=cols, kernel=1, filters=VALUES, hidden=4,
                         conv_layers=1, pool="global")
    return MeshSpec(1, config, header="compact")


def _node_by_hand(hand: Radio, sent: int, sent_bytes: int, taken: list[int],
                  cpu_s: float) -> float:
    """One node's joules a slot under the scheduled MAC, default parameters: it sends one
    one-frame unicast of `sent_bytes` to its parent (`sent` 1) and takes one of each size
    in `taken` from its children, ACKing each; then its processor."""
    tx = sent * hand.frame(sent_bytes) + len(taken) * hand.ack + N * hand.sync
    rx = sum(hand.frame(b) for b in taken) + sent * hand.ack + N * hand.sync
    listen = (GUARD + (2 * N - 1) * hand.turn  # the sync flood's guard and turnarounds
              + sent * (hand.turn + hand.cca if hand.cca else 0.0)  # a CCA first (not BLE)
              + sent * hand.turn  # then the wait for its ACK
              + len(taken) * (WINDOW + hand.turn))  # a window before each, then its ACK
    radio = tx * hand.tx_w + rx * hand.rx_w + listen * hand.rx_w + \
        (SLOT - tx - rx - listen) * hand.deep_w
    return radio + cpu_s * CPU_W + (SLOT - cpu_s) * ASLEEP_W


def _subtree(spec: MeshSpec, cell: Cell) -> int:
    children = spec.topology.children[cell]
    return 1 + sum(_subtree(spec, child) for child in children)


def _mesh_slot(spec: MeshSpec, radio_name: str) -> live.SlotCost:
    """A scheduled slot (the one after the install) of the live mesh."""
    config = spec.model
    data = noise_dataset(config, samples=8)
    settings = live.LiveSettings(slots=3, mac="scheduled")
    mesh = live.LiveMesh(spec, normalized_model(config), profile(radio_name), "shared",
                         device("cortex-m4"), device("pi4"), settings)
    series = np.ascontiguousarray(data.X_test[np.arange(3) % 4], np.float32)
    mesh.timed_slot(series, 0)  # the install: parameters flooded
    return mesh.timed_slot(series, 1).cost


@pytest.mark.parametrize("hand", [IEEE, BLE], ids=lambda r: r.name)
@pytest.mark.parametrize(("rows", "cols"), [(1, 2), (3, 3)])
def test_the_mesh_under_the_scheduled_mac_draws_what_the_hand_calculation_says(
        hand: Radio, rows: int, cols: int) -> None:
    spec = _spec(rows, cols)
    cost = _mesh_slot(spec, hand.name)
    assert cost.by_class == {"gather": GATHER_BYTES * rows * cols}
    radio, node = profile(hand.name), device("cortex-m4")
    for cell in spec.topology.cells():
        children = spec.topology.children[cell]
        expected = _node_by_hand(hand, 1, GATHER_BYTES, [GATHER_BYTES] * len(children),
                                 cost.cpu_s[cell])
        got = live.node_slot(cost, cell, "scheduled", radio, node, SLOT, MacParams())
        assert got.joules == pytest.approx(expected, rel=1e-9), cell


@pytest.mark.parametrize("hand", [IEEE, BLE], ids=lambda r: r.name)
@pytest.mark.parametrize(("rows", "cols"), [(1, 2), (3, 3)])
def test_the_cloud_sleeps_under_the_scheduled_mac_as_the_hand_calculation_says(
        hand: Radio, rows: int, cols: int) -> None:
    """Aggregated up the same tree: each node sends its parent one message of its
    subtree's readings, a 6-byte header and 4 bytes a reading; it handles a message per
    child and composes its own (50 us each on the Cortex-M4)."""
    spec = _spec(rows, cols)
    radio, node = profile(hand.name), device("cortex-m4")
    shipped = ship_readings(spec, radio, "shared", node, device("pi4"), 1,
                            header_bytes=6, traced=True)
    topo = spec.topology
    cells = [cell for cell in topo.cells() if cell in topo.members]
    links = live.plan_links((cell, parent) for cell, parent in topo.parent.items())
    cost = live.cloud_cost(shipped, radio, cells, links, live.flood_hops(spec))
    for cell in cells:
        children = topo.children[cell]
        cpu = (len(children) + 1) * 50e-6
        expected = _node_by_hand(hand, 1, 6 + 4 * _subtree(spec, cell),
                                 [6 + 4 * _subtree(spec, c) for c in children], cpu)
        got = live.node_slot(cost, cell, "scheduled", radio, node, SLOT, MacParams())
        assert got.joules == pytest.approx(expected, rel=1e-9), cell


def test_the_mesh_and_the_cloud_sleep_alike_between_slots() -> None:
    """Under the scheduled MAC both sides' processors sleep at the device's sleep_w and
    their radios at deep_sleep_w; under the other MACs, at idle_w and sleep_w as before."""
    spec = _spec(1, 2)
    cost = _mesh_slot(spec, "802.15.4")
    radio, node = profile("802.15.4"), device("cortex-m4")
    cell = (0, 1)
    scheduled = live.node_slot(cost, cell, "scheduled", radio, node, SLOT, MacParams())
    ideal = live.node_slot(cost, cell, "ideal", radio, node, SLOT, MacParams())
    # The ideal MAC: the radio asleep at the CC2420's 60 uW power-down, the processor idle.
    use = cost.use[cell]
    on = use.tx_s + use.rx_s
    assert ideal.joules == pytest.approx(
        use.tx_s * IEEE.tx_w + use.rx_s * IEEE.rx_w + (SLOT - on) * 60e-6
        + cost.cpu_s[cell] * CPU_W + (SLOT - cost.cpu_s[cell]) * 1.9e-6 * 3, rel=1e-9)
    # Without the 0.108 J of the CC2420's power-down, the scheduled node is cheaper even
    # with its 144 ms guard (8.1 mJ).
    assert scheduled.joules < ideal.joules / 4


def test_a_scheduled_nodes_parts_add_up_to_its_joules() -> None:
    """sim.json's `nodes` record splits the hottest node's joules into parts: under the
    scheduled MAC its processor's part is at the device's sleep, as its joules are."""
    spec = _spec(3, 3)
    cost = _mesh_slot(spec, "802.15.4")
    radio, node = profile("802.15.4"), device("cortex-m4")
    side = live.Side()
    side.add(cost, 5)
    settings = live.LiveSettings(slots=6, mac="scheduled")
    for cell in spec.topology.cells():
        parts = live.node_parts(side, cell, "scheduled", radio, node, settings)
        joules = live.node_slot(cost, cell, "scheduled", radio, node, SLOT, MacParams())
        assert sum(parts.values()) == pytest.approx(joules.joules, rel=1e-12)
        assert parts["processor"] == pytest.approx(
            cost.cpu_s[cell] * CPU_W + (SLOT - cost.cpu_s[cell]) * ASLEEP_W, rel=1e-12)


def test_a_live_run_prices_the_scheduled_mac_beside_the_four_when_chosen() -> None:
    assert live.priced_macs("lpl") == ("always-on", "ideal", "lpl", "tsch")
    assert live.priced_macs("scheduled") == ("always-on", "ideal", "lpl", "tsch",
                                             "scheduled")


def test_under_the_scheduled_mac_the_sync_flood_starts_every_clock_together() -> None:
    spec = _spec(3, 3)
    config = spec.model
    clocks = {}
    for mac in ("lpl", "scheduled"):
        mesh = live.LiveMesh(spec, normalized_model(config), profile("802.15.4"), "shared",
                             device("cortex-m4"), device("pi4"),
                             live.LiveSettings(slots=3, mac=mac))
        clocks[mac] = mesh.clock_errors()
    # 20 ppm crystals drift up to 36 ms over a half-hour slot; after the flood, none.
    assert max(abs(e) for e in clocks["lpl"].values()) > 1e-3
    assert set(clocks["scheduled"].values()) == {0.0}


# ------------------------------------------------------------------ the command
def test_simulate_live_mac_scheduled_prices_both_sides_asleep_between_slots(
        tmp_path) -> None:
    code, stdout, err = _meshdl("simulate", "live", "--rows", "4", "--cols", "5",
                                "--slots", "4", "--pool", "global", "--mac", "scheduled",
                                "--out", tmp_path / "run", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["mac"] == "scheduled" and report["alerts_equal_central"] is True
    assert set(report["macs"]) == {"always-on", "ideal", "lpl", "tsch", "scheduled"}
    assert report["clock"]["max_error_s"] == 0.0  # the sync flood sets every clock
    for side in ("mesh", "cloud"):
        joules = report[side]["hottest_node_j_per_slot"]
        assert joules == report["macs"]["scheduled"][side]["hottest_node_j_per_slot"]
        # Asleep, neither the CC2420's 0.108 J of power-down nor the ideal MAC's floor.
        assert joules < report["macs"]["ideal"][side]["hottest_node_j_per_slot"] / 3
        # Yet never below the processor asleep and the guard's listening.
        assert joules > SLOT * ASLEEP_W + GUARD * IEEE.rx_w


def test_simulate_live_refuses_mac_scheduled_on_wifi_in_one_line(tmp_path) -> None:
    code, _, err = _meshdl("simulate", "live", "--rows", "3", "--cols", "4", "--radio",
                           "wifi", "--mac", "scheduled", "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, "deep-sleep")
