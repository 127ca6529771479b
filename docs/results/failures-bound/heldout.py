"""Held-out protocol: data seeds x training seeds with the default global recipe
(central, as `meshdl bench recipe`), each model saved and read clean and with 10 / 20 %
of the cells dead (fault seeds 0-9, the cells `meshdl evaluate --dead` kills).

Usage: heldout.py DATA_SEEDS TRAIN_SEEDS OUT_DIR  (seeds as 100,101,...; a done.jsonl
beside OUT_DIR lists runs to skip). One JSON line per run on stdout.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.sim.faults.dead import cell_numbers, dead_cells
from meshdl.training.loop import train

data_seeds = [int(s) for s in sys.argv[1].split(",")]
train_seeds = [int(s) for s in sys.argv[2].split(",")]
out = Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
done_file = out.parent / "done.jsonl"
done = set()
if done_file.exists():
    done = {(r["data_seed"], r["train_seed"])
            for r in map(json.loads, done_file.read_text().splitlines())}
for ts in train_seeds:  # every data seed once before the next training seed
    for ds in data_seeds:
        if (ds, ts) in done:
            continue
        cfg = load_run_config(mode="central", model={"pool": "global"}, data={"seed": ds})
        started = time.perf_counter()
        data = generate_lounge(cfg.data)
        gen_s = time.perf_counter() - started
        run = cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": ts})})
        started = time.perf_counter()
        model, history = train(run, data)
        train_s = time.perf_counter() - started
        model.save(out / f"d{ds}_t{ts}.npz")
        X, y = data.X_test, data.y_test
        record = {"data_seed": ds, "train_seed": ts, "maps": len(data.y_train),
                  "epochs": run.train.epochs, "gen_s": round(gen_s, 1),
                  "train_s": round(train_s, 1), "clean": float(np.mean(model.predict(X) == y)),
                  "bench_test_acc": history.final["test_acc"]}
        for share in (0.1, 0.2):
            record[f"dead_{share}"] = [
                float(np.mean(model.predict(X, cell_numbers(dead_cells(17, 25, share, s), 25))
                              == y)) for s in range(10)]
        print(json.dumps(record), flush=True)
