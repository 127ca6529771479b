"""`meshdl experiment loss|failures`: what best-effort training loses to lossy links or
to dead nodes, by their share and the fill-in policy, under simulated time
(SIMULATION.md has the model).

Each trial trains the configured network in the mesh on the configured radio, with the
links losing the trial's share of frames (loss), or with the trial's share of the nodes
dead from the start, for the protocol to find and plan around (failures); the fault
seed draws which frames or which nodes, while the training seed stays the
configuration's. At 0 % it trains exactly (nothing lost, nobody dead), the reference
every policy starts from. A trial's policy is one of best effort's fill-ins, or, for
loss, "reliable" (every message recovered: the exact run's accuracy, at the time and
energy it costs).

Two accuracies: `test_acc` through the mesh under the same faults (inference waves fill
in too: what a deployment would see), and `clean_test_acc`, the trained parameters on
the whole test split in this process (what training under loss cost the model).

Failures draws two curves side by side. `test_acc` is the model trained in the mesh
with the cells already dead ("trained with dead"). `deployed_acc` is what happens to a
deployed model when its nodes die after training: the same recipe trained with every
cell alive (centrally, the mesh's model to float32 rounding: tests/test_alive.py), its
test split read with the trial's dead cells left out (zeros, the alive mask 0:
`CNN.predict(X, cells)`, as `meshdl evaluate --dead` reads them). `bound_acc` is the
bound of issue 45 on the same cells, where it was measured (`BOUND`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from meshdl.experiments.columns import Shown, figures_table, fixed, percent
from meshdl.experiments.runner import Record, Trial
from meshdl.report.plots import plain_ticks, pyplot, save_png

if TYPE_CHECKING:
    from meshdl.config import RunConfig
    from meshdl.data.datasets import Dataset
    from meshdl.model.cnn import CNN


class FaultSweep(NamedTuple):
    """One fault experiment: what it sweeps, its axis, its shares by default, and its
    swept variables' names in table.csv."""

    axis: str
    default: tuple[float, ...]
    variables: tuple[str, str]


SWEEPS = {"loss": FaultSweep("frames lost (%)", (0.0, 0.05, 0.1, 0.2, 0.3),
                             ("loss", "policy")),
          "failures": FaultSweep("nodes dead (%)", (0.0, 0.05, 0.1, 0.2),
                                 ("dead", "policy"))}
POLICIES = ("zero", "last", "neighbours")
EXACT = "exact"  # the 0 % trials: no loss, nothing to fill in
FIGURES = ("test_acc", "clean_test_acc", "train_loss", "seconds_per_epoch",
           "energy_j_per_epoch", "substituted", "substituted_per_wave", "skipped_steps",
           "messages_lost", "frames_lost", "frames", "dead_found", "absent_filled",
           "deployed_acc", "bound_acc")


def values(shares: list[float], policies: list[str]) -> list[list[Any]]:
    """The swept (share, policy) pairs: 0 % once, exactly; every other share per
    policy."""
    out: list[list[Any]] = []
    for share in shares:
        out.extend([[share, EXACT]] if share == 0 else [[share, p] for p in policies])
    return out


