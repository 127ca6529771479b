"""A flat vector of several segments (a REDUCE's conv layers, a PUSH's every layer) as
one compressed payload, and the sender's side of a stream of them (`Channel`).

`VectorCodec` cuts the vector at its segments' boundaries and gives each to its own
compressor; the payload is their bytes one after the other, each of a size fixed by its
compressor and segment, so the whole payload has one size the receiver knows before it
reads a byte. `Channel` is one sender's stream: error feedback over the whole vector
(meshdl/compress/feedback.py) and each segment's compressor state (RNG, warm start).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, TypeVar

import numpy as np

from meshdl.compress.compressors import ChannelState, Compressor, Segment, bad_payload
from meshdl.compress.feedback import ErrorFeedback
from meshdl.errors import CodecError

T = TypeVar("T")


class Part(NamedTuple):
    """One segment of a vector: its compressor, its values, its bytes in a payload."""

    segment: Segment
    compressor: Compressor
    values: slice
    payload: slice


@dataclass(frozen=True)
class VectorCodec:
    """Which compressor encodes each segment of a flat vector, in order."""

    segments: tuple[Segment, ...]
    compressors: tuple[Compressor, ...]

    def __post_init__(self) -> None:
        for segment, compressor in zip(self.segments, self.compressors, strict=True):
            if not compressor.applies_to(segment):
                raise ValueError(f"{compressor.spec} does not apply to {segment.name} "
                                 f"({segment.kind})")

    @cached_property
    def parts(self) -> tuple[Part, ...]:
        """Where each segment sits in the vector and in the payload (worked out once:
        every node encodes and decodes with the same codec in every wave)."""
        out, at, byte = [], 0, 0
        for segment, compressor in zip(self.segments, self.compressors, strict=True):
            width = compressor.nbytes(segment)
            out.append(Part(segment, compressor, slice(at, at + segment.size),
                            slice(byte, byte + width)))
            at, byte = at + segment.size, byte + width
        return tuple(out)

    @cached_property
    def size(self) -> int:
        """Values of the vector."""
        return sum(s.size for s in self.segments)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of every payload."""
        return sum(c.nbytes(s) for s, c in zip(self.segments, self.compressors, strict=True))

    @cached_property
    def lossless(self) -> bool:
        return all(c.lossless for c in self.compressors)

    @cached_property
    def operations(self) -> int:
        """Operations of one encoding and one decoding of a payload (the simulated
        devices' CPU time)."""
        return sum(c.operations(s) for s, c in zip(self.segments, self.compressors,
                                                   strict=True))

    def encode(self, values: np.ndarray, states: list[ChannelState]) -> np.ndarray:
        payloads = [part.compressor.encode(values[part.values], part.segment, state)
                    for part, state in zip(self.parts, states, strict=True)]
        return np.concatenate(payloads) if payloads else np.empty(0, np.uint8)

    def compress(self, values: np.ndarray, states: list[ChannelState]
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The payload, and the vector the receiver will decode from it."""
        payloads, decoded = [], []
        for part, state in zip(self.parts, states, strict=True):
            payload, values_out = part.compressor.compress(values[part.values],
                                                           part.segment, state)
            payloads.append(payload)
            decoded.append(values_out)
        if not payloads:
            return np.empty(0, np.uint8), np.empty(0, np.float32)
        return np.concatenate(payloads), np.concatenate(decoded)

    def decode(self, data: np.ndarray) -> np.ndarray:
        """The vector a payload carries; CodecError (BAD_COMPRESSED) if it is not one
        these compressors could have sent."""
        if data.dtype != np.uint8 or data.shape != (self.nbytes,):
            raise bad_payload(f"{data.size} bytes, expected {self.nbytes}")
        parts = [part.compressor.decode(data[part.payload], part.segment)
                 for part in self.parts]
        return np.concatenate(parts).astype(np.float32, copy=False)


class Channel:
    """One sender's stream of compressed vectors, with error feedback."""

    def __init__(self, codec: VectorCodec, seed: int = 0) -> None:
        self.codec = codec
        self.feedback = ErrorFeedback(codec.size)
        rngs = np.random.SeedSequence(seed).spawn(len(codec.segments))
        self.states = [ChannelState(np.random.default_rng(s)) for s in rngs]
        self.sent = 0

    def send(self, values: np.ndarray) -> np.ndarray:
        """The payload for `values` plus the residual; the residual keeps the rest."""
        if self.codec.lossless:  # nothing to remember
            return self.codec.encode(values, self.states)
        compensated = self.feedback.compensate(values)
        payload, decoded = self.codec.compress(compensated, self.states)
        self.feedback.update(compensated, decoded)
        self.sent += 1
        return payload

    @property
    def residual(self) -> np.ndarray:
        return self.feedback.residual


def read_or_count(read: Callable[[], T | None], stats: Counter[str], bad: str) -> T | None:
    """What `read` makes of a received payload, or None with the reason counted in
    `stats`: bytes no compressor writes ("rejected:bad_compressed"), or a payload that
    is not the form this mesh sends (`bad`). Nodes and the edge read every compressed
    payload through it."""
    try:
        value = read()
    except CodecError:
        stats["rejected:bad_compressed"] += 1
        return None
    if value is None:
        stats[bad] += 1
    return value
