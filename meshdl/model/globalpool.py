"""Global max pooling: each channel's maximum over the whole grid, per sample.

    features[ch, b] = max over (r, c) of relu(conv_L)[ch, r, c, b]

PyTorch's `AdaptiveMaxPool2d(1)`: the gradient of a feature goes to one cell, the first
maximum in row-major order (a later cell takes over only when strictly larger), and a
winner's ReLU passes it exactly when the feature is > 0 (the feature is its output).
`GlobalPlanes` is the conv stack of `kernels.ConvPlanes` with this pooling in place of
the windowed one; `pooled` is (filters, 1, 1, B) and `winners` the row-major number
r * cols + c of each feature's cell (int32), which is also what the mesh's aggregation
carries up its tree (nodes/execute.py) to break ties the same way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from meshdl.model.kernels import ConvPlanes

_JIT = {"cache": True, "nogil": True, "boundscheck": False}


@njit(**_JIT)
def global_max(act: np.ndarray, out: np.ndarray, arg: np.ndarray) -> None:
    """out[ch, b] = max of act[ch, :, :, b] (C, rows, cols, B); arg = its cell's
    row-major number, the first maximum's."""
    n_ch, rows, cols, batch = act.shape
    for ch in range(n_ch):
        for i in range(batch):
            out[ch, i] = act[ch, 0, 0, i]
            arg[ch, i] = 0
        for r in range(rows):
            for c in range(cols):
                at = np.int32(r * cols + c)
                for i in range(batch):  # branch-free, so that it vectorizes
                    v = act[ch, r, c, i]
                    take = v > out[ch, i]
                    out[ch, i] = v if take else out[ch, i]
                    arg[ch, i] = at if take else arg[ch, i]


@njit(**_JIT)
def global_route(dout: np.ndarray, pooled: np.ndarray, arg: np.ndarray, dz: np.ndarray,
                 sums: np.ndarray) -> None:
    """d(features) (C, B) to each feature's winner through its ReLU, into dz (C, rows,
    cols, B), every other cell 0; sums[ch] = what channel ch receives (its bias
    gradient)."""
    n_ch, rows, cols, batch = dz.shape
    zero = np.float32(0.0)
    for ch in range(n_ch):
        for r in range(rows):
            for c in range(cols):
                for i in range(batch):
                    dz[ch, r, c, i] = zero
        total = zero
        for i in range(batch):
            g = dout[ch, i] if pooled[ch, i] > zero else zero
            total += g
            r, c = divmod(arg[ch, i], cols)
            dz[ch, r, c, i] = g
        sums[ch] = total


class GlobalPlanes(ConvPlanes):
    """`ConvPlanes` whose last layer is pooled over the whole grid."""

    def __init__(self, rows: int, cols: int, batch: int, kernel: int, in_channels: int,
                 filters: int, layers: int) -> None:
        super().__init__(rows, cols, batch, kernel, in_channels, filters, layers, pool=1)
        self.pooled = np.zeros((filters, 1, 1, batch), np.float32)
        self.winners = np.zeros(self.pooled.shape, np.int32)

    def _pool(self) -> None:
        batch = self.geometry.batch
        global_max(self.views[-1], self.pooled.reshape(self.filters, batch),
                   self.winners.reshape(self.filters, batch))

    def _route(self, dpooled: np.ndarray, dz: np.ndarray, dbias: np.ndarray) -> None:
        geo, batch = self.geometry, self.geometry.batch
        global_route(dpooled.reshape(self.filters, batch),
                     self.pooled.reshape(self.filters, batch),
                     self.winners.reshape(self.filters, batch),
                     geo.grid(dz, self.after, self.filters), dbias)
