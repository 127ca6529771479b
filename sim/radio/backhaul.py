"""The backhaul: how long a message takes between a mesh's edge and the parameter server.

A transfer of B bytes holds its bottleneck link for 8 B / rate, then arrives one latency
later. Transfers that share a bottleneck go one after another, in the order they were
sent (FIFO): on Wi-Fi every transfer shares the one channel; on switched Ethernet the
uplinks share the server's port in, the downlinks its port out; over LTE each edge's
radio link is its own (uplink and downlink apart). Profiles are data
(`backhauls.toml` beside this module), each with its source.
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshdl.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUILTIN_FILE = Path(__file__).with_name("backhauls.toml")


class BackhaulProfile(BaseModel):
    """One backhaul technology: rates of TCP payload, latency and what is shared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    up_bps: float = Field(gt=0)  # edge -> server
    down_bps: float = Field(gt=0)  # server -> edge
    latency_s: float = Field(ge=0)  # one way
    bottleneck: Literal["channel", "server_port", "edge", "none"]
    source: str = ""


# The virtual meshes' clock counts waves in rounds: messages to and from the server
# take no time there.
INSTANT = BackhaulProfile(name="instant", up_bps=math.inf, down_bps=math.inf, latency_s=0.0,
                          bottleneck="none", source="none: the virtual meshes' round clock")


@cache
def builtin_backhauls() -> dict[str, BackhaulProfile]:
    with BUILTIN_FILE.open("rb") as handle:
        tables = tomllib.load(handle)["backhaul"]
    return {table["name"]: BackhaulProfile(**table) for table in tables}


def backhaul_profile(name: str) -> BackhaulProfile:
    """A built-in profile by name, or a usage error listing them."""
    profiles = builtin_backhauls()
    if name not in profiles:
        raise UsageError(f"--backhaul {name!r}: expected one of {', '.join(profiles)}")
    return profiles[name]


class Backhaul:
    """The links' state: when each bottleneck is free again, and what went over them."""

    def __init__(self, profile: BackhaulProfile) -> None:
        self.profile = profile
        self._free_at: dict[object, float] = {}
        self._busy: dict[object, float] = {}  # seconds each bottleneck carried something
        self.bytes_up = self.bytes_down = 0
        self.busy_s = 0.0  # summed over the bottlenecks: time they carried something
        self.queued_s = 0.0  # summed over transfers: time waiting for a bottleneck

    def send(self, now: float, nbytes: int, mesh: int, up: bool) -> float:
        """A transfer of `nbytes` sent at `now` between mesh `mesh`'s edge and the server
        (`up`: to the server): when it arrives."""
        p = self.profile
        holds = 8 * nbytes / (p.up_bps if up else p.down_bps)
        link = {"channel": "channel", "server_port": ("server", up),
                "edge": (mesh, up), "none": None}[p.bottleneck]
        start = max(now, self._free_at.get(link, now)) if link is not None else now
        if link is not None:
            self._free_at[link] = start + holds
            self._busy[link] = self._busy.get(link, 0.0) + holds
        self.queued_s += start - now
        self.busy_s += holds if math.isfinite(holds) else 0.0
        if up:
            self.bytes_up += nbytes
        else:
            self.bytes_down += nbytes
        return start + holds + p.latency_s

    @property
    def busiest_s(self) -> float:
        """Seconds the busiest bottleneck carried something: what the backhaul cannot
        do in less time."""
        return max(self._busy.values(), default=0.0)

    def report(self) -> dict[str, object]:
        return {"name": self.profile.name, "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "busy_s": self.busy_s,
                "busiest_link_s": self.busiest_s, "queued_s": self.queued_s,
                "latency_s": self.profile.latency_s, "source": self.profile.source}
