"""What kind of maps saved models get wrong with 10 % of the cells dead (test split,
fault seeds 0-9, the cells `meshdl evaluate --dead` kills), per data and fault seed:

- hidden: positives whose every pair at or above the threshold has a dead cell
  (`hidden_by_dead`), and how many of them lie near one of the room's installations
  (within 1.3 cells of a socket, diffuser or door: 135 of the 425 cells), where the
  generator puts every anomaly (meshdl/data/lounge.py, `_anomaly_fields`);
- missed: hidden positives called negative (and how many near an installation);
- fp: negatives called positive; fn_live: positives whose deciding pair is live, missed.

Usage: errors_by_kind.py LABEL[,LABEL...] DATA_SEED[,DATA_SEED...] [TRAIN_SEED]
(reads models/LABEL_dDS_tTS.npz beside this script)
"""
import sys
from pathlib import Path

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.datasets import hidden_by_dead
from meshdl.data.lounge import _Grid, generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ROWS, COLS = 17, 25
grid = _Grid(ROWS, COLS)
spots = [*grid.sockets, *grid.outlets, *((d[0], d[1]) for d in grid.doors)]
rr, cc = np.mgrid[:ROWS, :COLS]
near = np.zeros((ROWS, COLS), bool)
for y, x in spots:
    near |= (np.abs(rr - y) <= 1.3) & (np.abs(cc - x) <= 1.3)

labels, seeds = sys.argv[1].split(","), [int(s) for s in sys.argv[2].split(",")]
ts = int(sys.argv[3]) if len(sys.argv) > 3 else 0
models = Path(__file__).parent / "models"
for label in labels:
    tot = dict(hidden=0, hidden_near=0, missed=0, missed_near=0, fp=0, fn_live=0)
    for ds in seeds:
        cfg = load_run_config(mode="central", model={"pool": "global"}, data={"seed": ds})
        data = generate_lounge(cfg.data)
        X, y = data.X_test, data.y_test
        model = CNN.load(models / f"{label}_d{ds}_t{ts}.npz")
        for s in range(10):
            cells = cell_numbers(dead_cells(ROWS, COLS, 0.1, s), COLS)
            dead = np.zeros(ROWS * COLS, bool)
            dead[cells] = True
            dead = dead.reshape(ROWS, COLS)
            hidden = hidden_by_dead(X, dead)
            pred = model.predict(X, cells)
            tot["fp"] += int(((pred == 1) & (y == 0)).sum())
            tot["fn_live"] += int(((pred == 0) & (y == 1) & ~hidden).sum())
            for i in np.flatnonzero(hidden):
                deciding = set()
                for r, c in zip(*np.nonzero(np.abs(np.diff(X[i], axis=0)) >= 3.0), strict=True):
                    deciding |= {(r, c), (r + 1, c)}
                for r, c in zip(*np.nonzero(np.abs(np.diff(X[i], axis=1)) >= 3.0), strict=True):
                    deciding |= {(r, c), (r, c + 1)}
                close = any(near[p] for p in deciding if dead[p])
                tot["hidden"] += 1
                tot["hidden_near"] += close
                if pred[i] != y[i]:
                    tot["missed"] += 1
                    tot["missed_near"] += close
    runs = 10 * len(seeds)
    print(label, {k: round(v / runs, 2) for k, v in tot.items()}, f"(per {runs} reads)")
