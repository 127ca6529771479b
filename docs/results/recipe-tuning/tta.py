"""A saved model read on each map in its four mirror orientations, logits averaged
(test-time augmentation): as tune.py reads a model (the test split clean, and with 10 /
20 % of the cells dead for fault seeds 0-9), the dead cells mirrored with the map. Under
global pooling a mirrored map read with the filters is the map read with the mirrored
filters, so in a mesh this is one model with four filter banks (4 x the filters), not
four waves; here it is read as four passes. Beside it, the model alone, paired.

Usage: tta.py DATA_SEED MAPS MODEL.npz
One JSON line on stdout.
"""
import json
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ds, maps, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = load_run_config(mode="central", data_maps=maps, model={"pool": "global"},
                      data={"seed": ds, "train": maps})
data = generate_lounge(cfg.data)
X, y = data.X_test, data.y_test
model = CNN.load(path)
rows, cols = model.config.rows, model.config.cols


def flips(ud: bool, lr: bool):
    def maps_of(A: np.ndarray) -> np.ndarray:
        A = A[..., ::-1, :] if ud else A
        return np.ascontiguousarray(A[..., ::-1] if lr else A)

    def cells_of(cells: set) -> set:
        return {((rows - 1 - r) if ud else r, (cols - 1 - c) if lr else c) for r, c in cells}

    return maps_of, cells_of


def read(cells: set) -> tuple[float, float]:
    total, alone = 0.0, 0.0
    for ud in (False, True):
        for lr in (False, True):
            maps_of, cells_of = flips(ud, lr)
            logits = model.forward(maps_of(X), cell_numbers(cells_of(cells), cols) if cells
                                   else None)
            if not ud and not lr:
                alone = float(np.mean(logits.argmax(axis=1) == y))
            total = total + logits
    return alone, float(np.mean(total.argmax(axis=1) == y))


record: dict = {"data_seed": ds, "model": path}
record["clean_alone"], record["clean"] = read(set())
for share in (0.1, 0.2):
    reads = [read(set(dead_cells(rows, cols, share, s))) for s in range(10)]
    record[f"dead_{share}_alone"] = float(np.mean([r[0] for r in reads]))
    record[f"dead_{share}"] = float(np.mean([r[1] for r in reads]))
    for key in ("", "_alone"):
        record[f"lost_{share}{key}"] = round(
            100 * (record[f"clean{key}"] - record[f"dead_{share}{key}"]), 2)
print(json.dumps(record), flush=True)
