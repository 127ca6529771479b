"""How the meshes keep step with each other: `bsp`, `ssp:S` or `async`.

Every mesh counts its steps (its clock: the gradients it has pushed). The server
updates once per clock, with the mean of that clock's gradients from every mesh
(synchronous modes), or once per gradient as it arrives (asynchronous).

- `ssp:S` (Stale Synchronous Parallel, Ho et al. 2013): a mesh that has pushed c
  gradients may compute its next one on weights that miss at most the last S clocks'
  updates, i.e. of version >= c - S; it waits only when it is more than S clocks ahead
  of the slowest mesh. Updates stay one per clock, so the model a mesh may read is
  always a well-defined one, whichever optimizer.
- `bsp` is `ssp:0`: every mesh computes each step on the weights of all earlier steps,
  so N meshes with batch b take exactly the steps of one model with batch N b.
- `async` (Downpour SGD, Dean et al. 2012): the server applies each gradient on arrival
  and answers its mesh with the newest weights; a mesh waits for that answer, never for
  another mesh, so a gradient may be computed on weights as many updates old as the
  other meshes made meanwhile. A faster mesh computes more steps: each free mesh takes
  the epoch's next shard (in the simulator every mesh holds every map; in a building,
  a faster mesh learns from more of its own room's readings). The synchronous modes
  give every mesh the same shards of each global batch, as their clocks need.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from meshdl.errors import UsageError

MAX_STALENESS = 1_000


class Sync(NamedTuple):
    """A synchronization mode: `staleness` S of `ssp:S` (0: `bsp`), None for `async`."""

    staleness: int | None

    @classmethod
    def parse(cls, text: str) -> Sync:
        """`bsp`, `ssp:S` (0 <= S <= 1000) or `async`; anything else is a usage error."""
        if text == "bsp":
            return cls(0)
        if text == "async":
            return cls(None)
        match = re.fullmatch(r"ssp:(\d{1,4})", text)
        if match is None or int(match[1]) > MAX_STALENESS:
            raise UsageError(f"--sync {text!r}: expected bsp, ssp:S (S from 0 to "
                             f"{MAX_STALENESS}) or async")
        return cls(int(match[1]))

    @property
    def asynchronous(self) -> bool:
        return self.staleness is None

    def lr_share(self, meshes: int) -> float:
        """The share of the schedule's learning rate one update takes. A synchronous
        update is the step of a whole global batch. An asynchronous one applies one
        mesh's gradient, a 1/N share of a global batch, so it moves the model 1/N as far:
        without staleness, N of them take the synchronous step in expectation (the
        linear scaling rule of Goyal et al. 2017, per update). At the whole rate, N meshes
        would take N times bsp's steps on gradients N times as noisy, and stale: the
        seed's recipe (SGD, momentum 0.9, lr 0.15) diverged on 4 meshes."""
        return 1.0 / meshes if self.asynchronous else 1.0

    def __str__(self) -> str:
        if self.staleness is None:
            return "async"
        return "bsp" if self.staleness == 0 else f"ssp:{self.staleness}"
