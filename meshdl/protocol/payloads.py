"""The layouts of the edge's control payloads and of REDUCE, packed and read here only.

    PARAMS  float32  conv1.weight, conv1.bias, ..., convL.weight, convL.bias (each
                     flattened, PyTorch's shapes), then the input normalization's mean
                     and std (in_channels values each); under intsum each conv
                     layer's sum scale; then, when the mesh's plan is not the
                     configured one, its tail (`PlanTail`): the cell the edge is
                     attached to and the dead cells
    REDUCE  float32  d(loss)/d(conv parameters): PARAMS' first part, same order;
                     compressed (bytes): as the policy's compressors write it, or
                     under intsum the subtree's sums (meshdl/compress/intsum.py)
    HEALTH  int32    cells a node found silent, +(n + 1), or back, -(n + 1) (a hello),
                     n = row x cols + col
    BATCH   int32    mode, split, then one sample index per sample of the wave, then
                     (failout, training) the cells that act dead in it, -(n + 1) each
                     in increasing order of n
    PUSH    float32  based_on, samples, correct, loss, then the gradient of every
                     parameter (the model's flat order), the mean over the samples;
                     compressed (bytes): the same four as float32, then the
                     gradient as the policy's compressors write it (meshdl/compress)
    WEIGHTS float32  every parameter (the model's flat order), of the version the
                     header's step names

Several meshes training one model (meshdl/server) exchange PUSH and WEIGHTS between
each mesh's edge and the parameter server (`Push`).
The edge packs PARAMS and BATCH (edge/agent.py); nodes read them and pack REDUCE
(nodes/agent.py), through the same `ParamsLayout` and `BatchOrder`, so the two sides
cannot disagree on an offset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from meshdl.compress.codec import Channel, VectorCodec
from meshdl.config import ModelConfig, param_shapes
from meshdl.errors import UsageError


class PlanTail(NamedTuple):
    """What PARAMS says of a plan that is not the configured one: the cell the edge is
    attached to and the dead cells, as float32 cell numbers (row x cols + col, exact
    below 2^24): [edge_at, count, *dead in increasing order]."""

    edge_at: tuple[int, int]
    dead: frozenset[tuple[int, int]]

    def pack(self, cols: int) -> np.ndarray:
        numbers = sorted(r * cols + c for r, c in self.dead)
        return np.array([self.edge_at[0] * cols + self.edge_at[1], len(numbers), *numbers],
                        np.float32)

    @classmethod
    def read(cls, values: np.ndarray, rows: int, cols: int) -> PlanTail | None:
        """The tail of a PARAMS payload, or None if it is not a well-formed one: whole
        numbers of cells inside the grid, the count right, no repeats, increasing."""
        cells = rows * cols
        if values.size < 2 or not np.all(np.isfinite(values)):
            return None
        numbers = values.astype(np.int64)
        if not np.array_equal(numbers, values) or numbers.min() < 0 or \
                numbers[0] >= cells or numbers[1] != values.size - 2:
            return None
        dead = numbers[2:]
        if dead.size and (dead.max() >= cells or np.any(np.diff(dead) <= 0)):
            return None
        return cls(divmod(int(numbers[0]), cols),
                   frozenset(divmod(int(n), cols) for n in dead))


HEALTH_MAX = 64  # cells one HEALTH may name
# The phase of a hello that asks for parameters (a node reached a scheduled slot without
# them), and of the PARAMS answering it: not a wave's (PROTOCOL.md, "Scheduled slots").
REPAIR = 1


def health_entries(payload: np.ndarray, rows: int, cols: int
                   ) -> list[tuple[tuple[int, int], bool]] | None:
    """What a HEALTH payload says: each cell it names, and whether it is back (a hello)
    rather than silent; None if it is not a well-formed one (int32, 1 to `HEALTH_MAX`
    entries, each +(n+1) or -(n+1) of a cell n of the grid)."""
    if payload.dtype != np.int32 or payload.ndim != 1 or \
            not 0 < payload.size <= HEALTH_MAX:
        return None
    cells = rows * cols
    if not np.all((payload != 0) & (payload >= -cells) & (payload <= cells)):
        return None
    return [(divmod(abs(int(entry)) - 1, cols), int(entry) < 0) for entry in payload]


class LayerSlices(NamedTuple):
    """Where one conv layer's weight and bias sit in PARAMS (and REDUCE)."""

    weight: slice
    bias: slice
    kernel_shape: tuple[int, int, int]  # the weight as kernels read it: (h, c_in, k * k)


