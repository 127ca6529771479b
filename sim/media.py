"""Media: when a transmission starts and ends, who hears it, and the time each radio
spends transmitting and receiving.

One small model serves both media of the simulator. A transmission must hold a
*channel* for its whole duration: every frame of the message, each frame's
acknowledgement (turnaround and ACK frame) when it has one receiver, and the
inter-frame space after each. A sender may start only when every member of its
channel is free; starting holds them all until it ends. Then:

- **shared radio** (`SharedRadio`): the channel of a broadcast is the sender's one-hop
  neighbourhood, itself included; an acknowledged unicast also holds the receiver's
  neighbourhood, which hears the ACKs. Two transmissions at once therefore never share
  a listener: no node hears two at once (no collision) or receives while it transmits
  (half-duplex). A frame is heard by every neighbour, so a message for several
  neighbours goes out once. This is CSMA with perfect carrier sense over two hops, an
  idealization (no hidden terminals) that fits a loss-free run; losses come with fault
  injection.
- **MQTT star** (`MqttStar`): every party talks to the broker's access point over one
  Wi-Fi channel, which all share: node -> broker, then broker -> each receiver, one
  transmission at a time, as in one Wi-Fi cell.

Access is CSMA-style: before each message a random backoff of 0 .. 2^BE - 1 unit
periods, then a clear-channel assessment (CCA) and the radio's turn from receiving to
transmitting; a busy channel widens the window (up to 2^max_be) and the sender tries
again once the channel frees. A duty-cycle limit (LoRa in EU868) keeps a sender off the
air for T (1/d - 1) after T on air. The backoffs are drawn from one seeded generator,
in event order: the same seed gives the same trace.

Every transmission is one trace record (`Sent`): first bit on air to the last bit of the
last frame, the message's bytes before framing and its frames. The radios' time in
each state is bookkeeping over the same transmissions (`RadioTimes`).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from meshdl.errors import UsageError
from meshdl.messages import EDGE, Kind
from meshdl.sim.clock import EventQueue
from meshdl.sim.linklayer import send_frames
from meshdl.sim.loss import FrameLoss
from meshdl.sim.radio import RadioProfile
from meshdl.topology import Cell, Topology

Party = Cell  # a cell, the edge (-1, -1) or the broker (`BROKER`)
BROKER: Party = (-3, -3)
CHANNEL: Hashable = "channel"  # the star's one channel
Deliver = Callable[[Party, Any], None]  # (receiver, what the transmission carried to it)
MediumName = Literal["shared", "star"]


@dataclass(slots=True)
class Transmission:
    """What one sender puts on air at once: one message, or several messages for
    different neighbours that share one radio broadcast (`broadcast`: no ACKs)."""

    src: Party
    receivers: tuple[Party, ...]
    kind: Kind
    layer: int
    size: int  # bytes of the message (or the union the broadcast carries), unframed
    deliveries: list[tuple[Party, Any]]  # what each receiver gets: a Message, or a test's
    broadcast: bool = False
    ready: float = 0.0  # when its sender's CPU has made it: not on air before
    # A broadcast's: each delivery's own bytes, what a receiver that missed it is sent
    # again (None: `size` each).
    sizes: tuple[int, ...] | None = None


class Airtime(NamedTuple):
    """How one transmission of a given size occupies the channel, from its first bit."""

    frames: int
    on_air: float  # the frames' airtime (TX at the sender, RX at each receiver)
    last_bit: float  # to the last bit of the last frame
    received: float  # to the end of the last frame's ACK (or its last bit): delivered
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


class KindFigures(NamedTuple):
    """What the transmissions of one message kind and layer carried."""

    bytes: int  # before framing
    frames: int


class _Sending(NamedTuple):
    """What a transmission was, for the figures (`Medium._settle`)."""

    src: Party
    receivers: tuple[Party, ...]
    kind: Kind
    layer: int
    size: int
    broadcast: bool


@dataclass
class RadioTimes:
    """Seconds each party's radio spent transmitting and receiving (ACKs included)."""

    tx: dict[Party, float] = field(default_factory=lambda: defaultdict(float))
    rx: dict[Party, float] = field(default_factory=lambda: defaultdict(float))


