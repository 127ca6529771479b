"""MQTT-style topic names of a mesh, shared by the virtual broker and real MQTT.

    meshdl/<mesh>/<src>/<dst>/<kind>      e.g. meshdl/7/r0c1/r0c2/halo

A cell is named `r<row>c<col>`, the edge `edge`. A node publishes only under its own
name (`meshdl/<mesh>/<self>/#`) and subscribes only to what its one-hop neighbours
address to it (`meshdl/<mesh>/<neighbour>/<self>/#`), which is what a broker ACL can
enforce per node.
"""

from __future__ import annotations

import re

from meshdl.messages import EDGE, Kind

ROOT = "meshdl"
_CELL = re.compile(r"^r(\d{1,5})c(\d{1,5})$")
_FORBIDDEN = set("+#/\x00")


def name_of(cell: tuple[int, int]) -> str:
    return "edge" if cell == EDGE else f"r{cell[0]}c{cell[1]}"


def cell_of(name: str) -> tuple[int, int]:
    """Inverse of `name_of`; ValueError for anything else."""
    if name == "edge":
        return EDGE
    match = _CELL.match(name)
    if not match:
        raise ValueError(f"not a cell name: {name!r}")
    return int(match[1]), int(match[2])


def check_id(value: str, what: str = "id") -> str:
    """Mesh ids and names become topic levels: no wildcards, separators or NUL."""
    if not value or _FORBIDDEN & set(value):
        raise ValueError(f"{what} {value!r} must be non-empty without '+', '#', '/' or NUL")
    return value


def topic(mesh: int, src: tuple[int, int], dst: tuple[int, int], kind: Kind) -> str:
    return f"{ROOT}/{mesh}/{name_of(src)}/{name_of(dst)}/{kind.name.lower()}"


def inbox_filter(mesh: int, src: tuple[int, int], dst: tuple[int, int]) -> str:
    """What `dst` subscribes to for messages from its neighbour `src`."""
    return f"{ROOT}/{mesh}/{name_of(src)}/{name_of(dst)}/#"


def topic_matches(filter_: str, topic_: str) -> bool:
    """MQTT matching: '+' is one level, a trailing '#' any number of levels (even 0)."""
    f_parts, t_parts = filter_.split("/"), topic_.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts) or (part != "+" and part != t_parts[i]):
            return False
    return len(f_parts) == len(t_parts)
