"""Numba kernels of the compressors' hot loops: every node encodes its REDUCE and
decodes its children's in every training wave, so a few numpy calls per value would
cost more than the convolution itself. Each decoder also validates (returns False on
bytes no encoder writes) in the same pass."""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = {"cache": True, "nogil": True, "boundscheck": False}


@njit(**_JIT)
def two_bit_encode(values: np.ndarray, tau: float, packed: np.ndarray,
                   decoded: np.ndarray) -> None:
    """Codes 01 (+tau), 10 (-tau), 00, four to a byte from the low bits; `decoded` gets
    what the receiver will read."""
    packed[:] = 0
    for i in range(values.size):
        x = values[i]
        code = 0
        out = 0.0
        if tau > 0.0 and x >= tau:
            code, out = 1, tau
        elif tau > 0.0 and x <= -tau:
            code, out = 2, -tau
        packed[i >> 2] |= code << (2 * (i & 3))
        decoded[i] = out


@njit(**_JIT)
def two_bit_decode(packed: np.ndarray, tau: float, out: np.ndarray) -> bool:
    n = out.size
    for j in range(packed.size):
        byte = packed[j]
        for q in range(4):
            code = (byte >> (2 * q)) & 3
            i = 4 * j + q
            if code == 3 or (i >= n and code != 0):
                return False
            if i < n:
                out[i] = tau if code == 1 else -tau if code == 2 else 0.0
    return True


@njit(**_JIT)
def int8_decode(codes: np.ndarray, scale: float, out: np.ndarray) -> bool:
    for i in range(codes.size):
        if codes[i] == -128:
            return False
        out[i] = codes[i] * scale
    return True


@njit(**_JIT)
def scatter_checked(index: np.ndarray, values: np.ndarray, width: int, units: int,
                    out: np.ndarray) -> bool:
    """out[index[j] * width + t] = values[j * width + t], indices increasing and below
    `units`, values finite (the rest of `out` is zero)."""
    out[:] = 0.0
    last = -1
    for j in range(index.size):
        unit = np.int64(index[j])
        if unit <= last or unit >= units:
            return False
        last = unit
        for t in range(width):
            v = values[j * width + t]
            if not np.isfinite(v):
                return False
            out[unit * width + t] = v
    return True


@njit(**_JIT)
def ternary_encode(values: np.ndarray, scale: float, draws: np.ndarray, packed: np.ndarray,
                   decoded: np.ndarray) -> None:
    """TernGrad: +scale with probability x / scale for x > 0, -scale with |x| / scale for
    x < 0, else 0 (unbiased: the expected decoded value is x); codes as `two_bit_encode`."""
    packed[:] = 0
    for i in range(values.size):
        x = values[i]
        code = 0
        out = 0.0
        if scale > 0.0 and draws[i] * scale < abs(x):
            code, out = (1, scale) if x > 0.0 else (2, -scale)
        packed[i >> 2] |= code << (2 * (i & 3))
        decoded[i] = out
