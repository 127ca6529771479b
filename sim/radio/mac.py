"""Duty-cycled MACs: the joules one party's radio draws over a period, under five MACs.

The medium (sim/radio/media.py) times the traffic and counts each party's seconds
transmitting and receiving (`Tally`, `RadioTimes`): its frames, retries and ACKs, and
nothing of what a MAC does to meet its neighbours. `radio_use` sums one slot's trace into
what each party's radio did (`RadioUse`); `mac_energy` prices that over a period under
a MAC, by radio state (`MacEnergy`), with the radio profile's powers and airtimes. Each
MAC is the radio's own duty-cycled MAC of its kind, where one exists:

| MAC | 802.15.4 | BLE | LoRa | Wi-Fi |
| --- | --- | --- | --- | --- |
| always-on, ideal | yes | yes | yes | yes |
| lpl (sampled listening) | ContikiMAC | refused: no CCA | CAD preamble sampling | refused |
| tsch (scheduled) | TSCH (RFC 8180) | connection events | refused: no TSCH | refused |
| scheduled (wake-up) | Glossy sync, deep sleep | the same | the same | refused |

- **always-on**: the radio listens (`idle_w`) whenever it neither transmits nor receives,
  as sim/radio/energy.py's `state_energy` gives it; the upper bound.
- **ideal**: asleep (`sleep_w`) whenever it neither transmits nor receives; the floor.
- **lpl** on 802.15.4: ContikiMAC-style low-power listening (A. Dunkels, "The ContikiMAC
  Radio Duty Cycling Protocol", SICS Technical Report T2011:13, 2011; figures from Contiki
  3.0's core/net/mac/contikimac/contikimac.c, commit 32b5b17f, on the MSP430 motes'
  32,768 Hz rtimer, the CC2420 motes of the 802.15.4 profile). Every party samples the
  channel `lpl_check_rate_hz` times a second with `lpl_ccas_per_check` CCAs, each keeping
  the radio on for the profile's turnaround (RX calibration, 12 symbols) plus its CCA time
  (8 symbols of RSSI averaging): 0.64 ms a check, 0.51 % of the time at 8 Hz, inside the
  0.4-0.8 % that Contiki's ContikiMAC commit message reports for idle listening. A
  message's first frame is preceded by `lpl_ccas_before_send` CCAs (CCA_COUNT_MAX_TX).
  A unicast is strobed, copy after copy `lpl_inter_copy_s` apart (listening for the ACK
  in between), until the receiver's ACK. With phase-lock the sender starts
  `lpl_phase_lead_checks` check times before the receiver's learnt wake-up (GUARD_TIME
  minus the CCAs before sending = 10 CHECK_TIME = 12.2 ms), so a copy of period P =
  airtime + gap is sent lead / P + 1/2 extra times on average (the receiver's check
  falls, on average, halfway through a copy, and it takes the next whole one): about 5
  for a 67-byte frame, 3 for a full 133-byte one. Without phase-lock the lead is half a
  wake-up interval on average. A broadcast frame is strobed for STROBE_TIME (a wake-up
  interval plus two check times), ceil(STROBE_TIME / P) copies, the radio off between
  them. A receiver wakes on a check that hears a copy, listens through the rest of that
  copy (half of one on average) and the gap, takes the next copy whole, and ACKs a
  unicast; the frames after a unicast's first follow back to back while it is awake
  (FRAME_PENDING bursts), one inter-frame space apart. Each fragment of a broadcast is
  strobed and caught on its own.
- **lpl** on LoRa: preamble sampling with Channel Activity Detection, B-MAC's long
  preamble (J. Polastre, J. Hill, D. Culler, "Versatile Low Power Media Access for
  Wireless Sensor Networks", SenSys 2004) with LoRa's CAD for its channel check, as
  LoRa wake-on-radio does it (EBYTE's E22/E220 modules: a "wake-up code" before the data,
  a WOR cycle of 0.5 to 4 s). Every party runs a CAD every `lora_wakeup_interval_s`. A
  CAD (SX1276 datasheet Rev 4, 4.1.6 "Channel Activity Detection"; Semtech AN1200.85)
  receives for (2^SF + 32) / BW seconds at the receive current (1.28 ms at SF7, 125 kHz),
  then correlates "a little bit less than a symbol period" at a reduced current (the
  datasheet's CAD consumption table: 5.6 mA at 125 kHz): `lora_cad_processing_symbols`
  (one symbol, an upper bound) at `lora_cad_processing_w`; 67.5 uJ a CAD, 68 uW at 1 s.
  Every frame's preamble is the standard one lengthened by a wake-up interval and a CAD,
  in whole symbols (979 at SF7 and 1 s): wherever a receiver's CAD falls, it is done
  while a standard preamble still remains to lock on to. The receiver's CAD falls
  uniformly in the lengthening, so after it the receiver listens through half a wake-up
  interval of it on average, then takes the frame. The medium's frames are ACK-less and
  EU868's duty cycle keeps a sender off the air 99 times a frame's air time, so a
  receiver does not stay awake between frames: each frame, unicast or broadcast (every
  neighbour wakes on it), has its own long preamble and its own wake-up. Air time: at 1 s
  a frame of a 50-byte message holds the channel 1.1 s instead of 0.1 s, and the 1 %
  duty cycle (the profile's `duty_cycle`) then keeps its sender off the sub-band for 110 s:
  at most 16 such frames a node in an 1800 s slot. The medium times the wave without the
  long preambles and their off-times; this module prices energy only.
- **tsch** on 802.15.4: TSCH in the minimal 6TiSCH configuration (RFC 8180), priced
  per timeslot as in X. Vilajosana et al., "A Realistic Energy Consumption Model for TSCH
  Networks", IEEE Sensors Journal 14(2), 2014, pp. 482-489 (within a few % of
  measurement), with the radio's part of each slot from the 802.15.4-2015 default
  timeslot template (as RFC 8180 section 4.4 recommends; durations as in Contiki-NG's
  tsch-timeslot-timing.c, which centres the receive window on the expected frame):
  TxDataRxAck: the frame, then listening from macTsRxAckDelay (800 us) to the ACK's
  start at macTsTxAckDelay (1000 us), then the Enhanced ACK, which carries a 4-byte
  time-correction IE (RFC 8180 section 4.5.3, A.3); TxData (broadcast): the frame;
  RxDataTxAck / RxData: listening through the guard before the frame, half of
  macTsRxWait (2200 us), the frame, and the Enhanced ACK for a unicast; RxIdle: listening
  the whole macTsRxWait when nothing comes. Every party listens in the one shared cell
  of every slotframe (RFC 8180 section 4.1: 101 slots of 10 ms in its example, below
  0.99 % duty cycle) except when it transmits there its own Enhanced Beacon (every
  `tsch_eb_period_s`; 30 bytes of IEs, RFC 8180 A.1) or keep-alive (an empty acked data
  frame to its time source, every `keepalive_period_s`: the time for the relative drift
  of two crystals of `tsch_drift_ppm` each to use up the guard time macTsRxWait / 2).
  The traffic's frames go in cells of their own, as if a scheduling function (RFC 9033's
  MSF) had allocated exactly the cells the burst used: a wave's burst of frames within
  seconds does not fit one shared cell a second, and the medium timed it at channel
  rate.
- **tsch** on BLE means the radio's scheduled MAC: BLE connection events (Bluetooth Core
  Specification v4.2, Vol 6 Part B, 4.5; v5.x the same part). A party keeps one
  connection per peer it exchanges with (`RadioUse.links`: its tree parent, children
  and halo neighbours). At each anchor point, every `ble_conn_interval_s`, the central
  sends a packet and the peripheral replies T_IFS (150 us) later; an idle connection
  stays alive on empty PDUs (the profile's ACK frame, 10 bytes, 80 us). The central
  transmits at every anchor; with `ble_slave_latency` L the peripheral listens to one
  event in L + 1 (the central listens for its missing reply as long as an empty PDU, an
  upper bound). The peripheral opens its window early by the window widening
  (masterSCA + slaveSCA) / 10^6 x time since its last anchor (4.5.7), plus the 16 us
  that a sleep clock's instantaneous timing may stray from its average (v5.2 4.2.2;
  v5.3+ 4.2.4 writes it into the widening); at 4 s and 50 ppm a side, 416 us. The trace
  does not say which end of a link is its central: each end is priced half a central's
  events and half a peripheral's, so the two ends of a link together pay one of each.
  A message rides in a connection event of its link: each frame and the peer's reply
  (an empty PDU, the profile's ACK: in tx_s and rx_s) with a T_IFS after each of the two,
  as the medium times them, during which both radios are on; the event's empty opening
  exchange is priced as if the message did not replace it (an upper bound, one empty
  PDU pair a message). A link is point-to-point, so a broadcast frame goes once to each
  of its receivers (`RadioUse.broadcast_copies`), each copy answered. The medium times
  the wave at the profile's hop latency (half a 7.5 ms interval): at a 4 s interval a
  frame would wait 2 s a hop on average, or the links would shorten their interval for
  the wave with the connection update procedure, whose control PDUs are not priced.

- **scheduled**: every party wakes at the slot's known time, runs the wave, and puts its
  radio into its deepest sleep (the profile's `deep_sleep_w`) until the next slot, as
  TAG's epochs (Madden et al., OSDI 2002) and the Low-power Wireless Bus (F. Ferrari, M.
  Zimmerling, L. Mottola, L. Thiele, SenSys 2012) do; the caller puts the processor into
  its own (sim/radio/device.py's `sleep_w`). The slot begins with a time-sync flood from
  the edge, priced as a Glossy flood (F. Ferrari, M. Zimmerling, L. Thiele, O. Saukh,
  "Efficient Network Flooding and Time Synchronization with Glossy", IPSN 2011): the
  initiator sends a short frame, every node that receives it sends it again a fixed
  turnaround after the reception ends (the concurrent copies interfere constructively
  on 802.15.4), and a node turns its radio off once it has sent it `sched_sync_transmissions`
  (Glossy's N) times, having received it as often. A node `sync_hops` hops from the edge
  (`RadioUse.sync_hops`, the tree's depth: the flood's hop distance on the grid) knows
  when the flood reaches it: Glossy's frame carries a relay counter, from which each
  node takes its hop count and the flood's start (`sched_wake_by_relay_counter`); so it
  wakes its guard time before its own first reception, not before the flood's start
  (without: it listens (hops - 1) flood steps of airtime + turnaround more). Then N
  receptions and N transmissions with a turnaround between each two;
  Glossy measured floods of a few milliseconds and a sync error below a microsecond, so
  the wave after it starts with the clocks together. The guard: a node sleeps a whole
  slot between two floods, and its crystal and the initiator's may drift apart by
  2 x `sched_drift_ppm` (each crystal's tolerance, opposite ways; 40 ppm as TSCH's
  keep-alive period assumes) times the slot; it wakes that long early and on average
  listens that long before the flood comes (the window is twice that, centred). With
  `sched_drift_compensation` (each node learns its drift from successive floods, as
  Contiki-NG's TSCH adaptive timesync does) what remains is `sched_compensated_ppm`.
  During the wave a receiver opens a window of `sched_rx_window_s` before each message
  it expects (TSCH's mean guard, half macTsRxWait: the 802.15.4-2015 default timeslot
  template's 2.2 ms window), stays on through the inter-frame space before each later
  frame of it (the sender sets Frame Pending), and turns around before each ACK it
  sends; a sender senses the channel once before each frame (unslotted CSMA-CA's CCA:
  RX calibration plus the CCA time) and waits a turnaround for each ACK. The same on
  BLE and LoRa, with their own frames and timings (Glossy-style floods exist on both:
  BlueFlood, Al Nahas et al., EWSN 2019; LoRaBlink, Bor et al., EWSN 2016); Wi-Fi
  (the Pi's radio, whose profile has no deep-sleep figure) is refused. The radio's
  gaps inside the wave are priced at its deep sleep too (a 1 s wave's gaps at the CC2420's
  60 uW power-down rather than its 0.06 uW regulator-off cost at most 60 uJ).

Each MAC's `overhead_j` is what its radio draws beyond the traffic's own frames and ACKs
(tx_s at tx_w, rx_s at rx_w): idle listening for always-on, nothing for the ideal MAC,
checks, strobes, long preambles and waits for LPL, idle cells, beacons, keep-alives,
connection events and slot waits for TSCH, the sync flood, guard, windows, CCAs and
turnarounds for the scheduled MAC. The device's energy is not here (the caller
adds the CPU's).

What the model leaves out: overhearing (an LPL neighbour that wakes on a unicast strobe
for someone else stays on for a copy; on LoRa it listens through half a wake-up interval
of preamble and the frame, as much as its addressee, since the link header is in the
payload; a TSCH neighbour hears EBs in the shared cell it listens to anyway, each costing
its airtime less half macTsRxWait more than the idle listen it replaces, about 0.4 ms
for a 47-byte EB), false wake-ups on noise, the keep-alives a time source receives from
its children (the same kind of shared-cell swap), radio start-up (from sleep, the
SX1276's crystal and the nRF52832's ramp-up before each packet) and CPU phases of
Vilajosana et al.'s model (the profiles have no start-up power), BLE's connection set-up
(advertising, scanning) and, under loss, the exact ACK-less retries (priced like acked
ones) and the wake-ups on frames lost. Under the scheduled MAC: the wake-up from deep
sleep (the CC2420's regulator and crystal start-up and its registers written again, once
a slot), the schedule itself (which message comes when: the windows assume each
receiver knows, as LWB's flooded schedule or TSCH's cells tell it, while the medium
times the wave with CSMA), floods lost (a node that misses one sleeps through the slot
or listens until the next), and the flood's delay of the wave (milliseconds).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party, Sent

MacName = Literal["always-on", "ideal", "lpl", "tsch", "scheduled"]
MACS: tuple[MacName, ...] = ("always-on", "ideal", "lpl", "tsch", "scheduled")

# Contiki's ContikiMAC timing is in ticks of the rtimer: 32,768 Hz on the MSP430 motes
# (Tmote Sky, Zolertia Z1, both with a CC2420): cpu/msp430/rtimer-arch.h, 4096 * 8.
RTIMER_SECOND = 32768
CCA_CHECK_TICKS = RTIMER_SECOND // 8192  # CCA_CHECK_TIME: 4 ticks, 122 us
CCA_SLEEP_TICKS = RTIMER_SECOND // 2000  # CCA_SLEEP_TIME between two CCAs: 16 ticks, 488 us
CHECK_TICKS = 2 * (CCA_CHECK_TICKS + CCA_SLEEP_TICKS)  # CHECK_TIME (2 CCAs): 40 ticks, 1.22 ms
INTER_PACKET_TICKS = RTIMER_SECOND // 2500  # INTER_PACKET_INTERVAL: 13 ticks, 397 us

# BLE: T_IFS, the space between two packets of a connection event (Core Specification
# v4.2 Vol 6 Part B 4.1.1); the ble profile's turnaround and IFS.
BLE_T_IFS_S = 150e-6
# A sleep clock's instantaneous timing may stray this far from its average (Core
# Specification v5.2 Vol 6 Part B 4.2.2): the fixed part of the window widening.
BLE_SLEEP_JITTER_S = 16e-6
# connInterval is a multiple of 1.25 ms from 7.5 ms to 4 s; the supervision timeout, at
# most 32 s, must exceed (1 + connSlaveLatency) x connInterval x 2 (v4.2 Vol 6 Part B
# 4.5.1, 4.5.2); connSlaveLatency is below 500.
BLE_INTERVAL_UNIT_S = 1.25e-3
BLE_MAX_SUPERVISION_S = 32.0
# The SX1276's preamble length register (RegPreambleMsb/Lsb) is 16 bits wide.
LORA_MAX_PREAMBLE_SYMBOLS = 65535

_MISSED = re.compile(r"missed by (\d+) of (\d+)")


class RadioUse(NamedTuple):
    """What one party's radio did in one slot (or any stretch of traffic)."""

    tx_s: float  # seconds transmitting: its data frames, retries, and the ACKs it sent
    rx_s: float  # seconds receiving: frames and ACKs it took
    unicasts: int  # messages it sent to one receiver (each may be several frames)
    broadcasts: int  # messages it sent as one transmission heard by several neighbours
    frames_sent: int  # data frames it put on air (retries included)
    received: int  # messages it took
    frames_received: int  # data frames it took
    broadcast_frames_sent: int = 0  # of frames_sent, those of its broadcasts
    broadcasts_received: int = 0  # of received, the broadcasts
    broadcast_frames_received: int = 0  # of frames_received, the broadcasts'
    # Distinct parties it sent to or took from: the connections a point-to-point link
    # layer (BLE) keeps for it.
    links: int = 0
    # Its broadcast frames times their receivers: what a point-to-point link layer sends
    # for them, one copy to each receiver.
    broadcast_copies: int = 0
    # Hops from the initiator of the scheduled MAC's sync flood (the edge): how long the
    # flood takes to reach it (0: the initiator).
    sync_hops: int = 0

    @property
    def unicast_frames_sent(self) -> int:
        return self.frames_sent - self.broadcast_frames_sent

    @property
    def unicasts_received(self) -> int:
        return self.received - self.broadcasts_received

    @property
    def unicast_frames_received(self) -> int:
        return self.frames_received - self.broadcast_frames_received


