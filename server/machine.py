"""The parameter server as a sans-I/O machine: gradients in, updates, weights out.

It holds the one model the meshes train and its optimizer. Each mesh's edge pushes the
gradient of its shard of every step (PUSH, meshdl/protocol/payloads.py) and reads the weights
the server sends back (WEIGHTS). How they keep step is the `Sync` (meshdl/sync.py):

- synchronous (`bsp`, `ssp:S`): clock c's update waits for clock c's gradient from
  every mesh and applies their mean, weighted by samples, as one optimizer step: with
  the meshes' shards cut from one global batch, that is the step one model takes on
  the whole batch. The new weights go to every mesh.
- asynchronous: each gradient is one optimizer step on arrival; its mesh alone gets
  the new weights.

What arrives is checked before it counts: the sender's mesh and clock (a clock is taken
once, in order: a duplicate or a replay changes nothing), the server run it was made
for (its `session`: a genuine push of an earlier run, replayed, is not taken), the
payload's shape and counts, and the staleness its mode allows. Rejections are counted
by reason. A push of a clock already applied, of one beyond the next, or of another
session is answered with the weights: its mesh missed them, has not yet heard this run,
or is ahead of a server restarted from a checkpoint (each server run has its own
`session`, by which an edge knows it must start again from the weights' version).

A push's weight in the mean is never a number it claims: given `shard_sizes`, the
server knows how many samples each mesh's step holds (it draws the same batches from
the same seed), and a push claiming any other count than that or none (a wave that
missed its deadline) is rejected. Over MQTT the pushes are authenticated before they
get here (meshdl/protocol/auth.py: the link edge-ps of each mesh).

With overlap (meshdl/protocol/parts.py) a step's gradient comes in two parts, which must
agree on what they were computed on; the update is the same, and its weights go back conv layers
first, to every mesh, then the head.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from meshdl.errors import CodecError, MeshdlError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer
from meshdl.protocol.messages import EDGE, SERVER, Kind, Message, make
from meshdl.protocol.parts import SPLIT, Part, part_codecs, part_of, part_slice
from meshdl.protocol.payloads import Push
from meshdl.sync import Sync


@dataclass
class EpochFigures:
    """What the pushes of an epoch so far say of training."""

    loss_sum: float = 0.0  # each push's mean loss times its samples
    correct: int = 0
    samples: int = 0
    skipped: int = 0  # pushes with nothing to learn from (a wave that missed its deadline)


ShardSizes = Callable[[int, int], int]  # (mesh, clock) -> the samples of its shard


class ParameterServer:
    """The model several meshes train, updated from their gradients."""

    def __init__(self, model: CNN, optimizer: Optimizer, meshes: Sequence[int], sync: Sync,
                 lr: Callable[[int], float], session: int = 0, overlap: bool = False,
                 compress: str = "none", shard_sizes: ShardSizes | None = None) -> None:
        """`meshes`: their ids (the headers' mesh field); `lr(n)`: the learning rate of
        update n (0-based); `session`: names this server run in every message;
        `overlap`: gradients and weights travel in parts; `compress`: the policy the
        meshes' PUSH gradients come under (meshdl/compress); `shard_sizes(mesh, c)`:
        the samples of mesh's step c, which weigh its gradient (None: the pushes' own
        counts, for meshes in this process, whose shards are dealt as they come)."""
        if len(set(meshes)) != len(meshes) or not meshes:
            raise ValueError(f"mesh ids must be distinct, and at least one: {meshes}")
        self.model, self.optimizer, self.sync, self.lr = model, optimizer, sync, lr
        self.meshes = tuple(meshes)
        self.session = session
        self.version = 0  # updates applied
        self.clock = dict.fromkeys(self.meshes, 0)  # gradients taken from each mesh
        self._pending: dict[int, dict[int, Push]] = {}  # synchronous: clock -> mesh -> push
        self.staleness: Counter[int] = Counter()  # updates a taken gradient's weights missed
        self.stats: Counter[str] = Counter()
        self.epoch = EpochFigures()
        self.seq = 0
        self.overlap = overlap
        self._slices = {part: part_slice(part, model.config) for part in Part}
        self._codecs = part_codecs(compress, model.config)
        self._parts: dict[tuple[int, int], dict[Part, Push]] = {}  # (mesh, clock) -> parts
        self.shard_sizes = shard_sizes
        self.heard: dict[int, float] = {}  # mesh -> when its last push came (`now`)

    def handle(self, message: Message, now: float = 0.0) -> list[Message]:
        """Take one message from an edge; return the weights to send."""
        h = message.header
        if h.kind != Kind.PUSH or h.dst != SERVER or h.src != EDGE or \
                h.mesh not in self.clock:
            self.stats["rejected:not_for_me"] += 1
            return []
        self.heard[h.mesh] = now  # its edge is alive (pushes are authenticated first)
        part = part_of(h.layer)
        if part is None or (part == Part.WHOLE) == self.overlap:
            self.stats["rejected:bad_part"] += 1
            return []
        if h.session != self.session:
            # Made for another server run: a replay, or an edge that has not heard this
            # run yet (its first push) or missed its restart. The weights tell it which.
            self.stats["rejected:other_session"] += 1
            return self.weights_for([h.mesh])
        if h.step <= self.clock[h.mesh]:
            self.stats["duplicates"] += 1
            # Pushed again once applied: its answer was lost on the way.
            if self.sync.asynchronous or h.step <= self.version:
                self.stats["resent"] += 1
                return self.weights_for([h.mesh])
            return []
        if h.step != self.clock[h.mesh] + 1:
            # An earlier clock never came, or the mesh ran on while this server
            # restarted from a checkpoint: the weights tell it where training stands.
            self.stats["rejected:out_of_order"] += 1
            return self.weights_for([h.mesh])
        try:
            push = self._read(message.payload, part)
        except CodecError:
            self.stats["rejected:bad_compressed"] += 1
            return []
        if push is None or push.based_on > self.version:
            self.stats["rejected:bad_push"] += 1
            return []
        if self.shard_sizes is not None and \
                push.samples not in (0, self.shard_sizes(h.mesh, h.step)):
            self.stats["rejected:bad_samples"] += 1  # not what this mesh's step holds
            return []
        if part != Part.WHOLE:
            push = self._assemble(h.mesh, h.step, part, push)
            if push is None:
                return []
        if self.sync.asynchronous:
            return self._apply_now(h.mesh, push)
        missed = (h.step - 1) - push.based_on
        if missed > self.sync.staleness:
            self.stats["rejected:too_stale"] += 1  # a mesh that broke its bound
            return []
        self._take(h.mesh, push, missed)
        self._pending.setdefault(h.step, {})[h.mesh] = push
        out: list[Message] = []
        while len(self._pending.get(self.version + 1, ())) == len(self.meshes):
            self._apply_clock(self._pending.pop(self.version + 1))
            out += self.weights_for(self.meshes)
        return out

    def _read(self, payload: np.ndarray, part: Part) -> Push | None:
        """A PUSH of `part` in the form the meshes send, or None; CodecError if its
        compressed bytes are not any the policy's compressors write."""
        if self._codecs is None:
            return Push.read(payload, self.model.flat[self._slices[part]].size)
        return Push.read_compressed(payload, self._codecs[part])

    def _assemble(self, mesh: int, clock: int, part: Part, push: Push) -> Push | None:
        """With overlap: keep a step's first part; with its second, the whole push (at
        most one step per mesh is being assembled: the next after its clock)."""
        parts = self._parts.setdefault((mesh, clock), {})
        if part in parts:
            self.stats["duplicates"] += 1
            return None
        other = next(iter(parts.values()), None)
        if other is not None and other[:3] != push[:3]:
            self.stats["rejected:parts_disagree"] += 1
            return None
        parts[part] = push
        if len(parts) < len(SPLIT):
            return None
        del self._parts[(mesh, clock)]
        gradient = np.concatenate([parts[p].gradient for p in SPLIT])
        return push._replace(gradient=gradient)

    def _take(self, mesh: int, push: Push, missed: int) -> None:
        """Count a gradient in: its clock, its staleness and its epoch figures."""
        self.clock[mesh] += 1
        self.staleness[missed] += 1
        self.stats["pushes"] += 1
        figures = self.epoch
        if push.samples:
            figures.loss_sum += push.loss * push.samples
            figures.correct += push.correct
            figures.samples += push.samples
        else:
            figures.skipped += 1

    def _apply_now(self, mesh: int, push: Push) -> list[Message]:
        """Asynchronous: this gradient is one update, and its mesh gets the result."""
        self._take(mesh, push, self.version - push.based_on)
        if push.samples:
            self._step(push.gradient)
        return self.weights_for([mesh])

    def _apply_clock(self, pushes: dict[int, Push]) -> None:
        """Synchronous: one update with the mean of a clock's gradients, weighted by
        their samples (summed in mesh order, in float64: the same sum every run)."""
        samples = sum(push.samples for push in pushes.values())
        if samples:
            total = np.zeros(self.model.flat.size, np.float64)
            for mesh in self.meshes:
                push = pushes[mesh]
                if push.samples:
                    total += push.samples * push.gradient.astype(np.float64)
            self._step((total / samples).astype(np.float32))
        else:
            self.version += 1  # every wave of the clock missed its deadline
            self.stats["empty_updates"] += 1

    def _step(self, gradient: np.ndarray) -> None:
        params = self.model.flat
        self.optimizer.step(params, gradient, self.lr(self.optimizer.steps))
        self.version += 1
        if not np.isfinite(params.sum(dtype=np.float64)):
            raise MeshdlError(f"training diverged at update {self.version}; lower the "
                              f"learning rate (now {self.optimizer.config.lr})")

    def weights_for(self, meshes: Sequence[int]) -> list[Message]:
        """The current weights, to each of `meshes` (one copy for all of them); with
        overlap the conv layers' to all of them first, then the head's."""
        weights = self.model.flat.copy()
        out = []
        for part in SPLIT if self.overlap else (Part.WHOLE,):
            values = weights[self._slices[part]]
            for mesh in meshes:
                self.seq += 1
                out.append(make(Kind.WEIGHTS, mesh, self.version, SERVER, EDGE, values,
                                layer=part, seq=self.seq & 0xFFFFFFFF,
                                session=self.session))
        return out

    def resume_at(self, clock: int) -> None:
        """Synchronous training restarted from a checkpoint taken after `clock` clocks:
        every mesh's clock and the version stand there."""
        if self.sync.asynchronous:
            raise MeshdlError("an asynchronous run has no clock to resume at")
        self.version = clock
        self.clock = dict.fromkeys(self.meshes, clock)

    def take_epoch(self) -> EpochFigures:
        """The epoch's figures so far, and a fresh count for the next."""
        figures, self.epoch = self.epoch, EpochFigures()
        return figures

    @property
    def settled(self) -> bool:
        """Every gradient taken has been applied (nothing waits for another mesh)."""
        return not self._pending and not self._parts
