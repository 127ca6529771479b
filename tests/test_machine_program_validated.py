"""A node machine's program is checked before its first task runs, by the checks the
compiled loop's tables pass (nodes/compiled.py `validate_program`: the program read as
the tables of a mesh of that node alone, and each list of slots inside its own buffer),
once per plan, as the machine starts its first wave of it. The executor indexes without
bounds checks, on either road: a tampered index is refused in one line (the wave stalls
naming the cell its host isolated, and why) and no task of that program runs; the
untampered programs pass and run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.errors import MeshdlError
from meshdl.nodes.execute import CONV
from meshdl.nodes.plan import NodePlan, Program
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh


def _mesh() -> VirtualMesh:
    config = ModelConfig(rows=3, cols=4, kernel=3, filters=2, hidden=4)
    X = np.random.default_rng(0).normal(20.0, 3.0, (4, 3, 4)).astype(np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    labels = np.zeros(4, np.int64)
    return VirtualMesh(MeshSpec(1, config), {Split.TRAIN: X, Split.TEST: X}, model,
                       {Split.TRAIN: labels, Split.TEST: labels})


def _own(plan: NodePlan) -> Program:
    """The plan's program as its own writable copy: plans of the same content share
    one read-only program (nodes/shared.py), so a tamper changes a copy."""
    plan.program = Program(*(values.copy() for values in plan.program))
    return plan.program


def _conv(program: Program) -> int:
    """The node's first conv task (every member cell has one)."""
    return int(np.flatnonzero(program.step == CONV)[0])


def test_the_untampered_programs_pass_and_run() -> None:
    mesh = _mesh()
    assert not any(node.plan.checked for node in mesh.nodes.values())  # (not yet)
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    assert np.isfinite(result.loss)
    assert all(node.plan.checked and node.flops > 0 for node in mesh.nodes.values())


def _step(p: Program, t: int) -> str:
    p.step[t] = 99
    return f"Tables.task_step[{t}] = 99, not a step code"


def _layer(p: Program, t: int) -> str:
    p.layer[t] = 7
    return f"Tables.task_layer[{t}] = 7, not one of the 3 layers"


def _range(p: Program, t: int) -> str:
    p.args[t, 0, 2] = len(p.lists) + 5  # its input window's list, past the lists
    return f"Program.args[{t}, 0] = {len(p.lists) + 5}, not a range [start, end)"


def _tap(p: Program, t: int) -> str:
    start = p.args[t, 1, 1]  # its first kernel tap
    p.lists[start] = 9 ** 2
    return (f"Tables.lists[{start}] = 81, not one of the 9 operands (listed by "
            f"Tables.task_args[{t}, 1])")


def _waiter(p: Program, t: int) -> str:
    start, end = p.made[t]
    assert end > start  # (a conv's output is read by others)
    p.lists[start] = len(p.step) + 3
    return f"Tables.lists[{start}] = {len(p.step) + 3}, not one of the {len(p.step)} tasks"


@pytest.mark.parametrize("tamper", [_step, _layer, _range, _tap, _waiter],
                         ids=["step", "layer", "operand-range", "tap", "waiting-task"])
def test_a_tampered_index_of_a_nodes_program_is_refused_in_one_line(tamper) -> None:
    mesh = _mesh()
    node = next(iter(mesh.nodes.values()))
    named = tamper(_own(node.plan), _conv(node.plan.program))
    with pytest.raises(MeshdlError) as refused:
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    line = str(refused.value)
    assert "\n" not in line
    assert f"isolated: TablesError: program of cell {node.cell} refused" in line
    assert named in line, line
    assert node.flops == 0 and not node.plan.checked  # none of its tasks ran


# A slot the conv writes (its own activation) out of its buffer: the executor, without
# bounds checks, wrote outside the wave's arrays (one slot past the buffer's end lands
# beside it; far past, the process may die), so the tampered run is a process of its own.
OUT_OF_BUFFER = textwrap.dedent("""
    import sys
    import numpy as np
    from meshdl.errors import MeshdlError
    from meshdl.protocol.spec import Mode, Split
    sys.path.insert(0, {tests!r})
    from test_machine_program_validated import _conv, _mesh, _own

    mesh = _mesh()
    node = next(iter(mesh.nodes.values()))
    plan = node.plan
    program, t = _own(plan), _conv(plan.program)
    buffer, start, _ = program.args[t, 2]  # its own activation's one slot
    program.lists[start] = {slot}(plan.buffer_shapes[buffer][0])
    try:
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    except MeshdlError as error:
        print(error)
        sys.exit(1)
""")


@pytest.mark.parametrize("slot", ["int", "10 ** 9 + 0 *"], ids=["one-past", "far-past"])
def test_a_slot_outside_its_buffer_is_refused_and_does_not_run(slot) -> None:
    script = OUT_OF_BUFFER.format(tests=str(Path(__file__).parent), slot=slot)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and "program of cell" in lines[0], lines
    assert "Program.lists[" in lines[0] and "slots of the buffer its operand reads" in lines[0]


def test_a_program_with_the_numbers_of_one_passed_is_not_read_again(monkeypatch) -> None:
    """Nodes with the same neighbourhood have the same program: each distinct one is
    read once (`program_digest`), and a tampered copy of a passed one is still read,
    and refused."""
    from meshdl.nodes import compiled

    read: list[bytes] = []
    tables = compiled.program_tables
    monkeypatch.setattr(compiled, "_CHECKED", compiled.OrderedDict())
    monkeypatch.setattr(compiled, "program_tables", lambda plan, spec, children: (
        read.append(compiled.program_digest(plan, spec, children)),
        tables(plan, spec, children))[1])
    config = ModelConfig(rows=6, cols=7, kernel=3, filters=2, hidden=4)
    X = np.random.default_rng(0).normal(20.0, 3.0, (4, 6, 7)).astype(np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    labels = np.zeros(4, np.int64)
    mesh = VirtualMesh(MeshSpec(1, config), {Split.TRAIN: X, Split.TEST: X}, model,
                       {Split.TRAIN: labels, Split.TEST: labels})  # the machines
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    digests = {compiled.program_digest(node.plan, mesh.spec,
                                       len(mesh.spec.topology.children.get(cell, [])))
               for cell, node in mesh.nodes.items()}
    assert len(read) == len(set(read)) == len(digests) < len(mesh.nodes)
    twin = next(node.plan for node in mesh.nodes.values())
    _own(twin).layer[_conv(twin.program)] = 7
    with pytest.raises(MeshdlError, match="not one of the 3 layers"):
        compiled.validate_program(twin, mesh.spec, next(iter(mesh.nodes)))
