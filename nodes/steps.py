"""What the node machine does around the executor when a computation of its program runs:
delivery, not arithmetic (that is `execute.run_task`'s, nodes/execute.py, for the machine
and the compiled loop alike).

`run` resolves the task's operands (`Program.args`, nodes/plan.py) to the wave's field
buffers, or to this cell's activation kept apart where the wave's memory plan keeps it
(nodes/memory.py); fills in the orphans the step reads first (best effort,
nodes/besteffort.py); gives pooling its winners array; after the arithmetic, keeps a
conv output apart, sends the REDUCE (compressed through the node's channel where the mesh
compresses it, or under intsum summed in whole numbers here: meshdl/compress/intsum.py);
and tells the node what the task made (`NodeMachine._arrived`), which readies the tasks
waiting for it. `NodeMachine._run_ready` calls it for each computation, and counts its
flops. What it reads and calls of the machine is `NodeForSteps` (below), not the
machine's class: nodes/agent.py imports this module, and an import back would close a
circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from meshdl.compress.intsum import add_shares
from meshdl.nodes import execute
from meshdl.nodes.execute import (
    AGGREGATE,
    CONV,
    DZ_TOP,
    INPUT_GRAD,
    OPERANDS,
    POOL,
    REDUCE,
    WEIGHT_GRAD,
)
from meshdl.protocol.messages import Kind, Message
from meshdl.protocol.spec import Field

if TYPE_CHECKING:
    from meshdl.compress.codec import Channel
    from meshdl.compress.intsum import SumChannel
    from meshdl.nodes.besteffort import BestEffort
    from meshdl.nodes.plan import NodePlan, Operation, Wave
    from meshdl.protocol.payloads import ParamsLayout
    from meshdl.protocol.spec import MeshSpec
    from meshdl.protocol.topology import Cell

NO_VALUES = np.zeros((0, 0, 0), np.float32)  # an operand that is a list, or unused
NO_ROWS = np.zeros((0, 0), np.float32)
NO_GRADS = np.zeros((0, 0), np.float32)
NO_WINNERS = np.zeros((0, 0, 0), np.uint8)
NO_COLUMNS = np.zeros(0, np.int64)  # a model without a position bias reads none
IDENTITY = np.arange(OPERANDS, dtype=np.int64)  # operand i's values: the i-th array


class NodeForSteps(Protocol):
    """What a computation's delivery reads and calls of the node machine that runs it
    (`NodeMachine`, nodes/agent.py, which imports this module). `_arrived` and
    `_message` are the machine's own: this module is a part of it, as its best effort
    is."""

    spec: MeshSpec
    plan: NodePlan
    effort: BestEffort  # fills in the orphans a step reads
    layout: ParamsLayout
    number: int  # row x cols + col
    children: list[Cell]
    reduce_channel: Channel | None
    sum_channel: SumChannel | None
    flops: int

    def _arrived(self, wave: Wave, waiters: tuple[int, ...]) -> None: ...

    def _message(self, wave: Wave, kind: Kind, dst: Cell, payload: np.ndarray,
                 layer: int = 0, phase: int = 0) -> Message: ...


def orphans_read(step: int, layer: int, by_input_cell: bool) -> Field | None:
    """The field whose orphans (`NodePlan.orphans`) a step reads, filled in before it
    runs: conv l's input window, the routed gradient of dz_top, and the output
    gradients around this cell that the input gradient (and, by input cell, the
    weight gradient) of layer l reads."""
    if step == CONV:
        return ("a", layer - 1)
    if step == DZ_TOP:
        return ("route",)
    if step == INPUT_GRAD or (step == WEIGHT_GRAD and by_input_cell and layer > 1):
        return ("dz", layer)
    return None


def run(node: NodeForSteps, wave: Wave, operation: Operation, out: list[Message]) -> None:
    """Run one computation of the node's program in `wave` (see the module's
    docstring)."""
    step, layer, buffers, at, kept, kept_at, made = operation
    if node.plan.orphan_rows:
        f = orphans_read(step, layer, wave.by_input_cell)
        if f is not None:
            node.effort.fill_orphans(wave, f)
    if step == REDUCE and node.sum_channel is not None:
        _reduce_in_whole_numbers(node, wave, out)
        return
    if step in (POOL, AGGREGATE):  # which source held each maximum (<= 64 of them)
        wave.winners = np.empty((node.spec.model.filters, wave.batch), np.uint8)
    fields = wave.buffers
    values = [NO_VALUES if b < 0 or fields[b] is None else fields[b] for b in buffers]
    if kept is not None:
        i, own = kept
        if wave.kept[own] is not None:  # (1, channels, batch): its one slot is 0
            values[i], at = wave.kept[own], kept_at
    children = NO_ROWS
    if step == REDUCE and node.children:
        # In process a child's payload is its own `wave.grad`, read-only here and never
        # written again by the child: REDUCE is its wave's last task.
        children = np.stack([wave.reduce[child] for child in node.children])
    grad, winners = wave.grad, wave.winners
    execute.run_task(step, layer, tuple(values), IDENTITY, node.plan.program.lists, at,
                     wave.params_vector, node.plan.program.layout,
                     NO_GRADS if grad is None else grad[None], children,
                     NO_WINNERS if winners is None else winners[None], 0,
                     float(node.number), NO_COLUMNS if wave.columns is None else wave.columns,
                     wave.failed_out, wave.by_input_cell)
    if step == CONV:
        own = wave.kept[layer]
        if own is not None:  # its field's memory goes to gradients in the backward pass
            lists = node.plan.program.lists
            own[0] = values[2][lists[at[2, 0]]]
    elif step == REDUCE:
        _send_reduce(node, wave, out)
    node._arrived(wave, made)


def _send_reduce(node: NodeForSteps, wave: Wave, out: list[Message]) -> None:
    """Own partial gradients plus the children's (added by the executor), as one message
    up the tree (the REDUCE row of `MeshSpec.relays`), compressed where the mesh
    compresses it (the rest kept for next time)."""
    total = wave.grad
    if node.reduce_channel is not None:
        total = node.reduce_channel.send(total)
        node.flops += node.spec.reduce_operations // 2  # the encoding
    out.append(node._message(wave, Kind.REDUCE, node.plan.reduce_to, total))


def _reduce_in_whole_numbers(node: NodeForSteps, wave: Wave, out: list[Message]) -> None:
    """Under intsum: own share in whole numbers of the mesh's scales plus the children's,
    exactly (meshdl/compress/intsum.py), as one REDUCE up the tree."""
    share = node.sum_channel.quantize(wave.grad, wave.params_vector[node.layout.scales])
    for child in node.children:
        add_shares(share, wave.reduce[child])
    node.flops += node.spec.reduce_operations // 2  # the quantizing and encoding
    out.append(node._message(wave, Kind.REDUCE, node.plan.reduce_to,
                             node.spec.reduce_sum.encode(share)))
