"""Duty-cycled MACs (sim/radio/mac.py): each MAC's joules against hand calculations on
802.15.4 (ContikiMAC, TSCH), LoRa (lpl: CAD preamble sampling) and BLE (tsch: connection
events), the orderings that must hold between them, what `radio_use` counts from a trace,
and the radios each MAC refuses.

The hand calculations use each profile's powers and the standards' and datasheets'
figures typed in here (250 kbit/s: 32 us a byte; ContikiMAC's ticks of a 32,768 Hz
rtimer; the TSCH timeslot template; LoRa symbols of 1.024 ms and the SX1276's CAD; BLE's
8 us a byte, T_IFS and window widening), not the module's helpers; the
`test_the_*hand_figures_are_the_profiles` tests check that the typed figures are the
profiles'."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.protocol.messages import Kind
from meshdl.sim.radio.clock import EventQueue
from meshdl.sim.radio.device import device
from meshdl.sim.radio.energy import state_energy
from meshdl.sim.radio.mac import (
    MACS,
    MacEnergy,
    MacParams,
    RadioUse,
    lora_cad,
    mac_energies,
    mac_energy,
    radio_use,
    unsupported_reason,
)
from meshdl.sim.radio.media import SharedRadio, Transmission
from meshdl.sim.radio.profiles import RadioProfile, profile
from meshdl.sim.radio.trace import Sent

RADIO = profile("802.15.4")
PERIOD = 1800.0  # s: one live slot
BYTE_S = 8 / 250_000  # one byte at 250 kbit/s: 32 us
ACK = 11 * BYTE_S  # PHY 6 + ACK MPDU 5: 352 us
TURN = 192e-6  # aTurnaroundTime, 12 symbols
CCA = 128e-6  # CCA, 8 symbols
CCA_ON = TURN + CCA  # one CCA: RX calibration, then RSSI averaging
LIFS = 640e-6  # macMinLIFSPeriod
# ContikiMAC (Contiki 3.0 contikimac.c) on a 32,768 Hz rtimer
CHECK = 2 * (4 + 16) / 32768  # CHECK_TIME: 2 x (CCA_CHECK_TIME + CCA_SLEEP_TIME)
GAP = 13 / 32768  # INTER_PACKET_INTERVAL
LEAD = 10 * CHECK  # phase-lock: strobing starts 10 CHECK_TIME before the wake-up
STROBE = 1 / 8 + 2 * CHECK  # STROBE_TIME of a broadcast at 8 Hz
CHECKS_LISTEN = PERIOD * 8 * 2 * CCA_ON  # 8 checks a second, two CCAs each
# TSCH: 6TiSCH minimal, 802.15.4-2015 default timeslot template
SLOTFRAME = 101 * 10e-3
RX_WAIT = 2200e-6  # macTsRxWait
GUARD = RX_WAIT / 2
ACK_WINDOW = 1000e-6 - 800e-6  # macTsTxAckDelay - macTsRxAckDelay
IE = 4 * BYTE_S  # the Enhanced ACK's time-correction IE
EACK = 15 * BYTE_S  # Enhanced ACK: 11 + 4 bytes
EB = (17 + 30) * BYTE_S  # frame overhead + RFC 8180 A.1's 30 bytes of IEs
KA = 17 * BYTE_S  # an empty data frame
EBS = PERIOD / 14.0  # EBs in the period
KAS = PERIOD / (GUARD / 80e-6)  # keep-alives: 1.1 ms / (2 x 40 ppm) = 13.75 s apart
IDLE = PERIOD / SLOTFRAME - EBS - KAS  # shared cells it listens to in vain
# Frames of the cases below: payload + 17 bytes of overhead
SMALL = 67 * BYTE_S  # 50-byte message
BC = 117 * BYTE_S  # 100-byte broadcast
FULL = 133 * BYTE_S  # a full frame, 116 bytes of payload
REST = 50 * BYTE_S  # the second frame of a 149-byte message


def _joules(tx: float, rx: float, listen: float) -> float:
    """The radio's joules over the period in these states, asleep the rest."""
    return (tx * RADIO.tx_w + rx * RADIO.rx_w + listen * RADIO.idle_w
            + (PERIOD - tx - rx - listen) * RADIO.sleep_w)


def _check(energy: MacEnergy, tx: float, rx: float, listen: float, use: RadioUse) -> None:
    assert energy.tx_j == pytest.approx(tx * RADIO.tx_w, rel=1e-9)
    assert energy.rx_j == pytest.approx(rx * RADIO.rx_w, rel=1e-9)
    assert energy.listen_j == pytest.approx(listen * RADIO.idle_w, rel=1e-9)
    assert energy.total_j == pytest.approx(_joules(tx, rx, listen), rel=1e-9)
    assert energy.radio_on_s == pytest.approx(tx + rx + listen, rel=1e-9)
    traffic = use.tx_s * RADIO.tx_w + use.rx_s * RADIO.rx_w
    assert energy.overhead_j == pytest.approx(
        tx * RADIO.tx_w + rx * RADIO.rx_w + listen * RADIO.idle_w - traffic, rel=1e-9, abs=1e-15)


def test_the_hand_figures_are_the_profiles() -> None:
    assert RADIO.bitrate_bps == 250_000
    assert (RADIO.ack_frame_bytes, RADIO.frame_overhead_bytes) == (11, 17)
    assert (RADIO.turnaround_s, RADIO.cca_s, RADIO.ifs_s) == (TURN, CCA, LIFS)
    assert RADIO.frame_airtime(133) == pytest.approx(FULL)
    params = MacParams()
    assert params.keepalive_period_s == pytest.approx(13.75)
    assert params.lpl_strobe_s == pytest.approx(STROBE)


