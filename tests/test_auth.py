"""Message authentication (meshdl/protocol/auth.py): link tags, the edge's signatures, key files.

A mesh with `auth` on trains exactly as central training does; a hostile node holding
one cell's keys forges copies of everybody else's messages and changes nothing; every
tag and signature is counted in the ledger's bytes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshdl import ModelConfig
from meshdl.errors import CodecError, CodecReason, MeshdlError, UsageError
from meshdl.protocol.auth import (
    LINK_TAG_BYTES,
    REPAIR_TAG_BYTES,
    SIGNATURE_BYTES,
    Authenticator,
    Keyring,
    MeshKeys,
    SealError,
    authenticator_for,
)
from meshdl.protocol.messages import ALL, EDGE, HEADER_BYTES, Kind, encode, make
from meshdl.protocol.payloads import REPAIR
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.wire import Wire
from meshdl.sim.faults.chaos import Chaos
from tests.test_mesh import _assert_lockstep

CONFIG = ModelConfig(rows=4, cols=5, kernel=3, filters=3, hidden=8)
SPEC = MeshSpec(3, CONFIG, auth=True)
KEYS = MeshKeys.from_seed(7)


def _auth(*parties) -> Authenticator:
    return Authenticator(KEYS.keyring(SPEC, list(parties)))


def _halo(src=(1, 1), dst=(1, 2), value: float = 1.0):
    return make(Kind.HALO, SPEC.mesh_id, 5, src, dst, np.full((1, 1, 2), value, np.float32),
                layer=1, session=9)


def _params(src=EDGE, dst=ALL, phase: int = 0, step: int = 5, value: float = 1.0,
            session: int = 9):
    return make(Kind.PARAMS, SPEC.mesh_id, step, src, dst,
                np.full(SPEC.params_size, value, np.float32), phase=phase, session=session)


def test_a_link_message_opens_only_for_its_own_link_key() -> None:
    sender, receiver = _auth((1, 1)), _auth((1, 2))
    data = sender.seal(_halo())
    assert len(data) == HEADER_BYTES + 8 + LINK_TAG_BYTES
    assert receiver.open(data).payload.tolist() == [[[1.0, 1.0]]]
    # (2, 2) holds keys of its own links only: it cannot speak for (1, 1) ...
    with pytest.raises(MeshdlError, match="no key for the link r1c1-r1c2"):
        _auth((2, 2)).seal(_halo())
    # ... and a message in (1, 1)'s name tagged with a key (2, 2) holds does not verify.
    body = sender.seal(_halo(value=2.0))[:-LINK_TAG_BYTES]
    own_key = KEYS.link_key(SPEC.mesh_id, (2, 2), (1, 2))
    with pytest.raises(CodecError) as excinfo:
        receiver.open(body + Authenticator._tag(own_key, body))
    assert excinfo.value.reason == CodecReason.FORGED
    with pytest.raises(CodecError) as excinfo:  # nor does a damaged tag
        receiver.open(data[:-1] + bytes([data[-1] ^ 1]))
    assert excinfo.value.reason == CodecReason.FORGED


def test_only_the_edge_signs_parameters_and_a_relay_forwards_its_signature() -> None:
    edge, parent, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))
    signed = edge.seal(_params(EDGE, (0, 0)))
    assert len(signed) == HEADER_BYTES + 4 * SPEC.params_size + SIGNATURE_BYTES
    received = parent.open(signed)
    relayed = parent.seal(_params((0, 0), (1, 0)))  # what the node machine sends on
    assert np.array_equal(child.open(relayed).payload, received.payload)
    # A node cannot start a wave of its own: it has no signature for it ...
    with pytest.raises(MeshdlError, match="only the edge can start a wave"):
        _auth((2, 2)).seal(make(Kind.PARAMS, SPEC.mesh_id, 6, (2, 2), (3, 2),
                                np.ones(SPEC.params_size, np.float32), session=9))
    # ... and other parameters under the edge's signature do not verify (the forger
    # encodes them properly, checksum included: only the signature is wrong).
    other = make(Kind.PARAMS, SPEC.mesh_id, 5, EDGE, (0, 0),
                 np.full(SPEC.params_size, 2.0, np.float32), session=9)
    with pytest.raises(CodecError) as excinfo:
        child.open(encode(other) + signed[-SIGNATURE_BYTES:])
    assert excinfo.value.reason == CodecReason.FORGED


def test_a_repair_carries_the_edges_signature_and_the_tag_of_its_one_link() -> None:
    """The edge repairs the cell it is linked to, which repairs its child in turn: each
    repair is the wave's signature plus its link's tag (16 bytes more than the wave's
    PARAMS, which are unchanged)."""
    edge, near, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))
    assert len(edge.seal(_params())) == HEADER_BYTES + 4 * SPEC.params_size + SIGNATURE_BYTES
    repair = edge.seal(_params(EDGE, (0, 0), REPAIR))
    assert len(repair) == HEADER_BYTES + 4 * SPEC.params_size + REPAIR_TAG_BYTES
    assert near.open(repair).header.phase == REPAIR
    onward = near.seal(_params((0, 0), (1, 0), REPAIR))  # from its own verified copy
    assert child.open(onward).header.src == (0, 0)


def test_signed_params_re_sent_as_a_repair_or_to_another_cell_are_rejected_and_counted(
        ) -> None:
    """The edge's signature covered neither phase, sender nor receiver, so a captured
    wave's PARAMS (old parameters, say) re-sent as a repair from a cell's parent
    verified, and so did a repair re-addressed to another cell."""
    edge, near, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))
    old_wave = edge.seal(_params(step=4, value=2.0))  # a wave's PARAMS, captured
    signature = old_wave[-SIGNATURE_BYTES:]
    as_repair = encode(_params((0, 0), (1, 0), REPAIR, step=4, value=2.0))
    near.open(edge.seal(_params()))  # the wave `near` verified: its repairs carry it
    repair = near.seal(_params((0, 0), (1, 0), REPAIR))
    readdressed = encode(_params((0, 0), (0, 1), REPAIR)) + repair[-REPAIR_TAG_BYTES:]
    sibling = _auth((0, 1))
    wire, stats = Wire(SPEC.mesh_id, child), Counter()
    for forged in (as_repair + signature,  # the wave's signature alone
                   as_repair + signature + bytes(LINK_TAG_BYTES),  # and a made-up tag
                   as_repair + signature + repair[-LINK_TAG_BYTES:]):  # another's tag
        assert wire.receive(forged, stats) is None
    assert Wire(SPEC.mesh_id, sibling).receive(readdressed, stats) is None
    # The wave's signature alone is 16 bytes short of a repair's tags: what is left of
    # the payload no longer matches its shape. Every other one fails its link tag.
    assert stats == {"rejected:codec:payload_size": 1, "rejected:codec:forged": 3}, stats
    # A wave's signature does not cover another phase either.
    other_phase = encode(_params(phase=2, step=4, value=2.0)) + signature
    with pytest.raises(CodecError) as excinfo:
        child.open(other_phase)
    assert excinfo.value.reason == CodecReason.FORGED
    assert wire.receive(repair, stats) is not None  # the genuine repair opens


def test_replayed_signed_messages_do_not_push_out_the_signature_a_repair_needs() -> None:
    """Any login that reads the edge's broadcasts can replay them to a node, and they
    verify. Eight of them pushed the signature of the parameters the node cached out of
    its relay's memory, and its next repair could not be sealed (the node host's send
    raised). Older waves' replays now drop themselves."""
    edge, near, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))
    near.open(edge.seal(_params(step=100)))  # the parameters `near` caches
    for step in range(80, 100):  # captured earlier, replayed on a topic `near` reads
        near.open(edge.seal(make(Kind.BATCH, SPEC.mesh_id, step, EDGE, ALL,
                                 np.zeros(3, np.int32), session=9)))
        near.open(edge.seal(_params(step=step)))
    near.open(edge.seal(_params(step=101)))  # the edge's own resends of later slots
    near.open(edge.seal(_params(step=102)))
    repair = near.seal(_params((0, 0), (1, 0), REPAIR, step=100))
    assert child.open(repair).header.step == 100