@dataclass(frozen=True)
class ParamsLayout:
    """Offsets of a PARAMS vector for one model."""

    layers: dict[int, LayerSlices]  # conv layer (from 1) -> its slices
    conv_size: int  # values of the conv parameters, i.e. of a REDUCE
    mean: slice
    std: slice
    # Under intsum, each conv layer's scale of the in-network sum (compress/intsum.py).
    scales: slice
    # Under `--activations int8-static`, each activation layer's scale, the input's first
    # (meshdl/model/quantize.py): what a node quantizes its values by and reads codes with.
    act_scales: slice = field(default_factory=lambda: slice(0, 0))
    # With a position bias (`ModelConfig.position_bias`), its whole (filters, rows, cols)
    # table, last: one signed payload for every node, each reading its own column.
    position: slice = field(default_factory=lambda: slice(0, 0))

    @classmethod
    def of(cls, model: ModelConfig, scales: int = 0, act_scales: bool = False
           ) -> ParamsLayout:
        """The layout for `model`, with `scales` values of sum scales at its end, then
        (`act_scales`) one activation scale per layer (the input's and each conv's), then
        the position bias of a model with one (filters x cells)."""
        shapes = [s for name, s in param_shapes(model).items() if name.startswith("conv")]
        offsets = [int(o) for o in np.cumsum([0, *(math.prod(s) for s in shapes)])]
        layers = {layer: LayerSlices(slice(offsets[2 * layer - 2], offsets[2 * layer - 1]),
                                     slice(offsets[2 * layer - 1], offsets[2 * layer]),
                                     (*shapes[2 * layer - 2][:2], model.kernel ** 2))
                  for layer in range(1, model.conv_layers + 1)}
        end, c = offsets[-1], model.in_channels
        sums = end + 2 * c + scales
        acts = model.conv_layers + 1 if act_scales else 0
        table = model.filters * model.rows * model.cols if model.position_bias else 0
        return cls(layers, end, slice(end, end + c), slice(end + c, end + 2 * c),
                   slice(end + 2 * c, sums), slice(sums, sums + acts),
                   slice(sums + acts, sums + acts + table))

    @property
    def size(self) -> int:
        """Values of a PARAMS payload."""
        return max(self.scales.stop, self.act_scales.stop, self.position.stop)

    @property
    def reduce_size(self) -> int:
        """Values of a REDUCE payload (a node's gradient vector): the conv parameters'
        gradients, then a position bias's (filters x cells, as PARAMS carry it)."""
        return self.conv_size + self.position.stop - self.position.start

    def pack(self, conv: np.ndarray, mean: np.ndarray, std: np.ndarray,
             scales: np.ndarray | None = None, act_scales: np.ndarray | None = None,
             position: np.ndarray | None = None) -> np.ndarray:
        """PARAMS from the model's flat conv parameters, its normalization, (under
        intsum) the sum scales, (int8-static) the activation scales and the position
        bias (its model's, when the layout has one)."""
        table = self.position.stop - self.position.start
        if not table and position is not None:
            raise UsageError("this layout's model has no position bias, yet one was given: "
                             "the mesh's spec and the model disagree")
        if table and (position is None or position.size != table):
            raise UsageError(f"PARAMS of this layout carry a position bias of {table} "
                             "values: the model has none of that size")
        scales = np.zeros(self.scales.stop - self.scales.start) if scales is None else scales
        acts = self.act_scales.stop - self.act_scales.start
        if act_scales is None or not acts:
            act_scales = np.zeros(acts)
        parts = [conv[: self.conv_size], mean, std, scales, act_scales]
        if table:
            parts.append(np.asarray(position).ravel())
        return np.concatenate(parts).astype(np.float32)


NO_CELLS = np.empty(0, np.int32)


