"""Message authentication: no node can forge another node's messages, nor the edge's.

With `mesh.auth` on, every message on the wire carries a tag after its payload:

- a link message (halo, pool, gather, scatter, route, gradient halo, reduce) carries
  HMAC-SHA256 over its header and payload, truncated to `LINK_TAG_BYTES`, under the key
  its sender and receiver share (one key per pair of neighbours, and one between the
  edge and the cell it is linked to). A node holds the keys of its own links only, so it
  can speak for itself and nobody else;
- the edge's PARAMS and BATCH carry an Ed25519 signature (`SIGNATURE_BYTES`) that every
  node verifies with the edge's public key and none can make. It covers what every hop
  of a wave leaves unchanged (kind, mesh, step, session, phase, dtype, shape, payload),
  so a node that relays the parameters down the tree forwards the edge's signature as
  it received it. Sender and receiver are not covered: a wave's PARAMS are meant for
  every node, from whichever relay;
- a repair's PARAMS (phase REPAIR, one link: from a tree parent, or the edge, to the
  child that asked; nodes/agent.py, "Repair") carry the wave's signature as above and
  then the link tag of the link they cross, over header, payload and signature
  (`REPAIR_TAG_BYTES` in all). The tag binds the phase, the sender and the receiver: a
  wave's signed PARAMS re-sent as a repair, or a repair re-sent to another cell, has
  no valid tag, and only the two ends of the link can make one.

Status records (meshdl/mqtt/status.py) are signed the same way when the mesh authenticates:
a node host's with the status keys of the cells it claims (chained, so a claim needs the
key of every cell claimed), the edge's (the mesh's lease) with the edge's signing key;
the edge ignores, and counts, any it cannot verify, so that a client with a node's login
but not its keys can neither claim cells nor take the mesh nor stop its edge.

Keys come from one mesh secret and the edge's signing key (`MeshKeys`): `meshdl deploy
credentials` draws both at random and writes each broker user the `Keyring` of the cells
it acts for; the virtual mesh derives them from a seed. The CRC inside the message still
catches corruption; the tag is what a forger cannot make. What a tag does not stop: a
replay of a genuine message of an earlier edge session (see PROTOCOL.md).

Several meshes training one model: PUSH and WEIGHTS carry the link tag of the link
between a mesh's edge and the parameter server, under a random key per mesh that
`meshdl deploy central` draws (`PushKeys`; the server's side is `PushAuthenticator`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshdl.errors import CodecError, CodecReason, MeshdlError, UsageError
from meshdl.protocol.messages import (
    EDGE,
    HEADER_BYTES,
    SERVER,
    Kind,
    Message,
    decode,
    encode,
    newer,
)
from meshdl.protocol.payloads import REPAIR
from meshdl.protocol.topics import cell_of, name_of
from meshdl.protocol.topology import Cell

LINK_TAG_BYTES = 16  # HMAC-SHA256 truncated to 128 bits (RFC 2104 section 5 allows it)
SIGNATURE_BYTES = 64  # Ed25519 (RFC 8032)
KEY_BYTES = 32
STATUS_TAG = "tag"  # the field of a signed status record
SIGNED_KINDS = frozenset({Kind.PARAMS, Kind.BATCH})  # what only the edge can say
REPAIR_TAG_BYTES = SIGNATURE_BYTES + LINK_TAG_BYTES  # a repair: the wave's, and its link's
WAVE_PHASE = 0  # the phase of the edge's PARAMS and BATCH in a wave
_KIND_AT = 3  # byte offset of the kind in the header (messages.py)
_PHASE_AT = 11  # ... and of the phase
_SIGNED_FIELDS = struct.Struct("<BHIHBB4I")  # kind, mesh, step, session, phase, dtype, shape
# Verified edge signatures a relay remembers: of each kind, the newest waves of the last
# few edge sessions (a relay forwards them). A repair needs the signature of the
# parameters a node cached, which may be older than all of them: that one is pinned.
_STEPS_KEPT = 4
_SESSIONS_KEPT = 4


class SealError(MeshdlError):
    """A message this process cannot seal: `reason` names why, in a closed set
    (`no_signature`: no edge signature for a PARAMS or BATCH it did not make;
    `no_link_key`: a link it holds no key for)."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