class MacEnergy(NamedTuple):
    """One party's radio over one period under one MAC: joules by state, and seconds on."""

    tx_j: float
    rx_j: float
    listen_j: float  # on and listening: idle listening, checks (CADs), waits in slots
    sleep_j: float
    overhead_j: float  # beyond the traffic's frames and ACKs; also in tx/rx/listen
    total_j: float
    radio_on_s: float  # seconds the radio was not asleep


class MacParams(BaseModel):
    """The MACs' settings. Every field is configurable; each default says its source."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # -- LPL (ContikiMAC, Contiki 3.0 core/net/mac/contikimac/contikimac.c) ----------------
    # NETSTACK_RDC_CHANNEL_CHECK_RATE, 8 by default (core/contiki-default-conf.h).
    lpl_check_rate_hz: float = Field(8.0, gt=0)
    # CCA_COUNT_MAX: two CCAs a check, Tc apart, so that one falls on a copy of a strobe.
    lpl_ccas_per_check: int = Field(2, ge=1)
    # CCA_COUNT_MAX_TX: CCAs before the first copy of a message, for collision avoidance.
    lpl_ccas_before_send: int = Field(6, ge=0)
    # INTER_PACKET_INTERVAL (Ti of Dunkels' report, 0.4 ms): gap between two copies.
    lpl_inter_copy_s: float = Field(INTER_PACKET_TICKS / RTIMER_SECOND, ge=0)
    # CHECK_TIME: the span of one check's CCAs; STROBE_TIME and GUARD_TIME count in it.
    lpl_check_time_s: float = Field(CHECK_TICKS / RTIMER_SECOND, ge=0)
    # WITH_PHASE_OPTIMIZATION, on by default.
    lpl_phase_lock: bool = True
    # GUARD_TIME = 10 CHECK_TIME + CHECK_TIME_TX before the expected wake-up, of which
    # CHECK_TIME_TX goes to the CCAs before sending: strobing starts 10 CHECK_TIME early.
    lpl_phase_lead_checks: float = Field(10.0, ge=0)

    # -- LPL on LoRa (CAD preamble sampling, B-MAC's long preamble) ------------------------
    # How often a receiver runs a CAD, and so how long every preamble is. 1 s: B-MAC's
    # trade-off between checking (a CAD's energy E every interval T) and preambles (T at
    # tx_w for its sender, T / 2 at rx_w for its receiver) is least at
    # T = sqrt(E x period / (frames sent x tx_w + frames taken x rx_w / 2)): 1.03 s on the
    # SX1276 for one frame each way in an 1800 s slot (tests/test_mac.py checks it); and
    # within EBYTE's LoRa wake-on-radio cycles (E22/E220 user manuals: 0.5 to 4 s).
    lora_wakeup_interval_s: float = Field(1.0, gt=0)
    # After its receive phase a CAD correlates "a little bit less than a symbol period"
    # (SX1276 datasheet Rev 4, 4.1.6): one symbol, an upper bound.
    lora_cad_processing_symbols: float = Field(1.0, ge=0)
    # ... at the reduced current of the SX1276 datasheet's LoRa CAD consumption table:
    # 5.6 mA at 125 kHz (6.5 mA at 250 kHz, 8 mA at 500 kHz), at the profile's 3.3 V.
    lora_cad_processing_w: float = Field(5.6e-3 * 3.3, ge=0)

    # -- TSCH (IEEE 802.15.4-2015 default timeslot template; RFC 8180) -------------------
    tsch_timeslot_s: float = Field(10e-3, gt=0)  # macTsTimeslotLength
    # RFC 8180 section 4.1: slotframe size "tunable"; its Figure 2 example, 101 slots
    # (below 0.99 % duty cycle), also OpenWSN's default.
    tsch_slotframe_length: int = Field(101, ge=1)
    tsch_rx_wait_s: float = Field(2200e-6, gt=0)  # macTsRxWait: the receiver's window
    tsch_rx_ack_delay_s: float = Field(800e-6, ge=0)  # macTsRxAckDelay: sender opens for ACK
    tsch_tx_ack_delay_s: float = Field(1000e-6, ge=0)  # macTsTxAckDelay: the ACK starts
    tsch_max_tx_s: float = Field(4256e-6, gt=0)  # macTsMaxTx: the longest frame a slot holds
    tsch_max_ack_s: float = Field(2400e-6, gt=0)  # macTsMaxAck
    # CCA before sending: optional in TSCH (macTsCca 128 us); off in Contiki-NG
    # (TSCH_CONF_CCA_ENABLED 0) and not required by RFC 8180.
    tsch_cca: bool = False
    tsch_cca_s: float = Field(128e-6, ge=0)  # macTsCca
    # Mean interval between a node's EBs: RFC 8180 leaves EB_PERIOD tunable; Contiki-NG
    # draws each in [0.75, 1) x TSCH_EB_PERIOD = 16 s (os/net/mac/tsch/tsch.c): 14 s.
    tsch_eb_period_s: float = Field(14.0, gt=0)
    # An EB's IEs (sync, timeslot, channel hopping, slotframe and link): RFC 8180 A.1's
    # bytestream, 30 bytes, on top of the frame's header and FCS.
    tsch_eb_ie_bytes: int = Field(30, ge=0)
    # The Enhanced ACK's ACK/NACK time-correction IE: RFC 8180 A.3, 4 bytes.
    tsch_ack_ie_bytes: int = Field(4, ge=0)
    # Each node's clock error: Contiki-NG's TSCH_KEEPALIVE_TIMEOUT assumes 40 ppm (80
    # between two nodes, os/net/mac/tsch/tsch-conf.h); a 32.768 kHz watch crystal is
    # +-20 ppm at 25 C and falls by 0.035 ppm/C^2 away from it (ACT OJ-series datasheet:
    # another -20 ppm at 25 +- 24 C).
    tsch_drift_ppm: float = Field(40.0, gt=0)
    # None: the drift-limited period (`keepalive_period_s`); a number overrides it.
    tsch_keepalive_s: float | None = Field(None, gt=0)

    # -- TSCH on BLE: connection events (Bluetooth Core Specification, Vol 6 Part B) -------
    # connInterval: 4 s, the longest the specification allows (4.5.1): a link idles for
    # the whole slot between two waves.
    ble_conn_interval_s: float = Field(4.0, ge=7.5e-3, le=4.0)
    # connSlaveLatency: 0. Latency spares only the peripheral (the central transmits at
    # every anchor, 4.5.1), and at 4 s above 2 it would need a supervision timeout over
    # 32 s (4.5.2).
    ble_slave_latency: int = Field(0, ge=0, le=499)
    # Sleep clock accuracy of each side, the ppm its window widening counts: a 32.768 kHz
    # crystal is 40 ppm off at worst (as tsch_drift_ppm), in the SCA class 31-50 ppm, whose
    # bound the link layer uses (as Apache NimBLE's g_ble_sca_ppm_tbl does).
    ble_sca_ppm: float = Field(50.0, gt=0, le=500)

    # -- scheduled wake-up (Glossy sync flood, LWB-style rounds) --------------------------
    # Glossy's N: how often each node sends the flood's frame (IPSN 2011 lets the
    # initiator set it; more copies, more reliability). 2: a modelling choice.
    sched_sync_transmissions: int = Field(2, ge=1)
    # The sync frame's payload beyond the profile's frame overhead: Glossy's header byte
    # and relay counter (2), the slot's time (4) and number (2). A modelling choice.
    sched_sync_payload_bytes: int = Field(8, ge=0)
    # Each crystal's tolerance without compensation: 40 ppm as tsch_drift_ppm (Contiki-
    # NG's assumption; a watch crystal's +-20 ppm at 25 C plus its -0.035 ppm/C^2).
    sched_drift_ppm: float = Field(40.0, ge=0)
    # Drift compensation: a node learns its crystal's offset from the floods' times (as
    # Contiki-NG's TSCH adaptive timesync, os/net/mac/tsch/tsch-adaptive-timesync.c, does
    # from its time source). What a learnt offset leaves is its change between two
    # floods: temperature, on the crystal's parabola 0.035 ppm/C^2 x 2 x (T - 25 C), 0.7
    # ppm per degree at 10 C from the turnover; 2 ppm: a 3-degree change within a slot.
    sched_drift_compensation: bool = False
    sched_compensated_ppm: float = Field(2.0, ge=0)
    # A receiver's mean listening before each message it expects in the wave: TSCH's
    # guard, half of macTsRxWait (2.2 ms, the 802.15.4-2015 default timeslot template).
    sched_rx_window_s: float = Field(1.1e-3, ge=0)
    # Wake for one's own hop of the flood (Glossy's relay counter tells it), not for
    # the flood's start.
    sched_wake_by_relay_counter: bool = True

    @model_validator(mode="after")
    def _ble_connection_valid(self) -> MacParams:
        units = self.ble_conn_interval_s / BLE_INTERVAL_UNIT_S
        if not math.isclose(units, round(units), rel_tol=0, abs_tol=1e-6):
            raise ValueError(f"ble_conn_interval_s ({self.ble_conn_interval_s:g} s) must be "
                             "a multiple of 1.25 ms")
        if self.ble_event_period_s * 2 >= BLE_MAX_SUPERVISION_S:
            raise ValueError(f"(1 + ble_slave_latency) x ble_conn_interval_s x 2 = "
                             f"{self.ble_event_period_s * 2:g} s: the supervision timeout "
                             f"must exceed it and be at most {BLE_MAX_SUPERVISION_S:g} s")
        return self

    @property
    def lpl_wakeup_interval_s(self) -> float:
        return 1.0 / self.lpl_check_rate_hz

    @property
    def lpl_strobe_s(self) -> float:
        """STROBE_TIME: how long a broadcast frame is repeated (CYCLE_TIME + 2 CHECK_TIME)."""
        return self.lpl_wakeup_interval_s + 2 * self.lpl_check_time_s

    @property
    def lpl_lead_s(self) -> float:
        """How long before the receiver's wake-up a unicast strobe starts, on average."""
        if self.lpl_phase_lock:
            return self.lpl_phase_lead_checks * self.lpl_check_time_s
        return self.lpl_wakeup_interval_s / 2  # a uniformly random phase

    @property
    def tsch_guard_s(self) -> float:
        """The receiver's guard time, half its window (TsLongGT = macTsRxWait / 2)."""
        return self.tsch_rx_wait_s / 2

    @property
    def tsch_slotframe_s(self) -> float:
        return self.tsch_slotframe_length * self.tsch_timeslot_s

    @property
    def keepalive_period_s(self) -> float:
        """Keep-alives to the time source: before two clocks `tsch_drift_ppm` off each
        (opposite ways) drift apart by the guard time; 1.1 ms / 80 ppm = 13.75 s."""
        if self.tsch_keepalive_s is not None:
            return self.tsch_keepalive_s
        return self.tsch_guard_s / (2 * self.tsch_drift_ppm * 1e-6)

    @property
    def ble_event_period_s(self) -> float:
        """How often a BLE peripheral listens on an idle link: (1 + latency) intervals."""
        return (1 + self.ble_slave_latency) * self.ble_conn_interval_s

    @property
    def ble_window_widening_s(self) -> float:
        """How early a BLE peripheral opens its receive window: both sides' clock error
        over the time since its last anchor, plus the sleep clock's 16 us of jitter."""
        return 2 * self.ble_sca_ppm * 1e-6 * self.ble_event_period_s + BLE_SLEEP_JITTER_S

    def sched_guard_s(self, sleep_s: float) -> float:
        """How early a node wakes for the sync flood after sleeping `sleep_s`: its
        crystal's and the initiator's drift apart, opposite ways, over the sleep."""
        ppm = self.sched_compensated_ppm if self.sched_drift_compensation \
            else self.sched_drift_ppm
        return 2 * ppm * 1e-6 * sleep_s


