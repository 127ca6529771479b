"""Every message kind as one row: who sends it to whom, when, carrying what.

`KINDS` is the protocol's table in code, one `KindRow` per `Kind`, in the kinds' order.
What is defined elsewhere is read from there, not typed again: the accounting class
(`messages.CLASS_OF`, per conv layer as `accounting.class_name` says), the signed kinds
and tag lengths (`auth`), the wire dtypes (`messages`). PROTOCOL.md's "Message kinds"
table is `markdown()`'s output (tests/test_protocol_table.py keeps the two equal), and
`meshdl plan` lists a node's kinds from `KINDS` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from meshdl.protocol.accounting import class_name
from meshdl.protocol.auth import SIGNED_KINDS, tag_bytes
from meshdl.protocol.messages import CLASS_OF, DTYPES, FLOAT32, INT32, Kind


class Party(Enum):
    """Who takes part in the protocol."""

    NODE = "node"
    EDGE = "edge"
    SERVER = "parameter server"


class Phase(Enum):
    """When in (or around) a wave a kind is sent."""

    START = "wave start"
    FORWARD = "forward"
    BACKWARD = "backward, training waves only"
    AFTER = "after a wave"


@dataclass(frozen=True)
class KindRow:
    """One message kind: its parties and relation, its moment, its payload, and what the
    accounting, authentication and MQTT make of it."""

    kind: Kind
    senders: frozenset[Party]  # which parties send it
    sender: str  # the sender's relation to the receiver, in words
    receiver: str
    phase: Phase
    trigger: str  # what makes it go out, within its phase
    dtype: int  # the wire dtype's code (messages.DTYPES) when not compressed
    shape: str  # the payload's shape or layout, in words
    carries: str  # what its values are
    qos: int  # MQTT quality of service (meshdl/mqtt/session.py publishes with it)
    alternative: str = ""  # another way it travels (a hello, a broadcast)

    @property
    def ledger_class(self) -> str:
        """Its accounting class; `/convL` when the ledger counts it per conv layer."""
        per_layer = class_name(self.kind, 1) != class_name(self.kind, 2)
        return f"{CLASS_OF[self.kind]}/convL" if per_layer else CLASS_OF[self.kind]

    @property
    def signed(self) -> bool:
        """Does it carry the edge's signature (else, with `mesh.auth`, a link tag)?"""
        return self.kind in SIGNED_KINDS

    @property
    def tag_bytes(self) -> int:
        """Bytes of its signature or link tag when the mesh authenticates."""
        return tag_bytes(self.kind)

    @property
    def auth(self) -> str:
        """Its authentication in words."""
        what = "edge's signature" if self.signed else "link tag"
        return f"{what}, {self.tag_bytes} bytes"

    @property
    def training_only(self) -> bool:
        """Sent only in training waves (not in inference waves)."""
        return self.phase is Phase.BACKWARD

    @property
    def route(self) -> str:
        """"from -> to", with its alternative in brackets."""
        extra = f" ({self.alternative})" if self.alternative else ""
        return f"{self.sender} -> {self.receiver}{extra}"

    @property
    def when(self) -> str:
        return f"{self.phase.value}: {self.trigger}"

    @property
    def payload(self) -> str:
        """Its payload in words: dtype, shape, what it carries."""
        words = " ".join(part for part in (DTYPES[self.dtype].name, self.shape) if part)
        if not self.carries:
            return words
        return f"{words}: {self.carries}" if self.shape else f"{words} {self.carries}"

    def record(self) -> dict[str, object]:
        """The row as plain data (JSON)."""
        return {"kind": self.kind.name, "senders": sorted(p.value for p in self.senders),
                "from": self.sender, "to": self.receiver, "alternative": self.alternative,
                "phase": self.phase.value, "when": self.trigger, "payload": self.payload,
                "class": self.ledger_class, "auth": self.auth, "qos": self.qos,
                "training_only": self.training_only}