def tag_bytes(kind: Kind, phase: int = WAVE_PHASE) -> int:
    """Bytes an authenticated message of `kind` (in `phase`) carries after its payload."""
    if kind not in SIGNED_KINDS:
        return LINK_TAG_BYTES
    return REPAIR_TAG_BYTES if is_repair(kind, phase) else SIGNATURE_BYTES


def is_repair(kind: int, phase: int) -> bool:
    """PARAMS of a repair: one link's, not a wave's (nodes/agent.py, "Repair")."""
    return kind == Kind.PARAMS and phase == REPAIR


def link(a: Cell, b: Cell) -> tuple[Cell, Cell]:
    """The key name of the link between two parties, in either direction."""
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class Keyring:
    """The keys one party holds: its links' keys, the edge's public key, and (the edge
    only) the edge's signing key."""

    mesh_id: int
    links: dict[tuple[Cell, Cell], bytes]
    edge_public: bytes
    edge_private: bytes | None = None
    status: dict[Cell, bytes] = field(default_factory=dict)  # cell -> its status key

    def merged(self, other: Keyring) -> Keyring:
        """The keys of a host acting for the cells of both rings."""
        if (other.mesh_id, other.edge_public) != (self.mesh_id, self.edge_public):
            raise MeshdlError("key files of different meshes (or edge keys) cannot be merged")
        return Keyring(self.mesh_id, {**self.links, **other.links}, self.edge_public,
                       self.edge_private or other.edge_private,
                       {**self.status, **other.status})

    def to_json(self) -> str:
        record = KeyFile(
            mesh_id=self.mesh_id, edge_public=self.edge_public.hex(),
            edge_private=None if self.edge_private is None else self.edge_private.hex(),
            links={f"{name_of(a)}-{name_of(b)}": key.hex()
                   for (a, b), key in sorted(self.links.items())},
            status={name_of(cell): key.hex() for cell, key in sorted(self.status.items())})
        return record.model_dump_json(indent=1, exclude_none=True) + "\n"

    @classmethod
    def load(cls, path: Path) -> Keyring:
        """Read a key file; a damaged one is a one-line error, never a traceback."""
        try:
            record = KeyFile.model_validate_json(path.read_bytes())
            links = {}
            for name, key in record.links.items():
                a, b = name.split("-")
                links[link(cell_of(a), cell_of(b))] = bytes.fromhex(key)
            status = {cell_of(name): bytes.fromhex(key) for name, key in record.status.items()}
            ring = cls(record.mesh_id, links, bytes.fromhex(record.edge_public),
                       None if record.edge_private is None else bytes.fromhex(record.edge_private),
                       status)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "file"
            raise MeshdlError(f"{path}: not a meshdl key file ({where}: {first['msg']})"
                              ) from None
        except ValueError as exc:  # a link name that is not two cells
            raise MeshdlError(f"{path}: not a meshdl key file ({exc})") from None
        if any(len(k) != KEY_BYTES for k in (*ring.links.values(), *ring.status.values())) or \
                len(ring.edge_public) != KEY_BYTES or \
                (ring.edge_private is not None and len(ring.edge_private) != KEY_BYTES):
            raise MeshdlError(f"{path}: a key is not {KEY_BYTES} bytes long")
        return ring


_HEX_KEY = f"^[0-9a-f]{{{2 * KEY_BYTES}}}$"


class KeyFile(BaseModel):
    """A key file as stored: JSON, keys in hex; link names such as "r0c0-r0c1"."""

    model_config = ConfigDict(extra="forbid")
    mesh_id: int = Field(ge=0, le=0xFFFF)
    edge_public: str = Field(pattern=_HEX_KEY)
    edge_private: str | None = Field(None, pattern=_HEX_KEY)
    links: dict[str, str] = Field(max_length=1 << 20)
    status: dict[str, str] = Field(default_factory=dict, max_length=1 << 20)


