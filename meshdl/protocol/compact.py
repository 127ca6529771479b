"""Compact message headers for radio meshes: the 48-byte header of messages.py cut to
the 6 bytes a message needs once the 802.15.4 frame and the receiver's plan say the rest.

Model. A radio stack does not send an application's headers as they are: 6LoWPAN header
compression (RFC 6282) elides every field the link layer or a context both ends share
already gives, taking IPv6's 40 bytes down to 2-7. Here the 802.15.4 MAC header (frame
control, sequence number, PAN id, short destination and source: sim/radio/radios.toml)
and its FCS already carry, for every message:

- mesh: the PAN id;
- src and dst: the short addresses (`short_address`: the edge 0x0000, cell (r, c)
  1 + r * cols + c, every node 0xFFFF, 802.15.4's broadcast address);
- the checksum: the FCS, a CRC-16 over the frame;
- the payload's length: the frame's length (as RFC 6282, 3.2, elides IPv6's payload
  length and infers it "from lower layers");
- seq: the MAC's own sequence number (a decoded message has seq 0).

The protocol version is not sent: the parties of a mesh agree on it, as on this format
(`MeshSpec.header`), before its first wave (RFC 6282 elides IPv6's version too). The
receiver's plan knows each message's shape from (kind, layer, phase, src) and the
wave's batch (spec.py, `expected_shape`); a payload whose length only the frame gives (PARAMS,
BATCH, HEALTH, and every compressed payload, dtype bytes) is one-dimensional. The
receiver's current wave gives the step's high bits. What is left, little-endian:

    byte 0   bits 0-3  kind: 1 PARAMS ... 12 WEIGHTS, as messages.Kind (0, 13-15 invalid)
             bits 4-5  dtype: 0 float32, 1 int32, 2 bytes (3 invalid)
             bit  6    phase: 0 row strips, 1 column strips
             bit  7    reserved, 0 (a receiver rejects 1: a later format)
    byte 1   bits 0-4  layer (0-31)
             bits 5-7  parameter version: its low 3 bits
    bytes 2-3          step: its low 16 bits (u16)
    bytes 4-5          session (u16, whole: sessions are random draws, edge/remote.py,
                       so their low bits could not be widened back)

then the payload's bytes, as in messages.py (C order; never pickled). Why each cut from
the full header's u8 layer, u32 step and u8 version is safe:

- layer, 5 bits: a mesh's model has at most 16 conv layers (config.py, ModelConfig.
  conv_layers, le=16), and a radio message's layer numbers one of them (or is 0). PUSH
  and WEIGHTS, whose layer may number a part of the parameters, go between edge and
  parameter server on the backhaul, never on a radio. `encode_compact` refuses a layer
  above 31 (ValueError) rather than send another one.
- parameter version, 3 bits: a node keeps one set of parameters (nodes/agent.py,
  CachedParams), ordered by their PARAMS' session and step, not by this field; the field
  only tells a receiver whether a sender's parameters are the ones it holds, which 3 bits
  do unless a multiple of 8 versions went by unseen (live inference changes its model
  rarely: PROTOCOL.md, "Scheduled slots"). `encode_compact` takes the whole version and
  sends its low 3 bits.
- step, 16 bits: widened back below; see the limits there.

The payload starts at byte 6, so a payload read in place from the received bytes is no
longer aligned for its 4-byte values: `decode_compact` reads it in place when it is
aligned (bytes, dtype u1, always are) and otherwise copies it, as messages.decode does
for a misaligned buffer, into an aligned read-only array. The copy costs a payload's
bytes once per message, against 2 bytes on the air for every message.

Steps are widened back as messages.newer compares them (RFC 1982), over 16 bits: to the
step nearest the receiver's own whose low 16 bits match. Within the receiver's session a
step more than `MAX_STEP_GAP` (2**14) waves away is rejected: an honest sender is a wave
or two apart (a live slot's wave is numbered as its slot, the install's too:
sim/studies/live.py), so such a step is garbage. 2**14 waves are 341 days of half-hour
live slots, but only 4.5 hours of training waves a second apart: a node that misses
that many waves of one session refuses that session's messages until its edge's next
one. A node that misses 2**16 - 2**14 or more may instead widen a sender's step to one
of its own past waves or to its current one: the price of a step cut to 16 bits (the
full header's u32 has no such limit below 2**31).

A message of another session (an edge that restarted) starts wherever its edge says, as
with the full header: its step is widened without that check, so only its low 16 bits
are the edge's; every party widens the steps it receives against its own, so the high
bits never need to cross the air.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import Literal, NamedTuple

import numpy as np

from meshdl.errors import CodecError, CodecReason
from meshdl.limits import MAX_PAYLOAD_BYTES
from meshdl.model.kernels import all_finite
from meshdl.protocol.messages import (
    ALL,
    BYTES,
    DTYPES,
    EDGE,
    FLOAT32,
    Kind,
    Message,
    seal,
)
from meshdl.protocol.topology import Cell

HeaderFormat = Literal["full", "compact"]  # `MeshSpec.header`

_HEAD = struct.Struct("<BBHH")  # kind/dtype/phase, layer/version, step's low bits, session
COMPACT_HEADER_BYTES = _HEAD.size  # 6
_KIND_MASK, _DTYPE_SHIFT, _PHASE_BIT, _RESERVED_BIT = 0x0F, 4, 0x40, 0x80
LAYER_BITS, VERSION_BITS = 5, 3  # byte 1: layer in bits 0-4, version in bits 5-7
MAX_LAYER = (1 << LAYER_BITS) - 1  # 31
_VERSION_MASK = (1 << VERSION_BITS) - 1

STEP_BITS = 16
_STEP_MASK = (1 << STEP_BITS) - 1
_HALF = 1 << (STEP_BITS - 1)
MAX_STEP_GAP = 1 << (STEP_BITS - 2)  # waves either way, within the receiver's session

# IEEE 802.15.4-2006, MAC PIB macShortAddress: 0xFFFF is the broadcast address (and "no
# short address"), 0xFFFE "associated, no short address allocated": neither names a cell.
BROADCAST_ADDRESS = 0xFFFF
_NO_SHORT_ADDRESS = 0xFFFE
EDGE_ADDRESS = 0x0000  # our choice: cells count from 1, as HEALTH numbers them
MAX_CELLS = _NO_SHORT_ADDRESS - 1  # cells 1 .. 0xFFFD

ANY = -1  # a dimension the frame's length gives (numpy's reshape reads -1 the same)
Shape = tuple[int, ...]
PlanKey = tuple[Kind, int, int, Cell]  # (kind, layer, phase, src): spec.expects's key
ShapeOf = Callable[[PlanKey], Shape | None]


def short_address(cell: Cell, cols: int) -> int:
    """The 802.15.4 short address of a party of a mesh `cols` cells wide."""
    if cell == EDGE:
        return EDGE_ADDRESS
    if cell == ALL:
        return BROADCAST_ADDRESS
    r, c = cell
    if r < 0 or not 0 <= c < cols:
        raise ValueError(f"{cell} has no short address (not a cell, the edge or every node)")
    address = 1 + r * cols + c
    if address > MAX_CELLS:
        raise ValueError(f"cell {cell}: beyond the {MAX_CELLS} short addresses of a PAN")
    return address


def cell_at(address: int, cols: int) -> Cell:
    """The party a short address names: `short_address`'s inverse."""
    if address == EDGE_ADDRESS:
        return EDGE
    if address == BROADCAST_ADDRESS:
        return ALL
    if not 0 < address <= MAX_CELLS:
        raise ValueError(f"short address {address:#06x} names no party of a mesh")
    return divmod(address - 1, cols)


