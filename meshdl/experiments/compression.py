"""`meshdl experiment compression`: what each compression policy costs in accuracy and
saves in bytes and simulated time, on the seed experiment (seeds 000 and 003).

Each trial trains the configured network in the virtual mesh under one (gradient
policy, activation format) pair, from the trial's training seed; the reference is the
exact run of the same seed ("none", float32). Its mesh (or `--meshes` N of them) trains
through the parameter server, so that what the policy does to the edge's PUSH (the fc
layers' gradients, and the conv layers' after the REDUCE) is in the accuracy as it is
in the bytes; with one mesh and no compression that is exactly the plain run. Bytes
are counted: REDUCE per training step (the ledger; one message per tree link), and
each mesh's PUSH to the server per step (the cluster's count of the bytes it pushed).

Simulated time per epoch: the trained model's training waves under simulated time on
the configured radio (`--sim-waves` of them; every wave of a run sends the same
messages, so their mean times the steps of an epoch is the epoch), with the node
device's time to compress and decompress (sim/radio/device.py's rate over the compressors'
operation counts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshdl.experiments.columns import Shown, figures_table, fixed, percent, size
from meshdl.experiments.runner import Record, Trial
from meshdl.report.plots import plain_ticks, pyplot, save_png

POLICIES = ("none", "hylo", "intsum", "plan", "none/int8")
FIGURES = ("test_acc", "train_loss", "accuracy_cost", "reduce_bytes_per_step",
           "push_bytes_per_step", "gradient_bytes_per_step", "gradient_ratio",
           "forward_bytes_per_step", "mesh_bytes_per_step", "step_s", "epoch_s")


def parse_value(value: str) -> tuple[str, str]:
    """'hylo' -> ('hylo', 'float32'); 'none/int8' -> ('none', 'int8')."""
    compress, _, activations = value.partition("/")
    return compress, activations or "float32"


def run(trial: Trial) -> Record:
    """Train under the trial's policy; accuracy, bytes per step, simulated step time."""
    from meshdl.compress_grammar import PLAN
    from meshdl.config import RunConfig
    from meshdl.data.augment import training_data
    from meshdl.experiments.sweep import dataset
    from meshdl.sim.radio.backhaul import backhaul_profile
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.simulate import SimEngine
    from meshdl.sim.studies.schedule import resolve_plan
    from meshdl.training.parallel import train_parallel

    settings = trial.settings
    compress, activations = parse_value(trial.value)
    meshes = settings["meshes"]
    config = RunConfig.model_validate({
        "mode": "mesh", "model": settings["model"],
        "train": {**settings["train"], "seed": trial.seed},
        "mesh": {**settings["mesh"], "compress": compress, "activations": activations},
        "data": settings["data"], "parallel": {"meshes": meshes, "sync": "bsp"}})
    data = dataset(config.data, settings.get("data_file"))
    radio = settings["radio"]
    medium = natural_medium(radio)
    if compress == PLAN:  # the optimal plan of `meshdl schedule` for this radio
        config, _ = resolve_plan(config, training_data(config.train, data, config.model),
                                 profile(radio), medium, backhaul_profile("wifi"))
        compress, activations = config.mesh.compress, config.mesh.activations
    model, history = train_parallel(config, data)
    per_mesh = history.parallel["per_mesh"]
    pushed_per_step = sum(m["pushed_bytes"] for m in per_mesh) / \
        max(sum(m["steps"] for m in per_mesh), 1)
    classes = history.comm["classes"]
    cells = config.model.rows * config.model.cols
    steps = classes["reduce"]["messages"] / cells  # one REDUCE per cell and step
    reduce_per_step = classes["reduce"]["bytes"] / steps
    forward = sum(c["bytes"] for name, c in classes.items()
                  if name.startswith(("halo", "pool", "gather")))
    waves = history.comm.get("waves") or steps
    sim = SimEngine(training_data(config.train, data), profile(radio), medium,
                    device(natural_device(radio)), device("pi4"), seed=trial.seed,
                    params_via="tree" if medium == "shared" else "broadcast",
                    compress=compress, activations=activations)
    batch, spans = config.train.batch, []
    for wave in range(settings["sim_waves"]):
        sim.loss_and_grads(model, np.arange(wave * batch, (wave + 1) * batch))
        spans.append(sim.last_wave_shape.seconds)
    steps_per_epoch = steps / config.train.epochs
    return {
        "value": trial.value, "seed": trial.seed,
        "compress": compress, "activations": activations,
        "test_acc": history.final["test_acc"],
        "train_loss": history.epochs[-1].train_loss,
        "reduce_bytes_per_step": reduce_per_step,
        "push_bytes_per_step": pushed_per_step,
        "gradient_bytes_per_step": reduce_per_step + pushed_per_step,
        "forward_bytes_per_step": forward / waves,
        "mesh_bytes_per_step": history.comm["total_bytes"] / waves,
        "step_s": float(np.mean(spans)),
        "epoch_s": float(np.mean(spans)) * steps_per_epoch,
        "test_acc_per_epoch": [e.test_acc for e in history.epochs],
    }