class LoraCad(NamedTuple):
    """One LoRa channel activity detection, and the preamble that one always catches."""

    receive_s: float  # receiving: (2^SF + 32) / BW
    processing_s: float  # correlating, at the reduced current
    preamble_symbols: int  # the lengthened preamble, as the sender programs it
    extension_s: float  # what lengthening adds to each frame's air time

    @property
    def duration_s(self) -> float:
        return self.receive_s + self.processing_s


def lora_cad(radio: RadioProfile, params: MacParams | None = None) -> LoraCad:
    """A CAD on `radio` and the long preamble of LPL at `params`' wake-up interval: the
    standard preamble plus enough whole symbols to span a wake-up interval and a CAD."""
    p = params or MacParams()
    receive = (2**radio.spreading_factor + 32) / radio.bandwidth_hz
    processing = p.lora_cad_processing_symbols * radio.symbol_s
    extra = math.ceil((p.lora_wakeup_interval_s + receive + processing) / radio.symbol_s
                      * (1 - 1e-12))  # no spurious symbol from float rounding
    return LoraCad(receive, processing, radio.preamble_symbols + extra,
                   extra * radio.symbol_s)


@dataclass
class _Counts:
    """A party's messages and frames, while a trace is summed."""

    unicasts: int = 0
    broadcasts: int = 0
    frames_sent: int = 0
    broadcast_frames_sent: int = 0
    received: int = 0
    frames_received: int = 0
    broadcasts_received: int = 0
    broadcast_frames_received: int = 0
    broadcast_copies: int = 0
    peers: set[Party] = field(default_factory=set)

    def use(self, tx_s: float, rx_s: float) -> RadioUse:
        return RadioUse(tx_s, rx_s, self.unicasts, self.broadcasts, self.frames_sent,
                        self.received, self.frames_received, self.broadcast_frames_sent,
                        self.broadcasts_received, self.broadcast_frames_received,
                        len(self.peers), self.broadcast_copies)


