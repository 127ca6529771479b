"""Lossy forward activations: HALO, POOL and GATHER payloads in half precision or 8 bits.

The forward pass's values cross one hop each, so each message is compressed on its own
(int8 with its own scale, max |x| / 127); nothing accumulates, so there is no error
feedback: a receiver computes on the rounded values, the sender on its exact ones.
Gradients (SCATTER, ROUTE, GRAD_HALO) stay float32. The receiver knows each message's
shape from the plan, so it knows the exact byte count to expect.
"""

from __future__ import annotations

import math

import numpy as np

from meshdl.compress.compressors import ChannelState, Compressor, Half, Int8, Segment
from meshdl.protocol.messages import BYTES, FLOAT32, Header, Kind

ACTIVATION_FORMATS = ("float32", "fp16", "int8")
FORWARD_KINDS = frozenset({Kind.HALO, Kind.POOL, Kind.GATHER})
_NO_STATE = ChannelState(np.random.default_rng(0))  # neither compressor draws from it


def activation_compressor(name: str) -> Compressor | None:
    """The compressor of a `--activations` format; None for float32 (as sent today)."""
    return {"float32": None, "fp16": Half(), "int8": Int8()}[name]


def _segment(count: int) -> Segment:
    return Segment("activations", "activation", (count,))


def encode_activations(compressor: Compressor, values: np.ndarray) -> np.ndarray:
    """One message's activations as bytes."""
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    return compressor.encode(flat, _segment(flat.size), _NO_STATE)


def activation_bytes(compressor: Compressor, shape: tuple[int, ...]) -> int:
    return compressor.nbytes(_segment(math.prod(shape)))


def decode_activations(compressor: Compressor, payload: np.ndarray,
                       shape: tuple[int, ...]) -> np.ndarray | None:
    """The activations of `shape` a payload carries; None if it is not that many
    values' bytes; CodecError if the bytes are not any the compressor writes."""
    if payload.dtype != np.uint8 or payload.shape != (activation_bytes(compressor, shape),):
        return None
    return compressor.decode(payload, _segment(math.prod(shape))).reshape(shape)


def read_activations(codec: Compressor | None, header: Header, payload: np.ndarray,
                     shape: tuple[int, int, int]) -> np.ndarray | None:
    """An items message's (rows, channels, batch) values, in the form its mesh sends
    them: compressed forward activations, or float32; None if it is neither (of that
    shape); CodecError if compressed bytes are not any the compressor writes."""
    if header.dtype == BYTES and codec is not None and header.kind in FORWARD_KINDS:
        return decode_activations(codec, payload, shape)
    if header.dtype == FLOAT32 and payload.shape == shape:
        return payload
    return None