def run(trial: Trial) -> Record:
    """Train under the trial's faults and policy; accuracies, time, energy, faults."""
    from meshdl.config import RunConfig
    from meshdl.data.augment import training_data
    from meshdl.experiments.sweep import dataset
    from meshdl.protocol.deadlines import Policy
    from meshdl.protocol.spec import Mode
    from meshdl.sim.besteffort import BestEffort
    from meshdl.sim.faults.dead import dead_cells
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.loss import FrameLoss
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.simulate import SimEngine, sim_report
    from meshdl.training.loop import train

    share, policy = trial.value
    settings = trial.settings
    failures = settings["experiment"] == "failures"
    rate = settings["loss"] if failures else share
    config = RunConfig.model_validate({"mode": "mesh", "model": settings["model"],
                                       "train": settings["train"], "mesh": settings["mesh"],
                                       "data": settings["data"]})
    data = dataset(config.data, settings.get("data_file"))
    radio = settings["radio"]
    medium = natural_medium(radio)
    loss = FrameLoss(rate, settings["burst"] if rate else None, trial.seed)
    best_effort = None if policy in (EXACT, "reliable") else BestEffort(Policy(policy))
    down = dead_cells(config.model.rows, config.model.cols, share, trial.seed,
                      config.mesh.edge_at) if failures else frozenset()
    view = training_data(config.train, data, config.model)  # with the alive mask, if read
    engine = SimEngine(view, profile(radio), medium,
                       device(natural_device(radio)), device("pi4"), seed=config.train.seed,
                       edge_at=config.mesh.edge_at, params_via="tree" if medium == "shared"
                       else "broadcast", loss=loss, best_effort=best_effort, failing=down)
    model, history = train(config, data, engine=engine)
    report = sim_report(engine.mesh, Mode.TRAIN, epochs=config.train.epochs)
    faults = report["faults"]
    clean = model.forward(data.X_test).argmax(axis=1) if len(data.y_test) else np.empty(0)
    after = {} if not failures else {
        "deployed_acc": deployed_accuracy(config, data, settings, down),
        "bound_acc": bound_accuracy(data, settings, share, trial.seed)}
    return {**after,
        "value": [share, policy], "seed": trial.seed,
        "dead_found": len(set(faults["dead_cells"]) & set(faults["down_cells"])),
        "absent_filled": faults["absent_filled"],
        "test_acc": history.final["test_acc"],
        "clean_test_acc": float(np.mean(clean == data.y_test)) if len(clean) else None,
        "train_loss": history.epochs[-1].train_loss,
        "seconds_per_epoch": report["makespan_s"]["per_epoch_mean"],
        "energy_j_per_epoch": report["energy_j"]["per_epoch_mean"],
        "substituted": faults["substituted"],
        "substituted_per_wave": faults["substituted_per_wave_mean"],
        "skipped_steps": faults["skipped_steps"],
        "messages_lost": faults["messages_lost"] + faults["messages_expired"],
        "frames_lost": faults["lost"],
        "frames": report["frames_total"],
        "test_acc_per_epoch": [e.test_acc for e in history.epochs],
    }


# The deployed model of each recipe and data set, trained once per worker process.
_DEPLOYED: dict[str, CNN] = {}


def deployed_accuracy(config: RunConfig, data: Dataset, settings: dict[str, Any],
                      down: frozenset[tuple[int, int]]) -> float | None:
    """The test accuracy of the model trained with every cell alive (the sweep's recipe,
    central), its `down` cells dead after training: left out as `meshdl evaluate --dead`
    leaves them (no reading, no output, the alive mask 0)."""
    from meshdl.sim.faults.dead import cell_numbers
    from meshdl.training.loop import train

    if not len(data.y_test):
        return None
    key = json.dumps([settings["model"], settings["train"], settings["data"],
                      settings.get("data_file")], sort_keys=True)
    if key not in _DEPLOYED:
        _DEPLOYED[key], _ = train(config.model_copy(update={"mode": "central"}), data)
    model = _DEPLOYED[key]
    predicted = model.predict(data.X_test, cell_numbers(down, config.model.cols))
    return float(np.mean(predicted == data.y_test))


# The bound model of issue 45 (an independent PyTorch CNN told which cells are dead:
# readings with the dead zeroed and an alive mask, trained on random masks of 5-25 % a
# map) where it was measured: by data set (`data_digest`), its test accuracy with the
# cells `dead_cells(rows, cols, share, fault seed)` kills (edge at 0,0) for fault seeds
# 0-9. The script and its runs: docs/results/failures-bound/.
BOUND: dict[str, dict[str, list[float]]] = {
    # `meshdl data generate --train 40800` (seed 0; the default data set until the
    # recipe took 163,200 maps): 8 epochs, measured 2026-11-29.
    "01862e2202342943": {
        "0": [0.9768],
        "0.1": [0.9572, 0.9715, 0.9590, 0.9697, 0.9733, 0.9715, 0.9733, 0.9733, 0.9733,
                0.9661],
        "0.2": [0.9501, 0.9394, 0.9465, 0.9661, 0.9465, 0.9697, 0.9483, 0.9643, 0.9519,
                0.9643],
    },
    # `meshdl data generate --rows 6 --cols 8 --train 2400` (seed 0): 40 epochs on its
    # 2,400 training maps, measured 2026-11-29.
    "d3989c5c0f1b4c38": {
        "0": [0.9590],
        "0.1": [0.9554, 0.9465, 0.9501, 0.9305, 0.9554, 0.9590, 0.9590, 0.9626, 0.9537,
                0.9608],
        "0.2": [0.9465, 0.9465, 0.9572, 0.9198, 0.9626, 0.9519, 0.9394, 0.9430, 0.9501,
                0.9483],
    },
}


