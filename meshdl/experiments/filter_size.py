"""`meshdl experiment filter-size`: the source paper's question (seed 001) of which filter
size k, at what communication cost, with what accuracy.

Each trial trains the seed network with one k and one seed, in central mode: the mesh is
proven to train exactly the same model (tests/test_mesh.py), so its accuracy is the
mesh's, at a fraction of the time. The communication is measured on a real mesh wave of
the same network (`meshdl cost`'s dry training wave): the halo values each layer needs
and transmits per sample next to the paper's formula (k^2 - 1) m n c_in, and the bytes
and messages of one training wave. The paper's own accuracies are shown beside ours; its
data (a real lounge's log) differ from our synthetic lounge, so only the trend compares.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from meshdl.config import DataConfig, RunConfig, load_run_config
from meshdl.data import Dataset
from meshdl.experiments.runner import Record, Trial

# Seed 001's single-machine runs (17 x 25, 2,400 / 561 maps, batch 100, 200 hidden
# units, 5 filters, 20 epochs): train and test accuracy by filter size.
PAPER = {3: (0.944, 0.928), 4: (0.950, 0.937), 5: (0.945, 0.934), 6: (0.930, 0.900)}

FIGURES = ("train_acc", "test_acc", "halo_needed", "halo_transmitted", "halo_formula",
           "wave_bytes", "wave_messages", "wave_radio_bytes")


def trial_config(settings: Record, kernel: int, seed: int) -> RunConfig:
    """The run of one trial: the experiment's configuration with this k and seed."""
    model = {**settings["model"], "kernel": kernel}
    train = {**settings["train"], "seed": seed}
    return load_run_config(mode="central", model=model, train=train,
                           data=settings["data"])


def run(trial: Trial) -> Record:
    """Train with one k and seed; measure one mesh training wave of that network."""
    from meshdl.cli.cost import dry_wave  # the virtual mesh: loaded where it runs
    from meshdl.training import train

    settings, kernel, seed = trial.settings, trial.value, trial.seed
    config = trial_config(settings, kernel, seed)
    data = _data(config.data, settings.get("data_file"))
    _, history = train(config, data)
    comm = dry_wave(config.model, config.train.batch, config.mesh.edge_at)
    halo = comm["halo"].values()
    return {
        "value": kernel, "seed": seed,
        "train_acc": history.final["train_acc"], "test_acc": history.final["test_acc"],
        "single_class": history.final["single_class"],
        "halo_needed": sum(h["needed"] for h in halo),
        "halo_transmitted": sum(h["transmitted"] for h in halo),
        "halo_formula": sum(h["formula"] for h in halo),
        "wave_bytes": comm["total_bytes"], "wave_messages": comm["total_messages"],
        "wave_radio_bytes": comm["broadcast_bytes"],
    }


@cache
def _data(config: DataConfig, data_file: str | None) -> Dataset:
    """The data set, made once per process (every trial of a worker shares it)."""
    if data_file is not None:
        from meshdl.data import load_dataset

        return load_dataset(Path(data_file))
    from meshdl.sim.lounge import generate_lounge

    return generate_lounge(config)


def paper_rows(values: list[int]) -> list[Record]:
    """The paper's figures for the swept sizes it reports."""
    return [{"value": k, "train_acc": PAPER[k][0], "test_acc": PAPER[k][1]}
            for k in values if k in PAPER]


def plot(out: Path, rows: list[Record], paper: list[Record]) -> list[Path]:
    """accuracy.png and cost.png: means with one standard deviation as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [row["value"] for row in rows]

    def series(name: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        return ([row[name]["mean"] * scale for row in rows],
                [row[name]["std"] * scale for row in rows])

    written = []
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    for name, label in (("train_acc", "train"), ("test_acc", "test")):
        mean, std = series(name, 100)
        axes.errorbar(ks, mean, yerr=std, marker="o", capsize=4, label=f"{label} (ours)")
    for name, label, marker in (("train_acc", "train", "s"), ("test_acc", "test", "^")):
        axes.plot([p["value"] for p in paper], [p[name] * 100 for p in paper],
                  linestyle="none", marker=marker, color="grey",
                  label=f"{label} (paper, its own data)")
    axes.set(xlabel="filter size k", ylabel="accuracy (%)", xticks=ks,
             title="accuracy by filter size (mean ± std over seeds)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "accuracy.png", metadata={"Software": None})
    written.append(out / "accuracy.png")
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    for name, label, style in (("halo_needed", "needed", "-o"),
                               ("halo_transmitted", "transmitted", ":s"),
                               ("halo_formula", "(k²-1)·m·n·c_in", "-^")):
        mean, std = series(name)
        axes.errorbar(ks, mean, yerr=std, fmt=style, capsize=4, label=label)
    axes.set(xlabel="filter size k", ylabel="halo values per sample (all conv layers)",
             xticks=ks, title="halo cost by filter size")
    twin = axes.twinx()
    mean, _ = series("wave_bytes", 1e-6)
    twin.plot(ks, mean, color="black", linestyle="--", marker="x",
              label="bytes per training wave")
    twin.set_ylabel("MB per training wave (dashed)")
    axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(out / "cost.png", metadata={"Software": None})
    written.append(out / "cost.png")
    plt.close(figure)
    return written


def seeds_differ(records: list[Record]) -> bool:
    """Whether the seeds gave different accuracies (else a std of 0 means nothing)."""
    return len({(r["value"], r["test_acc"]) for r in records}) > len(
        {r["value"] for r in records})


def table_rows(rows: list[Record]) -> list[list[Any]]:
    """The printed table: k, accuracies (mean ± std; the paper's train/test), halo
    values sent per sample against the formula, MB per training wave (summary.json and
    table.csv have every figure)."""
    out = []
    for row in rows:
        k = row["value"]
        paper = PAPER.get(k)
        out.append([
            k,
            _pm(row["train_acc"], 100), _pm(row["test_acc"], 100),
            f"{paper[0] * 100:.1f}/{paper[1] * 100:.1f}" if paper else "-",
            f"{row['halo_transmitted']['mean']:,.0f}",
            f"{row['halo_formula']['mean']:,.0f}", f"{row['wave_bytes']['mean'] / 1e6:.1f}",
        ])
    return out


def _pm(figure: dict[str, float], scale: float) -> str:
    return f"{figure['mean'] * scale:.1f}±{figure['std'] * scale:.1f}"