_NODE, _EDGE, _SERVER = (frozenset({p}) for p in Party)
_BOTH = frozenset({Party.NODE, Party.EDGE})  # the edge to edge_at, nodes onward

KINDS: tuple[KindRow, ...] = (
    KindRow(Kind.PARAMS, _BOTH, "parent", "child", Phase.START,
            "from the edge; each node forwards it to its children once", FLOAT32, "",
            "conv parameters, then norm mean, norm std", 1,
            "over MQTT: edge -> every node at once"),
    KindRow(Kind.BATCH, _BOTH, "parent", "child", Phase.START, "with PARAMS", INT32,
            "`[mode, split, *sample indices, *failout cells]`", "", 1,
            "over MQTT: edge -> every node at once"),
    KindRow(Kind.HALO, _NODE, "neighbour", "neighbour", Phase.FORWARD,
            "once every cell it carries is known", FLOAT32, "(cells, channels, B)",
            "activations for a window", 0),
    KindRow(Kind.POOL, _NODE, "member", "towards leader", Phase.FORWARD,
            "once every cell it carries is known (relays aggregate)", FLOAT32,
            "(cells, filters, B)", "last conv outputs", 0),
    KindRow(Kind.GATHER, _NODE, "child", "parent", Phase.FORWARD,
            "once the pooled blocks of its whole subtree are in (global pooling: its "
            "subtree's maxima)", FLOAT32,
            "(blocks, filters, B)", "pooled features of a subtree; global pooling: its "
            "maxima (phase 0), in training also their first cells (phase 1)", 0),
    KindRow(Kind.SCATTER, _BOTH, "parent", "child", Phase.BACKWARD,
            "the edge after its head; a node once its child's blocks are in", FLOAT32,
            "(blocks, filters, B)", "d loss / d pooled (global pooling: of what the "
            "child's subtree won)", 0),
    KindRow(Kind.ROUTE, _NODE, "leader", "towards member", Phase.BACKWARD,
            "once every cell it carries is known", FLOAT32, "(cells, filters, B)",
            "max-pool routed gradient", 0),
    KindRow(Kind.GRAD_HALO, _NODE, "neighbour", "neighbour", Phase.BACKWARD,
            "once every cell it carries is known", FLOAT32, "(cells, filters, B)",
            "d loss / d conv output", 0),
    KindRow(Kind.REDUCE, _NODE, "child", "parent", Phase.BACKWARD,
            "last, once its own gradients and its children's REDUCEs are in", FLOAT32, "",
            "conv-parameter gradients of a subtree, summed (then a position bias's)", 0),
    KindRow(Kind.HEALTH, _NODE, "child", "parent", Phase.START,
            "in best effort, as a silent wave ends and with each wave after; relayed up to "
            "the edge",
            INT32, "cells", "+(n+1) silent, -(n+1) back", 0,
            "a hello: to a grid neighbour"),
    KindRow(Kind.PUSH, _EDGE, "edge", "parameter server", Phase.AFTER,
            "several meshes, once per training wave", FLOAT32,
            "`[based_on, samples, correct, loss, *gradient]`", "", 1),
    KindRow(Kind.WEIGHTS, _SERVER, "parameter server", "edge", Phase.AFTER,
            "once the server updated, or to answer a push", FLOAT32, "",
            "parameters (all, or one part)", 1),
)

ROW = {row.kind: row for row in KINDS}

_COLUMNS = ("kind", "from -> to", "when", "payload", "class", "auth (`mesh.auth`)",
            "MQTT QoS")


def sent_by(party: Party) -> tuple[KindRow, ...]:
    """The rows of the kinds `party` sends, in the kinds' order."""
    return tuple(row for row in KINDS if party in row.senders)


def markdown() -> str:
    """PROTOCOL.md's "Message kinds" table."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + " --- |" * len(_COLUMNS)]
    for row in KINDS:
        cells = (row.kind.name, row.route, row.when, row.payload, row.ledger_class,
                 row.auth, str(row.qos))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
