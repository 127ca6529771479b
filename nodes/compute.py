"""A sensor node's arithmetic for its own cell, as Numba kernels.

A node computes one output position of each convolution: a (filters x batch) block from
the values of the cells in its window, each (channels x batch). Numpy would first copy
those into a zero-padded window and then call BLAS on a tiny matrix, a dozen calls of
about a microsecond each per layer; one compiled loop over the cells that exist does the
same arithmetic several times faster. A node keeps the values of a field (say the
activations of layer 1) in one (slots, channels, batch) array; a kernel gets that array,
the *slots* of its window's cells and their *taps* (flat index dy * k + dx into the
kernel). A cell outside the grid is simply absent, which is the zero padding.

No "fast" math that assumes finite values: NaN and inf must propagate (training that
diverges is reported, not hidden), except through a ReLU that was off, whose gradient is
0 whatever arrives, as in the central model.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}


@njit(**_JIT)
def conv_relu(values: np.ndarray, slots: np.ndarray, taps: np.ndarray, weight: np.ndarray,
              bias: np.ndarray, out: np.ndarray) -> None:
    """out[h, j] = relu(bias[h] + sum over window cells t, channels c of
    weight[h, c, taps[t]] * values[slots[t], c, j]); weight is (filters, channels, k * k)."""
    for h in range(weight.shape[0]):
        for j in range(out.shape[1]):
            out[h, j] = bias[h]
    _convolve_relu(values, slots, taps, weight, out)


@njit(**_JIT)
def conv_relu_placed(values: np.ndarray, slots: np.ndarray, taps: np.ndarray,
                     weight: np.ndarray, bias: np.ndarray, table: np.ndarray,
                     columns: np.ndarray, out: np.ndarray) -> None:
    """`conv_relu` with a position bias: map j's bias is bias[h] + table[h, columns[j]],
    the column of the (filters, cells) table this cell reads for that map (its own, or
    under a mirror the mirrored cell's: `Wave.columns`). Columns are checked by the
    caller (`NodeMachine.mirrored_columns`)."""
    for h in range(weight.shape[0]):
        for j in range(out.shape[1]):
            out[h, j] = bias[h] + table[h, columns[j]]
    _convolve_relu(values, slots, taps, weight, out)


@njit(**_JIT, inline="always")
def _convolve_relu(values: np.ndarray, slots: np.ndarray, taps: np.ndarray,
                   weight: np.ndarray, out: np.ndarray) -> None:
    """out[h, j] += sum over window cells t, channels c of weight[h, c, taps[t]] *
    values[slots[t], c, j]; then the ReLU. `out` holds the biases."""
    filters, channels, _ = weight.shape
    batch = out.shape[1]
    for t in range(len(slots)):
        v = values[slots[t]]
        tap = taps[t]
        for h in range(filters):
            for c in range(channels):
                w = weight[h, c, tap]
                for j in range(batch):
                    out[h, j] += w * v[c, j]
    for h in range(filters):
        for j in range(batch):
            if out[h, j] < 0.0:
                out[h, j] = 0.0


@njit(**_JIT)
def position_grad(dz: np.ndarray, columns: np.ndarray, table: np.ndarray) -> None:
    """The position bias's gradient from this cell (its share of the REDUCE's table):
    table[h, columns[j]] = sum over the maps j reading that column of dz[h, j], the
    others 0. `table` is (filters, cells); columns as in `conv_relu_placed`."""
    table[...] = 0.0
    for h in range(dz.shape[0]):
        for j in range(dz.shape[1]):
            table[h, columns[j]] += dz[h, j]


# Reassociating the batch sums lets them vectorize; NaN and inf still propagate.
@njit(**_JIT, fastmath={"reassoc", "contract"})
def weight_grad(dz: np.ndarray, values: np.ndarray, slots: np.ndarray, taps: np.ndarray,
                dweight: np.ndarray, dbias: np.ndarray) -> None:
    """This cell's share of the filter gradients: dweight[h, c, taps[t]] = sum over the
    batch of dz[h, j] * values[slots[t], c, j] (zero at taps outside the grid); dbias[h] =
    sum over the batch of dz[h, j]. dweight is (filters, channels, k * k)."""
    filters, channels, _ = dweight.shape
    batch = dz.shape[1]
    dweight[...] = 0.0
    for t in range(len(slots)):
        v = values[slots[t]]
        tap = taps[t]
        for h in range(filters):
            for c in range(channels):
                acc = np.float32(0.0)
                for j in range(batch):
                    acc += dz[h, j] * v[c, j]
                dweight[h, c, tap] = acc
    bias_grad(dz, dbias)


@njit(**_JIT, fastmath={"reassoc", "contract"})
def bias_grad(dz: np.ndarray, dbias: np.ndarray) -> None:
    """dbias[h] = sum over the batch of dz[h, j]: a cell's share of the bias gradient."""
    for h in range(dz.shape[0]):
        acc = np.float32(0.0)
        for j in range(dz.shape[1]):
            acc += dz[h, j]
        dbias[h] = acc


