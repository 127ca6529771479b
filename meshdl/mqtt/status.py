"""Status records: what each client says about itself on its retained status topic.

`meshdl/<mesh>/status/<client>` holds one JSON object per client, written by the client
itself (heartbeats, and its last will when it drops): {"role", "state", "mesh", "time"};
for a node host the "cells" it serves, the "spec" of the mesh it runs (`MeshSpec.summary`),
the "data" it replays (a digest), what it has "rejected" and (live) the cells it could
not read for a slot ("unread", "unread_slot", "unread_error"); for the edge its "session"
and "since" (when it took the mesh: the edge's status topic is the mesh's lease, see
edge/remote.py). The edge reads them to know when every cell is served, by hosts that
run its mesh and data; `meshdl doctor` lists them. Any client may write its own status topic and the
broker replays it to every later subscriber, so a record is untrusted input: it is read
with a size limit, pydantic's JSON parser (which refuses nesting beyond its recursion
limit instead of exhausting Python's stack) and a schema, and a bad one is ignored by the
reader, which counts it; nothing a record holds can stop a reader.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshdl.protocol.messages import ALL, EDGE
from meshdl.protocol.topics import cell_of

MAX_STATUS_BYTES = 256 * 1024  # a node host serving 20,000 cells fits; a flood does not
MAX_CELLS = 1 << 16
MAX_ERROR_CHARS = 200  # a sensor's error, as a status record carries it
# A record replayed from the broker's store counts only while its heartbeat time is this
# recent (clients re-announce every 5 s): a host that died without its will being
# delivered, or a record a client left behind, must not pass for a running host.
FRESH_S = 20.0

Role = Literal["node-host", "edge", "doctor", "parameter-server"]


class StatusRecord(BaseModel):
    """One client's status; the fields a reader acts on, any others ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Role
    state: Literal["online", "offline"]
    mesh: int = Field(ge=0, le=0xFFFF)
    time: float | None = None  # the writer's clock at its last heartbeat (Unix seconds)
    cells: Annotated[list[str], Field(max_length=MAX_CELLS)] = []
    spec: Annotated[dict[str, int | bool | str | float | list[int] | None],
                    Field(max_length=64)] | None = None
    data: Annotated[str, Field(max_length=64)] | None = None  # digest of a replayed data set
    rejected: Annotated[dict[str, int], Field(max_length=256)] = {}  # by reason, summed
    refused: Annotated[dict[str, int], Field(max_length=32)] = {}  # by the broker, by reason
    failed: Annotated[list[str], Field(max_length=MAX_CELLS)] = []  # isolated cells
    # Live: the cells whose sensors gave no valid reading for slot `unread_slot`, and
    # why (the first one's error): a slot that gets no result is told by it.
    unread: Annotated[list[str], Field(max_length=MAX_CELLS)] = []
    unread_slot: int | None = Field(None, ge=0)
    unread_error: Annotated[str, Field(max_length=MAX_ERROR_CHARS)] | None = None
    session: int | None = Field(None, ge=0, le=0xFFFF)  # the edge's
    since: float | None = None  # when the edge took the mesh (Unix seconds)

    @field_validator("cells", "unread")
    @classmethod
    def _cell_names(cls, names: list[str]) -> list[str]:
        # A host serves each cell once: a name twice is a made-up claim (and the edge
        # would otherwise check the claim's signature once per repetition). Checked
        # before the names themselves, which costs a regular expression each.
        if len(set(names)) != len(names):
            raise ValueError("a cell is claimed twice")
        for name in names:  # ValueError (-> ValidationError) for anything but "r<R>c<C>"
            if cell_of(name) in (EDGE, ALL):
                raise ValueError(f"{name!r} is not a sensor cell")
        return names

    def fresh(self, now: float, retained: bool) -> bool:
        """Whether this record speaks for a client alive now: published now, or replayed
        by the broker with a heartbeat time within FRESH_S of `now` (Unix seconds)."""
        return not retained or (self.time is not None and abs(now - self.time) <= FRESH_S)

    @property
    def served(self) -> set[tuple[int, int]]:
        """The cells this record says its client serves (none unless online)."""
        return {cell_of(n) for n in self.cells} if self.state == "online" else set()


def parse_status(payload: bytes) -> StatusRecord | None:
    """The record in `payload`, or None for anything that is not a valid one."""
    if len(payload) > MAX_STATUS_BYTES:
        return None
    try:
        return StatusRecord.model_validate_json(payload)
    except ValidationError:
        return None