@dataclass(slots=True)
class _Radio:
    queue: deque[Transmission] = field(default_factory=deque)
    active: bool = False  # the head of its queue is in backoff or deferred
    backoff_exponent: int = 0
    free_at: float = 0.0  # not on air again before: its last hold's end, or duty cycle
    woken_by: Hashable | None = None  # the channel member whose release woke it


class Medium:
    """Radios of every party over channels; `send` queues, `deliver` is called at the
    receivers when the last frame (and its ACK) is through, plus the hop latency.

    A sender that finds its channel busy waits on the member held longest, in that
    member's queue; when the member is released, the first in its queue draws a new
    backoff and tries again (and, failing on another member, passes the turn to the
    next). So a busy channel costs an event per release, not one per waiting sender:
    the star's hundreds of nodes do not poll its one channel."""

    def __init__(self, radio: RadioProfile, queue: EventQueue, seed: int, deliver: Deliver,
                 trace: list[Sent] | None = None, loss: FrameLoss | None = None) -> None:
        self.radio = radio
        # Lossy links (sim/loss.py): frames lost, retried by the link layer, messages
        # recovered end to end, so that every message still arrives (reliable mode).
        self.loss = loss if loss is not None and loss.rate > 0 else None
        self.faults: Counter[str] = Counter()
        self.queue = queue
        self.rng = random.Random(seed)
        self.deliver = deliver
        self.trace = trace
        self._times = RadioTimes()
        # Until when each channel member is held; every member is listed (at 0 first),
        # so that checking a channel is one C-level max over its members.
        self.busy_until: dict[Hashable, float] = {}
        self._transmissions = 0
        self._frames = 0
        self._by_kind: Counter[tuple[Kind, int, str]] = Counter()
        # Transmissions not yet added to the figures above, counted by what they were
        # (a wave repeats the same few thousand): one counter step each on the hot path.
        self._unsettled: Counter[_Sending] = Counter()
        self._radios: dict[Party, _Radio] = {}
        self._channels: dict[Party, tuple[Hashable, ...]] = {}  # each medium fills it
        self._holds: dict[tuple[Party, Party], tuple[Hashable, ...]] = {}  # acked unicasts
        self._airtime: dict[tuple[int, bool], Airtime] = {}
        # The profile's figures read on every transmission, looked up once. After its
        # CCA the radio turns from receiving to transmitting before the first bit.
        self._access = radio.cca_s + (radio.turnaround_s if radio.cca_s else 0.0)
        self._latency = radio.hop_latency_s
        self._waiting: dict[Hashable, deque[Party]] = {}  # senders deferred on a member
        self._trying: set[Hashable] = set()  # members whose first waiter is trying

    def channel_of(self, party: Party) -> tuple[Hashable, ...]:
        """Who must be free for `party` to broadcast (and is held while it does)."""
        return self._channels[party]

    def hold_of(self, tx: Transmission) -> tuple[Hashable, ...]:
        """Who `tx` holds: the sender's channel, and for an acknowledged unicast also the
        receiver's, where its ACKs are heard."""
        if tx.broadcast or not self.radio.ack_frame_bytes:
            return self._channels[tx.src]
        key = (tx.src, tx.receivers[0])
        hold = self._holds.get(key)
        if hold is None:
            members = dict.fromkeys(self._channels[tx.src])
            members.update(dict.fromkeys(self._channels[tx.receivers[0]]))
            hold = self._holds[key] = tuple(members)
        return hold

    # -------------------------------------------------------------- sending
    def send(self, tx: Transmission, ready: float | None = None) -> None:
        """Queue `tx` on its sender's radio; it contends for the air from `ready` (when
        the sender's CPU has made it; default now)."""
        tx.ready = self.queue.now if ready is None else ready
        radio = self._radios.get(tx.src)
        if radio is None:
            radio = self._radios[tx.src] = _Radio()
        radio.queue.append(tx)
        if not radio.active:
            radio.active = True
            self._contend(tx.src, radio)

    def _contend(self, src: Party, radio: _Radio) -> None:
        """The head of `src`'s queue draws its backoff and tries once it is made and the
        radio may send again; if its hold is surely busy then, it waits at once."""
        head = radio.queue[0]
        radio.backoff_exponent = self.radio.min_be
        at = max(head.ready, radio.free_at) + self._backoff(radio)
        busy = self.busy_until
        blocker = max(self.hold_of(head), key=busy.__getitem__)
        if busy[blocker] > at:  # holds only ever end later: it would find it busy
            self._widen(radio)
            self._wait(src, blocker, first=False)
        else:
            self.queue.at(at, self._attempt, src)

    def _backoff(self, radio: _Radio) -> float:
        """A whole number of unit periods, 0 .. 2^BE - 1, drawn uniformly."""
        unit = self.radio.backoff_unit_s
        if unit <= 0:
            return 0.0
        return int(self.rng.random() * (1 << radio.backoff_exponent)) * unit

    def _widen(self, radio: _Radio) -> None:
        radio.backoff_exponent = min(radio.backoff_exponent + 1, self.radio.max_be)

    def _attempt(self, src: Party) -> None:
        now, radio = self.queue.now, self._radios[src]
        woken, radio.woken_by = radio.woken_by, None
        if woken is not None:
            self._trying.discard(woken)
        if now < radio.free_at:  # duty cycle
            self.queue.at(radio.free_at, self._attempt, src)
        else:
            busy, hold = self.busy_until, self.hold_of(radio.queue[0])
            blocker = max(hold, key=busy.__getitem__)
            if busy[blocker] > now:  # defer, with a wider window next time
                self._widen(radio)
                self._wait(src, blocker, first=blocker == woken)
            else:
                self._transmit(src, radio, hold, now)
        if woken is not None:
            self._release(woken)  # its next waiter's turn (now, or when it is free)

    def _wait(self, src: Party, member: Hashable, first: bool) -> None:
        waiting = self._waiting.get(member)
        if waiting is None:
            waiting = self._waiting[member] = deque()
        if first:
            waiting.appendleft(src)
        else:
            waiting.append(src)
        self._release(member)

    def _release(self, member: Hashable) -> None:
        """The first sender waiting on `member` tries again a fresh backoff after the
        member is free (unless one is trying already)."""
        if member in self._trying:
            return
        waiting = self._waiting.get(member)
        busy = self.busy_until
        free = max(busy[member], self.queue.now)
        while waiting:
            src = waiting.popleft()
            if not waiting:  # only members with waiters are listed
                del self._waiting[member]
            radio = self._radios[src]
            # A sender whose hold has another member busy past `free` would surely find
            # it busy then (holds only ever end later): it waits on that one instead.
            blocker = max(self.hold_of(radio.queue[0]), key=busy.__getitem__)
            if busy[blocker] > free:
                self._widen(radio)
                self._wait(src, blocker, first=False)
                waiting = self._waiting.get(member)
                continue
            radio.woken_by = member
            self._trying.add(member)
            self.queue.at(free + self._backoff(radio), self._attempt, src)
            return

    def _transmit(self, src: Party, radio: _Radio, hold: tuple[Hashable, ...],
                  now: float) -> None:
        """The hold is free: the head of `src`'s queue goes on air."""
        if self.loss is not None:
            self._transmit_lossy(src, radio, hold, now)
            return
        busy = self.busy_until
        tx = radio.queue.popleft()
        air = self.airtime(tx.size, acked=not tx.broadcast)
        t0 = now + self._access
        end = t0 + air.channel
        for member in hold:
            busy[member] = end
        self._unsettled[_Sending(src, tx.receivers, tx.kind, tx.layer, tx.size,
                                 tx.broadcast)] += 1
        if self.trace is not None:
            self.trace.append(Sent(t0, t0 + air.last_bit, src, tx.receivers, tx.broadcast,
                                   tx.kind, tx.layer, tx.size, air.frames, "ok"))
        radio.free_at = max(end, t0 + air.on_air + self.radio.off_time_s(air.on_air))
        self.queue.at(t0 + air.received + self._latency, self._arrive, tx)
        self._next(src, radio)

    def _transmit_lossy(self, src: Party, radio: _Radio, hold: tuple[Hashable, ...],
                        now: float) -> None:
        """The head of `src`'s queue over lossy links (sim/linklayer.py): the channel is
        held through every retry; who got the message gets it; whoever did not is sent
        it again end to end, after an ACK timeout, as an acknowledged unicast of its own
        (a missed broadcast becomes one per receiver that missed it)."""
        tx = radio.queue.popleft()
        out = send_frames(self.radio, self.loss, src, tx.receivers, tx.size,
                          acked=not tx.broadcast)
        t0 = now + self._access
        end = t0 + out.hold
        for member in hold:
            self.busy_until[member] = end
        for party, seconds in out.tx.items():
            self._times.tx[party] += seconds
        for party, seconds in out.rx.items():
            self._times.rx[party] += seconds
        self._transmissions += 1
        self._frames += out.frames
        self._by_kind[tx.kind, tx.layer, "bytes"] += tx.size
        self._by_kind[tx.kind, tx.layer, "frames"] += out.frames
        self.faults["frames_lost"] += out.lost
        self.faults["retransmitted"] += out.retries
        self.faults["frames_recovered"] += out.recoveries
        if self.trace is not None:
            outcome = (f"missed by {len(out.missing)} of {len(tx.receivers)}" if out.missing
                       else f"ok after {out.retries + out.recoveries} retries" if out.retries
                       else "ok")
            self.trace.append(Sent(t0, t0 + out.last_bit, src, tx.receivers, tx.broadcast,
                                   tx.kind, tx.layer, tx.size, out.frames, outcome))
        on_air = out.tx.get(src, 0.0)
        radio.free_at = max(end, t0 + on_air + self.radio.off_time_s(on_air))
        got = [d for d in tx.deliveries if d[0] not in out.missing]
        if got:
            self.queue.at(t0 + out.received + self._latency, self._arrive,
                          Transmission(src, tx.receivers, tx.kind, tx.layer, tx.size, got,
                                       tx.broadcast))
        if out.missing:  # recovered end to end: its own message to each who missed it
            ready = end + self.radio.ack_timeout_s
            sizes = tx.sizes or (tx.size,) * len(tx.deliveries)
            for (party, carried), size in reversed(list(zip(tx.deliveries, sizes,
                                                            strict=True))):
                if party in out.missing:
                    self.faults["messages_resent"] += 1
                    radio.queue.appendleft(Transmission(src, (party,), tx.kind, tx.layer,
                                                        size, [(party, carried)],
                                                        ready=ready))
        self._next(src, radio)

    def _next(self, src: Party, radio: _Radio) -> None:
        """The next in `src`'s queue contends once this one is through; else it idles."""
        if radio.queue:
            self._contend(src, radio)
        else:
            radio.active = False

    def _arrive(self, tx: Transmission) -> None:
        deliver = self.deliver
        for party, carried in tx.deliveries:
            deliver(party, carried)

    # -------------------------------------------------------------- figures
    def _settle(self) -> None:
        """Add the transmissions counted since the last call to the figures."""
        sending, receiving = self._times.tx, self._times.rx
        for s, n in self._unsettled.items():
            air = self.airtime(s.size, acked=not s.broadcast)
            sending[s.src] += n * air.on_air
            for receiver in s.receivers:
                receiving[receiver] += n * air.on_air
            if air.acks:
                sending[s.receivers[0]] += n * air.acks
                receiving[s.src] += n * air.acks
            self._transmissions += n
            self._frames += n * air.frames
            self._by_kind[s.kind, s.layer, "bytes"] += n * s.size
            self._by_kind[s.kind, s.layer, "frames"] += n * air.frames
        self._unsettled.clear()

    @property
    def times(self) -> RadioTimes:
        """Seconds each party transmitted and received, so far."""
        self._settle()
        return self._times

    @property
    def transmissions(self) -> int:
        self._settle()
        return self._transmissions

    @property
    def frames(self) -> int:
        self._settle()
        return self._frames

    @property
    def by_kind(self) -> dict[tuple[Kind, int], KindFigures]:
        """What the transmissions of each (kind, layer) carried, so far (a copy)."""
        self._settle()
        keys = dict.fromkeys((kind, layer) for kind, layer, _ in self._by_kind)
        return {(kind, layer): KindFigures(self._by_kind[kind, layer, "bytes"],
                                           self._by_kind[kind, layer, "frames"])
                for kind, layer in keys}

    # -------------------------------------------------------------- physics
    def airtime(self, size: int, acked: bool) -> Airtime:
        """Frames and times of one message of `size` bytes (cached: sizes repeat)."""
        key = (size, acked)
        air = self._airtime.get(key)
        if air is None:
            air = self._airtime[key] = airtime(self.radio, size, acked)
        return air