# ------------------------------------------------------------------ (a) 1 x 2 mesh
A, B = (0, 0), (0, 1)


def _one_unicast() -> dict:
    """A sends B one 50-byte message: one 67-byte frame, B's ACK back."""
    trace = [Sent(0.0, SMALL, A, (B,), False, 1, 1, 50, 1, "ok")]
    return radio_use(trace, RADIO, tx={A: SMALL, B: ACK}, rx={A: ACK, B: SMALL})


def test_always_on_and_ideal_on_a_1x2_mesh_match_a_hand_calculation() -> None:
    use = _one_unicast()
    for party in (A, B):
        u = use[party]
        quiet = PERIOD - SMALL - ACK
        _check(mac_energy("always-on", RADIO, u, PERIOD), u.tx_s, u.rx_s, quiet, u)
        _check(mac_energy("ideal", RADIO, u, PERIOD), u.tx_s, u.rx_s, 0.0, u)
        assert mac_energy("ideal", RADIO, u, PERIOD).total_j == pytest.approx(
            SMALL * (RADIO.tx_w if party == A else RADIO.rx_w)
            + ACK * (RADIO.rx_w if party == A else RADIO.tx_w) + quiet * RADIO.sleep_w)


def test_lpl_on_a_1x2_mesh_matches_a_hand_calculation() -> None:
    use = _one_unicast()
    # A: 6 CCAs before its strobe, LEAD / period + 1/2 extra copies of its frame (each
    # followed by a gap listening for the ACK), the turnaround before B's ACK.
    extra = LEAD / (SMALL + GAP) + 0.5
    assert 5.0 < extra < 5.5  # "few": about 5 extra copies of a 67-byte frame
    tx = SMALL + extra * SMALL
    listen = CHECKS_LISTEN + 6 * CCA_ON + extra * GAP + TURN
    _check(mac_energy("lpl", RADIO, use[A], PERIOD), tx, ACK, listen, use[A])
    # B: wakes on a copy, listens through half a copy and the gap, takes the next copy
    # whole and turns round to ACK it.
    listen = CHECKS_LISTEN + SMALL / 2 + GAP + TURN
    _check(mac_energy("lpl", RADIO, use[B], PERIOD), ACK, SMALL, listen, use[B])


def test_tsch_on_a_1x2_mesh_matches_a_hand_calculation() -> None:
    use = _one_unicast()
    # Both: EBs (TxData) and keep-alives (TxDataRxAck with an Enhanced ACK) in the shared
    # cell, and RxIdle (listening all of macTsRxWait) in its other occurrences.
    beacons_tx = EBS * EB + KAS * KA
    keepalive_rx, keepalive_listen = KAS * EACK, KAS * ACK_WINDOW
    # A: a TxDataRxAck slot: the ACK window before B's Enhanced ACK, 4 bytes longer.
    _check(mac_energy("tsch", RADIO, use[A], PERIOD), SMALL + beacons_tx,
           ACK + IE + keepalive_rx, ACK_WINDOW + keepalive_listen + IDLE * RX_WAIT, use[A])
    # B: a RxDataTxAck slot: the guard before the frame, its Enhanced ACK.
    _check(mac_energy("tsch", RADIO, use[B], PERIOD), ACK + IE + beacons_tx,
           SMALL + keepalive_rx, GUARD + keepalive_listen + IDLE * RX_WAIT, use[B])


def test_lpl_sends_the_later_frames_of_a_unicast_while_its_receiver_is_awake() -> None:
    """A 149-byte message (a full frame and a 50-byte one): B wakes once, then takes the
    second frame a LIFS after its first ACK."""
    trace = [Sent(0.0, FULL + REST, A, (B,), False, 1, 1, 149, 2, "ok")]
    use = radio_use(trace, RADIO, tx={A: FULL + REST, B: 2 * ACK},
                    rx={A: 2 * ACK, B: FULL + REST})
    mean = (FULL + REST) / 2
    listen = CHECKS_LISTEN + (mean / 2 + GAP) + 2 * TURN + LIFS
    _check(mac_energy("lpl", RADIO, use[B], PERIOD), 2 * ACK, FULL + REST, listen, use[B])
    extra = LEAD / (mean + GAP) + 0.5  # only the first frame is strobed
    listen = CHECKS_LISTEN + 6 * CCA_ON + extra * GAP + 2 * TURN
    _check(mac_energy("lpl", RADIO, use[A], PERIOD), FULL + REST + extra * mean, 2 * ACK,
           listen, use[A])


# ------------------------------------------------------------------ (b) 3 x 3 mesh
# The centre sends 4 one-frame broadcasts and a 2-frame unicast, and takes 8 messages: 4
# neighbours' broadcasts and 4 one-frame unicasts (ACKing each). A corner sends the
# centre's side neighbour one unicast and hears 2 broadcasts.
CENTRE = RadioUse(tx_s=4 * BC + FULL + REST + 4 * ACK, rx_s=4 * BC + 4 * SMALL + 2 * ACK,
                  unicasts=1, broadcasts=4, frames_sent=6, received=8, frames_received=8,
                  broadcast_frames_sent=4, broadcasts_received=4, broadcast_frames_received=4)
CORNER = RadioUse(tx_s=SMALL, rx_s=ACK + 2 * BC, unicasts=1, broadcasts=0, frames_sent=1,
                  received=2, frames_received=2, broadcast_frames_sent=0,
                  broadcasts_received=2, broadcast_frames_received=2)


