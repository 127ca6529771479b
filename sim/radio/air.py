"""The event heap and the loss-free medium's contention, compiled: the same events in
the same order as `EventQueue` and `Medium`, at a fraction of Python's cost per event.

An exact training wave on the seed mesh is about 17,000 events, and two in three are the
medium's own: each transmission's clear-channel assessment (CCA) and the CCAs of
senders that found their channel busy and sense again. Nothing in the machines depends
on those events but their outcome, so `AirQueue` runs them in compiled code and returns
to Python only for what Python must do: an event scheduled with `at` (a CPU waking, a
deadline) and a transmission's arrival at its receivers. `Medium.send` on a medium
attached to an `AirQueue` hands the transmission over here.

`AirQueue` is a clock in its own right (`Clock`, sim/radio/clock.py), not a subclass of
the Python `EventQueue`: Python's events and the medium's must share one heap and one
sequence counter to keep their order, so the heap lives here, compiled. Of the medium
it reads only its public face for a compiled backend (`Medium.contention`, `hold_of`,
`slot_of`, `count_sent`, `trace`, `deliver`), and only once per kind of transmission
or per settling, never per event.

Exactness is the point: one heap orders every event by (time, sequence) with one
sequence counter, Python's events and the medium's alike; the backoffs are drawn from
the medium's own seeded `random.Random`, in event order, through a buffer filled from
it; and every time is the same float operation as in sim/radio/media.py. The same run
therefore gives the same trace, event for event (tests/test_air.py runs both).

Only the loss-free medium is here: lossy links, nodes that go down and radios with
their own backoff streams stay in Python (sim/radio/media.py), where the link layer is.

A compiled caller may run its own parties on the same heap (`run_kernel`), as the cloud
baseline's convergecast does (`gather_kernel`, for sim/studies/cloud.py): its actions
are events of kind PYTHON pushed where Python would push them, so the order is the same.

The state is two arrays, one of int64 and one of float64, each a header and then
regions (`Layout`), so that a call into the compiled code unboxes two arrays (cached
kernels: no compiling per process). A region that runs out of room is grown here in
Python, between calls: the kernels say they need room (`NEED`) before they start an
event, never in the middle of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from itertools import count
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numba import njit

from meshdl.sim.radio.clock import Action
from meshdl.sim.radio.trace import Sent

if TYPE_CHECKING:
    from meshdl.sim.radio.transmission import AirMedium, Sending, Transmission

_JIT = {"cache": True, "nogil": True, "boundscheck": False}

# Event kinds, and what `_run` returns in the low bits of its result (the argument
# above them): a Python event or an arrival, or why it stopped.
PYTHON, ARRIVAL, CCA = 0, 1, 2
EMPTY, LIMIT, NEED, LATER = 3, 4, 5, 6
CODE_BITS = 3

# The int64 array's header: counters and settings, then each region's capacity and
# offset. The float64 array's header: the clock and two of the radio's figures.
(SEQUENCE, EVENTS, HEAP_N, CLASS_N, MEMBER_N, TX_FREE, DRAW_POS, DRAW_N, LOG_N, TRACING,
 TAKES_TURNS, MIN_BE, MAX_BE, SENT_N) = range(14)
NOW, ACCESS, UNIT = range(3)

# Regions: (name, int64s and float64s per entry).
#   heap   (sequence, kind, argument)      (time)
#   class  (first member, end, count)      (channel, last bit, delivered, radio free)
#   member (channel member's number)
#   radio  (active, backoff exponent, queue head, queue tail)   (free at)
#   tx     (class, carried's id, next in queue or free list)     (ready)
#   log    (class)                         (first bit on air): the trace, drained often
#   draw                                   (a backoff draw, uniform in [0, 1))
#   busy                                   (a channel member is held until)
#   sent   (class)   the classes counted since the figures were settled, in the order
#                    of their first transmission (as the medium's Counter keeps them)
REGIONS = (("heap", 3, 1), ("class", 3, 4), ("member", 1, 0), ("radio", 4, 1),
           ("tx", 3, 1), ("log", 1, 1), ("draw", 0, 1), ("busy", 0, 1), ("sent", 1, 0))
HEAP, CLASS, MEMBER, RADIO, TX, LOG, DRAW, BUSY, SENT = range(len(REGIONS))
# The fields of an entry, in the order above.
R_ACTIVE, R_EXPONENT, R_HEAD, R_TAIL = range(4)  # radio
T_CLASS, T_CARRIED, T_NEXT = range(3)  # tx
C_FIRST, C_END, C_COUNT = range(3)  # class: its members, and its transmissions
C_CHANNEL, C_LAST_BIT, C_DELIVERED, C_RADIO_FREE = range(4)  # class (the slot's times)
INT_HEADER = 16
CAPACITY = INT_HEADER  # + region: its capacity
INT_AT = CAPACITY + len(REGIONS)  # + region: where its int64s start
FLOAT_AT = INT_AT + len(REGIONS)  # + region: where its float64s start
INT_HEADER_END = FLOAT_AT + len(REGIONS)
FLOAT_HEADER = 3
assert SENT_N < INT_HEADER and UNIT < FLOAT_HEADER


class Layout:
    """The two arrays of an `AirQueue`'s state (`i64`, `f64`), and how to grow one region."""

    def __init__(self, capacities: dict[int, int], old: Layout | None = None) -> None:
        n_ints = INT_HEADER_END + sum(capacities[r] * REGIONS[r][1] for r in capacities)
        n_floats = FLOAT_HEADER + sum(capacities[r] * REGIONS[r][2] for r in capacities)
        self.i64, self.f64 = np.zeros(n_ints, np.int64), np.zeros(n_floats, np.float64)
        i_at, f_at = INT_HEADER_END, FLOAT_HEADER
        for region, (_, int_width, float_width) in enumerate(REGIONS):
            self.i64[CAPACITY + region] = capacities[region]
            self.i64[INT_AT + region], self.i64[FLOAT_AT + region] = i_at, f_at
            i_at += capacities[region] * int_width
            f_at += capacities[region] * float_width
        if old is not None:  # the same header and every region's entries, moved
            self.i64[:INT_HEADER] = old.i64[:INT_HEADER]
            self.f64[:FLOAT_HEADER] = old.f64[:FLOAT_HEADER]
            for region, (_, int_width, float_width) in enumerate(REGIONS):
                kept = min(old.capacity(region), capacities[region])
                self.ints(region)[:kept * int_width] = old.ints(region)[:kept * int_width]
                self.floats(region)[:kept * float_width] = \
                    old.floats(region)[:kept * float_width]

    def capacity(self, region: int) -> int:
        return int(self.i64[CAPACITY + region])

    def ints(self, region: int) -> np.ndarray:
        start = int(self.i64[INT_AT + region])
        return self.i64[start:start + self.capacity(region) * REGIONS[region][1]]

    def floats(self, region: int) -> np.ndarray:
        start = int(self.i64[FLOAT_AT + region])
        return self.f64[start:start + self.capacity(region) * REGIONS[region][2]]

    def grown(self, region: int, capacity: int) -> Layout:
        capacities = {r: self.capacity(r) for r in range(len(REGIONS))}
        capacities[region] = capacity
        return Layout(capacities, self)