def airtime(radio: RadioProfile, size: int, acked: bool) -> Airtime:
    """Fragment a message to the radio's frames and time them with the profile's own
    formulas (`RadioProfile.frame_time_s`): each frame's airtime, then, when
    acknowledged, the turnaround and the ACK frame, then the inter-frame space."""
    frames = radio.frame_sizes(size)
    on_air = [radio.frame_airtime(f) for f in frames]
    slots = [radio.frame_time_s(f, acked) for f in frames]
    ack = radio.ack_airtime if acked and radio.ack_frame_bytes else 0.0
    channel = sum(slots)
    space = radio.ifs_after(frames[-1])
    received = channel - space  # the last frame and its ACK are through
    last_bit = received - (radio.turnaround_s + ack if ack else 0.0)
    return Airtime(len(frames), sum(on_air), last_bit, received, channel, ack * len(frames))


class SharedRadio(Medium):
    """One radio per node; a transmission holds the sender's one-hop neighbourhood
    (and, acknowledged, the receiver's)."""

    def __init__(self, neighbours: dict[Party, list[Party]], *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._channels = {party: (party, *around) for party, around in neighbours.items()}
        self.busy_until.update(dict.fromkeys(self._channels, 0.0))


class MqttStar(Medium):
    """Every party on one Wi-Fi channel with the broker's access point."""

    def __init__(self, parties: Iterable[Party], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._channels = dict.fromkeys([*parties, BROKER], (CHANNEL,))
        self.busy_until[CHANNEL] = 0.0


def natural_medium(radio_name: str) -> MediumName:
    """How a radio's nodes are usually connected: Wi-Fi through a broker's access point,
    the low-power radios as a mesh."""
    return "star" if radio_name == "wifi" else "shared"


def medium_for(name: MediumName, topology: Topology, radio: RadioProfile, queue: EventQueue,
               seed: int, deliver: Deliver, trace: list[Sent] | None = None,
               loss: FrameLoss | None = None) -> Medium:
    """The medium of a mesh: its cells and the edge (linked to `edge_at`) as a radio
    mesh, or all of them around the broker."""
    if name == "shared":
        neighbours: dict[Party, list[Party]] = {
            cell: topology.neighbours(cell) for cell in topology.cells()}  # edge_at's: edge
        neighbours[EDGE] = [topology.edge_at]
        return SharedRadio(neighbours, radio, queue, seed, deliver, trace, loss)
    if name == "star":
        return MqttStar([*topology.cells(), EDGE], radio, queue, seed, deliver, trace, loss)
    raise UsageError(f"unknown medium {name!r} (shared or star)")