class SyncFlood(NamedTuple):
    """One party's radio in one Glossy sync flood: seconds in each on-state."""

    tx_s: float
    rx_s: float
    listen_s: float  # the guard, the wait for the flood to reach it, the turnarounds


def sync_flood(radio: RadioProfile, hops: int, sleep_s: float,
               params: MacParams | None = None) -> SyncFlood:
    """The scheduled MAC's sync flood for a party `hops` hops from its initiator, after
    a sleep of `sleep_s` (see the module docstring)."""
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    p = params or MacParams()
    air = radio.frame_airtime(radio.frame_overhead_bytes + p.sched_sync_payload_bytes)
    turn, n = radio.turnaround_s, p.sched_sync_transmissions
    if hops == 0:  # the initiator: it sends first, then takes and sends in turn
        return SyncFlood(n * air, (n - 1) * air, (2 * n - 2) * turn)
    wait = p.sched_guard_s(sleep_s)
    if not p.sched_wake_by_relay_counter:
        wait += (hops - 1) * (air + turn)  # awake from the flood's start
    return SyncFlood(n * air, n * air, wait + (2 * n - 1) * turn)


class _States(NamedTuple):
    """Seconds of one party's radio in each on-state."""

    tx: float
    rx: float
    listen: float
    processing: float = 0.0  # a LoRa CAD's correlation, at its own reduced power