# ------------------------------------------------------------------ compiled kernels
@njit(**_JIT)
def _move(i64: np.ndarray, f64: np.ndarray, to: int, source: int) -> None:
    """Heap entry `source` into the place of entry `to`."""
    heap_i, heap_f = i64[INT_AT + HEAP], i64[FLOAT_AT + HEAP]
    f64[heap_f + to] = f64[heap_f + source]
    for k in range(3):
        i64[heap_i + 3 * to + k] = i64[heap_i + 3 * source + k]


@njit(**_JIT)
def _push(i64: np.ndarray, f64: np.ndarray, time: float, kind: int, argument: int) -> None:
    """Schedule an event (there is room: the callers make sure)."""
    heap_i, heap_f = i64[INT_AT + HEAP], i64[FLOAT_AT + HEAP]
    sequence = i64[SEQUENCE]
    i64[SEQUENCE] = sequence + 1
    i = i64[HEAP_N]
    i64[HEAP_N] = i + 1
    while i > 0:  # sift up past every later parent
        parent = (i - 1) >> 1
        parent_time = f64[heap_f + parent]
        if parent_time < time or (parent_time == time and i64[heap_i + 3 * parent] < sequence):
            break
        _move(i64, f64, i, parent)
        i = parent
    f64[heap_f + i] = time
    i64[heap_i + 3 * i], i64[heap_i + 3 * i + 1], i64[heap_i + 3 * i + 2] = sequence, kind, argument


@njit(**_JIT)
def _pop(i64: np.ndarray, f64: np.ndarray) -> tuple[float, int, int]:
    """The earliest event (time, then sequence), taken off the heap."""
    heap_i, heap_f = i64[INT_AT + HEAP], i64[FLOAT_AT + HEAP]
    time, kind, argument = f64[heap_f], i64[heap_i + 1], i64[heap_i + 2]
    n = i64[HEAP_N] - 1
    i64[HEAP_N] = n
    last_time = f64[heap_f + n]
    last_sequence = i64[heap_i + 3 * n]
    i = 0
    while True:  # sift the last entry down from the root
        child = 2 * i + 1
        if child >= n:
            break
        right = child + 1
        if right < n and (f64[heap_f + right] < f64[heap_f + child] or (
                f64[heap_f + right] == f64[heap_f + child] and
                i64[heap_i + 3 * right] < i64[heap_i + 3 * child])):
            child = right
        child_time = f64[heap_f + child]
        if last_time < child_time or (last_time == child_time and
                                      last_sequence < i64[heap_i + 3 * child]):
            break
        _move(i64, f64, i, child)
        i = child
    _move(i64, f64, i, n)
    return time, kind, argument


