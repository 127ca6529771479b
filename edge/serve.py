"""Continuous inference at the edge: one wave per time slot on the nodes' live readings,
and an alert for each on the mesh's alerts topic.

Nodes sample their sensors at the start of every slot (`meshdl.nodes.live`); halfway
through the slot each node host starts the slot's inference wave on the parameters its
cells cached, by its own clock (scheduled slots: the edge sends PARAMS and BATCH with the
first slot, and again only after a slot without a result or a change of model:
`MqttEngine.live_logits`). The edge listens for the slot's GATHER from a little before
then (`LISTEN_AHEAD_S`), turns the logits into the probability of an anomaly and
publishes a retained JSON alert:

    {"timestamp": "2026-11-21T21:30:00Z", "slot": 29478210, "probability": 0.93,
     "label": 1}

A slot whose wave gets no result (a node had no valid reading, a node host is down)
gives an alert with "error" instead of a probability: never a guess. In best effort the
edge plans around the cells of a node host that went offline (its last will) from the
next slot, whose alert names them ("left_out": ["r2c0", ...]): the model's reading of
the room with those cells dead, as `CNN.forward(X, cells)` computes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from meshdl.edge.remote import MqttEngine
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.protocol.topics import alerts_topic, name_of
from meshdl.protocol.topology import Cell

# How long before the node hosts start a slot's wave (halfway through the slot, by their
# clocks) the edge listens for it, at most a quarter of a slot: the GATHER of a host whose
# clock runs ahead must not come before the edge waits for it. NTP keeps clocks "within
# tens of milliseconds over the public Internet", asymmetric routes and congestion cause
# "errors of 100 ms or more" (Wikipedia, "Network Time Protocol"); 1 s is ten times that.
LISTEN_AHEAD_S = 1.0


def anomaly_probability(logits: np.ndarray) -> float:
    """Softmax probability of class 1 (anomalous) of one sample's logits."""
    z = logits.reshape(-1).astype(np.float64)
    z = np.exp(z - z.max())
    return float(z[1] / z.sum())


def slot_alert(slot: int, slot_s: float, logits: np.ndarray | None, threshold: float,
               error: str | None = None, left_out: Iterable[Cell] = ()) -> dict[str, Any]:
    """One slot's alert; `left_out`: the cells the slot's wave went around (down, in
    best effort), named in it when there are any."""
    stamp = datetime.fromtimestamp(slot * slot_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if logits is None:
        return {"timestamp": stamp, "slot": slot, "error": error or "no result"}
    probability = anomaly_probability(logits)
    alert = {"timestamp": stamp, "slot": slot, "probability": round(probability, 6),
             "label": int(probability >= threshold)}
    if left_out := sorted(left_out):
        alert["left_out"] = [name_of(cell) for cell in left_out]
    return alert


def serve(engine: MqttEngine, model: CNN, slot_s: float, slots: int | None = None,
          threshold: float = 0.5, clock: Callable[[], float] = time.time,
          on_alert: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Serve one slot's inference wave after another (forever, or `slots` of them) and
    publish alerts."""
    alerts = []
    done = 0
    served: int | None = None  # the last slot served: never one twice
    try:  # connected, node hosts online: then the slots begin
        engine.open(model)
    except MeshdlError:
        if engine.session is None:  # the broker refused this edge: nothing to serve
            raise
        # Connected, but some node hosts are late: the slots' alerts say so until they come.
    while slots is None or done < slots:
        now = clock()
        slot = int(now // slot_s)
        # Halfway through the slot: the nodes have read their sensors by then.
        start = (slot + 0.5) * slot_s
        if now > start or (served is not None and slot <= served):
            # A slot's wave may end before its halfway point (its PARAMS went out ahead
            # of the nodes' clocks, with a new plan): the next is the slot after.
            slot = slot + 1 if served is None else max(slot + 1, served + 1)
            start = (slot + 0.5) * slot_s
        served = slot
        engine.idle(start - min(LISTEN_AHEAD_S, slot_s / 4) - clock())
        try:
            logits = engine.live_logits(model, slot, begins_in=start - clock())
            alert = slot_alert(slot, slot_s, logits, threshold,
                               left_out=engine.edge.spec.dead)
        except MeshdlError as exc:
            alert = slot_alert(slot, slot_s, None, threshold, str(exc))
        engine.run_coroutine(engine.session.publish_record(alerts_topic(engine.mesh_id),
                                                           alert))
        alerts.append(alert)
        if on_alert is not None:
            on_alert(alert)
        done += 1
    return alerts

