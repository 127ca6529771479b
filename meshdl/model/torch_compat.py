"""The equivalent PyTorch model, for cross-checks and benchmarks (PyTorch is optional).

`torch_sequential(config)` builds `torch.nn.Sequential` with the module names that make
meshdl's parameter names line up (`conv1`, ..., `fc1`, `fc2`), so
`net.load_state_dict(npz_state_dict("model.npz"))` works directly. Normalization
constants are not part of the network: apply (x - norm.mean) / norm.std first. A model
with the alive mask (`ModelConfig.alive`) reads it as its last input channel: 1 at a
live cell, and a dead cell's whole input (readings and mask) 0 after normalizing.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.config import ModelConfig
from meshdl.errors import MeshdlError


def import_torch() -> Any:
    """PyTorch, or a clear error saying how to get the CPU build."""
    try:
        import torch
    except ImportError:
        raise MeshdlError("PyTorch is not installed (pip install torch==2.13.0)") from None
    return torch


def torch_sequential(config: ModelConfig) -> Any:
    """torch.nn.Sequential equal to meshdl's CNN for `config` (same names and shapes);
    MeshdlError for a model with a position bias, which no stock layer adds."""
    if config.position_bias:
        raise MeshdlError("a model with a position bias has no torch.nn.Sequential twin "
                          "(no stock layer adds a bias per cell)")
    nn = import_torch().nn
    layers: OrderedDict[str, Any] = OrderedDict()
    for layer in range(1, config.conv_layers + 1):
        c_in = config.in_channels if layer == 1 else config.filters
        layers[f"conv{layer}"] = nn.Conv2d(c_in, config.filters, config.kernel, padding="same")
        layers[f"relu{layer}"] = nn.ReLU()
    layers["pool"] = nn.AdaptiveMaxPool2d(1) if config.global_pool else \
        nn.MaxPool2d(config.window, ceil_mode=True)
    layers["flatten"] = nn.Flatten()
    layers["fc1"] = nn.Linear(config.features, config.hidden)
    layers["fc1_relu"] = nn.ReLU()
    layers["fc2"] = nn.Linear(config.hidden, config.classes)
    return nn.Sequential(layers)


def npz_state_dict(path: str | Path) -> dict[str, Any]:
    """The network parameters of a model.npz as a PyTorch state_dict."""
    torch = import_torch()
    with np.load(path, allow_pickle=False) as npz:
        return {name: torch.from_numpy(npz[name].copy()) for name in npz.files
                if name.endswith((".weight", ".bias"))}
