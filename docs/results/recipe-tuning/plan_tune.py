"""tune.py with the room's plan as a second reading per cell (`plan_channel`): one
tuning run of the global head's recipe, read as heldout.py reads it (clean and with
10 / 20 % of the cells dead, fault seeds 0-9). Tuning data seeds only, unless HELDOUT
is set. Run with model.in_channels=3 (two readings and the alive mask).

Usage: plan_tune.py LABEL DATA_SEED TRAIN_SEED JOURNAL [section.name=value ...]
"""
import json
import os
import sys
import time

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.datasets import Dataset
from meshdl.data.lounge import _Grid, generate_lounge
from meshdl.sim.faults.dead import cell_numbers, dead_cells
from meshdl.training.loop import train


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


label, ds, ts, journal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if ds >= 100 and not os.environ.get("HELDOUT"):
    sys.exit("data seeds 100-109 are held out")
over: dict[str, dict] = {"model": {"pool": "global"}, "data": {"seed": ds}, "train": {"seed": ts}}
for item in sys.argv[5:]:
    key, value = item.split("=", 1)
    section, name = key.split(".")
    over.setdefault(section, {})[name] = json.loads(value)
cfg = load_run_config(mode="central", data_maps=over.get("data", {}).get("train"), **over)
cpu0, wall0 = time.process_time(), time.perf_counter()
data = with_plan(generate_lounge(cfg.data))
gen_cpu = time.process_time() - cpu0
model, history = train(cfg, data)
if os.environ.get("TUNE_SAVE"):  # a directory to keep the model in
    model.save(f"{os.environ['TUNE_SAVE']}/{label}_d{ds}_t{ts}.npz")
X, y = data.X_test, data.y_test
record = {"label": label, "data_seed": ds, "train_seed": ts, "overrides": sys.argv[5:],
          "maps": len(data.y_train), "epochs": cfg.train.epochs, "lr": cfg.train.lr,
          "batch": cfg.train.batch, "warmup": cfg.train.warmup_fraction,
          "failout": [cfg.train.failout, cfg.train.failout_max,
                      getattr(cfg.train, "failout_clean", 0.0)],
          "clean": float(np.mean(model.predict(X) == y))}
for share in (0.1, 0.2):
    accs = [float(np.mean(model.predict(X, cell_numbers(dead_cells(17, 25, share, s), 25)) == y))
            for s in range(10)]
    record[f"dead_{share}"] = round(float(np.mean(accs)), 5)
    record[f"lost_{share}"] = round(100 * (record["clean"] - record[f"dead_{share}"]), 2)
record["clean"] = round(record["clean"], 5)
record["gen_cpu_s"] = round(gen_cpu, 1)
record["cpu_s"] = round(time.process_time() - cpu0, 1)
record["wall_s"] = round(time.perf_counter() - wall0, 1)
line = json.dumps(record)
print(line, flush=True)
with open(journal, "a") as f:
    f.write(line + "\n")
