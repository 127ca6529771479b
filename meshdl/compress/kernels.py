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


# ------------------------------------------------------------------ Rice codes
# The in-network sum (compress/intsum.py) sends whole numbers that are mostly 0 and
# small: zigzag-mapped (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), each is written as its
# quotient by 2^p in unary (that many 1 bits, then a 0) and its p low bits, bits packed
# from the low end of each byte. Golomb-Rice: the code of a geometric source, and a few
# lines to decode on a microcontroller.

RICE_MAX_P = 31  # no quotient at all for any sum below 2^31


@njit(**_JIT)
def rice_best_p(values: np.ndarray) -> tuple[int, int]:
    """The Rice parameter that codes `values` (int32) in the fewest bits, the smallest
    such, and that number of bits."""
    best_p, best_bits = 0, -1
    for p in range(RICE_MAX_P + 1):
        bits = values.size * (1 + p)
        for i in range(values.size):
            v = np.int64(values[i])
            bits += ((v << 1) if v >= 0 else (-(v << 1) - 1)) >> p
        if best_bits < 0 or bits < best_bits:
            best_p, best_bits = p, bits
    return best_p, best_bits


@njit(**_JIT)
def rice_encode(values: np.ndarray, p: int, out: np.ndarray) -> None:
    """`values` (int32) in Rice code `p` into `out` (zeroed here; its size is the bits
    `rice_best_p` counted, rounded up to bytes)."""
    out[:] = 0
    at = 0
    for i in range(values.size):
        v = np.int64(values[i])
        z = (v << 1) if v >= 0 else (-(v << 1) - 1)
        for _ in range(z >> p):
            out[at >> 3] |= 1 << (at & 7)
            at += 1
        at += 1  # the 0 that ends the quotient
        for b in range(p):
            if (z >> b) & 1:
                out[at >> 3] |= 1 << (at & 7)
            at += 1


@njit(**_JIT)
def rice_decode(data: np.ndarray, p: int, bound: int, out: np.ndarray) -> bool:
    """`out.size` values in Rice code `p` from `data`, each of magnitude at most
    `bound`; False unless `data` is exactly such a code: no value out of bounds, no
    bits left over but the zero padding of its last byte."""
    bits = data.size * 8
    limit = (2 * np.int64(bound)) >> p  # the largest quotient a value in bounds has
    at = 0
    for i in range(out.size):
        q = np.int64(0)
        while True:
            if at >= bits:
                return False
            bit = (data[at >> 3] >> (at & 7)) & 1
            at += 1
            if bit == 0:
                break
            q += 1
            if q > limit:
                return False
        if at + p > bits:
            return False
        z = q << p
        for b in range(p):
            z |= np.int64((data[at >> 3] >> (at & 7)) & 1) << b
            at += 1
        v = (z >> 1) if (z & 1) == 0 else -((z + 1) >> 1)
        if v > bound or v < -bound:
            return False
        out[i] = v
    if (at + 7) >> 3 != data.size:
        return False
    while at < bits:  # the padding
        if (data[at >> 3] >> (at & 7)) & 1:
            return False
        at += 1
    return True
