"""The compact header (meshdl/protocol/compact.py): every message of real waves comes back
from its 6 bytes, the MAC frame's addresses and the receiver's plan exactly as sent
(seq aside, which the MAC numbers itself); steps wrap as serial numbers over 16 bits;
what 5 layer bits and 3 version bits cannot say is refused or cut as documented; payloads
6 bytes in come back aligned; malformed bytes are refused by reason; and a mesh with
compact headers sends, counts and simulates 42 bytes less per message, its values
unchanged."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshdl.config import DataConfig, ModelConfig
from meshdl.data.lounge import generate_lounge
from meshdl.edge.agent import WaveResult
from meshdl.errors import CodecError, CodecReason, UsageError
from meshdl.model.cnn import CNN
from meshdl.protocol.accounting import Ledger, class_name
from meshdl.protocol.compact import (
    ANY,
    COMPACT_HEADER_BYTES,
    MAX_LAYER,
    MAX_STEP_GAP,
    CompactContext,
    cell_at,
    decode_compact,
    encode_compact,
    read_compact_header,
    short_address,
)
from meshdl.protocol.messages import ALL, EDGE, HEADER_BYTES, SERVER, Kind, Message, make
from meshdl.protocol.spec import MeshSpec, Mode, Split, expected_shape, plan_shapes
from meshdl.sim.mesh import VirtualMesh
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh
from tests.helpers import recorded_sends

CONFIG = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=8)
BATCH = 2
SAVED = HEADER_BYTES - COMPACT_HEADER_BYTES  # per message


def _data():
    return generate_lounge(DataConfig(rows=CONFIG.rows, cols=CONFIG.cols, train=16, test=4,
                                      seed=1))


def _wave_messages(spec: MeshSpec, mode: Mode) -> list[Message]:
    """Every message one wave of `mode` sends in the virtual mesh, as it was sent."""
    data = _data()
    mesh = VirtualMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                       CNN(CONFIG, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test})
    sent = recorded_sends(mesh)
    mesh.run_wave(mode, Split.TRAIN, np.arange(BATCH))
    return sent


def _context(spec: MeshSpec, message: Message, step: int | None = None) -> CompactContext:
    """What the receiver of `message` knows: the MAC frame's PAN id and short addresses,
    its own wave (by default the message's: a wave's PARAMS find the wave before) and
    its plan's shapes."""
    h, cols = message.header, spec.model.cols
    if step is None:
        step = h.step - 1 if h.kind in (Kind.PARAMS, Kind.BATCH) else h.step
    src, dst = (cell_at(short_address(cell, cols), cols) for cell in (h.src, h.dst))
    return CompactContext(spec.mesh_id, src, dst, step, h.session,
                          plan_shapes(spec, dst, BATCH))


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize("settings", [
    {"params_via": "tree"},
    {"params_via": "broadcast"},
    {"activations": "int8", "compress": "2bit"},  # compressed payloads: dtype bytes
    {"compress": "intsum"},
])
@pytest.mark.parametrize("mode", [Mode.TRAIN, Mode.INFER])
def test_every_message_of_a_wave_comes_back_from_the_compact_header(settings, mode) -> None:
    spec = MeshSpec(3, CONFIG, **settings)
    messages = _wave_messages(spec, mode)
    kinds = Counter(Kind(m.header.kind) for m in messages)
    assert kinds[Kind.HALO] > 0 and kinds[Kind.PARAMS] > 0 and kinds[Kind.GATHER] > 0
    assert (kinds[Kind.REDUCE] > 0) == (mode == Mode.TRAIN)
    for message in messages:
        data = encode_compact(message)
        assert len(data) == COMPACT_HEADER_BYTES + message.payload.nbytes
        back = decode_compact(data, _context(spec, message))
        assert back.header == message.header._replace(seq=0)
        assert back.payload.dtype == message.payload.dtype
        assert back.payload.tobytes() == message.payload.tobytes()


def test_the_compact_header_is_6_bytes() -> None:
    assert COMPACT_HEADER_BYTES == 6
    assert SAVED == 42