@njit(**_JIT, fastmath={"reassoc", "contract"})
def weight_grad_of_input(dz_values: np.ndarray, slots: np.ndarray, taps: np.ndarray,
                         own: int, activation: np.ndarray, dweight: np.ndarray,
                         dbias: np.ndarray) -> None:
    """This cell's input's share of the filter gradients: the terms of `weight_grad`'s
    sum over the mesh in which this cell is the input rather than the output.
    dweight[h, c, k*k - 1 - taps[t]] = sum over the batch of dz_values[slots[t], h, j] *
    activation[c, j] for the cells t whose outputs this cell's activation fed (zero at
    taps outside the grid); dbias[h] = sum over the batch of dz_values[own, h, j]."""
    filters, channels, taps_total = dweight.shape
    batch = activation.shape[1]
    dweight[...] = 0.0
    for t in range(len(slots)):
        d = dz_values[slots[t]]
        tap = taps_total - 1 - taps[t]
        for h in range(filters):
            for c in range(channels):
                acc = np.float32(0.0)
                for j in range(batch):
                    acc += d[h, j] * activation[c, j]
                dweight[h, c, tap] = acc
    bias_grad(dz_values[own], dbias)


@njit(**_JIT)
def input_grad(dz_values: np.ndarray, slots: np.ndarray, taps: np.ndarray,
               weight: np.ndarray, activation: np.ndarray, out: np.ndarray) -> None:
    """d(loss)/d(this cell's pre-activation input) of a layer: the transposed
    convolution of the output gradients around it, through the ReLU that made its
    input. out[c, j] = [activation[c, j] > 0] * sum over cells t, filters h of
    weight[h, c, k*k - 1 - taps[t]] * dz_values[slots[t], h, j] (the kernel turned by
    180 degrees). `out` may be `activation` itself: a channel is summed apart and
    written once its mask is read."""
    filters, channels, taps_total = weight.shape
    batch = out.shape[1]
    total = np.empty(batch, np.float32)
    for c in range(channels):
        total[:] = 0.0
        for t in range(len(slots)):
            d = dz_values[slots[t]]
            tap = taps_total - 1 - taps[t]
            for h in range(filters):
                w = weight[h, c, tap]
                for j in range(batch):
                    total[j] += w * d[h, j]
        for j in range(batch):
            out[c, j] = total[j] if activation[c, j] > 0.0 else 0.0


@njit(**_JIT)
def normalize(readings: np.ndarray, indices: np.ndarray, mean: np.ndarray, std: np.ndarray,
              out: np.ndarray) -> None:
    """out[c, j] = (readings[c, indices[j]] - mean[c]) / std[c]: a wave's input."""
    for c in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[c, j] = (readings[c, indices[j]] - mean[c]) / std[c]


@njit(**_JIT)
def max_pool(values: np.ndarray, slots: np.ndarray, out: np.ndarray,
             winners: np.ndarray) -> None:
    """A block leader's pooling: out[h, j] = the maximum over the block's cells
    values[slots[t], h, j], winners[h, j] = the first t holding it, as numpy's max and
    argmax (a NaN wins over any number, the first NaN over later ones)."""
    for h in range(out.shape[0]):
        for j in range(out.shape[1]):
            best = values[slots[0], h, j]
            win = 0
            for t in range(1, len(slots)):
                x = values[slots[t], h, j]
                if not np.isnan(best) and (x > best or np.isnan(x)):
                    best = x
                    win = t
            out[h, j] = best
            winners[h, j] = win


@njit(**_JIT)
def route_max(grad: np.ndarray, winners: np.ndarray, slots: np.ndarray,
              out: np.ndarray) -> None:
    """Max-pool backward: block cell t gets grad[h, j] where it won, else 0."""
    for t in range(len(slots)):
        for h in range(grad.shape[0]):
            for j in range(grad.shape[1]):
                out[slots[t], h, j] = grad[h, j] if winners[h, j] == t else 0.0


