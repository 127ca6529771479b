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
transmitting. A sender that finds a member of its hold on air widens its window (up to
2^max_be) and senses again a fresh backoff after the transmissions in its way end:
whoever then finds the channel free takes it, so no turn is reserved and a neighbour
that comes during the backoff goes first, as in CSMA. On the star's one channel a busy
sender takes its turn instead, a backoff after the holder's end (first come, first
served: exact for one channel, and hundreds of waiting nodes do not sense it again and
again). A duty-cycle limit (LoRa in EU868) keeps a sender off the air for T (1/d - 1)
after T on air. The backoffs are drawn from one seeded generator, in event order: the
same seed gives the same trace.

On an `AirQueue` (sim/radio/air.py) a loss-free medium hands every transmission to the queue,
which runs this same contention compiled, event for event, through the medium's small
public face for a compiled backend (`Medium.contention`, `hold_of`, `slot_of`,
`count_sent`); lossy links, nodes that go down and per-radio backoff streams need this
module's Python path (`_python_only`).

Every transmission is one trace record (`Sent`): first bit on air to the last bit of the
last frame, the message's bytes before framing and its frames. The radios' time in
each state is bookkeeping over the same transmissions (`RadioTimes`).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from meshdl.errors import UsageError
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.topology import Topology
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.clock import Clock
from meshdl.sim.radio.linklayer import MAX_RECOVERIES, send_frames
from meshdl.sim.radio.loss import NO_LOSS, DownLinks, FrameLoss
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party, Sent
from meshdl.sim.radio.transmission import Contention, Sending, Slot, Transmission

BROKER: Party = (-3, -3)
CHANNEL: Hashable = "channel"  # the star's one channel
Deliver = Callable[[Party, Any], None]  # (receiver, what the transmission carried to it)
MediumName = Literal["shared", "star"]


class Airtime(NamedTuple):
    """How one transmission of a given size occupies the channel, from its first bit."""

    frames: int
    on_air: float  # the frames' airtime (TX at the sender, RX at each receiver)
    last_bit: float  # to the last bit of the last frame
    received: float  # to the end of the last frame's ACK (or its last bit): delivered
    channel: float  # the whole hold: frames, ACKs with turnarounds, inter-frame spaces
    acks: float  # the ACK frames' airtime (TX at the receiver, RX at the sender)


class KindFigures(NamedTuple):
    """What the transmissions of one message kind and layer carried."""

    bytes: int  # before framing
    frames: int


@dataclass
class RadioTimes:
    """Seconds each party's radio spent transmitting and receiving (ACKs included)."""

    tx: dict[Party, float] = field(default_factory=lambda: defaultdict(float))
    rx: dict[Party, float] = field(default_factory=lambda: defaultdict(float))


class Tally:
    """What the transmissions of one account took: each party's radio time, the
    transmissions, their frames and bytes by message kind. The timed mesh keeps one
    account per kind of wave (training, evaluation), so that a wave's figures need no
    before-and-after copies of the totals.

    A loss-free transmission is only counted on the hot path, by what it was (a wave
    repeats the same few thousand); the figures are worked out when asked for."""

    def __init__(self, airtime: Callable[[int, bool], Airtime] | None = None,
                 pending: Callable[[], None] | None = None) -> None:
        self._airtime = airtime  # the medium's (None: an account with nothing in it)
        self._pending = pending  # brings in what was counted elsewhere (sim/radio/air.py)
        self._times = RadioTimes()
        self._transmissions = 0
        self._frames = 0
        self._by_kind: Counter[tuple[Kind, int, str]] = Counter()
        self.unsettled: Counter[Sending] = Counter()

    def add(self, src: Party, kind: Kind, layer: int, size: int, frames: int,
            tx: dict[Party, float], rx: dict[Party, float]) -> None:
        """One transmission whose figures are known already (a lossy one)."""
        for party, seconds in tx.items():
            self._times.tx[party] += seconds
        for party, seconds in rx.items():
            self._times.rx[party] += seconds
        self._transmissions += 1
        self._frames += frames
        self._by_kind[kind, layer, "bytes"] += size
        self._by_kind[kind, layer, "frames"] += frames

    def _settle(self) -> None:
        """Add the transmissions counted since the last call to the figures."""
        if self._pending is not None:
            self._pending()
        sending, receiving = self._times.tx, self._times.rx
        for (src, receivers, kind, layer, size, broadcast), n in self.unsettled.items():
            assert self._airtime is not None
            air = self._airtime(size, not broadcast)
            sending[src] += n * air.on_air
            for receiver in receivers:
                receiving[receiver] += n * air.on_air
            if air.acks:
                sending[receivers[0]] += n * air.acks
                receiving[src] += n * air.acks
            self._transmissions += n
            self._frames += n * air.frames
            self._by_kind[kind, layer, "bytes"] += n * size
            self._by_kind[kind, layer, "frames"] += n * air.frames
        self.unsettled.clear()

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


