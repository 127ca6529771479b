"""Which cloud-heavy variant a simulated run is measured against: the strongest one.

sim.json holds the cloud-heavy baseline in every variant the medium has (over a radio
mesh: shipped up the tree *aggregated*, or *unaggregated*, each reading its own message).
Which is cheaper depends on the run. One inference slot (a reading a node) goes up the
tree fastest aggregated: one message per tree link. A training set (thousands of readings
a node) is not: aggregated, a node sends only once its whole subtree's readings are in,
so the levels of the tree take turns, where unaggregated relays pipeline (`meshdl
simulate train --epochs 2`: 1,946 s aggregated against 907 s unaggregated, and less
energy, though a few more bytes). Comparing the mesh with the weaker variant flattered
it (issue 43 item 11: "6.53 times the time" against the aggregated cloud, 14 against the
unaggregated one on the same page), so the answer in words is against the strongest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

# The figures a variant is priced by, as the report's sentence names them: time to the
# last result, the nodes' energy, the hottest node's (the first battery to die), bytes.
FIGURES = ("time", "energy", "hottest node's energy", "bytes")


class Costs(NamedTuple):
    """One side's figures, in FIGURES' order; None where the record has none."""

    time: float | None
    energy: float | None
    hottest: float | None
    bytes: float | None


class Strongest(NamedTuple):
    """The variant to compare against, and the figures in which it is the cheapest."""

    variant: str
    cheapest_in: tuple[str, ...]
    of: int  # how many variants there were to choose from


def cloud_costs(record: Mapping[str, Any]) -> Costs:
    """A cloud-heavy variant's figures from its sim.json record."""
    energy = record.get("energy_j") or {}
    return Costs(record.get("makespan_s"), energy.get("total"), energy.get("max_node"),
                 record.get("bytes"))


def variants(baseline: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """sim.json's `baseline` -> each variant's record by name ("aggregated", ...)."""
    return {key.removeprefix("cloud_heavy_"): record for key, record in baseline.items()
            if key.startswith("cloud_heavy_") and isinstance(record, Mapping)}


def strongest(baseline: Mapping[str, Any]) -> Strongest | None:
    """The cheapest variant in sim.json's `baseline`: the one cheapest in the most of
    FIGURES, and of those the fastest (time first: the sentence leads with it). None when
    the record has no variants (an old sim.json: its single `cloud_heavy` is all)."""
    found = variants(baseline)
    if not found:
        return None
    costs = {name: cloud_costs(record) for name, record in found.items()}

    def cheapest_in(name: str) -> tuple[str, ...]:
        return tuple(label for i, label in enumerate(FIGURES)
                     if costs[name][i] is not None and all(
                         other[i] is None or costs[name][i] <= other[i]
                         for other in costs.values()))

    def rank(name: str) -> tuple[int, float]:
        time = costs[name].time
        return -len(cheapest_in(name)), time if time is not None else float("inf")

    best = min(found, key=rank)
    return Strongest(best, cheapest_in(best), len(found))
