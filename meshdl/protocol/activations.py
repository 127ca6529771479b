"""Forward activations on the air: HALO, POOL and GATHER payloads in half precision or
8 bits.

fp16 and int8 are lossy per message: each message is compressed on its own (int8 with
its own scale, max |x| / 127); nothing accumulates, so there is no error feedback: a
receiver computes on the rounded values, the sender on its exact ones (equal to no
central model).

int8-static (`StaticCodes`) is exact: every value was quantized where it was made, by
its layer's calibrated scale (meshdl/model/quantize.py), and the message carries its codes
alone, 2 bytes a reading (int16, little-endian), 1 byte a ReLU output (uint8), no scale:
the receiver has the layer's scale from PARAMS and computes on `code x scale`, the very
values the sender computes on. The mesh then equals the central int8 emulation.

Gradients (SCATTER, ROUTE, GRAD_HALO) stay float32. The receiver knows each message's
shape from the plan, so it knows the exact byte count to expect.
"""

from __future__ import annotations

import math

import numpy as np

from meshdl.compress.compressors import ChannelState, Compressor, Half, Int8, Segment
from meshdl.model.quantize import code_dtype, from_codes, to_codes
from meshdl.protocol.messages import BYTES, FLOAT32, Header, Kind

STATIC = "int8-static"
ACTIVATION_FORMATS = ("float32", "fp16", "int8", STATIC)
FORWARD_KINDS = frozenset({Kind.HALO, Kind.POOL, Kind.GATHER})
_NO_STATE = ChannelState(np.random.default_rng(0))  # neither compressor draws from it


class StaticCodes:
    """`--activations int8-static`: a forward message's values as the codes of its
    layer's calibrated scale (meshdl/model/quantize.py). Which layer a message carries: a
    HALO of conv l the input of l (layer l - 1: 0 is the readings, int16), POOL and
    GATHER the last conv layer's (pooled maxima of quantized values are quantized
    values: their codes are exact)."""

    def __init__(self, conv_layers: int) -> None:
        self.conv_layers = conv_layers

    def layer_of(self, kind: Kind, layer: int) -> int:
        return layer - 1 if kind == Kind.HALO else self.conv_layers

    def itemsize(self, kind: Kind, layer: int) -> int:
        return code_dtype(self.layer_of(kind, layer)).itemsize

    def encode(self, values: np.ndarray, scales: np.ndarray, kind: Kind,
               layer: int) -> np.ndarray:
        """The codes of a message's (quantized) values, as little-endian bytes."""
        at = self.layer_of(kind, layer)
        codes = to_codes(values, scales[at], at).reshape(-1)
        return codes.astype(codes.dtype.newbyteorder("<")).view(np.uint8)

    def decode(self, payload: np.ndarray, shape: tuple[int, ...], scales: np.ndarray,
               kind: Kind, layer: int) -> np.ndarray | None:
        """The quantized values of `shape` a payload's codes stand for; None if it is not
        that many codes' bytes, or holds a code no node makes."""
        at = self.layer_of(kind, layer)
        dtype = code_dtype(at).newbyteorder("<")
        if payload.dtype != np.uint8 or payload.shape != (math.prod(shape) * dtype.itemsize,):
            return None
        values = from_codes(payload.view(dtype), scales[at], at)
        return None if values is None else values.reshape(shape)


def activation_compressor(name: str, conv_layers: int = 2) -> Compressor | StaticCodes | None:
    """The codec of a `--activations` format; None for float32 (as sent today)."""
    if name == STATIC:
        return StaticCodes(conv_layers)
    return {"float32": None, "fp16": Half(), "int8": Int8()}[name]


def valid_act_scales(scales: np.ndarray) -> bool:
    """int8-static's scales in PARAMS: finite and positive (a zero or negative scale
    would make every value 0 or flip signs: refused)."""
    return bool(np.all(np.isfinite(scales)) and np.all(scales > 0.0))


def _segment(count: int) -> Segment:
    return Segment("activations", "activation", (count,))


def encode_activations(compressor: Compressor | StaticCodes, values: np.ndarray,
                       scales: np.ndarray | None = None, kind: Kind = Kind.HALO,
                       layer: int = 1) -> np.ndarray:
    """One message's activations as bytes (int8-static: `scales` from PARAMS, and the
    message's kind and layer say which scale)."""
    if isinstance(compressor, StaticCodes):
        assert scales is not None
        return compressor.encode(values, scales, kind, layer)
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    return compressor.encode(flat, _segment(flat.size), _NO_STATE)


def activation_bytes(compressor: Compressor | StaticCodes, shape: tuple[int, ...],
                     kind: Kind = Kind.HALO, layer: int = 1) -> int:
    if isinstance(compressor, StaticCodes):
        return math.prod(shape) * compressor.itemsize(kind, layer)
    return compressor.nbytes(_segment(math.prod(shape)))


def decode_activations(compressor: Compressor, payload: np.ndarray,
                       shape: tuple[int, ...]) -> np.ndarray | None:
    """The activations of `shape` a payload carries; None if it is not that many
    values' bytes; CodecError if the bytes are not any the compressor writes."""
    if payload.dtype != np.uint8 or payload.shape != (activation_bytes(compressor, shape),):
        return None
    return compressor.decode(payload, _segment(math.prod(shape))).reshape(shape)


def read_activations(codec: Compressor | StaticCodes | None, header: Header,
                     payload: np.ndarray, shape: tuple[int, int, int],
                     scales: np.ndarray | None = None) -> np.ndarray | None:
    """An items message's (rows, channels, batch) values, in the form its mesh sends
    them: compressed forward activations (int8-static: codes of `scales`, from
    PARAMS), or float32; None if it is neither (of that shape); CodecError if
    compressed bytes are not any the compressor writes."""
    if isinstance(codec, StaticCodes) and header.kind in FORWARD_KINDS and \
            header.dtype != BYTES:
        return None  # values no node quantized: never computed on
    if header.dtype == BYTES and codec is not None and header.kind in FORWARD_KINDS:
        if isinstance(codec, StaticCodes):
            if scales is None:
                return None
            return codec.decode(payload, shape, scales, header.kind, header.layer)
        return decode_activations(codec, payload, shape)
    if header.dtype == FLOAT32 and payload.shape == shape:
        return payload
    return None
