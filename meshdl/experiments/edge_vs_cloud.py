"""`meshdl experiment edge-vs-cloud`: the source paper's claim (seed 001) that computing
in the sensor network costs less than shipping every reading to the cloud, one radio at
a time, under simulated time (SIMULATION.md has the model).

Each trial is one inference slot (one sample) of the configured network on one radio,
with its natural medium and devices (802.15.4, BLE and LoRa as a radio mesh of
Cortex-M4 nodes; Wi-Fi as an MQTT star of Pi Zero 2 W boards; the edge a Pi 4), against
the cloud-heavy baseline on the same medium: the readings shipped up the tree, one
message per tree link (aggregated; a radio mesh only) and one per reading
(unaggregated). The seed draws the radios' backoffs, so times and energies vary by seed
and bytes do not.
"""

from __future__ import annotations

from pathlib import Path

from meshdl.config import ModelConfig
from meshdl.experiments.columns import Format, Shown, digits, size, spread, title
from meshdl.experiments.runner import Record, Trial
from meshdl.report.plots import pyplot, save_png

RADIOS = ("802.15.4", "ble", "wifi", "lora-sf7")
SIDES = ("mesh", "cloud_aggregated", "cloud_unaggregated")
MEASURES = ("bytes", "makespan_s", "energy_j", "ideal_mac_j", "max_node_airtime_s")
FIGURES = tuple(f"{side}_{measure}" for side in SIDES for measure in MEASURES)


def run(trial: Trial) -> Record:
    """One inference slot in the mesh and shipped, on the trial's radio."""
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.studies.compare import inference_slot

    radio = trial.value
    medium = natural_medium(radio)
    model = ModelConfig(**trial.settings["model"])
    slot = inference_slot(model, profile(radio), medium, device(natural_device(radio)),
                          device("pi4"), batch=1, seed=trial.seed)
    record: Record = {"value": radio, "seed": trial.seed, "medium": medium}
    for side, key in (("mesh", "in_mesh"), ("cloud_aggregated", "cloud_aggregated"),
                      ("cloud_unaggregated", "cloud_unaggregated")):
        figures = slot.get(key)
        for measure in MEASURES:
            record[f"{side}_{measure}"] = None if figures is None else figures[measure]
    return record


# edge-vs-cloud.png's panels: the measure, the panel's title and its y label.
_PANELS = (("bytes", "bytes", "bytes per slot"), ("makespan_s", "time", "makespan (s)"),
           ("energy_j", "energy", "nodes' energy, always-on (J)"))


def plot(out: Path, rows: list[Record]) -> list[Path]:
    """edge-vs-cloud.png: bytes, makespan and the nodes' energy per radio, in the mesh
    and shipped (log scales: LoRa's duty cycle stretches its times a thousandfold); the
    legend below the panels, off the bars."""
    plt = pyplot()
    radios = [row["value"] for row in rows]
    figure, axes = plt.subplots(1, 3, figsize=(12, 4.6), dpi=100, layout="constrained")
    width = 0.27
    for panel, (measure, heading, ylabel) in zip(axes, _PANELS, strict=True):
        for i, side in enumerate(SIDES):
            values = [_mean(row.get(f"{side}_{measure}")) for row in rows]
            xs = [r + (i - 1) * width for r in range(len(rows))]
            kept = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
            panel.bar([x for x, _ in kept], [v for _, v in kept], width,
                      label=side.replace("_", " ") if panel is axes[0] else None)
        panel.set_yscale("log")
        panel.set_xticks(range(len(rows)), radios)
        panel.set(xlabel="radio", ylabel=ylabel, title=heading)
    figure.legend(loc="outside lower center", ncols=len(SIDES))
    figure.suptitle("one inference slot: in the mesh or shipped to the edge")
    path = out / "edge-vs-cloud.png"
    save_png(figure, path)
    return [path]


# The printed measures: bytes, makespan and energy, each in the mesh and shipped.
SHOWN: tuple[tuple[str, Format], ...] = (("bytes", size), ("makespan_s", digits(4)),
                                         ("energy_j", digits(4)))


def table(rows: list[Record]) -> Shown:
    """Per radio: bytes, makespan and energy in the mesh against the better cloud
    variant for each (mean over the seeds, ± std where they differ)."""
    header = ["radio"] + [title(f"{side}_{measure}") for measure, _ in SHOWN
                          for side in ("mesh", "cloud")]
    out = []
    for row in rows:
        cells = [str(row["value"])]
        for measure, show in SHOWN:
            mesh = row.get(f"mesh_{measure}")
            cloud = min((f for f in (row.get(f"cloud_aggregated_{measure}"),
                                     row.get(f"cloud_unaggregated_{measure}"))
                         if f is not None), key=lambda f: f["mean"])
            cells += [_shown(mesh, show, row["seeds"]), _shown(cloud, show, row["seeds"])]
        out.append(cells)
    return Shown(header, out, [f"mesh_{measure}" for measure, _ in SHOWN])


def _shown(figure: Record | None, show: Format, seeds: int) -> str:
    return "" if figure is None else show(figure["mean"], spread(figure, seeds))


def _mean(figure: dict[str, float] | None) -> float | None:
    return None if figure is None else figure["mean"]
