"""The in-network sum: the REDUCE adds whole numbers, so no hop adds error (`intsum[:L]`).

Re-compressing the REDUCE at every hop (compress/codec.py's `Channel` at each node)
puts one compression error into every one of the tree's messages, and all of them reach
the edge: 2-bit quantization that costs 0.5 points when applied once to the whole sum
does not learn at all after the 425 hops of the seed mesh (docs/compression.md). Here,
as SwitchML does in a switch, each node quantizes only its *own* share of the gradient,
once, to whole multiples of a scale that every node of the mesh shares, and keeps what
that leaves out for its next wave (error feedback). A REDUCE carries the whole numbers
of its subtree's shares, added exactly on the way up; the edge multiplies by the scale.

The scale of each layer comes from the edge with the PARAMS of the wave: the largest
|share + residual| any node had in the previous wave (the REDUCE carries its subtree's
largest, combined with max on the way up) over L, so each share needs at most L levels
either side of 0. The first wave has no scale yet (0): every node keeps its whole share
for the next one. Sums are mostly 0 and small, so they travel in Golomb-Rice code
(compress/kernels.py), one parameter per layer, chosen by the sender.

A REDUCE's payload, per conv layer: float32 peak, uint8 Rice parameter, uint16 bytes of
code, the code. A receiver knows the sender's subtree, hence the largest magnitude a
sum may have (L x cells), and refuses anything else (CodecError, BAD_COMPRESSED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
from numba import njit

from meshdl.compress import kernels
from meshdl.compress.compressors import Segment, bad_payload
from meshdl.compress_grammar import MAX_LAYER_VALUES

LAYER_HEAD = np.dtype([("peak", "<f4"), ("p", "u1"), ("nbytes", "<u2")])


class SumShare(NamedTuple):
    """What a REDUCE carries under intsum: a subtree's shares as whole numbers of each
    layer's scale, and the largest |share + residual| of any of its nodes per layer."""

    ints: np.ndarray  # int32, one per conv parameter
    peaks: np.ndarray  # float32, one per conv layer


class LayerPart(NamedTuple):
    """One conv layer of the sum: its values' place in the vector, its share's levels."""

    segment: Segment
    levels: int
    values: slice


