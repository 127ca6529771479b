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
- its status topic: a nesting bomb, an oversized record, a claim to serve every cell.

It counts what it sent by class. The acceptance run (meshdl/bench_hostile.py) trains
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
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import numpy as np

from meshdl.auth import LINK_TAG_BYTES, SIGNATURE_BYTES
from meshdl.messages import CodecError, Kind, decode, encode, make
from meshdl.mqtt import BrokerAddress
from meshdl.protocol import MeshSpec
from meshdl.topics import broadcast_filter, inbox_filter, name_of, status_topic, topic
from meshdl.topology import Cell

_QUIET = logging.getLogger("meshdl.sim.hostile.client")
_QUIET.setLevel(logging.CRITICAL)  # the broker throwing it out is the point, not news
REPLAYS_KEPT = 256  # captured messages kept to replay later
ROUND_TIMEOUT_S = 2.0  # a round not out by then: the connection is gone
OVERSIZED_BYTES = 2 * 1024 * 1024  # beyond the production broker's 1 MiB limit
WARM_ROUNDS = 25  # rounds before the first oversized payload


class Attacker:
    """The flood of one node's stolen login; `run` until `stop()` holds."""

    def __init__(self, spec: MeshSpec, address: BrokerAddress, cell: Cell,
                 seed: int = 0, round_s: float = 0.02, cafile: Path | None = None) -> None:
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

    async def run(self, stop: Callable[[], bool]) -> None:
        """Flood until `stop()`; log in again whenever the broker throws it out."""
        while not stop():
            try:
                await self._flood(stop)
            except (aiomqtt.MqttError, OSError) as exc:  # thrown out (an oversized payload)
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.05)

    async def _flood(self, stop: Callable[[], bool]) -> None:
        a = self.address
        tls = ssl.create_default_context(cafile=self.cafile) if a.tls else None
        async with aiomqtt.Client(a.host, a.port, username=a.username, password=a.password,
                                  tls_context=tls, identifier=f"attacker-{time.time_ns()}",
                                  max_queued_outgoing_messages=10_000,
                                  logger=_QUIET) as client:
            mesh = self.spec.mesh_id
            await client.subscribe([(inbox_filter(mesh, n, self.cell), 0)
                                    for n in self.neighbours] +
                                   [(broadcast_filter(mesh), 0)])
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
        await asyncio.gather(*(client.publish(name, payload, qos=0, retain=retain)
                               for name, payload, _, retain in out))
        self.sent.update(what for _, _, what, _ in out)

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
            payload = np.full(self.spec.conv_size, rng.uniform(-2, 2), np.float32)
        else:
            payload = np.full((1, self.spec.model.filters, rng.randrange(1, 101)),
                              rng.uniform(-50, 50), np.float32)
        message = make(kind, self.spec.mesh_id, step, src, dst, payload,
                       layer=rng.randrange(0, self.spec.model.conv_layers + 1),
                       phase=rng.randrange(0, 2), session=self.session_seen)
        tag = SIGNATURE_BYTES if kind in (Kind.PARAMS, Kind.BATCH) else LINK_TAG_BYTES
        return encode(message) + rng.randbytes(tag)
