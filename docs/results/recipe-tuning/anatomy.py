"""Where saved models lose their maps with 10 % of the cells dead: a TUNING data seed's
test split, fault seeds 0-9 (the cells `meshdl evaluate --dead` kills), each map a model
reads right with every cell alive and wrong with the dead cells sorted by why:

- FN-hidden (true d): a positive whose every pair at or above the threshold has a dead
  cell (the rule read on the live cells calls it negative); d buckets its largest
  difference: 0 = [3.0, 3.3), 1 = [3.3, 3.6), 2 = [3.6, 3.9), 3 = 3.9 and more;
- FN-visible: a positive whose deciding pair is live, called negative all the same;
- FP (seen, hid): a negative called positive, by its largest live difference and its
  largest difference touching a dead cell (each below or at least 2.7 degC);

and, apart, "both" (wrong either way) and "fixed" (wrong alive, right with dead cells).
Counts are maps a fault seed (one map of 561 is 0.18 points).

Usage: anatomy.py DATA_SEED MODEL.npz [MODEL.npz ...]   (models: tune.py with TUNE_SAVE)
"""
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

THRESHOLD = 3.0
ds, paths = int(sys.argv[1]), sys.argv[2:]
if ds >= 100:
    sys.exit("data seeds 100-109 are held out")
cfg = load_run_config(mode="central", model={"pool": "global"},
                      data={"seed": ds, "train": 2400})  # the test split is the same
data = generate_lounge(cfg.data)
X, y = data.X_test.astype(np.float64), data.y_test.astype(bool)
rows, cols = X.shape[1:]
dv, dh = np.abs(np.diff(X, axis=1)), np.abs(np.diff(X, axis=2))
largest = np.maximum(dv.max(axis=(1, 2)), dh.max(axis=(1, 2)))


def kind(i: int, seen: float, hidden: float) -> str:
    if y[i] and seen >= THRESHOLD:
        return "FN-visible"
    if y[i]:
        return f"FN-hidden (true {min(int((largest[i] - THRESHOLD) / 0.3), 3)})"
    return f"FP (seen {'>=' if seen >= 2.7 else '<'}2.7, hid {'>=' if hidden >= 2.7 else '<'}2.7)"


for path in paths:
    model = CNN.load(path)
    right_alive = model.predict(data.X_test) == y
    counts: dict[str, int] = {}
    for seed in range(10):
        cells = dead_cells(rows, cols, 0.1, seed)
        alive = np.ones((rows, cols), bool)
        for r, c in cells:
            alive[r, c] = False
        both_v, both_h = alive[:-1] & alive[1:], alive[:, :-1] & alive[:, 1:]
        seen = np.maximum(np.where(both_v, dv, 0).max(axis=(1, 2)),
                          np.where(both_h, dh, 0).max(axis=(1, 2)))
        hidden = np.maximum(np.where(~both_v, dv, 0).max(axis=(1, 2)),
                            np.where(~both_h, dh, 0).max(axis=(1, 2)))
        right = model.predict(data.X_test, cell_numbers(cells, cols)) == y
        for i in np.flatnonzero(~(right & right_alive)):
            name = ("fixed" if right[i] else "both" if not right_alive[i]
                    else kind(i, seen[i], hidden[i]))
            counts[name] = counts.get(name, 0) + 1
    lost = {k: v / 10 for k, v in sorted(counts.items()) if k not in ("both", "fixed")}
    print(f"{path}: clean {100 * right_alive.mean():.2f} %; maps a fault seed: "
          + ", ".join(f"{k} {v:.1f}" for k, v in lost.items())
          + f"; both {counts.get('both', 0) / 10:.1f}, fixed {counts.get('fixed', 0) / 10:.1f}")