@njit(**_JIT)
def aggregate_max(own: np.ndarray, values: np.ndarray, slots: np.ndarray, out: np.ndarray,
                  source: np.ndarray) -> None:
    """Global pooling at a node: out[h, j] = the maximum of its own value own[h, j] and
    its children's subtree maxima values[slots[t], h, j]; source[h, j] = 0 where its
    own holds it, t + 1 where child t does (the first in that order: `first_winners`
    settles ties)."""
    for h in range(out.shape[0]):
        for j in range(out.shape[1]):
            best = own[h, j]
            src = 0
            for t in range(len(slots)):
                x = values[slots[t], h, j]
                if x > best:
                    best = x
                    src = t + 1
            out[h, j] = best
            source[h, j] = src


@njit(**_JIT)
def first_winners(number: float, own: np.ndarray, maxima: np.ndarray, values: np.ndarray,
                  slots: np.ndarray, numbers: np.ndarray, number_slots: np.ndarray,
                  out: np.ndarray, source: np.ndarray) -> None:
    """Which cell of the subtree holds each maximum first in row-major order (PyTorch's
    tie rule): among the sources equal to the maximum, its own cell (`number`, row x
    cols + col) or child t's first cell numbers[number_slots[t]], the lowest. out gets
    it; source[h, j] its source, as `aggregate_max` numbers them."""
    for h in range(out.shape[0]):
        for j in range(out.shape[1]):
            best = maxima[h, j]
            first = np.inf
            src = 0
            if own[h, j] == best:
                first = number
            for t in range(len(slots)):
                if values[slots[t], h, j] == best and numbers[number_slots[t], h, j] < first:
                    first = numbers[number_slots[t], h, j]
                    src = t + 1
            out[h, j] = first
            source[h, j] = src


@njit(**_JIT)
def split_max(grad: np.ndarray, source: np.ndarray, own: np.ndarray, out: np.ndarray,
              slots: np.ndarray) -> None:
    """Global pooling backward at a node: the gradient of each maximum to the source
    that won it, this cell (own) or child t (out[slots[t]]); 0 to the others."""
    for h in range(grad.shape[0]):
        for j in range(grad.shape[1]):
            g = grad[h, j]
            src = source[h, j]
            own[h, j] = g if src == 0 else 0.0
            for t in range(len(slots)):
                out[slots[t], h, j] = g if src == t + 1 else 0.0


@njit(**_JIT)
def relu_backward(activation: np.ndarray, grad: np.ndarray, out: np.ndarray) -> None:
    """out = grad where the ReLU passed (activation > 0), else 0, even for a NaN grad
    (as the central model's ReLU backward does)."""
    for h in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[h, j] = grad[h, j] if activation[h, j] > 0.0 else 0.0


@njit(**_JIT)
def all_positive(values: np.ndarray) -> bool:
    """Whether every value is > 0 (NaN is not): a PARAMS message's standard deviations."""
    ok = True
    for i in range(values.size):
        ok &= values[i] > 0.0
    return ok


@njit(**_JIT)
def indices_within(indices: np.ndarray, size: int) -> bool:
    """Whether every index lies in [0, size): a BATCH message's sample numbers."""
    ok = True
    for i in range(indices.size):
        ok &= (indices[i] >= 0) & (indices[i] < size)
    return ok


def warm_up() -> None:
    """Compile (or load from Numba's cache) the kernels now, with the argument types a
    wave uses (what arrives in messages is read-only; the types do not depend on any
    size), so that a node's first wave is not slowed by compilation: a live slot's wave
    has a deadline."""

    def frozen(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        array = np.zeros(shape, dtype)
        array.setflags(write=False)
        return array

    slots, taps = np.zeros(1, np.intp), np.zeros(1, np.int64)
    values, out = np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.float32)
    weight, bias = frozen((1, 1, 1)), frozen((1,))
    normalize(np.zeros((1, 1), np.float32), frozen((1,), np.int32), bias, bias, out)
    conv_relu(values, slots, taps, weight, bias, out)
    columns = np.zeros(1, np.int64)
    conv_relu_placed(values, slots, taps, weight, bias, frozen((1, 1)), columns, out)
    position_grad(out, columns, np.zeros((1, 1), np.float32))
    winners = np.zeros((1, 1), np.uint8)  # as a wave keeps them (nodes/steps.py)
    max_pool(values, slots, out, winners)
    route_max(out, winners, slots, values)
    aggregate_max(out, values, slots, out, winners)
    first_winners(0.0, out, out, values, slots, values, slots, out, winners)
    split_max(out, winners, out, values, slots)
    relu_backward(out, out, out)
    weight_grad(out, values, slots, taps, np.zeros((1, 1, 1), np.float32),
                np.zeros(1, np.float32))
    weight_grad_of_input(values, slots, taps, 0, out, np.zeros((1, 1, 1), np.float32),
                         np.zeros(1, np.float32))
    input_grad(values, slots, taps, weight, out, out)
    all_positive(bias)
    indices_within(frozen((1,), np.int32), 1)
