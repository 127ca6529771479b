"""Two configurations read on the same data and training seeds, side by side: a row per
run (clean %, dead 10 % %, points lost at 10 / 20 % dead, CPU s of the first), the means
(and the worst clean read), and the paired differences (first minus second: mean and sd).

Usage: paired.py FIRST.jsonl[,MORE.jsonl] SECOND.jsonl[,MORE.jsonl]
  e.g. paired.py heldout-l3-train-seed0.jsonl,heldout-l3-train-seed1.jsonl \\
                 heldout-train-seed0.jsonl,heldout-train-seed1.jsonl
"""
import json
import statistics
import sys
from pathlib import Path


def runs(paths: str) -> dict[tuple[int, int], dict]:
    found = {}
    for path in paths.split(","):
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            found[(r["train_seed"], r["data_seed"])] = r
    return found


first, second = runs(sys.argv[1]), runs(sys.argv[2])
keys = sorted(set(first) & set(second))
reads = {"clean": lambda r: 100 * r["clean"], "dead 10 %": lambda r: 100 * r["dead_0.1"],
         "lost 10 %": lambda r: r["lost_0.1"], "lost 20 %": lambda r: r["lost_0.2"]}
print("| training / data seed | " + " | ".join(f"{name}: first / second" for name in reads)
      + " | CPU s (first) |")
print("| --- " * (len(reads) + 2) + "|")
for key in keys:
    cells = [f"{read(first[key]):.2f} / {read(second[key]):.2f}" for read in reads.values()]
    print(f"| {key[0]} / {key[1]} | " + " | ".join(cells) + f" | {first[key]['cpu_s']:.0f} |")
means = []
for name, read in reads.items():
    a, b = [read(first[k]) for k in keys], [read(second[k]) for k in keys]
    mean_a, mean_b = statistics.fmean(a) + 1e-9, statistics.fmean(b) + 1e-9
    cell = f"**{mean_a:.2f}** / {mean_b:.2f}"
    if name == "clean":
        cell += f" (worst {min(a):.2f} / {min(b):.2f})"
    means.append(cell)
print(f"| **mean of {len(keys)}** | " + " | ".join(means) + " | |")
print()
for name, read in reads.items():
    diff = [read(first[k]) - read(second[k]) for k in keys]
    sd = statistics.stdev(diff) if len(diff) > 1 else float("nan")
    print(f"paired {name}: {statistics.fmean(diff):+.2f} (sd {sd:.2f}); first at or below second "
          f"in {sum(d <= 0 for d in diff)} of {len(diff)}")
lost = [first[k]["lost_0.1"] for k in keys]
print(f"first: lost 10 % <= 1.0 in {sum(v <= 1.0 for v in lost)} of {len(lost)} runs")
