"""Mesh messages and their binary codec: a small validated header, then one array.

Wire format (little-endian), 48 bytes of header followed by the array's bytes:

    magic "MD" | version u8 | kind u8 | mesh u16 | step u32 | layer u8 | phase u8 |
    src row i16 | src col i16 | dst row i16 | dst col i16 | seq u32 |
    dtype u8 | ndim u8 | session u16 | shape 4 x u32 | crc32 u32 (of every byte before
    and after it)

dtype: 0 float32, 1 int32, 2 bytes (a compressed payload, meshdl/compress).

`session` (version 2; reserved 0 in version 1) names the edge run a wave belongs to: an
edge picks a new one when it starts, and nodes follow the PARAMS of a new session
whatever its step, so a restarted edge always takes its mesh back. The header is a
multiple of 16 bytes, so that a payload read in place from the received bytes is aligned.

The edge is cell (-1, -1), "every node" (-2, -2), the parameter server (-2, -1).
Decoding rejects, with a `CodecError`, anything truncated, oversized, of another
version, kind, dtype or mesh, or whose shape does not match the payload length. Never
pickle: the payload is `ndarray.tobytes()` and `np.frombuffer`.
"""

from __future__ import annotations

import math
import struct
import zlib
from enum import IntEnum
from typing import Annotated, Literal, NamedTuple

import numpy as np
from pydantic import Field, TypeAdapter, ValidationError

from meshdl.errors import CodecError, CodecReason
from meshdl.limits import MAX_PAYLOAD_BYTES
from meshdl.model.kernels import all_finite

# 2: the header's u16 at byte 26 carries the edge's session. 3: a REDUCE's conv weight
# gradients above the first layer are split by input cell (nodes/memory.py), so version-2
# nodes would count some terms twice and others never: they must not share a mesh.
PROTOCOL_VERSION = 3
MAGIC = b"MD"
EDGE = (-1, -1)  # the edge's "cell" in headers
ALL = (-2, -2)  # destination of the edge's broadcasts to every node
SERVER = (-2, -1)  # the parameter server's "cell" (several meshes, one model)
MAX_DIMS = 4

_FIELDS = struct.Struct("<2sBBHIBBhhhhIBBH4I")
_CRC = struct.Struct("<I")
_HEADER = struct.Struct(_FIELDS.format + "I")  # the fields, then their checksum
HEADER_BYTES = _HEADER.size


class Kind(IntEnum):
    """Message kinds; `CLASS_OF` names the accounting class of each."""

    PARAMS = 1  # conv parameters, flooded from the edge down the BFS tree
    BATCH = 2  # which samples this wave computes: int32 [mode, split, *indices]
    HALO = 3  # activations for a neighbour's convolution window
    POOL = 4  # a cell's last conv output, sent to its pooling block's leader
    GATHER = 5  # pooled features of a subtree, up the tree to the edge
    SCATTER = 6  # d(loss)/d(pooled) of a subtree, down the tree from the edge
    ROUTE = 7  # a pooling leader's gradient for one member of its block (max routing)
    GRAD_HALO = 8  # d(loss)/d(conv output) for a neighbour's transposed convolution
    REDUCE = 9  # partial conv-parameter gradients of a subtree, summed on the way up
    HEALTH = 10  # int32 cells suspected dead (+n+1) or back (-(n+1)), up the tree
    # Several meshes, one model (meshdl/server): between each mesh's edge and the
    # parameter server, over the backhaul.
    PUSH = 11  # a mesh's gradient of one step, with its loss (meshdl/protocol/payloads.py)
    WEIGHTS = 12  # the server's parameters after an update, to the edges


CLASS_OF = {
    Kind.PARAMS: "params", Kind.BATCH: "params", Kind.HALO: "halo", Kind.POOL: "pool",
    Kind.GATHER: "gather", Kind.SCATTER: "scatter", Kind.ROUTE: "scatter",
    Kind.GRAD_HALO: "grad-halo", Kind.REDUCE: "reduce", Kind.HEALTH: "health",
    Kind.PUSH: "push", Kind.WEIGHTS: "weights",
}

