"""Gradient and activation compressors: each turns float32 values into compact bytes and
back, with a fixed size for a given segment, so a receiver knows exactly what to expect.

A compressor is stateless apart from what it is handed (`Channel` keeps a sender's RNG
and PowerSGD's warm start); the error-feedback memory lives apart from it
(meshdl/compress/feedback.py), as in GRACE's split of Compressor and Memory. Every
`decode` checks the bytes as strictly as the message codec checks a header: wrong
length, indices out of range or out of order, codes that no encoder writes, non-finite
scales all raise `CodecError(BAD_COMPRESSED)`, so a forged payload never reaches the sum.

    name       bytes for n values (k kept)     what it sends
    none       4 n                             float32, exact
    fp16       2 n                             IEEE half precision, clipped to +-65504
    int8       4 + n                           scale = max|x| / 127, round(x / scale)
    2bit[:tau] 4 + ceil(n / 4)                 +tau, -tau or 0 per value (MXNet's rule);
                                               no tau: tau = mean |x| (Hylo's adaptive)
    2bitmean[:c] as 2bit                       2bit with tau = c x mean |x| (c = 1: 2bit)
    ternary    4 + ceil(n / 4)                 +-max|x| with probability |x| / max|x|
                                               (TernGrad: unbiased, stochastic)
    topk[:d]   k (2 or 4) + 4 k                the k largest |x|, k = ceil(d n)
    randk[:d]  as topk                         k values drawn at random (seeded)
    ktopk[:d]  kernels: 2 m + 4 m k^2, bias    the m conv kernels of largest L2 norm
               dense                           (Hylo's conv rule)
    powersgd[:r] 4 r (rows + cols), bias dense one power-iteration step of rank r
                                               with a warm start (Vogels et al.)
    intsum[:L] as int8 when sent alone          conv layers only: in the REDUCE, each
                                               node's own share in whole multiples of a
                                               scale the mesh shares, summed exactly up
                                               the tree (meshdl/compress/intsum.py)

Without a density, top-k, random-k and kernel top-k keep ceil(sqrt(units)) of a
segment's units (values, or kernels): the larger the layer, the harder it is cut, as
Hylo adapts its rate to the layer's size.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Literal

import numpy as np

from meshdl.compress import kernels
from meshdl.compress_grammar import INTSUM_LEVELS, RULES, Choice, parse_choice
from meshdl.errors import CodecError, CodecReason

FP16_MAX = 65504.0


@dataclass(frozen=True)
class Segment:
    """One layer's gradient (weight, then bias, PyTorch's order) or one activation
    payload: what a compressor knows of the values it compresses."""

    name: str  # "conv2", "fc1", "halo"
    kind: Literal["conv", "fc", "activation"]
    weight_shape: tuple[int, ...]  # (out, in, k, k) for conv; (out, in) for fc
    bias: int = 0

    @cached_property
    def weights(self) -> int:
        return math.prod(self.weight_shape)

    @cached_property
    def size(self) -> int:
        return self.weights + self.bias

    @property
    def matrix(self) -> tuple[int, int]:
        """The weight as a matrix: (outputs, everything else), as PowerSGD reads it."""
        rows = self.weight_shape[0]
        return rows, self.weights // rows

    @cached_property
    def kernel_values(self) -> int:
        """k^2: the values of one conv kernel."""
        return math.prod(self.weight_shape[2:])

    @cached_property
    def kernels(self) -> int:
        return self.weights // self.kernel_values


@dataclass
class ChannelState:
    """What one sender keeps between messages of one segment, for its compressor."""

    rng: np.random.Generator
    q: np.ndarray | None = None  # PowerSGD's warm start


def bad_payload(text: str) -> CodecError:
    """The error of a compressed payload no encoder could have written."""
    return CodecError(CodecReason.BAD_COMPRESSED, f"bad compressed payload: {text}")


class _Reader:
    """Reads typed arrays off a compressed payload, in order, checking its length."""

    def __init__(self, data: np.ndarray, expected: int) -> None:
        if data.dtype != np.uint8 or data.ndim != 1 or data.size != expected:
            raise bad_payload(f"{data.size} bytes, expected {expected}")
        self.data, self.at = data, 0

    def take(self, dtype: str, count: int) -> np.ndarray:
        width = np.dtype(dtype).itemsize * count
        # A copy: aligned, and independent of the received bytes.
        out = self.data[self.at:self.at + width].copy().view(dtype)
        self.at += width
        return out

    def floats(self, count: int) -> np.ndarray:
        values = self.take("<f4", count)
        if not np.all(np.isfinite(values)):
            raise bad_payload("non-finite values")
        return values

    def scale(self) -> float:
        value = float(self.take("<f4", 1)[0])
        if not (math.isfinite(value) and value >= 0.0):
            raise bad_payload(f"scale {value}")
        return value


def _pack(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


class Compressor(ABC):
    """float32 values of a `Segment` <-> a fixed number of bytes."""

    name: ClassVar[str]
    lossless: ClassVar[bool] = False

    def __init__(self, arg: float | None = None) -> None:
        self.arg = arg

    @property
    def spec(self) -> str:
        """NAME or NAME:ARG, as `parse_compressor` reads it."""
        return self.name if self.arg is None else f"{self.name}:{self.arg:g}"

    def applies_to(self, segment: Segment) -> bool:
        return Choice(self.name).applies_to(segment.kind)  # compress_grammar.py's rule for the name

    @abstractmethod
    def nbytes(self, segment: Segment) -> int:
        """Bytes of every payload for `segment`."""

    @abstractmethod
    def encode(self, values: np.ndarray, segment: Segment, state: ChannelState) -> np.ndarray:
        """`segment.size` float32 values -> `nbytes(segment)` bytes (uint8)."""

    @abstractmethod
    def decode(self, data: np.ndarray, segment: Segment) -> np.ndarray:
        """What `encode` sent, as `segment.size` float32 values; CodecError if `data`
        is not something it could have sent."""

    def compress(self, values: np.ndarray, segment: Segment, state: ChannelState
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The payload and what the receiver will decode from it (error feedback
        needs both; compressors that know it as they encode say so for less work)."""
        payload = self.encode(values, segment, state)
        return payload, self.decode(payload, segment)

    def operations(self, segment: Segment) -> int:
        """Floating-point-ish operations to encode once and decode once (the device
        profile turns them into CPU time): a few per value by default."""
        return 4 * segment.size

    def __repr__(self) -> str:
        return self.spec