def test_always_on_and_ideal_on_a_3x3_mesh_match_a_hand_calculation() -> None:
    for use in (CENTRE, CORNER):
        quiet = PERIOD - use.tx_s - use.rx_s
        _check(mac_energy("always-on", RADIO, use, PERIOD), use.tx_s, use.rx_s, quiet, use)
        _check(mac_energy("ideal", RADIO, use, PERIOD), use.tx_s, use.rx_s, 0.0, use)


def test_lpl_on_a_3x3_mesh_matches_a_hand_calculation() -> None:
    sent = (4 * BC + FULL + REST) / 6  # mean airtime of the centre's frames
    taken = (4 * BC + 4 * SMALL) / 8  # and of those it took
    extra = LEAD / (sent + GAP) + 0.5  # its unicast's extra copies
    copies = math.ceil(STROBE / (sent + GAP))  # each broadcast frame's copies
    assert copies == 33
    tx = CENTRE.tx_s + extra * sent + 4 * (copies - 1) * sent
    listen = (CHECKS_LISTEN
              + 6 * CCA_ON + extra * GAP + 2 * TURN  # the unicast: CCAs, gaps, 2 ACK waits
              + 4 * 6 * CCA_ON  # CCAs before each broadcast frame
              + 8 * (taken / 2 + GAP)  # woken for 4 unicasts and 4 broadcast frames
              + 4 * TURN)  # before each of its 4 ACKs
    _check(mac_energy("lpl", RADIO, CENTRE, PERIOD), tx, CENTRE.rx_s, listen, CENTRE)
    extra = LEAD / (SMALL + GAP) + 0.5
    listen = CHECKS_LISTEN + 6 * CCA_ON + extra * GAP + TURN + 2 * (BC / 2 + GAP)
    _check(mac_energy("lpl", RADIO, CORNER, PERIOD), SMALL + extra * SMALL, CORNER.rx_s,
           listen, CORNER)


def test_tsch_on_a_3x3_mesh_matches_a_hand_calculation() -> None:
    own_tx = EBS * EB + KAS * KA
    own_listen = KAS * ACK_WINDOW + IDLE * RX_WAIT
    # Centre: 2 TxDataRxAck (its unicast's frames), 4 TxData, 4 RxDataTxAck, 4 RxData.
    tx = CENTRE.tx_s + 4 * IE + own_tx
    rx = CENTRE.rx_s + 2 * IE + KAS * EACK
    listen = 2 * ACK_WINDOW + 8 * GUARD + own_listen
    _check(mac_energy("tsch", RADIO, CENTRE, PERIOD), tx, rx, listen, CENTRE)
    # Corner: 1 TxDataRxAck, 2 RxData.
    tx = CORNER.tx_s + own_tx
    rx = CORNER.rx_s + IE + KAS * EACK
    listen = ACK_WINDOW + 2 * GUARD + own_listen
    _check(mac_energy("tsch", RADIO, CORNER, PERIOD), tx, rx, listen, CORNER)


def test_always_on_and_ideal_are_energy_py_state_energy_radio_parts() -> None:
    cpu = device("cortex-m4")
    for use in (CENTRE, CORNER):
        parts = state_energy(RADIO, cpu, use.tx_s, use.rx_s, 0.0, PERIOD)
        radio_j = parts["tx"] + parts["rx"] + parts["listen"]
        assert mac_energy("always-on", RADIO, use, PERIOD).total_j == pytest.approx(radio_j)
        ideal_radio = parts["ideal_mac"] - parts["cpu"] - parts["idle"]
        assert mac_energy("ideal", RADIO, use, PERIOD).total_j == pytest.approx(ideal_radio)


# ------------------------------------------------------------------ orderings
def _use(frame_bytes: int, unicasts: int, unicast_frames: int, broadcasts: int,
         taken_unicasts: int, taken_broadcasts: int) -> RadioUse:
    """A consistent use where every frame has `frame_bytes` on air: unicasts of
    `unicast_frames` frames, one-frame broadcasts, one-frame messages taken."""
    air, ack = RADIO.frame_airtime(frame_bytes), RADIO.ack_airtime
    sent_uc = unicasts * unicast_frames
    return RadioUse(tx_s=(sent_uc + broadcasts) * air + taken_unicasts * ack,
                    rx_s=(taken_unicasts + taken_broadcasts) * air + sent_uc * ack,
                    unicasts=unicasts, broadcasts=broadcasts,
                    frames_sent=sent_uc + broadcasts,
                    received=taken_unicasts + taken_broadcasts,
                    frames_received=taken_unicasts + taken_broadcasts,
                    broadcast_frames_sent=broadcasts, broadcasts_received=taken_broadcasts,
                    broadcast_frames_received=taken_broadcasts)


TRAFFIC = st.tuples(st.integers(17, 133), st.integers(0, 20), st.integers(1, 4),
                    st.integers(0, 20), st.integers(0, 40), st.integers(0, 40))


@settings(max_examples=60, deadline=None)
@given(TRAFFIC)
def test_ideal_is_below_lpl_and_tsch_and_tsch_below_always_on(traffic: tuple) -> None:
    use = _use(*traffic)
    e = mac_energies(RADIO, use, PERIOD)
    assert set(e) == set(MACS)
    assert e["ideal"].total_j <= e["lpl"].total_j
    assert e["ideal"].total_j <= e["tsch"].total_j <= e["always-on"].total_j
    for energy in e.values():
        assert 0.0 <= energy.radio_on_s <= PERIOD
        assert energy.overhead_j >= 0.0
    assert e["ideal"].overhead_j == 0.0


