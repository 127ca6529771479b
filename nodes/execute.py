"""The one executor of a node's program: `run_task` holds the arithmetic of every
computation a node runs (`Step`, meshdl/protocol/work.py), and `start_input` that of a
wave's first values; both the node machine (nodes/agent.py, through nodes/steps.py) and
the compiled loop (`run_rounds`, nodes/compiled.py) call them, so each step's arithmetic
exists here once.

Where each step's arithmetic lives: here, in `run_task`, by its step code (each branch
calling the Numba kernels of nodes/compute.py):
  CONV         conv l's output at this cell, then ReLU, zeros where failout leaves the
               cell out (`compute.conv_relu`; with a position bias, each map's column
               of the table added to the bias, `compute.conv_relu_placed`)
  POOL         a leader's block maximum and which member held it (`compute.max_pool`)
  ROUTE        max-pool backward to each member (`compute.route_max`)
  AGGREGATE    global pooling: its subtree's maxima (`compute.aggregate_max`)
  WINNERS      global pooling: the first cell holding each maximum (`compute.first_winners`)
  SPLIT        global pooling backward to the source that won (`compute.split_max`)
  DZ_TOP       the routed gradient through the last ReLU (`compute.relu_backward`); with
               a position bias, this cell's share of the table's gradient, the last
               (filters x cells) values of its gradient vector (`compute.position_grad`)
  WEIGHT_GRAD  this cell's share of conv l's weight and bias gradients, by output cell
               (`compute.weight_grad`) or by input cell (`compute.weight_grad_of_input`)
  INPUT_GRAD   d(loss)/d(input of conv l), the transposed convolution (`compute.input_grad`)
  REDUCE       the children's gradient vectors added to this node's, in order, as
               numpy's += (element by element, float32)
and a wave's input, the normalized readings (zeros failed out), in `start_input`. What
differs between the two callers is delivery only: the machine resolves operands to its
field buffers and sends messages, fills in orphans, compresses a REDUCE and counts
flops (nodes/steps.py); the loop resolves them to its arenas and delivers in rounds.

A task's operands (`Program.args`, nodes/plan.py) are up to `OPERANDS`: operand i is the
rows lists[at[i, 0]:at[i, 1]] of the array values[which[i]], (slots, channels, batch)
float32 (the machine passes an array per operand; the loop its two arenas, `which`
picking one); a list of kernel taps or of tree children is an operand whose array is
never read. Per step, the operands in order (`OPERAND_KINDS` says what each is, for
`validate`):
  CONV l       a_{l-1} window, its taps, own a_l (out)
  POOL         a_top block members, own pooled (out)
  ROUTE        own dpooled, route of the members (out)
  AGGREGATE    own a_top, children's pooled, own pooled (out)
  WINNERS      own a_top, own pooled, children's pooled, children's winner, own winner (out)
  SPLIT        own dpooled, own route (out), children's dpooled (out)
  DZ_TOP       own a_top, own route, own dz_top (out)
  WEIGHT_GRAD l  own dz_l, a_{l-1} window, its taps, dz_l transposed window, its taps,
                 own a_{l-1}
  INPUT_GRAD l   dz_l transposed window, its taps, own a_{l-1}, own dz_{l-1} (out)
  REDUCE       the children (rows of `rows`)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from meshdl.errors import MeshdlError
from meshdl.model.quantize import ACTIVATION_LEVELS, INPUT_LEVELS, quantize_cell
from meshdl.nodes import compute
from meshdl.protocol.work import Step

# A task's step as a number; SEND is a task that sends (a `Send` of the plan).
SEND = 0
STEP_CODES = {step: code for code, step in enumerate(Step, start=1)}
CONV, POOL, ROUTE, AGGREGATE, WINNERS, SPLIT, DZ_TOP, WEIGHT_GRAD, INPUT_GRAD, REDUCE = (
    STEP_CODES[s] for s in (Step.CONV, Step.POOL, Step.ROUTE, Step.AGGREGATE, Step.WINNERS,
                            Step.SPLIT, Step.DZ_TOP, Step.WEIGHT_GRAD, Step.INPUT_GRAD,
                            Step.REDUCE))
OPERANDS = 6  # operands a task has at most (WEIGHT_GRAD's)

# What each operand of a step is (`validate` holds a program's operands to it): ("a", d)
# slots of the activations of layer l + d (their channels: the input's for layer 0, the
# filters' above), ("f",) slots of a field of the filters' channels, ("taps",) kernel
# taps, ("children",) tree children; "one" where the step reads exactly one slot.
A, F, TAPS, CHILDREN = "a", "f", "taps", "children"
OPERAND_KINDS: dict[int, tuple[tuple, ...]] = {
    CONV: (((A, -1), False), ((TAPS,), False), ((A, 0), True)),
    POOL: (((A, "top"), False), ((F,), True)),
    ROUTE: (((F,), True), ((F,), False)),
    AGGREGATE: (((A, "top"), True), ((F,), False), ((F,), True)),
    WINNERS: (((A, "top"), True), ((F,), True), ((F,), False), ((F,), False), ((F,), True)),
    SPLIT: (((F,), True), ((F,), True), ((F,), False)),
    DZ_TOP: (((A, "top"), True), ((F,), True), ((F,), True)),
    WEIGHT_GRAD: (((F,), True), ((A, -1), False), ((TAPS,), False), ((F,), False),
                  ((TAPS,), False), ((A, -1), True)),
    INPUT_GRAD: (((F,), False), ((TAPS,), False), ((A, -1), True), ((A, -1), True)),
    REDUCE: (((CHILDREN,), False),),
}
# Operand pairs a kernel walks together: the first's positions index the second (a
# window's slots and their taps; global pooling's children's maxima and first cells).
PAIRED: dict[int, tuple[tuple[int, int], ...]] = {
    CONV: ((0, 1),), WEIGHT_GRAD: ((1, 2), (3, 4)), INPUT_GRAD: ((0, 1),),
    WINNERS: ((2, 3),),
}
# Parameter layout rows (`layout[layer]`): where a conv layer's weight and bias sit in the
# PARAMS vector and in a node's gradient vector (`ParamsLayout`), and where its output's
# activation scale does under int8-static (-1: not quantized; row 0: the input's).
# P_OFF, P_CELLS: where the layer's position bias table starts in PARAMS (-1: none) and
# its cells (filter f of cell n at P_OFF + f x P_CELLS + n).
W_OFF, W_FILTERS, W_CHANNELS, W_TAPS, B_OFF, B_LEN, A_SCALE, P_OFF, P_CELLS = range(9)
LAYOUT_COLUMNS = 9


class UnknownStep(MeshdlError):
    """A task of a step code the executor has no arithmetic for (a program or tables
    changed after they were checked)."""


_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}


@njit(**_JIT)
def start_input(readings: np.ndarray, indices: np.ndarray, mean: np.ndarray,
                std: np.ndarray, failed: bool, scale: float, out: np.ndarray) -> None:
    """A wave's input at this cell: its readings of the wave's samples, normalized
    (`compute.normalize`); zeros, the values of a filled-in reading, where failout leaves
    the cell out; under int8-static (`scale` > 0, from PARAMS) their quantized values
    (int16 codes: meshdl/model/quantize.py)."""
    compute.normalize(readings, indices, mean, std, out)
    if failed:
        out[...] = 0.0
    if scale > 0.0:
        quantize_cell(out, np.float32(scale), INPUT_LEVELS)


# Inlined into the compiled loop, which calls it for every task of every node (a call with
# its arrays cost several % of a wave); from Python it is an ordinary compiled function.
@njit(**_JIT, inline="always")
def run_task(step: int, layer: int, values: tuple[np.ndarray, ...], which: np.ndarray,
             lists: np.ndarray, at: np.ndarray, params: np.ndarray, layout: np.ndarray,
             grads: np.ndarray,
             rows: np.ndarray, winners: np.ndarray, node: int, number: float,
             columns: np.ndarray, failed: bool, by_input: bool) -> None:
    """Run one computation of a node's program: step code `step` at conv layer `layer`
    on its operands (operand i: rows lists[at[i, 0]:at[i, 1]] of values[which[i]]: see
    the module's
    docstring), with the PARAMS vector `params` laid out by `layout`, this node's
    gradient vector `grads[node]`, the vectors `rows` a REDUCE adds to it, the wave's
    pooling `winners[node]` (filters, batch), this cell's `number` (row x cols + col),
    the column of the position bias table it reads for each map (`Wave.columns`: its
    number, or under a mirror the mirrored cell's; read only with a table), whether
    failout leaves it out, and whether weight gradients above layer 1 are taken
    by input cell (nodes/memory.py). A step code without arithmetic here raises
    `UnknownStep`."""

    def x(i: int) -> np.ndarray:  # operand i's values (slots, channels, batch)
        return values[which[i]]

    def s(i: int) -> np.ndarray:  # operand i's rows (slots, taps or children)
        return lists[at[i, 0]:at[i, 1]]

    def one(i: int) -> int:  # the one slot of operand i
        return lists[at[i, 0]]

    if step == CONV:
        h, c, kk = layout[layer, W_FILTERS], layout[layer, W_CHANNELS], layout[layer, W_TAPS]
        w, b = layout[layer, W_OFF], layout[layer, B_OFF]
        z = x(2)[one(2)]
        weight = params[w:w + h * c * kk].reshape((h, c, kk))
        bias = params[b:b + layout[layer, B_LEN]]
        p, cells = layout[layer, P_OFF], layout[layer, P_CELLS]
        if p >= 0:  # the position bias: each map's column of the table, added first
            compute.conv_relu_placed(x(0), s(0), s(1), weight, bias,
                                     params[p:p + h * cells].reshape((h, cells)), columns, z)
        else:
            compute.conv_relu(x(0), s(0), s(1), weight, bias, z)
        if failed:  # failout: a dead cell has no output (the zeros filled in)
            z[...] = 0.0
        if layout[layer, A_SCALE] >= 0:  # int8-static: quantized where it is made
            quantize_cell(z, params[layout[layer, A_SCALE]], ACTIVATION_LEVELS)
    elif step == POOL:
        compute.max_pool(x(0), s(0), x(1)[one(1)], winners[node])
    elif step == ROUTE:
        compute.route_max(x(0)[one(0)], winners[node], s(1), x(1))
    elif step == AGGREGATE:
        compute.aggregate_max(x(0)[one(0)], x(1), s(1), x(2)[one(2)], winners[node])
    elif step == WINNERS:
        compute.first_winners(number, x(0)[one(0)], x(1)[one(1)], x(2), s(2), x(3), s(3),
                              x(4)[one(4)], winners[node])
    elif step == SPLIT:
        compute.split_max(x(0)[one(0)], winners[node], x(1)[one(1)], x(2), s(2))
    elif step == DZ_TOP:
        dz = x(2)[one(2)]
        compute.relu_backward(x(0)[one(0)], x(1)[one(1)], dz)
        h, cells = layout[layer, W_FILTERS], layout[layer, P_CELLS]
        if layout[layer, P_OFF] >= 0:  # the table's gradient: last in the gradient vector
            grad = grads[node]
            table = grad[grad.size - h * cells:].reshape((h, cells))
            compute.position_grad(dz, columns, table)
    elif step == WEIGHT_GRAD:
        h, c, kk = layout[layer, W_FILTERS], layout[layer, W_CHANNELS], layout[layer, W_TAPS]
        w, b = layout[layer, W_OFF], layout[layer, B_OFF]
        grad = grads[node]
        dweight = grad[w:w + h * c * kk].reshape((h, c, kk))
        dbias = grad[b:b + layout[layer, B_LEN]]
        if by_input and layer > 1:
            compute.weight_grad_of_input(x(3), s(3), s(4), one(0), x(5)[one(5)], dweight,
                                         dbias)
        else:
            compute.weight_grad(x(0)[one(0)], x(1), s(1), s(2), dweight, dbias)
    elif step == INPUT_GRAD:
        h, c, kk = layout[layer, W_FILTERS], layout[layer, W_CHANNELS], layout[layer, W_TAPS]
        w = layout[layer, W_OFF]
        # Under the memory plan the first layer's output gradient may be written over
        # the activation it masks (`compute.input_grad` allows it).
        compute.input_grad(x(0), s(0), s(1), params[w:w + h * c * kk].reshape((h, c, kk)),
                           x(2)[one(2)], x(3)[one(3)])
    elif step == REDUCE:  # the children's vectors added in order, as numpy's +=
        grad = grads[node]
        for k in range(at[0, 0], at[0, 1]):
            child = rows[lists[k]]
            for v in range(grad.size):
                grad[v] += child[v]
    else:
        raise UnknownStep("a task of the program has an unknown step code")


def layout_rows(layout) -> np.ndarray:
    """A `ParamsLayout` as the executor's (layers + 1, LAYOUT_COLUMNS) rows (layer 0:
    only its A_SCALE, the input's)."""
    layers = max(layout.layers, default=0)
    rows = np.zeros((layers + 1, LAYOUT_COLUMNS), np.int64)
    rows[:, A_SCALE] = rows[:, P_OFF] = -1
    quantized = layout.act_scales.stop > layout.act_scales.start
    for layer, where in layout.layers.items():
        h, c, kk = where.kernel_shape
        rows[layer, :A_SCALE] = (where.weight.start, h, c, kk, where.bias.start,
                                 where.bias.stop - where.bias.start)
    if quantized:
        rows[:, A_SCALE] = np.arange(layout.act_scales.start, layout.act_scales.start +
                                     layers + 1)
    table = layout.position.stop - layout.position.start
    if table:  # the last layer's; a node reads its own column
        rows[layers, P_OFF] = layout.position.start
        rows[layers, P_CELLS] = table // rows[layers, W_FILTERS]
    return rows
