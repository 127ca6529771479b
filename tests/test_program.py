"""A node's plan is its program (`NodePlan.program`, nodes/plan.py): integer rows per task
in the node's own numbering, which the node machine and the compiled tables both read.
Every operand lies in the node's own buffers, every source a task waits for counts it
down exactly once, and each step has the operands the executor reads."""

from __future__ import annotations

from collections import Counter

import pytest

from meshdl import ModelConfig
from meshdl.nodes.execute import OPERAND_KINDS, SEND, WEIGHT_GRAD
from meshdl.nodes.plan import CHILD_LIST, NONE, TAP_LIST, NodePlan
from meshdl.protocol.messages import Kind
from meshdl.protocol.spec import MeshSpec

CONFIGS = [
    ModelConfig(rows=4, cols=5, kernel=3, filters=2, conv_layers=2, pool=2, hidden=4),
    ModelConfig(rows=5, cols=4, kernel=2, filters=3, conv_layers=3, pool="global", hidden=4),
    ModelConfig(rows=3, cols=6, kernel=3, filters=1, conv_layers=1, pool=3, hidden=4),
]


def _plans(config: ModelConfig, edge_at=(0, 0)):
    spec = MeshSpec(1, config, edge_at)
    return spec, [NodePlan(spec, cell) for cell in spec.topology.cells()]


@pytest.mark.parametrize("config", CONFIGS, ids=["windowed", "global", "one-layer"])
def test_every_operand_of_a_program_lies_in_its_nodes_own_buffers(config) -> None:
    _, plans = _plans(config)
    taps = config.kernel ** 2
    for plan in plans:
        program = plan.program
        children = sum(1 for key in plan.keys if key.kind == Kind.REDUCE)
        for t, args in enumerate(program.args):
            step = int(program.step[t])
            used = 1 if step == SEND else len(OPERAND_KINDS[step])
            for k, (buffer, start, end) in enumerate(args):
                values = program.lists[start:end]
                if k >= used or (step == WEIGHT_GRAD and program.layer[t] == 1 and k in (3, 4)):
                    assert buffer == NONE and start == end
                elif buffer == TAP_LIST:
                    assert values.size and values.min() >= 0 and values.max() < taps
                elif buffer == CHILD_LIST:
                    assert list(values) == list(range(children))
                else:  # slots: one where the step reads one (a leaf has no children)
                    assert 0 <= buffer < len(plan.slots)
                    one = step != SEND and OPERAND_KINDS[step][k][1]
                    assert values.size == 1 if one else values.size or step != SEND
                    assert ((values >= 0) & (values < len(plan.slots[buffer]))).all()


@pytest.mark.parametrize("config", CONFIGS, ids=["windowed", "global", "one-layer"])
def test_each_source_a_task_waits_for_counts_it_down_once(config) -> None:
    """A task's count of sources (`Program.needs`) is what counts it down: the inbox
    entries it waits for, the computations that make what it reads (`Program.made`),
    and this cell's own input (`Program.started`)."""
    _, plans = _plans(config)
    for plan in plans:
        program, lists = plan.program, plan.program.lists
        counted = Counter(t for expect in plan.expected for t in expect.waiters)
        counted.update(int(t) for start, end in program.made for t in lists[start:end])
        counted.update(int(t) for t in program.slots(*program.started))
        assert [counted[t] for t in range(len(program.step))] == list(program.needs)