def bound_accuracy(data: Dataset, settings: dict[str, Any], share: float,
                   seed: int) -> float | None:
    """The bound model's accuracy with the trial's dead cells, where it was measured:
    the same data set and edge, a share and fault seed it ran (else None)."""
    from meshdl.data.datasets import data_digest

    measured = BOUND.get(data_digest(data), {})
    per_seed = measured.get("0" if share == 0 else f"{share:g}")
    if tuple(settings["mesh"]["edge_at"]) != (0, 0) or per_seed is None:
        return None
    return per_seed[0] if share == 0 else per_seed[seed] if seed < len(per_seed) else None


# NAME.png's panels: each figure drawn, its scale, its line, and the panel it is on.
_LINES = (("test_acc", 100.0, "-o", 0), ("clean_test_acc", 100.0, ":x", 0),
          ("seconds_per_epoch", 1.0, "-o", 1), ("energy_j_per_epoch", 1.0, "-o", 2))
_PANELS = (("accuracy", "test accuracy (%)"), ("time", "simulated s per epoch"),
           ("energy", "nodes' J per epoch"))


def plot(out: Path, name: str, rows: list[Record]) -> list[Path]:
    """NAME.png: accuracy (through the mesh, and of the trained model) and the time and
    energy of an epoch against the share of faults, one colour per policy from the
    exact run; the legend below the panels, off the data."""
    plt = pyplot()
    exact = [row for row in rows if row["value"][1] == EXACT]
    policies = list(dict.fromkeys(row["value"][1] for row in rows
                                  if row["value"][1] != EXACT))
    figure, axes = plt.subplots(1, 3, figsize=(14, 4.6), dpi=100, layout="constrained")
    for index, policy in enumerate(policies):
        series = sorted(exact + [row for row in rows if row["value"][1] == policy],
                        key=lambda row: row["value"][0])
        rates = [100 * row["value"][0] for row in series]
        for figure_name, scale, style, panel in _LINES:
            kept = [(r, row[figure_name]) for r, row in zip(rates, series, strict=True)
                    if row.get(figure_name) is not None]
            # One standard deviation over the fault seeds; one colour per policy in
            # every panel.
            axes[panel].errorbar([r for r, _ in kept], [f["mean"] * scale for _, f in kept],
                                 yerr=[f["std"] * scale for _, f in kept], fmt=style,
                                 capsize=3, color=f"C{index}")
    after = [(figure_name, style, label) for figure_name, style, label in _AFTER
             if any(row.get(figure_name) for row in rows)]
    for figure_name, style, _ in after:  # one line each: the policy plays no part in it
        series = sorted({row["value"][0]: row for row in rows
                         if row.get(figure_name)}.values(), key=lambda row: row["value"][0])
        axes[0].errorbar([100 * row["value"][0] for row in series],
                         [100 * row[figure_name]["mean"] for row in series],
                         yerr=[100 * row[figure_name]["std"] for row in series],
                         fmt=style, capsize=3, color="black" if "deployed" in figure_name
                         else "grey")
    for panel, (title, ylabel) in zip(axes, _PANELS, strict=True):
        panel.set(xlabel=SWEEPS[name].axis, ylabel=ylabel, title=title)
    for panel in axes[1:]:  # 11,000 J, thousands separated as in the table
        plain_ticks(panel.yaxis)
    handles = _legend(plt, policies, [(style, label) for _, style, label in after])
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3))
    figure.suptitle("training over lossy links" if name == "loss" else
                    "training with dead nodes")
    path = out / f"{name}.png"
    save_png(figure, path)
    return [path]


