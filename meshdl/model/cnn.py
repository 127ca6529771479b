"""The seed CNN, whole: parameters, forward, backward, save and load.

    conv1(k,h) -> ReLU -> ... -> convL(k,h) -> ReLU -> max-pool (ceil) -> flatten (c,row,col)
    -> fc1(hidden) -> ReLU -> fc2(classes) -> softmax cross-entropy (mean over the batch)

With `pool = "global"` the max-pool is each channel's maximum over the grid
(meshdl/model/globalpool.py) and fc1 reads `filters` features.

Parameter names and shapes are PyTorch's (`conv1.weight (h, c_in, k, k)` ... `fc2.bias`),
so `model.npz` loads into an equivalent `torch.nn.Sequential` directly. All parameters
live in one flat float32 vector (`model.flat`) that `model.params` views by name: the
optimizer updates it in one kernel call and the mesh edge ships it as one array.

Inputs may be normalized by fixed constants (`norm.mean`, `norm.std`, one per input
channel, stored in model.npz): x' = (x - mean) / std before conv1 and nothing else,
so each sensor node can normalize its own reading alone.

With `alive` the last input channel is the alive mask: 1 at a live cell, and 0 at a
dead one because a dead cell's whole input is zeroed (failout, `forward_trace`). Its
constants are always mean 0, std 1, so the 1 reaches conv1 as it is; maps given
without it (the readings alone) get it here, as a live node appends it to its reading.

With `position_bias` the last conv layer adds `position` (h, rows, cols), a learned bias
per filter and cell, before its ReLU: a filter shared by every cell cannot know that a
dead cell beside a socket is likelier to hide a heater than one in mid-floor (the
lounge's anomalies come from fixed sockets, doors and diffusers). It starts at 0 (the
plain model), sits last in the flat vector, and, while training on mirrors, flips with
each map (`oriented_position`): the room's installations move with the mirror.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshdl.config import ModelConfig, param_shapes
from meshdl.data.augment import FLIPS, flip
from meshdl.data.npzfile import read_npz
from meshdl.errors import ModelFileError, UsageError
from meshdl.model import kernels
from meshdl.model.globalpool import GlobalPlanes


def views(flat: np.ndarray, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Named, shaped views into one flat vector laid out as `shapes` says."""
    out, start = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        out[name] = flat[start : start + size].reshape(shape)
        start += size
    return out


