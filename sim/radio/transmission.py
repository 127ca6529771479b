"""What a medium and its compiled backend (sim/radio/air.py) share: a transmission, its
key for the figures, a loss-free slot's times, the contention's settings, and the face
of a medium that the backend reads (`AirMedium`). Here rather than in media.py, which
runs the backend: the backend names them without importing the medium that imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from meshdl.protocol.messages import Kind
from meshdl.sim.radio.trace import Party, Sent


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
    hold: tuple[int, ...] = ()  # the numbers of the members it holds (`Medium.hold_of`)
    # Best effort: when its receivers stop waiting for it (None: they wait until it
    # comes); its lost frames are not taken up again after; and how often a lost frame
    # is taken up again at most (None: until it arrives).
    expires: float | None = None
    rounds: int | None = None



# What a loss-free transmission was, for the figures (`Tally`): (src, receivers, kind,
# layer, size, broadcast). A plain tuple: one is made on every transmission.
Sending = tuple[Party, tuple[Party, ...], Kind, int, int, bool]


class Slot(NamedTuple):
    """A loss-free transmission of one size, from its first bit (`Medium.slot_of`)."""

    channel: float  # held
    last_bit: float
    delivered: float  # received, plus the hop latency
    radio_free: float  # the sender may go on air again (channel, or duty cycle)
    frames: int


class Contention(NamedTuple):
    """A loss-free medium's contention, for a backend that runs it elsewhere
    (`Medium.contention`): every radio, numbered in the order of `parties`; channel
    members numbered 0 .. `members` - 1, each free from the start; the one backoff
    stream; and the profile's figures the CCA uses."""

    parties: list[Party]
    members: int
    draw: Callable[[], float]  # the next backoff draw, uniform in [0, 1)
    access: float  # from the CCA to the first bit: the CCA and the turnaround
    unit: float  # the backoff unit period (0: no backoff drawn)
    min_be: int
    max_be: int
    takes_turns: bool  # a busy channel: queue for it (the star), or sense again
    tracing: bool  # the medium keeps a trace


class AirMedium(Protocol):
    """What a compiled backend reads of the medium it runs (sim/radio/media.py's
    `Medium`), once per kind of transmission or per settling, never per event."""

    trace: list[Sent] | None
    deliver: Callable[[Party, Any], None]

    def contention(self) -> Contention: ...

    def hold_of(self, tx: Transmission) -> tuple[int, ...]: ...

    def slot_of(self, size: int, broadcast: bool) -> Slot: ...

    def count_sent(self, counts: Iterable[tuple[Sending, int]]) -> None: ...
