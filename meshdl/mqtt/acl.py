"""Who may publish and subscribe to what on a mesh's broker: the Mosquitto ACL, as data.

Pure functions, no I/O: `mesh_users` lists every broker user of a mesh with its grants,
`acl_text` renders them as a Mosquitto `acl_file`, and `parse_cells`/`parse_host` read
the `R0-R1,C0-C1` cell ranges that node hosts and `meshdl nodes run --cells` use.
`meshdl deploy credentials` (meshdl/cli/deploy.py) writes the files.

The rules follow the topic scheme (meshdl/protocol/topics.py) and the wave protocol: a node only
ever talks to its one-hop neighbours, and only the edge sends parameters. So

- a node (user `r<row>c<col>`) writes exactly the topics `meshdl/<mesh>/<self>/<n>/<kind>`
  of the kinds it sends each one-hop neighbour n (`node_topics`) and its status topic,
  and reads `meshdl/<mesh>/<n>/<self>/#` for each one-hop neighbour n (the edge for the
  `edge_at` cell) plus the edge's broadcasts `meshdl/<mesh>/edge/all/#`;
- the edge (user `edge`) writes its broadcasts (params, batch), its scatters and
  repairs (params) to `edge_at`, its status and the alerts topic, and reads what
  `edge_at` sends it and every client's status;
- a node host (one process serving several cells over one connection) gets its cells'
  grants on the links that leave the host (it passes messages between its own cells
  in process; `host_grants`), and its own status topic (its connection's last will);
- `monitor` reads status and alerts, nothing else.

Several meshes training one model (meshdl/server): each building's broker carries its
own mesh, and a Mosquitto bridge carries its edge's pushes to a central broker, where
the parameter server runs, and the server's weights back. With `parameter_server` the
edge also reads its weights topic (the bridge brings them in); on the central broker
(`central_users`), the server `ps` reads every mesh's pushes and writes every mesh's
weights, and each building's bridge (user `bridge-<mesh>`) writes its mesh's pushes and
reads its mesh's weights only, so no building can pose as another or as the server.

Mosquitto denies whatever an `acl_file` does not grant, so nothing else is needed: no
node can write under `edge/` (parameters), read a non-neighbour's messages, or pose as
another node. Topic lines are only ever given inside `user` blocks: lines before the
first `user` would apply to anonymous clients.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from meshdl.protocol.messages import ALL, EDGE, Kind
from meshdl.protocol.topics import (
    ROOT,
    alerts_topic,
    broadcast_filter,
    inbox_filter,
    name_of,
    push_topic,
    status_topic,
    topic,
    weights_topic,
)
from meshdl.protocol.topology import Cell, Topology

Access = Literal["read", "write", "readwrite"]

EDGE_USER = "edge"
MONITOR_USER = "monitor"
SERVER_USER = "ps"
# Names a node host cannot take: the mesh's other logins (the parameter server's and the
# bridges' are the central broker's, but one name must mean one login everywhere), and
# the words the topic scheme uses as levels.
RESERVED_USERS = frozenset({EDGE_USER, MONITOR_USER, SERVER_USER, "all", "status", "alerts"})
# Host names become broker user names, file names (secrets/<name>.env) and topic levels
# (status/<name>): letters, digits, '.', '_' and '-' only, starting with a letter.
_HOST_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_CELL_NAME = re.compile(r"^r\d+c\d+$")
_BRIDGE_NAME = re.compile(r"^bridge-\d+$")  # `bridge_user`
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class Grant:
    """One `topic <access> <filter>` line of an ACL."""

    access: Access
    topic: str


@dataclass(frozen=True)
class MeshUser:
    """A broker user: its name, what it is, the cells it acts for, and its grants."""

    name: str
    role: Literal["edge", "node", "host", "monitor", "server", "bridge"]
    cells: tuple[Cell, ...]
    grants: tuple[Grant, ...]


# What a node publishes to each neighbour (PROTOCOL.md, "Message kinds"): halos both
# ways; gather, reduce and health up the tree and scatter down it, to any neighbour,
# since a replanned mesh (dead cells, best effort) may hang the tree differently; pool
# and route only within its pooling block. To the edge (from `edge_at`): what goes up
# the tree. Over a broker the edge broadcasts the parameters and batch, so no node
# sends a batch, nor parameters but in a repair.
NEIGHBOUR_KINDS = (Kind.HALO, Kind.GRAD_HALO, Kind.GATHER, Kind.SCATTER, Kind.REDUCE,
                   Kind.HEALTH)
BLOCK_KINDS = (Kind.POOL, Kind.ROUTE)
EDGE_LINK_KINDS = (Kind.GATHER, Kind.REDUCE, Kind.HEALTH)
# Repair (nodes/agent.py, "Repair"): a node's cached PARAMS to a tree child that asks for
# them (to any neighbour, as SCATTER), and the edge's to `edge_at`. A repair carries the
# edge's signature and its one link's tag (meshdl/protocol/auth.py): this grant lets a
# stolen login publish there, not make a repair a node takes.
REPAIR_KINDS = (Kind.PARAMS,)


def node_topics(mesh: int, topology: Topology, cell: Cell,
                skip: frozenset[Cell] = frozenset()) -> list[str]:
    """Every topic the node at `cell` publishes a mesh message on (to its neighbours but
    those in `skip`): exactly these, no subtree (a free subtree would let a stolen login
    fill the broker with retained messages on topics nobody reads)."""
    names = []
    for n in topology.neighbours(cell):
        if n in skip:
            continue
        kinds = EDGE_LINK_KINDS if n == EDGE else NEIGHBOUR_KINDS + REPAIR_KINDS + (
            BLOCK_KINDS if topology.block_of(n) == topology.block_of(cell) else ())
        names += [topic(mesh, cell, n, kind) for kind in kinds]
    return names


def node_grants(mesh: int, topology: Topology, cell: Cell) -> list[Grant]:
    """What the node at `cell` may do: send as itself on the topics of its links, hear
    its neighbours and the edge. Its status topic is the only one it writes retained."""
    me = name_of(cell)
    grants = [Grant("write", name) for name in node_topics(mesh, topology, cell)]
    grants.append(Grant("write", status_topic(mesh, me)))
    grants += [Grant("read", inbox_filter(mesh, n, cell)) for n in topology.neighbours(cell)]
    grants.append(Grant("read", broadcast_filter(mesh)))
    return grants


def edge_grants(mesh: int, topology: Topology,
                parameter_server: bool = False) -> list[Grant]:
    """The edge broadcasts parameters and batches and sends `edge_at` its scatters
    (and, training with other meshes, pushes its gradients): exactly those topics; it
    hears only `edge_at`, and the parameter server's weights for its mesh. Its status
    (the lease) and the alerts are its retained records."""
    grants = [
        Grant("write", topic(mesh, EDGE, ALL, Kind.PARAMS)),
        Grant("write", topic(mesh, EDGE, ALL, Kind.BATCH)),
        Grant("write", topic(mesh, EDGE, topology.edge_at, Kind.SCATTER)),
        Grant("write", topic(mesh, EDGE, topology.edge_at, Kind.PARAMS)),  # its repair
        Grant("write", status_topic(mesh, EDGE_USER)),
        Grant("write", alerts_topic(mesh)),
        Grant("read", inbox_filter(mesh, topology.edge_at, EDGE)),
        Grant("read", f"{ROOT}/{mesh}/status/#"),
    ]
    if parameter_server:
        grants += [Grant("write", push_topic(mesh)), Grant("read", weights_topic(mesh))]
    return grants


def server_grants(meshes: Iterable[int]) -> list[Grant]:
    """The parameter server: every mesh's pushes in, its weights out; its status."""
    meshes = list(meshes)
    grants = [Grant("write", status_topic(meshes[0], SERVER_USER))]
    for mesh in meshes:
        grants += [Grant("read", push_topic(mesh)), Grant("write", weights_topic(mesh))]
    return grants


