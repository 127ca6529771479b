"""The broker's size limits for a mesh: the largest message it legitimately sends.

Mosquitto 2.0 bounds message sizes only for the whole broker (`message_size_limit`,
`max_packet_size`: every listener, every login), so that bound is what a stolen login
may flood its neighbours with at the broker's full speed. A mesh's messages are fixed by
its plan: `largest_messages` works out, from the mesh file, the largest of each kind a
deployment sends (a training wave's at the configured batch, the BATCH with failout
cells, PARAMS with a plan tail, REDUCE as compressed, HEALTH naming every cell, the
status records and alerts, and with a parameter server its PUSH and WEIGHTS), and
`broker_limits` adds a little headroom, never beyond `mesh.max_message_bytes`.
Evaluation waves are cut to fit `mesh.max_message_bytes`; `meshdl deploy credentials`
gives every process of the mesh the derived limit as that setting
(MESHDL_MESH__MAX_MESSAGE_BYTES), so they are cut to fit the broker's limit too.

The limits reach the broker as a file of production.conf's include directory
(`limits_file_name`, `limits_conf`), read after production.conf's own 1 MiB, which it
replaces: Mosquitto takes the option again and keeps the last value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshdl.limits import MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES

if TYPE_CHECKING:
    from meshdl.config import RunConfig
    from meshdl.protocol.spec import MeshSpec

# What max_packet_size allows beyond the payload: the topic (<= 45 B), the fixed header
# and MQTT v5 properties (deploy/mosquitto/production.conf, "Message size").
PACKET_OVERHEAD = 1024
PRODUCTION_MESSAGE_BYTES = 1_048_576  # production.conf's message_size_limit as shipped
# Headroom over the largest message: an eighth, at least 1 KiB (a status record's
# counters grow a digit, a lossy activation format adds its scale), in whole KiB.
HEADROOM_FRACTION = 8
HEADROOM_LEAST = 1024
# From here on a derived limit protects little: a login may flood with messages of half
# a megabyte and more, which a loaded host checks slower than they come (issue 43).
NEAR_MEGABYTE = MAX_MESSAGE_BYTES // 2
# A status record's counters ("rejected", "refused"): ~40 reasons of < 40 characters,
# counts of < 20 digits, with room to spare.
COUNTERS_BYTES = 4096
TAG_CHARS = 128  # a status record's tag in hex (the edge's Ed25519 signature: 64 bytes)
LIMITS_DIR = "limits.d"  # beside passwd and acl: production.conf's include_dir
DIGITS = 9  # of the limit in a limits file's name: mesh.max_message_bytes <= 64 MiB


@dataclass(frozen=True)
class Largest:
    """The largest message of one kind a mesh sends: `what` says which."""

    kind: str
    bytes: int
    what: str


@dataclass(frozen=True)
class BrokerLimits:
    """The broker's size options for one mesh (or the central broker of several)."""

    largest: Largest  # the largest legitimate message of all
    message_size_limit: int
    mesh_limit: int  # the mesh's mesh.max_message_bytes, which bounds it

    @property
    def max_packet_size(self) -> int:
        return self.message_size_limit + PACKET_OVERHEAD

    @property
    def near_megabyte(self) -> bool:
        """Is the largest legitimate message itself near 1 MB (a huge batch)? Then the
        broker can refuse nothing a flood needs."""
        return self.largest.bytes >= NEAR_MEGABYTE

    @property
    def clamped(self) -> bool:
        """Did mesh.max_message_bytes leave less than the headroom?"""
        return self.message_size_limit < with_headroom(self.largest.bytes)

    def options(self) -> dict[str, int]:
        return message_limits(self.message_size_limit)


def message_limits(max_message_bytes: int) -> dict[str, int]:
    """Mosquitto's two size options for messages of at most `max_message_bytes`."""
    return {"message_size_limit": max_message_bytes,
            "max_packet_size": max_message_bytes + PACKET_OVERHEAD}


