"""The reads of readouts.py summed up: for each way of reading (alone, banks, pairs,
pairs_banks, all, all_banks), the mean over every run (a data seed's model, pair or
set) of clean, dead 10 / 20 % and lost 10 / 20 %, the worst clean run, and beside
`banks` and `pairs` their mean difference from the model alone on the same maps.

Usage: readouts_summary.py READS.jsonl [...]   (readouts.py's output lines)
"""
import json
import statistics
import sys

records = []
for path in sys.argv[1:]:
    with open(path) as lines:
        records += [json.loads(line) for line in lines if line.strip()]
KEYS = ("clean", "dead_0.1", "dead_0.2", "lost_0.1", "lost_0.2")


def runs(way: str) -> list[dict]:
    out = []
    for r in records:
        reads = r.get(way)
        if reads:
            out += reads if isinstance(reads, list) else [reads]
    return out


def pct(key: str, value: float) -> float:
    return value if key.startswith("lost") else 100 * value


print(f"{len(records)} data seed lines")
print("| way | runs | clean mean / worst | dead 10 % | dead 20 % | lost 10 % (runs <= 1.0) "
      "| lost 20 % |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for way in ("alone", "banks", "pairs", "pairs_banks", "all", "all_banks"):
    rs = runs(way)
    if not rs:
        continue
    mean = {k: statistics.mean(pct(k, r[k]) for r in rs) for k in KEYS}
    worst = min(100 * r["clean"] for r in rs)
    under = sum(r["lost_0.1"] <= 1.0 for r in rs)
    print(f"| {way} | {len(rs)} | {mean['clean']:.2f} / {worst:.2f} | {mean['dead_0.1']:.2f} "
          f"| {mean['dead_0.2']:.2f} | {mean['lost_0.1']:.2f} ({under}) "
          f"| {mean['lost_0.2']:.2f} |")

# banks against the same model alone; each pair against the mean of its two members
diffs: dict[str, list[float]] = {f"banks {k}": [] for k in KEYS}
diffs.update({f"pair {k}": [] for k in KEYS})
for r in records:
    for a, b in zip(r["alone"], r["banks"], strict=True):
        for k in KEYS:
            diffs[f"banks {k}"].append(pct(k, b[k]) - pct(k, a[k]))
    n = len(r["alone"])
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    for (i, j), p in zip(pairs, r["pairs"], strict=True):
        for k in KEYS:
            members = (pct(k, r["alone"][i][k]) + pct(k, r["alone"][j][k])) / 2
            diffs[f"pair {k}"].append(pct(k, p[k]) - members)
for name, values in diffs.items():
    if len(values) > 1:  # better: more right, or fewer points lost
        better = sum(v < 0 for v in values) if "lost" in name else sum(v > 0 for v in values)
        print(f"{name}: {statistics.mean(values):+.3f} (sd {statistics.stdev(values):.3f}, "
              f"n {len(values)}, better in {better})")
