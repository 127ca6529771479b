"""The training loop of several meshes training one model (`--meshes N`).

Each epoch draws its batches exactly as one model trained with batch N b would
(`training.batches` with the global batch N b) and gives mesh i the i-th contiguous
shard of each (asynchronous: whichever mesh is free takes the next shard); the meshes,
their edges and the parameter server then run the epoch (sim/cluster.py) under the
run's `Sync` (meshdl/sync.py). With `bsp` every update is
the one that single model takes: tests/test_parallel.py checks it step by step. The
epoch is evaluated on the server's model, by the first mesh (in-mesh inference).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.blas import one_blas_thread
from meshdl.config import RunConfig
from meshdl.data.augment import orientations, originals, training_data
from meshdl.data.datasets import Dataset
from meshdl.errors import MeshdlError, UsageError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.server.machine import ParameterServer
from meshdl.server.worker import Learnt, MeshWorker
from meshdl.sim.cluster import Cluster, UpdateFn, WaveShape
from meshdl.sim.radio.backhaul import INSTANT, Backhaul, BackhaulProfile
from meshdl.sync import Sync
from meshdl.training.checkpoint import Checkpoint, save_checkpoint
from meshdl.training.cumulative import SoFar, add_comm, add_counts
from meshdl.training.loop import (
    Engine,
    EpochFn,
    EpochMetrics,
    History,
    ProgressFn,
    batches,
    checkpoint_of,
    engine_for,
    final_metrics,
    normalization,
    predictions,
    restore,
)

WaveTime = Callable[[list[Engine], int], WaveShape]  # (the engines, mesh i) -> its last wave


def mesh_ids(config: RunConfig) -> list[int]:
    """The meshes' ids, in shard order."""
    first = config.parallel.first_mesh_id
    return list(range(first, first + config.parallel.meshes))


def shards(global_batch: np.ndarray, meshes: int) -> list[np.ndarray]:
    """Mesh i's share of a global batch: its i-th contiguous part (sizes differ by one
    at most; a batch shorter than the meshes leaves some empty)."""
    return np.array_split(global_batch, meshes)


def epoch_shards(config: RunConfig, n_train: int, epoch: int) -> list[list[np.ndarray]]:
    """Every mesh's shards of epoch `epoch` (from 1), drawn as the run draws them: each
    mesh can compute its own from the configuration alone (over MQTT, `edge run --ps`)."""
    tc, n = config.train, config.parallel.meshes
    rng = np.random.default_rng(tc.seed)
    for _ in range(epoch - 1):
        batches(n_train, n * tc.batch, rng, orientations(tc))
    split = [shards(b, n) for b in batches(n_train, n * tc.batch, rng, orientations(tc))]
    return [[parts[i] for parts in split] for i in range(n)]


def rounds_of_last_wave(engines: list[Engine], i: int) -> WaveShape:
    """A virtual mesh's clock: the rounds (one hop each) its last wave took, and the
    round its head ran in (a head takes no round); one round per step for an engine
    without a mesh (central)."""
    mesh = getattr(engines[i], "mesh", None)
    rounds = float(getattr(mesh, "last_wave_rounds", 1))
    gather = getattr(mesh, "gather_rounds", None)
    head = rounds if gather is None else float(gather)
    return WaveShape(rounds, head, head)