@dataclass(slots=True)
class _Radio:
    queue: deque[Transmission] = field(default_factory=deque)
    active: bool = False  # the head of its queue is in backoff or deferred
    backoff_exponent: int = 0
    free_at: float = 0.0  # not on air again before: its last hold's end, or duty cycle
    rng: Any = None  # where it draws its backoffs (`Medium.backoff_stream`)


class Medium:
    """Radios of every party over channels; `send` queues, `deliver` is called at the
    receivers when the last frame (and its ACK) is through, plus the hop latency.

    A transmission is two events, its CCA and its arrival (none if every receiver
    missed it), plus one for each time its sender finds its hold busy on the radio mesh
    (on the star it takes its turn at once)."""

    def __init__(self, radio: RadioProfile, queue: Clock, seed: int, deliver: Deliver,
                 trace: list[Sent] | None = None, loss: FrameLoss | None = None) -> None:
        self.radio = radio
        # Loss-free contention compiled (sim/radio/air.py), when the queue can run it.
        self._air: AirQueue | None = None
        # Lossy links (sim/radio/loss.py): frames lost, retried by the link layer, messages
        # recovered end to end, so that every message still arrives (reliable mode), or
        # until it expires (`Transmission.expires`, best-effort mode).
        self._loss = loss if loss is not None and loss.rate > 0 else None
        # Parties whose node is down: every frame to them is lost (no ACK comes back),
        # so their senders retry, as the link layer would (`silence`).
        self.down: set[Party] = set()
        self.faults: Counter[str] = Counter()
        self.queue = queue
        # Where each radio draws its backoffs (`_Radio.rng`): one stream for all, in the
        # order the draws come (`pair_backoffs` gives each its own); a test may put its
        # own generator here.
        self.seed = seed
        self._rng = random.Random(seed)
        self._backoff_stream: Callable[[Party], Any] = lambda _party: self._rng
        self.deliver = deliver
        self.trace = trace
        # Until when each channel member is held, by the member's number: checking a
        # hold is one C-level max over a tuple of small ints (cells' tuples would be
        # hashed again on every look-up).
        self._busy: list[float] = []
        self._number: dict[Hashable, int] = {}
        self._hold_numbers: dict[Hashable, tuple[int, ...]] = {}  # by `hold_of`'s key
        self.takes_turns = False  # a busy channel: sense again later, or queue for it
        # The figures, per account (`account`); transmissions count into the current one.
        self.tallies: dict[Hashable, Tally] = {}
        self._tally = self._unsettled = None  # type: ignore[assignment]
        self.account(None)
        self._radios: dict[Party, _Radio] = {}
        self._channels: dict[Party, tuple[Hashable, ...]] = {}  # each medium fills it
        self._airtime: dict[tuple[int, bool], Airtime] = {}
        self._slots: dict[tuple[int, bool], Slot] = {}  # by (size, broadcast)
        # The profile's figures read on every transmission, looked up once. After its
        # CCA the radio turns from receiving to transmitting before the first bit.
        self._access = radio.cca_s + (radio.turnaround_s if radio.cca_s else 0.0)
        self._unit = max(radio.backoff_unit_s, 0.0)
        self._min_be, self._max_be = radio.min_be, radio.max_be
        self._at = queue.at  # bound once: the hot path
        self._acks = bool(radio.ack_frame_bytes)
        self._latency = radio.hop_latency_s

    def _members(self, members: Iterable[Hashable]) -> None:
        """Number the channel members, each free from the start; then, on an `AirQueue`
        and without lossy links, hand the contention over to it."""
        self._number = {member: number for number, member in enumerate(members)}
        self._busy = [0.0] * len(self._number)
        if isinstance(self.queue, AirQueue) and self.loss is None:
            self.queue.attach(self)
            self._air = self.queue

    # ------------------------------------------------- for a compiled backend
    # What sim/radio/air.py runs of this medium, and all it reads of it: the settings of
    # its contention (`contention`), each kind of transmission's hold and slot, worked
    # out here once per kind (`hold_of`, `slot_of`), and, handed back, how many
    # loss-free transmissions of each kind it made (`count_sent`), its trace records
    # (`trace`) and its arrivals (`deliver`).
    def contention(self) -> Contention:
        """The loss-free contention's settings, as this medium runs it."""
        return Contention(list(self._channels), len(self._number), self.rng.random,
                          self._access, self._unit, self._min_be, self._max_be,
                          self.takes_turns, self.trace is not None)

    def count_sent(self, counts: Iterable[tuple[Sending, int]]) -> None:
        """Loss-free transmissions made elsewhere, counted into the current account
        (their figures are worked out when asked for, as for this medium's own)."""
        unsettled = self._unsettled
        for sending, n in counts:
            unsettled[sending] += n

    @property
    def rng(self) -> Any:
        """The one stream of backoffs (a `random.Random`, or a test's generator)."""
        return self._rng

    @rng.setter
    def rng(self, rng: Any) -> None:
        self._python_only("another backoff generator")
        self._rng = rng

    @property
    def backoff_stream(self) -> Callable[[Party], Any]:
        """Where each radio draws its backoffs: the one stream by default."""
        return self._backoff_stream

    @backoff_stream.setter
    def backoff_stream(self, stream: Callable[[Party], Any]) -> None:
        self._python_only("a backoff stream per radio")
        self._backoff_stream = stream

    @property
    def loss(self) -> FrameLoss | None:
        return self._loss

    @loss.setter
    def loss(self, loss: FrameLoss | None) -> None:
        if loss is not None and loss.rate > 0:
            self._python_only("lossy links")
        self._loss = loss if loss is not None and loss.rate > 0 else None

    def _python_only(self, what: str) -> None:
        if self._air is not None:
            raise UsageError(f"{what} needs the Python medium: run the mesh on a plain "
                             "EventQueue (TimedMesh(compiled=False))")

    def hold_of(self, tx: Transmission) -> tuple[int, ...]:
        """The numbers of the members `tx` holds: the sender's channel, and for an
        acknowledged unicast also the receiver's, where its ACKs are heard (worked out
        once per sender and receiver, and kept with `tx` for its further attempts)."""
        acked = not tx.broadcast and self._acks
        key = (tx.src, tx.receivers[0]) if acked else tx.src
        hold = self._hold_numbers.get(key)
        if hold is None:
            members = dict.fromkeys(self._channels[tx.src])
            if acked:
                members.update(dict.fromkeys(self._channels[tx.receivers[0]]))
            hold = self._hold_numbers[key] = tuple(self._number[m] for m in members)
        tx.hold = hold
        return hold

    # -------------------------------------------------------------- sending
    def send(self, tx: Transmission, ready: float | None = None) -> None:
        """Queue `tx` on its sender's radio; it contends for the air from `ready` (when
        the sender's CPU has made it; default now)."""
        tx.ready = self.queue.now if ready is None else ready
        if self._air is not None:
            if self.down:
                self._python_only("a node that is down")
            self._air.send(tx)
            return
        radio = self._radios.get(tx.src)
        if radio is None:
            radio = self._radios[tx.src] = _Radio(rng=self.backoff_stream(tx.src))
        radio.queue.append(tx)
        if not radio.active:
            radio.active = True
            self._contend(radio)

    def pair_backoffs(self) -> None:
        """Give each radio its own stream of backoffs, seeded by the run's seed and the
        party (common random numbers): two runs that differ only in some messages'
        sizes (two compression plans) then draw the same backoffs at the same radios,
        so comparing them measures the sizes rather than a reshuffled stream. Before
        the first transmission."""
        seed = self.seed
        self.backoff_stream = lambda party: random.Random(f"{seed}:{party}")

    def silence(self, party: Party) -> None:
        """`party`'s node is down: what it had queued never goes on air (what is on air
        now ends), and frames to it are lost from now on (`down`)."""
        self._python_only("a node going down")
        self.down.add(party)
        radio = self._radios.get(party)
        if radio is not None:
            radio.queue.clear()

    def _contend(self, radio: _Radio) -> None:
        """The head of the radio's queue draws its backoff, a whole number of unit periods
        0 .. 2^BE - 1, and assesses the channel after it, once it is made and the radio
        may send again."""
        radio.backoff_exponent = exponent = self._min_be
        backoff = int(radio.rng.random() * (1 << exponent)) * self._unit if self._unit else 0.0
        self._at(max(radio.queue[0].ready, radio.free_at) + backoff, self._attempt, radio)

    def _attempt(self, radio: _Radio) -> None:
        """The CCA: the head of the radio's queue goes on air now if no member of its
        hold is on air. Else, with a fresh backoff from a wider window after the
        transmissions in its way, it senses again (a radio mesh) or takes its turn (the
        star's one channel: first come, first served). Then the next in the queue
        contends, or the radio idles."""
        if not radio.queue:  # its node went down while it waited
            radio.active = False
            return
        now, busy, tx = self.queue.now, self._busy, radio.queue[0]
        src, hold = tx.src, tx.hold or self.hold_of(tx)
        free = max(map(busy.__getitem__, hold))
        if free > now:
            exponent = radio.backoff_exponent
            if exponent < self._max_be:
                radio.backoff_exponent = exponent = exponent + 1
            backoff = int(radio.rng.random() * (1 << exponent)) * self._unit \
                if self._unit else 0.0
            if not self.takes_turns:
                self._at(free + backoff, self._attempt, radio)
                return
            now = free + backoff
        radio.queue.popleft()
        if self._loss is not None or (self.down and not self.down.isdisjoint(tx.receivers)):
            self._transmit_lossy(src, radio, tx, hold, now)
        else:  # loss-free: the hot path, its figures worked out later (`Tally`)
            slot = self.slot_of(tx.size, tx.broadcast)
            t0 = now + self._access
            end = t0 + slot.channel
            for member in hold:
                busy[member] = end
            self._unsettled[src, tx.receivers, tx.kind, tx.layer, tx.size,
                            tx.broadcast] += 1
            if self.trace is not None:
                self.trace.append(Sent(t0, t0 + slot.last_bit, src, tx.receivers,
                                       tx.broadcast, tx.kind, tx.layer, tx.size,
                                       slot.frames, "ok"))
            radio.free_at = t0 + slot.radio_free
            self._at(t0 + slot.delivered, self._arrive, tx)
        if radio.queue:
            self._contend(radio)
        else:
            radio.active = False

    def _transmit_lossy(self, src: Party, radio: _Radio, tx: Transmission,
                        hold: tuple[int, ...], now: float) -> None:
        """`tx` over lossy links (sim/radio/linklayer.py): the channel is held through every
        retry; who got the message gets it; whoever did not is sent it again end to
        end, after an ACK timeout, as an acknowledged unicast of its own (a missed
        broadcast becomes one per receiver that missed it)."""
        t0 = now + self._access
        budget = math.inf if tx.expires is None else tx.expires - t0
        if budget <= 0.0:  # best effort: nobody waits for it any more
            self.faults["messages_expired"] += len(tx.receivers)
            radio.free_at = max(radio.free_at, now)  # the next contends from now
            return
        links = self.loss or NO_LOSS
        if self.down:
            links = DownLinks(links, self.down)
        out = send_frames(self.radio, links, src, tx.receivers, tx.size,
                          acked=not tx.broadcast, budget=budget,
                          rounds=MAX_RECOVERIES if tx.rounds is None else tx.rounds)
        end = t0 + out.hold
        for member in hold:
            self._busy[member] = end
        self._tally.add(src, tx.kind, tx.layer, tx.size, out.frames, out.tx, out.rx)
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
        ready = end + self.radio.ack_timeout_s
        if out.missing and (not tx.broadcast or
                            (tx.expires is not None and ready > tx.expires)):
            self.faults["messages_lost"] += len(out.missing)  # expired: lost for good
        elif out.missing:  # again to each who missed it, as a unicast of its own
            sizes = tx.sizes or (tx.size,) * len(tx.deliveries)
            for (party, carried), size in reversed(list(zip(tx.deliveries, sizes,
                                                            strict=True))):
                if party in out.missing:
                    self.faults["messages_resent"] += 1
                    radio.queue.appendleft(Transmission(src, (party,), tx.kind, tx.layer,
                                                        size, [(party, carried)],
                                                        ready=ready, expires=tx.expires,
                                                        rounds=tx.rounds))

    def _arrive(self, tx: Transmission) -> None:
        deliver = self.deliver
        for party, carried in tx.deliveries:
            deliver(party, carried)

    # -------------------------------------------------------------- figures
    def _settle_air(self) -> None:
        if self._air is not None:
            self._air.settle()

    def account(self, key: Hashable) -> Tally:
        """Count what follows into the account `key` (made when first named)."""
        if self._air is not None:
            self._air.settle()  # what it counted belongs to the account before
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally(self.airtime, self._settle_air)
        self._tally, self._unsettled = tally, tally.unsettled
        return tally

    @property
    def times(self) -> RadioTimes:
        """Seconds each party transmitted and received, so far, over every account."""
        total = RadioTimes()
        for tally in self.tallies.values():
            for mine, theirs in ((total.tx, tally.times.tx), (total.rx, tally.times.rx)):
                for party, seconds in theirs.items():
                    mine[party] += seconds
        return total

    @property
    def transmissions(self) -> int:
        return sum(tally.transmissions for tally in self.tallies.values())

    @property
    def frames(self) -> int:
        return sum(tally.frames for tally in self.tallies.values())

    @property
    def by_kind(self) -> dict[tuple[Kind, int], KindFigures]:
        """What the transmissions of each (kind, layer) carried, so far, over every
        account."""
        total: dict[tuple[Kind, int], KindFigures] = {}
        for tally in self.tallies.values():
            for key, (size, frames) in tally.by_kind.items():
                old = total.get(key, KindFigures(0, 0))
                total[key] = KindFigures(old.bytes + size, old.frames + frames)
        return total

    # -------------------------------------------------------------- physics
    def airtime(self, size: int, acked: bool) -> Airtime:
        """Frames and times of one message of `size` bytes (cached: sizes repeat)."""
        key = (size, acked)
        air = self._airtime.get(key)
        if air is None:
            air = self._airtime[key] = airtime(self.radio, size, acked)
        return air

    def slot_of(self, size: int, broadcast: bool) -> Slot:
        """The loss-free slot of a transmission of `size` bytes (cached)."""
        key = (size, broadcast)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = self._slot(size, acked=not broadcast)
        return slot

    def _slot(self, size: int, acked: bool) -> Slot:
        air = self.airtime(size, acked)
        radio_free = max(air.channel, air.on_air + self.radio.off_time_s(air.on_air))
        return Slot(air.channel, air.last_bit, air.received + self._latency, radio_free,
                     air.frames)


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
        self._members(self._channels)