@njit(**_JIT)
def _backoff(i64: np.ndarray, f64: np.ndarray, exponent: int) -> float:
    """0 .. 2^exponent - 1 unit periods, from the next draw (none without a unit)."""
    if f64[UNIT] == 0.0:
        return 0.0
    draw = f64[i64[FLOAT_AT + DRAW] + i64[DRAW_POS]]
    i64[DRAW_POS] += 1
    return np.int64(draw * (1 << exponent)) * f64[UNIT]


@njit(**_JIT)
def _contend(i64: np.ndarray, f64: np.ndarray, radio: int) -> None:
    """`Medium._contend`: the head of the radio's queue draws its backoff and assesses
    the channel after it, once it is made and the radio may send again."""
    radio_at = i64[INT_AT + RADIO] + 4 * radio
    i64[radio_at + R_EXPONENT] = i64[MIN_BE]
    backoff = _backoff(i64, f64, i64[MIN_BE])
    ready = f64[i64[FLOAT_AT + TX] + i64[radio_at + R_HEAD]]
    free_at = f64[i64[FLOAT_AT + RADIO] + radio]
    _push(i64, f64, max(ready, free_at) + backoff, CCA, radio)


@njit(**_JIT)
def _attempt(i64: np.ndarray, f64: np.ndarray, radio: int) -> None:
    """`Medium._attempt` on its loss-free path: the CCA of the head of the radio's
    queue, then its transmission or another backoff."""
    radio_at = i64[INT_AT + RADIO] + 4 * radio
    tx = i64[radio_at + R_HEAD]
    tx_at = i64[INT_AT + TX] + 3 * tx
    class_no = i64[tx_at + T_CLASS]
    class_at = i64[INT_AT + CLASS] + 3 * class_no
    times_at = i64[FLOAT_AT + CLASS] + 4 * class_no
    members, busy = i64[INT_AT + MEMBER], i64[FLOAT_AT + BUSY]
    free = -math.inf  # the hold's members: on air until
    for m in range(i64[class_at + C_FIRST], i64[class_at + C_END]):
        free = max(free, f64[busy + i64[members + m]])
    now = f64[NOW]
    if free > now:
        exponent = i64[radio_at + R_EXPONENT]
        if exponent < i64[MAX_BE]:
            exponent += 1
            i64[radio_at + R_EXPONENT] = exponent
        backoff = _backoff(i64, f64, exponent)
        if i64[TAKES_TURNS] == 0:
            _push(i64, f64, free + backoff, CCA, radio)
            return
        now = free + backoff
    following = i64[tx_at + T_NEXT]  # off the queue
    i64[radio_at + R_HEAD] = following
    if following == -1:
        i64[radio_at + R_TAIL] = -1
    t0 = now + f64[ACCESS]
    end = t0 + f64[times_at + C_CHANNEL]
    for m in range(i64[class_at + C_FIRST], i64[class_at + C_END]):
        f64[busy + i64[members + m]] = end
    i64[class_at + C_COUNT] += 1
    if i64[class_at + C_COUNT] == 1:  # its first since the figures were settled
        i64[i64[INT_AT + SENT] + i64[SENT_N]] = class_no
        i64[SENT_N] += 1
    if i64[TRACING]:
        n = i64[LOG_N]
        i64[i64[INT_AT + LOG] + n], f64[i64[FLOAT_AT + LOG] + n] = class_no, t0
        i64[LOG_N] = n + 1
    f64[i64[FLOAT_AT + RADIO] + radio] = t0 + f64[times_at + C_RADIO_FREE]
    _push(i64, f64, t0 + f64[times_at + C_DELIVERED], ARRIVAL, i64[tx_at + T_CARRIED])
    i64[tx_at + T_NEXT] = i64[TX_FREE]  # its slot is free again
    i64[TX_FREE] = tx
    if following != -1:
        _contend(i64, f64, radio)
    else:
        i64[radio_at + R_ACTIVE] = 0