class BatchOrder(NamedTuple):
    """What a BATCH says: the wave's mode, the split its samples come from, which ones,
    and (failout) the cells that act dead in the wave: no reading, no output
    (nodes/execute.py), as numbers n = row x cols + col. They travel as -(n + 1), as
    HEALTH's cells, after the indices, which are never negative."""

    mode: int
    split: int
    indices: np.ndarray  # int32, a view of the payload
    failout: np.ndarray = NO_CELLS  # int32 cell numbers, increasing

    def pack(self) -> np.ndarray:
        return np.concatenate([np.array([self.mode, self.split], np.int32),
                               np.asarray(self.indices, np.int32),
                               -1 - np.asarray(self.failout, np.int32)])

    @classmethod
    def read(cls, payload: np.ndarray) -> BatchOrder:
        """The fields of a BATCH payload of at least 3 values (checked by the reader;
        `valid_failout` checks the cells)."""
        rest = payload[2:]
        if rest[-1] >= 0:  # no failout cells (they come last): every wave but failout's
            return cls(int(payload[0]), int(payload[1]), rest)
        negative = np.flatnonzero(rest < 0)
        cut = int(negative[0]) if negative.size else rest.size
        return cls(int(payload[0]), int(payload[1]), rest[:cut], -1 - rest[cut:])

    def valid_failout(self, cells: int) -> bool:
        """Are the failout cells inside a grid of `cells`, increasing, in a training
        wave (the negatives all after the indices: none left among the indices)?"""
        f = self.failout
        if not f.size:
            return True
        return self.mode == 0 and bool(f[0] >= 0) and bool(f[-1] < cells) and \
            bool(np.all(np.diff(f) > 0))


BATCH_HEAD = 2  # values of a BATCH before its indices (mode, split)


PUSH_HEAD = 4  # values of a PUSH before its gradient
EXACT_FLOAT32 = 1 << 24  # whole numbers up to here are exact in float32


class Push(NamedTuple):
    """What a PUSH says: one mesh's gradient of one step and what it was computed on."""

    based_on: int  # the version of the weights the mesh computed it with
    samples: int  # in its shard (0: nothing to learn from, as a skipped wave)
    correct: int  # of those samples, predicted right in the forward pass
    loss: float  # mean over the samples
    gradient: np.ndarray  # float32, the mean over the samples

    def pack(self) -> np.ndarray:
        if not (0 <= self.based_on < EXACT_FLOAT32 and 0 <= self.samples < EXACT_FLOAT32):
            raise ValueError(f"version {self.based_on} or {self.samples} samples beyond "
                             "what a PUSH carries exactly (2^24)")
        head = np.array([self.based_on, self.samples, self.correct, self.loss], np.float32)
        return np.concatenate([head, np.asarray(self.gradient, np.float32)])

    def pack_compressed(self, channel: Channel) -> np.ndarray:
        """The compressed form (bytes): the four head values as float32, then the
        gradient through `channel` (its error feedback keeps what this one leaves
        out). A push with no samples counts for nothing at the server, so its zeros
        go without touching the residual."""
        head = self.pack()[:PUSH_HEAD].view(np.uint8)
        codec = channel.codec
        body = channel.send(self.gradient) if self.samples else \
            codec.encode(np.zeros(codec.size, np.float32), Channel(codec).states)
        return np.concatenate([head, body])

    @classmethod
    def read_compressed(cls, payload: np.ndarray, codec: VectorCodec) -> Push | None:
        """A compressed PUSH (`pack_compressed`), or None if its head is not a
        well-formed one; CodecError if the gradient's bytes are not any `codec`
        writes."""
        head_bytes = 4 * PUSH_HEAD
        if payload.dtype != np.uint8 or payload.shape != (head_bytes + codec.nbytes,):
            return None
        head = payload[:head_bytes].copy().view("<f4")
        if not np.all(np.isfinite(head)):
            return None
        gradient = codec.decode(payload[head_bytes:])
        return cls.read(np.concatenate([head, gradient]), codec.size)

    @classmethod
    def read(cls, payload: np.ndarray, size: int) -> Push | None:
        """The fields of a PUSH of a `size`-value gradient, or None if it is not a
        well-formed one: float32 of the right length, whole non-negative counts, no more
        correct than samples (finite values: the codec checks)."""
        if payload.dtype != np.float32 or payload.shape != (PUSH_HEAD + size,):
            return None
        based_on, samples, correct, loss = (float(v) for v in payload[:PUSH_HEAD])
        counts = (based_on, samples, correct)
        if any(v < 0 or v != int(v) for v in counts) or correct > samples or loss < 0:
            return None
        return cls(int(based_on), int(samples), int(correct), loss, payload[PUSH_HEAD:])