class CompactHeader(NamedTuple):
    """The fields a compact header carries, as read off the wire."""

    kind: Kind
    dtype: int
    phase: int
    layer: int
    step_low: int  # the step's low `STEP_BITS` bits
    session: int
    version: int  # of the parameters: its low `VERSION_BITS` bits


class CompactContext(NamedTuple):
    """What a receiver knows of a message besides its compact bytes: from the MAC frame
    (PAN id, short addresses through `cell_at`) and from its own state."""

    mesh: int
    src: Cell
    dst: Cell
    step: int  # the receiver's current wave (0 before its first)
    session: int  # ... and its session
    # The payload's shape for a (kind, layer, phase, src) of the receiver's plan, None for
    # a message it does not expect: a function (spec.py's `plan_shapes`) or a mapping.
    shapes: ShapeOf | Mapping[PlanKey, Shape]


def encode_compact(message: Message, version: int = 0) -> bytes:
    """A message's bytes with the compact header; `version`: of the parameters it
    carries, for receivers that cache them (its low `VERSION_BITS` bits are sent). What
    the compact form cannot say is a ValueError: a phase above 1, a layer above
    `MAX_LAYER`, a negative version, or a compressed payload of more than one dimension."""
    h = message.header
    if not 0 <= h.phase <= 1:
        raise ValueError(f"phase {h.phase}: the compact header has one bit for it")
    if h.layer > MAX_LAYER:
        raise ValueError(f"layer {h.layer}: the compact header has {LAYER_BITS} bits for it "
                         f"(a radio mesh's model has at most 16 conv layers)")
    if version < 0:
        raise ValueError(f"parameter version {version} is negative")
    if h.dtype == BYTES and message.payload.ndim != 1:
        raise ValueError("a compressed payload travels as its bytes: one dimension")
    first = int(h.kind) | h.dtype << _DTYPE_SHIFT | h.phase * _PHASE_BIT
    second = h.layer | (version & _VERSION_MASK) << LAYER_BITS
    return _HEAD.pack(first, second, h.step & _STEP_MASK, h.session) + \
        message.payload.tobytes()


