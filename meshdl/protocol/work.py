"""How much arithmetic each computation of a wave does: floating-point operations.

Simulated time turns work into CPU time on a device profile (sim/radio/device.py), so the
figures here are what a node or the edge computes, counted the usual way: a multiply-add
is 2 operations, a comparison, an addition or a ReLU 1. They are exact counts of the
kernels in nodes/compute.py and meshdl/model/cnn.py at the sizes the plan gives, not
estimates; memory traffic and interpreter overhead are what a device profile's
per-message cost stands for.

`Step` names a node's computations; `Work(per_sample, per_wave)` counts one: most scale
with the batch; adding the children's partial gradients (REDUCE) does not.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from meshdl.config import ModelConfig
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topology import Cell


class Step(StrEnum):
    """A node's computations, in a wave's order (nodes/execute.py runs them). Each equals
    its string, the name `meshdl plan` prints."""

    CONV = "conv"  # a conv layer's output at this cell, then ReLU
    POOL = "pool"  # a leader: its block's maximum, and which member held it
    ROUTE = "route"  # a leader: the pooled gradient back to each block member's maximum
    # Global pooling: every node, over its own values and its tree children's.
    AGGREGATE = "aggregate"  # its subtree's maximum, and which source held it
    WINNERS = "winners"  # the first cell holding each maximum (ties, as PyTorch)
    SPLIT = "split"  # the pooled gradient to the source that won: itself or a child
    DZ_TOP = "dz_top"  # the routed gradient through the last conv layer's ReLU
    WEIGHT_GRAD = "grad"  # this cell's share of a conv layer's weight and bias gradient
    INPUT_GRAD = "dinput"  # d(loss)/d(this cell's input to a conv layer above the first)
    REDUCE = "reduce"  # own partial gradients plus the children's, to the tree parent


class Work(NamedTuple):
    """Operations of one computation: per sample of the batch, and once per wave."""

    per_sample: int
    per_wave: int = 0

    def at(self, batch: int) -> int:
        return self.per_sample * batch + self.per_wave


def node_work(spec: MeshSpec, cell: Cell, step: Step, layer: int) -> Work:
    """Operations of one of `cell`'s computations (`step`, at conv layer `layer`)."""
    topo, h = spec.topology, spec.model.filters
    before, after = spec.offsets
    # A position bias: one more add per filter and map at the top layer forward (its
    # column), and backward its gradient added into the table (zeroed once a wave).
    table = spec.model.position_bias and layer == spec.model.conv_layers
    if step == Step.CONV:  # window x c_in x h multiply-adds, then bias and ReLU
        taps = len(topo.window(cell, before, after))
        return Work(2 * taps * spec.channels(layer - 1) * h + (3 if table else 2) * h)
    if step in (Step.POOL, Step.ROUTE):  # one comparison (or one copy) per member value
        return Work(len(topo.block_cells(topo.block_of(cell))) * h)
    if step in (Step.AGGREGATE, Step.WINNERS, Step.SPLIT):  # one per source value
        return Work((1 + len(topo.children[cell])) * h)
    if step == Step.DZ_TOP:  # ReLU's mask on the routed gradient
        return Work(2 * h, h * topo.rows * topo.cols) if table else Work(h)
    if step == Step.WEIGHT_GRAD:  # d(weights): dz x window multiply-adds; d(bias): dz summed
        taps = len(topo.window(cell, before, after))
        return Work(2 * taps * spec.channels(layer - 1) * h + h)
    if step == Step.INPUT_GRAD:  # transposed convolution of the dz window, then ReLU's mask
        taps = len(topo.window(cell, after, before))
        c_in = spec.channels(layer - 1)
        return Work(2 * taps * h * c_in + c_in)
    if step == Step.REDUCE:  # each child's partial gradients added to this node's
        return Work(0, len(topo.children[cell]) * spec.reduce_size)
    raise ValueError(f"unknown computation {step!r}")


def head_work(model: ModelConfig, training: bool) -> Work:
    """The edge's head per sample: fc1 -> ReLU -> fc2; in training also the softmax
    cross-entropy and the backward pass (twice the forward's multiply-adds: the input's
    gradient and the weights')."""
    f, hidden, classes = model.features, model.hidden, model.classes
    forward = 2 * (f * hidden + hidden * classes) + hidden + classes + hidden
    if not training:
        return Work(forward)
    loss = 4 * classes
    backward = 2 * forward + hidden
    return Work(forward + loss + backward)


def optimizer_work(parameters: int) -> Work:
    """One Adam update (the costliest of the optimizers): about 12 operations a
    parameter (two moments, bias corrections, the square root and the step)."""
    return Work(0, 12 * parameters)


def central_work(model: ModelConfig, training: bool) -> Work:
    """The whole network on one machine, per sample (the cloud-heavy baseline): every
    cell's convolutions over full windows (the zeros of "same" padding included, as a
    dense kernel computes them), pooling and the head; in training also what the mesh's
    nodes compute backward: routing the pooled gradient, ReLU masks, each layer's
    weight gradients, and the input gradient of every layer but the first."""
    cells, h, k2 = model.rows * model.cols, model.filters, model.kernel**2
    c_in = [model.in_channels if layer == 1 else h for layer in range(1, model.conv_layers + 1)]
    forward = sum(cells * (2 * k2 * c * h + 2 * h) for c in c_in) + cells * h  # + pooling
    table = cells * h if model.position_bias else 0  # a position bias added, its gradient
    forward += table
    head = head_work(model, training).per_sample
    if not training:
        return Work(forward + head)
    weights = sum(cells * (2 * k2 * c * h + h) for c in c_in)
    inputs = sum(cells * (2 * k2 * h * c + c) for c in c_in[1:])
    routing = 2 * cells * h  # the max's position, then ReLU's mask of the top layer
    return Work(forward + weights + inputs + routing + table + head)