@settings(max_examples=60, deadline=None)
@given(TRAFFIC, st.sampled_from([1, 3, 4, 5]))
def test_more_traffic_never_costs_less(traffic: tuple, more: int) -> None:
    """One more unicast sent, broadcast sent, unicast taken or broadcast taken costs
    more under every MAC that sleeps; not always under always-on, where the CC2420's
    transmitting (52.2 mW) is cheaper than the listening it replaces (56.4 mW)."""
    assert RADIO.tx_w < RADIO.idle_w
    bigger = list(traffic)
    bigger[more] += 1
    for mac in ("ideal", "lpl", "tsch"):
        assert mac_energy(mac, RADIO, _use(*bigger), PERIOD).total_j >= \
            mac_energy(mac, RADIO, _use(*traffic), PERIOD).total_j


def test_phase_lock_shortens_a_unicast_strobe() -> None:
    unlocked = MacParams(lpl_phase_lock=False)
    use = _one_unicast()[A]
    locked_j = mac_energy("lpl", RADIO, use, PERIOD).tx_j
    assert mac_energy("lpl", RADIO, use, PERIOD, unlocked).tx_j == pytest.approx(
        SMALL * RADIO.tx_w * (1 + (1 / 16) / (SMALL + GAP) + 0.5))  # half a wake-up interval
    assert locked_j < mac_energy("lpl", RADIO, use, PERIOD, unlocked).tx_j


def test_keepalives_come_before_the_clocks_drift_out_of_the_guard_time() -> None:
    assert MacParams().keepalive_period_s == pytest.approx(1.1e-3 / 80e-6)
    assert MacParams(tsch_drift_ppm=20.0).keepalive_period_s == pytest.approx(27.5)
    assert MacParams(tsch_keepalive_s=30.0).keepalive_period_s == 30.0
    use = _one_unicast()[A]
    sparse = mac_energy("tsch", RADIO, use, PERIOD, MacParams(tsch_drift_ppm=20.0))
    assert sparse.tx_j < mac_energy("tsch", RADIO, use, PERIOD).tx_j  # fewer keep-alives


def test_a_longer_slotframe_listens_less() -> None:
    use = _one_unicast()[B]
    short = mac_energy("tsch", RADIO, use, PERIOD, MacParams(tsch_slotframe_length=7))
    assert short.listen_j > mac_energy("tsch", RADIO, use, PERIOD).listen_j


# ------------------------------------------------------------------ (c) LoRa: lpl by CAD
# The lora-sf7 profile's figures, typed in: SF7 at 125 kHz, CR 4/5, an 8-symbol preamble,
# explicit header and CRC (AN1200.13); SX1276 TX 29 mA, RX 11.5 mA, sleep 0.2 uA at 3.3 V.
LORA = profile("lora-sf7")
TS = 2**7 / 125e3  # one symbol: 1.024 ms
CAD_RX = (2**7 + 32) / 125e3  # a CAD receives (2^SF + 32) / BW: 1.28 ms
CAD_PROC = 1 * TS  # then correlates for at most a symbol ...
PROC_W = 5.6e-3 * 3.3  # ... at 5.6 mA (SX1276 CAD consumption table, 125 kHz)
WAKE = 1.0  # s between two CADs
CADS = PERIOD / WAKE  # 1800 CADs in the period
EXT = 979 * TS  # the preamble's lengthening: ceil((1 s + 1.28 ms + 1.024 ms) / 1.024 ms)
HEARD = EXT - CAD_RX - CAD_PROC - WAKE / 2  # listened to after the CAD, on average


def _lora_air(payload: int) -> float:
    """AN1200.13 at SF7: (8 + 4.25) preamble symbols, then
    8 + ceil((8 PL - 4 SF + 28 + 16) / (4 SF)) (CR + 4) symbols (no LDRO at SF7)."""
    return (8 + 4.25 + 8 + math.ceil((8 * payload - 28 + 28 + 16) / 28) * 5) * TS


L_SMALL = _lora_air(50 + 4)  # a 50-byte message and the 4-byte link header: 102.656 ms
L_BC = _lora_air(100 + 4)  # a 100-byte broadcast
L_FULL, L_REST = _lora_air(255), _lora_air(49 + 4)  # a 300-byte message: 251 + 49 bytes


def _check_on(radio: RadioProfile, energy: MacEnergy, tx: float, rx: float, listen: float,
              use: RadioUse, processing: float = 0.0) -> None:
    """`_check` on any radio, with `processing` seconds of CAD correlation at PROC_W."""
    listen_j = listen * radio.idle_w + processing * PROC_W
    on = tx + rx + listen + processing
    total = tx * radio.tx_w + rx * radio.rx_w + listen_j + (PERIOD - on) * radio.sleep_w
    assert energy.tx_j == pytest.approx(tx * radio.tx_w, rel=1e-9)
    assert energy.rx_j == pytest.approx(rx * radio.rx_w, rel=1e-9)
    assert energy.listen_j == pytest.approx(listen_j, rel=1e-9)
    assert energy.total_j == pytest.approx(total, rel=1e-9)
    assert energy.radio_on_s == pytest.approx(on, rel=1e-9)
    traffic = use.tx_s * radio.tx_w + use.rx_s * radio.rx_w
    assert energy.overhead_j == pytest.approx(
        tx * radio.tx_w + rx * radio.rx_w + listen_j - traffic, rel=1e-9, abs=1e-15)


