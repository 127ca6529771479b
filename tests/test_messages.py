"""The binary codec: round trips, and every malformed input is a typed CodecError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.errors import CodecError
from meshdl.protocol.messages import EDGE, HEADER_BYTES, Kind, decode, encode, make, wire_size


def _message(payload=None, **kw):
    values = np.arange(30, dtype=np.float32).reshape(2, 3, 5) if payload is None else payload
    args = {"kind": Kind.HALO, "mesh": 7, "step": 3, "src": (0, 1), "dst": (0, 2),
            "layer": 1, "phase": 1, "seq": 9, **kw}
    return make(args.pop("kind"), args.pop("mesh"), args.pop("step"), args.pop("src"),
                args.pop("dst"), values, **args)


def test_round_trip_keeps_header_and_array() -> None:
    message = _message()
    data = encode(message)
    assert len(data) == wire_size(message) == HEADER_BYTES + 30 * 4
    back = decode(data, mesh=7)
    assert back.header == message.header
    np.testing.assert_array_equal(back.payload, message.payload)


def test_int32_payloads_and_the_edge_address_round_trip() -> None:
    message = make(Kind.BATCH, 1, 1, EDGE, (0, 0), np.array([0, 1, 5, 9], np.int32))
    back = decode(encode(message))
    assert back.header.src == EDGE
    assert back.payload.dtype == np.int32
    np.testing.assert_array_equal(back.payload, [0, 1, 5, 9])


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda b: b[:20], "truncated"),
    (lambda b: b[:-4], "payload of"),
    (lambda b: b + b"\0\0\0\0", "payload of"),
    (lambda b: b"XY" + b[2:], "magic"),
    (lambda b: b[:2] + bytes([1]) + b[3:], "version"),
    (lambda b: b[:3] + bytes([200]) + b[4:], "kind"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), "checksum"),
])
def test_malformed_messages_raise_codec_error(mutate, needle) -> None:
    with pytest.raises(CodecError, match=needle):
        decode(mutate(encode(_message())))


def test_other_mesh_oversized_and_nan_payloads_are_refused() -> None:
    with pytest.raises(CodecError, match="mesh"):
        decode(encode(_message()), mesh=8)
    with pytest.raises(CodecError, match="oversized"):
        decode(encode(_message()), max_payload=16)
    with pytest.raises(CodecError, match="NaN"):
        decode(encode(_message(np.array([1.0, np.nan], np.float32))))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_decode_into_anything_but_codec_error(data: bytes) -> None:
    try:
        decode(data)
    except CodecError:
        return


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=HEADER_BYTES + 120), st.integers(0, HEADER_BYTES + 119))
def test_any_bit_flip_in_a_real_message_is_caught(noise: bytes, where: int) -> None:
    data = bytearray(encode(_message()))
    where %= len(data)
    data[where] ^= noise[0] or 1
    try:
        back = decode(bytes(data))
    except CodecError:
        return
    pytest.fail(f"a flipped bit at byte {where} went unnoticed: {back.header}")
