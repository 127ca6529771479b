"""The tuning journal by configuration: each run (clean %, points lost at 10 / 20 % dead,
CPU s), then the mean and worst over data seeds 0-2 where all three ran.

Usage: summary.py docs/results/recipe-tuning/journal.jsonl
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

runs = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
by = defaultdict(dict)
for r in runs:
    by[r["label"]][r["data_seed"]] = r
print("| configuration | overrides | data seed | clean | lost 10 % | lost 20 % | CPU s |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    print(f"| {r['label']} | {' '.join(r['overrides']) or '(recipe)'} | {r['data_seed']} | "
          f"{100 * r['clean']:.2f} | {r['lost_0.1']:.2f} | {r['lost_0.2']:.2f} | "
          f"{r['cpu_s']:.0f} |")
print()
print("| configuration | clean mean / worst | lost 10 % mean | lost 20 % mean | CPU s mean |")
print("| --- | --- | --- | --- | --- |")
for label, seeds in by.items():
    if set(seeds) >= {0, 1, 2}:
        rs = [seeds[s] for s in (0, 1, 2)]
        clean = [round(100 * r["clean"], 4) for r in rs]
        print(f"| {label} | {sum(clean) / 3 + 1e-9:.2f} / {min(clean):.2f} | "
              f"{sum(r['lost_0.1'] for r in rs) / 3:.2f} | "
              f"{sum(r['lost_0.2'] for r in rs) / 3:.2f} | "
              f"{sum(r['cpu_s'] for r in rs) / 3:.0f} |")
print()
print("Every seed a configuration ran on (mean, and the range over seeds):")
print()
print("| configuration | data seeds | clean mean / worst | lost 10 % mean (range) | "
      "lost 20 % mean (range) | dead 10 % mean | CPU s mean |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for label, seeds in by.items():
    rs = [seeds[s] for s in sorted(seeds)]
    n = len(rs)
    clean = [100 * r["clean"] for r in rs]
    l1, l2 = [r["lost_0.1"] for r in rs], [r["lost_0.2"] for r in rs]
    print(f"| {label} | {','.join(str(s) for s in sorted(seeds))} | "
          f"{sum(clean) / n + 1e-9:.2f} / {min(clean):.2f} | "
          f"{sum(l1) / n:.2f} ({min(l1):.2f}-{max(l1):.2f}) | "
          f"{sum(l2) / n:.2f} ({min(l2):.2f}-{max(l2):.2f}) | "
          f"{sum(100 * r['dead_0.1'] for r in rs) / n:.2f} | "
          f"{sum(r['cpu_s'] for r in rs) / n:.0f} |")
