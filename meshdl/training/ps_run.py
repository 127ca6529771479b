"""The parameter server over MQTT (`meshdl ps run`): one connection, the meshes' pushes
in, the weights out, a checkpoint after every epoch.

The server subscribes to every mesh's push topic (`meshdl/<mesh>/edge/ps/push`) and
publishes each mesh's weights on `meshdl/<mesh>/ps/edge/weights`, both at QoS 1; a
push's topic must agree with its header (the broker's ACL checked the topic). An edge
that hears nothing pushes its step again: a push already applied is answered with the
weights again, so a lost message costs a wait, never the run.

An epoch ends once every mesh's clock has reached its last step and the server has
applied them; its loss and accuracy are those of the pushes (each edge's forward
passes), and a checkpoint holds the model and the optimizer. A server started again
from it (`--resume`) names itself by a new session: edges that ran ahead go back to
its clock (server/worker.py), so training ends on the parameters it would have had.

With `mesh.auth` every push must carry the tag of its mesh's link edge-ps (the keys of
`parallel.keys`, from `meshdl deploy central`), and the weights carry it too: a broker
login alone cannot make a push the server takes; what fails is counted in the
connection's figures (`rejected:codec:forged`). Each push weighs what the server knows
its mesh's step holds: it deals the same shards from the same seed as the edges.

A server whose meshes have all stopped pushing does not wait for ever: `serve` gives
up once one that has steps left has been silent for `edges_timeout_s`, naming it.

A run stopped and resumed reports the whole run, as `train` does (issue 33, item 2):
each checkpoint carries the server's wall time and "parallel" counts so far, every
stretch's (meshdl/training/cumulative.py), and the stretch that ends the run adds its
own; the time a stopped server spent after its last checkpoint is lost with it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.augment import orientations, originals
from meshdl.data.datasets import Dataset
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.mqtt.session import BrokerAddress, Session
from meshdl.protocol.auth import PushAuthenticator, push_keys_for
from meshdl.protocol.messages import Message
from meshdl.protocol.topics import push_topic
from meshdl.protocol.wire import Wire
from meshdl.server.machine import ParameterServer
from meshdl.sync import Sync
from meshdl.training.checkpoint import Checkpoint, save_checkpoint
from meshdl.training.cumulative import SoFar, add_counts
from meshdl.training.loop import (
    EpochFn,
    EpochMetrics,
    History,
    batches,
    checkpoint_of,
    normalization,
    restore,
)
from meshdl.training.parallel import epoch_shards, mesh_ids

SERVER_CLIENT = "ps"  # its status topic, under the first mesh
# Keys of the server's "parallel" record that describe the run or where it stands
# rather than count what a stretch did: the later stretch's value stands. (`updates` is
# the server's version, which a resumed server takes up from its checkpoint.)
SERVER_DESCRIPTIONS = frozenset({"meshes", "sync", "session", "updates"})


class ServerRun:
    """A training run of the parameter server: its machine, epochs and checkpoints."""

    def __init__(self, config: RunConfig, data: Dataset, checkpoints: Path | None = None,
                 resume: Checkpoint | None = None, session: int | None = None,
                 on_epoch: EpochFn | None = None) -> None:
        """`data`: the training view the meshes train on (its size makes the epochs;
        its readings, the normalization every mesh applies)."""
        tc = config.train
        self.config, self.checkpoints, self.on_epoch = config, checkpoints, on_epoch
        self.sync = Sync.parse(config.parallel.sync)
        if config.parallel.overlap:
            raise MeshdlError("over MQTT the server takes whole pushes: run without overlap")
        n = config.parallel.meshes
        self.steps = -(-originals(data) // (n * tc.batch))  # clocks per epoch
        total = tc.epochs * self.steps * (n if self.sync.asynchronous else 1)
        share = self.sync.lr_share(n)
        self.model = CNN(config.model, seed=tc.seed)
        self.model.set_normalization(*normalization(data.X_train))
        self.optimizer = Optimizer(tc, self.model.flat.size)
        self.history = History()
        # The batches each epoch draws, drawn here too (the edges draw their shards from
        # the same seed): its state in a checkpoint is the one `train` would save.
        self.rng = np.random.default_rng(tc.seed)
        self._n_train = originals(data)
        session = int.from_bytes(os.urandom(2), "little") if session is None else session
        self._sizes: dict[int, list[list[int]]] = {}  # epoch -> mesh index -> step -> samples
        self.server = ParameterServer(self.model, self.optimizer, mesh_ids(config),
                                      self.sync,
                                      lambda k: share * learning_rate(tc, k, total),
                                      session=session, compress=config.mesh.compress,
                                      shard_sizes=self.shard_size)
        # The links edge-ps, read up front: a missing key file is an error now, not a
        # run that never takes a push.
        keys = push_keys_for(config.parallel.keys, list(self.server.meshes), config.mesh.auth)
        self.wire = Wire(None, None if keys is None else PushAuthenticator(keys))
        if resume is not None:
            restore(resume, config, self.model, self.optimizer, self.rng, self.history)
            self.server.resume_at(len(self.history.epochs) * self.steps)
        # The earlier stretches' figures, to which this one's add up.
        self.before = SoFar(self.history.wall_s, parallel=dict(self.history.parallel))
        self.stats: Counter[str] = Counter()
        self.started = time.perf_counter()
        # When the last epoch was applied: the run's clock stops there (a resumed run
        # with nothing left to train adds nothing).
        self.ended: float | None = self.started if self.done else None

    def report(self) -> dict[str, Any]:
        """metrics.json's "parallel" of the server, the whole run's (every stretch):
        updates, staleness, what it counted, seconds served."""
        return self.so_far().parallel

    def so_far(self) -> SoFar:
        """The whole run's wall time and "parallel" record up to now (up to the last
        epoch's end, once it has ended)."""
        now = time.perf_counter() if self.ended is None else self.ended
        stretch = self._stretch_report(now - self.started)
        whole = _in_order(add_counts(self.before.parallel, stretch, SERVER_DESCRIPTIONS)) \
            if self.before.parallel else stretch
        return SoFar(self.before.wall_s + now - self.started, parallel=whole)

    def _stretch_report(self, wall_s: float) -> dict[str, Any]:
        """The "parallel" record of this stretch alone (this process's server)."""
        server = self.server
        return {"meshes": len(server.meshes), "sync": str(self.sync),
                "updates": server.version, "session": server.session,
                "staleness": {str(k): n for k, n in sorted(server.staleness.items())},
                "server": dict(sorted(server.stats.items())),
                "connection": dict(sorted(self.stats.items())),
                "wall_s": wall_s}

    @property
    def done(self) -> bool:
        return len(self.history.epochs) >= self.config.train.epochs

    def shard_size(self, mesh: int, clock: int) -> int:
        """The samples of mesh `mesh`'s step `clock` (from 1): its shard of that step's
        global batch, dealt as the edges deal it (meshdl/training/edge_run.py)."""
        epoch, step = divmod(clock - 1, self.steps)
        sizes = self._sizes.get(epoch + 1)
        if sizes is None:
            sizes = [[len(shard) for shard in mine]
                     for mine in epoch_shards(self.config, self._n_train, epoch + 1)]
            if len(self._sizes) >= 4:  # meshes are at most a few epochs apart (ssp)
                del self._sizes[min(self._sizes)]
            self._sizes[epoch + 1] = sizes
        index = mesh - self.config.parallel.first_mesh_id
        return sizes[index][step] if step < len(sizes[index]) else 0

    def silent(self, since: float, now: float, timeout_s: float) -> list[int]:
        """The meshes with steps left from which no push has come for `timeout_s`
        (counting from `since`, the start of serving, for those never heard)."""
        last = self.config.train.epochs * self.steps
        heard = self.server.heard
        return [mesh for mesh in self.server.meshes
                if self.server.clock[mesh] < last and
                now - max(heard.get(mesh, since), since) > timeout_s]

    def handle(self, topic: str, message: Message) -> list[Message]:
        """A push from an edge: through the server machine, then the epoch's end."""
        if topic != push_topic(message.header.mesh):
            self.stats["rejected:topic_mismatch"] += 1
            return []
        out = self.server.handle(message, time.monotonic())
        self._epochs_ended()
        return out

    def _epochs_ended(self) -> None:
        server = self.server
        while not self.done and server.settled and \
                min(server.clock.values()) >= (len(self.history.epochs) + 1) * self.steps:
            figures = server.take_epoch()
            tc = self.config.train
            batches(self._n_train, self.config.parallel.meshes * tc.batch, self.rng,
                    orientations(tc))
            learned = figures.samples
            self.history.epochs.append(EpochMetrics(
                epoch=len(self.history.epochs) + 1,
                train_loss=figures.loss_sum / learned if learned else float("nan"),
                train_acc=figures.correct / learned if learned else float("nan"),
                test_acc=float("nan"),  # the edges evaluate, in their meshes
                skipped_steps=figures.skipped))
            if self.done:
                self.ended = time.perf_counter()
            # The history holds the whole run's figures up to here: what metrics.json
            # reports once the run is over, what the checkpoint carries over to a resume.
            so_far = self.so_far()
            self.history.wall_s, self.history.parallel = so_far.wall_s, so_far.parallel
            if self.checkpoints is not None:
                save_checkpoint(self.checkpoints, checkpoint_of(
                    self.config, self.model, self.optimizer, self.history,
                    self.rng.bit_generator.state, so_far=so_far))
            if self.on_epoch is not None:
                self.on_epoch(self.history.epochs[-1])