def test_the_header_carries_the_parameter_versions_low_3_bits_beside_the_layer() -> None:
    params = make(Kind.PARAMS, 3, 7, EDGE, (0, 0), np.arange(5, dtype=np.float32), session=9)
    plain = read_compact_header(encode_compact(params))
    for version, low in ((7, 7), (8, 0), (201, 201 % 8), (2**40 + 5, 5)):
        header = read_compact_header(encode_compact(params, version=version))
        assert header.version == low
        assert header._replace(version=0) == plain  # nothing else moved
    # The version's bits sit above the layer's: the highest layer keeps the highest version.
    top = read_compact_header(encode_compact(params._replace(
        header=params.header._replace(layer=MAX_LAYER)), version=7))
    assert (top.layer, top.version) == (31, 7)
    assert encode_compact(params, version=5)[1] == 5 << 5  # layer 0 in bits 0-4


def test_a_payload_6_bytes_in_comes_back_aligned_and_read_only() -> None:
    spec, message = _halo(7)
    data = encode_compact(message)
    # CPython keeps a bytes object's data 16-byte aligned, so its float32s 6 bytes in are not.
    assert np.frombuffer(data, np.float32, offset=COMPACT_HEADER_BYTES).flags.aligned is False
    back = decode_compact(data, _context(spec, message))
    assert back.payload.flags.aligned and not back.payload.flags.writeable
    assert back.payload.tobytes() == message.payload.tobytes()


def test_every_party_has_a_short_address_and_back() -> None:
    cols = 25
    parties = [(r, c) for r in range(17) for c in range(cols)] + [EDGE, ALL]
    addresses = [short_address(cell, cols) for cell in parties]
    assert len(set(addresses)) == len(parties)
    assert short_address(ALL, cols) == 0xFFFF  # 802.15.4's broadcast address
    assert 0xFFFE not in addresses  # "no short address"
    assert [cell_at(a, cols) for a in addresses] == parties
    with pytest.raises(ValueError):
        short_address(SERVER, cols)  # on the backhaul, not on the radio
    with pytest.raises(ValueError):
        cell_at(0xFFFE, cols)


def test_the_plan_gives_each_receiver_its_shapes() -> None:
    spec = MeshSpec(1, CONFIG)
    for dst, inbox in spec.expects.items():
        for key, send in inbox.items():
            assert expected_shape(spec, dst, key, BATCH) == \
                (len(send.items), *spec.item_shape(send.field, BATCH))
    child = spec.topology.children[(0, 0)][0]
    assert expected_shape(spec, (0, 0), (Kind.REDUCE, 0, 0, child), BATCH) == (spec.conv_size,)
    assert expected_shape(spec, (0, 0), (Kind.PARAMS, 0, 0, EDGE), BATCH) == (ANY,)
    assert expected_shape(spec, (0, 0), (Kind.PARAMS, 0, 0, child), BATCH) is None
    assert expected_shape(spec, (0, 0), (Kind.HALO, 1, 0, (3, 4)), BATCH) is None
    assert spec.topology.parent[(0, 1)] != (1, 1)
    assert expected_shape(spec, (1, 1), (Kind.HEALTH, 0, 0, (0, 1)), BATCH) == (ANY,)  # hello
    assert expected_shape(spec, (1, 1), (Kind.HEALTH, 0, 0, (0, 3)), BATCH) is None


# ------------------------------------------------------------------ steps
def _halo(step: int, session: int = 5) -> tuple[MeshSpec, Message]:
    spec = MeshSpec(1, CONFIG)
    (key, send), *_ = spec.expects[(0, 1)].items()
    kind, layer, phase, src = key
    values = np.ones((len(send.items), *spec.item_shape(send.field, BATCH)), np.float32)
    return spec, make(kind, 1, step, src, (0, 1), values, layer, phase, session=session)


@pytest.mark.parametrize(("sent", "current"), [
    (0x102, 0xFF), (0xFF, 0x101),  # across 2**8: within the low bits
    (0x10002, 0xFFFF), (0xFFFE, 0x10003),  # across 2**16: the low bits wrap
    (0x3FFFF, 0x40000 + MAX_STEP_GAP - 1),  # as far back as allowed, across 2**18
    (1, 0xFFFFFFFF), (0xFFFFFFFE, 2),  # across 2**32: the step itself wraps
    (MAX_STEP_GAP - 1, 0xFFFFFFFF),  # as far ahead as allowed, across 2**32
])
def test_a_step_is_widened_back_across_wraps(sent, current) -> None:
    spec, message = _halo(sent)
    back = decode_compact(encode_compact(message), _context(spec, message, current))
    assert back.header.step == sent


