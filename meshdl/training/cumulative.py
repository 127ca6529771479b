"""A run trained in stretches reports the whole run (issue 33, item 2).

A run stopped (killed, interrupted, its broker gone) and resumed from its checkpoint is
trained by several processes, one stretch each; the engine of each counts only its own
waves, messages and bytes. The checkpoint carries the sums of the stretches before it
(training/checkpoint.py), and the stretch that ends the run adds its own counts here, so
that metrics.json's "comm", "parallel" and "wall_s" are those of the whole run.

Work a killed process did after its last checkpoint is not counted: it is lost with the
process, and the resumed run does it again (and counts it then).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Keys of the "comm" record that describe the mesh or the last wave rather than count
# what crossed it: the later stretch's value stands.
COMM_DESCRIPTIONS = frozenset({"wave_depth", "needed", "formula", "transport", "broker",
                               "busiest_link", "transmitted"})


def add_counts(before: Any, after: Any, descriptions: Iterable[str] = ()) -> Any:
    """`after` added to `before` leaf by leaf: numbers summed, records (dicts) key by key,
    lists of records item by item (one per mesh), lists of names joined in order; a key
    in `descriptions`, a flag, or a text takes `after`'s value."""
    described = frozenset(descriptions)
    if before is None:
        return after
    if after is None:
        return before
    if isinstance(before, dict) and isinstance(after, dict):
        return {key: after[key] if key in described and key in after
                else add_counts(before.get(key), after.get(key), described)
                for key in {**before, **after}}
    if isinstance(before, bool) or isinstance(after, bool):
        return after
    if isinstance(before, int | float) and isinstance(after, int | float):
        return before + after
    if isinstance(before, list) and isinstance(after, list):
        if len(before) == len(after) and all(isinstance(x, dict) for x in before + after):
            return [add_counts(a, b, described) for a, b in zip(before, after, strict=True)]
        if all(isinstance(x, str) for x in before + after):
            return list(dict.fromkeys(before + after))
    return after


def add_comm(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The "comm" record of two stretches of one run, `before` and then `after`."""
    if not before or not after:
        return after or before
    total = add_counts(before, after, COMM_DESCRIPTIONS)
    waves = (before.get("waves", 0), after.get("waves", 0))
    for layer, figures in total.get("halo", {}).items():
        earlier = before.get("halo", {}).get(layer, {}).get("transmitted")
        if earlier is not None and "transmitted" in figures and sum(waves):
            # a mean per wave: weighted by each stretch's waves
            figures["transmitted"] = (earlier * waves[0] + figures["transmitted"] *
                                      waves[1]) / sum(waves)
    if "busiest_link" in total:
        total["busiest_link"] = _busiest(before.get("busiest_link"),
                                         after.get("busiest_link"))
    return total


def _busiest(before: dict[str, Any] | None, after: dict[str, Any] | None
             ) -> dict[str, Any] | None:
    """The busiest link over both stretches: the same link in both (the usual case,
    the edge's own), its sums; else the busier of the two (a link second in both
    stretches could in truth have carried more, but each stretch names only its first)."""
    if before is None or after is None:
        return after or before
    if before.get("link") == after.get("link"):
        return add_counts(before, after, ("link",))
    return max(before, after, key=lambda link: link.get("bytes", 0))


@dataclass(frozen=True)
class SoFar:
    """What a run has done up to a checkpoint, every stretch of it: what the checkpoint
    carries over to the stretch resumed from it."""

    wall_s: float = 0.0  # seconds of training
    comm: dict[str, Any] = field(default_factory=dict)  # the engine's counts
    parallel: dict[str, Any] = field(default_factory=dict)  # several meshes' record
