"""Live readings: a node host samples its cells' sensors once per time slot.

Slot n covers [n * slot_s, (n + 1) * slot_s) of the Unix clock, the same on every node
and the edge (keep their clocks in NTP sync). At the start of each slot the sampler
reads every sensor of the host (blocking reads in worker threads, with retries and a
timeout: `read_with_retry`) and stores the value in the node's LIVE ring at
`n % LIVE_SLOTS`; a failed reading (no answer, NaN, inf, or outside the sensor's
physical range: `meshdl.nodes.sensors.ValidRange`) is stored as missing, so a wave over
that slot is refused by that node rather than computed from a made-up number, and the
edge's alert for the slot is an error. Replayed and synthetic sources are read by slot
number (`SlotSensor`): a retry reads the same slot again, so one bad value never puts a
cell ahead of the others. The edge starts the slot's inference wave later in the slot
(`edge serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.sensors import Reading, Sensor, read_with_retry
from meshdl.protocol.spec import LIVE_SLOTS, Split
from meshdl.protocol.topology import Cell


def live_ring(channels: int = 1) -> np.ndarray:
    """An empty LIVE ring for one node: (LIVE_SLOTS, channels), every slot missing."""
    return np.full((LIVE_SLOTS, channels), np.nan, np.float32)


def slot_of(now: float, slot_s: float) -> int:
    return int(now // slot_s)


class LiveSampler:
    """Reads the sensors of a host's cells into their nodes, one slot at a time."""

    def __init__(self, nodes: dict[Cell, NodeMachine], sensors: dict[Cell, Sensor],
                 slot_s: float, clock: Callable[[], float] = time.time,
                 attempts: int = 3, timeout_s: float = 2.0) -> None:
        self.nodes = nodes
        self.sensors = sensors
        self.slot_s = slot_s
        self.clock = clock
        self.attempts = attempts
        # A reading must be done well inside its slot, retries included.
        self.timeout_s = min(timeout_s, slot_s / (2 * attempts))
        self.stats: Counter[str] = Counter()
        self.last_errors: dict[Cell, str] = {}

    async def sample(self, slot: int) -> dict[Cell, Reading]:
        """Read every sensor for `slot` and store the readings in the nodes."""
        cells = list(self.sensors)
        readings = await asyncio.gather(*(
            read_with_retry(self.sensors[c], self.attempts, self.slot_s / 20, self.timeout_s,
                            slot=slot)
            for c in cells))
        for cell, reading in zip(cells, readings, strict=True):
            self.nodes[cell].record(Split.LIVE, slot % LIVE_SLOTS,
                                    reading.value if reading.ok else None)
            if reading.ok:
                self.stats["readings"] += 1
                self.last_errors.pop(cell, None)
            else:
                self.stats["failed_readings"] += 1
                self.last_errors[cell] = reading.error or "no reading"
        return dict(zip(cells, readings, strict=True))

    async def run(self, stop: asyncio.Event) -> None:
        """Sample at the start of every slot until `stop` is set."""
        while not stop.is_set():
            slot = slot_of(self.clock(), self.slot_s)
            await self.sample(slot)
            wait = (slot + 1) * self.slot_s - self.clock()
            # asyncio.TimeoutError: not yet the builtin one before Python 3.11.
            with contextlib.suppress(asyncio.TimeoutError):  # the next slot has come
                await asyncio.wait_for(stop.wait(), max(wait, 0.0))
