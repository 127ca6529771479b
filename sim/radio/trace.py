"""The trace of a simulated run: one record (`Sent`) per transmission, a line of
trace.jsonl, whichever backend of the medium ran it (media.py in Python, air.py compiled)."""

from __future__ import annotations

from typing import NamedTuple

from meshdl.protocol.topology import Cell

Party = Cell  # a cell, the edge (-1, -1) or the broker (`BROKER`)


class Sent(NamedTuple):
    """One line of trace.jsonl."""

    t0: float
    t1: float
    src: Party
    receivers: tuple[Party, ...]
    broadcast: bool
    kind: int
    layer: int
    size: int
    frames: int
    outcome: str