@given(st.integers(0, 0xFFFFFFFF), st.integers(-MAX_STEP_GAP, MAX_STEP_GAP))
def test_any_step_within_the_gap_of_the_receivers_comes_back(sent, gap) -> None:
    spec, message = _halo(sent)
    current = (sent - gap) & 0xFFFFFFFF
    back = decode_compact(encode_compact(message), _context(spec, message, current))
    assert back.header.step == sent


def test_a_step_too_far_from_the_receivers_is_refused_in_its_session() -> None:
    spec, message = _halo(5_000_000)
    data = encode_compact(message)
    near = 5_000_000 - MAX_STEP_GAP
    assert decode_compact(data, _context(spec, message, near)).header.step == 5_000_000
    with pytest.raises(CodecError) as refused:
        decode_compact(data, _context(spec, message, near - 1))
    assert refused.value.reason == CodecReason.INVALID_HEADER
    ahead = 5_000_000 + MAX_STEP_GAP  # ... either way
    assert decode_compact(data, _context(spec, message, ahead)).header.step == 5_000_000
    with pytest.raises(CodecError):
        decode_compact(data, _context(spec, message, ahead + 1))
    # Another session (an edge that restarted) starts wherever its edge says: only the
    # step's low 16 bits are its edge's, the rest the receiver's.
    far = 5_000_000 + 40_000
    other = _context(spec, message, far)._replace(session=6)
    step = decode_compact(data, other).header.step
    assert step % (1 << 16) == 5_000_000 % (1 << 16) and step != 5_000_000


# ------------------------------------------------------------------ refusals
def _refused(data: bytes, context: CompactContext) -> CodecReason:
    with pytest.raises(CodecError) as refused:
        decode_compact(data, context)
    return refused.value.reason


def test_malformed_bytes_are_refused_by_reason() -> None:
    spec, message = _halo(7)
    data, context = encode_compact(message), _context(spec, message)
    assert decode_compact(data, context).header == message.header
    assert _refused(data[:COMPACT_HEADER_BYTES - 1], context) == CodecReason.TRUNCATED
    assert _refused(data[:-1], context) == CodecReason.PAYLOAD_SIZE
    assert _refused(data + b"\0", context) == CodecReason.PAYLOAD_SIZE
    assert _refused(data[:-4], context) == CodecReason.PAYLOAD_SIZE  # a value short
    nan = bytearray(data)
    nan[COMPACT_HEADER_BYTES:COMPACT_HEADER_BYTES + 4] = np.float32(np.nan).tobytes()
    assert _refused(bytes(nan), context) == CodecReason.NOT_FINITE
    for first in (data[0] & 0xF0,  # kind 0
                  data[0] & 0xF0 | 13,  # kind 13
                  data[0] | 0x30,  # dtype 3
                  data[0] | 0x80):  # the reserved bit
        assert _refused(bytes([first]) + data[1:], context) == CodecReason.INVALID_HEADER
    other_layer = data[:1] + bytes([9]) + data[2:]  # a message the plan does not have
    assert _refused(other_layer, context) == CodecReason.INVALID_HEADER
    assert _refused(data, context._replace(src=(3, 4))) == CodecReason.INVALID_HEADER
    assert _refused(data, context._replace(shapes={})) == CodecReason.INVALID_HEADER
    assert _refused(data, context._replace(step=7 + MAX_STEP_GAP + 1)) == \
        CodecReason.INVALID_HEADER


def test_a_length_the_frame_gives_must_be_whole_values() -> None:
    batch = make(Kind.BATCH, 1, 3, EDGE, (0, 0), np.array([1, 0, 4, 9], np.int32))
    spec = MeshSpec(1, CONFIG)
    context = _context(spec, batch)
    data = encode_compact(batch)
    assert decode_compact(data, context).payload.tolist() == [1, 0, 4, 9]
    assert _refused(data[:-1], context) == CodecReason.PAYLOAD_SIZE


def test_what_the_compact_form_cannot_say_is_not_encoded() -> None:
    _, message = _halo(1)
    with pytest.raises(ValueError):
        encode_compact(message._replace(header=message.header._replace(phase=2)))
    encode_compact(message._replace(header=message.header._replace(layer=31)))
    for layer in (32, 255):  # 5 bits: 32 would read back as layer 0
        with pytest.raises(ValueError, match="layer"):
            encode_compact(message._replace(header=message.header._replace(layer=layer)))
    with pytest.raises(ValueError):
        encode_compact(message, version=-1)