def test_the_lora_hand_figures_are_the_profiles() -> None:
    assert (LORA.tx_w, LORA.rx_w, LORA.idle_w, LORA.sleep_w) == pytest.approx(
        (29e-3 * 3.3, 11.5e-3 * 3.3, 11.5e-3 * 3.3, 0.2e-6 * 3.3))
    assert LORA.symbol_s == pytest.approx(TS)
    # radios.toml's AN1200.13 figures: 20 B 56.6 ms, 51 B 102.7 ms
    assert (_lora_air(20), _lora_air(51)) == pytest.approx((56.6e-3, 102.7e-3), abs=0.05e-3)
    for payload in (54, 104, 255, 53):
        assert LORA.frame_airtime(payload) == pytest.approx(_lora_air(payload), rel=1e-12)
    assert math.ceil((WAKE + CAD_RX + CAD_PROC) / TS) == 979
    assert lora_cad(LORA) == pytest.approx((CAD_RX, CAD_PROC, 8 + 979, EXT))
    params = MacParams()
    assert (params.lora_wakeup_interval_s, params.lora_cad_processing_w) == (WAKE, PROC_W)


def _lora_one_unicast() -> dict:
    """A sends B one 50-byte message: one 54-byte frame, no ACK (the profile has none)."""
    trace = [Sent(0.0, L_SMALL, A, (B,), False, 1, 1, 50, 1, "ok")]
    return radio_use(trace, LORA, tx={A: L_SMALL}, rx={B: L_SMALL})


def test_lpl_on_lora_on_a_1x2_mesh_matches_a_hand_calculation() -> None:
    use = _lora_one_unicast()
    # Both run 1800 CADs: 1.28 ms receiving and 1.024 ms correlating each.
    checks, correlating = CADS * CAD_RX, CADS * CAD_PROC
    # A: its frame's preamble is lengthened by 979 symbols (1.0025 s), at tx_w.
    _check_on(LORA, mac_energy("lpl", LORA, use[A], PERIOD), L_SMALL + EXT, 0.0, checks,
              use[A], correlating)
    # B: a CAD falls on the long preamble; it listens through the rest of the
    # lengthening (half a wake-up interval on average, 0.5002 s), then takes the frame.
    assert math.isclose(HEARD, 0.500192)
    _check_on(LORA, mac_energy("lpl", LORA, use[B], PERIOD), 0.0, L_SMALL, checks + HEARD,
              use[B], correlating)
    # On these figures: 228 mJ at A and 146 mJ at B, against 11 and 5 mJ for the ideal
    # MAC and 68.3 J for always-on.
    assert mac_energy("lpl", LORA, use[A], PERIOD).total_j == pytest.approx(0.2284, abs=1e-4)
    assert mac_energy("lpl", LORA, use[B], PERIOD).total_j == pytest.approx(0.1456, abs=1e-4)


def test_always_on_and_ideal_on_lora_on_a_1x2_mesh_match_a_hand_calculation() -> None:
    use = _lora_one_unicast()
    _check_on(LORA, mac_energy("always-on", LORA, use[A], PERIOD), L_SMALL, 0.0,
              PERIOD - L_SMALL, use[A])
    _check_on(LORA, mac_energy("ideal", LORA, use[B], PERIOD), 0.0, L_SMALL, 0.0, use[B])


# The 3 x 3 mesh's centre on LoRa: it broadcasts 4 one-frame halos (100 bytes) to its 4
# neighbours, sends its parent a 300-byte message (2 frames), and takes its neighbours'
# 4 broadcasts and 4 one-frame unicasts (50 bytes); no ACKs.
LORA_CENTRE = RadioUse(tx_s=4 * L_BC + L_FULL + L_REST, rx_s=4 * L_BC + 4 * L_SMALL,
                       unicasts=1, broadcasts=4, frames_sent=6, received=8,
                       frames_received=8, broadcast_frames_sent=4, broadcasts_received=4,
                       broadcast_frames_received=4, links=4, broadcast_copies=16)


def test_lpl_on_lora_on_a_3x3_mesh_matches_a_hand_calculation() -> None:
    # Each of its 6 frames has a long preamble; each of the 8 it takes wakes it once.
    tx = LORA_CENTRE.tx_s + 6 * EXT
    listen = CADS * CAD_RX + 8 * HEARD
    _check_on(LORA, mac_energy("lpl", LORA, LORA_CENTRE, PERIOD), tx, LORA_CENTRE.rx_s,
              listen, LORA_CENTRE, CADS * CAD_PROC)
    # Its 7.5 s on air fit EU868's 1 % of the half hour (18 s).
    assert tx < LORA.duty_cycle * PERIOD


def test_the_lora_wake_up_interval_is_near_its_optimum_for_one_frame_each_way() -> None:
    """B-MAC's trade-off for a node that sends one frame and takes one in the period:
    CADs cost E a wake-up interval T, preambles T at tx_w and T / 2 at rx_w; the sum is
    least at T = sqrt(E x period / (tx_w + rx_w / 2)), about 1 s."""
    cad_j = CAD_RX * LORA.rx_w + CAD_PROC * PROC_W
    best = math.sqrt(cad_j * PERIOD / (LORA.tx_w + LORA.rx_w / 2))
    assert 0.95 < best < 1.1
    use = RadioUse(L_SMALL, L_SMALL, 1, 0, 1, 1, 1, links=1)
    joules = {wake: mac_energy("lpl", LORA, use, PERIOD,
                               MacParams(lora_wakeup_interval_s=wake)).total_j
              for wake in (0.5, 0.8, 1.0, 1.25, 2.0)}
    assert min(joules, key=joules.__getitem__) == 1.0


def _lora_use(unicasts: int, unicast_frames: int, broadcasts: int, taken: int) -> RadioUse:
    """A LoRa node's use: unicasts of `unicast_frames` and one-frame broadcasts of 50-byte
    frames, and `taken` one-frame messages."""
    sent = unicasts * unicast_frames + broadcasts
    return RadioUse(sent * L_SMALL, taken * L_SMALL, unicasts, broadcasts, sent, taken,
                    taken, broadcasts, 0, 0, links=1, broadcast_copies=broadcasts)