def test_a_repair_of_the_cached_parameters_is_sealed_after_the_edge_resent_later_slots(
        ) -> None:
    """A node caches the first PARAMS of a run of slots (step 100) and counts the edge's
    resends of slots it began on its own (110 .. 140) as duplicates, while its relay
    memory keeps the newest waves only: the signature of step 100 was dropped and the
    next repair could not be sealed. The one pinned for the cached version stays."""
    edge, near, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))
    near.open(edge.seal(_params(step=100)))
    near.pin(Kind.PARAMS, [(9, 100)])  # what the node host does once its cell cached it
    for step in (110, 120, 130, 140):
        near.open(edge.seal(_params(step=step)))
    repair = near.seal(_params((0, 0), (1, 0), REPAIR, step=100))
    assert child.open(repair).header.step == 100
    # Without the pin, the same sequence leaves nothing to seal the repair with: a
    # SealError naming why (the node host counts it and drops that one message).
    unpinned = _auth((0, 0))
    for step in (100, 110, 120, 130, 140):
        unpinned.open(edge.seal(_params(step=step)))
    with pytest.raises(SealError, match="no edge signature for PARAMS of wave 100") as caught:
        unpinned.seal(_params((0, 0), (1, 0), REPAIR, step=100))
    assert caught.value.reason == "no_signature"
    # A pin holds only while the version stays cached: the next pin replaces it.
    near.pin(Kind.PARAMS, [(9, 140)])
    assert child.open(near.seal(_params((0, 0), (1, 0), REPAIR, step=140))).header.step == 140
    with pytest.raises(SealError):
        near.seal(_params((0, 0), (1, 0), REPAIR, step=100))


