"""Would the head lose less with its decision moved by how many cells are dead? A saved
model's logit margin (positive minus negative) plus a shift d, for maps with 10 % of the
cells dead (fault seeds 0-9, the cells `meshdl evaluate --dead` kills): d fitted on the
training split of a lounge no run trains or tests on (data seed 5000 + DATA_SEED, fault
seeds 100-109), and, for scale, the best d read on the test split itself (an oracle no
deployment has). The edge knows how many cells are dead, so such a shift would be
deployable; it is worth building only if the fitted one wins.

Usage: shift.py MODEL.npz DATA_SEED   (models: tune.py with TUNE_SAVE set)
"""
import sys

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells

path, ds = sys.argv[1], int(sys.argv[2])
cfg = load_run_config(mode="central", model={"pool": "global"},
                      data={"seed": ds, "train": 2400})  # the test split is the same
data = generate_lounge(cfg.data)
model = CNN.load(path)


def margins(X: np.ndarray, share: float, seeds: range) -> np.ndarray:
    """(fault seeds, maps) logit margins with `share` of the cells dead."""
    out = []
    for s in seeds:
        logits = model.forward(X, cell_numbers(dead_cells(17, 25, share, s), 25))
        out.append(logits[:, 1] - logits[:, 0])
    return np.array(out)


X, y = data.X_test, data.y_test
clean = float(np.mean(model.predict(X) == y))
dead10, dead20 = margins(X, 0.1, range(10)), margins(X, 0.2, range(10))
other = generate_lounge(cfg.data.model_copy(update={"seed": 5000 + ds}))
fit = margins(other.X_train, 0.1, range(100, 110))
shifts = np.linspace(-3.0, 3.0, 121)  # 0 at index 60
fitted = shifts[int(np.argmax([np.mean((fit + d > 0) == other.y_train) for d in shifts]))]
read = [np.mean((dead10 + d > 0) == y) for d in shifts]
oracle = shifts[int(np.argmax(read))]


def lost(margin: np.ndarray, d: float) -> float:
    return 100 * (clean - float(np.mean((margin + d > 0) == y)))


print(f"{path.rsplit('/', 1)[-1]}: clean {100 * clean:.2f}; lost 10 % {lost(dead10, 0):.2f}, "
      f"with the fitted shift {fitted:+.2f}: {lost(dead10, fitted):.2f} (20 %: "
      f"{lost(dead20, 0):.2f} -> {lost(dead20, fitted):.2f}); oracle shift {oracle:+.2f}: "
      f"{lost(dead10, oracle):.2f}")