# What EU868's 1 % lets a node send in a half hour with 1 s preambles: 16 frames.
LORA_TRAFFIC = st.tuples(st.integers(0, 6), st.integers(1, 2), st.integers(0, 4),
                         st.integers(0, 40))


@settings(max_examples=40, deadline=None)
@given(LORA_TRAFFIC, st.sampled_from([0, 2, 3]))
def test_on_lora_ideal_is_below_lpl_below_always_on_and_more_traffic_costs_more(
        traffic: tuple, more: int) -> None:
    use = _lora_use(*traffic)
    assert use.frames_sent * (L_SMALL + EXT) <= LORA.duty_cycle * PERIOD
    e = mac_energies(LORA, use, PERIOD)
    assert set(e) == {"always-on", "ideal", "lpl", "scheduled"}
    assert e["ideal"].total_j <= e["lpl"].total_j <= e["always-on"].total_j
    bigger = list(traffic)
    bigger[more] += 1
    assert mac_energy("lpl", LORA, _lora_use(*bigger), PERIOD).total_j > e["lpl"].total_j


def test_lpl_on_lora_passes_always_on_only_beyond_the_duty_cycle() -> None:
    """A second of preamble at tx_w (95.7 mW) costs more than the listening it replaces
    (38 mW), so a node sending 800 frames a half hour would draw more under lpl than
    always on; EU868's 1 % allows it 16."""
    use = _lora_use(800, 1, 0, 0)
    assert use.frames_sent * (L_SMALL + EXT) > 40 * LORA.duty_cycle * PERIOD
    assert mac_energy("lpl", LORA, use, PERIOD).total_j > \
        mac_energy("always-on", LORA, use, PERIOD).total_j


# ------------------------------------------------------------------ (d) BLE: connection events
# The ble profile's figures, typed in: LE 1M (8 us a byte), 14 bytes of overhead a frame,
# T_IFS 150 us, the empty PDU 10 bytes; nRF52832 TX 7.1 mA, RX 6.5 mA, 1.9 uA at 3 V.
BLE = profile("ble")
B_BYTE = 8 / 1e6
EMPTY = 10 * B_BYTE  # preamble 1, access address 4, header 2, CRC 3: 80 us
T_IFS = 150e-6
EVENTS = PERIOD / 4.0  # anchor points of a link at a 4 s connection interval: 450
WIDEN = (50 + 50) * 1e-6 * 4.0 + 16e-6  # both sides' 50 ppm over 4 s, and 16 us: 416 us
# One link's idle events at one end, half a central's (its empty PDU at the anchor, T_IFS,
# the peripheral's empty reply) and half a peripheral's (its window WIDEN early, the
# central's empty PDU, T_IFS, its reply): an empty PDU sent and one taken an event, and
# T_IFS + WIDEN / 2 listening.
LINK_TX, LINK_RX = EVENTS * EMPTY, EVENTS * EMPTY
LINK_LISTEN = EVENTS * (T_IFS + WIDEN / 2)
B_SMALL = (50 + 14) * B_BYTE  # a 50-byte message: 512 us
B_BC = (100 + 14) * B_BYTE  # a 100-byte broadcast
B_FULL, B_REST = 261 * B_BYTE, (53 + 14) * B_BYTE  # a 300-byte message: 247 + 53 bytes


def test_the_ble_hand_figures_are_the_profiles() -> None:
    assert (BLE.tx_w, BLE.rx_w, BLE.idle_w, BLE.sleep_w) == pytest.approx(
        (7.1e-3 * 3, 6.5e-3 * 3, 6.5e-3 * 3, 1.9e-6 * 3))
    assert (BLE.turnaround_s, BLE.ifs_s, BLE.ack_airtime) == pytest.approx((T_IFS, T_IFS, EMPTY))
    assert BLE.frame_airtime(BLE.frame_sizes(50)[0]) == pytest.approx(B_SMALL)
    assert [BLE.frame_airtime(f) for f in BLE.frame_sizes(300)] == pytest.approx(
        [B_FULL, B_REST])
    params = MacParams()
    assert params.ble_window_widening_s == pytest.approx(WIDEN)
    assert params.ble_conn_interval_s * EVENTS == PERIOD


def _ble_one_unicast() -> dict:
    """A sends B one 50-byte message: one 64-byte frame, B's empty PDU back."""
    trace = [Sent(0.0, B_SMALL, A, (B,), False, 1, 1, 50, 1, "ok")]
    return radio_use(trace, BLE, tx={A: B_SMALL, B: EMPTY}, rx={A: EMPTY, B: B_SMALL})


def test_tsch_on_ble_on_a_1x2_mesh_matches_a_hand_calculation() -> None:
    use = _ble_one_unicast()
    assert use[A].links == use[B].links == 1
    # A: the link's idle events; its frame in one of them, B's reply, a T_IFS after each.
    _check_on(BLE, mac_energy("tsch", BLE, use[A], PERIOD), B_SMALL + LINK_TX,
              EMPTY + LINK_RX, LINK_LISTEN + 2 * T_IFS, use[A])
    # B: the same events; it takes the frame and replies.
    _check_on(BLE, mac_energy("tsch", BLE, use[B], PERIOD), EMPTY + LINK_TX,
              B_SMALL + LINK_RX, LINK_LISTEN + 2 * T_IFS, use[B])
    # On these figures 14.9 mJ at each end, against 10.3 mJ for the ideal MAC (asleep
    # at 5.7 uW) and 35.1 J always on.
    assert mac_energy("tsch", BLE, use[A], PERIOD).total_j == pytest.approx(14.89e-3,
                                                                            abs=0.01e-3)