def test_replays_of_older_edge_sessions_do_not_push_out_the_current_sessions_signatures(
        ) -> None:
    """A stolen neighbour login may publish signed PARAMS and BATCH of earlier edge
    sessions, which verify. The memory kept the most recently heard sessions, so the
    replays of the three this relay heard before the current one, and one more, pushed
    the current session's signature out; it now drops the session first heard longest
    ago, and hearing an old one again does not make it newer. (Replays of many more
    sessions it never heard still push the current one out of this memory: a repair's
    signature is pinned apart, and `Session.send` drops what it cannot seal.)"""
    edge, near, child = _auth(EDGE), _auth((0, 0)), _auth((1, 0))

    def captured(session: int) -> list[bytes]:
        return [edge.seal(_params(step=7, session=session)),
                edge.seal(make(Kind.BATCH, SPEC.mesh_id, 7, EDGE, ALL,
                               np.zeros(3, np.int32), session=session))]

    for session in (20, 21, 22):  # heard when those edge runs were live
        for data in captured(session):
            near.open(data)
    near.open(edge.seal(_params(step=100)))  # the current edge session, 9
    near.open(edge.seal(make(Kind.BATCH, SPEC.mesh_id, 100, EDGE, ALL,
                             np.zeros(3, np.int32), session=9)))
    for session in (20, 21, 22, 20, 21, 22, 23):  # replayed, and one never heard
        for data in captured(session):
            near.open(data)
    relayed = near.seal(_params((0, 0), (1, 0), step=100))  # a relay's wave PARAMS
    assert child.open(relayed).header.session == 9


def test_a_mesh_with_authentication_trains_exactly_as_central_training() -> None:
    for params_via in ("tree", "broadcast"):
        engine = _assert_lockstep(CONFIG, (0, 0), batch=3, steps=2, optimizer="sgd",
                                  auth=True, params_via=params_via)
        assert engine.mesh is not None and not engine.mesh.codec_errors


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(forger=st.sampled_from([(0, 0), (1, 1), (3, 4), (2, 0)]),
       seed=st.integers(0, 2 ** 16), params_via=st.sampled_from(["tree", "broadcast"]))