# ------------------------------------------------------------------ radio use
def radio_use(trace: Iterable[Sent], radio: RadioProfile, tx: Mapping[Party, float],
              rx: Mapping[Party, float]) -> dict[Party, RadioUse]:
    """Each party's `RadioUse` from a slot's trace and the medium's seconds of that slot.

    A `Sent`'s `frames` is what went on air: the frames the message was cut into
    (`radio.frame_sizes`), plus, over lossy links, every retry and end-to-end recovery
    (sim/radio/linklayer.py's `frames`; "ok after N retries" says N = retries +
    recoveries, already in it), each broadcast frame once. Each receiver is counted one
    message, of as many frames as the message was cut into (a frame received twice
    because its ACK was lost counts once). A unicast "missed by 1 of 1" is not counted
    at its receiver; a broadcast "missed by k of n" is counted at all n, since the trace
    does not say who missed it (each who did is sent it again as a unicast, counted as
    one more message). A party's links are the parties it sent to or took from (a missed
    unicast's too: the link was there); its broadcast copies, each broadcast's frames
    times its receivers.
    Every party of the trace, and of `tx` and `rx`, gets an entry."""
    counts: dict[Party, _Counts] = defaultdict(_Counts)
    for sent in trace:
        mine = counts[sent.src]
        mine.peers.update(sent.receivers)
        for receiver in sent.receivers:
            counts[receiver].peers.add(sent.src)
        if sent.broadcast:
            mine.broadcasts += 1
            mine.broadcast_frames_sent += sent.frames
            mine.broadcast_copies += sent.frames * len(sent.receivers)
        else:
            mine.unicasts += 1
        mine.frames_sent += sent.frames
        if not sent.broadcast and _MISSED.match(sent.outcome):
            continue  # its receiver took nothing
        frames = len(radio.frame_sizes(sent.size))
        for receiver in sent.receivers:
            theirs = counts[receiver]
            theirs.received += 1
            theirs.frames_received += frames
            if sent.broadcast:
                theirs.broadcasts_received += 1
                theirs.broadcast_frames_received += frames
    return {party: counts[party].use(tx.get(party, 0.0), rx.get(party, 0.0))
            for party in dict.fromkeys([*counts, *tx, *rx])}