@njit(**_JIT)
def _enqueue(i64: np.ndarray, f64: np.ndarray, radio: int, class_no: int, ready: float,
             carried: int) -> bool:
    """`Medium.send`: queue a transmission of class `class_no` on the radio; False,
    having done nothing, if a region needs room first."""
    if i64[TX_FREE] == -1 or i64[DRAW_N] - i64[DRAW_POS] < 1 or \
            i64[HEAP_N] + 1 > i64[CAPACITY + HEAP]:
        return False
    tx = i64[TX_FREE]
    tx_at = i64[INT_AT + TX] + 3 * tx
    i64[TX_FREE] = i64[tx_at + T_NEXT]
    i64[tx_at + T_CLASS], i64[tx_at + T_CARRIED], i64[tx_at + T_NEXT] = class_no, carried, -1
    f64[i64[FLOAT_AT + TX] + tx] = ready
    radio_at = i64[INT_AT + RADIO] + 4 * radio
    if i64[radio_at + R_TAIL] == -1:
        i64[radio_at + R_HEAD] = tx
    else:
        i64[i64[INT_AT + TX] + 3 * i64[radio_at + R_TAIL] + T_NEXT] = tx
    i64[radio_at + R_TAIL] = tx
    if i64[radio_at + R_ACTIVE] == 0:
        i64[radio_at + R_ACTIVE] = 1
        _contend(i64, f64, radio)
    return True


@njit(**_JIT)
def _schedule(i64: np.ndarray, f64: np.ndarray, time: float, action: int) -> bool:
    """A Python event; False if the heap needs room first."""
    if i64[HEAP_N] + 1 > i64[CAPACITY + HEAP]:
        return False
    _push(i64, f64, time, PYTHON, action)
    return True


@njit(**_JIT)
def _run(i64: np.ndarray, f64: np.ndarray, stop: int, until: float) -> int:
    """Run the medium's events until an event Python must run (returned with its
    argument above `CODE_BITS`: its action's id, or the arrival's transmission), or
    none is left, or the `stop`-th event has run, or the next is after `until`, or a
    region needs room before the next CCA can run."""
    return _run_needing(i64, f64, stop, until, 0, 0)


@njit(**_JIT)
def _run_needing(i64: np.ndarray, f64: np.ndarray, stop: int, until: float, draws: int,
                 events: int) -> int:
    """`_run` for a compiled caller that handles the events it returns itself: before
    one of those it also asks for `draws` backoff draws and room for `events` more
    events on the heap (Python, instead, makes room as it goes)."""
    while True:
        if i64[HEAP_N] == 0:
            return EMPTY
        if f64[i64[FLOAT_AT + HEAP]] > until:
            return LATER
        if i64[EVENTS] >= stop:
            return LIMIT
        if i64[i64[INT_AT + HEAP] + 1] == CCA:
            if i64[DRAW_N] - i64[DRAW_POS] < 2 or i64[HEAP_N] + 2 > i64[CAPACITY + HEAP] or \
                    i64[LOG_N] + 1 > i64[CAPACITY + LOG]:
                return NEED
        elif i64[DRAW_N] - i64[DRAW_POS] < draws or \
                i64[HEAP_N] + events > i64[CAPACITY + HEAP]:
            return NEED
        time, kind, argument = _pop(i64, f64)
        f64[NOW] = time
        i64[EVENTS] += 1
        if kind == CCA:
            _attempt(i64, f64, argument)
        else:
            return (argument << CODE_BITS) | kind


# ------------------------------------------------------------------ a convergecast
# The cloud-heavy baseline's parties (sim/studies/cloud.py), compiled: each party's CPU
# takes one message at a time, then the party sends its own readings, relays a piece as
# it came or gathers its children's pieces before sending its subtree's. Run on an
# AirQueue's heap (`AirQueue.run_kernel`), each action is an event of kind PYTHON whose
# argument is its entry, pushed where the Python parties would push it, so the sequence
# numbers, and with them the order of every event, are the Python run's. It lives in
# this file because Numba's cache checks only the calling function's own file ("Cache
# invalidation fails to recognize changes in functions defined in a different file",
# Numba docs, Notes on Caching): kernels in another module would keep running a stale
# copy of these after an edit.
#
# party_i (parties, P_COLUMNS): next hop, radio, what an arrival does, readings held,
#     children still to hear from, readings expected when it sends, its own pieces
#     (`own[first:end]`, bytes each), the classes it may send (`classes[first:end]`,
#     rows of (piece bytes, class)), and its rank in the order of first CPU use
# party_f (parties, 3): CPU seconds a message, CPU busy until, CPU seconds used
# entries (n, 4): an action or a piece in flight: action, party (a piece's receiver),
#     piece bytes, readings it completes; free ones are chained through the action
# state: the free chain's head, readings at the sink, parties that used their CPU,
#     started
(P_NEXT, P_RADIO, P_ARRIVAL, P_CARRIED, P_WAITING, P_EXPECT, P_OWN_FIRST, P_OWN_END,
 P_CLASS_FIRST, P_CLASS_END, P_RANK) = range(11)
