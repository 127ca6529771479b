"""tune.py with the room's plan as a second reading per cell (`plan_channel`): the same
tuning run and reading, on the lounge generator's maps with the plan added to each. Run
with model.in_channels=3 (two readings and the alive mask).

Usage: plan_tune.py LABEL DATA_SEED TRAIN_SEED JOURNAL [section.name=value ...]
"""
import runpy
from pathlib import Path

import numpy as np

import meshdl.data.lounge as lounge
from meshdl.data.datasets import Dataset
from meshdl.data.lounge import _Grid


def plan_channel(rows: int, cols: int) -> np.ndarray:
    """The room's installations as a reading a node holds: exp(-d^2 / 2), d the distance
    in cells to the nearest socket, diffuser or door."""
    grid = _Grid(rows, cols)
    spots = [*grid.sockets, *grid.outlets, *((d[0], d[1]) for d in grid.doors)]
    rr, cc = np.mgrid[:rows, :cols]
    d2 = np.min([(rr - y) ** 2 + (cc - x) ** 2 for y, x in spots], axis=0)
    return np.exp(-d2 / 2).astype(np.float32)


def with_plan(data: Dataset) -> Dataset:
    """`data` with the plan as every map's second reading."""
    plan = plan_channel(*data.X_train.shape[-2:])
    # the run normalizes every reading channel with one mean and std (`normalization`):
    # give the plan the temperatures' so that both read as standardized values
    mean = float(data.X_train.mean(dtype=np.float64))
    std = float(data.X_train.std(dtype=np.float64))
    plan = (mean + std * (plan - plan.mean()) / plan.std()).astype(np.float32)

    def two(X: np.ndarray) -> np.ndarray:
        out = np.empty((len(X), 2, *X.shape[-2:]), np.float32)
        out[:, 0] = X
        out[:, 1] = plan
        return out
    return Dataset(two(data.X_train), data.y_train, two(data.X_test), data.y_test, data.meta)


generate = lounge.generate_lounge
lounge.generate_lounge = lambda cfg: with_plan(generate(cfg))  # what tune.py imports
runpy.run_path(str(Path(__file__).parent / "tune.py"), run_name="__main__")