def fan_in(name: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Inputs feeding one unit of the layer owning `name` (PyTorch's init bound)."""
    weight = shapes[name.rsplit(".", 1)[0] + ".weight"]
    return math.prod(weight[1:])


def _check_orientation(orientation: np.ndarray) -> None:
    """A map's mirror is one of `augment.FLIPS` (0-3); the room's installations flip
    with the map, so the position bias does too."""
    if orientation.size and not (orientation.min() >= 0 and orientation.max() < len(FLIPS)):
        raise UsageError(f"a map's mirror orientation is 0-{len(FLIPS) - 1}")


def oriented_position(position: np.ndarray, orientation: np.ndarray) -> np.ndarray:
    """The position bias (h, rows, cols) as each map of a batch sees it, (h, rows, cols,
    B): flipped as map b was (`orientation[b]`, 0-3)."""
    _check_orientation(orientation)
    out = np.empty((*position.shape, len(orientation)), np.float32)
    for o, (up_down, left_right) in enumerate(FLIPS):
        pick = orientation == o
        if pick.any():
            out[..., pick] = flip(position, up_down, left_right)[..., None]
    return out


def position_gradient(top: np.ndarray, orientation: np.ndarray, out: np.ndarray) -> None:
    """d(loss)/d(position) from the last layer's d(pre-activation) (h, rows, cols, B)
    of maps in mirror `orientation`: each map's share flipped back to the room's frame
    (a flip is its own inverse)."""
    _check_orientation(orientation)
    out[...] = 0.0
    for o, (up_down, left_right) in enumerate(FLIPS):
        pick = orientation == o
        if pick.any():
            out += flip(top[..., pick].sum(axis=-1), up_down, left_right)


@dataclass
class Trace:
    """What the forward pass keeps for the backward pass (batch-last arrays).

    A trace from `forward_trace` views the model's buffers for its batch size (see
    `kernels.ConvPlanes`, reused from step to step): it stays valid until the next
    `forward_trace` of the same model with the same batch size, so one model must not
    run passes from several threads at once (two models share nothing).
    """

    activations: list[np.ndarray]  # input (normalized), then relu(conv_l) for each layer
    pooled: np.ndarray  # (h, PH, PW, B)
    winners: np.ndarray  # window index of each pooled max, int8 (global: cell number, int32)
    hidden: np.ndarray  # relu(fc1), (hidden, B)
    logits: np.ndarray  # (classes, B)
    planes: kernels.ConvPlanes | None = None  # the conv stack's buffers, for conv_backward


class CNN:
    """The seed network on Numba kernels; see the module docstring for the conventions."""

    def __init__(self, config: ModelConfig, seed: int = 0) -> None:
        self.config = config
        self.shapes = param_shapes(config)
        self.flat = np.zeros(sum(math.prod(s) for s in self.shapes.values()), np.float32)
        self.params = views(self.flat, self.shapes)
        self.norm_mean = np.zeros(config.in_channels, np.float32)
        self.norm_std = np.ones(config.in_channels, np.float32)
        # Static int8 inference (meshdl/model/quantize.py): each activation layer's scale, the
        # input's first, fixed after training (`calibrate`); None: not calibrated.
        self.act_scales: np.ndarray | None = None
        self._grad_flat = np.zeros_like(self.flat)
        self._plane_cache: dict[int, kernels.ConvPlanes] = {}  # conv buffers per batch size
        self._grads = views(self._grad_flat, self.shapes)
        rng = np.random.default_rng(seed)
        for name, value in self.params.items():
            if name == "position":
                continue  # starts at 0: the model is the plain one until it learns
            # PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
            bound = 1.0 / math.sqrt(fan_in(name, self.shapes))
            value[...] = rng.uniform(-bound, bound, value.shape)

    # ----------------------------------------------------------------- inputs
    def set_normalization(self, mean: np.ndarray | float, std: np.ndarray | float) -> None:
        """Fix the input normalization constants (per input channel)."""
        c = self.config.in_channels
        mean_arr = np.broadcast_to(np.asarray(mean, np.float32), (c,)).copy()
        std_arr = np.broadcast_to(np.asarray(std, np.float32), (c,)).copy()
        if not np.all(np.isfinite(mean_arr)) or not np.all(std_arr > 0):
            raise UsageError(f"normalization needs finite mean and std > 0, got {mean}, {std}")
        if self.config.alive:  # the mask is 1 or 0 as it is: never normalized
            mean_arr[-1], std_arr[-1] = 0.0, 1.0
        self.norm_mean, self.norm_std = mean_arr, std_arr

    def with_alive(self, X: np.ndarray) -> np.ndarray:
        """Maps as this model reads them: with `alive`, readings alone ((B, rows, cols)
        or (B, readings, rows, cols)) get the alive mask, 1 at every cell, as their last
        channel (a dead cell's is zeroed with its readings); anything else as given."""
        cfg = self.config
        X = np.asarray(X)
        lacks = (X.ndim == 3 and cfg.readings == 1) or \
            (X.ndim == 4 and X.shape[1] == cfg.readings)
        if not cfg.alive or not lacks or not np.issubdtype(X.dtype, np.number):
            return X
        out = np.ones((X.shape[0], cfg.in_channels, *X.shape[-2:]), np.float32)
        out[:, : cfg.readings] = X.reshape(out[:, : cfg.readings].shape)
        return out

    def to_batch_last(self, X: np.ndarray) -> np.ndarray:
        """Check X (B,rows,cols) or (B,c,rows,cols) and return normalized (c,rows,cols,B)
        (with `alive`, the readings alone get the mask: `with_alive`)."""
        cfg = self.config
        X = self.with_alive(X)
        if X.ndim == 3 and cfg.in_channels == 1:
            X = X[:, None]
        expected = ("B", cfg.in_channels, cfg.rows, cfg.cols)
        if X.ndim != 4 or X.shape[1:] != expected[1:] or X.shape[0] < 1:
            raise UsageError(f"input shape {X.shape} does not fit the model, expected {expected}")
        if not np.issubdtype(X.dtype, np.number):
            raise UsageError(f"input holds non-numeric readings ({X.dtype})")
        x = np.empty((cfg.in_channels, cfg.rows, cfg.cols, X.shape[0]), np.float32)
        if not kernels.normalize_batch_last(np.asarray(X, np.float32), self.norm_mean,
                                            self.norm_std, x):
            raise UsageError("input holds NaN or inf readings")
        return x

    # ---------------------------------------------------------------- forward
    def forward_trace(self, x: np.ndarray, failout: np.ndarray | None = None,
                      quantized: bool = False, orientation: np.ndarray | None = None
                      ) -> Trace:
        """Forward pass on batch-last, normalized input (c,rows,cols,B), keeping a trace.
        `failout`: cells (row x cols + col) with no reading and no output, zeros in every
        layer (meshdl/training/failout.py). `quantized`: the central int8 emulation, each
        activation quantized where it is made by the calibrated `act_scales` (what a mesh
        under `--activations int8-static` computes; inference only). `orientation` (B,)
        of 0-3 (`augment.ORIENTATIONS`): each map's mirror while training on mirrors,
        which the position bias follows (`oriented_position`)."""
        cfg, p = self.config, self.params
        planes = self._planes(x.shape[-1])
        layers = range(1, cfg.conv_layers + 1)
        weights = [p[f"conv{n}.weight"] for n in layers]
        dead = None
        if failout is not None and len(failout):
            dead = np.divmod(np.asarray(failout, np.intp), cfg.cols)
            x[:, dead[0], dead[1]] = 0.0
        position = p.get("position")
        if position is not None and orientation is not None:
            position = oriented_position(position, orientation)
        planes.forward(x, weights, [p[f"conv{n}.bias"] for n in layers], dead,
                       self.scales_for_inference() if quantized else None, position)
        trace = self.head_forward(planes.pooled)
        trace.activations, trace.winners, trace.planes = list(planes.views), planes.winners, planes
        return trace

    def _planes(self, batch: int) -> kernels.ConvPlanes:
        """This model's conv buffers for `batch` samples (the last few sizes are kept)."""
        cache = self._plane_cache
        planes = cache.pop(batch, None)
        if planes is None:
            cfg = self.config
            if cfg.global_pool:
                planes = GlobalPlanes(cfg.rows, cfg.cols, batch, cfg.kernel, cfg.in_channels,
                                      cfg.filters, cfg.conv_layers)
            else:
                planes = kernels.ConvPlanes(cfg.rows, cfg.cols, batch, cfg.kernel,
                                            cfg.in_channels, cfg.filters, cfg.conv_layers,
                                            cfg.window)
            while len(cache) >= 3:  # e.g. training batch, last partial batch, evaluation
                cache.pop(next(iter(cache)))
        cache[batch] = planes  # most recently used last
        return planes

    def forward(self, X: np.ndarray, failout: np.ndarray | None = None,
                quantized: bool = False) -> np.ndarray:
        """Logits (B, classes) for X of shape (B,rows,cols) or (B,c_in,rows,cols);
        `failout`: cells read as dead, `quantized`: int8 emulation (`forward_trace`)."""
        trace = self.forward_trace(self.to_batch_last(X), failout, quantized)
        return np.ascontiguousarray(trace.logits.T)

    def predict(self, X: np.ndarray, failout: np.ndarray | None = None,
                quantized: bool = False) -> np.ndarray:
        """Predicted class per sample (int64)."""
        return self.forward(X, failout, quantized).argmax(axis=1).astype(np.int64)

    def scales_for_inference(self) -> np.ndarray:
        """The calibrated activation scales; UsageError if the model has none."""
        if self.act_scales is None:
            raise UsageError("the model has no int8 activation scales: calibrate it "
                             "(`meshdl calibrate MODEL DATA`, or train it again)")
        return self.act_scales

    def calibrate(self, X: np.ndarray, percentile: float = 100.0) -> np.ndarray:
        """Fix the int8 activation scales from maps X (the training split): each
        layer's largest |value| (or `percentile`) of the float32 forward pass."""
        from meshdl.model.quantize import calibrate_scales

        self.act_scales = calibrate_scales(self, X, percentile=percentile)
        return self.act_scales

    # --------------------------------------------------------------- backward
    def loss_and_grads(self, X: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy of the batch and its gradient for every parameter.

        The returned dict views an internal buffer that the next call overwrites;
        copy it to keep it.
        """
        loss, _ = self.gradient_pass(X, y)
        return loss, self._grads

    def gradient_pass(self, X: np.ndarray, y: np.ndarray, failout: np.ndarray | None = None,
                      orientation: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """Forward and backward of one batch: (loss, logits (B, classes)); `failout`: the
        cells acting dead in it, `orientation`: each map's mirror (`forward_trace`).

        Fills `grad_flat` (the flat gradient, laid out like `flat`), which the next call
        overwrites.
        """
        x = self.to_batch_last(X)
        labels = self.check_labels(y, x.shape[-1])
        trace = self.forward_trace(x, failout, orientation=orientation)
        dlogits = np.empty_like(trace.logits)
        loss = kernels.softmax_cross_entropy(trace.logits, labels, dlogits)
        dfeatures = self.head_backward(trace, dlogits)
        self.conv_backward(trace, dfeatures, orientation)
        return float(loss), np.ascontiguousarray(trace.logits.T)

    @property
    def grad_flat(self) -> np.ndarray:
        """The gradient buffer of the last backward pass, laid out like `flat`."""
        return self._grad_flat

    def head_forward(self, pooled: np.ndarray) -> Trace:
        """fc1 -> ReLU -> fc2 on pooled features (h, PH, PW, B): what the mesh edge runs."""
        p = self.params
        features = pooled.reshape(self.config.features, pooled.shape[-1])
        hidden = p["fc1.weight"] @ features
        kernels.bias_relu(hidden, p["fc1.bias"])
        logits = p["fc2.weight"] @ hidden
        logits += p["fc2.bias"][:, None]
        return Trace([], pooled, np.empty(0, np.int8), hidden, logits)

    def check_labels(self, y: np.ndarray, batch: int) -> np.ndarray:
        """Labels as int64 in [0, classes), one per sample."""
        labels = np.asarray(y)
        if labels.shape != (batch,) or not np.issubdtype(labels.dtype, np.integer):
            raise UsageError(f"labels must be {batch} integers, got shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= self.config.classes):
            raise UsageError(f"labels must lie in [0, {self.config.classes})")
        return labels.astype(np.int64)

    def head_backward(self, trace: Trace, dlogits: np.ndarray,
                      overwrite: bool = False) -> np.ndarray:
        """Gradients of fc2 and fc1 into the grad buffer; returns dL/d(pooled) batch-last.

        `overwrite` (the mesh edge's memory plan, seed 002): each layer's weight gradient
        is taken first, after which its input is dead, so the input gradient is written
        over it: d(hidden) over `trace.hidden` (only which units passed the ReLU is kept,
        a byte each) and d(pooled) over `trace.pooled`, which is returned. The values are
        the same bits either way; the trace is spent."""
        p, g = self.params, self._grads
        # Written over only where a reshape is a view (the edge's own, contiguous arrays).
        overwrite = overwrite and trace.pooled.flags.c_contiguous and \
            trace.hidden.flags.c_contiguous
        np.matmul(dlogits, trace.hidden.T, out=g["fc2.weight"])
        g["fc2.bias"][...] = dlogits.sum(axis=1, dtype=np.float64)  # terms nearly cancel
        if overwrite:
            passed = trace.hidden > 0
            dhidden = np.matmul(p["fc2.weight"].T, dlogits, out=trace.hidden)
            kernels.masked_grad_and_sum(dhidden, passed, g["fc1.bias"])
        else:
            dhidden = p["fc2.weight"].T @ dlogits
            kernels.relu_grad_and_sum(dhidden, trace.hidden, g["fc1.bias"])
        features = trace.pooled.reshape(self.config.features, -1)
        if features.shape[1] == 1:  # numpy's matmul takes a slow path for an outer product
            np.multiply(dhidden, features.T, out=g["fc1.weight"])
        else:
            np.matmul(dhidden, features.T, out=g["fc1.weight"])
        if overwrite:
            np.matmul(p["fc1.weight"].T, dhidden, out=features)
            return trace.pooled
        return (p["fc1.weight"].T @ dhidden).reshape(trace.pooled.shape)

    def conv_backward(self, trace: Trace, dpooled: np.ndarray,
                      orientation: np.ndarray | None = None) -> None:
        """Gradients of every conv layer (and the position bias) into the grad buffer,
        from dL/d(pooled); `orientation` as in `forward_trace`."""
        cfg, p, g = self.config, self.params, self._grads
        planes = trace.planes
        if planes is None:  # a trace built by hand: lay its arrays out in planes first
            planes = self._planes(trace.pooled.shape[-1])
            for layer, act in enumerate(trace.activations):
                planes.activation(layer)[...] = act
            planes.pooled[...] = trace.pooled
            planes.winners[...] = trace.winners
        layers = range(1, cfg.conv_layers + 1)
        planes.backward(
            dpooled,
            [p[f"conv{n}.weight"] for n in layers],
            [g[f"conv{n}.weight"] for n in layers],
            [g[f"conv{n}.bias"] for n in layers],
            keep_top="position" in g,
        )
        if "position" in g:  # the last layer's d(pre-activation), summed over the batch
            top = planes.top_gradient()
            if orientation is None:
                top.sum(axis=-1, out=g["position"])
            else:
                position_gradient(top, orientation, g["position"])

    def on_grid(self, rows: int, cols: int) -> CNN:
        """This model for a grid of `rows` x `cols`: under global pooling the same
        parameters fit any grid (fc1 reads one feature per filter); a windowed pooling's
        fc1 reads the grid's blocks, so UsageError there unless the grid is this one."""
        cfg = self.config
        if (rows, cols) == (cfg.rows, cfg.cols):
            return self
        if cfg.position_bias:
            raise UsageError(f"the model's position bias holds a value per cell of its "
                             f"{cfg.rows} x {cfg.cols} grid: it cannot run on {rows} x {cols}")
        if not cfg.global_pool:
            raise UsageError(f"the model's fc1 reads the pooled blocks of its "
                             f"{cfg.rows} x {cfg.cols} grid: it cannot run on {rows} x {cols} "
                             "(a model with pool = 'global' runs on any grid)")
        other = CNN(cfg.model_copy(update={"rows": rows, "cols": cols}))
        other.flat[...] = self.flat
        other.norm_mean, other.norm_std = self.norm_mean.copy(), self.norm_std.copy()
        other.act_scales = None if self.act_scales is None else self.act_scales.copy()
        return other

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write model.npz: PyTorch-named parameters, norm.mean/norm.std, and the config."""
        arrays = {name: value.copy() for name, value in self.params.items()}
        arrays["norm.mean"] = self.norm_mean
        arrays["norm.std"] = self.norm_std
        if self.act_scales is not None:  # static int8 inference's (meshdl/model/quantize.py)
            arrays["quant.scales"] = self.act_scales
        arrays["config"] = np.array(self.config.model_dump_json())
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            np.savez(fh, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> CNN:
        """Read a model.npz written by `save`, checking every name, shape and value."""
        path = Path(path)
        arrays = read_npz(path, "model file", ModelFileError)
        if "config" not in arrays:
            raise ModelFileError(f"{path} has no 'config' entry: not a meshdl model")
        try:
            config = ModelConfig.model_validate(json.loads(str(arrays.pop("config"))))
        except ValueError as exc:
            raise ModelFileError(f"{path} has an invalid config: {exc}") from None
        except RecursionError:  # the file's fault, not the request's (cli's mapping of it)
            raise ModelFileError(f"{path} has a config nested too deeply to read") from None
        # Every parameter the config names, at its shape, before the model is built: a
        # config may describe a network of petabytes, the arrays read are bounded.
        for name, shape in param_shapes(config).items():
            if name not in arrays:
                raise ModelFileError(f"{path} lacks parameter {name}")
            if arrays[name].shape != shape:
                raise ModelFileError(
                    f"{path}: {name} has shape {arrays[name].shape}, config needs {shape}"
                )
        model = cls(config)
        for name, value in model.params.items():
            stored = arrays[name]
            if not np.all(np.isfinite(stored)):
                raise ModelFileError(f"{path}: {name} holds NaN or inf")
            value[...] = stored
        try:
            model.set_normalization(arrays.get("norm.mean", 0.0), arrays.get("norm.std", 1.0))
        except (UsageError, ValueError) as exc:
            raise ModelFileError(f"{path}: bad normalization constants ({exc})") from None
        scales = arrays.get("quant.scales")
        if scales is not None:
            if scales.shape != (config.conv_layers + 1,) or \
                    not np.all(np.isfinite(scales)) or not np.all(scales > 0):
                raise ModelFileError(f"{path}: quant.scales must be {config.conv_layers + 1} "
                                     "finite scales > 0")
            model.act_scales = scales.astype(np.float32)
        return model
