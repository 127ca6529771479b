"""Saved models of one data seed read every way this file knows, on the same maps and
dead cells as tune.py (the test split clean, and with 10 / 20 % of the cells dead for
fault seeds 0-9, the cells `meshdl evaluate --dead` kills):

  alone     each model as it is
  banks     each model's mirror banks (`meshdl mirror-banks`: its four mirror readings,
            logits averaged; read here as four passes with the map and its dead cells
            flipped, which equal the banks' one pass to float rounding:
            tests/test_mirror_banks.py)
  pairs     each pair of models, logits averaged (one model of their filters side by
            side, block-diagonal weights); pairs_banks the same of their banks
  all       every model given, logits averaged; all_banks the same of their banks

Usage: readouts.py DATA_SEED MAPS MODEL.npz [MODEL.npz ...]
One JSON line on stdout: per way, its reads (clean, dead_0.1, dead_0.2, lost_0.1,
lost_0.2), a list where the way has several members.
"""
import itertools
import json
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.model.mirrors import ORIENTATIONS
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ds, maps, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
cfg = load_run_config(mode="central", data_maps=maps, model={"pool": "global"},
                      data={"seed": ds, "train": maps})
data = generate_lounge(cfg.data)
X, y = data.X_test, data.y_test
models = [CNN.load(p) for p in paths]
rows, cols = models[0].config.rows, models[0].config.cols
masks = {"clean": [set()]}
for share in (0.1, 0.2):
    masks[f"dead_{share}"] = [set(dead_cells(rows, cols, share, s)) for s in range(10)]


def logits(model: CNN, cells: set, up_down: bool, left_right: bool) -> np.ndarray:
    A = X[..., ::-1, :] if up_down else X
    A = np.ascontiguousarray(A[..., ::-1] if left_right else A)
    flipped = {(rows - 1 - r if up_down else r, cols - 1 - c if left_right else c)
               for r, c in cells}
    return model.forward(A, cell_numbers(flipped, cols) if flipped else None).astype(np.float64)


# every model's logits, alone and as banks, for every mask: (model, read, mask) -> logits
alone: dict = {}
banks: dict = {}
for m, model in enumerate(models):
    for read, cell_sets in masks.items():
        for k, cells in enumerate(cell_sets):
            each = [logits(model, cells, ud, lr) for ud, lr in ORIENTATIONS]
            alone[m, read, k] = each[0]
            banks[m, read, k] = np.mean(each, axis=0)


def reads(table: dict, members: tuple[int, ...]) -> dict:
    out = {}
    for read, cell_sets in masks.items():
        accs = [float(np.mean(np.mean([table[m, read, k] for m in members], axis=0)
                              .argmax(axis=1) == y)) for k in range(len(cell_sets))]
        out[read] = round(float(np.mean(accs)), 6)
    for share in (0.1, 0.2):
        out[f"lost_{share}"] = round(100 * (out["clean"] - out[f"dead_{share}"]), 3)
    return out


n = len(models)
pairs = list(itertools.combinations(range(n), 2))
record = {"data_seed": ds, "models": paths,
          "alone": [reads(alone, (m,)) for m in range(n)],
          "banks": [reads(banks, (m,)) for m in range(n)],
          "pairs": [reads(alone, p) for p in pairs],
          "pairs_banks": [reads(banks, p) for p in pairs],
          "all": reads(alone, tuple(range(n))), "all_banks": reads(banks, tuple(range(n)))}
print(json.dumps(record), flush=True)