P_COLUMNS = 11
F_COST, F_FREE, F_USED = range(3)
E_ACTION, E_PARTY, E_SIZE, E_CELLS = range(4)
S_FREE, S_ARRIVED, S_RANKED, S_STARTED = range(4)
# Actions, and what an arrival makes its receiver do.
SEND, FORWARD, TOOK, NOTHING = range(4)
COLLECT, RELAY, GATHER = range(3)
BROKEN = 7  # a return code: the tables did not fit the run (a bug, never a run's result)


@njit(**_JIT)
def _entry(entries: np.ndarray, state: np.ndarray) -> int:
    """A free entry, off the chain (-1 if none)."""
    e = state[S_FREE]
    if e != -1:
        state[S_FREE] = entries[e, E_ACTION]
    return e


@njit(**_JIT)
def _free(entries: np.ndarray, state: np.ndarray, e: int) -> None:
    entries[e, E_ACTION] = state[S_FREE]
    state[S_FREE] = e


@njit(**_JIT)
def _after_cpu(i64: np.ndarray, f64: np.ndarray, party_i: np.ndarray, party_f: np.ndarray,
               entries: np.ndarray, state: np.ndarray, party: int, action: int,
               e: int) -> bool:
    """`_Shipping._after_cpu` for one message: entry `e` does `action` at `party` once
    its CPU has handled it."""
    seconds = party_f[party, F_COST]
    start = max(f64[NOW], party_f[party, F_FREE])
    party_f[party, F_FREE] = start + seconds
    if party_i[party, P_RANK] < 0:
        party_i[party, P_RANK] = state[S_RANKED]
        state[S_RANKED] += 1
    party_f[party, F_USED] += seconds
    entries[e, E_ACTION], entries[e, E_PARTY] = action, party
    return _schedule(i64, f64, start + seconds, e)


@njit(**_JIT)
def _forward(i64: np.ndarray, f64: np.ndarray, party_i: np.ndarray, classes: np.ndarray,
             entries: np.ndarray, src: int, size: int, cells: int, e: int) -> bool:
    """`_Shipping._forward`: a piece of `size` bytes completing `cells` readings to
    the next hop, ready now."""
    class_no = -1
    for row in range(party_i[src, P_CLASS_FIRST], party_i[src, P_CLASS_END]):
        if classes[row, 0] == size:
            class_no = classes[row, 1]
            break
    if class_no == -1:
        return False
    entries[e, E_PARTY], entries[e, E_SIZE], entries[e, E_CELLS] = \
        party_i[src, P_NEXT], size, cells
    return _enqueue(i64, f64, party_i[src, P_RADIO], class_no, f64[NOW], e)


@njit(**_JIT)
def _act(i64: np.ndarray, f64: np.ndarray, party_i: np.ndarray, party_f: np.ndarray,
         own: np.ndarray, classes: np.ndarray, entries: np.ndarray, state: np.ndarray,
         e: int) -> bool:
    """Entry `e`'s action, its party's CPU done."""
    action, party = entries[e, E_ACTION], entries[e, E_PARTY]
    if action == SEND:  # its readings in pieces, the last completing them
        carried = party_i[party, P_CARRIED]
        if carried != party_i[party, P_EXPECT]:  # its pieces were sized for those
            return False
        last = party_i[party, P_OWN_END] - 1
        for k in range(party_i[party, P_OWN_FIRST], last + 1):
            piece = e if k == last else _entry(entries, state)
            if piece == -1 or not _forward(i64, f64, party_i, classes, entries, party,
                                           own[k], carried if k == last else 0, piece):
                return False
        return True
    if action == FORWARD:
        return _forward(i64, f64, party_i, classes, entries, party, entries[e, E_SIZE],
                        entries[e, E_CELLS], e)
    if action == TOOK and entries[e, E_CELLS]:  # `_Shipping._took`
        party_i[party, P_CARRIED] += entries[e, E_CELLS]
        party_i[party, P_WAITING] -= 1
        if party_i[party, P_WAITING] == 0:
            return _after_cpu(i64, f64, party_i, party_f, entries, state, party, SEND, e)
    _free(entries, state, e)
    return True


@njit(**_JIT)
def _arrived(i64: np.ndarray, f64: np.ndarray, party_i: np.ndarray, party_f: np.ndarray,
             entries: np.ndarray, state: np.ndarray, e: int) -> bool:
    """`_Shipping._arrive`: the piece in entry `e` is at its receiver."""
    party = entries[e, E_PARTY]
    arrival = party_i[party, P_ARRIVAL]
    if arrival == COLLECT:
        state[S_ARRIVED] += entries[e, E_CELLS]
        return _after_cpu(i64, f64, party_i, party_f, entries, state, party, NOTHING, e)
    return _after_cpu(i64, f64, party_i, party_f, entries, state, party,
                      FORWARD if arrival == RELAY else TOOK, e)


