"""Numba kernels of the seed CNN: convolution, ReLU, max-pooling, softmax cross-entropy.

Layout: activations are *batch-last*, (channels, rows, cols, batch). This is the layout of
the mesh itself (each node holds its B readings side by side), and it makes every inner
loop a contiguous run over the batch that LLVM vectorizes. The public model converts
from and to PyTorch's (batch, channels, rows, cols) once per call.

Conventions (fixed, as PyTorch): cross-correlation; "same" zero padding, the extra row and
column of an even kernel going to the bottom/right; max-pooling in ceil mode, the first
maximum in row-major window order winning ties; relu'(0) = 0.
The fully-connected layers are plain matrix products and use BLAS through numpy.

Convolutions work on *planes* (see `PlaneGeometry`): each channel's zero-padded grid,
flattened to one vector of (row, col, batch). In a plane every kernel tap is a fixed
offset: output cell n reads the input at n + dy*row_stride + dx*batch, so a grid row of
one output channel is one long contiguous run, computed without border tests. A layer
writes its output straight into the padded plane the next layer reads, the pads stay
zero, and the planes are allocated once per batch size (`ConvPlanes`), not per step.
The input gradient of a convolution is the same correlation with the kernel turned by
180 degrees and its channel axes swapped, on gradient planes padded the other way.

Speed notes (single thread; measured on the AVX-512 machine this was tuned on):
- Inner loops compute 2 or 3 output channels from one 3x3 group of taps: 9 input loads
  feed 18 or 27 FMAs. This runs at about the FMA throughput of 256-bit vectors. Four
  written outputs per loop make LLVM give up vectorizing (too many runtime alias
  checks); 512-bit vectors (NUMBA_CPU_FEATURES=-prefer-256-bit) measured no faster.
  Kernels wider than 3 use several tap groups, padded with zero weights.
- The first pass of a loop writes bias + sum and the last applies the ReLU, so that no
  pass only initializes or clamps. Weight gradients keep 18 sums in registers.
- Planes are indexed with unsigned offsets, never sliced inside loops (see
  `_tap_offsets`): a slice costs two atomic reference-count operations, and short
  loops then spend more time on those than on arithmetic.
- Whole grid rows make the best blocks: shorter blocks (for L1) measured slower.
- ReLU outputs are >= 0, so pooling windows past the grid may read zero pads.

Threads: the two heaviest kernels have parallel twins (`correlate_planes_parallel`,
`conv_weight_grad_parallel`) that share a call's blocks among numba's threads and give
the same bits: what crosses blocks (bias and weight gradients) is summed per block and
the block sums added in block order, as the serial kernel adds them. `ConvPlanes` runs
a twin only inside `using_threads` and when the call is big enough to pay for it;
`meshdl.model.threads` picks the thread count, by timing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numba
import numpy as np
from numba import njit, prange

from meshdl.model.quantize import levels, quantize_planes

_JIT = {"cache": True, "fastmath": True, "nogil": True, "boundscheck": False,
        "error_model": "numpy"}
_PARALLEL = {**_JIT, "parallel": True}  # the twins of the two heaviest kernels
# fastmath without reassociation: sums in the order written (see `_gate_and_sum`)
_ORDERED = {**_JIT, "fastmath": {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}}

# Fewest multiply-adds for which a conv kernel call runs its parallel twin (see
# `ConvPlanes._parallel`). Measured call by call on the 2-core machine of issue 34, twin
# on 2 threads against the serial kernel: the twin lost below about 0.7 M (24 -> 27 us
# at 0.65 M), won from about 1.2 M (36 -> 29 us at 1.3 M; 266 -> 172 us at 9.6 M, the
# seed's second layer at batch 100); the fork and join cost some 5-10 us.
PARALLEL_MIN_FMAS = 1_000_000

LANES = 64  # running sums of `_gate_and_sum`: 4 512-bit or 8 256-bit vectors
GROUP = 3  # kernel taps are handled in GROUP x GROUP blocks (zero weights pad the rest)
BLOCK = 4096  # floats per block: longer rows are cut, shorter ones grouped (see blocks)


_local = threading.local()  # per Python thread, as numba's own thread count


def kernel_threads() -> int:
    """Threads the conv kernels called from this Python thread may use: 1 unless a
    `using_threads` block says more (meshes, nodes and edges run serial kernels)."""
    return getattr(_local, "threads", 1)


@contextlib.contextmanager
def using_threads(count: int) -> Iterator[int]:
    """Let this Python thread's conv kernels use up to `count` threads in the block
    (at most numba's NUMBA_NUM_THREADS, the cores by default); yields the count in force.

    Only the choice between a kernel and its parallel twin changes: their outputs are
    the same bits (tests/test_kernel_threads.py).
    """
    count = max(1, min(count, numba.config.NUMBA_NUM_THREADS))
    before = kernel_threads()
    # Serial kernels never ask numba's threads: leave them alone (and unstarted).
    before_numba = numba.get_num_threads() if count > 1 else None
    _local.threads = count
    if before_numba is not None:
        numba.set_num_threads(count)
    try:
        yield count
    finally:
        _local.threads = before
        if before_numba is not None:
            numba.set_num_threads(before_numba)


def same_padding(kernel: int) -> tuple[int, int]:
    """Zeros before and after each axis for 'same' output size (PyTorch's split)."""
    before = (kernel - 1) // 2
    return before, kernel - 1 - before


def tap_width(kernel: int) -> int:
    """Kernel size rounded up to whole tap groups."""
    return -(-kernel // GROUP) * GROUP


def slots(channels: int) -> int:
    """Channels a plane stack holds: kernels compute 2 or 3 output channels at a time, so
    a single channel gets a scratch partner (zero weights, output 0)."""
    return max(channels, 2)


@dataclass(frozen=True)
class PlaneGeometry:
    """Where a (rows, cols, batch) grid with a k x k kernel's padding sits in a plane.

    A plane is `height` x `width` cells of `batch` floats, flattened. A grid cell (r, c)
    sits at cell (r + a, c + a), where a is the padding before the grid:
    `same_padding(k)[0]` for activations and `same_padding(k)[1]` for gradients (the
    transposed convolution pads the other way round). Every other cell is a zero pad
    cell: the width leaves at least the k-1 pad columns, the height room for the zero
    weights of a padded tap group to read past the last row, and both room for the
    last pooling windows of a ceil-mode max-pool to read zeros past the grid.
    """

    rows: int
    cols: int
    batch: int
    kernel: int
    pool: int = 1

    @cached_property
    def taps(self) -> int:
        return tap_width(self.kernel)

    @cached_property
    def width(self) -> int:
        after = same_padding(self.kernel)[1]  # the larger padding
        return max(self.cols + self.kernel - 1, after + -(-self.cols // self.pool) * self.pool)

    @cached_property
    def height(self) -> int:
        # the last tap group reads taps-1 rows below the last grid row, and there up to
        # cols+taps-1 cells from its start, which may run on into the following rows
        reach = self.rows + self.taps - 2 + -(-(self.cols + self.taps - 1) // self.width)
        after = same_padding(self.kernel)[1]
        return max(reach, after + -(-self.rows // self.pool) * self.pool)

    @cached_property
    def row_stride(self) -> int:
        return self.width * self.batch

    @cached_property
    def size(self) -> int:
        """Floats per channel plane."""
        return self.height * self.row_stride

    def base(self, pad: int) -> int:
        """Flat index of grid cell (0, 0) when `pad` zeros precede the grid."""
        return pad * (self.row_stride + self.batch)

    def zeros(self, channels: int) -> np.ndarray:
        """A zeroed (channels, size) plane stack; kernels only ever write the interior."""
        return np.zeros((channels, self.size), np.float32)

    def grid(self, planes: np.ndarray, pad: int, channels: int) -> np.ndarray:
        """The (channels, rows, cols, batch) view of the grid inside a plane stack."""
        cells = planes[:channels].reshape(channels, self.height, self.width, self.batch)
        return cells[:, pad : pad + self.rows, pad : pad + self.cols]

    @cached_property
    def multi_row(self) -> bool:
        """Whether `blocks` run across rows, through the pad cells between them."""
        return self.cols * self.batch < BLOCK // 2 and self.rows > 1

    def blocks(self) -> np.ndarray:
        """(start, stop) ranges of flat offsets n from grid cell (0, 0) covering the grid.

        A grid row is one contiguous run of cols*batch floats. Long rows are cut into
        near-equal blocks of at most BLOCK floats; short rows are grouped (fewer, longer
        loops), a block then also covering the pad cells between its rows.
        """
        run, stride = self.cols * self.batch, self.row_stride
        if not self.multi_row:
            parts = -(-run // BLOCK)
            cuts = [run * i // parts for i in range(parts + 1)]
            spans = [(r * stride + cuts[i], r * stride + cuts[i + 1])
                     for r in range(self.rows) for i in range(parts)]
        else:
            group = max(1, BLOCK // stride)
            spans = [(r * stride, (min(r + group, self.rows) - 1) * stride + run)
                     for r in range(0, self.rows, group)]
        return np.array(spans, np.int64)


@njit(**_JIT)
def padded_weights(w: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """Write w (Co,Ci,k,k) into out, zeroed beyond k taps and beyond the real channels.

    Without `flip` out is (slots(Co), Ci, taps, taps), the forward kernel's weights.
    With `flip` out is (slots(Ci), Co, taps, taps): the kernel turned by 180 degrees with
    its channel axes swapped, the weights of the input gradient (transposed convolution).
    """
    n_out, n_in, k, _ = w.shape
    out[...] = 0.0
    for co in range(n_out):
        for ci in range(n_in):
            for dy in range(k):
                for dx in range(k):
                    if flip:
                        out[ci, co, k - 1 - dy, k - 1 - dx] = w[co, ci, dy, dx]
                    else:
                        out[co, ci, dy, dx] = w[co, ci, dy, dx]


@njit(**{**_JIT, "fastmath": False})
def all_finite(values: np.ndarray) -> bool:
    """Whether a 1-D float32 array holds no NaN and no inf.

    Integer tests of the exponent bits vectorize where float comparisons with NaN do
    not: several times faster than a float64 sum, and it runs on every received payload.
    """
    bits = values.view(np.uint32)
    bad = np.uint32(0)
    for i in range(bits.size):
        bad |= (bits[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return bad == 0


@njit(**{**_JIT, "fastmath": False})  # fastmath would assume every value finite
def normalize_batch_last(
    X: np.ndarray, mean: np.ndarray, std: np.ndarray, out: np.ndarray
) -> bool:
    """out[c, r, col, i] = (X[i, c, r, col] - mean[c]) / std[c], in one pass; False if X
    holds NaN or inf (then out is garbage).

    What `CNN.to_batch_last` does with a transpose copy and two more passes (and a
    finiteness check with a temporary): a single pass is several times faster.
    """
    batch, n_ch, rows, cols = X.shape
    finite = True
    for c in range(n_ch):
        mu, sigma = mean[c], std[c]
        for r in range(rows):
            for col in range(cols):
                for i in range(batch):
                    v = np.float32(X[i, c, r, col])
                    finite &= np.isfinite(v)
                    out[c, r, col, i] = (v - mu) / sigma
    return finite


@njit(**_JIT)
def bias_relu(z: np.ndarray, b: np.ndarray) -> None:
    """z = max(z + b[:, None], 0) in place, for z (units, B): one pass instead of two."""
    zero = np.float32(0.0)
    for u in range(z.shape[0]):
        bu = b[u]
        for i in range(z.shape[1]):
            z[u, i] = max(z[u, i] + bu, zero)


@njit(**_JIT)
def relu_grad_and_sum(dz: np.ndarray, z: np.ndarray, total: np.ndarray) -> None:
    """dz *= (z > 0) in place for dz, z (units, B); total[u] = sum over the batch of dz[u].

    Back through a ReLU given its output, and the bias gradient of the layer below it.
    The sum is accumulated in float64, as its terms may nearly cancel.
    """
    zero = np.float32(0.0)
    for u in range(dz.shape[0]):
        s = 0.0
        for i in range(dz.shape[1]):
            g = dz[u, i] if z[u, i] > zero else zero
            dz[u, i] = g
            s += g
        total[u] = s


@njit(**_JIT)
def masked_grad_and_sum(dz: np.ndarray, passed: np.ndarray, total: np.ndarray) -> None:
    """`relu_grad_and_sum` given only where the ReLU passed (bool, units x B): for a dz
    written over the ReLU's own output (the edge's memory plan)."""
    zero = np.float32(0.0)
    for u in range(dz.shape[0]):
        s = 0.0
        for i in range(dz.shape[1]):
            g = dz[u, i] if passed[u, i] else zero
            dz[u, i] = g
            s += g
        total[u] = s


_U = np.uint64  # type of flat indices, see `_tap_offsets`


@njit(**_JIT)
def _tap_offsets(q: int, row_stride: int, batch: int) -> tuple:
    """Flat offsets of the 9 taps of the 3x3 tap group whose first tap is at offset q.

    Kernels index planes as plane[channel, offset + j] with unsigned offsets rather
    than taking slices: Numba then adds no negative-index wraparound (which would stop
    LLVM from vectorizing), and no reference counting (two atomic operations per
    slice, which cost more than a short loop). Unsigned arithmetic must stay unsigned:
    uint64 with int64 gives float64 in Numba, so there are no int literals below.
    """
    q, rs, b = _U(q), _U(row_stride), _U(batch)
    q1 = q + rs
    q2 = q1 + rs
    return q, q + b, q + b + b, q1, q1 + b, q1 + b + b, q2, q2 + b, q2 + b + b


@njit(**_JIT)
def _tap_weights(w: np.ndarray, ty: int, tx: int) -> tuple:
    """The 9 weights of the 3x3 tap group at (ty, tx) of a (taps, taps) kernel."""
    return (
        w[ty, tx], w[ty, tx + 1], w[ty, tx + 2],
        w[ty + 1, tx], w[ty + 1, tx + 1], w[ty + 1, tx + 2],
        w[ty + 2, tx], w[ty + 2, tx + 1], w[ty + 2, tx + 2],
    )


@njit(**_JIT)
def _at(x: np.ndarray, ch: int, o: tuple, j: int) -> tuple:
    """The 9 tap values x[ch, o[t] + j] of a tap group."""
    return (x[ch, o[0] + j], x[ch, o[1] + j], x[ch, o[2] + j], x[ch, o[3] + j],
            x[ch, o[4] + j], x[ch, o[5] + j], x[ch, o[6] + j], x[ch, o[7] + j], x[ch, o[8] + j])


@njit(**_JIT)
def _dot9(w: tuple, v: tuple) -> float:
    """Sum of w[t] * v[t] over a tap group."""
    return (w[0] * v[0] + w[1] * v[1] + w[2] * v[2] + w[3] * v[3] + w[4] * v[4]
            + w[5] * v[5] + w[6] * v[6] + w[7] * v[7] + w[8] * v[8])


@njit(**_JIT)
def _correlate2(
    x: np.ndarray, ch: int, o: tuple, wa: tuple, wb: tuple, out: np.ndarray, a: int, b: int,
    base: int, n: int, first: bool, relu: bool, bias_a: float, bias_b: float,
) -> None:
    """out[a] += wa . x and out[b] += wb . x over n cells from `base`.

    x[ch] holds the input, o its tap offsets. Both outputs share the 9 input loads: 18
    FMAs per 11 loads and 2 stores. The first pass sets out = bias + ... instead, and
    with `relu` (the last pass of a forward convolution) the ReLU is applied: no passes
    that only write the bias or clamp. Each case is its own loop, so that each
    vectorizes.
    """
    zero = np.float32(0.0)
    if first and relu:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = max(bias_a + _dot9(wa, v), zero)
            out[b, base + j] = max(bias_b + _dot9(wb, v), zero)
    elif first:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = bias_a + _dot9(wa, v)
            out[b, base + j] = bias_b + _dot9(wb, v)
    elif relu:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = max(out[a, base + j] + _dot9(wa, v), zero)
            out[b, base + j] = max(out[b, base + j] + _dot9(wb, v), zero)
    else:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] += _dot9(wa, v)
            out[b, base + j] += _dot9(wb, v)


@njit(**_JIT)
def _correlate3(
    x: np.ndarray, ch: int, o: tuple, wa: tuple, wb: tuple, wc: tuple, out: np.ndarray,
    a: int, base: int, n: int, first: bool, relu: bool, bias_a: float, bias_b: float,
    bias_c: float,
) -> None:
    """`_correlate2` for outputs a, a+1, a+2: 27 FMAs per 12 loads and 3 stores."""
    zero = np.float32(0.0)
    b, c = a + 1, a + 2
    if first and relu:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = max(bias_a + _dot9(wa, v), zero)
            out[b, base + j] = max(bias_b + _dot9(wb, v), zero)
            out[c, base + j] = max(bias_c + _dot9(wc, v), zero)
    elif first:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = bias_a + _dot9(wa, v)
            out[b, base + j] = bias_b + _dot9(wb, v)
            out[c, base + j] = bias_c + _dot9(wc, v)
    elif relu:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] = max(out[a, base + j] + _dot9(wa, v), zero)
            out[b, base + j] = max(out[b, base + j] + _dot9(wb, v), zero)
            out[c, base + j] = max(out[c, base + j] + _dot9(wc, v), zero)
    else:
        for j in range(n):
            v = _at(x, ch, o, j)
            out[a, base + j] += _dot9(wa, v)
            out[b, base + j] += _dot9(wb, v)
            out[c, base + j] += _dot9(wc, v)


@njit(**_JIT)
def _group_size(channels: int, at: int) -> int:
    """Output channels computed together from channel `at` on: 3s, and 2s to end even.

    (channels >= 2: a single channel is paired with a scratch channel of zero weights.)
    Three outputs per loop run as fast per FMA as two; four do not vectorize.
    """
    left = channels - at
    return 3 if left == 3 or left >= 5 else 2


@njit(**_JIT)
def correlate_planes(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, out: np.ndarray, out_base: int,
    channels: int, blocks: np.ndarray, row_stride: int, batch: int,
    gate: np.ndarray, gate_base: int, relu: bool, sums: np.ndarray,
) -> None:
    """out[m, out_base + n] = finish(bias[m] + sum of w[m,c,dy,dx] * x[c, n + dy*rs + dx*B]).

    A convolution's forward pass (`relu`: finish = ReLU) or its input gradient (finish
    = pass where gate[m, gate_base + n] > 0, the gate being the layer input, a ReLU
    output; sums[m] = the sum of out[m] over the grid, the bias gradient of the layer
    below). The gate is applied in a pass of its own, which costs a little but keeps
    this kernel one compiled function for both uses.

    x: input planes; w: (slots, in channels, taps, taps) from `padded_weights`, flipped
    for the input gradient; bias: (slots,), 0 for a scratch channel and for the input
    gradient; out: output planes (slots, size); channels: slots, the output channels to
    compute; blocks: `PlaneGeometry.blocks`, the ranges of n. Output channels go in
    groups of 2 or 3, with one pass per input channel and tap group: the first pass
    adds the bias, the last one applies the ReLU. A block spanning several rows also
    writes the pad cells between them: the gate zeroes them (it is 0 there), after a
    forward pass `zero_overhang` does. `correlate_planes_parallel` is its twin on
    several threads, to the bit.
    """
    if not relu:
        sums[:] = 0.0
    lanes = np.empty(LANES, np.float32)  # `_gate_and_sum`'s running sums
    for block in range(blocks.shape[0]):
        _correlate_block(x, w, bias, out, out_base, channels, blocks[block, 0],
                         blocks[block, 1], row_stride, batch, gate, gate_base, relu, sums,
                         lanes)


@njit(**_PARALLEL)
def correlate_planes_parallel(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, out: np.ndarray, out_base: int,
    channels: int, blocks: np.ndarray, row_stride: int, batch: int,
    gate: np.ndarray, gate_base: int, relu: bool, sums: np.ndarray,
) -> None:
    """`correlate_planes` with its blocks shared among numba's threads, the same bits.

    Blocks write disjoint cells; only the sums of the input gradient cross blocks, so
    each block's go to a row of its own, added up afterwards in block order: the very
    additions `correlate_planes` makes, in its order.
    """
    n_blocks = blocks.shape[0]
    partial = np.zeros((n_blocks, sums.shape[0]), np.float32)
    lanes = np.empty((n_blocks, LANES), np.float32)
    for block in prange(n_blocks):
        _correlate_block(x, w, bias, out, out_base, channels, blocks[block, 0],
                         blocks[block, 1], row_stride, batch, gate, gate_base, relu,
                         partial[block], lanes[block])
    if not relu:
        _sum_rows(partial, sums)


@njit(**_ORDERED)
def _sum_rows(partial: np.ndarray, total: np.ndarray) -> None:
    """total = the sum of partial's rows, added in row order from 0 (fixed, for the bits)."""
    total[:] = 0.0
    for row in range(partial.shape[0]):
        for i in range(total.shape[0]):
            total[i] += partial[row, i]


@njit(**_JIT)
def _correlate_block(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, out: np.ndarray, out_base: int,
    channels: int, start: int, stop: int, row_stride: int, batch: int,
    gate: np.ndarray, gate_base: int, relu: bool, sums: np.ndarray, lanes: np.ndarray,
) -> None:
    """`correlate_planes` over one block, cells start..stop; sums[m] += its gated sums
    (`lanes`: scratch for `_gate_and_sum`)."""
    n_in, taps = w.shape[1], w.shape[2]
    passes = n_in * (taps // GROUP) ** 2
    base, gbase, n = _U(out_base + start), _U(gate_base + start), _U(stop - start)
    m = 0
    while m < channels:
        size = _group_size(channels, m)
        done = 0
        for c in range(n_in):
            for ty in range(0, taps, GROUP):
                for tx in range(0, taps, GROUP):
                    o = _tap_offsets(start + ty * row_stride + tx * batch, row_stride, batch)
                    done += 1
                    first, last_relu = done == 1, relu and done == passes
                    if size == 3:
                        _correlate3(x, c, o, _tap_weights(w[m, c], ty, tx),
                                    _tap_weights(w[m + 1, c], ty, tx),
                                    _tap_weights(w[m + 2, c], ty, tx), out, m, base, n,
                                    first, last_relu, bias[m], bias[m + 1], bias[m + 2])
                    else:
                        _correlate2(x, c, o, _tap_weights(w[m, c], ty, tx),
                                    _tap_weights(w[m + 1, c], ty, tx), out, m, m + 1,
                                    base, n, first, last_relu, bias[m], bias[m + 1])
        if not relu:
            for g in range(m, m + size):
                sums[g] += _gate_and_sum(out, g, base, gate, gbase, n, lanes)
        m += size


@njit(**_ORDERED)
def _gate_and_sum(out: np.ndarray, g: int, base: int, gate: np.ndarray, gbase: int, n: int,
                  lanes: np.ndarray) -> float:
    """out[g, base + j] = out[g, base + j] where gate[g, gbase + j] > 0, else 0, for j < n;
    returns the sum of what is kept, in an order fixed here: `LANES` running sums (lane
    j mod LANES, in `lanes`, scratch), folded in halves (lane l + lane l + half), then
    the tail of n mod LANES values in turn.

    With `fastmath`'s reassociation LLVM picks the order of a sum itself, and its pick
    changed with where the loop was compiled: fresh or from numba's cache, inside
    `correlate_planes` or its parallel twin, the bias gradients differed in the last
    bit. Without reassociation the order is the one written; the lanes are independent,
    so the loop still vectorizes (the running sums are vector adds).
    """
    zero = np.float32(0.0)
    base, gbase, n = _U(base), _U(gbase), _U(n)
    width = _U(LANES)
    lanes[:] = zero
    full = n - n % width
    for k in range(_U(0), full, width):
        q, r = base + k, gbase + k
        for lane in range(width):
            kept = out[g, q + lane] if gate[g, r + lane] > zero else zero
            out[g, q + lane] = kept
            lanes[lane] += kept
    half = LANES // 2
    while half > 0:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    total = lanes[0]
    for j in range(full, n):
        kept = out[g, base + j] if gate[g, gbase + j] > zero else zero
        out[g, base + j] = kept
        total += kept
    return total


@njit(**_JIT)
def zero_overhang(
    planes: np.ndarray, base: int, rows: int, cols: int, row_stride: int, batch: int
) -> None:
    """Zero the pad cells between the rows of a grid (which multi-row blocks write)."""
    for ch in range(planes.shape[0]):
        for r in range(rows - 1):
            planes[ch, base + r * row_stride + cols * batch : base + (r + 1) * row_stride] = 0.0


@njit(**_JIT)
def conv_weight_grad(
    x: np.ndarray, dz: np.ndarray, dz_base: int, dw: np.ndarray,
    blocks: np.ndarray, row_stride: int, batch: int,
) -> None:
    """dw[co,ci,dy,dx] = sum over n of dz[co, dz_base + n] * x[ci, n + dy*rs + dx*B].

    x: the layer input's planes; dz: gradient planes (>= Co, size) with zeros in every
    pad cell (so pad cells inside multi-row blocks add nothing); dw: (Co, Ci, taps,
    taps). Output channels go in pairs, whose 18 sums share the 9 tap loads. (The bias
    gradient, the sum of dz, comes from the kernel that writes dz.)
    `conv_weight_grad_parallel` is its twin on several threads, to the bit.
    """
    dw[...] = 0.0
    for block in range(blocks.shape[0]):
        _weight_grad_block(x, dz, dz_base, dw, blocks[block, 0], blocks[block, 1],
                           row_stride, batch)


@njit(**_PARALLEL)
def conv_weight_grad_parallel(
    x: np.ndarray, dz: np.ndarray, dz_base: int, dw: np.ndarray,
    blocks: np.ndarray, row_stride: int, batch: int,
) -> None:
    """`conv_weight_grad` with its blocks shared among numba's threads, the same bits.

    Each block adds its sums into a zeroed gradient of its own (0 + s = s: each tap group
    is added once per block), and those are added up in block order: the additions
    `conv_weight_grad` makes into dw, in its order.
    """
    n_blocks = blocks.shape[0]
    partial = np.zeros((n_blocks, dw.size), np.float32)
    for block in prange(n_blocks):
        _weight_grad_block(x, dz, dz_base, partial[block].reshape(dw.shape),
                           blocks[block, 0], blocks[block, 1], row_stride, batch)
    _sum_rows(partial, dw.reshape(dw.size))


@njit(**_JIT)
def _weight_grad_block(
    x: np.ndarray, dz: np.ndarray, dz_base: int, dw: np.ndarray,
    start: int, stop: int, row_stride: int, batch: int,
) -> None:
    """`conv_weight_grad`'s sums over one block, cells start..stop, added into dw."""
    n_out, n_in, taps, _ = dw.shape
    base, n = _U(dz_base + start), _U(stop - start)
    for co in range(0, n_out, 2):
        for ci in range(n_in):
            for ty in range(0, taps, GROUP):
                for tx in range(0, taps, GROUP):
                    o = _tap_offsets(start + ty * row_stride + tx * batch, row_stride, batch)
                    if co + 1 < n_out:
                        s, t = _dots2(x, ci, o, dz, co, base, n)
                        _add_tap_group(dw[co, ci], ty, tx, s)
                        _add_tap_group(dw[co + 1, ci], ty, tx, t)
                    else:
                        _add_tap_group(dw[co, ci], ty, tx, _dots1(x, ci, o, dz, co, base, n))


@njit(**_JIT)
def _dots2(x: np.ndarray, ci: int, o: tuple, dz: np.ndarray, co: int, base: int, n: int) -> tuple:
    """Sums over n cells of dz[co] * (each tap of x[ci]), and of dz[co + 1] * (...).

    18 sums from 11 loads per cell.
    """
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = np.float32(0.0)
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = np.float32(0.0)
    for j in range(n):
        v0, v1, v2, v3, v4, v5, v6, v7, v8 = _at(x, ci, o, j)
        g, h = dz[co, base + j], dz[co + 1, base + j]
        a0 += g * v0
        a1 += g * v1
        a2 += g * v2
        a3 += g * v3
        a4 += g * v4
        a5 += g * v5
        a6 += g * v6
        a7 += g * v7
        a8 += g * v8
        c0 += h * v0
        c1 += h * v1
        c2 += h * v2
        c3 += h * v3
        c4 += h * v4
        c5 += h * v5
        c6 += h * v6
        c7 += h * v7
        c8 += h * v8
    return (a0, a1, a2, a3, a4, a5, a6, a7, a8), (c0, c1, c2, c3, c4, c5, c6, c7, c8)


@njit(**_JIT)
def _dots1(x: np.ndarray, ci: int, o: tuple, dz: np.ndarray, co: int, base: int, n: int) -> tuple:
    """Sums over n cells of dz[co] * (each tap of x[ci])."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = np.float32(0.0)
    for j in range(n):
        v0, v1, v2, v3, v4, v5, v6, v7, v8 = _at(x, ci, o, j)
        g = dz[co, base + j]
        a0 += g * v0
        a1 += g * v1
        a2 += g * v2
        a3 += g * v3
        a4 += g * v4
        a5 += g * v5
        a6 += g * v6
        a7 += g * v7
        a8 += g * v8
    return a0, a1, a2, a3, a4, a5, a6, a7, a8


@njit(**_JIT)
def _add_tap_group(w: np.ndarray, ty: int, tx: int, s: tuple) -> None:
    """Add 9 sums to the 3x3 tap group at (ty, tx) of a (taps, taps) kernel."""
    for dy in range(GROUP):
        for dx in range(GROUP):
            w[ty + dy, tx + dx] += s[dy * GROUP + dx]


@njit(**_JIT)
def maxpool_forward_planes(
    act: np.ndarray, base: int, row_stride: int, batch: int, size: int,
    out: np.ndarray, arg: np.ndarray,
) -> None:
    """Ceil-mode max-pool of the ReLU output inside activation planes (cell (0,0) at
    base) into out (C,PH,PW,B); arg = the winner's row-major index in its window. Only
    a strictly larger value takes over, so the first maximum wins, as in PyTorch.

    Windows past the grid read pad cells, 0, which never beats a ReLU output (>= 0)
    that comes first in the window: no clipping needed. 2x2 windows (the seed) take
    one loop per window, as short loops cost more to enter than to run.
    """
    n_ch, prow, pcol, _ = out.shape
    nb, rs, b = _U(batch), _U(row_stride), _U(batch)
    zero = np.int8(0)
    for ch in range(n_ch):
        for pr in range(prow):
            for pc in range(pcol):
                at = _U(base + pr * size * row_stride + pc * size * batch)
                if size == 2:
                    for i in range(nb):
                        v0, v1 = act[ch, at + i], act[ch, at + b + i]
                        v2, v3 = act[ch, at + rs + i], act[ch, at + rs + b + i]
                        top, code = v0, zero
                        top, code = (v1, np.int8(1)) if v1 > top else (top, code)
                        top, code = (v2, np.int8(2)) if v2 > top else (top, code)
                        top, code = (v3, np.int8(3)) if v3 > top else (top, code)
                        out[ch, pr, pc, i] = top
                        arg[ch, pr, pc, i] = code
                    continue
                for i in range(nb):
                    out[ch, pr, pc, i] = act[ch, at + i]
                    arg[ch, pr, pc, i] = zero
                for code in range(1, size * size):
                    dr, dc = divmod(code, size)
                    at = _U(base + (pr * size + dr) * row_stride + (pc * size + dc) * batch)
                    for i in range(nb):  # branch-free, so that it vectorizes
                        v = act[ch, at + i]
                        take = v > out[ch, pr, pc, i]
                        out[ch, pr, pc, i] = v if take else out[ch, pr, pc, i]
                        arg[ch, pr, pc, i] = code if take else arg[ch, pr, pc, i]


@njit(**_JIT)
def maxpool_relu_backward_planes(
    dout: np.ndarray, pooled: np.ndarray, arg: np.ndarray, size: int,
    dz: np.ndarray, base: int, row_stride: int, batch: int, sums: np.ndarray,
) -> None:
    """Route dout (C,PH,PW,B) to each window's winner in gradient planes, through the ReLU.

    The pooled value is its winner's ReLU output, so the winner's ReLU passes the
    gradient exactly when pooled > 0. Every other cell of every window gets 0, also
    the pad cells that windows past the grid cover (the planes leave room for them).
    One loop per cell: a loop with several stores into dz does not vectorize.
    sums[ch] = the sum of what channel ch receives (the bias gradient of its conv).
    """
    n_ch, prow, pcol, _ = dout.shape
    nb = _U(batch)
    zero = np.float32(0.0)
    for ch in range(n_ch):
        total = zero
        for pr in range(prow):
            for pc in range(pcol):
                for i in range(nb):
                    total += dout[ch, pr, pc, i] if pooled[ch, pr, pc, i] > zero else zero
                for code in range(size * size):
                    dr, dc = divmod(code, size)
                    at = _U(base + (pr * size + dr) * row_stride + (pc * size + dc) * batch)
                    mine = np.int8(code)  # compare int8 lanes with int8: no widening
                    for i in range(nb):
                        g = dout[ch, pr, pc, i] if pooled[ch, pr, pc, i] > zero else zero
                        dz[ch, at + i] = g if arg[ch, pr, pc, i] == mine else zero
        sums[ch] = total


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray, dlogits: np.ndarray) -> float:
    """Mean cross-entropy of logits (K,B) against labels (B,); dlogits = its gradient.

    The kernel runs without bounds checks and indexes the logits with each label, so
    this guard refuses (`ValueError`) what would make it read or write out of bounds:
    other shapes, labels that are not integers, a label outside [0, K). Callers check
    labels at the data boundary first (`Dataset.require_classes`) with a message for
    the user; this is the last line, costing one pass over B labels.
    """
    if logits.ndim != 2 or logits.shape[0] < 1 or dlogits.shape != logits.shape:
        raise ValueError(f"logits {logits.shape} and dlogits {dlogits.shape} must be one "
                         "(classes >= 1, batch) shape")
    if labels.ndim != 1 or labels.shape[0] != logits.shape[1] or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be {logits.shape[1]} integers, got {labels.dtype} "
                         f"of shape {labels.shape}")
    classes = logits.shape[0]
    if labels.dtype != np.int64:  # one kernel type; a uint64 above int64 would wrap
        if labels.size and int(labels.max()) >= classes:
            raise ValueError(f"label {int(labels.max())} is outside 0..{classes - 1}")
        labels = labels.astype(np.int64)
    bad = _first_label_outside(labels, classes)
    if bad >= 0:
        raise ValueError(f"label {labels[bad]} of sample {bad} is outside 0..{classes - 1}")
    return _softmax_cross_entropy(logits, labels, dlogits)


@njit(**_JIT)
def _first_label_outside(labels: np.ndarray, classes: int) -> int:
    """The index of the first label outside [0, classes), or -1."""
    for i in range(labels.shape[0]):
        if labels[i] < 0 or labels[i] >= classes:
            return i
    return -1


@njit(**_JIT)
def _softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray,
                           dlogits: np.ndarray) -> float:
    """The kernel of `softmax_cross_entropy`: labels int64, all in range (unchecked)."""
    n_cls, batch = logits.shape
    loss = 0.0
    for i in range(batch):
        top = logits[0, i]
        for j in range(1, n_cls):
            top = max(top, logits[j, i])
        norm = 0.0
        for j in range(n_cls):
            norm += np.exp(np.float64(logits[j, i] - top))
        log_norm = np.log(norm)
        loss += log_norm - (logits[labels[i], i] - top)
        for j in range(n_cls):
            p = np.exp(np.float64(logits[j, i] - top) - log_norm)
            dlogits[j, i] = (p - (1.0 if j == labels[i] else 0.0)) / batch
    return loss / batch


# The central int8 emulation's conv: the node's arithmetic (nodes/compute.py `conv_relu`),
# cell by cell, in the node's order (bias, then the window's cells in row-major tap order,
# each over its channels; cells outside the grid left out), without fastmath. The planes'
# kernels reassociate (fastmath), which moves a value by an ulp now and then: harmless in
# float32, but quantization would round it the other way where it sits on a boundary.
@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def conv_relu_node_order(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, before: int,
                         out: np.ndarray) -> None:
    """out (h, rows, cols, B) = relu(conv of x (c, rows, cols, B)) with weight
    (h, c, k, k), 'same' windows reaching `before` cells up and left, and each cell's
    bias (h, rows, cols): the layer's, plus the position bias where there is one, as a
    node adds them (float32) before its sum."""
    filters, channels, k, _ = weight.shape
    rows, cols, batch = x.shape[1], x.shape[2], x.shape[3]
    for r in range(rows):
        for q in range(cols):
            for h in range(filters):
                for j in range(batch):
                    out[h, r, q, j] = bias[h, r, q]
            for dy in range(k):
                i = r + dy - before
                if i < 0 or i >= rows:
                    continue
                for dx in range(k):
                    m = q + dx - before
                    if m < 0 or m >= cols:
                        continue
                    for h in range(filters):
                        for c in range(channels):
                            w = weight[h, c, dy, dx]
                            for j in range(batch):
                                out[h, r, q, j] += w * x[c, i, m, j]
            for h in range(filters):
                for j in range(batch):
                    if out[h, r, q, j] < 0.0:
                        out[h, r, q, j] = 0.0


class ConvPlanes:
    """The plane buffers of a conv stack for one batch size, reused from step to step.

    Layer l (1..layers) reads planes `acts[l-1]` (`acts[0]` holds the input) and writes
    its ReLU output into `acts[l]`, all with the activation padding. The backward pass
    alternates between two gradient planes with the gradient padding. Buffers are
    zeroed once: the kernels write grid cells only (and zeros in pad cells), so pads
    stay 0. Two models never share a ConvPlanes; one model's next forward pass of the
    same batch size overwrites it.
    """

    def __init__(
        self, rows: int, cols: int, batch: int, kernel: int, in_channels: int,
        filters: int, layers: int, pool: int,
    ) -> None:
        self.geometry = geo = PlaneGeometry(rows, cols, batch, kernel, pool)
        self.blocks = geo.blocks()
        self.before, self.after = same_padding(kernel)
        self.in_channels, self.filters, self.layers, self.pool = in_channels, filters, layers, pool
        taps, h = geo.taps, filters
        self.acts = [geo.zeros(in_channels)] + [geo.zeros(slots(h)) for _ in range(layers)]
        self.grads: list[np.ndarray] = []  # allocated by the first backward pass
        self._ones: np.ndarray | None = None  # the gate of a layer with a position bias
        self._top: np.ndarray | None = None  # the last layer's d(pre-activation), if kept
        fan = [in_channels] + [h] * (layers - 1)
        self.weights = [np.zeros((slots(h), c, taps, taps), np.float32) for c in fan]
        self.flipped = [np.zeros((slots(c), h, taps, taps), np.float32) for c in fan]
        self.biases = [np.zeros(slots(h), np.float32) for _ in fan]
        self.no_bias = np.zeros(slots(h), np.float32)
        self.dweights = [np.zeros((h, c, taps, taps), np.float32) for c in fan]
        self.dsums = np.zeros(slots(h), np.float32)  # bias gradients from the input gradient
        prow, pcol = -(-rows // pool), -(-cols // pool)
        self.pooled = np.zeros((h, prow, pcol, batch), np.float32)
        self.winners = np.zeros(self.pooled.shape, np.int8)
        # kernel arguments, worked out once (a step is short: Python time counts)
        self.slots = slots(h)
        self.act_base, self.grad_base = geo.base(self.before), geo.base(self.after)
        self.grid_args = (rows, cols, geo.row_stride, batch)
        self.multi_row = geo.multi_row
        # multiply-adds per input channel of one conv kernel call (see `_parallel`)
        self.fmas_per_input = int((self.blocks[:, 1] - self.blocks[:, 0]).sum()) * \
            self.slots * taps * taps
        self.views = [geo.grid(self.acts[0], self.before, in_channels)] + [
            geo.grid(a, self.before, h) for a in self.acts[1:]
        ]

    def _parallel(self, in_channels: int) -> bool:
        """Whether a conv kernel call over `in_channels` input channels runs its parallel
        twin: only with threads to spare (`using_threads`), blocks to share between them,
        and enough work to pay for the fork and join (`PARALLEL_MIN_FMAS`)."""
        return kernel_threads() > 1 and len(self.blocks) > 1 and \
            self.fmas_per_input * in_channels >= PARALLEL_MIN_FMAS

    def activation(self, layer: int) -> np.ndarray:
        """Layer `layer`'s ReLU output (the input for 0) as a (C, rows, cols, B) view."""
        return self.views[layer]

    def forward(self, x: np.ndarray, weights: list[np.ndarray], biases: list[np.ndarray],
                dead: tuple[np.ndarray, np.ndarray] | None = None,
                scales: np.ndarray | None = None,
                position: np.ndarray | None = None) -> None:
        """Conv + ReLU layers then max-pool of x (Ci, rows, cols, B) into `pooled`, `winners`.
        `dead` (failout): (rows, cols) of cells whose every layer's output is 0; their
        ReLU then passes no gradient back either. `scales` (layers + 1): the central
        int8 emulation (meshdl/model/quantize.py): the input and each layer's ReLU output
        replaced by its quantized values where it is made, as the mesh's nodes do.
        `position`: the last layer's bias per cell, (h, rows, cols) or per map too
        (h, rows, cols, B), added before its ReLU."""
        last = len(weights) - 1
        geo, base = self.geometry, self.act_base
        self.views[0][...] = x
        if scales is not None:
            quantize_planes(self.views[0], scales[0], levels(0))
        for layer, (w, b) in enumerate(zip(weights, biases, strict=True)):
            if scales is not None:  # the int8 emulation: the node's arithmetic, exactly
                cell_bias = np.empty((len(b), geo.rows, geo.cols), np.float32)
                cell_bias[...] = b[:, None, None]
                if position is not None and layer == last:
                    cell_bias += position  # per map only while training: not here
                conv_relu_node_order(self.views[layer], w, cell_bias, self.before,
                                     self.views[layer + 1])
                if dead is not None:
                    self.views[layer + 1][:, dead[0], dead[1]] = 0.0
                quantize_planes(self.views[layer + 1], scales[layer + 1], levels(layer + 1))
                continue
            padded_weights(w, self.weights[layer], flip=False)
            self.biases[layer][: len(b)] = b
            out = self.acts[layer + 1]  # (also the gate, which a forward pass ignores)
            correlate = correlate_planes_parallel if self._parallel(w.shape[1]) \
                else correlate_planes
            if position is not None and layer == last:  # bias per cell, then the ReLU
                if self._ones is None:  # a gate that passes everything
                    self._ones = np.ones_like(out)
                correlate(self.acts[layer], self.weights[layer], self.biases[layer], out,
                          base, self.slots, self.blocks, geo.row_stride, geo.batch,
                          self._ones, base, False, self.dsums)
                top = self.views[layer + 1]
                top += position if position.ndim == 4 else position[..., None]
                np.maximum(top, 0.0, out=top)
            else:
                correlate(self.acts[layer], self.weights[layer], self.biases[layer], out,
                          base, self.slots, self.blocks, geo.row_stride, geo.batch, out, base,
                          True, self.dsums)
            if self.multi_row:
                zero_overhang(self.acts[layer + 1], base, *self.grid_args)
            if dead is not None:
                self.views[layer + 1][:, dead[0], dead[1]] = 0.0
        self._pool()

    def top_gradient(self) -> np.ndarray:
        """The last layer's d(pre-activation) (h, rows, cols, B) of the last `backward`
        with `keep_top`."""
        if self._top is None:
            raise RuntimeError("no backward pass kept the top gradient")
        return self._top

    def _pool(self) -> None:
        """The last layer's ReLU output, max-pooled into `pooled`, `winners`."""
        geo = self.geometry
        maxpool_forward_planes(self.acts[-1], self.act_base, geo.row_stride, geo.batch,
                               self.pool, self.pooled, self.winners)

    def _route(self, dpooled: np.ndarray, dz: np.ndarray, dbias: np.ndarray) -> None:
        """d(pooled) routed to the winners through the ReLU, into gradient planes `dz`
        (every grid cell written); dbias = its sum per channel."""
        geo = self.geometry
        maxpool_relu_backward_planes(dpooled, self.pooled, self.winners, self.pool, dz,
                                     self.grad_base, geo.row_stride, geo.batch, dbias)

    def backward(
        self, dpooled: np.ndarray, weights: list[np.ndarray],
        dweights: list[np.ndarray], dbiases: list[np.ndarray], keep_top: bool = False,
    ) -> None:
        """Weight and bias gradients of every layer from dL/d(pooled), into dweights/dbiases.

        Uses the activations, `pooled` and `winners` of the last `forward`. `keep_top`:
        also keep the last layer's d(pre-activation) (`top_gradient`), what a position
        bias learns from.
        """
        geo, grad_base = self.geometry, self.grad_base
        if not self.grads:
            self.grads = [geo.zeros(self.slots) for _ in range(2)]
        k = weights[0].shape[-1]
        dz, below = self.grads
        dpooled = np.ascontiguousarray(dpooled, dtype=np.float32)
        self._route(dpooled, dz, dbiases[-1])
        if keep_top:
            self._top = geo.grid(dz, self.after, self.filters).copy()
        for layer in range(self.layers - 1, -1, -1):
            dw = self.dweights[layer]
            parallel = self._parallel(dw.shape[1])  # weight gradient: Ci by Co as forward
            weight_grad = conv_weight_grad_parallel if parallel else conv_weight_grad
            weight_grad(self.acts[layer], dz, grad_base, dw, self.blocks,
                        geo.row_stride, geo.batch)
            dweights[layer][...] = dw[:, :, :k, :k]
            if layer > 0:
                padded_weights(weights[layer], self.flipped[layer], flip=True)
                correlate = correlate_planes_parallel if self._parallel(self.filters) \
                    else correlate_planes
                correlate(dz, self.flipped[layer], self.no_bias, below, grad_base, self.slots,
                          self.blocks, geo.row_stride, geo.batch, self.acts[layer],
                          self.act_base, False, self.dsums)
                dbiases[layer - 1][...] = self.dsums[: self.filters]
                dz, below = below, dz
