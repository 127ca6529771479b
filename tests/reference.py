"""An independent float64 NumPy reference of the seed CNN, written for clarity only.

The tests compare meshdl's Numba kernels (float32, batch-last) with this plain
batch-first implementation, and differentiate it by finite differences.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from meshdl.config import ModelConfig


def conv_same(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PyTorch Conv2d(padding='same'): x (B,Ci,H,W), w (Co,Ci,k,k) -> (B,Co,H,W)."""
    k = w.shape[-1]
    before = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (0, 0), (before, k - 1 - before), (before, k - 1 - before)))
    windows = sliding_window_view(xp, (k, k), axis=(2, 3))  # (B,Ci,H,W,k,k)
    return np.einsum("bihwyx,oiyx->bohw", windows, w) + b[None, :, None, None]


def maxpool_ceil(x: np.ndarray, size: int) -> np.ndarray:
    """MaxPool2d(size, ceil_mode=True): pad with -inf up to whole windows."""
    B, C, H, W = x.shape
    ph, pw = -(-H // size), -(-W // size)
    padded = np.full((B, C, ph * size, pw * size), -np.inf)
    padded[:, :, :H, :W] = x
    return padded.reshape(B, C, ph, size, pw, size).max(axis=(3, 5))


def logits(params: dict[str, np.ndarray], config: ModelConfig, x: np.ndarray,
           dead: np.ndarray | None = None) -> np.ndarray:
    """Logits (B, classes) of normalized input x (B,Ci,H,W), all in float64; `dead`
    (failout): a (H, W) mask of cells whose input and outputs are 0."""
    keep = 1.0 if dead is None else ~dead
    a = x.astype(np.float64) * keep
    for layer in range(1, config.conv_layers + 1):
        a = np.maximum(conv_same(a, params[f"conv{layer}.weight"], params[f"conv{layer}.bias"]),
                       0.0) * keep
    if config.global_pool:
        features = a.max(axis=(2, 3))
    else:
        features = maxpool_ceil(a, config.pool).reshape(len(x), -1)
    hidden = np.maximum(features @ params["fc1.weight"].T + params["fc1.bias"], 0.0)
    return hidden @ params["fc2.weight"].T + params["fc2.bias"]


def loss(params: dict[str, np.ndarray], config: ModelConfig, x: np.ndarray,
         y: np.ndarray, dead: np.ndarray | None = None) -> float:
    """Mean softmax cross-entropy."""
    z = logits(params, config, x, dead)
    z = z - z.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean())
