"""The compiled code runs with Numba's bounds checks on (NUMBA_BOUNDSCHECK=1), so that an
index out of range raises IndexError instead of reading or writing past an array.

Every kernel is compiled with `boundscheck=False` (a checked loop is several times
slower), and nodes/compiled.py `validate` holds the tables to their arrays before the
loop runs. What `validate` cannot see, an index a kernel computes wrong, shows only
with the checks on: `test_the_compiled_meshes_run_with_bounds_checks` runs the meshes
below, each compiled and through the machines, to the bit, the seed mesh, and a
position bias's training wave over mirrored maps, in a process with NUMBA_BOUNDSCHECK=1
and a cache of its own (Numba's cache does not key on the checks: a cached unchecked
build would be loaded). The suite as a whole passes that
way too (`NUMBA_BOUNDSCHECK=1 pytest`), which takes several times as long.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshdl import ModelConfig
from meshdl.nodes import compute
from meshdl.sim.mesh import MeshEngine
from tests.test_compiled import _assert_same, _data, _run

CHECKED = os.environ.get("NUMBA_BOUNDSCHECK") == "1"
ROOT = Path(__file__).resolve().parents[1]

# (rows, cols, kernel, filters, layers, pool, edge, memory plan, failout): every pooling,
# one to three layers, an even kernel, the edge at a corner and mid-border.
MESHES = [
    (4, 5, 3, 2, 2, 2, (0, 0), True, 0.0),
    (5, 4, 2, 1, 3, "global", (0, 2), False, 0.3),
    (3, 6, 3, 3, 1, 3, (2, 5), True, 0.3),
    (4, 4, 4, 2, 2, 1, (0, 0), False, 0.0),
]


@pytest.mark.parametrize(("rows", "cols", "kernel", "filters", "layers", "pool", "edge",
                          "memory_plan", "failout"), MESHES)
def test_compiled_waves_are_the_machines_with_every_pooling(rows, cols, kernel, filters,
                                                            layers, pool, edge, memory_plan,
                                                            failout) -> None:
    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=filters,
                         conv_layers=layers, pool=pool, hidden=4)
    data = _data(config, 7, 1)
    batches = [np.arange(0, 3), np.arange(3, 6), np.array([6])]
    runs = [_run(MeshEngine(data, edge_at=edge, memory_plan=memory_plan, compiled=compiled),
                 config, batches, 1, failout) for compiled in (True, False)]
    _assert_same(*runs)


@pytest.mark.skipif(not CHECKED, reason="run with NUMBA_BOUNDSCHECK=1 (see below)")
def test_an_index_out_of_range_raises_when_bounds_are_checked() -> None:
    """The canary: bounds checking is on in this process (a slot past the values)."""
    values = np.zeros((2, 1, 1), np.float32)
    with pytest.raises(IndexError):
        compute.conv_relu(values, np.array([5], np.intp), np.zeros(1, np.int64),
                          np.zeros((1, 1, 1), np.float32), np.zeros(1, np.float32),
                          np.zeros((1, 1), np.float32))


@pytest.mark.skipif(CHECKED, reason="this process already checks bounds")
def test_the_compiled_meshes_run_with_bounds_checks(tmp_path) -> None:
    env = {**{key: value for key, value in os.environ.items()
              if not key.startswith("PYTEST_XDIST")},  # not a worker of this run's
           "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    tests = [f"tests/{Path(__file__).name}",
             "tests/test_compiled.py::test_the_seed_mesh_trains_as_its_node_machines_to_the_bit",
             "tests/test_compiled_tables.py::test_a_task_of_an_unknown_step_is_refused_and_"
             "stops_the_loop",
             "tests/test_position_bias.py::test_the_compiled_dispatch_trains_the_table_as_"
             "the_machines_do_to_the_bit"]
    this = f"{tests[0]}::test_the_compiled_meshes_run_with_bounds_checks"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "0", "-rs", "--deselect", this, *tests], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"{len(MESHES) + 4} passed" in run.stdout and "skipped" not in run.stdout, \
        run.stdout[-2000:]