def read_compact_header(data: bytes) -> CompactHeader:
    """The compact header of wire bytes, checked alone; CodecError naming what is wrong."""
    if len(data) < COMPACT_HEADER_BYTES:
        raise CodecError(CodecReason.TRUNCATED, f"truncated message: {len(data)} bytes, "
                                                f"header alone is {COMPACT_HEADER_BYTES}")
    first, second, step_low, session = _HEAD.unpack_from(data)
    if first & _RESERVED_BIT:
        raise CodecError(CodecReason.INVALID_HEADER, "reserved bit set: not this format")
    try:
        kind = Kind(first & _KIND_MASK)
    except ValueError:
        raise CodecError(CodecReason.INVALID_HEADER,
                         f"unknown kind {first & _KIND_MASK}") from None
    dtype = (first >> _DTYPE_SHIFT) & 0x3
    if dtype not in DTYPES:
        raise CodecError(CodecReason.INVALID_HEADER, f"unknown dtype {dtype}")
    return CompactHeader(kind, dtype, int(bool(first & _PHASE_BIT)), second & MAX_LAYER,
                         step_low, session, second >> LAYER_BITS)


def widen_step(low: int, near: int) -> int:
    """The u32 step whose low `STEP_BITS` bits are `low` nearest to step `near`, in
    serial-number arithmetic (RFC 1982): it may wrap past 0xFFFFFFFF either way."""
    return (near + step_gap(low, near)) & 0xFFFFFFFF


def step_gap(low: int, near: int) -> int:
    """How many waves after `near` (negative: before) the step of low bits `low` is."""
    gap = (low - near) & _STEP_MASK
    return gap - (1 << STEP_BITS) if gap >= _HALF else gap


def decode_compact(data: bytes, context: CompactContext,
                   max_payload: int = MAX_PAYLOAD_BYTES) -> Message:
    """Parse and validate compact wire bytes with what the receiver knows (`context`),
    as strictly as messages.decode: truncated or oversized data, an unknown kind or
    dtype, a message the plan does not expect, a payload whose length does not fit its
    shape, NaN or inf, a step too far from the receiver's: CodecError."""
    c = read_compact_header(data)
    size = len(data) - COMPACT_HEADER_BYTES
    if size > max_payload:
        raise CodecError(CodecReason.OVERSIZED, f"oversized message: {len(data)} bytes")
    if c.session == context.session and abs(step_gap(c.step_low, context.step)) > MAX_STEP_GAP:
        raise CodecError(CodecReason.INVALID_HEADER,
                         f"step {c.step_low:#x} (low {STEP_BITS} bits) is more than "
                         f"{MAX_STEP_GAP} waves from this receiver's {context.step}")
    step = widen_step(c.step_low, context.step)
    key = (c.kind, c.layer, c.phase, context.src)
    shapes = context.shapes
    shape = shapes.get(key) if isinstance(shapes, Mapping) else shapes(key)
    if shape is None:
        raise CodecError(CodecReason.INVALID_HEADER, f"{c.kind.name} layer {c.layer} phase "
                         f"{c.phase} from {context.src}: not a message of this plan")
    dtype = DTYPES[c.dtype]
    if c.dtype == BYTES:
        shape = (ANY,)  # compressed: its bytes, as many as the frame holds
    if not _fits(size, shape, dtype.itemsize):
        raise CodecError(CodecReason.PAYLOAD_SIZE,
                         f"payload of {size} bytes, shape {shape} of {dtype} does not fit")
    flat = np.frombuffer(data, dtype, offset=COMPACT_HEADER_BYTES)
    if not flat.flags.aligned:  # 4-byte values 6 bytes into the buffer: copy them aligned
        flat = flat.copy()
        flat.setflags(write=False)  # read-only, as a payload read in place
    if c.dtype == FLOAT32 and not all_finite(flat):
        raise CodecError(CodecReason.NOT_FINITE, "payload holds NaN or inf")
    return seal(c.kind, context.mesh, step, context.src, context.dst, flat.reshape(shape),
                c.layer, c.phase, 0, c.dtype, c.session)


def _fits(size: int, shape: Shape, itemsize: int) -> bool:
    """Are `size` bytes the values of `shape`: exactly, or, with an `ANY` dimension,
    a whole number of the other dimensions' values?"""
    known = itemsize * math.prod(d for d in shape if d != ANY)
    if ANY not in shape:
        return size == known
    return size == 0 or (known > 0 and size % known == 0)
