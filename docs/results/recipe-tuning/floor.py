"""What a dead sensor's own error leaves undecidable: an estimate of the floor under
issue 45's 10 % goal, from the data alone (no model).

A dead cell's reading is its temperature plus its sensor's calibration offset (sd
SENSOR_OFFSET, fixed per sensor) and its reading noise (sd SENSOR_NOISE, new each slot:
meshdl/data/lounge.py). Neither is spatially smooth, so no reading of the live cells can
recover them. Take an observer that knows everything else: the temperature field under
every dead cell exactly. What it still does not know is each dead cell's sensor error,
and a map's label turns on it when every live pair is below the threshold and a pair
through a dead cell lies near it. Such an observer calls each map by the likelier label
under that error, and errs with probability min(p, 1 - p), p the share of error draws
under which the map is positive. Its mean error with 10 % of the cells dead (fault seeds
0-9, the cells `meshdl evaluate --dead` kills) estimates what no model can beat; with
every cell alive it errs on nothing. Two error sizes: the noise alone (a model that has
learnt every sensor's offset from the lounge's training period) and noise and offset.

This is an estimate, not a bound: the generator scales each map's features to land its
largest difference on a drawn target, so the dead cell's error and the rest of the map
are not exactly independent; and a real observer does not know the field under a dead
cell (a heater's peak is sharp), so the real floor is higher.

Usage: floor.py  (data seeds 0-5 and 100-109, their test splits; about a minute)
"""
import numpy as np

from meshdl.config import DataConfig
from meshdl.data.lounge import SENSOR_NOISE, SENSOR_OFFSET, generate_lounge
from meshdl.sim.faults.dead import cell_numbers, dead_cells

THRESHOLD, ROWS, COLS, DRAWS = 3.0, 17, 25, 400


def largest(X: np.ndarray, live_v: np.ndarray, live_h: np.ndarray) -> np.ndarray:
    """Largest |difference| over the pairs the masks keep, per map."""
    dv, dh = np.abs(np.diff(X, axis=-2)), np.abs(np.diff(X, axis=-1))
    return np.maximum((dv * live_v).max(axis=(-2, -1)), (dh * live_h).max(axis=(-2, -1)))


def observer_errors(X: np.ndarray, dead: np.ndarray, sd: float, rng) -> float:
    """Expected maps the observer errs on, of these maps, with `dead` cells."""
    through_v, through_h = dead[1:, :] | dead[:-1, :], dead[:, 1:] | dead[:, :-1]
    seen = largest(X, ~through_v, ~through_h)
    hidden = largest(X, through_v, through_h)
    # Decided by a live pair, or too far from the threshold for any error to turn it.
    open_ = (seen < THRESHOLD) & (np.abs(hidden - THRESHOLD) < 8 * sd + 1e-9)
    if not open_.any():
        return 0.0
    maps = X[open_]
    errors = rng.normal(0.0, sd, (DRAWS, len(maps), int(dead.sum())))
    drawn = np.repeat(maps[None], DRAWS, axis=0)
    drawn[:, :, dead] += errors
    p = (largest(drawn, through_v, through_h) >= THRESHOLD).mean(axis=0)
    return float(np.minimum(p, 1.0 - p).sum())


rng = np.random.default_rng(45)
for name, seeds in (("tuning 0-5", range(6)), ("held out 100-109", range(100, 110))):
    for label, sd in (("noise", SENSOR_NOISE), ("noise and offset",
                                                 float(np.hypot(SENSOR_NOISE, SENSOR_OFFSET)))):
        per_seed = []
        for ds in seeds:
            X = generate_lounge(DataConfig(seed=ds, train=2400)).X_test.astype(np.float64)
            for fs in range(10):
                dead = np.zeros((ROWS, COLS), bool)
                dead.flat[cell_numbers(dead_cells(ROWS, COLS, 0.1, fs), COLS)] = True
                per_seed.append(100 * observer_errors(X, dead, sd, rng) / len(X))
        print(f"{name}, {label} (sd {sd:.3f} degC): the observer errs on "
              f"{np.mean(per_seed):.2f} % of the maps with 10 % dead (fault seeds 0-9; "
              f"{min(per_seed):.2f}-{max(per_seed):.2f} % per data and fault seed)")
