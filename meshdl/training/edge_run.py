"""The edge's loop when several meshes train one model over MQTT (`meshdl edge run
--ps`): its mesh computes its shard of every global batch, the parameter server
(meshdl/training/ps_run.py) combines and updates.

The edge is the `MeshWorker` machine (server/worker.py) over an `MqttEngine`: the engine
runs the training waves through the node hosts and hands the server's weights to the
worker; this loop says which shard comes next (drawn from the configuration alone:
mesh i takes the i-th contiguous part of each global batch, as `train_parallel` does),
pushes each step, and waits for what its sync mode needs. A push whose answer does not
come within `resend_s` is pushed again; nothing for `patience_s` is an error. After each
epoch the first mesh evaluates the server's model in its mesh (test split).

With `mesh.auth` the edge seals its pushes and opens the server's weights with its
mesh's key of the link edge-ps (`parallel.keys`, from `meshdl deploy central`), added to
its mesh keys: without that file it refuses to start, naming it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.augment import originals, training_data
from meshdl.data.datasets import Dataset
from meshdl.edge.remote import MqttEngine
from meshdl.errors import MeshdlError, StepSkipped, UsageError
from meshdl.model.cnn import CNN
from meshdl.protocol.auth import push_keys_for, with_push_key
from meshdl.protocol.messages import Message
from meshdl.server.worker import Learnt, MeshWorker
from meshdl.sync import Sync
from meshdl.training.loop import (
    EpochFn,
    EpochMetrics,
    History,
    ProgressFn,
    final_metrics,
    normalization,
    predictions,
)
from meshdl.training.parallel import epoch_shards


def train_with_server(config: RunConfig, data: Dataset, engine: MqttEngine,
                      resend_s: float = 5.0, patience_s: float = 600.0,
                      progress: ProgressFn | None = None,
                      on_epoch: EpochFn | None = None) -> tuple[CNN, History]:
    """Train this edge's mesh's shards with the parameter server; returns the model (the
    server's, as of its last update) and this edge's history."""
    started = time.perf_counter()
    tc, n = config.train, config.parallel.meshes
    index = config.mesh.mesh_id - config.parallel.first_mesh_id
    if not 0 <= index < n:
        raise UsageError(f"mesh {config.mesh.mesh_id} is not one of the {n} meshes from "
                         f"id {config.parallel.first_mesh_id} (parallel.first_mesh_id)")
    if config.parallel.overlap:
        raise UsageError("over MQTT the meshes push whole steps: run without overlap")
    sync = Sync.parse(config.parallel.sync)
    _seal_pushes(config, engine)
    view = training_data(tc, data, config.model)
    n_train, n_test = originals(view), len(view.y_test)
    model = CNN(config.model, seed=tc.seed)  # the server's version 0, from the same seed
    model.set_normalization(*normalization(view.X_train, config.model.alive))
    worker = MeshWorker(config.mesh.mesh_id, sync, model, session=None,
                        compress=config.mesh.compress)
    engine.on_weights = worker.handle
    engine.open(model)
    loop = _Loop(engine, worker, resend_s, patience_s)
    steps = len(epoch_shards(config, n_train, 1)[index])
    history = History()
    epoch = 0
    while epoch < tc.epochs:
        epoch += 1
        worker.assign(epoch_shards(config, n_train, epoch)[index][worker.clock % steps:])
        loss_sum, correct, learned, skipped = 0.0, 0, 0, 0
        while worker.clock < epoch * steps:
            if not loop.wait_for(lambda: worker.ready or worker.rewound):
                raise MeshdlError(loop.gave_up("its next step"))
            if worker.rewound:  # the server started again: from its clock on
                epoch = _rewind(worker, history, steps)
                break
            step = worker.begin()
            learnt = _learn(engine, model, step.indices, view.y_train)
            if learnt is None:
                skipped += len(step.indices) > 0
            else:
                loss_sum += learnt.loss * len(step.indices)
                correct += learnt.correct
                learned += len(step.indices)
            loop.push(worker.push(learnt))
            if progress:
                progress(epoch, worker.clock - (epoch - 1) * steps, steps,
                         learnt.loss if learnt is not None else float("nan"))
        else:
            # The epoch's last update (every mesh's): the model to evaluate.
            if not sync.asynchronous and not loop.wait_for(
                    lambda: worker.version >= worker.clock or worker.rewound):
                raise MeshdlError(loop.gave_up(f"the update of step {worker.clock}"))
            if worker.rewound:
                epoch = _rewind(worker, history, steps)
                continue
            test = predictions(engine, model, "test", n_test) if index == 0 else None
            history.epochs.append(EpochMetrics(
                epoch=epoch,
                train_loss=loss_sum / learned if learned else float("nan"),
                train_acc=correct / learned if learned else float("nan"),
                test_acc=float(np.mean(test == view.y_test)) if test is not None and n_test
                else float("nan"),
                skipped_steps=skipped))
            if on_epoch is not None:
                on_epoch(history.epochs[-1])
    history.final = final_metrics(config.model.classes,
                                  predictions(engine, model, "train", n_train),
                                  view.y_train[:n_train],
                                  predictions(engine, model, "test", n_test), view.y_test)
    history.comm = engine.report()
    history.parallel = {"meshes": n, "sync": str(sync), "mesh_id": worker.mesh_id,
                        "shard": index, "steps": worker.clock, "version": worker.version,
                        "worker": dict(worker.stats), "pushes_resent": loop.resent}
    history.wall_s = time.perf_counter() - started
    return model, history


def _seal_pushes(config: RunConfig, engine: MqttEngine) -> None:
    """With `mesh.auth`: the engine's keys gain the link edge-ps, so that its pushes
    carry the tag the server checks and only the server's weights are taken."""
    push = push_keys_for(config.parallel.keys, [config.mesh.mesh_id], config.mesh.auth)
    if push is None:
        return
    if engine.auth is None:
        raise UsageError("mesh.auth is on but the edge's engine has no keys "
                         "(MqttEngine.for_run reads them from mesh.keys)")
    engine.auth = with_push_key(engine.auth, push)
    if engine.session is not None:  # connected already: its wire takes the new keys
        engine.session.wire.auth = engine.auth


def _rewind(worker: MeshWorker, history: History, steps: int) -> int:
    """The server started again at the worker's clock now: the epochs done before it
    stand, the loop goes on in the next; returns the last epoch done."""
    worker.rewound = False
    done = worker.clock // steps
    del history.epochs[done:]
    return done


def _learn(engine: MqttEngine, model: CNN, indices: np.ndarray,
           labels: np.ndarray) -> Learnt | None:
    """One training wave of the shard (None: nothing to learn from)."""
    if not len(indices):
        return None
    try:
        loss, logits, grads = engine.loss_and_grads(model, indices)
    except StepSkipped:
        return None
    correct = int(np.sum(logits.argmax(axis=1) == labels[indices]))
    return Learnt(correct, float(loss), grads.copy())


class _Loop:
    """Waiting on the server: with the last push sent again while its answer is due."""

    def __init__(self, engine: MqttEngine, worker: MeshWorker, resend_s: float,
                 patience_s: float) -> None:
        self.engine, self.worker = engine, worker
        self.resend_s, self.patience_s = resend_s, patience_s
        self.last: Message | None = None
        self.resent = 0

    def push(self, message: Message) -> None:
        self.last = message
        self.engine.send([*self.worker.take_outbox(), message])

    def wait_for(self, condition: Any) -> bool:
        """Take messages until `condition()`; the last push again every `resend_s`, and
        the pushes the worker makes again for the server's session as soon as it knows
        it."""
        worker = self.worker
        deadline = time.monotonic() + self.patience_s
        while True:
            ended = self.engine.wait_until(lambda: condition() or bool(worker.outbox),
                                           self.resend_s)
            if worker.outbox:
                again = worker.take_outbox()
                self.last = again[-1]
                self.engine.send(again)
            if condition():
                return True
            if ended:
                continue  # the outbox woke it: the resend is not due yet
            if time.monotonic() >= deadline:
                return False
            if self.last is not None:
                self.resent += 1
                self.engine.send([self.last])

    def gave_up(self, what: str) -> str:
        return (f"mesh {self.worker.mesh_id}: no answer from the parameter server for "
                f"{what} in {self.patience_s:g} s (is `meshdl ps run` running on this "
                "broker?)")
