"""Media: when a transmission starts and ends, who hears it, and the time each radio
spends transmitting and receiving.

One small model serves both media of the simulator. A transmission must hold a
*channel* for its whole duration: every frame of the message, each frame's
acknowledgement (turnaround and ACK frame) when it has one receiver, and the
inter-frame space after each. A sender may start only when every party of its channel
is free; starting occupies them all until it ends. Then:

- **shared radio** (`SharedRadio`): a party's channel is its one-hop neighbourhood, itself
  included. Two transmissions at once therefore have disjoint neighbourhoods: no node
  ever hears two at once (no collision) or receives while it transmits (half-duplex).
  A frame is heard by every neighbour, so a message for several neighbours goes out
  once. This is CSMA with perfect carrier sense over two hops, an idealization (no
  hidden terminals) that fits a loss-free run; losses come with fault injection.
- **MQTT star** (`MqttStar`): every node talks to the broker's access point over one
  Wi-Fi channel, which all parties share: node -> broker, then broker -> each receiver,
  one transmission at a time, as in one Wi-Fi cell.

Access is CSMA-style deferral: before each message a random backoff of
0 .. 2^BE - 1 unit periods, then a clear-channel assessment (CCA); a busy channel
doubles the window (up to 2^max_be) and the sender tries again after the channel frees.
A duty-cycle limit (LoRa in EU868) keeps a sender off the air for T * (1/d - 1) after
T on air. The backoffs are drawn from one seeded generator, in event order: the same
seed gives the same trace.

Every transmission is one trace record (`Sent`): first bit on air to the last bit of the
last frame, the message's bytes before framing and its frames. Energy is bookkeeping
over the same intervals (`RadioTimes`), so the trace is the one source of truth.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from meshdl.messages import Message
from meshdl.sim.clock import EventQueue
from meshdl.sim.radio import RadioProfile
from meshdl.topology import Cell

Party = Cell  # a cell, the edge (-1, -1) or the broker (`BROKER`)
BROKER: Party = (-3, -3)
CHANNEL: Hashable = "channel"  # the star's one channel


@dataclass(slots=True)
class Transmission:
    """What one sender puts on air at once: one message, or several messages for
    different neighbours that share one radio broadcast (`broadcast`: no ACKs)."""

    src: Party
    receivers: tuple[Party, ...]
    kind: int
    layer: int
    size: int  # bytes of the message (or the union the broadcast carries), unframed
    deliveries: list[tuple[Party, Message]]
    broadcast: bool = False


class Airtime(NamedTuple):
    """How one transmission of a given size occupies the channel."""

    frames: int
    on_air: float  # the frames' airtime (TX at the sender, RX at each receiver)
    last_bit: float  # first bit of the first frame to last bit of the last
    channel: float  # the whole hold: frames, ACKs with turnarounds, inter-frame spaces
    acks: float  # the ACK frames' airtime (TX at the receiver, RX at the sender)


class Sent(NamedTuple):
    """One line of trace.jsonl."""

    t0: float
    t1: float
    src: Party
    receivers: tuple[Party, ...]
    broadcast: bool
    kind: int
    layer: int
    size: int
    frames: int
    outcome: str


@dataclass
class RadioTimes:
    """Seconds each party's radio spent transmitting and receiving (ACKs included)."""

    tx: dict[Party, float] = field(default_factory=dict)
    rx: dict[Party, float] = field(default_factory=dict)

    def add(self, times: dict[Party, float], party: Party, seconds: float) -> None:
        times[party] = times.get(party, 0.0) + seconds


@dataclass(slots=True)
class _Radio:
    queue: deque[Transmission] = field(default_factory=deque)
    active: bool = False  # a transmission queued, in backoff or on air
    backoff_exponent: int = 0
    free_at: float = 0.0  # duty cycle: not on air before