class Dense(Compressor):
    name, lossless = "none", True

    def nbytes(self, segment: Segment) -> int:
        return 4 * segment.size

    def encode(self, values, segment, state):
        return _pack(values.astype("<f4", copy=False))

    def decode(self, data, segment):
        return _Reader(data, self.nbytes(segment)).floats(segment.size)

    def operations(self, segment: Segment) -> int:
        return 0


class Half(Compressor):
    name = "fp16"

    def nbytes(self, segment: Segment) -> int:
        return 2 * segment.size

    def encode(self, values, segment, state):
        return _pack(np.clip(values, -FP16_MAX, FP16_MAX).astype("<f2"))

    def decode(self, data, segment):
        values = _Reader(data, self.nbytes(segment)).take("<f2", segment.size)
        if not np.all(np.isfinite(values)):
            raise bad_payload("non-finite half-precision values")
        return values.astype(np.float32)


class Int8(Compressor):
    name = "int8"

    def nbytes(self, segment: Segment) -> int:
        return 4 + segment.size

    def encode(self, values, segment, state):
        top = float(np.max(np.abs(values))) if values.size else 0.0
        scale = np.float32(top / 127.0)
        q = np.zeros(values.size, np.int8) if scale == 0 else \
            np.clip(np.rint(values / scale), -127, 127).astype(np.int8)
        return _pack(np.array([scale], "<f4"), q)

    def decode(self, data, segment):
        reader = _Reader(data, self.nbytes(segment))
        scale = reader.scale()
        out = np.empty(segment.size, np.float32)
        if not kernels.int8_decode(reader.take("i1", segment.size), scale, out):
            raise bad_payload("int8 code -128 (never sent)")
        return out


