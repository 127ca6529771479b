"""What dead cells hide from any model: for each tuning data seed's test split and
fault seeds 0-9 (the cells `meshdl evaluate --dead` kills), the share of the maps
that are positive while every live 4-neighbour pair differs by less than the threshold
(hidden positives: the rule read on the live cells alone calls them negative), and the
negatives whose largest live difference lies within 0.3 degC below it. TUNING data
seeds only.

Usage: hidden.py DATA_SEED [DATA_SEED ...]
"""
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.sim.faults.dead import dead_cells

seeds = [int(s) for s in sys.argv[1:]]
if any(s >= 100 for s in seeds):
    sys.exit("data seeds 100-109 are held out")
print("| data seed | positives | hidden positives at 10 % (points) | at 20 % | "
      "near-threshold negatives at 10 % | at 20 % |")
print("| --- | --- | --- | --- | --- | --- |")
for ds in seeds:
    cfg = load_run_config(mode="central", model={"pool": "global"},
                          data={"seed": ds, "train": 2400})  # the test split is the same
    data = generate_lounge(cfg.data)
    X, y = data.X_test.astype(np.float64), data.y_test.astype(bool)
    thr = cfg.data.threshold
    rows, cols = X.shape[1:]
    row = []
    for share in (0.1, 0.2):
        hid, near = [], []
        for s in range(10):
            alive = np.ones((rows, cols), bool)
            for r, c in dead_cells(rows, cols, share, s):
                alive[r, c] = False
            dv = np.where(alive[:-1] & alive[1:], np.abs(X[:, 1:] - X[:, :-1]), 0)
            dh = np.where(alive[:, :-1] & alive[:, 1:], np.abs(X[:, :, 1:] - X[:, :, :-1]), 0)
            seen = np.maximum(dv.max(axis=(1, 2)), dh.max(axis=(1, 2)))
            hid.append(np.mean(y & (seen < thr)))
            near.append(np.mean(~y & (seen >= thr - 0.3)))
        row.append((100 * np.mean(hid), 100 * np.mean(near)))
    print(f"| {ds} | {100 * y.mean():.1f} % | {row[0][0]:.2f} | {row[1][0]:.2f} | "
          f"{row[0][1]:.2f} | {row[1][1]:.2f} |")