def test_messages_forged_without_the_senders_key_never_change_a_result(
        forger, seed, params_via) -> None:
    """A hostile node holds `forger`'s keys and sends, next to half of all messages of
    every kind, a copy with one value changed (a feature, a parameter, a sample index),
    for this wave or a later one, tagged with its own link keys or signed with a key of
    its own: every parameter still equals central training's after every step."""
    chaos = Chaos(seed=seed, forge=0.5, forger_cell=forger)
    engine = _assert_lockstep(CONFIG, (0, 0), batch=3, steps=2, optimizer="sgd",
                              auth=True, chaos=chaos, params_via=params_via)
    assert engine.mesh is not None
    forged = sum(n for k, n in engine.mesh.node_stats().items() if k.endswith(":forged"))
    forged += engine.mesh.edge.stats["rejected:codec:forged"]
    assert forged > 0


def test_tags_and_signatures_are_counted_in_the_ledger_bytes() -> None:
    plain = _assert_lockstep(CONFIG, (0, 0), batch=3, steps=1, optimizer="sgd").report()
    signed = _assert_lockstep(CONFIG, (0, 0), batch=3, steps=1, optimizer="sgd",
                              auth=True).report()
    for name, counts in plain["classes"].items():
        tag = SIGNATURE_BYTES if name == "params" else LINK_TAG_BYTES
        assert signed["classes"][name]["messages"] == counts["messages"]
        assert signed["classes"][name]["bytes"] == counts["bytes"] + tag * counts["messages"]
        radio = counts["broadcast"]
        assert signed["classes"][name]["broadcast"]["bytes"] == \
            radio["bytes"] + tag * radio["transmissions"]


def test_key_files_round_trip_and_a_damaged_one_is_a_clear_error(tmp_path) -> None:
    ring = KEYS.keyring(SPEC, [(1, 1), (1, 2)])
    path = tmp_path / "host.keys.json"
    path.write_text(ring.to_json())
    assert Keyring.load(path) == ring
    assert authenticator_for(SPEC, [(1, 1), (1, 2)], path, True) is not None
    with pytest.raises(UsageError, match="no key for the link"):
        authenticator_for(SPEC, [(3, 3)], path, True)
    edge_link_only = KEYS.keyring(SPEC, [(0, 0)])  # has the edge's link, not its key
    (tmp_path / "edge.keys.json").write_text(edge_link_only.to_json())
    with pytest.raises(UsageError, match="not the edge's key file"):
        authenticator_for(SPEC, [EDGE], tmp_path / "edge.keys.json", True)
    path.write_text(ring.to_json().replace('"mesh_id": 3', '"mesh_id": "x"'))
    with pytest.raises(MeshdlError, match="not a meshdl key file"):
        Keyring.load(path)
    with pytest.raises(UsageError, match="give this process its key file"):
        authenticator_for(SPEC, [(1, 1)], None, True)
    assert authenticator_for(SPEC, [(1, 1)], None, False) is None



def test_status_records_verify_only_for_the_writer_of_every_cell_they_claim() -> None:
    host, edge = _auth((1, 1), (1, 2)), _auth(EDGE)
    claim = {"role": "node-host", "state": "online", "mesh": 3, "time": 1.5,
             "cells": ["r1c1", "r1c2"]}
    signed = host.sign_status(claim)
    assert edge.verify_status(signed)
    assert not edge.verify_status(claim)  # no tag
    assert not edge.verify_status({**signed, "time": 2.5})  # changed after signing
    assert not edge.verify_status({**signed, "cells": ["r1c1", "r1c2", "r2c2"]})
    with pytest.raises(MeshdlError, match="no status key for r2c2"):
        host.sign_status({**claim, "cells": ["r2c2"]})  # a cell it does not serve
    lease = {"role": "edge", "state": "online", "mesh": 3, "session": 4, "since": 1.0}
    assert edge.verify_status(edge.sign_status(lease))
    with pytest.raises(MeshdlError, match="only the edge signs"):
        host.sign_status(lease)
    forged = {**lease, "tag": host.sign_status({**claim})["tag"]}
    assert not edge.verify_status(forged)