@njit(**_JIT)
def gather_kernel(i64: np.ndarray, f64: np.ndarray, party_i: np.ndarray,
                  party_f: np.ndarray, own: np.ndarray, classes: np.ndarray,
                  entries: np.ndarray, state: np.ndarray, starts: np.ndarray, draws: int,
                  events: int) -> int:
    """The convergecast until no event is left (EMPTY), or a region needs room (NEED:
    call again after), or BROKEN. The first call starts the `starts` parties' sends."""
    if state[S_STARTED] == 0:
        state[S_STARTED] = 1
        for party in starts:
            e = _entry(entries, state)
            if e == -1 or not _after_cpu(i64, f64, party_i, party_f, entries, state,
                                         party, SEND, e):
                return BROKEN
    while True:
        result = _run_needing(i64, f64, 2**62, math.inf, draws, events)
        code, e = result & ((1 << CODE_BITS) - 1), result >> CODE_BITS
        if code == PYTHON:
            done = _act(i64, f64, party_i, party_f, own, classes, entries, state, e)
        elif code == ARRIVAL:
            done = _arrived(i64, f64, party_i, party_f, entries, state, e)
        else:
            return code
        if not done:
            return BROKEN


# ------------------------------------------------------------------ Python side
class _Class(NamedTuple):
    """What the transmissions of one class are, for the figures and the trace: the
    medium's `Sending` key, and the slot's last bit and frames."""

    key: Sending
    last_bit: float
    frames: int


