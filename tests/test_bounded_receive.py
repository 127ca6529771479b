"""Hostile input costs a receiver a bounded amount of work and memory.

- A status record claiming one cell tens of thousands of times is refused by the edge
  with work bounded by the grid: the body is hashed once, never once per claim.
- What a connection has received but not handled yet is bounded in messages and bytes,
  per sender and in total; what does not fit is dropped and counted.
- A status publish (heartbeat, a slot's unread cells) is never awaited in the receive
  loop, and a message a host cannot seal is dropped and counted, never fatal.
- A connection that breaks while nobody awaits its read leaves no "Future exception was
  never retrieved" behind, and a wave lost that way does not send the user to look
  for missing node hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import hmac
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import aiomqtt
import numpy as np
import pytest

from meshdl.config import ModelConfig
from meshdl.edge.remote import MqttEngine
from meshdl.errors import UsageError
from meshdl.mqtt.session import BrokerAddress, InboxLimits, Session, check_client_name
from meshdl.mqtt.status import MAX_STATUS_BYTES, parse_status
from meshdl.nodes.serve import Ticker
from meshdl.protocol import auth as auth_module
from meshdl.protocol.auth import Authenticator, MeshKeys
from meshdl.protocol.messages import EDGE, Kind, make
from meshdl.protocol.payloads import REPAIR
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.wire import Wire
from meshdl.sim.faults.hostile import claim_bomb

SPEC = MeshSpec(3, ModelConfig(rows=4, cols=5), auth=True)
KEYS = MeshKeys.from_seed(7)
MiB = 1024 * 1024


class Hashed:
    """Counts the bytes every SHA-256 and HMAC-SHA256 call of meshdl.protocol.auth takes in, and
    fails at once past `budget` (so that an unbounded check does not run for seconds)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
        self.bytes, self.budget = 0, budget
        digest, sha256 = hmac.digest, hashlib.sha256

        def counted_digest(key: bytes, message: bytes, algorithm: Any) -> bytes:
            self._count(len(message))
            return digest(key, message, algorithm)

        def counted_sha256(data: bytes = b"") -> Any:
            self._count(len(data))
            return sha256(data)

        monkeypatch.setattr(auth_module.hmac, "digest", counted_digest)
        monkeypatch.setattr(auth_module.hashlib, "sha256", counted_sha256)

    def _count(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.budget:
            raise AssertionError(f"hashed more than {self.budget} bytes")


def test_a_status_claim_bomb_is_refused_after_hashing_its_body_at_most_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = claim_bomb(SPEC.mesh_id, MAX_STATUS_BYTES)
    record = json.loads(bomb)
    assert len(record["cells"]) > 32_000 and len(bomb) <= MAX_STATUS_BYTES
    edge = Authenticator(KEYS.keyring(SPEC, [EDGE]))
    cells = SPEC.model.rows * SPEC.model.cols
    # One hash of the body, then at most one short HMAC (tag + digest) per grid cell.
    hashed = Hashed(monkeypatch, budget=len(bomb) + cells * 64)
    assert not edge.verify_status(record)
    assert parse_status(bomb) is None  # a cell claimed twice: not a valid record
    # A genuine record still verifies, within the same bound.
    host = Authenticator(KEYS.keyring(SPEC, [(1, 1), (1, 2)]))
    genuine = host.sign_status({"role": "node-host", "state": "online", "mesh": 3,
                                "time": 1.5, "cells": ["r1c1", "r1c2"]})
    hashed.bytes = 0
    assert edge.verify_status(genuine)
    assert not edge.verify_status({**genuine, "cells": ["r1c1", "r1c2", "r1c1"]})
    assert parse_status(json.dumps(genuine).encode()) is not None


def _session(**options: Any) -> Session:
    return Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 3, "south", [], **options)


def test_a_connections_inbox_drops_and_counts_what_exceeds_its_bounds() -> None:
    async def fill() -> tuple[Session, Any]:
        session = _session()
        queue = session._new_client()._queue
        large = bytes(1_040_000)  # one object: the test itself holds 1 MB
        for _ in range(200):  # 200 MB from one sender
            queue.put_nowait(aiomqtt.Message("meshdl/3/r1c1/r2c1/halo", large, 0, False, 0,
                                             None))
        for i in range(50):  # then a neighbour's ordinary traffic
            queue.put_nowait(aiomqtt.Message("meshdl/3/r2c2/r2c1/halo", bytes(4000), 0,
                                             False, i, None))
        return session, queue

    session, queue = asyncio.run(fill())
    held = [m.topic.value for m in queue._queue]
    held_bytes = sum(len(m.payload) for m in queue._queue)
    assert held_bytes <= 32 * MiB, held_bytes
    # The flooding sender is cut to its share; the other sender's messages all got in.
    assert held.count("meshdl/3/r2c2/r2c1/halo") == 50
    assert held.count("meshdl/3/r1c1/r2c1/halo") <= 8
    assert session.stats["rejected:inbox_full"] == 250 - len(held)
    # What is taken out makes room again.
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(aiomqtt.Message("meshdl/3/r1c1/r2c1/halo", bytes(1_040_000), 0, False,
                                     0, None))
    assert queue.qsize() == 1


