"""One executor: every computation's arithmetic is `execute.run_task` (nodes/execute.py),
which the node machines (through nodes/steps.py) and the compiled loop both call, one
task at a time; a step it has no arithmetic for stops the wave, on either road."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.errors import MeshdlError
from meshdl.nodes import execute
from meshdl.nodes.execute import CONV, UnknownStep
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh

ROOT = Path(__file__).resolve().parents[1]
# The kernels that do a step's arithmetic (nodes/compute.py), and the normalization.
KERNELS = {"conv_relu", "conv_relu_placed", "position_grad", "max_pool", "route_max",
           "aggregate_max", "first_winners", "split_max", "relu_backward", "weight_grad",
           "weight_grad_of_input", "input_grad", "normalize"}


def _callers(kernel_names: set[str]) -> dict[str, set[str]]:
    """Per kernel, the files of nodes/, sim/ and edge/ that call it as `compute.<name>`."""
    callers: dict[str, set[str]] = {name: set() for name in kernel_names}
    for folder in ("nodes", "sim", "edge"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        isinstance(node.func.value, ast.Name) and \
                        node.func.value.id == "compute" and node.func.attr in kernel_names:
                    callers[node.func.attr].add(str(path.relative_to(ROOT)))
    return callers


def test_each_steps_arithmetic_is_called_from_the_executor_alone() -> None:
    """The machines' steps and the compiled loop call no kernel of their own: both go
    through `run_task` (and `start_input` for a wave's first values)."""
    callers = _callers(KERNELS)
    assert {name: files for name, files in callers.items()
            if files - {"nodes/execute.py"}} == {}
    assert all(callers[name] == {"nodes/execute.py"} for name in KERNELS - {"normalize"})


def _mesh(compiled: bool) -> VirtualMesh:
    config = ModelConfig(rows=3, cols=4, kernel=3, filters=2, hidden=4)
    X = np.random.default_rng(0).normal(20.0, 3.0, (4, 3, 4)).astype(np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    return VirtualMesh(MeshSpec(1, config), {Split.TRAIN: X, Split.TEST: X}, model,
                       {Split.TRAIN: np.zeros(4, np.int64), Split.TEST: np.zeros(4, np.int64)},
                       compiled=compiled)


def test_a_task_of_an_unknown_step_stops_the_node_machines_wave() -> None:
    """As the compiled loop does (tests/test_compiled_tables.py): the machine's task of
    a step code the executor does not know raises, rather than finishing the wave
    without the task's arithmetic; its host isolates the cell, and the wave stalls
    saying why."""
    mesh = _mesh(compiled=False)
    node = next(iter(mesh.nodes.values()))
    conv = next(t for t, job in enumerate(node.jobs)
                if job.operation is not None and job.operation.step == CONV)
    node.jobs = [*node.jobs]  # (the plan's own list stays as it is)
    job = node.jobs[conv]
    node.jobs[conv] = job._replace(operation=job.operation._replace(step=99))
    with pytest.raises(MeshdlError, match=r"isolated: UnknownStep: .*unknown step code"):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))


def test_the_executor_refuses_a_step_code_it_does_not_know() -> None:
    values = (np.zeros((1, 1, 1), np.float32),) * execute.OPERANDS
    with pytest.raises(UnknownStep):
        execute.run_task(99, 1, values, np.arange(execute.OPERANDS), np.zeros(1, np.intp),
                         np.zeros((execute.OPERANDS, 2), np.int64), np.zeros(1, np.float32),
                         np.zeros((2, 6), np.int64), np.zeros((1, 1), np.float32),
                         np.zeros((0, 1), np.float32), np.zeros((1, 1, 1), np.uint8), 0,
                         0.0, np.zeros(0, np.int64), False, False)