def _check_use(use: RadioUse) -> None:
    if min(use) < 0:
        raise ValueError(f"a RadioUse has no negative figures: {use}")
    if use.frames_sent < use.unicasts + use.broadcasts \
            or use.broadcast_frames_sent < use.broadcasts \
            or use.broadcast_frames_sent > use.frames_sent:
        raise ValueError(f"frames sent do not match the messages sent: {use}")
    if use.frames_received < use.received \
            or use.broadcast_frames_received < use.broadcasts_received \
            or use.broadcast_frames_received > use.frames_received \
            or use.broadcasts_received > use.received:
        raise ValueError(f"frames received do not match the messages received: {use}")


def _mean_airtimes(radio: RadioProfile, use: RadioUse) -> tuple[float, float]:
    """Mean airtime of a data frame it sent, and of one it received: its seconds less
    the ACKs' (it ACKs each unicast frame it takes, and takes an ACK for each it sends)."""
    ack = radio.ack_airtime
    sent = max(use.tx_s - use.unicast_frames_received * ack, 0.0)
    taken = max(use.rx_s - use.unicast_frames_sent * ack, 0.0)
    return (sent / use.frames_sent if use.frames_sent else 0.0,
            taken / use.frames_received if use.frames_received else 0.0)


# ------------------------------------------------------------------ which MAC applies
def is_ble(radio: RadioProfile) -> bool:
    """Whether `radio`'s link layer is BLE's, as a profile shows it: no CCA, and every
    packet answered by the peer's (the ACK frame) T_IFS after it, T_IFS before the next."""
    return (radio.modulation == "linear" and not radio.cca_s and radio.ack_frame_bytes > 0
            and math.isclose(radio.turnaround_s, BLE_T_IFS_S)
            and math.isclose(radio.ifs_s, BLE_T_IFS_S))


def unsupported_reason(mac: MacName, radio: RadioProfile,
                       params: MacParams | None = None) -> str | None:
    """Why `mac` does not apply to `radio` (None: it does)."""
    if mac not in MACS:
        return f"unknown MAC {mac!r} (known: {', '.join(MACS)})"
    if mac in ("always-on", "ideal"):
        return None
    if mac == "scheduled":
        if radio.deep_sleep_w is None:
            return (f"scheduled does not apply to radio {radio.name!r}: its profile has no "
                    "deep-sleep figure (deep_sleep_w) to sleep in between slots")
        return None
    p = params or MacParams()
    if radio.modulation == "lora":
        return _lora_reason(mac, radio, p)
    if is_ble(radio):
        return _ble_reason(mac, radio, p)
    lacks = [what for what, absent in (("CCA (cca_s = 0)", not radio.cca_s),
                                       ("ACK frame (ack_frame_bytes = 0)",
                                        not radio.ack_frame_bytes)) if absent]
    missing = " and ".join(f"an {what}" if what[0] == "A" else f"a {what}" for what in lacks)
    if mac == "lpl":
        if not missing:
            return None
        return (f"lpl does not apply to radio {radio.name!r}: ContikiMAC samples the channel "
                "with CCAs and stops a unicast's strobe at its link-layer ACK, and this "
                f"profile lacks {missing}")
    if missing:
        return (f"tsch does not apply to radio {radio.name!r}: TSCH is a mode of the IEEE "
                f"802.15.4 MAC, and this profile lacks 802.15.4's {' and '.join(lacks)}")
    longest = radio.frame_airtime(radio.max_frame_bytes)
    ack = radio.frame_airtime(radio.ack_frame_bytes + p.tsch_ack_ie_bytes)
    if longest > p.tsch_max_tx_s * (1 + 1e-9) or ack > p.tsch_max_ack_s * (1 + 1e-9):
        return (f"tsch does not apply to radio {radio.name!r}: its longest frame "
                f"({longest * 1e3:.3f} ms) or Enhanced ACK ({ack * 1e3:.3f} ms) does not fit "
                f"the timeslot (macTsMaxTx {p.tsch_max_tx_s * 1e3:g} ms, macTsMaxAck "
                f"{p.tsch_max_ack_s * 1e3:g} ms)")
    return None


