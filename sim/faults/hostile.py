"""A hostile client: what someone holding one node's broker login can throw at a mesh.

`Attacker` logs in as the node at `cell` (its password, not its message keys) and, until
stopped, floods every topic the broker's ACL lets that node write, in rounds:

- garbage: random bytes of random lengths, on every kind of topic to every neighbour;
- replays: every mesh message it can read (its neighbours' messages to it, the edge's
  broadcasts), published again on its own topics at once and in later rounds;
- forgeries: well-formed messages of every kind, valid checksum, in its own name or
  another's, for this wave, the next ones or far ahead, with made-up values and a tag it
  cannot make right;
- oversized payloads beyond the broker's limit (the broker drops the connection: it
  logs in again and goes on);
- its status topic: a nesting bomb, an oversized record, a claim to serve every cell,
  and (`claim_bomb`) once a second a retained record just under the readers' size
  limit claiming one cell tens of thousands of times;
- (`flood_cell`) messages of `flood_bytes` (by default FLOOD_BYTES, just under the
  broker's 1 MiB), forged (well-formed, valid checksum, finite values, a tag it cannot
  make right) to one neighbour, at `flood_mb_per_s` (None: as fast as the broker takes
  them) on a connection of their own, `flood_total` of them or until stopped;
- (`retained_fill`) that many retained messages of `FLOOD_BYTES` on topics below its
  own name, the protocol's and made-up ones, to fill the broker's memory and store.

It counts what it sent by class. The acceptance run (meshdl/bench/hostile.py) trains
while it floods and checks the result against the virtual mesh.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiomqtt
import numpy as np

from meshdl.errors import CodecError
from meshdl.mqtt.session import BrokerAddress, settle_client
from meshdl.protocol.auth import LINK_TAG_BYTES, SIGNATURE_BYTES
from meshdl.protocol.messages import HEADER_BYTES, Kind, decode, encode, make
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import broadcast_filter, inbox_filter, name_of, status_topic, topic
from meshdl.protocol.topology import Cell

_QUIET = logging.getLogger("meshdl.sim.faults.hostile.client")
_QUIET.setLevel(logging.CRITICAL)  # the broker throwing it out is the point, not news
REPLAYS_KEPT = 256  # captured messages kept to replay later
ROUND_TIMEOUT_S = 2.0  # a round not out by then: the connection is gone
OVERSIZED_BYTES = 2 * 1024 * 1024  # beyond the production broker's 1 MiB limit
WARM_ROUNDS = 25  # rounds before the first oversized payload
FLOOD_BYTES = 1_040_000  # under the production broker's 1 MiB message_size_limit
FLOOD_PER_ROUND = 8  # large messages to `flood_cell` in flight at once
# The large flood's rate: several times what a node host takes in while it checks every
# message (~3 ms each: copy, checksum, tag), so that an unbounded inbox fills; a faster
# one only makes the broker drop more of it, and the test run longer.
FLOOD_MB_PER_S = 400
FILL_PER_ROUND = 8  # retained messages per round until `retained_fill` are out
CLAIM_EVERY_S = 1.0  # the claim bomb's period
CLAIMED_CELL = "r0c0"  # the claim bomb's one cell, repeated


def claim_bomb(mesh: int, limit: int) -> bytes:
    """A well-formed node-host status record of at most `limit` bytes claiming
    CLAIMED_CELL as many times as fit (~32,750 under 256 KiB): a signature chain that
    costs one step per claimed cell would cost that many hashes of the whole body."""
    head = {"role": "node-host", "state": "online", "mesh": mesh, "time": time.time(),
            "tag": "00" * LINK_TAG_BYTES}
    empty = len(json.dumps({**head, "cells": []}).encode())
    count = (limit - empty) // len(f'"{CLAIMED_CELL}", ')
    return json.dumps({**head, "cells": [CLAIMED_CELL] * count}).encode()[:limit]


class Attacker:
    """The flood of one node's stolen login; `run` until `stop()` holds."""

    def __init__(self, spec: MeshSpec, address: BrokerAddress, cell: Cell,
                 seed: int = 0, round_s: float = 0.02, cafile: Path | None = None,
                 claim_bomb: int | None = None, flood_cell: Cell | None = None,
                 retained_fill: int = 0, flood_total: int | None = None,
                 flood_bytes: int = FLOOD_BYTES,
                 flood_mb_per_s: float | None = FLOOD_MB_PER_S) -> None:
        """`claim_bomb`: the readers' status size limit, to publish a claim bomb of that
        size once a second; `flood_cell`: a neighbour to flood with messages of
        `flood_bytes` on the wire, `flood_total` of them (None: until stopped), at
        `flood_mb_per_s` (None: at full speed); `retained_fill`: how many retained
        FLOOD_BYTES messages to leave."""
        self.spec = spec
        self.address = address
        self.cell = cell
        self.rng = random.Random(seed)
        self.round_s = round_s  # pause between rounds: a flood, not a livelock of 2 cores
        self.cafile = cafile  # the broker's certificate authority, for TLS
        self.neighbours = spec.topology.neighbours(cell)
        self.sent: Counter[str] = Counter()
        self.captured: list[bytes] = []
        self.errors: Counter[str] = Counter()
        self.rounds = 0  # published so far
        self.step_seen = 0  # the newest wave number it has read
        self.session_seen = 0
        self.claim_bomb = claim_bomb
        self.flood_cell = flood_cell
        self.flood_total = flood_total
        self.flood_bytes = flood_bytes
        self.flood_mb_per_s = flood_mb_per_s
        if flood_cell is not None and flood_cell not in self.neighbours:
            raise ValueError(f"{name_of(flood_cell)} is not a neighbour of {name_of(cell)}")
        self.retained_fill = retained_fill
        self.filled = 0  # retained messages out so far
        self._claimed_at = float("-inf")
        self._floods: list[bytes] = []  # a few forgeries of `flood_bytes`, made once
        self.flood_sent_bytes = 0  # the flood's bytes out so far

    async def run(self, stop: Callable[[], bool]) -> None:
        """Flood until `stop()`; log in again whenever the broker throws it out. The
        large flood has a connection of its own (the same login), so that its bytes do
        not hold back the rounds (the claim bomb's period among them)."""
        floods = [self._flood] + ([self._flood_cell] if self.flood_cell is not None else [])
        await asyncio.gather(*(self._connected(flood, stop) for flood in floods))

    async def _connected(self, flood: Callable[[aiomqtt.Client, Callable[[], bool]],
                                               Awaitable[None]],
                         stop: Callable[[], bool]) -> None:
        """Run `flood` on a connection of its own, logging in again when thrown out."""
        while not stop():
            a = self.address
            tls = ssl.create_default_context(cafile=self.cafile) if a.tls else None
            client = aiomqtt.Client(
                a.host, a.port, username=a.username, password=a.password, tls_context=tls,
                identifier=f"attacker-{time.time_ns()}",
                max_queued_outgoing_messages=10_000, logger=_QUIET)
            try:
                async with client:
                    await flood(client, stop)
                    return  # done: it ends by itself, or when stop() holds
            except (aiomqtt.MqttError, OSError) as exc:  # thrown out (an oversized payload)
                self.errors[type(exc).__name__] += 1
                settle_client(client)  # (no "Future exception was never retrieved" for it)
                await asyncio.sleep(0.05)

    async def _flood(self, client: aiomqtt.Client, stop: Callable[[], bool]) -> None:
        mesh = self.spec.mesh_id
        await client.subscribe([(inbox_filter(mesh, n, self.cell), 0)
                                for n in self.neighbours] + [(broadcast_filter(mesh), 0)])
        listening = asyncio.ensure_future(self._capture(client))
        try:
            while not stop():
                try:  # publishes hang once the broker has thrown it out
                    await asyncio.wait_for(self._round(client), ROUND_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise aiomqtt.MqttError("thrown out: publishing stalled") from None
                await asyncio.sleep(self.round_s)
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    async def _capture(self, client: aiomqtt.Client) -> None:
        """Keep what it can read, to replay; learn the current wave number from it."""
        async for message in client.messages:
            payload = bytes(message.payload) if isinstance(message.payload, bytes) else b""
            if len(self.captured) < REPLAYS_KEPT:
                self.captured.append(payload)
            else:
                self.captured[self.rng.randrange(REPLAYS_KEPT)] = payload
            for tag in (LINK_TAG_BYTES, SIGNATURE_BYTES, 0):
                try:
                    header = decode(payload[:len(payload) - tag]).header
                except CodecError:
                    continue
                self.step_seen, self.session_seen = header.step, header.session
                break

    async def _round(self, client: aiomqtt.Client) -> None:
        """One round of everything, published at once."""
        rng, mesh = self.rng, self.spec.mesh_id
        me = self.cell
        out: list[tuple[str, bytes, str, bool]] = []
        for dst in self.neighbours:
            for kind in Kind:
                name = topic(mesh, me, dst, kind)
                out.append((name, rng.randbytes(rng.randrange(1, 4096)), "garbage", False))
                out.append((name, self._forgery(kind, dst), "forged", False))
            for replay in rng.sample(self.captured, min(4, len(self.captured))):
                kind = rng.choice(list(Kind))
                out.append((topic(mesh, me, dst, kind), replay, "replayed", False))
        out.append((f"meshdl/{mesh}/{name_of(me)}/x/y/z", b"\x00", "garbage", False))
        self.rounds += 1
        # Oversized payloads get it thrown out: only once the flood is under way, so
        # that a short run is flooded at all before the first reconnection.
        if self.rounds > WARM_ROUNDS and rng.random() < 0.02:
            out.append((topic(mesh, me, self.neighbours[0], Kind.GATHER),
                        rng.randbytes(OVERSIZED_BYTES), "oversized", False))
        if rng.random() < 0.05:
            claim = {"role": "node-host", "state": "online", "mesh": mesh, "time": time.time(),
                     "cells": [name_of(c) for c in self.spec.topology.cells()]}
            bomb = rng.choice([b"[" * 3000 + b"]" * 3000, b"{" + b" " * 300_000 + b"}",
                               json.dumps(claim).encode()])
            out.append((status_topic(mesh, name_of(me)), bomb, "status", True))
        out += self._heavy(rng)
        await asyncio.gather(*(client.publish(name, payload, qos=0, retain=retain)
                               for name, payload, _, retain in out))
        self.sent.update(what for _, _, what, _ in out)
        self.filled += sum(what == "retained_fill" for _, _, what, _ in out)

    def _forgery(self, kind: Kind, dst: Cell) -> bytes:
        """A well-formed message of `kind` with a wrong tag: from this node or (under its
        own topic, which the ACL allows) claiming another sender."""
        rng = self.rng
        src = self.cell if rng.random() < 0.7 else rng.choice([*self.neighbours, (-1, -1)])
        step = (self.step_seen + rng.choice((0, 1, 2, 1 << 31))) & 0xFFFFFFFF
        if kind == Kind.BATCH:
            payload = np.array([0, 0, *rng.sample(range(50), 3)], np.int32)
        elif kind == Kind.PARAMS:
            payload = np.full(self.spec.params_size, rng.uniform(-2, 2), np.float32)
        elif kind == Kind.REDUCE:
            payload = np.full(self.spec.reduce_size, rng.uniform(-2, 2), np.float32)
        else:
            payload = np.full((1, self.spec.model.filters, rng.randrange(1, 101)),
                              rng.uniform(-50, 50), np.float32)
        message = make(kind, self.spec.mesh_id, step, src, dst, payload,
                       layer=rng.randrange(0, self.spec.model.conv_layers + 1),
                       phase=rng.randrange(0, 2), session=self.session_seen)
        tag = SIGNATURE_BYTES if kind in (Kind.PARAMS, Kind.BATCH) else LINK_TAG_BYTES
        return encode(message) + rng.randbytes(tag)

    async def _flood_cell(self, client: aiomqtt.Client, stop: Callable[[], bool]) -> None:
        """Messages of `flood_bytes` to `flood_cell`, FLOOD_PER_ROUND at a time, at
        `flood_mb_per_s` (or as fast as the connection takes them, if slower or None).
        Counted as `flood_1mb` (the large flood) or `flood_small`."""
        assert self.flood_cell is not None
        if not self._floods:
            self._floods = [self._large_forgery(self.flood_cell) for _ in range(4)]
        mesh, rng = self.spec.mesh_id, self.rng
        kinds = (Kind.HALO, Kind.GRAD_HALO, Kind.GATHER, Kind.SCATTER)
        counted = self.flood_counter
        started, sent = time.monotonic(), 0
        while not stop() and (self.flood_total is None or
                              self.sent[counted] < self.flood_total):
            rate = self.flood_mb_per_s
            ahead = 0.0 if rate is None else \
                sent * self.flood_bytes / 1e6 / rate - (time.monotonic() - started)
            # Full speed still yields a turn, so that the rounds' connection (and, in the
            # bench, the harness) goes on beside it.
            await asyncio.sleep(max(ahead, 0.0))
            batch = [(topic(mesh, self.cell, self.flood_cell, rng.choice(kinds)),
                      rng.choice(self._floods)) for _ in range(FLOOD_PER_ROUND)]
            try:  # (every outcome taken: a publish cancelled by a disconnection too)
                outcomes = await asyncio.wait_for(asyncio.gather(
                    *(client.publish(name, data, qos=0) for name, data in batch),
                    return_exceptions=True), ROUND_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise aiomqtt.MqttError("thrown out: publishing stalled") from None
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if failed:
                raise aiomqtt.MqttError("thrown out: a publish failed") from failed[0]
            self.sent[counted] += len(batch)
            self.flood_sent_bytes += len(batch) * self.flood_bytes
            sent += len(batch)

    @property
    def flood_counter(self) -> str:
        """The name `sent` counts the flood under."""
        return "flood_1mb" if self.flood_bytes >= FLOOD_BYTES else "flood_small"

    def _heavy(self, rng: random.Random) -> list[tuple[str, bytes, str, bool]]:
        """This round's share of the claim bomb and the retained fill."""
        mesh, me, out = self.spec.mesh_id, self.cell, []
        now = time.monotonic()
        if self.claim_bomb is not None and now - self._claimed_at >= CLAIM_EVERY_S:
            self._claimed_at = now
            out.append((status_topic(mesh, name_of(me)), claim_bomb(mesh, self.claim_bomb),
                        "claim_bomb", True))
        for i in range(self.filled, min(self.filled + FILL_PER_ROUND, self.retained_fill)):
            # Every other one on a topic the protocol uses (a kind to a neighbour), the
            # others on made-up topics below its name: an ACL with a free subtree keeps
            # them all; one listing the protocol's topics only the first kind. (`filled`
            # counts those published: a round thrown out is tried again.)
            dst = self.neighbours[i // 2 % len(self.neighbours)]
            name = topic(mesh, me, dst, list(Kind)[i // 2 % len(Kind)]) if i % 2 == 0 \
                else f"meshdl/{mesh}/{name_of(me)}/fill/{i}"
            out.append((name, rng.randbytes(FLOOD_BYTES), "retained_fill", True))
        return out

    def _large_forgery(self, dst: Cell) -> bytes:
        """A well-formed message of `flood_bytes` on the wire (valid checksum, finite
        values), to `dst`, in this node's name, with a tag it cannot make right: the
        receiver pays for the copy, the checksum and the tag check of every one."""
        values = (self.flood_bytes - HEADER_BYTES - LINK_TAG_BYTES) // 4  # fills it
        payload = np.random.default_rng(self.rng.randrange(1 << 32)).uniform(
            -50, 50, (1, 1, values)).astype(np.float32)
        message = make(Kind.HALO, self.spec.mesh_id, self.step_seen, self.cell, dst,
                       payload, session=self.session_seen)
        return encode(message) + self.rng.randbytes(LINK_TAG_BYTES)
