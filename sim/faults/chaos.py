"""Fault injection for the virtual mesh: duplicated, delayed (so reordered), corrupted,
truncated and stale copies of real messages, from a seeded random generator.

Every injected copy is *extra*: the original message is still delivered, so a correct
protocol must give exactly the result of a clean run while counting what it rejected.
(Losing messages is another matter: it needs retries, which the transports provide.)

In an authenticating mesh a `Forger` plays a hostile node: it holds one cell's keys and
sends changed copies of other parties' messages (other values, a later wave), tagged
with the keys it has or signed with a key of its own. None of them may change a result.
"""

from __future__ import annotations

import hmac
import random
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshdl.errors import CodecError
from meshdl.protocol.auth import LINK_TAG_BYTES, SIGNED_KINDS, Keyring, tag_bytes
from meshdl.protocol.messages import decode, encode, seal
from meshdl.protocol.topology import Cell


class Forger:
    """A hostile node holding the keys of `cell`: forgeries of messages between others."""

    def __init__(self, keyring: Keyring, cell: Cell, rng: random.Random) -> None:
        self.keys = list(keyring.links.values())
        self.cell = cell
        self.rng = rng
        # What it signs "edge" messages with: a key of its own, not the edge's.
        self.signer = Ed25519PrivateKey.from_private_bytes(rng.randbytes(32))

    def forge(self, data: bytes) -> bytes | None:
        """A changed copy of a sealed message, tagged as well as this node can; None for
        this node's own traffic (it may say what it likes there: not a forgery)."""
        kind = data[3]
        try:
            message = decode(data[:-tag_bytes(kind)])
        except CodecError:
            return None
        h = message.header
        if self.cell in (h.src, h.dst):
            return None
        payload = message.payload.copy()
        if payload.size:
            flat = payload.reshape(-1)
            flat[self.rng.randrange(flat.size)] += 1  # a value, an index, a mode
        step = (h.step + self.rng.choice((0, 0, 1, 2))) & 0xFFFFFFFF  # this wave or next
        forged = seal(h.kind, h.mesh, step, h.src, h.dst, payload, h.layer, h.phase, h.seq,
                      h.dtype, h.session)
        body = encode(forged)
        if h.kind in SIGNED_KINDS:
            return body + self.signer.sign(body)
        key = self.rng.choice(self.keys) if self.keys else self.rng.randbytes(32)
        return body + hmac.digest(key, body, "sha256")[:LINK_TAG_BYTES]


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
    forge: float = 0.0  # a forged copy, made by a node holding `forger_cell`'s keys
    forger_cell: Cell | None = None  # (an authenticating mesh sets up its `forger`)
    forger: Forger | None = field(default=None, repr=False)
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
        if self.forger is not None and rng.random() < self.forge:
            forged = self.forger.forge(payload)
            if forged is not None:
                out.append((topic, forged, rng.randint(0, self.max_delay)))
        if self._archive and rng.random() < self.stale:
            out.append((*rng.choice(self._archive), 0))
        if len(self._archive) < 512:
            self._archive.append((topic, payload))
        elif rng.random() < 0.05:
            self._archive[rng.randrange(512)] = (topic, payload)
        return out
