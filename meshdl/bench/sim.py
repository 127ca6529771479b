"""Benchmarks of simulated time (wall clock, never in tests):

- one inference wave on a large mesh (100 x 100 by default) under simulated time: wall
  seconds, simulated events and events per wall second;
- a training run under simulated time against the plain virtual mesh, both measured in
  this run on the same data and configuration (the ratio is the price of the clock:
  events, media and energy bookkeeping over the same node machines, the virtual mesh's
  compiled dispatch left out; the loss-free medium's contention runs compiled,
  sim/radio/air.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from meshdl.config import ModelConfig, RunConfig
from meshdl.data.augment import training_data
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import CNN
from meshdl.protocol.spec import Mode, Split
from meshdl.sim.mesh import MeshEngine
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.device import device, natural_device
from meshdl.sim.radio.media import natural_medium
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine
from meshdl.sim.studies.compare import zero_mesh
from meshdl.training.loop import train


def bench_large_wave(rows: int, cols: int, radio: str = "802.15.4") -> dict[str, Any]:
    """One inference wave of one sample on a rows x cols mesh (readings of zeros: what
    is sent does not depend on them)."""
    medium, node = natural_medium(radio), device(natural_device(radio))
    built = time.perf_counter()
    mesh = zero_mesh(ModelConfig(rows=rows, cols=cols), profile(radio), medium, node,
                     device("pi4"), samples=1, seed=0)
    start = time.perf_counter()
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(1))
    wall = time.perf_counter() - start
    return {"grid": [rows, cols], "radio": radio, "medium": medium,
            "build_s": start - built, "wave_wall_s": wall, "events": mesh.queue.events,
            "events_per_s": mesh.queue.events / wall, "transmissions": mesh.medium.transmissions,
            "simulated_s": mesh.waves[-1].end - mesh.waves[-1].start}


def bench_training(config: RunConfig, data: Dataset, radio: str = "802.15.4",
                   log: Callable[[str], None] = lambda _: None,
                   pairs: int = 1) -> dict[str, Any]:
    """The same training run in the plain virtual mesh and under simulated time,
    `pairs` times one after the other: this machine's speed drifts by a fifth from
    run to run, so one ratio is a sample; the figures are the pairs' medians, each
    pair's in `pairs`."""
    runs = [_training_pair(config, data, radio, log) for _ in range(pairs)]
    result = dict(runs[len(runs) // 2])  # the other figures are the same in every pair
    for name in ("virtual_wall_s", "timed_wall_s", "ratio_to_virtual", "events_per_s"):
        result[name] = statistics.median(run[name] for run in runs)
    result["same_parameters"] = all(run["same_parameters"] for run in runs)
    result["pairs"] = [{name: run[name] for name in ("virtual_wall_s", "timed_wall_s",
                                                      "ratio_to_virtual")} for run in runs]
    return result


def _training_pair(config: RunConfig, data: Dataset, radio: str,
                   log: Callable[[str], None]) -> dict[str, Any]:
    view = training_data(config.train, data, config.model)
    medium, node = natural_medium(radio), device(natural_device(radio))
    # One wave first, so that neither run pays for loading the compiled kernels.
    MeshEngine(view, compiled=False).loss_and_grads(CNN(config.model, seed=config.train.seed),
                                    np.arange(config.train.batch))
    log("training in the virtual mesh")
    virtual_model, virtual = train(config, data, engine=MeshEngine(view, compiled=False))
    log(f"training under simulated time ({radio}, {medium})")
    engine = SimEngine(view, profile(radio), medium, node, device("pi4"),
                       seed=config.train.seed)
    timed_model, timed = train(config, data, engine=engine)
    assert engine.mesh is not None
    return {"grid": [config.model.rows, config.model.cols], "epochs": config.train.epochs,
            "virtual_wall_s": virtual.wall_s, "timed_wall_s": timed.wall_s,
            "ratio_to_virtual": timed.wall_s / virtual.wall_s,
            "same_parameters": bool(np.array_equal(timed_model.flat, virtual_model.flat)),
            "waves": len(engine.mesh.waves), "events": engine.mesh.queue.events,
            # the loss-free medium's contention compiled (sim/radio/air.py), as by default
            "compiled_medium": isinstance(engine.mesh.queue, AirQueue),
            "events_per_s": engine.mesh.queue.events / timed.wall_s,
            "simulated_s": engine.mesh.queue.now}
