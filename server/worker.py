"""A mesh's edge in data-parallel training, as a sans-I/O machine: which shard it
computes next, on which weights, when it may, and the PUSH that reports it.

The edge computes a step's gradient in its mesh (one training wave, edge/agent.py) on
the weights its model holds, and pushes it to the parameter server. Weights that arrive
while a wave runs are held until the wave ends: the mesh computes one step on one set
of weights. When it may start the next step is the `Sync`'s rule (meshdl/sync.py).

With overlap (meshdl/protocol/parts.py) weights come in two parts: a step starts as soon
as the conv layers' weights are in (its PARAMS flood them), and the head's of the same version,
which the edge needs only when the pooled features arrive, are taken up as they come.
The gradient goes up in two parts too: the head's (`push(..., Part.HEAD)`) while the
mesh still runs the conv backward, the conv layers' when the wave ends.

A push names the server run it is for (its session). An edge that has not heard the
server yet pushes with session 0; a server of another session answers with its weights
and takes nothing (a replayed push of an earlier run must not count), so once the
worker learns the session it makes those pushes again for it (`outbox`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from meshdl.compress.codec import Channel
from meshdl.model.cnn import CNN
from meshdl.protocol.messages import EDGE, SERVER, Kind, Message, make, newer
from meshdl.protocol.parts import Part, part_codecs, part_of, part_slice
from meshdl.protocol.payloads import Push
from meshdl.sync import Sync


class Step(NamedTuple):
    """One step a mesh computes: its shard of a global batch and the weights' version."""

    clock: int  # the mesh's count of steps, this one included
    indices: np.ndarray  # sample indices of its shard (may be empty)
    based_on: int  # the version of the conv layers' weights it started with


class Learnt(NamedTuple):
    """What one step's wave gave: its forward pass's hits and loss, and the gradient."""

    correct: int
    loss: float  # mean over the shard's samples
    gradient: np.ndarray  # mean over the shard's samples, every parameter