def test_a_connection_broken_while_nobody_reads_leaves_no_unretrieved_exception() -> None:
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        session = _session()
        client = session._new_client()
        # Connected, then dropped by the broker (a missed keepalive) while no read was
        # under way: aiomqtt keeps the error for a read that never comes.
        client._connected.set_result(None)
        client._on_disconnect(client._client, None, None, 7, None)
        stack = contextlib.AsyncExitStack()
        stack.push_async_exit(client)
        session._client, session._stack = client, stack
        del client, stack
        # A heartbeat's publish notices the break first: the run loop's handling.
        await session._disconnected(aiomqtt.MqttError("the broker dropped the connection"))
        gc.collect()

    asyncio.run(main())
    assert [c.get("message") for c in reported] == []


def test_a_wave_lost_to_the_edges_own_connection_drops_says_so() -> None:
    engine = MqttEngine(None, "mqtt://127.0.0.1:1")
    try:
        engine.session = SimpleNamespace(stats=Counter({"reconnects": 3}))
        engine.stats["rejected:bad_status"] = 270
        edge = SimpleNamespace(step=5, spec=SimpleNamespace(max_message_bytes=MiB))
        line = engine._no_result(edge)
    finally:
        engine.session = None
        engine.close()
    assert "are all node hosts running" not in line
    assert "dropped this edge 3 times" in line and "270 invalid status records" in line


def _servers_inbox_after(junk: int, junk_bytes: int) -> tuple[Session, Any]:
    """The parameter server's session and inbox after `junk` messages of `junk_bytes` on
    mesh 1's push topic, then 20 genuine pushes of mesh 2's."""

    async def fill() -> tuple[Session, Any]:
        session = Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 1, "ps", [])
        queue = session._new_client()._queue
        payload = bytes(junk_bytes)
        for i in range(junk):
            queue.put_nowait(aiomqtt.Message("meshdl/1/edge/ps/push", payload, 1, False,
                                             i, None))
        for i in range(20):
            queue.put_nowait(aiomqtt.Message("meshdl/2/edge/ps/push", bytes(60_000), 1,
                                             False, i, None))
        return session, queue

    return asyncio.run(fill())


def test_the_servers_inbox_gives_each_meshs_edge_its_own_share() -> None:
    # Every mesh's edge pushes as `edge`; junk from mesh 1's edge login must not fill the
    # share mesh 2's pushes arrive in (the server hears them all over one connection).
    session, queue = _servers_inbox_after(junk=100, junk_bytes=1_040_000)  # 100 MB
    held = [m.topic.value for m in queue._queue]
    assert held.count("meshdl/2/edge/ps/push") == 20
    assert held.count("meshdl/1/edge/ps/push") <= 8
    assert session.stats["rejected:inbox_full"] == 120 - len(held)


def test_a_client_name_of_60000_bytes_is_refused_in_one_usage_line() -> None:
    # MQTT takes client ids of 65,535 bytes and Mosquitto 2.0 bounds none: `nodes run
    # --name` of 60,000 bytes connected.
    with pytest.raises(UsageError, match=r"^client name of 60000 bytes: at most 128 "):
        Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 1, "x" * 60_000, [])
    with pytest.raises(UsageError, match="client name of 129 bytes"):
        check_client_name("é" * 64 + "x")  # bytes, not characters
    with pytest.raises(UsageError, match="must be non-empty without"):
        check_client_name("north/+")
    name = "host-ip-172-31-22-10.eu-west-1.compute.internal-123456"
    assert Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 1, name, []).client_name == name


class _UnackedClient:
    """A connection whose broker never acknowledges a QoS 1 publish (its PUBACK stuck
    behind a flood) while messages keep arriving."""

    def __init__(self, incoming: list[aiomqtt.Message]) -> None:
        self.published: list[str] = []
        self.messages = self._arrive(incoming)

    async def publish(self, topic: str, payload: Any, qos: int = 0, retain: bool = False,
                      **_: Any) -> None:
        self.published.append(topic)
        if qos:
            await asyncio.Event().wait()  # the acknowledgement that never comes

    async def _arrive(self, incoming: list[aiomqtt.Message]) -> Any:
        for message in incoming:
            yield message
            await asyncio.sleep(0.001)
        await asyncio.Event().wait()


