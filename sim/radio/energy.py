"""Energy as bookkeeping over simulated time, as Contiki's Energest does it: the seconds
each party spent in each state, times that state's power.

Radio states: transmitting and receiving (the trace's frames and ACKs), and listening the
rest of the time: an always-on radio, which is what a mesh without a duty-cycled MAC
pays, and on the CC2420 listening draws as much as receiving. So the always-on figure
mostly measures how long a run lasts. Beside it, `ideal_mac` is the floor a perfect
duty-cycled MAC would reach: the radio asleep whenever it neither transmits nor
receives; that figure follows the traffic, which is where in-mesh computing and
shipping readings differ. Device states: computing (the kernels' operations at the
device's rate) and idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshdl.protocol.topics import name_of
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party

STATES = ("tx", "rx", "listen", "cpu", "idle")


def state_energy(radio: RadioProfile, device: DeviceProfile, tx: float, rx: float,
                 cpu: float, duration: float) -> dict[str, float]:
    """Joules of one party over `duration` seconds, by state, with their total; and
    `ideal_mac`: the same with the radio asleep instead of listening."""
    quiet = max(duration - tx - rx, 0.0)
    parts = {"tx": tx * radio.tx_w, "rx": rx * radio.rx_w, "listen": quiet * radio.idle_w,
             "cpu": cpu * device.cpu_w, "idle": max(duration - cpu, 0.0) * device.idle_w}
    parts["total"] = sum(parts[state] for state in STATES)
    parts["ideal_mac"] = parts["total"] - parts["listen"] + quiet * radio.sleep_w
    return parts


def energy_record(radio: RadioProfile, node: DeviceProfile, edge: DeviceProfile,
                  cells: Iterable[Party], edge_party: Party, tx: Mapping[Party, float],
                  rx: Mapping[Party, float], cpu: Mapping[Party, float], duration: float,
                  down: Mapping[Party, float] | None = None) -> dict[str, Any]:
    """sim.json's energy record over `duration`: total (nodes and edge), nodes, edge,
    the hottest node, by state, per node; the same under an ideal MAC; and each node's
    radio airtime (transmitting plus receiving), which shows who relays. A node `down`
    for some of the time draws nothing then; one down all along is left out."""
    per_node: dict[str, dict[str, float]] = {}
    airtime: dict[str, float] = {}
    down = down or {}
    for cell in cells:
        up = duration - down.get(cell, 0.0)
        # Down all along: its down time and the duration are sums of the same waves'
        # lengths, in other orders, so they may differ by rounding.
        if cell in down and up <= 1e-9 * duration:
            continue
        name = name_of(cell)
        per_node[name] = state_energy(radio, node, tx.get(cell, 0.0), rx.get(cell, 0.0),
                                      cpu.get(cell, 0.0), up)
        airtime[name] = tx.get(cell, 0.0) + rx.get(cell, 0.0)
    at_edge = state_energy(radio, edge, tx.get(edge_party, 0.0), rx.get(edge_party, 0.0),
                           cpu.get(edge_party, 0.0), duration)
    totals = {name: parts["total"] for name, parts in per_node.items()}
    ideal = {name: parts["ideal_mac"] for name, parts in per_node.items()}
    hottest = max(totals, key=totals.__getitem__)
    hottest_ideal = max(ideal, key=ideal.__getitem__)
    busiest = max(airtime, key=airtime.__getitem__)
    return {
        "total": sum(totals.values()) + at_edge["total"],
        "nodes": sum(totals.values()),
        "edge": at_edge["total"],
        "max_node": totals[hottest],
        "max_node_cell": hottest,
        "by_state": {state: sum(parts[state] for parts in per_node.values())
                     for state in STATES},
        "ideal_mac": {"total": sum(ideal.values()) + at_edge["ideal_mac"],
                      "nodes": sum(ideal.values()), "edge": at_edge["ideal_mac"],
                      "max_node": ideal[hottest_ideal], "max_node_cell": hottest_ideal},
        "airtime_s": {"max_node": airtime[busiest], "max_node_cell": busiest,
                      "per_node": airtime},
        "per_node": totals,
    }
