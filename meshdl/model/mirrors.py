"""A global-pool model read in its four mirror orientations at once, as one model.

The label rule is symmetric under both flips (meshdl/data/augment.py), and the global
head trains on the mirrored maps, so reading a map in its four orientations and
averaging the logits (test-time augmentation) is a better guess than one reading when
cells are dead: docs/results/recipe-tuning/README.md measures it. A mesh cannot flip a
map (a node would need the reading of its mirror cell, across the grid), but under
global pooling it need not: flipping the map is flipping every filter,

    conv(flip(x), W) = flip(conv(x, flip(W)))    (odd k: 'same' padding is symmetric)

ReLU and zeroing dead cells commute with the flip, and each channel's maximum over the
whole grid does not see it. So the four readings are one model on the map as it is:
four banks of filters (bank o holds every conv layer's filters flipped as orientation o
flips the map; a layer reads only its own bank's channels of the layer below), four
copies of the hidden layer, and fc2 the mean of the four. `mirror_banks` builds it with
the stock layers (block-diagonal weights, zeros between the banks), so it runs as any
model does: centrally, in the virtual mesh, over MQTT, with the same cells left out.
It costs what four models cost (4 x the filters: 4 x a halo's values, and conv2 reads
all 4 x 16 channels, zeros included), and it is for inference: a trained model's
banks, not a model to train on. The banks equal the four readings in float32 and under
int8-static (once calibrated: their scales are those of the model calibrated on all
four orientations, not the model's own); under `--activations int8` one message's scale
covers the four banks, so there they only come near them. A position bias stays where
it is in every bank: the head trained with it flipping with each mirrored map, so its
reading o is the map and the room flipped together (`cnn.oriented_position`).
"""

from __future__ import annotations

import numpy as np
from pydantic import ValidationError

from meshdl.config import ModelConfig
from meshdl.data.augment import FLIPS, flip
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN

# Bank o reads the map in orientation o of `augment.FLIPS` (the training view's order,
# the first as it is): conv weights (out, in, k, k) flip as the map would, on their
# last two axes (`augment.flip`).


def mirror_banks(model: CNN) -> CNN:
    """`model` reading every map in its four mirror orientations, logits averaged, as
    one model of 4 x the filters and 4 x the hidden units (see the module docstring).
    UsageError unless the model pools globally (a windowed pooling sees where a
    feature is) and its kernel is odd (an even one pads one side more)."""
    cfg = model.config
    if not cfg.global_pool:
        raise UsageError("mirror banks need a global-pool model (pool = 'global'): a "
                         "windowed pooling keeps where each feature is, which a flip moves")
    if cfg.kernel % 2 == 0:
        raise UsageError(f"mirror banks need an odd kernel ({cfg.kernel}: 'same' padding "
                         "puts more zeros on one side, which a flip moves)")
    banks = len(FLIPS)
    f, hidden = cfg.filters, cfg.hidden
    try:  # validated: a model file must load back
        wide = ModelConfig.model_validate({**cfg.model_dump(), "filters": banks * f,
                                           "hidden": banks * hidden})
    except ValidationError as exc:
        detail = exc.errors()[0]
        raise UsageError(f"mirror banks of this model exceed what a model may hold: "
                         f"{detail['loc'][0]}: {detail['msg']}") from None
    out = CNN(wide)
    p, q = model.params, out.params
    out.flat[...] = 0.0  # (q views it) the zeros between the banks
    for o, (ud, lr) in enumerate(FLIPS):
        rows = slice(o * f, (o + 1) * f)
        for layer in range(1, cfg.conv_layers + 1):
            weight = flip(p[f"conv{layer}.weight"], ud, lr)
            inputs = slice(None) if layer == 1 else rows  # its own bank's channels
            q[f"conv{layer}.weight"][rows, inputs] = weight
            q[f"conv{layer}.bias"][rows] = p[f"conv{layer}.bias"]
        units = slice(o * hidden, (o + 1) * hidden)
        q["fc1.weight"][units, rows] = p["fc1.weight"]
        q["fc1.bias"][units] = p["fc1.bias"]
        q["fc2.weight"][:, units] = p["fc2.weight"] / np.float32(banks)
        if "position" in p:  # as trained: the room flips with the map, so in the map's
            q["position"][rows] = p["position"]  # frame the installations stay put
    q["fc2.bias"][...] = p["fc2.bias"]
    out.norm_mean, out.norm_std = model.norm_mean.copy(), model.norm_std.copy()
    # No int8 scales: the model's were calibrated on the maps as they are, and the banks
    # read the four orientations, whose ranges are wider (`meshdl calibrate` the banks).
    return out
