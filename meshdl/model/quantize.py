"""Static (calibrated) activation quantization, as TFLite's post-training static
quantization runs a CNN on a microcontroller: each layer's activations get one scale,
fixed after training, and every value is a whole number of that scale.

- Layer 0 (the normalized readings, and the alive mask) as int16 codes, symmetric:
  -32767..32767 (a reading keeps 15 bits: the cloud ships readings as 16 bits too).
- Each conv layer's ReLU output as uint8 codes 0..255. Post-ReLU values are never
  negative, so a sign bit would waste half of the byte: 255 levels above 0 halve the
  rounding step of int8's 0..127 at the same byte.

A value is quantized where it is made (a node's own readings, its conv output), and the
quantized value `float32(code) * scale` is what its maker and every receiver compute on:
`_code` is the one function that makes it (the node executor's `quantize_cell`,
nodes/execute.py, and the central emulation's `quantize_planes`,
`kernels.ConvPlanes.forward`, both call it), so the mesh equals the central int8
model to the bit. Messages carry the codes (`to_codes`),
never the scale: a receiver has every layer's scale from the PARAMS it got.

Calibration (`calibrate_scales`): a layer's scale is its largest value over the
training split (over 127 / 255 levels), taken on the trained model's float32 forward
pass; a value beyond it saturates at the largest code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PERCENTILE_MAPS = 4000  # a percentile's maps: 4,000 x 425 cells x 16 filters, 109 MB
# The maps a calibration pass holds at once: about this many bytes of one layer's
# activations (1,000 maps on 17 x 25 with 16 filters, 27; on 100 x 100, 6). A layer's
# peak is a maximum over maps, so the batch changes no scale, only the memory.
CALIBRATION_BATCH_BYTES = 32 << 20
INPUT_LEVELS = 32767  # int16 codes of the readings: -32767..32767
ACTIVATION_LEVELS = 255  # uint8 codes of a ReLU output: 0..255
CODE_DTYPES = (np.dtype(np.int16), np.dtype(np.uint8))  # layer 0, layers above


def levels(layer: int) -> int:
    """The largest code of layer `layer`'s activations (0: the input)."""
    return INPUT_LEVELS if layer == 0 else ACTIVATION_LEVELS


def code_dtype(layer: int) -> np.dtype:
    """How layer `layer`'s codes travel: int16 readings, uint8 activations."""
    return CODE_DTYPES[0] if layer == 0 else CODE_DTYPES[1]


@njit(cache=True, nogil=True, inline="always")
def _code(v: np.float32, scale: np.float32, top: int) -> np.float32:
    """The whole number of `scale` nearest v (ties to even), within +-top (0..top for
    a ReLU output, whose values are never negative)."""
    q = np.float32(np.rint(np.float32(v) / scale))
    if q > top:
        return np.float32(top)
    if q < -top:
        return np.float32(-top)
    return q


@njit(cache=True, nogil=True)
def quantize_cell(x: np.ndarray, scale: np.float32, top: int) -> None:
    """One cell's (channels, batch) values replaced by their quantized values
    `float32(code) * scale`, in place (the node executor's: nodes/execute.py)."""
    s = np.float32(scale)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] = _code(x[i, j], s, top) * s


@njit(cache=True, nogil=True)
def quantize_planes(x: np.ndarray, scale: np.float32, top: int) -> None:
    """A layer's (channels, rows, cols, batch) values (a view of the central planes)
    replaced by their quantized values, in place: `quantize_cell`'s arithmetic, cell by
    cell (`kernels.ConvPlanes.forward`)."""
    s = np.float32(scale)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            for k in range(x.shape[2]):
                for m in range(x.shape[3]):
                    x[i, j, k, m] = _code(x[i, j, k, m], s, top) * s


def to_codes(values: np.ndarray, scale: float, layer: int) -> np.ndarray:
    """The codes of quantized values (made by `_code` with this scale): each
    exactly the whole number it was made from (|code| <= 32767 is far within float32's
    exact recovery), in the layer's code dtype."""
    top = levels(layer)
    codes = np.rint(np.asarray(values, np.float32) / np.float32(scale))
    return np.clip(codes, -top if layer == 0 else 0, top).astype(code_dtype(layer))


def from_codes(codes: np.ndarray, scale: float, layer: int) -> np.ndarray | None:
    """The quantized values (float32) of `codes`, computed as their maker computed
    them; None if a code is outside the layer's range (-32768 of int16: never made)."""
    if codes.dtype == np.int16 and codes.size and int(codes.min()) < -INPUT_LEVELS:
        return None
    return codes.astype(np.float32) * np.float32(scale)


def scale_of(peak: float, layer: int) -> np.float32:
    """A layer's scale from the largest |value| it should represent (a layer that is
    0 throughout gets the scale of 1: any code it makes is 0 anyway)."""
    peak = float(peak)
    return np.float32(peak / levels(layer) if peak > 0 and np.isfinite(peak) else
                      1.0 / levels(layer))


def calibration_batch(model, limit: int = 1000) -> int:
    """Maps a calibration pass runs at once: at most `limit`, and no more than hold
    about `CALIBRATION_BATCH_BYTES` of one layer's float32 activations (at 100 x 100
    a batch of 1,000 held 640 MB a layer and `simulate live --activations int8-static`
    peaked at 3.8 GB)."""
    cfg = model.config
    per_map = cfg.rows * cfg.cols * max(cfg.filters, cfg.in_channels) * 4
    return max(1, min(limit, CALIBRATION_BATCH_BYTES // per_map))


def calibrate_scales(model, X: np.ndarray, batch: int | None = None,
                     percentile: float = 100.0) -> np.ndarray:
    """The scales (conv_layers + 1, float32) of `model` on maps X (the training
    split): each layer's `percentile` of |activation| over every cell and sample (100:
    the maximum, over every map), over its levels; a percentile below 100 of a ReLU
    layer is over its positive values, on the first `PERCENTILE_MAPS` maps (every value
    is held at once). Runs the float32 forward pass, `batch` maps at a time (default:
    `calibration_batch`)."""
    layers = model.config.conv_layers + 1
    batch = batch or calibration_batch(model)
    if percentile >= 100.0:
        peaks = np.zeros(layers)
        for start in range(0, len(X), batch):
            trace = model.forward_trace(model.to_batch_last(X[start:start + batch]))
            for layer, act in enumerate(trace.activations):
                peaks[layer] = max(peaks[layer], float(np.abs(act).max()))
    else:
        X = X[:PERCENTILE_MAPS]
        samples: list[list[np.ndarray]] = [[] for _ in range(layers)]
        for start in range(0, len(X), batch):
            trace = model.forward_trace(model.to_batch_last(X[start:start + batch]))
            for layer, act in enumerate(trace.activations):
                a = np.abs(act).reshape(-1)
                samples[layer].append(a if layer == 0 else a[a > 0])
        peaks = np.array([np.percentile(np.concatenate(s), percentile) if
                          sum(x.size for x in s) else 0.0 for s in samples])
    return np.array([scale_of(p, layer) for layer, p in enumerate(peaks)], np.float32)
