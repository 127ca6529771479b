"""`meshdl experiment delta`: live inference over a simulated day with delta halos
(seed 001's slot-by-slot use, issue item (d)): HALO bytes per slot against whole halos,
and whether the alerts stay the same.

One model (trained centrally on the configuration, or `--model`) runs one inference
wave per time slot, in time order, over a day of the lounge's test period (48 slots of
30 minutes), in the virtual mesh; each trial is one epsilon (None: whole halos, the
reference). An alert is a slot the model calls anomalous.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshdl.experiments.columns import Shown, figures_table, fixed, percent, size
from meshdl.experiments.runner import Record, Trial
from meshdl.report.plots import plain_ticks, pyplot, save_png

EPSILONS = (0.0, 0.01, 0.05, 0.1, 0.25)
FIGURES = ("halo_bytes_per_slot", "mesh_bytes_per_slot", "halo_ratio", "alerts",
           "alerts_changed")
FULL = "full"


def run(trial: Trial) -> Record:
    """One epsilon's day: bytes per slot and the alerts."""
    from meshdl.config import RunConfig
    from meshdl.experiments.sweep import dataset
    from meshdl.model.cnn import CNN
    from meshdl.sim.mesh import MeshEngine
    from meshdl.training.loop import train

    settings = trial.settings
    config = RunConfig.model_validate({"mode": "central", "model": settings["model"],
                                       "train": settings["train"], "data": settings["data"]})
    data = dataset(config.data, settings.get("data_file"))
    if settings.get("model_file"):
        model = CNN.load(Path(settings["model_file"]))
    else:
        model, _ = train(config, data)
    start, slots = settings["start"], settings["slots"]
    epsilon = None if trial.value == FULL else float(trial.value)
    engine = MeshEngine(data, wire=True, delta=epsilon)
    alerts = []
    for slot in range(start, start + slots):
        logits = engine.logits(model, "test", np.array([slot]))
        alerts.append(int(np.argmax(logits[0])))
    classes = engine.report()["classes"]
    halo = sum(c["bytes"] for name, c in classes.items() if name.startswith("halo"))
    total = engine.report()["total_bytes"]
    return {"value": trial.value, "seed": trial.seed, "alert_slots": alerts,
            "halo_bytes_per_slot": halo / slots, "mesh_bytes_per_slot": total / slots,
            "alerts": int(sum(alerts))}


def add_reference(rows: list[Record], records: list[Record]) -> None:
    """Each epsilon's HALO bytes as a share of whole halos', and its alerts that differ
    from theirs."""
    full = next(r for r in records if r["value"] == FULL)
    for record in records:
        record["halo_ratio"] = record["halo_bytes_per_slot"] / full["halo_bytes_per_slot"]
        record["alerts_changed"] = int(sum(a != b for a, b in zip(
            record["alert_slots"], full["alert_slots"], strict=True)))
    for row, record in zip(rows, records, strict=True):
        for name in ("halo_ratio", "alerts_changed"):
            row[name] = {"mean": float(record[name]), "std": 0.0}


def plot(out: Path, rows: list[Record]) -> list[Path]:
    """delta.png: the HALO bytes a slot per epsilon, each bar with the alerts it
    changed against whole halos."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.5, 4), dpi=100)
    labels = [str(row["value"]) for row in rows]
    axis.bar(range(len(rows)), [row["halo_bytes_per_slot"]["mean"] for row in rows])
    axis.set_xticks(range(len(rows)), labels)
    axis.set_xlabel("epsilon (°C after normalization: whole halos = full)")
    axis.set_ylabel("HALO bytes per slot")
    plain_ticks(axis.yaxis)  # 200,000 bytes
    axis.margins(y=0.12)  # room above the bars for their notes, inside the frame
    for i, row in enumerate(rows):
        changed = round(row["alerts_changed"]["mean"])
        axis.annotate(f"{changed} alert{'' if changed == 1 else 's'} changed",
                      (i, row["halo_bytes_per_slot"]["mean"]), ha="center", va="bottom",
                      fontsize=7)
    figure.suptitle("live inference over a day: delta halos")
    path = out / "delta.png"
    save_png(figure, path)
    return [path]


def table(rows: list[Record]) -> Shown:
    """The printed table: per epsilon the HALO bytes a slot and their share of whole
    halos', the mesh's bytes a slot, the alerts and those that changed."""
    return figures_table(rows, [("epsilon", str)],
                         [("halo_bytes_per_slot", size), ("halo_ratio", percent(1)),
                          ("mesh_bytes_per_slot", size), ("alerts", fixed(0)),
                          ("alerts_changed", fixed(0))])