class MeshWorker:
    """The edge of mesh `mesh_id` training the server's model with the other meshes."""

    def __init__(self, mesh_id: int, sync: Sync, model: CNN, session: int | None = 0,
                 compress: str = "none") -> None:
        """`model`: this edge's copy, holding the server's weights of version 0;
        `session`: the server run it works with (None: the first that answers);
        `compress`: the policy its PUSH gradients go under (meshdl/compress), with
        error feedback per part."""
        self.mesh_id, self.sync, self.model, self.session = mesh_id, sync, model, session
        codecs = part_codecs(compress, model.config)
        self.channels = None if codecs is None else {
            part: Channel(codec, seed=8 * mesh_id + part) for part, codec in codecs.items()}
        self.clock = 0  # steps pushed
        self.versions = {Part.CONV: 0, Part.HEAD: 0}  # of the weights `model` holds
        self.shards: deque[np.ndarray] = deque()  # this epoch's, in order
        self.step: Step | None = None  # the step being computed
        self.awaiting = False  # asynchronous: the answer to its last push not in yet
        self._held: dict[Part, tuple[int, np.ndarray]] = {}  # until the wave ends
        self._slices = {part: part_slice(part, model.config) for part in Part}
        self.stats: Counter[str] = Counter()
        self.seq = 0
        # A server that started again from a checkpoint: its first weights, taken up
        # when no wave runs; then `rewound` says the clock went back to their version.
        self._restart: Message | None = None
        self.rewound = False
        self._unheard: list[Message] = []  # pushed before any server answered
        self.outbox: list[Message] = []  # to send now: those pushes, for its session

    @property
    def version(self) -> int:
        """The version of the weights it holds whole."""
        return min(self.versions.values())

    def assign(self, shards: Iterable[np.ndarray]) -> None:
        """This mesh's shards of an epoch's global batches, in order."""
        self.shards.extend(shards)

    @property
    def may_proceed(self) -> bool:
        """Whether its sync rule lets it start a step now (no step running)."""
        if self.step is not None:
            return False
        if self.sync.asynchronous:
            return not self.awaiting
        return self.versions[Part.CONV] >= self.clock - self.sync.staleness

    @property
    def ready(self) -> bool:
        """Whether it may start its next step now: it has one, and may."""
        return bool(self.shards) and self.may_proceed

    @property
    def head_ready(self) -> bool:
        """Whether the running step's head weights are in (always, without overlap)."""
        return self.step is not None and self.versions[Part.HEAD] >= self.step.based_on

    def begin(self) -> Step:
        """Start the next step (when `ready`): what to compute, on the weights held."""
        if not self.ready:
            raise RuntimeError(f"mesh {self.mesh_id} may not start a step now")
        self.step = Step(self.clock + 1, self.shards.popleft(), self.versions[Part.CONV])
        return self.step

    def push(self, learnt: Learnt | None, part: Part = Part.WHOLE) -> Message:
        """The step's result for the server (None: nothing to learn from, an empty
        shard or a wave that missed its deadline): all of it, or with overlap the
        head's part first and the conv layers' part last. The last part ends the step:
        weights that came while the wave ran are taken up; an asynchronous mesh then
        waits for the answer."""
        step = self.step
        if step is None:
            raise RuntimeError(f"mesh {self.mesh_id} pushes without a step")
        size = self.model.flat[self._slices[part]].size
        payload = Push(step.based_on, 0, 0, 0.0, np.zeros(size, np.float32)) \
            if learnt is None else \
            Push(step.based_on, len(step.indices), learnt.correct, learnt.loss,
                 learnt.gradient[self._slices[part]])
        if part != Part.HEAD:
            self.step = None
            for held, (version, weights) in list(self._held.items()):
                self._adopt(held, version, weights)
            self.clock, self.awaiting = step.clock, True
            if self._restart is not None:
                self._start_again(self._restart)
        self.seq += 1
        body = payload.pack() if self.channels is None else \
            payload.pack_compressed(self.channels[part])
        message = make(Kind.PUSH, self.mesh_id, step.clock, EDGE, SERVER, body,
                       layer=part, seq=self.seq & 0xFFFFFFFF, session=self.session or 0)
        if self.session is None:
            self._unheard.append(message)
        return message

    def take_outbox(self) -> list[Message]:
        """The pushes to send again now (made before the server's session was known)."""
        out, self.outbox = self.outbox, []
        return out

    def handle(self, message: Message) -> None:
        """Take the server's weights (held while a wave runs, but for the head's part
        that the running step waits for)."""
        h = message.header
        part = part_of(h.layer)
        if h.kind != Kind.WEIGHTS or h.src != SERVER or h.dst != EDGE or \
                h.mesh != self.mesh_id or part is None:
            self.stats["rejected:not_for_me"] += 1
            return
        if message.payload.shape != self.model.flat[self._slices[part]].shape:
            self.stats["rejected:bad_shape"] += 1
            return
        if h.session != self.session:
            if self.session is None:  # the first server run that answers
                self.session = h.session
                self._again_for(h.session)
            else:  # another run of the server: training goes on from its weights
                self.stats["server_restarts"] += 1
                if self.step is None:
                    self._start_again(message)
                else:
                    self._restart = message
                return
        parts = (Part.CONV, Part.HEAD) if part == Part.WHOLE else (part,)
        held = max(self._held[p][0] if p in self._held else self.versions[p] for p in parts)
        if not newer(h.step, held):
            self.stats["stale"] += 1
            return
        self.stats["weights"] += 1
        step = self.step
        if step is None or (part == Part.HEAD and h.step == step.based_on):
            self._adopt(part, h.step, message.payload)
        else:
            self._held[part] = (h.step, message.payload)

    def _again_for(self, session: int) -> None:
        """The pushes made before the session was known, made again for `session` (a
        server of another session took none of them)."""
        unheard, self._unheard = self._unheard, []
        if session == 0:
            return  # they carried it already
        for message in unheard:
            h = message.header
            self.seq += 1
            self.outbox.append(make(Kind.PUSH, h.mesh, h.step, EDGE, SERVER,
                                    message.payload, layer=h.layer,
                                    seq=self.seq & 0xFFFFFFFF, session=session))

    def _start_again(self, message: Message) -> None:
        """Go on from a restarted server's weights: synchronous training stands at the
        clock of their version (the shards from there are the driver's to give again);
        asynchronous training has no such clock and cannot go on."""
        self._restart = None
        h = message.header
        if self.sync.asynchronous or part_of(h.layer) != Part.WHOLE:
            raise RuntimeError(f"mesh {self.mesh_id}: the parameter server started again; "
                               "only synchronous runs without overlap go on from its "
                               "checkpoint")
        self.session = h.session
        self._held.clear()
        self._adopt(Part.WHOLE, h.step, message.payload)
        self.clock, self.rewound = h.step, True
        self.shards.clear()

    def _adopt(self, part: Part, version: int, weights: np.ndarray) -> None:
        self.model.flat[self._slices[part]] = weights
        for p in (Part.CONV, Part.HEAD) if part == Part.WHOLE else (part,):
            self.versions[p] = version
            self._held.pop(p, None)
        self._held.pop(part, None)
        if self.versions[Part.CONV] == self.versions[Part.HEAD]:
            self.awaiting = False