@one_blas_thread  # as `train`: the same bits whatever the machine's cores
def train_parallel(
    config: RunConfig,
    data: Dataset,
    engines: list[Engine] | None = None,
    wave_time: WaveTime = rounds_of_last_wave,
    time_unit: str = "rounds",
    backhaul: BackhaulProfile = INSTANT,
    progress: ProgressFn | None = None,
    checkpoints: Path | None = None,
    resume: Checkpoint | None = None,
    on_epoch: EpochFn | None = None,
    on_update: UpdateFn | None = None,
) -> tuple[CNN, History]:
    """Fit one model on `config.parallel.meshes` meshes; returns it and its history.

    `engines`: one per mesh (default: `config.mode`'s, mesh i of id
    `config.parallel.first_mesh_id` + i); `wave_time` (in `time_unit`s) and `backhaul` set the
    cluster's clock;
    `on_update(version, params)` sees every update of the server."""
    started = time.perf_counter()
    tc, n_meshes = config.train, config.parallel.meshes
    sync = Sync.parse(config.parallel.sync)
    data = training_data(tc, data, config.model)
    model = CNN(config.model, seed=tc.seed)
    model.set_normalization(*normalization(data.X_train, config.model.alive))
    created = engines is None
    if engines is None:
        engines = [engine_for(_with_mesh_id(config, mesh_id), data)
                   for mesh_id in mesh_ids(config)]
    if len(engines) != n_meshes:
        raise UsageError(f"{len(engines)} engines for {n_meshes} meshes")
    try:
        optimizer = Optimizer(tc, model.flat.size)
        rng = np.random.default_rng(tc.seed)
        history = History()
        if resume is not None:
            if resume.steps_done:
                raise MeshdlError("this checkpoint stopped inside an epoch; several meshes "
                                  "checkpoint at epoch ends only")
            restore(resume, config, model, optimizer, rng, history)
        n_train, n_test = originals(data), len(data.y_test)
        per_epoch = -(-n_train // (n_meshes * tc.batch))  # global batches (clocks)
        total = tc.epochs * per_epoch * (n_meshes if sync.asynchronous else 1)
        overlap = config.parallel.overlap
        share = sync.lr_share(n_meshes)
        server = ParameterServer(model, optimizer, mesh_ids(config), sync,
                                 lambda n: share * learning_rate(tc, n, total), overlap=overlap,
                                 compress=config.mesh.compress)
        workers = [MeshWorker(mesh_id, sync, _replica(model), compress=config.mesh.compress)
                   for mesh_id in server.meshes]
        pushes = 0

        def pushed(_: int, learnt: Learnt | None) -> None:
            nonlocal pushes
            pushes += 1
            if progress:
                progress(epoch, pushes, per_epoch * n_meshes,
                         learnt.loss if learnt is not None else float("nan"))

        cluster = Cluster(server, workers, engines, data.y_train,
                          lambda i: wave_time(engines, i), Backhaul(backhaul), on_update,
                          pushed, overlap=overlap)
        test_pred = np.empty(0, np.int64)
        for epoch in range(len(history.epochs) + 1, tc.epochs + 1):
            pushes = 0
            epoch_batches = batches(n_train, n_meshes * tc.batch, rng, orientations(tc))
            split = [shards(b, n_meshes) for b in epoch_batches]
            cluster.run_epoch([[parts[i] for parts in split] for i in range(n_meshes)],
                              pooled=sync.asynchronous)
            figures = server.take_epoch()
            # Every mesh holds the server's weights now: the first evaluates them.
            test_pred = predictions(engines[0], workers[0].model, "test", n_test)
            learned = figures.samples
            history.epochs.append(EpochMetrics(
                epoch=epoch,
                train_loss=figures.loss_sum / learned if learned else float("nan"),
                train_acc=figures.correct / learned if learned else float("nan"),
                test_acc=float(np.mean(test_pred == data.y_test)) if n_test else float("nan"),
                skipped_steps=figures.skipped,
            ))
            if checkpoints is not None:  # with the whole run's figures so far
                so_far = SoFar(history.wall_s + time.perf_counter() - started,
                               add_comm(history.comm, engines[0].report()),
                               whole_parallel(history.parallel, parallel_report(
                                   sync, server, cluster, time_unit,
                                   [engine.report() for engine in engines])))
                save_checkpoint(checkpoints, checkpoint_of(config, model, optimizer, history,
                                                           rng.bit_generator.state,
                                                           so_far=so_far))
            if on_epoch is not None:
                on_epoch(history.epochs[-1])
        if len(test_pred) != n_test:  # resumed after the last epoch: nothing ran
            test_pred = predictions(engines[0], workers[0].model, "test", n_test)
        history.final = final_metrics(config.model.classes,
                                      predictions(engines[0], workers[0].model, "train",
                                                  n_train),
                                      data.y_train[:n_train], test_pred, data.y_test)
        history.comm = add_comm(history.comm, engines[0].report())
        history.parallel = whole_parallel(history.parallel, parallel_report(
            sync, server, cluster, time_unit, [engine.report() for engine in engines]))
    finally:
        if created:
            for engine in engines:
                engine.close()
    history.wall_s += time.perf_counter() - started
    return model, history


def parallel_report(sync: Sync, server: ParameterServer, cluster: Cluster, time_unit: str,
                    comms: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json's "parallel": the server's updates and staleness, and each mesh's
    steps, time and traffic on the cluster's clock."""
    return with_figures({
        "meshes": len(cluster.workers),
        "sync": str(sync),
        "overlap": cluster.overlap,
        "backhaul": cluster.backhaul.report(),
        "updates": server.version,
        "staleness": {"histogram": {str(k): n for k, n in sorted(server.staleness.items())}},
        "time_unit": time_unit,
        "elapsed": cluster.queue.now,
        "server": dict(sorted(server.stats.items())),
        "per_mesh": [
            {"mesh_id": worker.mesh_id, **asdict(figures),
             "mesh_bytes": comm.get("total_bytes", 0),
             **({"rejected": dict(worker.stats)} if any(
                 k.startswith("rejected") for k in worker.stats) else {})}
            for worker, figures, comm in zip(cluster.workers, cluster.figures, comms,
                                             strict=True)],
    })


def with_figures(counts: dict[str, Any]) -> dict[str, Any]:
    """The "parallel" record of `counts` (`parallel_report`'s counts alone, or those of
    several stretches of a run added), with the figures derived from them: staleness
    max and mean, a step's mean, compute and communication time, samples per time."""
    histogram = counts["staleness"]["histogram"]
    taken = sum(histogram.values())
    elapsed = counts["elapsed"]
    meshes = counts["per_mesh"]
    samples = sum(m["samples"] for m in meshes)
    steps = max((m["steps"] for m in meshes), default=0)
    # A step's compute (a mesh's wave) and communication (its share of the busiest
    # backhaul bottleneck, plus a round trip); overlapped perfectly, a step would take
    # the longer of the two.
    compute = float(np.mean([m["busy"] / m["steps"] for m in meshes if m["steps"]])) \
        if steps else 0.0
    backhaul = counts["backhaul"]
    communication = backhaul["busiest_link_s"] / steps + 2 * backhaul["latency_s"] \
        if steps else 0.0
    return {
        **{key: counts[key] for key in ("meshes", "sync", "overlap", "backhaul", "updates")},
        "staleness": {
            "max": max(map(int, histogram), default=0),
            "mean": sum(int(k) * n for k, n in histogram.items()) / taken if taken else 0.0,
            "histogram": histogram,
        },
        "time_unit": counts["time_unit"],
        "elapsed": elapsed,
        "step": {"mean": elapsed / steps if steps else 0.0, "compute": compute,
                 "communication": communication,
                 "ideal": max(compute, communication)},
        "samples_per_time": samples / elapsed if elapsed else float("nan"),
        "server": counts["server"],
        "per_mesh": meshes,
    }


# Keys of the "parallel" record that describe the run rather than count what it did.
PARALLEL_DESCRIPTIONS = frozenset({"meshes", "sync", "overlap", "time_unit", "name",
                                   "source", "latency_s", "mesh_id"})


def whole_parallel(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The "parallel" record of two stretches of one run, `before` and then `after`."""
    if not before:
        return after
    return with_figures(add_counts(before, after, PARALLEL_DESCRIPTIONS))


def _replica(model: CNN) -> CNN:
    """An edge's copy of the server's model: same parameters and normalization."""
    copy = CNN(model.config)
    copy.flat[...] = model.flat
    copy.set_normalization(model.norm_mean, model.norm_std)
    return copy


def _with_mesh_id(config: RunConfig, mesh_id: int) -> RunConfig:
    return config.model_copy(update={"mesh": config.mesh.model_copy(
        update={"mesh_id": mesh_id})})
