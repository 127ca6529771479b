"""Benchmark: what compression costs in wall time, against the plain virtual mesh
measured in the same run.

Two figures per policy: the seed network's training waves in the virtual mesh (their
wall time over the same waves' without compression), and one sender's encode plus one
receiver's decode of a REDUCE and of a PUSH (microseconds, median of repeats).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from meshdl.compress.codec import Channel
from meshdl.compress.intsum import SumChannel
from meshdl.compress.policy import CompressionPolicy, model_segments, reduce_segments
from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import CNN
from meshdl.sim.mesh import MeshEngine
from meshdl.training.loop import normalization

POLICIES = ("none", "hylo", "2bit", "int8", "topk:0.1", "powersgd:1", "intsum")


def _codec_us(policy: CompressionPolicy, segments: tuple, repeats: int) -> float | None:
    """One sender's encoding and one receiver's decoding, or under intsum (a REDUCE)
    one node's quantizing of its share, its encoding and the parent's decoding."""
    summed = policy.sum_codec(segments)
    if summed is not None:
        sums = SumChannel(summed)
        share = np.random.default_rng(0).standard_normal(summed.size).astype(np.float32)
        scales = np.full(len(summed.parts), 0.5, np.float32)

        def once() -> object:
            return summed.decode(summed.encode(sums.quantize(share, scales)), 1)
    else:
        codec = policy.codec(segments)
        if codec.lossless:
            return None
        channel = Channel(codec)
        gradient = np.random.default_rng(0).standard_normal(codec.size).astype(np.float32)

        def once() -> object:
            return codec.decode(channel.send(gradient))
    for _ in range(3):
        once()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def _waves_s(config: RunConfig, data: Dataset, compress: str, waves: int) -> float:
    model = CNN(config.model, seed=0)
    model.set_normalization(*normalization(data.X_train))
    engine = MeshEngine(data, compress=compress)
    batch = config.train.batch
    engine.loss_and_grads(model, np.arange(batch))  # builds the mesh, warms the kernels
    start = time.perf_counter()
    for wave in range(1, waves + 1):
        engine.loss_and_grads(model, np.arange(wave * batch, (wave + 1) * batch))
    engine.close()
    return time.perf_counter() - start


def bench_compress(config: RunConfig, data: Dataset, waves: int = 10,
                   log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    rows = []
    reference = _waves_s(config, data, "none", waves)
    log(f"plain virtual mesh: {waves} training waves in {reference:.2f} s")
    for spec in POLICIES:
        policy = CompressionPolicy.parse(spec, config.model)
        wall = reference if spec == "none" else _waves_s(config, data, spec, waves)
        row = {"policy": spec, "waves_wall_s": wall, "ratio_to_plain": wall / reference,
               "reduce_us": _codec_us(policy, reduce_segments(config.model), 200),
               "push_us": _codec_us(policy, model_segments(config.model), 20)}
        log(f"{spec}: {wall:.2f} s ({wall / reference:.2f}x)")
        rows.append(row)
    return {"waves": waves, "batch": config.train.batch, "plain_wall_s": reference,
            "policies": rows}