class AirQueue:
    """A clock (`Clock`: the same events in the same order as an `EventQueue`) whose
    heap is compiled, and which runs the loss-free contention of a `Medium` attached to
    it (`attach`) without returning to Python.

    What the medium's compiled part counted and traced reaches the medium's figures
    and trace when a run ends, when the medium changes accounts, and whenever a `Tally`
    is read (`settle`); the trace list itself is only complete between runs."""

    def __init__(self, now: float = 0.0, room: int = 1024, draws: int = 4096) -> None:
        """`room`: entries each growable region starts with (heap, classes, members,
        queued transmissions, trace log, classes sent); `draws`: backoff draws
        buffered (at least 2). Neither changes the run, only how often Python makes
        room."""
        if room < 1 or draws < 2:
            raise ValueError("an AirQueue needs room for 1 entry and 2 draws at least")
        self.now = now  # the clock, as of the last return to Python
        self._draws = draws
        self._layout = Layout({HEAP: room, CLASS: room, MEMBER: room, RADIO: 0, TX: room,
                               LOG: room, DRAW: 0, BUSY: 0, SENT: room})
        self._layout.f64[NOW] = now
        self._layout.i64[TX_FREE] = -1
        self._link_free_tx(0)
        self._actions: dict[int, tuple[Action, Any]] = {}
        self._ids = count()
        self.medium: AirMedium | None = None
        self._carried: dict[int, Transmission] = {}
        self._classes: dict[Sending, int] = {}
        self._class_list: list[_Class] = []
        self._radios: dict[Hashable, int] = {}
        self._draw: Callable[[], float] = lambda: 0.0

    # ------------------------------------------------------------- the medium
    def attach(self, medium: AirMedium) -> None:
        """Run `medium`'s loss-free contention here (`Medium.contention`): its
        parties' radios, its channel members (each free from the start), its figures."""
        if self.medium is not None or self._layout.i64[HEAP_N]:
            raise ValueError("a medium attaches to an AirQueue once, before any event")
        c = medium.contention()
        layout = self._layout.grown(RADIO, len(c.parties)).grown(BUSY, c.members) \
            .grown(DRAW, self._draws)
        i64, f64 = layout.i64, layout.f64
        i64[MIN_BE], i64[MAX_BE], i64[TAKES_TURNS], i64[TRACING] = c.min_be, c.max_be, \
            c.takes_turns, c.tracing
        f64[ACCESS], f64[UNIT] = c.access, c.unit
        radios = layout.ints(RADIO).reshape(-1, 4)
        radios[:, R_HEAD], radios[:, R_TAIL] = -1, -1  # empty queues
        # Without a backoff unit nothing is drawn (the buffer of zeros only satisfies
        # the kernels' check), and the medium's generator is left untouched.
        self._layout, self.medium = layout, medium
        self._draw = c.draw if c.unit else float
        self._radios = {party: number for number, party in enumerate(c.parties)}
        self._refill()

    def send(self, tx: Transmission) -> None:
        """Queue `tx` (its `ready` set, not before now) on its sender's radio."""
        if tx.ready < self.now:  # (the Python medium's queue would refuse its CCA)
            raise ValueError(f"cannot send at {tx.ready} before now ({self.now})")
        class_no = self.class_of(tx)
        carried = next(self._ids)
        self._carried[carried] = tx
        radio = self._radios[tx.src]
        while not _enqueue(self._layout.i64, self._layout.f64, radio, class_no, tx.ready,
                           carried):
            self._make_room()

    def class_of(self, tx: Transmission) -> int:
        """The number of `tx`'s class, made when first seen: every transmission with
        the same key has the same hold and times (and, in the trace, the first one's
        key fields). A compiled caller (`run_kernel`) names its transmissions by it."""
        key = (tx.src, tx.receivers, tx.kind, tx.layer, tx.size, tx.broadcast)
        class_no = self._classes.get(key)
        return self._add_class(key, tx) if class_no is None else class_no

    def radio_of(self, party: Hashable) -> int:
        """The number of `party`'s radio in the kernels (`attach` numbered them)."""
        return self._radios[party]

    def _add_class(self, key: Sending, tx: Transmission) -> int:
        """A new class of transmission: its hold's members and its slot's times."""
        assert self.medium is not None
        hold = tx.hold or self.medium.hold_of(tx)
        slot = self.medium.slot_of(tx.size, tx.broadcast)
        class_no, first = int(self._layout.i64[CLASS_N]), int(self._layout.i64[MEMBER_N])
        if class_no == self._layout.capacity(CLASS):  # each class is sent at most once
            room = 2 * class_no  # between two settlings: SENT grows with it
            self._layout = self._layout.grown(CLASS, room).grown(SENT, room)
        while first + len(hold) > self._layout.capacity(MEMBER):
            self._layout = self._layout.grown(MEMBER, 2 * self._layout.capacity(MEMBER))
        layout = self._layout
        layout.ints(MEMBER)[first:first + len(hold)] = hold
        layout.ints(CLASS)[3 * class_no:3 * class_no + 3] = (first, first + len(hold), 0)
        layout.floats(CLASS)[4 * class_no:4 * class_no + 4] = (
            slot.channel, slot.last_bit, slot.delivered, slot.radio_free)
        layout.i64[CLASS_N], layout.i64[MEMBER_N] = class_no + 1, first + len(hold)
        self._classes[key] = class_no
        self._class_list.append(_Class(key, slot.last_bit, slot.frames))
        return class_no

    def _refill(self) -> None:
        """Top the backoff draws up from the medium's stream (in order: the unused
        draws first)."""
        layout = self._layout
        draws, pos, n = layout.floats(DRAW), int(layout.i64[DRAW_POS]), int(layout.i64[DRAW_N])
        left = n - pos
        draws[:left] = draws[pos:n]
        draw = self._draw
        draws[left:] = [draw() for _ in range(len(draws) - left)]
        layout.i64[DRAW_POS], layout.i64[DRAW_N] = 0, len(draws)

    def _link_free_tx(self, start: int) -> None:
        """Make the transmission slots from `start` on the free list (which is empty:
        new slots are made when none is left)."""
        layout = self._layout
        slots = layout.ints(TX).reshape(-1, 3)
        slots[start:-1, T_NEXT] = np.arange(start + 1, len(slots))
        slots[-1, T_NEXT] = -1
        layout.i64[TX_FREE] = start

    def _make_room(self, draws: int = 2, events: int = 2) -> None:
        """Whatever the kernels need before the next event: draws, heap, slots, log
        (`draws` and `events`: what the next event may take at most)."""
        i64 = self._layout.i64
        if i64[DRAW_N] - i64[DRAW_POS] < draws and self.medium is not None:
            if draws > self._layout.capacity(DRAW):
                raise ValueError(f"an event that draws {draws} backoffs needs an "
                                 f"AirQueue of {draws} draws at least")
            self._refill()
        while i64[HEAP_N] + events > self._layout.capacity(HEAP):
            self._layout = self._layout.grown(HEAP, 2 * self._layout.capacity(HEAP))
            i64 = self._layout.i64
        if i64[TX_FREE] == -1:
            old = self._layout.capacity(TX)
            self._layout = self._layout.grown(TX, 2 * old)
            self._link_free_tx(old)
        if self._layout.i64[LOG_N] + 1 > self._layout.capacity(LOG):
            self._drain_trace()

    def reserve(self, transmissions: int, events: int) -> None:
        """Room for `transmissions` queued at once and `events` pending at once, for a
        compiled caller that cannot stop to make room in the middle of an event."""
        if transmissions > self._layout.capacity(TX):
            old, head = self._layout.capacity(TX), int(self._layout.i64[TX_FREE])
            self._layout = self._layout.grown(TX, transmissions)
            self._link_free_tx(old)  # the new slots, then those free already
            self._layout.ints(TX).reshape(-1, 3)[-1, T_NEXT] = head
        if events > self._layout.capacity(HEAP):
            self._layout = self._layout.grown(HEAP, events)

    def run_kernel(self, kernel: Callable[[np.ndarray, np.ndarray], int], draws: int,
                   events: int) -> int:
        """Run a compiled caller's `kernel(i64, f64)` (say, `gather_kernel` bound to
        its tables) until it returns anything but NEED, making room for `draws`
        backoff draws and `events` more events whenever it does; then settle."""
        try:
            while True:
                code = kernel(self._layout.i64, self._layout.f64)
                if code != NEED:
                    return code
                self._make_room(draws, events)
        finally:
            self.now = self._layout.f64.item(NOW)
            self.settle()

    # ------------------------------------------------------------- the figures
    def settle(self) -> None:
        """Hand what the medium's compiled part counted and traced to the medium: each
        class's transmissions into its current account, the trace in order."""
        if self.medium is None:
            return
        self._drain_trace()
        layout = self._layout
        sent = layout.ints(SENT)[:int(layout.i64[SENT_N])]
        if len(sent):
            counts = layout.ints(CLASS).reshape(-1, 3)[:, C_COUNT]
            classes = self._class_list
            self.medium.count_sent(
                [(classes[class_no].key, n)
                 for class_no, n in zip(sent.tolist(), counts[sent].tolist(), strict=True)])
            counts[sent] = 0
            layout.i64[SENT_N] = 0

    def _drain_trace(self) -> None:
        layout = self._layout
        trace = self.medium.trace if self.medium is not None else None
        n = int(layout.i64[LOG_N])
        if trace is not None and n:
            classes = self._class_list
            for class_no, t0 in zip(layout.ints(LOG)[:n].tolist(),
                                    layout.floats(LOG)[:n].tolist(), strict=True):
                c = classes[class_no]
                src, receivers, message_kind, layer, size, broadcast = c.key
                trace.append(Sent(t0, t0 + c.last_bit, src, receivers, broadcast,
                                  message_kind, layer, size, c.frames, "ok"))
        layout.i64[LOG_N] = 0

    # ------------------------------------------------------------- the clock
    @property
    def events(self) -> int:
        """Events run so far, the medium's own included."""
        return int(self._layout.i64[EVENTS])

    def at(self, time: float, action: Action, argument: Any = None) -> None:
        """Run `action(argument)` at `time` (never before now)."""
        if time < self.now:
            raise ValueError(f"cannot schedule at {time} before now ({self.now})")
        key = next(self._ids)
        self._actions[key] = (action, argument)
        while not _schedule(self._layout.i64, self._layout.f64, time, key):
            self._make_room()

    def advance_to(self, time: float) -> None:
        """`EventQueue.advance_to`: nothing may be pending."""
        if self._layout.i64[HEAP_N] or time < self.now:
            raise ValueError(f"cannot advance to {time}: events pending or time past")
        self.now = self._layout.f64[NOW] = time

    def __bool__(self) -> bool:
        return bool(self._layout.i64[HEAP_N])

    def _events_until(self, stop: int, until: float) -> bool:
        """Run events until none is left up to `until`; False if the `stop`-th event
        ran first."""
        actions, carried = self._actions, self._carried
        deliver = self.medium.deliver if self.medium is not None else None
        try:
            while True:
                layout = self._layout
                result = _run(layout.i64, layout.f64, stop, until)
                code = result & ((1 << CODE_BITS) - 1)
                if code == PYTHON:
                    self.now = layout.f64.item(NOW)
                    action, argument = actions.pop(result >> CODE_BITS)
                    action(argument)
                elif code == ARRIVAL:  # `Medium._arrive`, one call less
                    self.now = layout.f64.item(NOW)
                    for party, what in carried.pop(result >> CODE_BITS).deliveries:
                        deliver(party, what)  # type: ignore[misc]
                elif code == NEED:
                    self._make_room()
                    continue
                else:
                    return code != LIMIT
        finally:
            self.now = self._layout.f64.item(NOW)
            self.settle()

    def run(self, limit: int) -> bool:
        """Run events until none is left; False if `limit` events ran out first."""
        return self._events_until(self._stop(limit), math.inf)

    def run_until(self, done: Callable[[], bool], limit: int) -> bool:
        """`done()` is asked after every event, the medium's too (one call into the
        compiled loop each: this is the slow way, for tests)."""
        stop = self._stop(limit)
        while self and not done():
            if self.events >= stop:
                return False
            self._events_until(self.events + 1, math.inf)  # one event
        return True

    def _stop(self, limit: int) -> int:
        return min(self.events + limit, 2**62)  # the kernels count in int64

    def run_through(self, time: float) -> None:
        """Run the events up to `time`, then move the clock to it."""
        self._events_until(2**62, time)
        self.now = self._layout.f64[NOW] = max(self.now, time)
