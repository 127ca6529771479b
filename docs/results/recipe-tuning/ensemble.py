"""Two or more saved models of one data seed read as one: their logits averaged (what one
model with their filters side by side and block-diagonal weights computes), read as
tune.py reads a model (the test split clean, and with 10 / 20 % of the cells dead for
fault seeds 0-9, the cells `meshdl evaluate --dead` kills). Beside the ensemble, each
member alone, so that the two are paired on the same maps and masks.

Usage: ensemble.py DATA_SEED MAPS MODEL.npz MODEL.npz [...]
One JSON line on stdout.
"""
import json
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ds, maps, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
cfg = load_run_config(mode="central", data_maps=maps, model={"pool": "global"},
                      data={"seed": ds, "train": maps})
data = generate_lounge(cfg.data)
X, y = data.X_test, data.y_test
models = [CNN.load(p) for p in paths]


def read(failout: np.ndarray | None) -> tuple[list[float], float]:
    logits = [m.forward(X, failout) for m in models]
    alone = [float(np.mean(z.argmax(axis=1) == y)) for z in logits]
    return alone, float(np.mean(np.mean(logits, axis=0).argmax(axis=1) == y))


record: dict = {"data_seed": ds, "models": paths}
alone, joint = read(None)
record["clean"], record["clean_alone"] = joint, alone
for share in (0.1, 0.2):
    reads = [read(cell_numbers(dead_cells(17, 25, share, s), 25)) for s in range(10)]
    record[f"dead_{share}"] = float(np.mean([r[1] for r in reads]))
    record[f"dead_{share}_alone"] = [float(np.mean([r[0][i] for r in reads]))
                                     for i in range(len(models))]
    record[f"lost_{share}"] = round(100 * (record["clean"] - record[f"dead_{share}"]), 2)
    record[f"lost_{share}_alone"] = [round(100 * (c - d), 2) for c, d in
                                     zip(alone, record[f"dead_{share}_alone"], strict=True)]
print(json.dumps(record), flush=True)
