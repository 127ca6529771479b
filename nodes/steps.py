"""A node's computations (`Step`, meshdl/protocol/work.py), one function each, and `STEPS`,
the one table from a step to the function that runs it.

Each takes the node whose wave it computes for, the wave, the conv layer of its task and
the list of messages to send: it reads the wave's field buffers at the slots the node's
plan gave (`NodeMachine._adopt`), writes its result into them (a Numba kernel,
nodes/compute.py) and tells the node what it made (`NodeMachine._arrived`), which readies
the tasks waiting for it. `NodeMachine._adopt` looks each task's step up here once per
plan; a wave calls the function straight from its task (`Job.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from meshdl.compress.intsum import add_shares
from meshdl.nodes import compute
from meshdl.protocol.messages import Kind, Message
from meshdl.protocol.work import Step

if TYPE_CHECKING:
    from meshdl.nodes.agent import NodeMachine
    from meshdl.nodes.plan import Wave

Run = Callable[["NodeMachine", "Wave", int, list[Message]], None]


def conv_forward(node: NodeMachine, wave: Wave, layer: int, out: list[Message]) -> None:
    """This cell's output of conv `layer` (then ReLU) from its input window."""
    if node.orphan_rows:
        node.effort.fill_orphans(wave, ("a", layer - 1))
    z = wave.buffers[node.a[layer]][node.own_a[layer]]
    inputs = wave.buffers[node.a[layer - 1]]
    compute.conv_relu(inputs, node.conv_slots[layer], node.conv_taps,
                      wave.weights[layer], wave.biases[layer], z)
    if wave.failed_out:  # failout: a dead cell has no output (the zeros filled in)
        z[...] = 0.0
    kept = wave.kept[layer]
    if kept is not None:  # its field's memory goes to gradients in the backward pass
        kept[...] = z
    node._arrived(wave, node.made_a[layer])


def own_input(node: NodeMachine, wave: Wave, layer: int) -> np.ndarray:
    """This cell's activation a_layer, (channels, batch): kept apart, or in its field."""
    kept = wave.kept[layer]
    return kept if kept is not None else wave.buffers[node.a[layer]][node.own_a[layer]]