class LinkPlan(Protocol):
    """What `MeshKeys` needs of a mesh spec: its id and which parties talk."""

    mesh_id: int

    @property
    def links(self) -> frozenset[tuple[Cell, Cell]]: ...


@dataclass(frozen=True)
class MeshKeys:
    """Every key of one mesh, from which each party's `Keyring` is cut. Link keys are
    derived (HMAC-SHA256 of the mesh secret and the link's name), so that the whole
    mesh's keys are two 32-byte secrets."""

    secret: bytes
    edge_seed: bytes  # the Ed25519 private key

    @classmethod
    def from_seed(cls, seed: int) -> MeshKeys:
        """Deterministic keys for a simulation (never for a deployment)."""
        root = hashlib.sha256(f"meshdl virtual mesh keys {seed}".encode()).digest()
        return cls(hmac.digest(root, b"links", "sha256"), hmac.digest(root, b"edge", "sha256"))

    def link_key(self, mesh_id: int, a: Cell, b: Cell) -> bytes:
        lo, hi = link(a, b)
        return hmac.digest(self.secret, struct.pack("<H4h", mesh_id, *lo, *hi), "sha256")

    def status_key(self, mesh_id: int, cell: Cell) -> bytes:
        return hmac.digest(self.secret, b"status" + struct.pack("<H2h", mesh_id, *cell),
                           "sha256")

    def edge_public(self) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.edge_seed).public_key() \
            .public_bytes_raw()

    def keyring(self, spec: LinkPlan, holder: list[Cell]) -> Keyring:
        """The keys of the parties `holder` (cells, or `EDGE`): their links, the edge's
        public key, and the signing key if the edge is among them."""
        mine = set(holder)
        links = {pair: self.link_key(spec.mesh_id, *pair) for pair in spec.links
                 if pair[0] in mine or pair[1] in mine}
        # The edge checks every node host's status record: it holds every cell's key.
        cells = sorted({cell for pair in spec.links for cell in pair} - {EDGE})
        status = {cell: self.status_key(spec.mesh_id, cell) for cell in cells
                  if cell in mine or EDGE in mine}
        return Keyring(spec.mesh_id, links, self.edge_public(),
                       self.edge_seed if EDGE in mine else None, status)


