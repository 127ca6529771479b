"""What saved models get wrong with 10 % of the cells dead (test split, fault seeds 0-9,
the cells `meshdl evaluate --dead` kills), per read of 561 maps:

- by label: how many are wrong, how many of them are wrong with every cell alive too,
  and histograms of their largest 4-neighbour difference over all cells ("true"; also
  of those wrong alive too) and over live pairs only ("live");
- positives missed only with the cells dead although a pair at or above the threshold
  stays live: how far (Chebyshev, in cells) that pair lies from the nearest dead cell,
  and whether the map is missed again with only the dead cells farther than 2 cells
  from every deciding cell.

Usage: threshold_errors.py LABEL DATA_SEED[,DATA_SEED...] [MODELS_DIR]
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
BINS = [0, 2.0, 2.5, 2.7, 2.8, 2.9, 3.0, 3.1, 3.3, 3.6, 99]
rr, cc = np.mgrid[:ROWS, :COLS]


def largest_difference(X: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Each map's largest 4-neighbour difference over pairs of live cells."""
    down = np.abs(np.diff(X, axis=1)) * (live[1:] & live[:-1])
    across = np.abs(np.diff(X, axis=2)) * (live[:, 1:] & live[:, :-1])
    return np.maximum(down.reshape(len(X), -1).max(1), across.reshape(len(X), -1).max(1))


def deciding_pairs(x: np.ndarray) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The 4-neighbour pairs of one map that differ by at least 3 degC."""
    down = np.argwhere(np.abs(np.diff(x, axis=0)) >= 3)
    across = np.argwhere(np.abs(np.diff(x, axis=1)) >= 3)
    return [((r, c), (r + 1, c)) for r, c in down] + [((r, c), (r, c + 1)) for r, c in across]


label, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
models = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).parent / "models"
wrong = []  # (label, clean prediction, true largest difference, live largest difference)
distance = np.zeros(6)  # live-pair misses by their nearest dead cell's distance
again = checked = 0
for ds in seeds:
    cfg = load_run_config(mode="central", model={"pool": "global"}, data={"seed": ds})
    data = generate_lounge(cfg.data)
    X, y = data.X_test, data.y_test
    model = CNN.load(models / f"{label}_d{ds}_t0.npz")
    clean = model.predict(X)
    true = largest_difference(X, np.ones((ROWS, COLS), bool))
    for seed in range(10):
        cells = cell_numbers(dead_cells(ROWS, COLS, 0.1, seed), COLS)
        dead = np.zeros(ROWS * COLS, bool)
        dead[cells] = True
        dead = dead.reshape(ROWS, COLS)
        live = largest_difference(X, ~dead)
        predicted = model.predict(X, cells)
        for i in np.flatnonzero(predicted != y):
            wrong.append((y[i], clean[i], true[i], live[i]))
        for i in np.flatnonzero((predicted == 0) & (y == 1) & (clean == 1)):
            pairs = deciding_pairs(X[i])
            live_pairs = [pq for pq in pairs if not dead[pq[0]] and not dead[pq[1]]]
            if not live_pairs:
                continue  # a hidden positive: every deciding pair has a dead cell
            nearest = min(np.max(np.abs([rr[dead] - a[0], cc[dead] - a[1]]), axis=0).min()
                          for pq in live_pairs for a in pq)
            distance[min(int(nearest), 5)] += 1
            near = np.zeros((ROWS, COLS), bool)
            for a in (a for pq in pairs for a in pq):
                near |= (np.abs(rr - a[0]) <= 2) & (np.abs(cc - a[1]) <= 2)
            far = np.flatnonzero((dead & ~near).ravel()).astype(np.int32)
            checked += 1
            again += int(model.predict(X[i:i + 1], far)[0] == 0)
table = np.array(wrong, float).reshape(-1, 4)
reads = 10 * len(seeds)
for lab in (0, 1):
    rows = table[table[:, 0] == lab]
    also = np.sum(rows[:, 1] != lab) / reads
    print(f"label {lab}: wrong {len(rows) / reads:.2f} a read, {also:.2f} of them wrong alive too")
    print("  true largest difference", np.histogram(rows[:, 2], BINS)[0] / reads)
    print("    of them wrong alive too", np.histogram(rows[rows[:, 1] != lab, 2], BINS)[0] / reads)
    print("  live largest difference", np.histogram(rows[:, 3], BINS)[0] / reads)
print("bins (degC)", BINS)
print("positives missed with a live deciding pair, a read, by the nearest dead cell's "
      "distance 1, 2, 3, 4, 5+:", (distance / reads).round(3)[1:])
print(f"missed again with only the dead cells farther than 2: {again} of {checked}")
