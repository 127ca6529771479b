"""MQTT-style topic names of a mesh, shared by the virtual broker and real MQTT.

    meshdl/<mesh>/<src>/<dst>/<kind>     one hop, e.g. meshdl/7/r0c1/r0c2/halo
    meshdl/<mesh>/edge/all/<kind>        the edge to every node (parameters, batch)
    meshdl/<mesh>/edge/ps/push           the edge's gradients to the parameter server
    meshdl/<mesh>/ps/edge/weights        the parameter server's weights to the edge
    meshdl/<mesh>/status/<client>        a client's liveness: retained JSON, its will
    meshdl/<mesh>/alerts                 the edge's anomaly alerts: retained JSON

A cell is named `r<row>c<col>`, the edge `edge`, the parameter server `ps` (several
meshes training one model: meshdl/server). A node publishes only under its own
name (`meshdl/<mesh>/<self>/#`) and subscribes only to what its one-hop neighbours
address to it (`meshdl/<mesh>/<neighbour>/<self>/#`) and to the edge's broadcasts,
which is what a broker ACL can enforce per node: no node can write parameters.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from meshdl.protocol.messages import ALL, EDGE, SERVER, Header, Kind

ROOT = "meshdl"
_CELL = re.compile(r"^r(\d{1,5})c(\d{1,5})$")
_FORBIDDEN = set("+#/\x00")


ALL_NAME = "all"  # the destination level of the edge's broadcasts
SERVER_NAME = "ps"  # the parameter server's level


def name_of(cell: tuple[int, int]) -> str:
    if cell == EDGE:
        return "edge"
    if cell == ALL:
        return ALL_NAME
    if cell == SERVER:
        return SERVER_NAME
    return f"r{cell[0]}c{cell[1]}"


def cell_of(name: str) -> tuple[int, int]:
    """Inverse of `name_of`; ValueError for anything else."""
    if name == "edge":
        return EDGE
    if name == ALL_NAME:
        return ALL
    if name == SERVER_NAME:
        return SERVER
    match = _CELL.match(name)
    if not match or name_of((int(match[1]), int(match[2]))) != name:  # r01c2 is not r1c2
        raise ValueError(f"not a cell name: {name!r}")
    return int(match[1]), int(match[2])


def check_id(value: str, what: str = "id") -> str:
    """Mesh ids and names become topic levels: no wildcards, separators or NUL."""
    if not value or _FORBIDDEN & set(value):
        raise ValueError(f"{what} {value!r} must be non-empty without '+', '#', '/' or NUL")
    return value


def topic(mesh: int, src: tuple[int, int], dst: tuple[int, int], kind: Kind) -> str:
    return f"{ROOT}/{mesh}/{name_of(src)}/{name_of(dst)}/{kind.name.lower()}"


def push_topic(mesh: int) -> str:
    """Where mesh `mesh`'s edge pushes its gradients to the parameter server."""
    return topic(mesh, EDGE, SERVER, Kind.PUSH)


def weights_topic(mesh: int) -> str:
    """Where the parameter server sends mesh `mesh`'s edge its weights."""
    return topic(mesh, SERVER, EDGE, Kind.WEIGHTS)


class Route(NamedTuple):
    """What a mesh message's topic says: who sends, to whom, what kind."""

    src: tuple[int, int]
    dst: tuple[int, int]
    kind: Kind

    def agrees_with(self, header: Header) -> bool:
        """A header must say what its topic says: the broker's ACL checks the topic."""
        return (header.src, header.dst, header.kind) == self


_KINDS = {kind.name.lower(): kind for kind in Kind}


class TopicNames:
    """Topic names of mesh messages, made and read once each: a wave sends the same few
    thousand topics again and again (both transports, every node host and the edge)."""

    def __init__(self, mesh: int) -> None:
        self.mesh = mesh
        self._names: dict[tuple, str] = {}
        self._routes: dict[str, Route] = {}

    def of(self, header: Header) -> str:
        """The topic a message with this header is published on (under the header's
        mesh: a parameter server publishes to several)."""
        key = (header.mesh, header.src, header.dst, header.kind)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = topic(*key)
        return name

    def route(self, name: str) -> Route | None:
        """What a received topic says, or None for one no mesh message has. Only valid
        routes are remembered: a flood of made-up topics cannot grow the cache beyond
        the mesh's real topics."""
        route = self._routes.get(name)
        if route is not None:
            return route
        levels = name.split("/")
        if len(levels) != 5 or levels[:2] != [ROOT, str(self.mesh)] or \
                levels[4] not in _KINDS:
            return None
        try:
            route = Route(cell_of(levels[2]), cell_of(levels[3]), _KINDS[levels[4]])
        except ValueError:
            return None
        self._routes[name] = route
        return route


def inbox_filter(mesh: int, src: tuple[int, int], dst: tuple[int, int]) -> str:
    """What `dst` subscribes to for messages from its neighbour `src`."""
    return f"{ROOT}/{mesh}/{name_of(src)}/{name_of(dst)}/#"


def broadcast_filter(mesh: int) -> str:
    """What every node subscribes to for the edge's broadcasts."""
    return f"{ROOT}/{mesh}/edge/{ALL_NAME}/#"


def status_topic(mesh: int, client: str) -> str:
    """A client's retained liveness record (its last will says "offline")."""
    return f"{ROOT}/{mesh}/status/{check_id(client, 'client name')}"


def alerts_topic(mesh: int) -> str:
    return f"{ROOT}/{mesh}/alerts"


def topic_matches(filter_: str, topic_: str) -> bool:
    """MQTT matching: '+' is one level, a trailing '#' any number of levels (even 0)."""
    f_parts, t_parts = filter_.split("/"), topic_.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts) or (part != "+" and part != t_parts[i]):
            return False
    return len(f_parts) == len(t_parts)