# Bytes (code 2) carry a compressed payload (meshdl/compress): its layout is the
# compressor's, and the receiver checks it as strictly as the codec checks the header.
DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<i4"), 2: np.dtype("u1")}
DTYPE_CODES = {dtype: code for code, dtype in DTYPES.items()}
FLOAT32, INT32, BYTES = (DTYPE_CODES[np.dtype(t)] for t in ("<f4", "<i4", "u1"))
ITEM_BYTES = 4  # of a value: float32 or int32


def payload_bytes(header: Header) -> int:
    """Bytes of a message's payload: its shape's items times its dtype's size."""
    return math.prod(header.shape) * DTYPES[header.dtype].itemsize


Cell16 = Annotated[int, Field(ge=-2, le=0x7FFE)]  # -1: the edge, -2: every node


class Header(NamedTuple):
    """The header of one mesh message; `validate_header` checks one from the wire."""

    version: Literal[PROTOCOL_VERSION]
    kind: Kind
    mesh: Annotated[int, Field(ge=0, le=0xFFFF)]
    step: Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
    layer: Annotated[int, Field(ge=0, le=255)]
    phase: Annotated[int, Field(ge=0, le=255)]
    src: tuple[Cell16, Cell16]
    dst: tuple[Cell16, Cell16]
    seq: Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
    dtype: Literal[0, 1, 2]
    shape: Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(max_length=MAX_DIMS)]
    session: Annotated[int, Field(ge=0, le=0xFFFF)] = 0  # the edge run the wave belongs to


# pydantic validates wire headers (compiled once; the checks run in pydantic-core).
_validate_header = TypeAdapter(Header).validate_python


class Message(NamedTuple):
    """One mesh message: its header and its array (`payload.shape == header.shape`)."""

    header: Header
    payload: np.ndarray  # read-only when decoded: it views the received bytes

    @property
    def kind(self) -> Kind:
        return self.header.kind


_new = tuple.__new__


def make(kind: Kind, mesh: int, step: int, src: tuple[int, int], dst: tuple[int, int],
         payload: np.ndarray, layer: int = 0, phase: int = 0, seq: int = 0,
         session: int = 0) -> Message:
    """A message from trusted local code (the payload is converted to a wire dtype)."""
    array = np.ascontiguousarray(payload)
    code = DTYPE_CODES.get(array.dtype)
    if code is None:
        array = array.astype(np.float32 if array.dtype.kind == "f" else np.int32)
        code = DTYPE_CODES[array.dtype]
    if array.ndim > MAX_DIMS:
        raise ValueError(f"a payload has at most {MAX_DIMS} dimensions, not {array.ndim}")
    return seal(kind, mesh, step, src, dst, array.view(), layer, phase, seq, code, session)


def seal(kind: Kind, mesh: int, step: int, src: tuple[int, int], dst: tuple[int, int],
         view: np.ndarray, layer: int, phase: int, seq: int, dtype: int = FLOAT32,
         session: int = 0) -> Message:
    """A message around a fresh C-contiguous view of a wire dtype (`dtype`'s code): the
    hot path of a node's sends, whose payloads are slices of its buffers; `make` for
    anything else."""
    # Read-only, as a decoded payload is: in-process transports hand this very array to
    # the receiver, which must not be able to change what the sender still holds.
    view.setflags(write=False)
    # tuple.__new__ skips the NamedTuples' generated __new__: this runs for every message.
    header = _new(Header, (PROTOCOL_VERSION, kind, mesh, step, layer, phase, src, dst, seq,
                           dtype, view.shape, session))
    return _new(Message, (header, view))


