"""Positives that saved models miss only with 10 % of the cells dead although a pair at
or above the threshold stays live: how far (Chebyshev, in cells) that pair lies from the
nearest dead cell, per read, and whether the map is missed again with only the dead
cells farther than 2 cells from every deciding cell.

Usage: live_pair_misses.py LABEL DATA_SEED[,DATA_SEED...] [MODELS_DIR]
(reads MODELS_DIR/LABEL_dDS_t0.npz; MODELS_DIR defaults to models/ beside this script)
"""
import sys
from pathlib import Path

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ROWS, COLS = 17, 25
rr, cc = np.mgrid[:ROWS, :COLS]


def deciding_pairs(x: np.ndarray) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The 4-neighbour pairs of one map that differ by at least 3 degC."""
    down = np.argwhere(np.abs(np.diff(x, axis=0)) >= 3)
    across = np.argwhere(np.abs(np.diff(x, axis=1)) >= 3)
    return [((r, c), (r + 1, c)) for r, c in down] + [((r, c), (r, c + 1)) for r, c in across]


label, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
models = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).parent / "models"
distance = np.zeros(6)
again = checked = reads = 0
for ds in seeds:
    cfg = load_run_config(mode="central", model={"pool": "global"}, data={"seed": ds})
    data = generate_lounge(cfg.data)
    X, y = data.X_test, data.y_test
    model = CNN.load(models / f"{label}_d{ds}_t0.npz")
    clean = model.predict(X)
    for seed in range(10):
        reads += 1
        cells = cell_numbers(dead_cells(ROWS, COLS, 0.1, seed), COLS)
        dead = np.zeros(ROWS * COLS, bool)
        dead[cells] = True
        dead = dead.reshape(ROWS, COLS)
        missed = (model.predict(X, cells) == 0) & (y == 1) & (clean == 1)
        for i in np.flatnonzero(missed):
            pairs = deciding_pairs(X[i])
            live = [pq for pq in pairs if not dead[pq[0]] and not dead[pq[1]]]
            if not live:
                continue  # a hidden positive: every deciding pair has a dead cell
            nearest = min(np.max(np.abs([rr[dead] - a[0], cc[dead] - a[1]]), axis=0).min()
                          for pq in live for a in pq)
            distance[min(int(nearest), 5)] += 1
            near = np.zeros((ROWS, COLS), bool)
            for a in (a for pq in pairs for a in pq):
                near |= (np.abs(rr - a[0]) <= 2) & (np.abs(cc - a[1]) <= 2)
            far = np.flatnonzero((dead & ~near).ravel()).astype(np.int32)
            checked += 1
            again += int(model.predict(X[i:i + 1], far)[0] == 0)
print("a read, by the nearest dead cell's distance 1, 2, 3, 4, 5+:",
      (distance / reads).round(3)[1:])
print(f"missed again with only the dead cells farther than 2: {again} of {checked}")