def pool(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """The block's maximum and, for the backward pass, which member held it (the first
    in row-major order, as PyTorch)."""
    pooled = wave.buffers[node.pooled][node.pooled_slot]
    wave.winners = np.empty(pooled.shape, np.uint8)  # a block has <= 64 cells
    compute.max_pool(wave.buffers[node.a[layers]], node.block_slots, pooled, wave.winners)
    node._arrived(wave, node.made_pooled)


def route(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """Max-pool backward at the leader: each member gets the gradient where it won."""
    grad = wave.buffers[node.dpooled][node.dpooled_slot]
    compute.route_max(grad, wave.winners, node.route_slots, wave.buffers[node.route])
    for made in node.made_route:
        node._arrived(wave, made)


def aggregate(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """Global pooling: the maximum of this cell's last activation and its children's
    subtree maxima, and which of them held it (ties settled by `winners`)."""
    pooled = wave.buffers[node.pooled]
    maxima = pooled[node.pooled_slot]
    wave.winners = np.empty(maxima.shape, np.uint8)  # 0 itself, t + 1 child t (<= 4)
    compute.aggregate_max(own_input(node, wave, layers), pooled, node.child_pooled, maxima,
                          wave.winners)
    node._arrived(wave, node.made_pooled)


def winners(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """Global pooling, training: the first cell of the subtree holding each maximum,
    from the children's; the source that holds it wins the gradient."""
    pooled, numbers = wave.buffers[node.pooled], wave.buffers[node.winner]
    compute.first_winners(float(node.number), own_input(node, wave, layers),
                          pooled[node.pooled_slot], pooled, node.child_pooled, numbers,
                          node.child_winner, numbers[node.winner_slot], wave.winners)
    node._arrived(wave, node.made_winner)


def split(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """Global pooling backward: each maximum's gradient to the source that won it, this
    cell (its routed gradient) or a tree child (its SCATTER)."""
    dpooled = wave.buffers[node.dpooled]
    compute.split_max(dpooled[node.dpooled_slot], wave.winners,
                      wave.buffers[node.route][node.own_route], dpooled, node.child_dpooled)
    for made in node.made_route:
        node._arrived(wave, made)


def dz_top(node: NodeMachine, wave: Wave, layers: int, out: list[Message]) -> None:
    """d(loss)/d(last conv's pre-activation): the routed gradient where ReLU passed."""
    if node.orphan_rows:
        node.effort.fill_orphans(wave, ("route",))
    compute.relu_backward(own_input(node, wave, layers),
                          wave.buffers[node.route][node.own_route],
                          wave.buffers[node.dz[layers]][node.own_dz[layers]])
    node._arrived(wave, node.made_dz[layers])


def weight_grad(node: NodeMachine, wave: Wave, layer: int, out: list[Message]) -> None:
    """This cell's share of d(loss)/d(conv weights, bias): its output gradient times its
    input window or, above the first layer under the memory plan, its input times the
    output gradients around it (nodes/memory.py)."""
    where = node.layout.layers[layer]
    dweight = wave.grad[where.weight].reshape(where.kernel_shape)
    if wave.by_input_cell and layer > 1:
        if node.orphan_rows:
            node.effort.fill_orphans(wave, ("dz", layer))
        compute.weight_grad_of_input(wave.buffers[node.dz[layer]], node.grad_slots[layer],
                                     node.grad_taps, node.own_dz[layer],
                                     own_input(node, wave, layer - 1), dweight,
                                     wave.grad[where.bias])
    else:
        dz = wave.buffers[node.dz[layer]][node.own_dz[layer]]  # (h, B)
        compute.weight_grad(dz, wave.buffers[node.a[layer - 1]], node.conv_slots[layer],
                            node.conv_taps, dweight, wave.grad[where.bias])
    node._arrived(wave, node.made_grad[layer])  # the reduce and dinput wait for it


def input_grad(node: NodeMachine, wave: Wave, layer: int, out: list[Message]) -> None:
    """d(loss)/d(this cell's input to `layer`): transposed convolution of the dz halo."""
    below = layer - 1
    if node.orphan_rows:
        node.effort.fill_orphans(wave, ("dz", layer))
    # Under the memory plan the first layer's output gradient is written over the
    # activation it masks (`compute.input_grad` allows it).
    compute.input_grad(wave.buffers[node.dz[layer]], node.grad_slots[layer],
                       node.grad_taps, wave.weights[layer], own_input(node, wave, below),
                       wave.buffers[node.dz[below]][node.own_dz[below]])
    node._arrived(wave, node.made_dz[below])


def reduce(node: NodeMachine, wave: Wave, _: int, out: list[Message]) -> None:
    """Own partial gradients plus the children's, as one message up the tree (the
    REDUCE row of `MeshSpec.relays`)."""
    total = wave.grad  # the own layers' shares, written in place by `weight_grad`
    if node.sum_channel is not None:
        share = node.sum_channel.quantize(total, wave.params_vector[node.layout.scales])
        for child in node.children:
            add_shares(share, wave.reduce[child])
        node.flops += node.spec.reduce_operations // 2  # the quantizing and encoding
        out.append(node._message(wave, Kind.REDUCE, node.plan.reduce_to,
                                 node.spec.reduce_sum.encode(share)))
        return
    # In process a child's payload is its own `wave.grad`, read-only here and never
    # written again by the child: REDUCE is its wave's last task.
    for child in node.children:
        total += wave.reduce[child]
    if node.reduce_channel is not None:  # compressed, the rest kept for next time
        total = node.reduce_channel.send(total)
        node.flops += node.spec.reduce_operations // 2  # the encoding
    out.append(node._message(wave, Kind.REDUCE, node.plan.reduce_to, total))


STEPS: dict[Step, Run] = {
    Step.CONV: conv_forward,
    Step.POOL: pool,
    Step.ROUTE: route,
    Step.AGGREGATE: aggregate,
    Step.WINNERS: winners,
    Step.SPLIT: split,
    Step.DZ_TOP: dz_top,
    Step.WEIGHT_GRAD: weight_grad,
    Step.INPUT_GRAD: input_grad,
    Step.REDUCE: reduce,
}