def add_costs(rows: list[Record], records: list[Record]) -> None:
    """Each trial's accuracy cost (points below the exact run of its seed) and gradient
    bytes ratio (the exact run's over its own), then their means per row."""
    exact = {r["seed"]: r for r in records if parse_value(r["value"]) == ("none", "float32")}
    for record in records:
        reference = exact.get(record["seed"])
        if reference is None:
            continue
        record["accuracy_cost"] = 100.0 * (reference["test_acc"] - record["test_acc"])
        record["gradient_ratio"] = reference["gradient_bytes_per_step"] / \
            record["gradient_bytes_per_step"]
    for row in rows:
        group = [r for r in records if r["value"] == row["value"] and "accuracy_cost" in r]
        for name in ("accuracy_cost", "gradient_ratio"):
            values = [r[name] for r in group]
            row[name] = None if not values else {
                "mean": float(np.mean(values)),
                "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}


def plot(out: Path, rows: list[Record]) -> list[Path]:
    """compression.png: test accuracy against gradient bytes per step (log), and
    simulated seconds per epoch, one colour per policy (the legend below the panels,
    off the data)."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100, layout="constrained")
    for index, row in enumerate(rows):
        colour = f"C{index}"
        acc, grad = 100 * _mean(row["test_acc"]), _mean(row["gradient_bytes_per_step"])
        axes[0].errorbar([grad], [acc], yerr=[100 * row["test_acc"]["std"]], fmt="o",
                         capsize=3, color=colour, label=row["value"])
        axes[1].bar([index], [_mean(row["epoch_s"])], color=colour)
    axes[0].set_xscale("log")
    axes[0].set(xlabel="REDUCE + PUSH bytes per step (one mesh)",
                ylabel="test accuracy (%)", title="accuracy against gradient bytes")
    axes[1].set_xticks(range(len(rows)), [row["value"] for row in rows], rotation=20)
    axes[1].set(xlabel="policy", ylabel="simulated s per epoch", title="time")
    plain_ticks(axes[1].yaxis)  # 6,000 s
    figure.legend(loc="outside lower center", ncols=min(len(rows), 4))
    figure.suptitle("gradient and activation compression on the seed experiment")
    path = out / "compression.png"
    save_png(figure, path)
    return [path]


def table(rows: list[Record]) -> Shown:
    """The printed table: the policy, its test accuracy and what it cost in points
    against the exact run, the bytes a step (REDUCE, PUSH, forward activations), how
    many times fewer gradient bytes, and simulated seconds per epoch."""
    return figures_table(rows, [("policy", str)],
                         [("test_acc", percent(2)), ("accuracy_cost", _signed),
                          ("reduce_bytes_per_step", size), ("push_bytes_per_step", size),
                          ("gradient_ratio", _times), ("forward_bytes_per_step", size),
                          ("epoch_s", fixed(0))])


def _signed(mean: float, std: float | None) -> str:
    """Points of accuracy the policy cost: +0.35 (lost), -0.18 (gained)."""
    return fixed(2)(mean, std).replace(f"{mean:,.2f}", f"{mean:+,.2f}", 1)


def _times(mean: float, std: float | None) -> str:
    """How many times fewer gradient bytes: 3.2x."""
    return fixed(1)(mean, std).replace(f"{mean:,.1f}", f"{mean:,.1f}x", 1)


def _mean(figure: dict[str, float] | None) -> float:
    return float("nan") if figure is None else figure["mean"]
