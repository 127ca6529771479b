"""Several meshes and their parameter server on one clock, in this process.

Each mesh (its engine: the virtual mesh, or one in simulated time) computes its steps'
gradients as training waves; its edge (`MeshWorker`) pushes them over the backhaul to
the server (`ParameterServer`), whose weights come back the same way. The two machines
decide everything (what to compute, on which weights, when); this module only moves
their messages and keeps the time:

- a step takes its mesh the wave's duration (`wave_time`: the virtual mesh's rounds,
  or the seconds of a wave in simulated time); its gradient is computed when the wave
  starts, on the weights the edge holds then, which is what the wave would compute;
- with overlap (meshdl/protocol/parts.py) a wave starts on the conv layers' weights alone; if
  the head's come later than the wave's pooled features, the wave stalls for them (its
  rest comes that much later); the head's gradient goes up when the edge has it, the
  conv layers' at the wave's end;
- a message takes the backhaul's time (sim/radio/backhaul.py: its bytes at the link's rate
  behind whatever shares its bottleneck, then the latency).

An epoch ends when every mesh has pushed all its shards and the server has applied
them; meshes whose weights are older than the server's then get the newest (in
asynchronous modes), so each epoch is evaluated on, and starts from, one model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from meshdl.errors import MeshdlError, StepSkipped
from meshdl.protocol.messages import Message, wire_size
from meshdl.protocol.parts import Part
from meshdl.server.machine import ParameterServer
from meshdl.server.worker import Learnt, MeshWorker
from meshdl.sim.radio.backhaul import INSTANT, Backhaul
from meshdl.sim.radio.clock import EventQueue

if TYPE_CHECKING:
    from meshdl.model.cnn import CNN


class StepEngine(Protocol):
    """What the cluster asks of a mesh's engine (any of the training loop's `Engine`s):
    one step's loss, logits and gradient. Named here, not imported from the training
    loop, which drives the cluster: the simulator does not lean on what runs it."""

    def loss_and_grads(self, model: CNN, indices: np.ndarray,
                       failout: np.ndarray | None = None
                       ) -> tuple[float, np.ndarray, np.ndarray]: ...


class WaveShape(NamedTuple):
    """A wave's duration, and when in it the edge ran the head (from its start)."""

    seconds: float
    gather: float  # the pooled features are in: the head needs its weights now
    head: float  # the head's gradient is ready (training)


@dataclass
class MeshFigures:
    """What one mesh did over the run, on the cluster's clock."""

    steps: int = 0
    samples: int = 0
    busy: float = 0.0  # computing waves
    waited: float = 0.0  # with shards left, kept from starting by its sync rule, or
    # (overlap) a wave stalled for the head's weights
    pushed_bytes: int = 0
    weights_bytes: int = 0  # received
    weights: int = 0


UpdateFn = Callable[[int, np.ndarray], None]  # (version, the server's parameters)
PushFn = Callable[[int, "Learnt | None"], None]  # (mesh index, what its step gave)