def _lora_reason(mac: MacName, radio: RadioProfile, p: MacParams) -> str | None:
    if mac == "tsch":
        return (f"tsch does not apply to radio {radio.name!r}: LoRa has no TSCH mode (TSCH is "
                "a mode of the IEEE 802.15.4 MAC, and one LoRa frame lasts longer than a "
                "10 ms timeslot), nor a scheduled link layer between peers of its own "
                "(LoRaWAN's class B ping slots are a gateway's, in a star)")
    symbols = lora_cad(radio, p).preamble_symbols
    if symbols > LORA_MAX_PREAMBLE_SYMBOLS:
        return (f"lpl does not apply to radio {radio.name!r} with a "
                f"{p.lora_wakeup_interval_s:g} s wake-up interval: its preamble would be "
                f"{symbols} symbols, more than the SX1276's {LORA_MAX_PREAMBLE_SYMBOLS}")
    return None


def _ble_reason(mac: MacName, radio: RadioProfile, p: MacParams) -> str | None:
    if mac == "lpl":
        return (f"lpl does not apply to radio {radio.name!r}: BLE has no CCA (cca_s = 0) to "
                "sample the channel with; its advertising bearer is no low-power listening "
                "(BLE mesh asks its nodes to scan with a duty cycle as close to 100 % as "
                "possible, Mesh Profile 1.0, 3.3.1: always-on), and its duty-cycled link "
                "is the connection, priced as tsch")
    limit = p.ble_conn_interval_s / 2 - BLE_T_IFS_S
    if p.ble_window_widening_s >= limit:
        return (f"tsch does not apply to radio {radio.name!r}: a window widening of "
                f"{p.ble_window_widening_s * 1e3:g} ms reaches connInterval / 2 - T_IFS "
                f"({limit * 1e3:g} ms), where the connection is to be dropped (Core "
                "Specification v4.2 Vol 6 Part B 4.5.7)")
    return None


# ------------------------------------------------------------------ energy
def mac_energy(mac: MacName, radio: RadioProfile, use: RadioUse, period_s: float,
               params: MacParams | None = None) -> MacEnergy:
    """Joules of one party's radio over `period_s` seconds in which it did `use`, under
    `mac`; a ValueError if the MAC does not apply to the radio, or the radio would have
    to be on longer than the period. On BLE, tsch means connection events and needs
    `use.links` (and `use.broadcast_copies` for broadcasts), as `radio_use` gives them."""
    if not period_s > 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    _check_use(use)
    params = params or MacParams()
    reason = unsupported_reason(mac, radio, params)
    if reason:
        raise ValueError(reason)
    traffic = use.tx_s + use.rx_s
    if traffic > period_s * (1 + 1e-12):
        raise ValueError(f"{traffic:g} s of traffic does not fit a period of {period_s:g} s")
    if mac == "always-on":
        states = _States(use.tx_s, use.rx_s, max(period_s - traffic, 0.0))
    elif mac == "ideal":
        states = _States(use.tx_s, use.rx_s, 0.0)
    elif mac == "lpl":
        states = (_lora_lpl(radio, use, period_s, params) if radio.modulation == "lora"
                  else _lpl(radio, use, period_s, params))
    elif mac == "scheduled":
        states = _scheduled(radio, use, period_s, params)
        assert radio.deep_sleep_w is not None  # unsupported_reason said so
        return _priced(radio, use, states, period_s, mac, 0.0, radio.deep_sleep_w)
    elif is_ble(radio):
        states = _ble_events(radio, use, period_s, params)
    else:
        states = _tsch(radio, use, period_s, params)
    return _priced(radio, use, states, period_s, mac, params.lora_cad_processing_w)


def _priced(radio: RadioProfile, use: RadioUse, states: _States, period_s: float,
            mac: str, processing_w: float, sleep_w: float | None = None) -> MacEnergy:
    on = states.tx + states.rx + states.listen + states.processing
    if on > period_s * (1 + 1e-9):
        raise ValueError(f"under {mac} the radio would be on {on:g} s of a {period_s:g} s "
                         "period: more traffic than the MAC can carry")
    tx_j, rx_j = states.tx * radio.tx_w, states.rx * radio.rx_w
    listen_j = states.listen * radio.idle_w + states.processing * processing_w
    sleep_j = max(period_s - on, 0.0) * (radio.sleep_w if sleep_w is None else sleep_w)
    overhead_j = tx_j + rx_j + listen_j - (use.tx_s * radio.tx_w + use.rx_s * radio.rx_w)
    return MacEnergy(tx_j, rx_j, listen_j, sleep_j, overhead_j,
                     tx_j + rx_j + listen_j + sleep_j, min(on, period_s))


def _lpl(radio: RadioProfile, use: RadioUse, period_s: float, p: MacParams) -> _States:
    """ContikiMAC's radio-on seconds (see the module docstring)."""
    cca_on = radio.turnaround_s + radio.cca_s  # RX calibration, then RSSI averaging
    gap = p.lpl_inter_copy_s
    sent, taken = _mean_airtimes(radio, use)
    tx, rx = use.tx_s, use.rx_s
    listen = period_s * p.lpl_check_rate_hz * p.lpl_ccas_per_check * cca_on  # checks
    if use.unicasts:
        extra = p.lpl_lead_s / (sent + gap) + 0.5  # copies before the one it takes
        tx += use.unicasts * extra * sent
        listen += use.unicasts * (extra * gap + p.lpl_ccas_before_send * cca_on)
        listen += use.unicast_frames_sent * radio.turnaround_s  # before each ACK comes
    if use.broadcast_frames_sent:
        copies = math.ceil(p.lpl_strobe_s / (sent + gap))
        tx += use.broadcast_frames_sent * (copies - 1) * sent
        listen += use.broadcast_frames_sent * p.lpl_ccas_before_send * cca_on
    # Receiving: a wake-up on each unicast message and on each broadcast frame, then the
    # rest of the copy it heard and the gap; its turn to transmit before each ACK; the
    # inter-frame space before each later frame of a unicast burst.
    wakes = use.unicasts_received + use.broadcast_frames_received
    listen += wakes * (taken / 2 + gap)
    listen += use.unicast_frames_received * radio.turnaround_s
    listen += (use.unicast_frames_received - use.unicasts_received) * radio.ifs_s
    return _States(tx, rx, listen)