class Sweep(NamedTuple):
    """A finished sweep of one fault experiment, as `meshdl experiment compare` reads it:
    its label on the plot and summary.json's rows."""

    label: str
    rows: list[Record]


def compare_plot(path: Path, name: str, sweeps: list[Sweep]) -> Path:
    """One panel: test accuracy through the mesh against the share of faults, one colour
    per sweep (say one per network head), one marker and line style per policy, each
    from its sweep's exact run; one standard deviation over the fault seeds."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 5), dpi=100, layout="constrained")
    styles: dict[str, tuple[str, str]] = {}
    for index, sweep in enumerate(sweeps):
        exact = [row for row in sweep.rows if row["value"][1] == EXACT]
        policies = dict.fromkeys(row["value"][1] for row in sweep.rows
                                 if row["value"][1] != EXACT)
        for policy in policies:
            marker, line = styles.setdefault(policy, _POLICY_STYLES[len(styles) %
                                                                    len(_POLICY_STYLES)])
            series = sorted(exact + [row for row in sweep.rows
                                     if row["value"][1] == policy],
                            key=lambda row: row["value"][0])
            axis.errorbar([100 * row["value"][0] for row in series],
                          [100 * row["test_acc"]["mean"] for row in series],
                          yerr=[100 * row["test_acc"]["std"] for row in series],
                          fmt=marker + line, capsize=3, color=f"C{index}",
                          label=f"{sweep.label}, {policy}")
    axis.set(xlabel=SWEEPS[name].axis, ylabel="test accuracy through the mesh (%)",
             title="training with dead nodes" if name == "failures" else
             "training over lossy links")
    figure.legend(loc="outside lower center", ncols=min(3, max(1, len(
        axis.get_legend_handles_labels()[1]))))
    save_png(figure, path)
    return path


# compare_plot's marker and line style per policy (colours tell the sweeps apart)
_POLICY_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))


# Failures' lines of models whose cells die after training: figure, style, legend.
_AFTER = (("deployed_acc", "--s", "deployed: trained all alive, cells die after"),
          ("bound_acc", ":D", "bound model (PyTorch, told the dead)"))


def _legend(plt: Any, policies: list[str],
            after: list[tuple[str, str]] | None = None) -> list[Any]:
    """The legend's entries: a colour per policy, then what the two accuracies' lines
    are (solid: through the mesh, trained with the cells dead; dotted: the trained
    model on clean readings), then the lines of models whose cells die after
    training."""
    line = plt.Line2D
    return ([line([], [], color=f"C{i}", marker="o", label=p) for i, p in enumerate(policies)]
            + [line([], [], color="black", linestyle="-", label="test: through the mesh"
                    + (", trained with the dead" if after else "")),
               line([], [], color="black", linestyle=":", marker="x",
                    label="clean test: the trained model")]
            + [line([], [], color="black" if "deployed" in label else "grey",
                    linestyle=style[:-1], marker=style[-1], label=label)
               for style, label in after or []])


def table(name: str, rows: list[Record]) -> Shown:
    """The printed table: the share and policy, the seeds, the accuracies (through the
    mesh, the headline, then the trained model's on clean readings), time and energy
    of an epoch, fill-ins a wave, and the skipped steps (loss) or dead found
    (failures)."""
    last = ("skipped_steps", fixed(1)) if name == "loss" else ("dead_found", fixed(1))
    shares = ("loss %" if name == "loss" else "dead %", lambda value: f"{100 * value[0]:g}")
    after = [] if name == "loss" else [
        (figure_name, percent(2)) for figure_name, _, _ in _AFTER
        if any(row.get(figure_name) for row in rows)]
    return figures_table(rows, [shares, ("policy", lambda value: str(value[1]))],
                         [("test_acc", percent(2)), *after, ("clean_test_acc", percent(2)),
                          ("seconds_per_epoch", fixed(0)), ("energy_j_per_epoch", fixed(0)),
                          ("substituted_per_wave", fixed(1)), last], seeds_column=True)