def _in_order(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its counts listed as a stretch lists them (stretches added key by
    key list first the keys of the earlier): staleness by number, the rest by name."""
    staleness = record.get("staleness", {})
    return {**record,
            "staleness": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
            **{key: dict(sorted(record.get(key, {}).items()))
               for key in ("server", "connection")}}


class EdgesSilent(MeshdlError):
    """The meshes named stopped pushing: the server gives up instead of waiting."""


async def serve(run: ServerRun, address: BrokerAddress,
                stop: Callable[[], bool] = lambda: False,
                connect_timeout_s: float | None = 30.0,
                edges_timeout_s: float | None = None) -> None:
    """Serve the meshes until the run's last epoch is applied (or `stop()`); raises
    `EdgesSilent` when a mesh with steps left has sent nothing for `edges_timeout_s`
    (None: wait for ever)."""
    config = run.config
    session = Session(address, config.parallel.first_mesh_id, SERVER_CLIENT,
                      [push_topic(mesh) for mesh in run.server.meshes],
                      status={"role": "parameter-server",
                              "meshes": list(run.server.meshes),
                              "session": run.server.session},
                      connect_timeout_s=connect_timeout_s, wire=run.wire,
                      stats=run.stats)
    await session.connect()
    since = time.monotonic()

    async def watch() -> None:
        if edges_timeout_s is None:
            return
        silent = run.silent(since, time.monotonic(), edges_timeout_s)
        if silent:
            names = ", ".join(map(str, silent))
            raise EdgesSilent(
                f"parameter server: no push from mesh{'es' if len(silent) > 1 else ''} "
                f"{names} for {edges_timeout_s:g} s (--edges-timeout); are their "
                "`meshdl edge run --ps` running, with this run's keys?")

    try:
        await session.run(run.handle, tick=watch, until=lambda: run.done or stop())
        await asyncio.sleep(0)  # the last weights went out with the last push's turn
    finally:
        await session.close()