class Medium:
    """Radios of every party over channels; `send` queues, `deliver` is called at the
    receiver when the last frame (and its ACK) is through."""

    def __init__(self, radio: RadioProfile, queue: EventQueue, seed: int,
                 deliver: Callable[[Party, Message], None],
                 trace: list[Sent] | None = None) -> None:
        self.radio = radio
        self.queue = queue
        self.rng = random.Random(seed)
        self.deliver = deliver
        self.trace = trace
        self.times = RadioTimes()
        self.busy_until: dict[Hashable, float] = {}
        self.transmissions = 0
        self.frames = 0
        self.by_kind: dict[tuple[int, int], list[int]] = {}  # (kind, layer): bytes, frames
        self._radios: dict[Party, _Radio] = {}
        self._airtime: dict[tuple[int, bool], Airtime] = {}

    def channel_of(self, party: Party) -> Iterable[Hashable]:
        """Who must be free for `party` to transmit (and is held while it does)."""
        raise NotImplementedError

    # -------------------------------------------------------------- sending
    def send(self, tx: Transmission) -> None:
        radio = self._radios.get(tx.src)
        if radio is None:
            radio = self._radios[tx.src] = _Radio()
        radio.queue.append(tx)
        if not radio.active:
            radio.active = True
            self._contend(tx.src, radio, self.queue.now)

    def _contend(self, src: Party, radio: _Radio, after: float) -> None:
        radio.backoff_exponent = self.radio.min_be
        self.queue.at(max(after, radio.free_at) + self._backoff(radio), self._attempt, src)

    def _backoff(self, radio: _Radio) -> float:
        unit = self.radio.backoff_unit_s
        if unit <= 0:
            return 0.0
        return self.rng.randrange(1 << radio.backoff_exponent) * unit

    def _attempt(self, src: Party) -> None:
        now, radio = self.queue.now, self._radios[src]
        if now < radio.free_at:  # duty cycle
            self.queue.at(radio.free_at, self._attempt, src)
            return
        busy, channel = self.busy_until, self.channel_of(src)
        latest = max(busy.get(party, 0.0) for party in channel)
        if latest > now:  # defer, with a wider window
            radio.backoff_exponent = min(radio.backoff_exponent + 1, self.radio.max_be)
            self.queue.at(latest + self._backoff(radio), self._attempt, src)
            return
        tx = radio.queue.popleft()
        air = self.airtime(tx.size, acked=not tx.broadcast)
        t0 = now + self.radio.cca_s
        end = t0 + air.channel
        for party in channel:
            busy[party] = end
        times = self.times
        times.add(times.tx, src, air.on_air)
        for receiver in tx.receivers:
            times.add(times.rx, receiver, air.on_air)
        if air.acks:
            times.add(times.tx, tx.receivers[0], air.acks)
            times.add(times.rx, src, air.acks)
        self.transmissions += 1
        self.frames += air.frames
        counts = self.by_kind.get((tx.kind, tx.layer))
        if counts is None:
            counts = self.by_kind[tx.kind, tx.layer] = [0, 0]
        counts[0] += tx.size
        counts[1] += air.frames
        if self.trace is not None:
            self.trace.append(Sent(t0, t0 + air.last_bit, src, tx.receivers, tx.broadcast,
                                   tx.kind, tx.layer, tx.size, air.frames, "ok"))
        radio.free_at = t0 + self.radio.off_time_s(air.on_air) + air.on_air
        self.queue.at(end, self._finished, tx)

    def _finished(self, tx: Transmission) -> None:
        now = self.queue.now
        at = now + self.radio.hop_latency_s
        for party, message in tx.deliveries:
            self.queue.at(at, self._arrive, (party, message))
        radio = self._radios[tx.src]
        if radio.queue:
            self._contend(tx.src, radio, now)
        else:
            radio.active = False

    def _arrive(self, delivery: tuple[Party, Message]) -> None:
        self.deliver(*delivery)

    # -------------------------------------------------------------- physics
    def airtime(self, size: int, acked: bool) -> Airtime:
        """Frames and times of one message of `size` bytes (cached: sizes repeat)."""
        key = (size, acked)
        air = self._airtime.get(key)
        if air is None:
            air = self._airtime[key] = airtime(self.radio, size, acked)
        return air


def airtime(radio: RadioProfile, size: int, acked: bool) -> Airtime:
    """Fragment a message to the radio's frames and time them: each frame's airtime,
    then, when acknowledged, the turnaround and the ACK frame, then the inter-frame
    space (`RadioProfile.frame_time_s`)."""
    frames = radio.frame_sizes(size)
    on_air = [radio.frame_airtime(f) for f in frames]
    slots = [radio.frame_time_s(f, acked) for f in frames]
    ack = radio.ack_airtime if acked and radio.ack_frame_bytes else 0.0
    channel = sum(slots)
    last_bit = channel - (slots[-1] - on_air[-1])  # the last frame's ACK and space follow
    return Airtime(len(frames), sum(on_air), last_bit, channel, ack * len(frames))


class SharedRadio(Medium):
    """One radio per node; a transmission holds the sender's one-hop neighbourhood."""

    def __init__(self, neighbours: dict[Party, list[Party]], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._channels = {party: (party, *around) for party, around in neighbours.items()}

    def channel_of(self, party: Party) -> tuple[Party, ...]:
        return self._channels[party]


class MqttStar(Medium):
    """Every party on one Wi-Fi channel with the broker's access point."""

    _ONE = (CHANNEL,)

    def channel_of(self, party: Party) -> tuple[Hashable, ...]:
        return self._ONE