def encode(message: Message) -> bytes:
    """The wire bytes of a message."""
    h, body = message.header, message.payload.tobytes()
    shape = tuple(h.shape) + (0,) * (MAX_DIMS - len(h.shape))
    fields = _FIELDS.pack(
        MAGIC, h.version, int(h.kind), h.mesh, h.step, h.layer, h.phase, *h.src, *h.dst,
        h.seq, h.dtype, len(h.shape), h.session, *shape,
    )
    # The checksum covers the header too: a flipped bit in `layer` or `step` would
    # otherwise pass as a different, valid-looking message.
    return fields + _CRC.pack(zlib.crc32(body, zlib.crc32(fields))) + body


def newer(step: int, than: int) -> bool:
    """Whether wave `step` comes after wave `than`, in serial-number arithmetic over the
    header's u32 (RFC 1982): steps wrap from 0xFFFFFFFF to 0, and a step is newer when it
    is less than 2**31 ahead, so a forged far-ahead number reads as an old one."""
    return 0 < ((step - than) & 0xFFFFFFFF) < 0x80000000


def wire_size(message: Message) -> int:
    """Bytes on the wire: header plus payload."""
    return HEADER_BYTES + message.payload.nbytes  # nbytes: whatever the dtype


def decode(data: bytes, mesh: int | None = None,
           max_payload: int = MAX_PAYLOAD_BYTES) -> Message:
    """Parse and validate wire bytes; raises CodecError naming what is wrong."""
    if len(data) < HEADER_BYTES:
        raise CodecError(CodecReason.TRUNCATED, f"truncated message: {len(data)} bytes, "
                                                f"header alone is {HEADER_BYTES}")
    if len(data) - HEADER_BYTES > max_payload:
        raise CodecError(CodecReason.OVERSIZED, f"oversized message: {len(data)} bytes")
    (magic, version, kind, mesh_id, step, layer, phase, sr, sc, dr, dc, seq, dtype, ndim,
     session, *dims, crc) = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(CodecReason.BAD_MAGIC, "not a meshdl message (bad magic)")
    if version != PROTOCOL_VERSION:
        raise CodecError(CodecReason.VERSION, f"protocol version {version}, this node "
                                              f"speaks {PROTOCOL_VERSION}")
    if ndim > MAX_DIMS or any(dims[ndim:]):
        raise CodecError(CodecReason.BAD_SHAPE, f"bad shape: ndim {ndim}, dims {dims}")
    try:
        header = _validate_header((version, kind, mesh_id, step, layer, phase, (sr, sc),
                                   (dr, dc), seq, dtype, tuple(dims[:ndim]), session))
    except ValidationError as exc:
        raise CodecError(CodecReason.INVALID_HEADER,
                         f"invalid header: {_first_error(exc)}") from None
    if mesh is not None and header.mesh != mesh:
        raise CodecError(CodecReason.OTHER_MESH,
                         f"message of mesh {header.mesh}, this is mesh {mesh}")
    size = len(data) - HEADER_BYTES
    expected = payload_bytes(header)
    if size != expected:
        raise CodecError(CodecReason.PAYLOAD_SIZE,
                         f"payload of {size} bytes, shape {header.shape} needs {expected}")
    view = memoryview(data)
    if zlib.crc32(view[HEADER_BYTES:], zlib.crc32(view[: _FIELDS.size])) != crc:
        raise CodecError(CodecReason.CHECKSUM, "checksum mismatch (corrupted in transit)")
    flat = np.frombuffer(data, DTYPES[dtype], offset=HEADER_BYTES)
    if not flat.flags.aligned:  # bytes at an odd address (a slice of a larger buffer)
        flat = flat.copy()
        flat.setflags(write=False)
    if dtype == FLOAT32 and not all_finite(flat):
        raise CodecError(CodecReason.NOT_FINITE, "payload holds NaN or inf")
    return Message(header, flat.reshape(header.shape))


def _first_error(exc: ValidationError) -> str:
    """'kind: Input should be 1, 2, ...' from pydantic's report on a header tuple."""
    first = exc.errors()[0]
    loc = list(first["loc"])
    if loc and isinstance(loc[0], int) and loc[0] < len(Header._fields):
        loc[0] = Header._fields[loc[0]]
    return f"{'.'.join(str(p) for p in loc)}: {first['msg']}"