# The 3 x 3 mesh's centre on BLE: the same traffic as LORA_CENTRE, with the peer's empty
# PDU answering each unicast frame (the centre answers its 4 unicasts, is answered twice).
BLE_CENTRE = RadioUse(tx_s=4 * B_BC + B_FULL + B_REST + 4 * EMPTY,
                      rx_s=4 * B_BC + 4 * B_SMALL + 2 * EMPTY, unicasts=1, broadcasts=4,
                      frames_sent=6, received=8, frames_received=8, broadcast_frames_sent=4,
                      broadcasts_received=4, broadcast_frames_received=4, links=4,
                      broadcast_copies=16)


def test_tsch_on_ble_on_a_3x3_mesh_matches_a_hand_calculation() -> None:
    sent = (4 * B_BC + B_FULL + B_REST) / 6  # mean airtime of its frames
    # 4 links' idle events. Each broadcast frame goes to its 4 receivers on their links:
    # 12 copies more, each answered (16 replies taken); it answers the 4 broadcast frames
    # it takes. A T_IFS after each frame and each reply of 2 + 16 + 8 exchanges.
    tx = BLE_CENTRE.tx_s + 12 * sent + 4 * EMPTY + 4 * LINK_TX
    rx = BLE_CENTRE.rx_s + 16 * EMPTY + 4 * LINK_RX
    listen = 4 * LINK_LISTEN + (2 + 16 + 8) * 2 * T_IFS
    _check_on(BLE, mac_energy("tsch", BLE, BLE_CENTRE, PERIOD), tx, rx, listen, BLE_CENTRE)


def test_slave_latency_spares_the_peripheral_half_of_each_end() -> None:
    """At 1 s with a latency of 3 the central opens 1800 events and the peripheral
    listens to 450, widening over 4 s; the central listens for the 1350 missing replies
    as long as an empty PDU."""
    idle = RadioUse(0.0, 0.0, 0, 0, 0, 0, 0, links=1)
    params = MacParams(ble_conn_interval_s=1.0, ble_slave_latency=3)
    assert params.ble_window_widening_s == pytest.approx(WIDEN)
    opened, heard = PERIOD / 1.0, PERIOD / 4.0
    tx = (opened + heard) / 2 * EMPTY
    rx = heard * EMPTY
    listen = (opened * T_IFS + (opened - heard) * EMPTY + heard * (WIDEN + T_IFS)) / 2
    _check_on(BLE, mac_energy("tsch", BLE, idle, PERIOD, params), tx, rx, listen, idle)


def test_connection_parameters_outside_the_specification_are_refused() -> None:
    with pytest.raises(ValueError, match="supervision timeout"):
        MacParams(ble_conn_interval_s=4.0, ble_slave_latency=3)  # 32 s: not below 32
    with pytest.raises(ValueError, match=r"multiple of 1\.25 ms"):
        MacParams(ble_conn_interval_s=1.001)
    with pytest.raises(ValueError):
        MacParams(ble_conn_interval_s=5.0)  # above 4 s
    wide = MacParams(ble_conn_interval_s=7.5e-3, ble_slave_latency=499, ble_sca_ppm=500)
    assert "window widening" in unsupported_reason("tsch", BLE, wide)


def test_tsch_on_ble_needs_the_links_and_broadcast_copies_radio_use_counts() -> None:
    with pytest.raises(ValueError, match="no links"):
        mac_energy("tsch", BLE, BLE_CENTRE._replace(links=0), PERIOD)
    with pytest.raises(ValueError, match="broadcast_copies"):
        mac_energy("tsch", BLE, BLE_CENTRE._replace(broadcast_copies=3), PERIOD)


def _ble_use(frame_bytes: int, links: int, unicasts: int, broadcasts: int, receivers: int,
             taken_unicasts: int, taken_broadcasts: int) -> RadioUse:
    """A BLE node's use: one-frame messages of `frame_bytes` on air, each broadcast to
    `receivers` of its `links`."""
    air = BLE.frame_airtime(frame_bytes)
    sent = unicasts + broadcasts
    taken = taken_unicasts + taken_broadcasts
    return RadioUse(sent * air + taken_unicasts * EMPTY, taken * air + unicasts * EMPTY,
                    unicasts, broadcasts, sent, taken, taken, broadcasts, taken_broadcasts,
                    taken_broadcasts, links=links,
                    broadcast_copies=broadcasts * min(receivers, links))


BLE_TRAFFIC = st.tuples(st.integers(24, 261), st.integers(1, 5), st.integers(0, 20),
                        st.integers(0, 20), st.integers(1, 5), st.integers(0, 40),
                        st.integers(0, 40))


@settings(max_examples=40, deadline=None)
@given(BLE_TRAFFIC, st.sampled_from([1, 2, 3, 5, 6]))
def test_on_ble_ideal_is_below_tsch_below_always_on_and_more_traffic_costs_more(
        traffic: tuple, more: int) -> None:
    use = _ble_use(*traffic)
    e = mac_energies(BLE, use, PERIOD)
    assert set(e) == {"always-on", "ideal", "tsch", "scheduled"}
    assert e["ideal"].total_j <= e["tsch"].total_j <= e["always-on"].total_j
    bigger = list(traffic)
    bigger[more] += 1
    assert mac_energy("tsch", BLE, _ble_use(*bigger), PERIOD).total_j >= e["tsch"].total_j