def with_headroom(size: int) -> int:
    headroom = max(size // HEADROOM_FRACTION, HEADROOM_LEAST)
    return math.ceil((size + headroom) / 1024) * 1024


def mesh_spec(config: RunConfig) -> MeshSpec:
    """The mesh as a deployment runs it: over a broker, every message authenticated
    (`deploy credentials` turns auth on in every process's environment)."""
    from meshdl.protocol.spec import MeshSpec

    mesh = config.mesh
    return MeshSpec(mesh.mesh_id, config.model, mesh.edge_at, "broadcast",
                    mesh.max_message_bytes, True, compress=mesh.compress,
                    activations=mesh.activations, delta=mesh.delta)


def largest_messages(config: RunConfig) -> list[Largest]:
    """The largest message of each kind the mesh of `config` sends in a deployment,
    largest first. Wave payloads are counted as float32 (fp16 and int8 activations
    only make them smaller); the batch is the training batch (evaluation waves are cut
    to fit the limit)."""
    from meshdl.protocol.messages import ITEM_BYTES, Kind
    from meshdl.protocol.payloads import BATCH_HEAD
    from meshdl.protocol.topics import name_of

    spec = mesh_spec(config)
    batch, cells = config.train.batch, config.model.rows * config.model.cols
    found: dict[str, Largest] = {}

    def add(kind: str, size: int, what: str) -> None:
        if size > found.get(kind, Largest(kind, -1, "")).bytes:
            found[kind] = Largest(kind, size, what)

    for src, sends in spec.sends.items():
        for send in sends:
            values = len(send.items) * spec.item_shape(send.field, 0)[0] * batch
            add(send.kind.name, spec.overhead(send.kind) + ITEM_BYTES * values,
                f"{name_of(src)} -> {name_of(send.dst)} at batch {batch}")
    # PARAMS with a plan tail (edge cell, count, every other cell dead), BATCH with
    # every cell named by failout, HEALTH naming every cell, REDUCE as compressed.
    add("PARAMS", spec.overhead(Kind.PARAMS) + ITEM_BYTES * (spec.params_size + 2 + cells),
        "the conv parameters and a plan tail")
    add("BATCH", spec.overhead(Kind.BATCH) + ITEM_BYTES * (BATCH_HEAD + batch + cells),
        f"{batch} samples and every cell by failout")
    add("HEALTH", spec.overhead(Kind.HEALTH) + ITEM_BYTES * cells, "every cell named")
    summed, codec = spec.reduce_sum, spec.reduce_codec
    reduce_bytes = max(ITEM_BYTES * spec.reduce_size,
                       0 if codec is None else codec.nbytes,
                       0 if summed is None else summed.max_nbytes(cells))
    add("REDUCE", spec.overhead(Kind.REDUCE) + reduce_bytes,
        "the conv gradients (and a position bias's)")
    add("status", status_bytes(spec), "a node host's status record naming every cell "
                                      "as served, failed and unread")
    add("alert", alert_bytes(config.model.rows, config.model.cols),
        "a live slot's alert naming every cell unread, one host each")
    if config.parallel.meshes > 1:
        for largest in server_messages(config):
            add(largest.kind, largest.bytes, largest.what)
    return sorted(found.values(), key=lambda m: -m.bytes)


def server_messages(config: RunConfig) -> list[Largest]:
    """PUSH and WEIGHTS between a mesh's edge and the parameter server (the whole
    model; a compressed PUSH as its codec writes it)."""
    from meshdl.compress.policy import model_segments
    from meshdl.protocol.messages import ITEM_BYTES, Kind
    from meshdl.protocol.parts import part_codecs
    from meshdl.protocol.payloads import PUSH_HEAD

    spec = mesh_spec(config)
    size = sum(s.size for s in model_segments(config.model))
    codecs = part_codecs(config.mesh.compress, config.model) or {}
    push = max([ITEM_BYTES * (PUSH_HEAD + size),
                *(ITEM_BYTES * PUSH_HEAD + c.nbytes for c in codecs.values())])
    return [Largest("PUSH", spec.overhead(Kind.PUSH) + push, "a step's gradient, the "
                    "whole model"),
            Largest("WEIGHTS", spec.overhead(Kind.WEIGHTS) + ITEM_BYTES * size,
                    "the whole model")]


def status_bytes(spec: MeshSpec) -> int:
    """A bound on a node host's status record: one host serving every cell, every one
    also failed and unread, with its counters and tag (meshdl/mqtt/status.py)."""
    from meshdl.mqtt.status import MAX_ERROR_CHARS
    from meshdl.protocol.auth import STATUS_TAG
    from meshdl.protocol.topics import name_of

    names = [name_of(c) for c in spec.topology.cells()]
    record = {"role": "node-host", "state": "offline", "mesh": 0xFFFF,
              "time": 1e10 + 0.123456789, "cells": names, "spec": spec.summary,
              "data": "f" * 64, "rejected": {}, "refused": {}, "failed": names,
              "unread": names, "unread_slot": 2**63, "unread_error": "x" * MAX_ERROR_CHARS,
              "session": 0xFFFF, "since": 1e10 + 0.123456789, STATUS_TAG: "f" * TAG_CHARS}
    return len(json.dumps(record).encode()) + COUNTERS_BYTES


def alert_bytes(rows: int, cols: int) -> int:
    """A bound on a live slot's alert (edge/serve.py): its error names every unread cell
    with its host (a host a cell) and the host's sensor error."""
    from meshdl.mqtt.status import MAX_ERROR_CHARS
    from meshdl.protocol.topics import name_of

    names = [name_of((r, c)) for r in range(rows) for c in range(cols)]
    error = "; ".join(f"{n} (node host {n}: {'x' * MAX_ERROR_CHARS})" for n in names)
    alert = {"timestamp": "2000-01-01T00:00:00Z", "slot": 2**63,
             "error": f"slot {2**32}: no valid reading of {error}: a slot is computed only "
                      "on every cell's reading"}
    return len(json.dumps(alert).encode())


def broker_limits(config: RunConfig) -> BrokerLimits:
    """The broker's limits for the mesh of `config`: its largest legitimate message with
    headroom, at most mesh.max_message_bytes. UsageError if even the largest message
    does not fit mesh.max_message_bytes (the edge would refuse the batch anyway)."""
    from meshdl.errors import UsageError

    largest = largest_messages(config)[0]
    mesh_limit = config.mesh.max_message_bytes
    if largest.bytes > mesh_limit:
        raise UsageError(
            f"mesh.max_message_bytes {mesh_limit} is below the mesh's largest message, "
            f"its {largest.kind} ({largest.what}) of {largest.bytes:,} bytes: lower [train] "
            "batch or raise mesh.max_message_bytes")
    return BrokerLimits(largest, min(with_headroom(largest.bytes), mesh_limit), mesh_limit)


def central_limits(config: RunConfig) -> BrokerLimits:
    """The central broker's limits: the PUSH and WEIGHTS of the meshes' edges and the
    parameter server (the bridges carry nothing else), and the server's status record
    (meshdl/training/ps_run.py: its meshes and session)."""
    record = {"role": "parameter-server", "meshes": [0xFFFF] * config.parallel.meshes,
              "session": 0xFFFF, "mesh": 0xFFFF, "state": "offline",
              "time": 1e10 + 0.123456789}
    found = [*server_messages(config),
             Largest("status", len(json.dumps(record).encode()), "the server's record")]
    largest = max(found, key=lambda m: m.bytes)
    return BrokerLimits(largest, with_headroom(largest.bytes), MAX_PAYLOAD_BYTES)


def limits_file_name(limits: BrokerLimits, whose: str) -> str:
    """The limits file's name: its limit zero-padded, so that files load in the order of
    their limits and on a broker shared by several meshes the largest one's holds
    (Mosquitto reads an include_dir's files sorted by name, the last value of an option
    holding); then `whose` they are ("mesh7", "central"), to replace them alone."""
    return f"message-size-{limits.message_size_limit:0{DIGITS}d}-{whose}.conf"


def limits_conf(limits: BrokerLimits, header: str, examples: str = "") -> str:
    """The limits file: the two options and why they are what they are."""
    largest = limits.largest
    why = (f"mesh.max_message_bytes ({limits.mesh_limit:,}) leaves less headroom"
           if limits.clamped else "with headroom")
    lines = [
        f"# {header}",
        "# The broker's size limits for this mesh, read by production.conf's",
        f"# `include_dir /etc/mosquitto/meshdl/{LIMITS_DIR}` after its own 1 MiB, which they",
        "# replace (Mosquitto keeps the last value). The largest message the mesh",
        f"# legitimately sends: {largest.kind}, {largest.what}, {largest.bytes:,} bytes;",
        f"# {why}: {limits.message_size_limit:,} bytes (max_packet_size adds 1 KiB for topic,",
        "# header and properties). A stolen login sending anything larger is thrown out at",
        "# the packet's header; up to this size it may still flood its neighbours (no",
        "# per-login rate limit in Mosquitto 2.0; the edge waits out such a flood).",
        "# Files here load in name order and the last value holds: the name carries the",
        "# limit, so a broker shared by several meshes keeps the largest mesh's.",
        "# Every process of the mesh plans with the same figure (MESHDL_MESH__MAX_MESSAGE_BYTES",
        "# in its secrets/<user>.env): evaluation waves are cut to fit it.",
    ]
    if examples:
        lines += ["#", *(f"# {line}" for line in examples.splitlines())]
    lines += [f"{option} {value}" for option, value in limits.options().items()]
    return "\n".join(lines) + "\n"


def readme_examples() -> str:
    """What the README's set-ups derive, for the limits file's comment."""
    from meshdl.config import load_run_config

    out = ["For scale, the README's set-ups (batch 100, kernel 3, 5 filters, pool 2):"]
    for rows, cols, name in ((17, 25, "the source paper's 17 x 25 floor"),
                             (6, 8, "the 6 x 8 mesh of its MQTT example")):
        limits = broker_limits(load_run_config(None, model={"rows": rows, "cols": cols}))
        out.append(f"  {name}: largest {limits.largest.kind} {limits.largest.bytes:,} B, "
                   f"limit {limits.message_size_limit:,} B")
    return "\n".join(out)
