"""Held-out protocol: data seeds x training seeds with the default global recipe
(central, as `meshdl bench recipe`), each model saved and read clean and with 10 / 20 %
of the cells dead (fault seeds 0-9, the cells `meshdl evaluate --dead` kills)."""
import json, sys, time
from pathlib import Path
import numpy as np
from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.training.loop import train
from meshdl.sim.faults.dead import dead_cells, cell_numbers

data_seeds = [int(s) for s in sys.argv[1].split(",")]
train_seeds = [int(s) for s in sys.argv[2].split(",")]
out = Path(sys.argv[3]); out.mkdir(parents=True, exist_ok=True)
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
done = set()
done_file = out.parent / "done.jsonl"
if done_file.exists():
    done = {(r["data_seed"], r["train_seed"]) for r in map(json.loads, done_file.read_text().splitlines())}
for ts in train_seeds:
  for ds in data_seeds:
    if (ds, ts) in done:
        continue
    cfg = load_run_config(mode="central", model={"pool": "global", **extra.get("model", {})},
                          data={"seed": ds, **extra.get("data", {})}, train=extra.get("train", {}))
    t = time.perf_counter(); data = generate_lounge(cfg.data); gen_s = time.perf_counter() - t
    if True:
        run = cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": ts})})
        t = time.perf_counter(); model, hist = train(run, data); train_s = time.perf_counter() - t
        model.save(out / f"d{ds}_t{ts}.npz")
        X, y = data.X_test, data.y_test
        rec = {"data_seed": ds, "train_seed": ts, "maps": len(data.y_train),
               "epochs": run.train.epochs, "gen_s": round(gen_s, 1), "train_s": round(train_s, 1),
               "clean": float(np.mean(model.predict(X) == y)), "bench_test_acc": hist.final["test_acc"]}
        for share in (0.1, 0.2):
            accs = [float(np.mean(model.predict(X, cell_numbers(dead_cells(17, 25, share, s), 25)) == y))
                    for s in range(10)]
            rec[f"dead_{share}"] = accs
        print(json.dumps(rec), flush=True)
