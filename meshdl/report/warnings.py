"""The warnings at the top of a report, where a reader looks first (issue 47 item 4): a
fact that changes what every figure below means was plain text in a table
(`single_class: true`) or nowhere at all.

- a model that collapsed to one class (metrics.json's final `single_class`, or an
  experiment's trials that did): its accuracy is the majority share, it detects nothing;
- a model that was never trained (sim.json's `model.trained` false: `simulate infer` or
  `live` without --model runs a fresh one): its alerts and accuracy mean nothing, its
  bytes, time and joules are still those of the network;
- a comparison with the weaker of the cloud-heavy variants (sim.json's `cloud_heavy`,
  the one its console line named, is not the strongest): the page compares with the
  strongest, and says which the console used.
Each is a sentence; none is said of a run it does not apply to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshdl.report.baseline import strongest


def warnings(run_dir: Path, metrics: Mapping[str, Any] | None,
             sim: Mapping[str, Any] | None) -> list[str]:
    """Every warning that applies to the run in `run_dir` (its metrics.json and sim.json
    as read), most serious first."""
    found = []
    final = (metrics or {}).get("final") or {}
    if final.get("single_class"):
        found.append(_collapsed(final))
    found += _collapsed_trials(run_dir)
    if sim is not None and (sim.get("model") or {}).get("trained") is False:
        found.append("The model was never trained: this run used a fresh model (no "
                     "--model), so its alerts and accuracy mean nothing. Its bytes, time "
                     "and joules are those of the network all the same. Pass a trained "
                     "model.npz with --model for alerts that mean something.")
    if sim is not None and (weaker := _weaker_baseline(sim.get("baseline") or {})):
        found.append(weaker)
    return found


def _collapsed(final: Mapping[str, Any]) -> str:
    counts = final.get("predicted_per_class") or {}
    totals = [sum(pair) for pair in zip(counts.get("train", []), counts.get("test", []),
                                        strict=False)]
    which = f"class {totals.index(max(totals))}" if totals else "one class"
    return (f"The model collapsed to one class: it predicts {which} for every sample, so "
            "it detects nothing, and its accuracy is only the share of that class. "
            "Train longer (a short run may not have left it yet), or again with another "
            "--seed or a lower --lr.")


def _collapsed_trials(run_dir: Path) -> list[str]:
    """An experiment's trials (trials.jsonl, or journal.jsonl of one stopped) that
    collapsed to one class, named by value and seed."""
    records = _records(run_dir / "trials.jsonl") or _records(run_dir / "journal.jsonl")
    trained = [r for r in records if "single_class" in r]
    collapsed = [r for r in trained if r.get("single_class")]
    if not collapsed:
        return []
    named = ", ".join(f"{r.get('value')} (seed {r.get('seed')})" for r in collapsed[:6])
    more = len(collapsed) - 6
    return [f"{len(collapsed)} of {len(trained)} trials collapsed to one class (their "
            f"accuracy is the majority share, they detect nothing): {named}"
            + (f" and {more} more" if more > 0 else "") + ". Their means below count them."]


def _records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file, a journal's entries' records too; a line that
    is no object (a journal cut off mid-line) is skipped."""
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            record = entry.get("record") if isinstance(entry.get("record"), dict) else entry
            found.append(record)
    return found


def _weaker_baseline(baseline: Mapping[str, Any]) -> str | None:
    """A warning when sim.json's main cloud-heavy baseline (the console's) is not the
    strongest variant."""
    best = strongest(baseline)
    main = baseline.get("cloud_heavy")
    if best is None or not isinstance(main, Mapping) or main.get("variant") in (
            None, best.variant):
        return None
    return (f"This run's console line compared the mesh with the cloud-heavy baseline "
            f"{main['variant']}, the weaker of the {best.of} variants: {best.variant} is "
            f"cheaper in {', '.join(best.cheapest_in) or 'none of the figures'}. This "
            f"page compares with {best.variant}, the strongest.")