class TwoBit(Compressor):
    """MXNet's 2-bit quantization: each value >= tau sends +tau, <= -tau sends -tau,
    others 0; the codes 01 (+tau), 10 (-tau), 00 (0), four to a byte. With no tau
    given, tau is the mean |x| of what is compressed (Hylo's threshold adapted to the
    layer's gradient magnitude)."""

    name = "2bit"

    def nbytes(self, segment: Segment) -> int:
        return 4 + (segment.size + 3) // 4

    def threshold(self, values: np.ndarray) -> np.float32:
        if self.arg is not None:
            return np.float32(self.arg)
        return np.float32(np.mean(np.abs(values))) if values.size else np.float32(0)

    def compress(self, values, segment, state):
        tau = self.threshold(values)
        packed = np.empty((segment.size + 3) // 4, np.uint8)
        decoded = np.empty(segment.size, np.float32)
        kernels.two_bit_encode(values, float(tau), packed, decoded)
        return _pack(np.array([tau], "<f4"), packed), decoded

    def encode(self, values, segment, state):
        return self.compress(values, segment, state)[0]

    def decode(self, data, segment):
        reader = _Reader(data, self.nbytes(segment))
        tau = np.float32(reader.scale())
        out = np.empty(segment.size, np.float32)
        if not kernels.two_bit_decode(reader.take("u1", (segment.size + 3) // 4), tau, out):
            raise bad_payload("2-bit code 11, or padding that is not zero")
        return out


class MeanTwoBit(TwoBit):
    """2-bit with Hylo's adaptive threshold scaled: tau = c x mean |x| of what is
    compressed (c = 1 is `2bit` without a tau). A larger c sends fewer, larger steps
    and drains a large residual in fewer messages."""

    name = "2bitmean"

    @property
    def factor(self) -> float:
        return 1.0 if self.arg is None else self.arg

    def threshold(self, values: np.ndarray) -> np.float32:
        if not values.size:
            return np.float32(0)
        return np.float32(self.factor * np.mean(np.abs(values)))


class Ternary(TwoBit):
    """TernGrad (Wen et al., 2017): the scale is max |x|, and each value goes as +-scale
    with probability |x| / scale, else 0, drawn from the sender's seeded stream: the
    decoded message is unbiased, so no large value waits in a residual for many
    messages, which matters where each hop re-compresses a sum (the REDUCE up the
    tree). Same payload as 2-bit."""

    name = "ternary"

    def threshold(self, values: np.ndarray) -> np.float32:
        return np.float32(np.max(np.abs(values))) if values.size else np.float32(0)

    def compress(self, values, segment, state):
        scale = self.threshold(values)
        packed = np.empty((segment.size + 3) // 4, np.uint8)
        decoded = np.empty(segment.size, np.float32)
        kernels.ternary_encode(values, float(scale), state.rng.random(segment.size),
                               packed, decoded)
        return _pack(np.array([scale], "<f4"), packed), decoded


def _density_count(density: float | None, units: int) -> int:
    """Units kept: ceil(density x units), or ceil(sqrt(units)) by the layer's size."""
    if units == 0:
        return 0
    # (less a hair: 0.04 x 25 must keep 1, whatever the last bit of 0.04 does)
    kept = math.ceil(math.sqrt(units)) if density is None else \
        math.ceil(density * units - 1e-9)
    return max(1, min(units, kept))


def _index_dtype(units: int) -> str:
    return "<u2" if units <= 0x10000 else "<u4"


class _Sparse(Compressor):
    """k chosen values with their indices (increasing)."""


    def kept(self, segment: Segment) -> int:
        return _density_count(self.arg, segment.size)

    def nbytes(self, segment: Segment) -> int:
        k = self.kept(segment)
        return k * (np.dtype(_index_dtype(segment.size)).itemsize + 4)

    @abstractmethod
    def choose(self, values: np.ndarray, k: int, state: ChannelState) -> np.ndarray:
        """Indices of the k values to send."""

    def compress(self, values, segment, state):
        index = np.sort(self.choose(values, self.kept(segment), state))
        picked = values[index].astype("<f4")
        decoded = np.zeros(segment.size, np.float32)
        decoded[index] = picked
        return _pack(index.astype(_index_dtype(segment.size)), picked), decoded

    def encode(self, values, segment, state):
        return self.compress(values, segment, state)[0]

    def decode(self, data, segment):
        k, n = self.kept(segment), segment.size
        reader = _Reader(data, self.nbytes(segment))
        index = reader.take(_index_dtype(n), k)
        out = np.empty(n, np.float32)
        if not kernels.scatter_checked(index, reader.take("<f4", k), 1, n, out):
            raise bad_payload("indices out of range or not increasing, or non-finite")
        return out

    def operations(self, segment: Segment) -> int:
        return 8 * segment.size  # a selection pass and a scatter


class TopK(_Sparse):
    name = "topk"

    def choose(self, values, k, state):
        if k >= values.size:
            return np.arange(values.size)
        return np.argpartition(np.abs(values), values.size - k)[values.size - k:]


class RandomK(_Sparse):
    name = "randk"

    def choose(self, values, k, state):
        return state.rng.choice(values.size, size=k, replace=False)


class KernelTopK(Compressor):
    """Hylo's conv rule: the m kernels (one k x k filter slice per input and output
    channel) of largest L2 norm, with their indices; the bias dense."""

    name = "ktopk"


    def kept(self, segment: Segment) -> int:
        return _density_count(self.arg, segment.kernels)

    def nbytes(self, segment: Segment) -> int:
        m = self.kept(segment)
        return m * (2 + 4 * segment.kernel_values) + 4 * segment.bias

    def compress(self, values, segment, state):
        m, kk = self.kept(segment), segment.kernel_values
        units = values[: segment.weights].reshape(segment.kernels, kk)
        norms = np.einsum("ij,ij->i", units, units)
        index = np.sort(np.argpartition(norms, units.shape[0] - m)[units.shape[0] - m:])
        picked, bias = units[index].astype("<f4"), values[segment.weights:].astype("<f4")
        decoded = np.zeros(segment.size, np.float32)
        decoded[: segment.weights].reshape(segment.kernels, kk)[index] = picked
        decoded[segment.weights:] = bias
        return _pack(index.astype("<u2"), picked, bias), decoded

    def encode(self, values, segment, state):
        return self.compress(values, segment, state)[0]

    def decode(self, data, segment):
        m, kk = self.kept(segment), segment.kernel_values
        reader = _Reader(data, self.nbytes(segment))
        index, picked = reader.take("<u2", m), reader.take("<f4", m * kk)
        out = np.empty(segment.size, np.float32)
        if not kernels.scatter_checked(index, picked, kk, segment.kernels,
                                       out[: segment.weights]):
            raise bad_payload("kernel indices out of range or not increasing, or "
                              "non-finite")
        out[segment.weights:] = reader.floats(segment.bias)
        return out


class PowerSGD(Compressor):
    """Rank-r compression of the weight matrix M (outputs x the rest) by one power
    iteration from the last step's Q (the warm start): P = M Q, orthonormalized, then
    Q = M^T P; P and Q go, the receiver forms P Q^T. The bias goes dense. Messages here
    are point to point (a tree link, the backhaul), so both factors go in one message
    rather than in the two all-reduce rounds of the data-centre form."""

    name = "powersgd"

    def rank(self, segment: Segment) -> int:
        rows, cols = segment.matrix
        return max(1, min(int(self.arg or 1), rows, cols))


    def nbytes(self, segment: Segment) -> int:
        rows, cols = segment.matrix
        return 4 * self.rank(segment) * (rows + cols) + 4 * segment.bias

    def encode(self, values, segment, state):
        rows, cols = segment.matrix
        r = self.rank(segment)
        m = values[: segment.weights].reshape(rows, cols).astype(np.float64)
        if state.q is None or state.q.shape != (cols, r):
            state.q = state.rng.standard_normal((cols, r))
        p = _orthonormal(m @ state.q)
        q = m.T @ p
        state.q = q
        return _pack(p.astype("<f4"), q.astype("<f4"), values[segment.weights:].astype("<f4"))

    def decode(self, data, segment):
        rows, cols = segment.matrix
        r = self.rank(segment)
        reader = _Reader(data, self.nbytes(segment))
        p = reader.floats(rows * r).reshape(rows, r)
        q = reader.floats(cols * r).reshape(cols, r)
        bias = reader.floats(segment.bias)
        weight = (p.astype(np.float64) @ q.T.astype(np.float64)).astype(np.float32)
        if not np.all(np.isfinite(weight)):
            raise bad_payload("non-finite low-rank product")
        return np.concatenate([weight.reshape(-1), bias])

    def operations(self, segment: Segment) -> int:
        rows, cols = segment.matrix
        return 6 * rows * cols * self.rank(segment)  # M Q, M^T P, and P Q^T


class IntSum(Int8):
    """`intsum[:L]`: conv layers summed in the network, each node's share in 2L + 1
    levels (L = 7 unless given). Where nothing is summed on the way (an edge's PUSH
    to the parameter server) the layer travels as int8."""

    name = "intsum"


    @property
    def levels(self) -> int:
        return INTSUM_LEVELS if self.arg is None else int(self.arg)


def _orthonormal(p: np.ndarray) -> np.ndarray:
    """Columns of p made orthonormal (Gram-Schmidt); a column with no length left
    becomes zero rather than NaN."""
    out = p.copy()
    for j in range(out.shape[1]):
        for i in range(j):
            out[:, j] -= (out[:, i] @ out[:, j]) * out[:, i]
        norm = np.linalg.norm(out[:, j])
        out[:, j] = out[:, j] / norm if norm > 1e-30 else 0.0
    return out


COMPRESSORS: dict[str, type[Compressor]] = {
    c.name: c for c in (Dense, Half, Int8, TwoBit, MeanTwoBit, Ternary, TopK, RandomK,
                        KernelTopK, PowerSGD, IntSum)}
assert list(COMPRESSORS) == list(RULES), "compress_grammar.RULES names the compressors, in order"


def parse_compressor(spec: str) -> Compressor:
    """'topk:0.01' -> TopK(0.01); a UsageError naming the choices for anything else."""
    return compressor_of(parse_choice(spec))


def compressor_of(choice: Choice) -> Compressor:
    """The compressor a parsed name stands for."""
    kind = COMPRESSORS[choice.name]
    return kind() if choice.arg is None else kind(choice.arg)
