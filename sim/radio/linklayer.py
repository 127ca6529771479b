"""The link layer over lossy links: one message's frames, their losses and retries.

A unicast sends each frame until its ACK comes back (a radio whose profile has no ACK
frame, Wi-Fi's being folded into its frame time and raw LoRa having none, is taken to
learn of each frame's fate by an acknowledgement of no airtime): a lost frame, or a
lost ACK, costs the frame's airtime and the wait for the ACK (`ack_timeout_s`), then the
frame goes again, up to the radio's retry limit (802.15.4: macMaxFrameRetries = 3). A
frame that exhausts it is recovered end to end, fragment by fragment (as 6LoWPAN's
selective fragment recovery, RFC 8931, does): after one more ACK timeout the sender
takes it up again, so a long message is never sent over from its first frame, and every
message arrives. In best-effort mode a message is recovered only while its receiver
still waits for it (`budget` seconds from its first bit), or, when the sender cannot
know that, a few times (`rounds`: a receiver that answers none is taken for dead);
after that the sender gives it up at the first frame that exhausts the limit, as a
6LoWPAN sender drops the datagram (the receiver has it only if that was the last frame
and only its ACKs were lost).

A broadcast has no ACKs: each receiver loses frames on its own, and whoever missed one
has not got the message (the medium sends it again to them as a unicast).

Pure arithmetic over the loss model's draws: the medium applies the outcome (holds the
channel for `hold`, counts the state times, delivers to who got it).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from typing import NamedTuple

from meshdl.errors import MeshdlError
from meshdl.protocol.topology import Cell
from meshdl.sim.radio.loss import Links
from meshdl.sim.radio.profiles import RadioProfile


class LinkOutcome(NamedTuple):
    """What sending one message over lossy links came to, in seconds from its first bit."""

    hold: float  # the channel, until the last space
    last_bit: float  # the last bit of the last frame sent
    received: float  # the last frame and its ACK through: when receivers have it
    frames: int  # frames put on air, retries included
    retries: int  # frames sent again at the link layer
    recoveries: int  # frames taken up again end to end after the retry limit
    lost: int  # frames (or ACKs) lost on the way
    missing: tuple[Cell, ...]  # receivers without the whole message
    tx: dict[Cell, float]  # seconds each party transmitted (frames, ACKs)
    rx: dict[Cell, float]  # seconds each party received


class LinkUnusable(MeshdlError):
    """A frame that did not get through in `MAX_RECOVERIES` recoveries."""


MAX_RECOVERIES = 1_000  # of one frame: at the 0.9 loss allowed, some 10^-40 to reach


@functools.lru_cache(maxsize=4096)
def _frame_plan(radio: RadioProfile, size: int) -> tuple[tuple[float, float], ...]:
    """Each frame of a message of `size` bytes: its airtime and the space after it
    (messages repeat their sizes wave after wave)."""
    return tuple((radio.frame_airtime(frame), radio.ifs_after(frame))
                 for frame in radio.frame_sizes(size))


@functools.lru_cache(maxsize=64)
def _timing(radio: RadioProfile) -> tuple[float, float, float]:
    """The ACK's airtime, the wait for one, and the radio's turnaround."""
    return radio.ack_airtime, radio.ack_timeout_s, radio.turnaround_s


def send_frames(radio: RadioProfile, loss: Links, src: Cell,
                receivers: tuple[Cell, ...], size: int, acked: bool,
                budget: float = math.inf, rounds: int = MAX_RECOVERIES) -> LinkOutcome:
    """Send a message of `size` bytes from `src` to `receivers` over `loss`'s links:
    `acked`, one receiver, frame by frame until each is acknowledged, recovering a
    frame end to end while within `budget` seconds and at most `rounds` times; else a
    broadcast."""
    tx: dict[Cell, float] = defaultdict(float)
    rx: dict[Cell, float] = defaultdict(float)
    t = last_bit = received = 0.0
    frames = retries = recoveries = lost = 0
    # BLE retries without limit (its connection times out instead): rounds of 1,000.
    tries_per_round = int(min(radio.retry_limit, 999)) + 1
    missing: set[Cell] = set()
    ack_air, ack_timeout, turnaround = _timing(radio)
    lost_on = loss.lost
    dst = receivers[0]
    tx_src = rx_dst = tx_dst = rx_src = 0.0  # a unicast's (dicts: a broadcast's)
    any_arrived = any_acked = False
    plan = _frame_plan(radio, size)
    last_frame = len(plan) - 1
    for number, (air, space) in enumerate(plan):
        if not acked:
            frames += 1
            tx[src] += air
            for receiver in receivers:
                if loss.lost(src, receiver):
                    lost += 1
                    missing.add(receiver)
                else:
                    rx[receiver] += air
            last_bit = received = t + air
            t += air + space
            continue
        arrived = False  # at the receiver, whatever became of its ACKs
        for attempt in itertools.count():
            if attempt and attempt % tries_per_round == 0:  # the retry limit: recovery
                if t > budget or attempt // tries_per_round > rounds:
                    # Given up: the receiver has it if only its ACKs were lost.
                    if not (arrived and number == last_frame):
                        missing.add(dst)
                    break
                recoveries += 1
                if recoveries > MAX_RECOVERIES:
                    raise LinkUnusable(f"the link {src} -> {dst} lost a frame "
                                       f"{attempt} times in a row")
                t += ack_timeout
            frames += 1
            retries += attempt % tries_per_round != 0
            tx_src += air
            last_bit = t + air
            if lost_on(src, dst):
                lost += 1
                t += air + ack_timeout + space  # waited for an ACK in vain
                continue
            rx_dst += air
            arrived = any_arrived = True
            tx_dst += ack_air
            if ack_air and lost_on(dst, src):  # the frame came, its ACK did not
                lost += 1
                t += air + ack_timeout + space
                continue
            rx_src += ack_air
            any_acked = True
            received = t + air + turnaround + ack_air
            t = received + space
            break
        if missing:
            break
    if acked:  # each party's seconds: the parties that took part, summed frame by frame
        tx, rx = {src: tx_src}, {}
        if any_arrived:
            tx[dst], rx[dst] = tx_dst, rx_dst
        if any_acked:
            rx[src] = rx_src
    return LinkOutcome(t, last_bit, received or t, frames, retries, recoveries, lost,
                       tuple(r for r in receivers if r in missing), dict(tx), dict(rx))