class Cluster:
    """N meshes, their edges and the parameter server, driven on one event queue."""

    def __init__(self, server: ParameterServer, workers: Sequence[MeshWorker],
                 engines: Sequence[StepEngine], labels: np.ndarray,
                 wave_time: Callable[[int], WaveShape], backhaul: Backhaul | None = None,
                 on_update: UpdateFn | None = None,
                 on_push: PushFn | None = None, overlap: bool = False) -> None:
        """`labels`: of the training split, to count a forward pass's hits;
        `wave_time(i)`: the shape of mesh i's last wave; `on_update`: called after
        each update of the server; `on_push`: after each step's (last) push;
        `overlap`: gradients and weights travel in parts (as the server's)."""
        self.server, self.workers, self.engines = server, list(workers), list(engines)
        self.labels, self.wave_time = labels, wave_time
        self.backhaul = backhaul or Backhaul(INSTANT)
        self.on_update, self.on_push = on_update, on_push
        self.queue = EventQueue()
        self.figures = [MeshFigures() for _ in self.workers]
        self._index = {w.mesh_id: i for i, w in enumerate(self.workers)}
        self._idle_since: list[float | None] = [None] * len(self.workers)
        self._pool: deque[np.ndarray] = deque()  # shards for whichever mesh is free
        self.overlap = overlap
        self._started: dict[int, float] = {}  # mesh -> when its running wave started

    def run_epoch(self, shards: Sequence[Sequence[np.ndarray]], pooled: bool = False) -> None:
        """Every mesh computes its shards (`shards[i]`, in order) until the server has
        applied them all; then every mesh holds the server's weights. `pooled`: the
        shards are taken in turn (global batch by global batch) by whichever mesh is
        free, so a fast mesh computes more of them (asynchronous training: see
        `Sync`)."""
        self._pool.clear()
        if pooled:
            self._pool.extend(shard for parts in zip(*shards, strict=True) for shard in parts)
        else:
            for worker, own in zip(self.workers, shards, strict=True):
                worker.assign(own)
        for i in range(len(self.workers)):
            self._idle_since[i] = self.queue.now
            self._try_start(i)
        steps = sum(len(own) for own in shards)
        if not self.queue.run(limit=16 * steps + 64):
            raise MeshdlError("the meshes' steps did not settle (an event loop)")
        behind = [w.mesh_id for w in self.workers if w.version != self.server.version]
        if behind:
            for message in self.server.weights_for(behind):
                self._send_to_worker(message)
            self.queue.run(limit=4 * len(behind))
        stuck = [w.mesh_id for w in self.workers if w.shards or w.step is not None]
        if stuck or self._pool or not self.server.settled:
            raise MeshdlError(f"meshes {stuck} could not finish the epoch's steps "
                              f"(server settled: {self.server.settled})")

    def _try_start(self, i: int) -> None:
        worker = self.workers[i]
        if self._pool and not worker.shards and worker.may_proceed:
            worker.assign([self._pool.popleft()])
        if not worker.ready:
            return
        now = self.queue.now
        if worker.shards and self._idle_since[i] is not None:
            self.figures[i].waited += now - self._idle_since[i]
        self._idle_since[i] = None
        worker.begin()
        self._started[i] = now
        if worker.head_ready:
            self._compute(i)
        # else: the head's weights are on their way (overlap); `_to_worker` goes on.

    def _compute(self, i: int) -> None:
        """Run mesh i's wave (on the weights it holds now, all of this step's), and
        schedule its pushes: the wave started at `_started[i]`, and stalled for as long
        as the head's weights came after its pooled features."""
        worker, figures, now = self.workers[i], self.figures[i], self.queue.now
        step, started = worker.step, self._started.pop(i)
        learnt, shape = None, WaveShape(0.0, 0.0, 0.0)
        if len(step.indices):
            try:
                loss, logits, grads = self.engines[i].loss_and_grads(worker.model, step.indices)
            except StepSkipped:
                pass  # the mesh has nothing to learn from: it pushes no samples
            else:
                correct = int(np.sum(logits.argmax(axis=1) == self.labels[step.indices]))
                learnt = Learnt(correct, float(loss), grads.copy())  # grads: a reused buffer
            shape = self.wave_time(i)
        stall = max(0.0, now - (started + shape.gather))
        figures.busy += shape.seconds
        figures.waited += stall
        figures.steps += 1
        figures.samples += len(step.indices) if learnt is not None else 0
        if self.overlap:
            self.queue.at(started + shape.head + stall, self._push_head, (i, learnt))
        self.queue.at(started + shape.seconds + stall, self._finish, (i, learnt))

    def _push_head(self, arg: tuple[int, Learnt | None]) -> None:
        i, learnt = arg
        self._send_to_server(i, self.workers[i].push(learnt, Part.HEAD))

    def _finish(self, arg: tuple[int, Learnt | None]) -> None:
        i, learnt = arg
        last = Part.CONV if self.overlap else Part.WHOLE
        self._send_to_server(i, self.workers[i].push(learnt, last))
        if self.on_push is not None:
            self.on_push(i, learnt)
        self._idle_since[i] = self.queue.now
        self._try_start(i)

    def _send_to_server(self, i: int, message: Message) -> None:
        nbytes = wire_size(message)
        self.figures[i].pushed_bytes += nbytes
        arrives = self.backhaul.send(self.queue.now, nbytes, i, up=True)
        self.queue.at(arrives, self._to_server, message)

    def _to_server(self, message: Message) -> None:
        version = self.server.version
        out = self.server.handle(message, self.queue.now)
        if self.on_update is not None and self.server.version != version:
            self.on_update(self.server.version, self.server.model.flat)
        for reply in out:
            self._send_to_worker(reply)

    def _send_to_worker(self, message: Message) -> None:
        i = self._index[message.header.mesh]
        arrives = self.backhaul.send(self.queue.now, wire_size(message), i, up=False)
        self.queue.at(arrives, self._to_worker, message)

    def _to_worker(self, message: Message) -> None:
        i = self._index[message.header.mesh]
        figures = self.figures[i]
        figures.weights += 1
        figures.weights_bytes += wire_size(message)
        worker = self.workers[i]
        worker.handle(message)
        if i in self._started and worker.head_ready:
            self._compute(i)  # the head's weights this wave waited for
        else:
            self._try_start(i)