def _scheduled(radio: RadioProfile, use: RadioUse, period_s: float,
               p: MacParams) -> _States:
    """The scheduled MAC's radio-on seconds: the sync flood after a slot's sleep, then
    the wave's frames with their windows (see the module docstring)."""
    flood = sync_flood(radio, use.sync_hops, period_s, p)
    turn = radio.turnaround_s if radio.ack_frame_bytes else 0.0  # before each ACK
    cca = radio.turnaround_s + radio.cca_s if radio.cca_s else 0.0  # RX calibration + CCA
    listen = flood.listen_s
    listen += use.frames_sent * cca + use.unicast_frames_sent * turn  # sending
    listen += use.received * p.sched_rx_window_s  # a window before each message taken
    listen += (use.frames_received - use.received) * radio.ifs_s  # its later frames
    listen += use.unicast_frames_received * turn  # before each ACK it sends
    return _States(use.tx_s + flood.tx_s, use.rx_s + flood.rx_s, listen)


def _lora_lpl(radio: RadioProfile, use: RadioUse, period_s: float, p: MacParams) -> _States:
    """CAD preamble sampling's radio-on seconds on LoRa (see the module docstring)."""
    cad = lora_cad(radio, p)
    checks = period_s / p.lora_wakeup_interval_s
    # Every frame it sends carries the long preamble; after the CAD that woke it, a
    # receiver hears the rest of the lengthening, half a wake-up interval on average
    # (the standard preamble's part is in the frame's airtime, in rx_s).
    tx = use.tx_s + use.frames_sent * cad.extension_s
    wait = cad.extension_s - cad.duration_s - p.lora_wakeup_interval_s / 2
    listen = checks * cad.receive_s + use.frames_received * wait
    # A profile with ACKs: the turnaround before each, both awake (none in lora-sf7).
    listen += (use.unicast_frames_sent + use.unicast_frames_received) * radio.turnaround_s
    return _States(tx, use.rx_s, listen, checks * cad.processing_s)


def _tsch(radio: RadioProfile, use: RadioUse, period_s: float, p: MacParams) -> _States:
    """Radio-on seconds of TSCH's timeslots (see the module docstring)."""
    ie = radio.frame_airtime(p.tsch_ack_ie_bytes)  # what an Enhanced ACK adds
    enhanced_ack = radio.frame_airtime(radio.ack_frame_bytes + p.tsch_ack_ie_bytes)
    ack_window = p.tsch_tx_ack_delay_s - p.tsch_rx_ack_delay_s  # listening before the ACK
    cca = p.tsch_cca_s if p.tsch_cca else 0.0
    # The traffic: TxDataRxAck / TxData for each frame sent, RxDataTxAck / RxData for
    # each taken; its frames and immediate ACKs are in tx_s and rx_s already.
    tx = use.tx_s + use.unicast_frames_received * ie
    rx = use.rx_s + use.unicast_frames_sent * ie
    listen = (use.unicast_frames_sent * ack_window + use.frames_sent * cca
              + use.frames_received * p.tsch_guard_s)
    # Its Enhanced Beacons (TxData) and keep-alives (TxDataRxAck) in the shared cell.
    beacons = period_s / p.tsch_eb_period_s
    keepalives = period_s / p.keepalive_period_s
    tx += beacons * radio.frame_airtime(radio.frame_overhead_bytes + p.tsch_eb_ie_bytes)
    tx += keepalives * radio.frame_airtime(radio.frame_overhead_bytes)
    rx += keepalives * enhanced_ack
    listen += beacons * cca + keepalives * (cca + ack_window)
    # RxIdle in every other occurrence of the shared cell.
    idle = max(period_s / p.tsch_slotframe_s - beacons - keepalives, 0.0)
    listen += idle * p.tsch_rx_wait_s
    return _States(tx, rx, listen)


def _ble_events(radio: RadioProfile, use: RadioUse, period_s: float,
                p: MacParams) -> _States:
    """Radio-on seconds of BLE's connection events (see the module docstring)."""
    if (use.frames_sent or use.frames_received) and not use.links:
        raise ValueError("tsch on BLE keeps a connection per peer, and this RadioUse has "
                         f"traffic but no links: {use} (radio_use counts them)")
    if use.broadcast_copies < use.broadcast_frames_sent:
        raise ValueError("tsch on BLE sends a broadcast frame to each receiver on its "
                         "link, and this RadioUse has fewer broadcast_copies than "
                         f"broadcast frames: {use} (radio_use counts them)")
    empty, tifs = radio.ack_airtime, radio.turnaround_s  # the empty PDU; T_IFS
    opened = period_s / p.ble_conn_interval_s  # events a central opens on a link
    heard = period_s / p.ble_event_period_s  # events a peripheral listens to
    # Each end of each link: half a central's events (an empty PDU at every anchor, T_IFS,
    # the reply if the peripheral listens, else as long listening for it) and half a
    # peripheral's (the widening, the empty PDU, T_IFS, its empty reply).
    tx = use.links * (opened + heard) / 2 * empty
    rx = use.links * heard * empty
    listen = use.links * (opened * tifs + (opened - heard) * empty
                          + heard * (p.ble_window_widening_s + tifs)) / 2
    # The traffic, in events of its links: each frame and its reply, a T_IFS after each.
    # A broadcast frame goes to each receiver, each copy answered; a broadcast frame it
    # takes, it answers.
    sent, _ = _mean_airtimes(radio, use)
    tx += (use.tx_s + (use.broadcast_copies - use.broadcast_frames_sent) * sent
           + use.broadcast_frames_received * empty)
    rx += use.rx_s + use.broadcast_copies * empty
    exchanges = use.unicast_frames_sent + use.broadcast_copies + use.frames_received
    listen += exchanges * 2 * tifs
    return _States(tx, rx, listen)


def mac_energies(radio: RadioProfile, use: RadioUse, period_s: float,
                 params: MacParams | None = None) -> dict[MacName, MacEnergy]:
    """`mac_energy` under every MAC that applies to `radio`."""
    return {mac: mac_energy(mac, radio, use, period_s, params) for mac in MACS
            if unsupported_reason(mac, radio, params) is None}