# ------------------------------------------------------------------ radio_use
def test_radio_use_counts_messages_frames_and_each_broadcast_receiver() -> None:
    a, b, c, d = (0, 0), (0, 1), (1, 0), (1, 1)
    trace = [
        Sent(0.0, 0.01, a, (b,), False, 1, 1, 150, 2, "ok"),  # 2 frames (116 + 34 bytes)
        Sent(0.1, 0.11, a, (b, c), True, 1, 1, 50, 1, "ok"),  # one broadcast, 2 receivers
        Sent(0.2, 0.21, c, (a,), False, 1, 1, 50, 3, "ok after 2 retries"),
        Sent(0.3, 0.31, c, (b,), False, 1, 1, 50, 4, "missed by 1 of 1"),
        Sent(0.4, 0.41, b, (a, c), True, 1, 1, 300, 3, "missed by 1 of 2"),  # 3 frames
    ]
    use = radio_use(trace, RADIO, tx={a: 0.5, d: 0.25}, rx={b: 0.75})
    assert set(use) == {a, b, c, d}
    assert use[a] == RadioUse(0.5, 0.0, unicasts=1, broadcasts=1, frames_sent=3, received=2,
                              frames_received=4, broadcast_frames_sent=1,
                              broadcasts_received=1, broadcast_frames_received=3,
                              links=2, broadcast_copies=2)
    assert use[b] == RadioUse(0.0, 0.75, unicasts=0, broadcasts=1, frames_sent=3, received=2,
                              frames_received=3, broadcast_frames_sent=3,
                              broadcasts_received=1, broadcast_frames_received=1,
                              links=2, broadcast_copies=6)
    assert use[c] == RadioUse(0.0, 0.0, unicasts=2, broadcasts=0, frames_sent=7, received=2,
                              frames_received=4, broadcast_frames_sent=0,
                              broadcasts_received=2, broadcast_frames_received=4,
                              links=2, broadcast_copies=0)
    assert use[d] == RadioUse(0.25, 0.0, 0, 0, 0, 0, 0)


def test_radio_use_of_a_medium_run_agrees_with_the_medium() -> None:
    queue, trace = EventQueue(), []
    neighbours = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}
    medium = SharedRadio(neighbours, RADIO, queue, 0, lambda *_: None, trace=trace)
    medium.send(Transmission("a", ("b",), Kind.HALO, 1, 150, [("b", None)]), ready=0.0)
    medium.send(Transmission("c", ("a", "b"), Kind.HALO, 1, 40, [("a", None), ("b", None)],
                             broadcast=True), ready=0.0)
    assert queue.run(1000)
    times = medium.times
    use = radio_use(trace, RADIO, times.tx, times.rx)
    assert use["a"].frames_sent == 2 and use["a"].unicasts == 1
    assert use["b"].received == 2 and use["b"].frames_received == 3
    assert use["b"].tx_s == pytest.approx(2 * ACK)  # it ACKed the unicast's two frames
    assert sum(u.frames_sent for u in use.values()) == medium.frames == 3


# ------------------------------------------------------------------ refusals
def test_tsch_refuses_lora_naming_the_radio() -> None:
    use = RadioUse(0.0, 0.0, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="tsch does not apply to radio 'lora-sf7': LoRa"):
        mac_energy("tsch", LORA, use, PERIOD)
    assert unsupported_reason("lpl", LORA) is None


def test_lpl_on_lora_refuses_a_preamble_longer_than_the_sx1276_counts() -> None:
    """Its preamble register has 16 bits: 65,535 symbols, 67 s at SF7."""
    assert unsupported_reason("lpl", LORA, MacParams(lora_wakeup_interval_s=60.0)) is None
    reason = unsupported_reason("lpl", LORA, MacParams(lora_wakeup_interval_s=70.0))
    assert "'lora-sf7'" in reason and "65535" in reason


def test_lpl_refuses_ble_and_both_refuse_radios_without_cca_or_acks() -> None:
    for mac in ("lpl", "tsch"):
        reason = unsupported_reason(mac, profile("wifi"))
        assert reason is not None and "'wifi'" in reason and "CCA" in reason
    reason = unsupported_reason("lpl", BLE)
    assert "'ble'" in reason and "CCA" in reason and "advertising bearer" in reason
    assert unsupported_reason("tsch", BLE) is None
    idle = RadioUse(0.0, 0.0, 0, 0, 0, 0, 0)
    assert set(mac_energies(profile("wifi"), idle, PERIOD)) == {"always-on", "ideal"}
    assert set(mac_energies(BLE, idle, PERIOD)) == {"always-on", "ideal", "tsch", "scheduled"}
    assert set(mac_energies(LORA, idle, PERIOD)) == {"always-on", "ideal", "lpl", "scheduled"}


def test_tsch_refuses_frames_longer_than_a_timeslot_holds() -> None:
    long = RADIO.model_copy(update={"name": "long", "max_frame_bytes": 200})
    assert "does not fit the timeslot" in unsupported_reason("tsch", long)


def test_inconsistent_uses_and_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="frames sent"):
        mac_energy("ideal", RADIO, RadioUse(0.0, 0.0, 2, 0, 1, 0, 0), PERIOD)
    with pytest.raises(ValueError, match="does not fit a period"):
        mac_energy("ideal", RADIO, RadioUse(2.0, 0.0, 1, 0, 1, 0, 0), 1.0)
    with pytest.raises(ValueError, match="period_s"):
        mac_energy("ideal", RADIO, RadioUse(0.0, 0.0, 0, 0, 0, 0, 0), 0.0)
    with pytest.raises(ValueError, match="unknown MAC"):
        mac_energy("csma", RADIO, RadioUse(0.0, 0.0, 0, 0, 0, 0, 0), PERIOD)  # type: ignore[arg-type]
