"""Fault injection for the virtual mesh: duplicated, delayed (so reordered), corrupted,
truncated and stale copies of real messages, from a seeded random generator.

Every injected copy is *extra*: the original message is still delivered, so a correct
protocol must give exactly the result of a clean run while counting what it rejected.
(Losing messages is another matter: it needs retries, which the transports provide.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Chaos:
    """Probabilities per sent message of each kind of injected copy."""

    seed: int = 0
    duplicate: float = 0.0  # an identical copy, possibly delayed
    corrupt: float = 0.0  # a copy with one byte flipped
    truncate: float = 0.0  # a copy cut short
    stale: float = 0.0  # a copy of an earlier wave's message, re-sent now
    max_delay: int = 3  # rounds an original or a copy may be held back
    delay: float = 0.0  # probability that the original itself is delayed
    shuffle: bool = False  # deliver each round in random order
    rng: random.Random = field(init=False, repr=False)
    _archive: list[tuple[str, bytes]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def copies(self, topic: str, payload: bytes) -> list[tuple[str, bytes, int]]:
        """(topic, bytes, delay) to publish for one sent message, the original included."""
        rng, out = self.rng, []
        delay = rng.randint(1, self.max_delay) if rng.random() < self.delay else 0
        out.append((topic, payload, delay))
        if rng.random() < self.duplicate:
            out.append((topic, payload, rng.randint(0, self.max_delay)))
        if rng.random() < self.corrupt and payload:
            flipped = bytearray(payload)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            out.append((topic, bytes(flipped), 0))
        if rng.random() < self.truncate and len(payload) > 1:
            out.append((topic, payload[: rng.randrange(len(payload))], 0))
        if self._archive and rng.random() < self.stale:
            out.append((*rng.choice(self._archive), 0))
        if len(self._archive) < 512:
            self._archive.append((topic, payload))
        elif rng.random() < 0.05:
            self._archive[rng.randrange(512)] = (topic, payload)
        return out