_JUNK = [aiomqtt.Message("meshdl/3/r1c1/r2c1/halo", b"junk", 0, False, i, None)
         for i in range(200)]  # 200 messages too short to decode


def _through_junk(session: Session, client: _UnackedClient,
                  tick: Any = None) -> Session:
    """`session` on `client`, run until it has handled the 200 junk messages."""

    async def main() -> Session:
        session._client = client
        handled = session.stats

        async def run() -> None:
            await session.run(lambda _t, _m: [], tick=tick,
                              until=lambda: handled["rejected:codec:truncated"] >= 200)

        await asyncio.wait_for(run(), 60)  # a hang guard, not a timing claim
        session._stop_beating()
        return session

    return asyncio.run(main())


def test_an_unacknowledged_heartbeat_holds_up_no_message_and_no_connection() -> None:
    # Under a flood of small junk, a host's heartbeat (QoS 1) waited for its PUBACK
    # inside the receive loop: nothing was handled meanwhile, and after the operation
    # timeout the connection was torn down (every ~20 s, every wave lost).
    client = _UnackedClient(_JUNK)
    session = _through_junk(_session(heartbeat_s=0.0), client)  # a beat every turn
    assert session.stats["rejected:codec:truncated"] == 200
    assert session.stats["reconnects"] == 0
    assert session.stats["heartbeats_unacknowledged"] >= 1
    assert client.published.count("meshdl/3/status/south") == 1  # not one per turn


def test_a_node_hosts_send_drops_and_counts_a_message_it_cannot_seal() -> None:
    """A repair whose edge signature is gone (or any message its keys cannot seal)
    raised out of `send`, and `run` catches only broker errors: the node host died,
    all its cells with it. That one message is now dropped and counted."""
    near = Authenticator(KEYS.keyring(SPEC, [(0, 0)]))
    payload = np.ones(SPEC.params_size, np.float32)
    repair = make(Kind.PARAMS, SPEC.mesh_id, 100, (0, 0), (1, 0), payload, phase=REPAIR,
                  session=9)
    halo = make(Kind.HALO, SPEC.mesh_id, 100, (0, 0), (0, 1),
                np.ones((1, 1, 1), np.float32), layer=1, session=9)
    client = _AckedClient()

    async def main() -> Session:
        session = _session(wire=Wire(SPEC.mesh_id, near))
        session._client = client
        await session.send([repair, halo, repair])
        return session

    session = asyncio.run(main())
    assert session.stats["unsendable:no_signature"] == 2
    assert session.stats["sent"] == 1 and client.published == ["meshdl/3/r0c0/r0c1/halo"]


class _AckedClient:
    """A connection whose broker acknowledges every publish at once."""

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, topic: str, payload: Any, qos: int = 0, retain: bool = False,
                      **_: Any) -> None:
        self.published.append(topic)


def test_one_sender_of_small_junk_fills_only_its_own_share_of_the_inbox_count() -> None:
    """Only bytes were counted per sender: 20,000 tiny messages from one edge login
    filled the inbox's message count and every other mesh's pushes were dropped."""
    session, queue = _servers_inbox_after(junk=25_000, junk_bytes=1)
    held = Counter(m.topic.value for m in queue._queue)
    assert held["meshdl/2/edge/ps/push"] == 20
    assert held["meshdl/1/edge/ps/push"] == InboxLimits().sender_messages
    assert session.stats["rejected:inbox_full"] == 25_020 - sum(held.values())
    while not queue.empty():  # what is taken out makes room again
        queue.get_nowait()
    queue.put_nowait(aiomqtt.Message("meshdl/1/edge/ps/push", b"x", 1, False, 0, None))
    assert queue.qsize() == 1


def test_an_unacknowledged_announcement_of_unread_cells_holds_up_no_message() -> None:
    """The tick announced a slot's unread cells by awaiting a QoS 1 publish in the
    receive loop: under a flood its PUBACK came late, nothing was handled meanwhile, and
    the operation timeout tore the connection down. It is now published as the
    heartbeat is, beside the loop."""
    client = _UnackedClient(_JUNK)
    host = SimpleNamespace(tick=lambda _now: [])
    sampler = SimpleNamespace(last_errors={(1, 1): "no reading"}, sampled=7)
    session = _session(heartbeat_s=3600.0)  # no heartbeat: the announcement alone
    session = _through_junk(session, client, Ticker(host, session, None, sampler))
    assert session.stats["rejected:codec:truncated"] == 200
    assert session.stats["reconnects"] == 0
    assert client.published.count("meshdl/3/status/south") == 1  # once for the slot
