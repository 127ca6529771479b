"""Held-out accuracy of the data-seed-0 model (training seed 0, default global recipe):
float32 against the central int8 emulation, several calibrations."""
import json
import sys

import numpy as np

from meshdl.data.datasets import load_split
from meshdl.model.cnn import CNN
from meshdl.model.quantize import calibrate_scales

model = CNN.load(sys.argv[1])
X0, _ = load_split("/tmp/int8runs/full/seed0.npz", "train")
variants = {"max (all 40,800 training maps, as trained)": model.act_scales.copy()}
for p in (100.0, 99.999, 99.99, 99.9):
    variants[f"p{p} (first 2,400 training maps)"] = calibrate_scales(model, X0[:2400], percentile=p)
del X0
def acc(X, y, scales):
    if scales is None:
        return float(np.mean(model.predict(X) == y))
    model.act_scales = scales
    return float(np.mean(model.predict(X, quantized=True) == y))
rows = {}
for name, path in [("val: seed 0 test", "/tmp/int8runs/full/seed0.npz")] + \
        [(f"seed {s}", f"/tmp/int8runs/data/seed{s}.npz") for s in range(100, 110)]:
    X, y = load_split(path, "test")
    rows[name] = {"float32": acc(X, y, None), **{v: acc(X, y, sc) for v, sc in variants.items()}}
    print(name, rows[name], flush=True)
held = [r for k, r in rows.items() if k.startswith("seed")]
summary = {k: float(np.mean([r[k] for r in held])) for k in held[0]}
print(json.dumps({"scales": {k: v.tolist() for k, v in variants.items()}, "rows": rows,
                  "held_out_mean": summary}, indent=1))