def bridge_grants(mesh: int) -> list[Grant]:
    """A building's bridge on the central broker: its mesh's pushes out, weights in."""
    return [Grant("write", push_topic(mesh)), Grant("read", weights_topic(mesh))]


def bridge_user(mesh: int) -> str:
    return f"bridge-{mesh}"


def central_users(meshes: Iterable[int]) -> list[MeshUser]:
    """The central broker's users: the parameter server and one bridge per mesh."""
    meshes = list(meshes)
    return [MeshUser(SERVER_USER, "server", (), tuple(server_grants(meshes))),
            *(MeshUser(bridge_user(m), "bridge", (), tuple(bridge_grants(m)))
              for m in meshes)]


TLS_PORT = 8883  # MQTT over TLS (IANA), production.conf's network listener
SYSTEM_CAPATH = "/etc/ssl/certs"  # Debian's and Raspberry Pi OS's trusted CAs


@dataclass(frozen=True)
class CentralBroker:
    """Where the buildings' bridges reach the central broker, and how: over TLS (the
    certificate checked against `cafile`, a path on the building's machine, or the
    system's CAs without one) or, asked for by name, in clear."""

    host: str
    port: int
    tls: bool
    cafile: str | None = None

    @classmethod
    def parse(cls, text: str, cafile: str | None = None) -> CentralBroker:
        """`mqtts://HOST[:PORT]` (TLS, port 8883 by default), `mqtt://HOST[:PORT]` (in
        clear, 1883), or `HOST:PORT`: TLS on 8883 or with a CA file, else in clear, as
        a broker URL of meshdl reads (mqtt/session.py). ValueError naming the problem."""
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "", text
        if scheme not in ("", "mqtt", "mqtts"):
            raise ValueError(f"{text}: expected HOST:PORT, mqtts://HOST[:PORT] or "
                             "mqtt://HOST[:PORT]")
        host, colon, port = rest.rpartition(":")
        if not colon:
            host, port = rest, "" if scheme else "?"
        if not host or "/" in host or "@" in host or \
                not (port == "" or (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"{text}: expected HOST:PORT, mqtts://HOST[:PORT] or "
                             "mqtt://HOST[:PORT]")
        if scheme == "mqtt" and cafile is not None:
            raise ValueError(f"{text}: mqtt:// is in clear, a CA file is for TLS "
                             "(mqtts://)")
        number = int(port) if port else TLS_PORT if scheme == "mqtts" else 1883
        tls = scheme == "mqtts" or (scheme == "" and (number == TLS_PORT or
                                                        cafile is not None))
        return cls(host, number, tls, cafile)

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def bridge_config(mesh: int, central: CentralBroker, password: str) -> str:
    """The lines a building's Mosquitto needs to bridge its mesh's server traffic to the
    central broker (QoS 1 both ways, as the edge and the server publish it). They hold
    the bridge's password, which Mosquitto takes only inline: the file is a secret of
    its own, read through `include_dir` from a directory only the broker's user can
    read (Mosquitto reads its configuration, included files too, before it drops
    privileges, and again as that user on a reload), so that mosquitto.conf holds none.

    Over TLS the bridge checks the central broker's certificate and its name (a bridge
    without `bridge_cafile`/`bridge_capath` speaks MQTT in clear to a TLS listener,
    which refuses it: "wrong version number"), at TLS 1.2 or later, as production.conf's
    listener takes."""
    lines = [
        f"# meshdl mesh {mesh}: pushes to the central parameter server, weights back.",
        "# A secret (the bridge's password): install it as "
        f"/etc/mosquitto/meshdl/bridge.d/bridge-{mesh}.conf,",
        "# owner mosquitto, mode 0600, and end mosquitto.conf with",
        "#   include_dir /etc/mosquitto/meshdl/bridge.d",
        "# Never paste these lines into mosquitto.conf itself.",
        f"connection meshdl-{mesh}-central",
        f"address {central.host}:{central.port}",
        f"remote_username {bridge_user(mesh)}",
        f"remote_password {password}",
        f"remote_clientid meshdl-bridge-{mesh}",
        "cleansession false",
        f"topic {push_topic(mesh)} out 1",
        f"topic {weights_topic(mesh)} in 1",
    ]
    if central.tls:
        lines += [
            f"# TLS: the central broker's certificate must be signed by this CA and name "
            f"{central.host}.",
            f"bridge_cafile {central.cafile}" if central.cafile is not None else
            f"bridge_capath {SYSTEM_CAPATH}",
            "bridge_insecure false",
            "bridge_tls_version tlsv1.2",
        ]
    else:
        lines += ["# In clear: the password, pushes and weights cross the network unencrypted",
                  "# (`meshdl deploy central --central mqtts://HOST` bridges over TLS)."]
    return "\n".join([*lines, ""])


def monitor_grants(mesh: int) -> list[Grant]:
    """A dashboard or `meshdl doctor`: liveness and alerts, read-only."""
    return [
        Grant("read", f"{ROOT}/{mesh}/status/#"),
        Grant("read", alerts_topic(mesh)),
    ]


def host_grants(mesh: int, topology: Topology, host: str, cells: Iterable[Cell],
                via_broker: bool = False) -> list[Grant]:
    """A node host: its own status (its will, the one record it writes: its cells have
    none of their own), and its cells' links that leave the host, the edge's among them,
    both ways. Between its own cells it hands messages over in process (`meshdl nodes
    run`'s default), so those topics are not granted: each is a place a stolen login
    could leave a retained message of up to the broker's message size, and a floor host
    has many times more inner topics than topics to others (0-3,0-24 of 17 x 25: 179
    topics to write, where its cells' union has 2,698).
    `via_broker`: the host runs with `--via-broker` and sends its cells' messages to
    each other through the broker too, so it gets every topic of its cells' links."""
    cells = list(cells)
    inner = frozenset() if via_broker else frozenset(cells)
    grants = [Grant("write", status_topic(mesh, host))]
    for cell in cells:
        grants += [Grant("write", name) for name in node_topics(mesh, topology, cell, inner)]
        grants += [Grant("read", inbox_filter(mesh, n, cell))
                   for n in topology.neighbours(cell) if n not in inner]
    grants.append(Grant("read", broadcast_filter(mesh)))
    return _unique(grants)


def mesh_users(
    mesh: int,
    topology: Topology,
    hosts: Mapping[str, Iterable[Cell]] | None = None,
    monitor: bool = True,
    parameter_server: bool = False,
    hosts_via_broker: bool = False,
) -> list[MeshUser]:
    """Every broker user of a mesh: the edge, one per cell, the node hosts, the monitor
    (`parameter_server`: the mesh trains with others, its edge hears their server;
    `hosts_via_broker`: the node hosts pass their own cells' messages through the
    broker, `host_grants`)."""
    users = [MeshUser(EDGE_USER, "edge", (),
                      tuple(edge_grants(mesh, topology, parameter_server)))]
    users += [
        MeshUser(name_of(cell), "node", (cell,), tuple(node_grants(mesh, topology, cell)))
        for cell in topology.cells()
    ]
    served_by: dict[Cell, str] = {}
    for host, cells in (hosts or {}).items():
        check_host_name(host)
        cells = tuple(cells)
        for cell in cells:
            if not topology.inside(cell):
                raise ValueError(f"host {host}: cell {cell} is outside the "
                                 f"{topology.rows} x {topology.cols} grid")
            # Two processes acting for one cell would both answer its neighbours.
            if cell in served_by:
                raise ValueError(f"cell {name_of(cell)} is in two hosts: "
                                 f"{served_by[cell]} and {host}")
            served_by[cell] = host
        users.append(MeshUser(host, "host", cells,
                              tuple(host_grants(mesh, topology, host, cells,
                                                hosts_via_broker))))
    if monitor:
        users.append(MeshUser(MONITOR_USER, "monitor", (), tuple(monitor_grants(mesh))))
    return users


def acl_text(users: Iterable[MeshUser], header: str = "") -> str:
    """A Mosquitto `acl_file`: one `user` block per user, nothing granted outside them."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += ["# Mosquitto denies everything not granted below (no anonymous topics).", ""]
    for user in users:
        lines.append(f"user {user.name}")
        lines += [f"topic {g.access} {g.topic}" for g in user.grants]
        lines.append("")
    return "\n".join(lines)


def parse_acl(text: str) -> dict[str, list[Grant]]:
    """The grants per user of an `acl_file` written by `acl_text` (for checks and tests)."""
    out: dict[str, list[Grant]] = {}
    user: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword == "user":
            user = rest.strip()
            out.setdefault(user, [])
        elif keyword == "topic" and user is not None:
            access, _, filter_ = rest.strip().partition(" ")
            if access not in ("read", "write", "readwrite"):
                raise ValueError(f"unknown access {access!r} in ACL line {raw!r}")
            out[user].append(Grant(access, filter_.strip()))  # type: ignore[arg-type]
        else:
            raise ValueError(f"unexpected ACL line {raw!r}")
    return out


# --------------------------------------------------------------------------- cell ranges


def parse_cells(text: str, rows: int, cols: int) -> list[Cell]:
    """'R0-R1,C0-C1' (inclusive ranges or single numbers) -> the cells, row-major.

    '0-3,0-24' is rows 0..3 of 25 columns; '2,5' is the single cell (2, 5); '1,0-4'
    is part of row 1. ValueError, naming the problem, for anything else.
    """
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"cells {text!r}: expected ROWS,COLS such as 0-3,0-24 or 2,5")
    row_lo, row_hi = _parse_range(parts[0], "row", rows, text)
    col_lo, col_hi = _parse_range(parts[1], "column", cols, text)
    return [(r, c) for r in range(row_lo, row_hi + 1) for c in range(col_lo, col_hi + 1)]


def _parse_range(part: str, axis: str, size: int, text: str) -> tuple[int, int]:
    match = _RANGE.match(part)
    if not match:
        raise ValueError(f"cells {text!r}: {axis}s {part.strip()!r} are not N or N-M "
                         "(non-negative integers)")
    lo = int(match[1])
    hi = int(match[2]) if match[2] is not None else lo
    if lo > hi:
        raise ValueError(f"cells {text!r}: {axis} range {lo}-{hi} is reversed (write {hi}-{lo})")
    if hi >= size:
        raise ValueError(f"cells {text!r}: {axis} {hi} is outside the grid "
                         f"({axis}s 0-{size - 1})")
    return lo, hi


def parse_host(spec: str, rows: int, cols: int) -> tuple[str, list[Cell]]:
    """'NAME=R0-R1,C0-C1' -> (NAME, its cells); ValueError naming the problem."""
    name, sep, cells = spec.partition("=")
    if not sep:
        raise ValueError(f"host {spec!r}: expected NAME=ROWS,COLS such as floor1=0-3,0-24")
    name = name.strip()
    check_host_name(name)
    return name, parse_cells(cells, rows, cols)


def check_host_name(name: str) -> str:
    """A node host's name: a valid user/file/topic name that no other user has."""
    if not _HOST_NAME.match(name):
        raise ValueError(f"host name {name!r}: use a letter, then letters, digits, '.', '_' "
                         "or '-' (at most 64)")
    if name in RESERVED_USERS or _CELL_NAME.match(name) or _BRIDGE_NAME.match(name):
        raise ValueError(f"host name {name!r} is taken (the edge, the monitor, the "
                         "parameter server ps, the bridges bridge-<mesh> and cells "
                         "r<row>c<col> have their own users)")
    return name


def format_cells(cells: Iterable[Cell]) -> str:
    """The 'R0-R1,C0-C1' text of a rectangle of cells (inverse of `parse_cells`)."""
    cells = set(cells)
    rows = sorted({r for r, _ in cells})
    cols = sorted({c for _, c in cells})
    full = {(r, c) for r in range(rows[0], rows[-1] + 1)
            for c in range(cols[0], cols[-1] + 1)} if cells else set()
    if not cells or cells != full:
        raise ValueError("cells do not form one rectangle")

    def span(values: list[int]) -> str:
        return str(values[0]) if values[0] == values[-1] else f"{values[0]}-{values[-1]}"

    return f"{span(rows)},{span(cols)}"


def _unique(grants: Iterable[Grant]) -> list[Grant]:
    """Grants in first-seen order without repeats (neighbouring cells share filters)."""
    return list(dict.fromkeys(grants))