@dataclass(frozen=True)
class SumCodec:
    """The conv layers of a REDUCE under intsum, and their levels."""

    segments: tuple[Segment, ...]
    levels: tuple[int, ...]

    @cached_property
    def parts(self) -> tuple[LayerPart, ...]:
        out, at = [], 0
        for segment, levels in zip(self.segments, self.levels, strict=True):
            out.append(LayerPart(segment, levels, slice(at, at + segment.size)))
            at += segment.size
        return tuple(out)

    @cached_property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    def __post_init__(self) -> None:
        for segment in self.segments:
            if segment.size > MAX_LAYER_VALUES:
                raise ValueError(f"intsum: {segment.name} has {segment.size} values, more "
                                 f"than a REDUCE's layer code holds ({MAX_LAYER_VALUES})")

    def per_value(self, per_layer: np.ndarray) -> np.ndarray:
        """One figure per layer (a scale) spread over the layer's values."""
        return np.repeat(per_layer.astype(np.float32, copy=False),
                         [p.segment.size for p in self.parts])

    @cached_property
    def operations(self) -> int:
        """Operations of one node's quantizing, encoding and one decoding: a few per
        value (the simulated devices' CPU time)."""
        return 8 * self.size

    def zeros(self) -> SumShare:
        """A subtree that sent nothing (best effort: its REDUCE missed the deadline)."""
        return SumShare(np.zeros(self.size, np.int32), np.zeros(len(self.parts), np.float32))

    def max_nbytes(self, cells: int) -> int:
        """The largest payload a subtree of `cells` cells can send: the Rice parameter
        that never needs a quotient bounds what the sender's best one writes. (Worked
        out once per subtree size: every REDUCE received asks it twice.)"""
        bound = self._bounds.get(cells)
        if bound is None:
            bound = self._bounds[cells] = self._max_nbytes(cells)
        return bound

    @cached_property
    def _bounds(self) -> dict[int, int]:
        return {}

    def _max_nbytes(self, cells: int) -> int:
        total = 0
        for part in self.parts:
            width = min(kernels.RICE_MAX_P, (2 * part.levels * cells).bit_length())
            quotient = (2 * part.levels * cells) >> width
            bits = part.segment.size * (1 + width + quotient)
            total += LAYER_HEAD.itemsize + -(-bits // 8)
        return total

    def encode(self, share: SumShare) -> np.ndarray:
        chunks = []
        for i, part in enumerate(self.parts):
            ints = share.ints[part.values]
            p, bits = kernels.rice_best_p(ints)
            code = np.empty(-(-bits // 8), np.uint8)
            kernels.rice_encode(ints, p, code)
            head = np.array([(share.peaks[i], p, code.size)], LAYER_HEAD)
            chunks += [head.view(np.uint8), code]
        return np.concatenate(chunks)

    def decode(self, data: np.ndarray, cells: int) -> SumShare:
        """The share a subtree of `cells` cells sent; CodecError if no such subtree could
        have sent `data` (a sum out of bounds, a bad code, bytes short or left over)."""
        if data.dtype != np.uint8 or data.ndim != 1 or data.size > self.max_nbytes(cells):
            raise bad_payload(f"{data.size} bytes, more than a subtree of {cells} sends")
        ints = np.empty(self.size, np.int32)
        peaks = np.empty(len(self.parts), np.float32)
        at = 0
        for i, part in enumerate(self.parts):
            if at + LAYER_HEAD.itemsize > data.size:
                raise bad_payload("a layer's head cut short")
            head = data[at:at + LAYER_HEAD.itemsize].copy().view(LAYER_HEAD)[0]
            at += LAYER_HEAD.itemsize
            peak, p, nbytes = float(head["peak"]), int(head["p"]), int(head["nbytes"])
            if not (math.isfinite(peak) and peak >= 0.0) or p > kernels.RICE_MAX_P:
                raise bad_payload(f"{part.segment.name}: peak {peak}, Rice parameter {p}")
            if at + nbytes > data.size:
                raise bad_payload(f"{part.segment.name}: {nbytes} bytes of code cut short")
            if not kernels.rice_decode(data[at:at + nbytes], p, part.levels * cells,
                                       ints[part.values]):
                raise bad_payload(f"{part.segment.name}: not a Rice code of sums of "
                                  f"{cells} shares in {part.levels} levels")
            peaks[i] = peak
            at += nbytes
        if at != data.size:
            raise bad_payload(f"{data.size - at} bytes after the last layer")
        return SumShare(ints, peaks)


class SumChannel:
    """A node's side: its share in whole numbers of the scales, and its residual."""

    def __init__(self, codec: SumCodec) -> None:
        self.codec = codec
        self.residual = np.zeros(codec.size, np.float32)

    def quantize(self, own: np.ndarray, scales: np.ndarray) -> SumShare:
        """`own` (this node's share, float32) plus the residual in whole numbers of each
        layer's scale (0: no scale yet, all kept); the residual keeps the rest."""
        share = self.codec.zeros()
        for i, part in enumerate(self.codec.parts):
            share.peaks[i] = _quantize(own[part.values], float(scales[i]), part.levels,
                                       share.ints[part.values], self.residual[part.values])
        return share


def add_shares(total: SumShare, other: SumShare) -> None:
    """A child's subtree into its parent's: whole numbers added, peaks by max."""
    np.add(total.ints, other.ints, out=total.ints)
    np.maximum(total.peaks, other.peaks, out=total.peaks)


class SharedScales:
    """The edge's side: the scale of each layer it sends with PARAMS, learnt from the
    peaks the last REDUCE brought, and the gradient a REDUCE's sums stand for."""

    def __init__(self, codec: SumCodec) -> None:
        self.codec = codec
        self.scales = np.zeros(len(codec.parts), np.float32)  # none before a first REDUCE

    def gradient(self, share: SumShare, scales: np.ndarray) -> np.ndarray:
        """float32 conv gradients of `share`, summed under `scales` (the wave's)."""
        return share.ints.astype(np.float32) * self.codec.per_value(scales)

    def learn(self, peaks: np.ndarray) -> None:
        """Scales for the next wave: every node's share then fits in its levels (a
        share that grew beyond is clipped, and error feedback keeps the excess)."""
        levels = np.array(self.codec.levels, np.float32)
        self.scales = (peaks / levels).astype(np.float32)


@njit(cache=True, nogil=True)
def _quantize(own: np.ndarray, scale: float, levels: int, ints: np.ndarray,
              residual: np.ndarray) -> float:
    """ints = clip(rint((own + residual) / scale), +-levels), residual = what is left;
    returns max |own + residual| (the peak)."""
    peak = 0.0
    for i in range(own.size):
        v = own[i] + residual[i]
        peak = max(peak, abs(v))
        q = 0
        if scale > 0.0 and np.isfinite(v):  # a NaN share: never sent
            q = int(min(max(np.rint(v / scale), -levels), levels))
        ints[i] = q
        residual[i] = v - np.float32(q * scale)
    return peak