class MqttStar(Medium):
    """Every party on one Wi-Fi channel with the broker's access point."""

    def __init__(self, parties: Iterable[Party], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._channels = dict.fromkeys([*parties, BROKER], (CHANNEL,))
        # One channel: a sender that finds it busy queues for it (its turn comes a
        # backoff after the holder's end), which is exact first-come-first-served for
        # one channel and keeps hundreds of waiting nodes from sensing it over and over.
        self.takes_turns = True
        self._members([CHANNEL])


def natural_medium(radio_name: str) -> MediumName:
    """How a radio's nodes are usually connected: Wi-Fi through a broker's access point,
    the low-power radios as a mesh."""
    return "star" if radio_name == "wifi" else "shared"


def medium_for(name: MediumName, topology: Topology, radio: RadioProfile, queue: Clock,
               seed: int, deliver: Deliver, trace: list[Sent] | None = None,
               loss: FrameLoss | None = None,
               edge_links: Iterable[Party] = ()) -> Medium:
    """The medium of a mesh: its cells and the edge (linked to `edge_at`, and to the
    `edge_links` it may attach to instead) as a radio mesh, or all of them around the
    broker."""
    if name == "shared":
        neighbours: dict[Party, list[Party]] = {
            cell: topology.neighbours(cell) for cell in topology.cells()}  # edge_at's: edge
        neighbours[EDGE] = list(dict.fromkeys([topology.edge_at, *edge_links]))
        for cell in neighbours[EDGE]:
            if EDGE not in neighbours[cell]:
                neighbours[cell] = [*neighbours[cell], EDGE]
        return SharedRadio(neighbours, radio, queue, seed, deliver, trace, loss)
    if name == "star":
        return MqttStar([*topology.cells(), EDGE], radio, queue, seed, deliver, trace, loss)
    raise UsageError(f"unknown medium {name!r} (shared or star)")