# ------------------------------------------------------------------ the spec
def test_a_mesh_spec_says_its_header_and_keeps_it_when_replanned() -> None:
    full = MeshSpec(1, CONFIG, (0, 0), "tree")  # positional construction: full headers
    compact = MeshSpec(1, CONFIG, (0, 0), "tree", header="compact")
    assert full.header == "full" and full.overhead(Kind.HALO) == HEADER_BYTES
    assert compact.overhead(Kind.HALO) == COMPACT_HEADER_BYTES
    assert full.overhead(Kind.HALO, "compact") == COMPACT_HEADER_BYTES
    signed = MeshSpec(1, CONFIG, auth=True, header="compact")
    assert signed.overhead(Kind.HALO) == COMPACT_HEADER_BYTES + 16  # link tag
    assert signed.overhead(Kind.PARAMS) == COMPACT_HEADER_BYTES + 64  # edge's signature
    replanned = compact.replanned((0, 1), frozenset({(3, 4)}))
    assert replanned.header == "compact" and replanned.dead == frozenset({(3, 4)})
    assert full.differences(compact.summary) == ["header compact (here full)"]
    with pytest.raises(UsageError):
        MeshSpec(1, CONFIG, header="tiny")


# ------------------------------------------------------------------ counting
def test_the_ledger_counts_both_encodings() -> None:
    spec = MeshSpec(1, CONFIG)
    ledger = Ledger(spec)
    for message in _wave_messages(spec, Mode.TRAIN):
        ledger.record(message)
    report = ledger.report()
    for name, c in report["classes"].items():
        assert c["compact_bytes"] == c["bytes"] - SAVED * c["messages"], name
        b = c["broadcast"]
        assert b["compact_bytes"] == b["bytes"] - SAVED * b["transmissions"], name
    assert report["total_compact_bytes"] == \
        report["total_bytes"] - SAVED * report["total_messages"]
    assert report["broadcast_compact_bytes"] == \
        report["broadcast_bytes"] - SAVED * report["broadcast_transmissions"]
    compact = Ledger(MeshSpec(1, CONFIG, header="compact"))
    for message in _wave_messages(spec, Mode.TRAIN):
        compact.record(message)
    counted = compact.report()
    assert counted["total_bytes"] == counted["total_compact_bytes"] == \
        report["total_compact_bytes"]


def _timed_wave(header: str, mode: Mode) -> tuple[TimedMesh, WaveResult]:
    data = _data()
    spec = MeshSpec(1, CONFIG, (0, 0), "tree", header=header)
    mesh = TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(CONFIG, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     trace=True)
    return mesh, mesh.run_wave(mode, Split.TRAIN, np.arange(BATCH))


@pytest.mark.parametrize("mode", [Mode.INFER, Mode.TRAIN])
def test_the_simulated_radio_sends_42_bytes_less_per_transmission(mode) -> None:
    (full, full_result), (compact, compact_result) = (_timed_wave("full", mode),
                                                      _timed_wave("compact", mode))
    sent = {}
    for name, mesh in (("full", full), ("compact", compact)):
        transmissions = Counter((s.src, s.receivers, s.kind, s.layer, s.broadcast)
                                for s in mesh.trace)
        size, count = Counter(), Counter()
        for s in mesh.trace:
            size[class_name(s.kind, s.layer)] += s.size
            count[class_name(s.kind, s.layer)] += 1
        sent[name] = (transmissions, size, count)
    assert sent["full"][0] == sent["compact"][0]  # the same transmissions ...
    (_, full_size, count), (_, compact_size, _) = sent["full"], sent["compact"]
    assert set(full_size) >= {"params", "halo/conv1", "gather"}
    for name in full_size:  # ... each 42 bytes lighter
        assert compact_size[name] == full_size[name] - SAVED * count[name], name
    assert compact.queue.now < full.queue.now  # and the wave is over sooner
    assert compact_result.logits.tobytes() == full_result.logits.tobytes()  # the values
    if mode == Mode.TRAIN:
        assert compact_result.grads.tobytes() == full_result.grads.tobytes()
