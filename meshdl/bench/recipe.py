"""Benchmark: does the training recipe train on every data set, not only the one it was
tuned on?

A grid of runs, one per (data seed, training seed): each generates the synthetic lounge
with its data seed (as `meshdl data generate --seed D`) and trains with every other
setting at the configuration's value (as `meshdl train --seed T`). The reference is the
recipe's own spread: mean and worst test accuracy, runs under 93 %, and runs that ended
predicting one class for every sample (collapsed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.lounge import generate_lounge
from meshdl.training.loop import train

FLOOR = 0.93  # test accuracy a working anomaly detector reaches on any lounge data set


def bench_recipe(config: RunConfig, data_seeds: Sequence[int], train_seeds: Sequence[int],
                 log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Train `config` on every data seed x training seed; the table and its summary."""
    runs = []
    for data_seed in data_seeds:
        run_config = config.model_copy(update={"data": config.data.model_copy(
            update={"seed": data_seed})})
        data = generate_lounge(run_config.data)
        for train_seed in train_seeds:
            seeded = run_config.model_copy(update={"train": config.train.model_copy(
                update={"seed": train_seed})})
            _, history = train(seeded, data)
            final = history.final
            runs.append({"data_seed": data_seed, "train_seed": train_seed,
                         "test_acc": final["test_acc"], "train_acc": final["train_acc"],
                         "single_class": final["single_class"]})
            log(f"data seed {data_seed:4d}, training seed {train_seed:3d}: "
                f"test acc {final['test_acc']:.4f}")
    accs = np.array([r["test_acc"] for r in runs])
    return {
        "mode": config.mode,
        "train": config.train.model_dump(mode="json", exclude={"seed"}),
        "runs": runs,
        "mean_test_acc": float(accs.mean()),
        "min_test_acc": float(accs.min()),
        "under_floor": sum(1 for r in runs if r["test_acc"] < FLOOR),
        "floor": FLOOR,
        "single_class": sum(1 for r in runs if r["single_class"]),
    }