class Authenticator:
    """Seals the messages of the parties a keyring speaks for, and opens what they
    receive: the bytes of `encode` plus a tag. `open` raises a `CodecError` (reason
    `forged`) for a tag that does not verify and never returns such a message."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self.mesh_id = keyring.mesh_id
        self._links = keyring.links
        self._verify_key = Ed25519PublicKey.from_public_bytes(keyring.edge_public)
        self._sign_key = None if keyring.edge_private is None else \
            Ed25519PrivateKey.from_private_bytes(keyring.edge_private)
        # Verified edge signatures: a relay forwards them. By (kind, session), in the
        # order each session was first heard; then by step.
        self._signatures: OrderedDict[tuple[int, int], dict[int, bytes]] = OrderedDict()
        # The signatures of what the node machines cached, by (kind, session, step): a
        # repair sends those parameters, whatever was heard since (`pin`).
        self._pinned: dict[tuple[int, int, int], bytes] = {}

    def seal(self, message: Message) -> bytes:
        """The wire bytes of a message this keyring's parties send, tag included."""
        data = encode(message)
        h = message.header
        if h.kind not in SIGNED_KINDS:
            return data + self._link_tag(h.src, h.dst, data)
        signature = self._edge_signature(message)
        if is_repair(h.kind, h.phase):  # one link's: bound to its phase, sender, receiver
            return data + signature + self._link_tag(h.src, h.dst, data + signature)
        return data + signature

    def _edge_signature(self, message: Message) -> bytes:
        """The edge's signature of a wave's PARAMS or BATCH: made here by the edge, else
        one received and verified (a relay, a repairing parent)."""
        h = message.header
        if self._sign_key is not None and h.src == EDGE:
            return self._sign_key.sign(_signed_bytes(message))
        signature = self._known_signature(h.kind, h.session, h.step)
        if signature is None:  # a relay forwards only what it received and verified
            raise SealError("no_signature", f"no edge signature for {h.kind.name} of wave "
                            f"{h.step}: only the edge can start a wave")
        return signature

    def _known_signature(self, kind: int, session: int, step: int) -> bytes | None:
        """A verified edge signature of that wave: among the newest heard, or pinned."""
        return self._signatures.get((kind, session), {}).get(step) or \
            self._pinned.get((kind, session, step))

    def pin(self, kind: Kind, versions: Iterable[tuple[int, int]]) -> None:
        """Keep the signatures of `kind` for these (session, step) versions, the ones
        the node machines this process serves have cached, for as long as they stay
        cached (the last call's only; unknown versions are left out). A node keeps the
        first PARAMS of a run of slots and counts the edge's later resends of slots it
        began itself as duplicates, while `open` keeps only the newest waves: without
        the pin, four resends dropped the signature its next repair needed."""
        pinned: dict[tuple[int, int, int], bytes] = {}
        for session, step in versions:
            signature = self._known_signature(kind, session, step)
            if signature is not None:
                pinned[(kind, session, step)] = signature
        self._pinned = {k: v for k, v in self._pinned.items() if k[0] != kind} | pinned

    def open(self, data: bytes) -> Message:
        """Verify and decode wire bytes; raises CodecError naming what is wrong."""
        if len(data) <= HEADER_BYTES + LINK_TAG_BYTES:
            raise CodecError(CodecReason.TRUNCATED, f"truncated message: {len(data)} bytes, "
                             "too short for a header and its tag")
        kind, phase = data[_KIND_AT], data[_PHASE_AT]
        size = tag_bytes(kind, phase)
        body, tag = data[:-size], data[-size:]
        message = decode(body, mesh=self.mesh_id)
        h = message.header
        if h.kind not in SIGNED_KINDS:
            key = self._links.get(link(h.src, h.dst))
            if key is None or not hmac.compare_digest(tag, self._tag(key, body)):
                raise CodecError(CodecReason.FORGED, f"{h.kind.name} from {name_of(h.src)} "
                                 f"to {name_of(h.dst)}: no valid link tag")
            return message
        signature = tag[:SIGNATURE_BYTES]
        if is_repair(h.kind, h.phase):
            key = self._links.get(link(h.src, h.dst))
            if key is None or not hmac.compare_digest(
                    tag[SIGNATURE_BYTES:], self._tag(key, body + signature)):
                raise CodecError(CodecReason.FORGED, f"repair PARAMS from {name_of(h.src)} "
                                 f"to {name_of(h.dst)}: no valid link tag")
        try:
            self._verify_key.verify(signature, _signed_bytes(message))
        except InvalidSignature:
            raise CodecError(CodecReason.FORGED, f"{h.kind.name} of wave {h.step}: not "
                             "signed by the edge") from None
        self._remember(h.kind, h.session, h.step, signature)
        return message

    # ------------------------------------------------------------- status records
    def sign_status(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with its tag: the edge's signature for the edge's record, else the
        chain of the claimed cells' status keys."""
        body = status_bytes(record)
        if record.get("role") == "edge":
            if self._sign_key is None:
                raise MeshdlError("only the edge signs the edge's status record")
            return {**record, STATUS_TAG: self._sign_key.sign(body).hex()}
        names = record.get("cells", [])
        for name in names:
            if cell_of(name) not in self.keyring.status:
                raise MeshdlError(f"no status key for {name}")
        cells = _claimed_cells(names, self.keyring.status)
        if cells is None:
            raise MeshdlError("a status record claims each of its cells once")
        return {**record, STATUS_TAG: _chain(cells, body, self.keyring.status)}

    def verify_status(self, record: dict[str, Any]) -> bool:
        """Whether a received status record carries a tag only its writer could make.

        A record is untrusted input and the edge reads one whenever any client writes
        one, so the work is bounded by the grid, not by what the record claims: the
        claim is checked first (a list of distinct cells of this mesh: at most one per
        status key held), then the body is hashed once and the chain runs over that
        32-byte digest, one short HMAC per claimed cell."""
        tag = record.get(STATUS_TAG)
        if not isinstance(tag, str):
            return False
        if record.get("role") == "edge":
            try:
                self._verify_key.verify(bytes.fromhex(tag), status_bytes(record))
            except (InvalidSignature, ValueError):
                return False
            return True
        cells = _claimed_cells(record.get("cells", []), self.keyring.status)
        if cells is None:
            return False
        expected = _chain(cells, status_bytes(record), self.keyring.status)
        return hmac.compare_digest(tag, expected)

    def _link_tag(self, src: Cell, dst: Cell, data: bytes) -> bytes:
        key = self._links.get(link(src, dst))
        if key is None:
            raise SealError("no_link_key", f"no key for the link {name_of(src)}-"
                            f"{name_of(dst)}: this key file is not for the cells this "
                            "process serves")
        return self._tag(key, data)

    @staticmethod
    def _tag(key: bytes, data: bytes) -> bytes:
        return hmac.digest(key, data, "sha256")[:LINK_TAG_BYTES]

    def _remember(self, kind: Kind, session: int, step: int, signature: bytes) -> None:
        """Keep a verified signature. Anyone who reads the edge's broadcasts can replay
        them (they verify), so what is dropped to stay bounded never depends on what was
        heard last: within a session, the oldest wave (a replay of older waves drops
        itself); across sessions, the one first heard longest ago (a replay of an older
        session's waves does not bring it forward, so it cannot push out the current
        session, which was first heard after it). The signatures a repair needs are
        pinned apart (`pin`), out of reach of both."""
        steps = self._signatures.setdefault((kind, session), {})
        steps.setdefault(step, signature)
        while len(steps) > _STEPS_KEPT:
            del steps[_oldest(steps)]
        while len(self._signatures) > 2 * _SESSIONS_KEPT:  # PARAMS and BATCH of each
            self._signatures.popitem(last=False)


def _oldest(steps: dict[int, bytes]) -> int:
    """The oldest of some waves' steps, in the header's serial-number order (the one
    newer than the fewest others)."""
    return min(steps, key=lambda s: sum(newer(s, t) for t in steps))


def authenticator_for(spec: LinkPlan, parties: list[Cell], keys: Path | None,
                      enabled: bool) -> Authenticator | None:
    """The authenticator of a process acting for `parties` (cells, or `EDGE`), from its
    key file; None when the mesh does not authenticate. A key file that lacks one of
    the parties' links is refused up front, naming the link."""
    if not enabled:
        return None
    if keys is None:
        raise UsageError("mesh.auth is on: give this process its key file (mesh.keys in "
                         "the config, or MESHDL_MESH__KEYS), from `meshdl deploy credentials`")
    ring = Keyring.load(keys)
    if ring.mesh_id != spec.mesh_id:
        raise UsageError(f"{keys}: keys of mesh {ring.mesh_id}, this is mesh {spec.mesh_id}")
    mine = set(parties)
    missing = sorted(p for p in spec.links if (p[0] in mine or p[1] in mine)
                     and p not in ring.links)
    if missing:
        a, b = missing[0]
        raise UsageError(f"{keys}: no key for the link {name_of(a)}-{name_of(b)} "
                         f"({len(missing)} missing): not the key file of these cells")
    if EDGE in mine and ring.edge_private is None:
        raise UsageError(f"{keys}: not the edge's key file (it cannot sign parameters)")
    return Authenticator(ring)


def _claimed_cells(names: Any, keys: dict[Cell, bytes]) -> list[Cell] | None:
    """The cells a status record claims, or None for a claim no host can sign: not a
    list of cell names, a cell twice, a cell without a status key here. Looked at
    before any hashing, and at most one name per key held (the grid's cells) is read."""
    if not isinstance(names, list) or len(names) > len(keys):
        return None
    cells: list[Cell] = []
    seen: set[Cell] = set()
    for name in names:
        try:
            cell = cell_of(name) if isinstance(name, str) else None
        except ValueError:
            return None
        if cell is None or cell in seen or cell not in keys:
            return None
        seen.add(cell)
        cells.append(cell)
    return cells


def _chain(cells: list[Cell], body: bytes, keys: dict[Cell, bytes]) -> str:
    """The status tag of `body` claimed for `cells`: the body hashed once, then an HMAC
    chain over that digest under each claimed cell's key (a claim needs every key)."""
    tag, digest = b"", hashlib.sha256(body).digest()
    for cell in cells:
        tag = hmac.digest(keys[cell], tag + digest, "sha256")
    return tag[:LINK_TAG_BYTES].hex()


def status_bytes(record: dict[str, Any]) -> bytes:
    """What a status record's tag covers: the record without its tag, canonical JSON."""
    fields = {k: v for k, v in record.items() if k != STATUS_TAG}
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _signed_bytes(message: Message) -> bytes:
    """What the edge's signature covers: every field a relay keeps, and the payload. A
    repair carries its wave's signature (its link's tag binds the rest): the phase
    covered is the wave's."""
    h = message.header
    shape = tuple(h.shape) + (0,) * (4 - len(h.shape))
    phase = WAVE_PHASE if is_repair(h.kind, h.phase) else h.phase
    return _SIGNED_FIELDS.pack(h.kind, h.mesh, h.step, h.session, phase, h.dtype,
                               *shape) + message.payload.tobytes()



# ------------------------------------------------------------ the parameter server's links
#
# Several meshes training one model (meshdl/server): each mesh's edge and the parameter
# server share one random key, the link edge-ps of that mesh, drawn by `meshdl deploy
# central`. PUSH and WEIGHTS carry the link tag under it (HMAC-SHA256 over header and
# payload, as every link message): the header's kind, mesh, clock, session and part are
# covered, so a tag made for one mesh, clock or direction is worth nothing for another.
# The edge's key file holds its own mesh's key; the server's, every mesh's. A broker
# login alone (a stolen .env) can therefore publish on the push topic but not make a
# push the server takes.

PUSH_LINK = link(EDGE, SERVER)  # the key name of an edge's link to the parameter server
PUSH_KINDS = frozenset({Kind.PUSH, Kind.WEIGHTS})


class PushKeyFile(BaseModel):
    """A push key file as stored: the edge-ps link key of each mesh, in hex."""

    model_config = ConfigDict(extra="forbid")
    push: dict[int, str] = Field(min_length=1, max_length=0x10000)

    @field_validator("push")
    @classmethod
    def _keys_are_keys(cls, keys: dict[int, str]) -> dict[int, str]:
        for mesh, key in keys.items():
            if not 0 <= mesh <= 0xFFFF:
                raise ValueError(f"mesh {mesh} is not a header's mesh id")
            if re.fullmatch(_HEX_KEY, key) is None:
                raise ValueError(f"the key of mesh {mesh} is not {KEY_BYTES} bytes in hex")
        return keys


@dataclass(frozen=True)
class PushKeys:
    """The edge-ps link keys one party holds: the server every mesh's, an edge its own."""

    keys: dict[int, bytes]  # mesh id -> key

    @classmethod
    def draw(cls, meshes: list[int]) -> PushKeys:
        """Fresh random keys, one per mesh (`meshdl deploy central`)."""
        return cls({mesh: secrets.token_bytes(KEY_BYTES) for mesh in meshes})

    def only(self, mesh: int) -> PushKeys:
        """The key of one mesh: what that mesh's edge holds."""
        return PushKeys({mesh: self.keys[mesh]})

    def to_json(self) -> str:
        record = PushKeyFile(push={m: key.hex() for m, key in sorted(self.keys.items())})
        return record.model_dump_json(indent=1) + "\n"

    @classmethod
    def load(cls, path: Path, meshes: list[int]) -> PushKeys:
        """Read a push key file holding the keys of `meshes` at least; a missing, damaged
        or wrong one is a one-line error."""
        try:
            record = PushKeyFile.model_validate_json(path.read_bytes())
        except OSError as exc:
            raise MeshdlError(f"{path}: cannot read the push key file ({exc.strerror})"
                              ) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "file"
            raise MeshdlError(f"{path}: not a meshdl push key file ({where}: "
                              f"{first['msg']})") from None
        missing = sorted(set(meshes) - set(record.push))
        if missing:
            raise UsageError(f"{path}: no key for the link edge-ps of mesh "
                             f"{', '.join(map(str, missing))}: not the push key file of "
                             "these meshes (`meshdl deploy central` writes them)")
        return cls({m: bytes.fromhex(record.push[m]) for m in meshes})


def push_keys_for(keys: Path | None, meshes: list[int], enabled: bool) -> PushKeys | None:
    """The push keys of a process of `meshes` (an edge: its own; the server: all), from
    the file `parallel.keys` names; None when the meshes do not authenticate."""
    if not enabled:
        return None
    if keys is None:
        raise UsageError("mesh.auth is on: give this process its push key file "
                         "(parallel.keys in the config, or MESHDL_PARALLEL__KEYS), from "
                         "`meshdl deploy central`")
    return PushKeys.load(keys, meshes)


def with_push_key(auth: Authenticator, push: PushKeys) -> Authenticator:
    """An edge's authenticator that also seals its PUSH and opens the server's WEIGHTS:
    its mesh keys with the link edge-ps added."""
    ring = auth.keyring
    key = push.keys.get(ring.mesh_id)
    if key is None:
        raise UsageError(f"no key for the link edge-ps of mesh {ring.mesh_id} in the push "
                         "key file: not this mesh's")
    return Authenticator(replace(ring, links={**ring.links, PUSH_LINK: key}))


class PushAuthenticator:
    """The parameter server's side of the links edge-ps: seals WEIGHTS and opens PUSH of
    every mesh it serves, each under its mesh's key. Same tag as `Authenticator`'s link
    messages, so an edge's `Authenticator` holding its mesh's key opens and makes them."""

    def __init__(self, keys: PushKeys) -> None:
        self._keys = keys.keys

    def seal(self, message: Message) -> bytes:
        h = message.header
        if h.kind not in PUSH_KINDS or h.mesh not in self._keys:
            raise MeshdlError(f"the parameter server seals no {h.kind.name} of mesh {h.mesh}")
        data = encode(message)
        return data + Authenticator._tag(self._keys[h.mesh], data)

    def open(self, data: bytes) -> Message:
        """Verify and decode; CodecError (reason `forged`) for anything not tagged with
        its mesh's key edge-ps."""
        if len(data) <= HEADER_BYTES + LINK_TAG_BYTES:
            raise CodecError(CodecReason.TRUNCATED, f"truncated message: {len(data)} bytes, "
                             "too short for a header and its tag")
        body, tag = data[:-LINK_TAG_BYTES], data[-LINK_TAG_BYTES:]
        message = decode(body)
        h = message.header
        key = self._keys.get(h.mesh)
        if h.kind not in PUSH_KINDS or key is None or \
                link(h.src, h.dst) != PUSH_LINK or \
                not hmac.compare_digest(tag, Authenticator._tag(key, body)):
            raise CodecError(CodecReason.FORGED, f"{h.kind.name} of mesh {h.mesh}: no valid "
                             "tag of the link edge-ps")
        return message
