"""What saved models get wrong with 10 % of the cells dead (test split, fault seeds 0-9,
the cells `meshdl evaluate --dead` kills), by label: how many a read, how many of them
are wrong with every cell alive too, and histograms of their largest 4-neighbour
difference over all cells ("true"; also of those wrong alive too) and over live pairs
only ("live").

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


def largest_difference(X: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Each map's largest 4-neighbour difference over pairs of live cells."""
    down = np.abs(np.diff(X, axis=1)) * (live[1:] & live[:-1])
    across = np.abs(np.diff(X, axis=2)) * (live[:, 1:] & live[:, :-1])
    return np.maximum(down.reshape(len(X), -1).max(1), across.reshape(len(X), -1).max(1))


label, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
models = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).parent / "models"
wrong = []  # (label, clean prediction, true largest difference, live largest difference)
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
        live = largest_difference(X, ~dead.reshape(ROWS, COLS))
        for i in np.flatnonzero(model.predict(X, cells) != y):
            wrong.append((y[i], clean[i], true[i], live[i]))
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
