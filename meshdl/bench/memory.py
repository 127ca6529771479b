"""Benchmark: the memory one wave holds, with the memory plan (seed 002) and without.

The plan (nodes/memory.py, `CNN.head_backward(overwrite=True)`): an inference
wave gives the nodes' gradient fields no memory, an exact training wave lets the
gradients coming down the tree take the memory of the features that went up, and the
edge writes each input gradient of its head over the input it no longer needs.

Each measurement runs in a fresh process (`python -m meshdl.bench.memory`), so that
one's peak resident set is not another's: the mesh is built, its kernels are warmed up on
a tiny mesh first (compilation is not the wave's memory), then one wave runs with
tracemalloc on. Figures per measurement:
  - traced_peak_mb: the highest Python/numpy allocation during the wave, above what was
    allocated before it (numpy reports its buffers to tracemalloc);
  - held_mb: what is still allocated after it (the node buffers kept for the next wave);
  - rss_peak_mb: the process's peak resident set (ru_maxrss), the operating system's view,
    including the interpreter, the libraries and the mesh's plans.
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import tracemalloc
from typing import Any, NamedTuple

import numpy as np

from meshdl.config import ModelConfig
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh


class MemoryCase(NamedTuple):
    """One wave measured: a grid, a batch size and a mode."""

    rows: int
    cols: int
    batch: int
    mode: str  # "train" or "infer"

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols} {self.mode} batch {self.batch}"


SEED_CASES = [MemoryCase(17, 25, 100, "train"), MemoryCase(17, 25, 1024, "train"),
              MemoryCase(17, 25, 1024, "infer")]
WHOLE_BATCH_BYTES = 1 << 28
LARGE_CASES = [MemoryCase(100, 100, 100, "train"), MemoryCase(100, 100, 100, "infer")]


def _mesh(config: ModelConfig, batch: int, plan: bool, seed: int = 0) -> VirtualMesh:
    """The virtual mesh of `config` with `batch` samples of random readings per split,
    its nodes and edge with the memory plan or without (`plan`)."""
    rng = np.random.default_rng(seed)
    maps = rng.normal(20.0, 2.0, (batch, config.rows, config.cols)).astype(np.float32)
    labels = rng.integers(0, config.classes, batch)
    model = CNN(config, seed=seed)
    model.norm_mean[:] = 20.0
    model.norm_std[:] = 2.0
    # One wave carries the whole batch (the broker's default 1 MiB would cut the seed's
    # at 448 samples, a 100 x 100 mesh's at 20), as with a raised `max_message_bytes`.
    spec = MeshSpec(1, config, max_message_bytes=WHOLE_BATCH_BYTES)
    return VirtualMesh(spec, {Split.TRAIN: maps, Split.TEST: maps}, model,
                       {Split.TRAIN: labels, Split.TEST: labels}, memory_plan=plan)


def _wave(mesh: VirtualMesh, mode: Mode, batch: int) -> None:
    mesh.run_wave(mode, Split.TRAIN, np.arange(batch))


def _rss_mb() -> float:
    """The peak resident set so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(case: MemoryCase, plan: bool) -> dict[str, Any]:
    """One wave of `case` in this process, with or without the memory plan."""
    mode = Mode.TRAIN if case.mode == "train" else Mode.INFER
    warm = _mesh(ModelConfig(rows=4, cols=4), 2, plan)  # compiles (or loads) every kernel
    _wave(warm, Mode.TRAIN, 2)
    _wave(warm, Mode.INFER, 2)
    del warm
    mesh = _mesh(ModelConfig(rows=case.rows, cols=case.cols), case.batch, plan)
    gc.collect()
    rss_before = _rss_mb()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _wave(mesh, mode, case.batch)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"case": case.name, "plan": plan, "traced_peak_mb": (peak - before) / 1e6,
            "held_mb": (current - before) / 1e6, "rss_before_mb": rss_before,
            "rss_peak_mb": _rss_mb()}


def _in_fresh_process(case: MemoryCase, plan: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "meshdl.bench.memory", *map(str, case), str(int(plan))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise MeshdlError(f"memory measurement of {case.name} failed: {last[0]}")
    return json.loads(done.stdout)


def bench_memory(cases: list[MemoryCase], log: Any = lambda _: None) -> dict[str, Any]:
    """Each case with the plan and without, each in its own process; the saving is
    1 - with / without."""
    rows = []
    for case in cases:
        log(f"{case.name}: without the memory plan, then with it")
        without, with_plan = _in_fresh_process(case, False), _in_fresh_process(case, True)
        rows.append({"case": case.name, "grid": [case.rows, case.cols], "batch": case.batch,
                     "mode": case.mode, "without": without, "with": with_plan,
                     "traced_saving": 1 - with_plan["traced_peak_mb"] / without["traced_peak_mb"],
                     "rss_saving": 1 - with_plan["rss_peak_mb"] / without["rss_peak_mb"]})
    return {"cases": rows}


if __name__ == "__main__":  # one measurement, run by `_in_fresh_process`
    rows, cols, batch, mode, plan = sys.argv[1:6]
    figures = measure(MemoryCase(int(rows), int(cols), int(batch), mode), plan == "1")
    print(json.dumps(figures))
