"""Live readings and scheduled slots: a node host samples its cells' sensors once per
time slot, and starts each slot's inference wave by its own clock.

Slot n covers [n * slot_s, (n + 1) * slot_s) of the Unix clock, the same on every node
and the edge (keep their clocks in NTP sync). At the start of each slot the sampler
reads every sensor of the host (blocking reads in worker threads, with retries and a
timeout: `read_with_retry`) and stores the value in the node's LIVE ring at
`n % LIVE_SLOTS`; a failed reading (no answer, NaN, inf, or outside the sensor's
physical range: `meshdl.nodes.sensors.ValidRange`) is stored as missing, so a wave over
that slot is refused by that node rather than computed from a made-up number, and the
edge's alert for the slot is an error. A slot the sampler skipped (it ran late) is
marked missing too: its ring place still holds a reading LIVE_SLOTS slots old. Replayed
and synthetic sources are read by slot number (`SlotSensor`): a retry reads the same
slot again, so one bad value never puts a cell ahead of the others.

Scheduled slots (`SlotStarter`). The edge sends the parameters once, with the first
slot's wave (PARAMS and BATCH, to every node); each node caches them
(`NodeMachine.cached`). Halfway through every later slot, once the sampler has stored
that slot's readings, the host starts the slot's wave on each of its cells
(`NodeHost.begin_slot`: step = slot number, no PARAMS, no BATCH) and publishes what
they send; the edge only waits for the slot's GATHER (`meshdl edge serve`). A cell
without parameters (its host just started) cannot start: it asks its tree parent for
them (PROTOCOL.md, "Scheduled slots"), and when the slot stalls all the same the edge
sends PARAMS and BATCH of that very slot again (same step): a cell that began the slot
counts them as duplicates, and forgets its cached parameters if they differ (the edge's
model changed), so that the next slot asks for the new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.host import NodeHost
from meshdl.nodes.sensors import Reading, Sensor, read_with_retry
from meshdl.protocol.messages import Message
from meshdl.protocol.spec import LIVE_SLOTS, Split
from meshdl.protocol.topology import Cell

# Where in its slot a host starts the slot's wave: halfway, as the edge used to send its
# PARAMS and BATCH, so that the sensors read at the slot's start (retries included: the
# sampler's timeouts keep within half a slot) are in.
BEGIN_AT = 0.5


def live_ring(channels: int = 1) -> np.ndarray:
    """An empty LIVE ring for one node: (LIVE_SLOTS, channels), every slot missing."""
    return np.full((LIVE_SLOTS, channels), np.nan, np.float32)


def as_recorded(alive: bool, value: float) -> float | np.ndarray:
    """A sensor's reading as its node's model reads it: with the alive mask
    (`ModelConfig.alive`), the reading and a 1 (this node is alive: it read it)."""
    return np.array([value, 1.0], np.float32) if alive else value


def slot_of(now: float, slot_s: float) -> int:
    return int(now // slot_s)


class LiveSampler:
    """Reads the sensors of a host's cells into their nodes, one slot at a time."""

    def __init__(self, nodes: dict[Cell, NodeMachine], sensors: dict[Cell, Sensor],
                 slot_s: float, clock: Callable[[], float] = time.time,
                 attempts: int = 3, timeout_s: float = 2.0, alive: bool = False) -> None:
        self.nodes = nodes
        self.alive = alive  # the model reads the alive mask: each reading beside a 1
        self.sensors = sensors
        self.slot_s = slot_s
        self.clock = clock
        self.attempts = attempts
        # A reading must be done well inside its slot, retries included.
        self.timeout_s = min(timeout_s, slot_s / (2 * attempts))
        self.stats: Counter[str] = Counter()
        self.last_errors: dict[Cell, str] = {}
        self.sampled: int | None = None  # the last slot whose readings are stored

    async def sample(self, slot: int) -> dict[Cell, Reading]:
        """Read every sensor for `slot` and store the readings in the nodes."""
        cells = list(self.sensors)
        readings = await asyncio.gather(*(
            read_with_retry(self.sensors[c], self.attempts, self.slot_s / 20, self.timeout_s,
                            slot=slot)
            for c in cells))
        self._forget_skipped(slot)
        for cell, reading in zip(cells, readings, strict=True):
            self.nodes[cell].record(Split.LIVE, slot % LIVE_SLOTS,
                                    as_recorded(self.alive, reading.value) if reading.ok
                                    else None)
            if reading.ok:
                self.stats["readings"] += 1
                self.last_errors.pop(cell, None)
            else:
                self.stats["failed_readings"] += 1
                self.last_errors[cell] = reading.error or "no reading"
        self.sampled = slot
        return dict(zip(cells, readings, strict=True))

    def _forget_skipped(self, slot: int) -> None:
        """Mark missing the slots between the last sampled one and `slot`: a wave over
        one of them must not compute on what its ring place holds from LIVE_SLOTS slots
        before."""
        if self.sampled is None or slot <= self.sampled + 1:
            return
        skipped = range(max(self.sampled + 1, slot - LIVE_SLOTS + 1), slot)
        self.stats["skipped_slots"] += slot - self.sampled - 1
        for cell in self.sensors:
            for missed in skipped:
                self.nodes[cell].record(Split.LIVE, missed % LIVE_SLOTS, None)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample at the start of every slot until `stop` is set."""
        while not stop.is_set():
            slot = slot_of(self.clock(), self.slot_s)
            await self.sample(slot)
            wait = (slot + 1) * self.slot_s - self.clock()
            # asyncio.TimeoutError: not yet the builtin one before Python 3.11.
            with contextlib.suppress(asyncio.TimeoutError):  # the next slot has come
                await asyncio.wait_for(stop.wait(), max(wait, 0.0))


class SlotStarter:
    """Starts each slot's wave on a host's cells by the host's clock (`begin`, polled by
    the host's loop), once its readings are stored (`NodeHost.begin_slot`: a cell never
    starts a slot twice)."""

    def __init__(self, host: NodeHost, sampler: LiveSampler, begin_at: float = BEGIN_AT) -> None:
        self.host = host
        self.sampler = sampler
        self.begin_at = begin_at
        self.begun: int | None = None  # the last slot started

    def due(self, now: float) -> int | None:
        """The slot to start at Unix time `now`, if any: its middle has passed, its
        readings are stored, and it has not been started."""
        slot_s = self.sampler.slot_s
        slot = slot_of(now, slot_s)
        if now < (slot + self.begin_at) * slot_s or slot == self.begun or \
                self.sampler.sampled != slot:
            return None
        return slot

    def begin(self) -> list[Message]:
        """Start the due slot's wave on every cell that has not (a PARAMS of the edge
        may have started it already); returns what goes to the broker (what the cells
        send one another is handed over in process, as `NodeHost.handle` does)."""
        slot = self.due(self.sampler.clock())
        if slot is None:
            return []
        self.begun = slot
        return self.host.begin_slot(slot)
