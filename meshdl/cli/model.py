"""`meshdl evaluate`, `meshdl infer`, `meshdl calibrate`, `meshdl mirror-banks` and `meshdl
config show|init`: look at a trained model, fix its int8 scales or write its mirror banks,
or look at a configuration, or write one to start from.

numpy, the model (Numba) and the data sets are imported by the commands that use them,
not with the module: `meshdl --help` builds every command's options and runs none.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import typer

from meshdl.cli.common import emit_json, err_console, file_to_write, out_console
from meshdl.cli.options import (
    Activations,
    Cols,
    Config,
    DataFile,
    EdgeAt,
    JsonReport,
    ModelFile,
    Pool,
    Rows,
    json_option,
)
from meshdl.errors import UsageError

if TYPE_CHECKING:
    import numpy as np


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
    app.command("infer")(infer)
    app.command("calibrate")(calibrate)
    app.command("mirror-banks")(mirror_banks_command)
    config_app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)
    config_app.command("show")(config_show)
    config_app.command("init")(config_init)
    app.add_typer(config_app, name="config")


DEFAULT_FAULT_SEEDS = "0-9"  # --dead alone: ten draws, the mean and spread a deployer needs

DeadSeed = typer.Option(None, "--fault-seed", "--dead-seed", min=0, help="With --dead: the "
                        "one draw of dead cells (the same cells `simulate infer|train "
                        "--fault-seed` kills; --dead-seed is its older name).")
DeadSeeds = typer.Option(None, "--fault-seeds", metavar="SEEDS", help="With --dead: "
                         "several draws, e.g. 0-9 or 0,3,7: their accuracies' mean, std "
                         "(n - 1), min and max. "
                         f"Default when neither seed flag is given: {DEFAULT_FAULT_SEEDS}.")


def evaluate(
    model_path: ModelFile,
    data_path: DataFile,
    split: Literal["test", "train", "all"] = typer.Option("test", "--split",
                                                          help="The samples to evaluate."),
    dead: float = typer.Option(0.0, "--dead", min=0.0, max=0.99, help="Share of the cells "
                               "read as dead (no reading, no output: zeros), drawn as "
                               "`simulate --dead` draws them (never the edge's cell)."),
    fault_seed: int | None = DeadSeed,
    fault_seeds: str | None = DeadSeeds,
    edge_at: str = typer.Option("0,0", "--edge-at", metavar="R,C", help="With --dead: the "
                                "edge's cell, never dead (as in the mesh)."),
    int8_static: bool = typer.Option(False, "--int8-static", help="The central int8 "
                                     "emulation: what a mesh under --activations "
                                     "int8-static computes (the model's calibrated "
                                     "scales)."),
    json_out: JsonReport = False,
) -> None:
    """Accuracy and confusion matrix of a saved model on a data set: all its cells, or
    with --dead some read as dead, over several draws of them (--fault-seeds, default
    0-9: accuracy mean, std, min, max; confusion and samples then count every draw's
    predictions) or one (--fault-seed). The JSON's `down_cells` (one draw) and
    `per_seed` name the cells as sim.json's `down_cells` does."""
    import numpy as np
    from rich.table import Table

    from meshdl.cli.common import parse_cell
    from meshdl.data.datasets import check_label_range, load_split
    from meshdl.model.cnn import CNN
    from meshdl.protocol.topics import name_of
    from meshdl.sim.faults.dead import cell_numbers, dead_cells

    if fault_seed is not None and fault_seeds is not None:
        raise UsageError("--fault-seed and --fault-seeds: give one draw or several, not both")
    seeds = [fault_seed] if fault_seed is not None else parse_seeds(
        fault_seeds or DEFAULT_FAULT_SEEDS)
    model = CNN.load(model_path)
    # Only the splits asked for are read: a gap in the other one is no reason to refuse.
    names = ("train", "test") if split == "all" else (split,)
    parts = [load_split(data_path, part) for part in names]
    # The confusion matrix is indexed by the true labels: each must be a class.
    for part, (_, labels) in zip(names, parts, strict=True):
        check_label_range(labels, model.config.classes, f"y_{part}", str(data_path))
    X = np.concatenate([x for x, _ in parts])
    y = np.concatenate([t for _, t in parts])
    model = model.on_grid(*X.shape[-2:])  # global pooling: any grid; else the model's
    if int8_static:
        model.scales_for_inference()  # said before any prediction
    rows, cols = model.config.rows, model.config.cols
    edge = parse_cell(edge_at)
    if not (0 <= edge[0] < rows and 0 <= edge[1] < cols):
        raise UsageError(f"--edge-at {edge_at}: not a cell of the {rows} x {cols} grid")
    if not dead:
        seeds = seeds[:1]  # no cell dead: every draw is the same
    draws: list[DeadDraw] = []
    for seed in seeds:
        down = dead_cells(rows, cols, dead, seed, edge)
        predicted = np.concatenate([model.predict(X[i : i + 500], cell_numbers(down, cols),
                                                  quantized=int8_static)
                                    for i in range(0, len(X), 500)])
        draws.append(DeadDraw(seed, [name_of(cell) for cell in sorted(down)], predicted))
    report = classification_report(np.tile(y, len(draws)),
                                   np.concatenate([d.predicted for d in draws]),
                                   model.config.classes)
    report.update({"model": str(model_path), "data": str(data_path), "split": split,
                   "dead": dead, "dead_cells": len(draws[0].down),
                   "activations": "int8-static" if int8_static else "float32"})
    if dead:
        report.update(dead_spread(draws, y))
    if json_out:
        emit_json(report)
        return
    title = f"{split} split: accuracy {report['accuracy']:.4f} ({report['samples']} samples)"
    # As wide as its title: a narrow confusion matrix wrapped it ("(561" / "samples)").
    table = Table(title=title, min_width=len(title))
    table.add_column("true \\ predicted")
    for c in range(model.config.classes):
        table.add_column(str(c), justify="right")
    for c, row in enumerate(report["confusion"]):
        table.add_row(str(c), *(str(v) for v in row))
    out_console.print(table)
    if dead:
        for line in dead_lines(report):
            out_console.print(line, highlight=False)


def calibrate(
    model_path: ModelFile,
    data_path: DataFile,
    percentile: float = typer.Option(100.0, "--percentile", min=50.0, max=100.0,
                                     help="Each layer's scale covers this percentile of "
                                     "its |values| on the training maps (100: the "
                                     "maximum; the rest saturate; below 100, on at "
                                     "most the first 4,000 maps)."),
    maps: int = typer.Option(0, "--maps", min=0, help="Calibrate on the first MAPS "
                             "training maps (0: all)."),
    out: Path | None = typer.Option(None, "--out", help="Write the calibrated model here "
                                    "(default: over MODEL)."),
    json_out: JsonReport = False,
) -> None:
    """Fix a trained model's int8 activation scales (`--activations int8-static`) from
    a data set's training split: the input's (int16 codes) and each conv layer's ReLU
    output's (uint8 codes), saved in model.npz as quant.scales. Training does it with
    the maximum; this is for models trained before, or another percentile."""
    from meshdl.data.datasets import load_split
    from meshdl.model.cnn import CNN

    model = CNN.load(model_path)
    X, _ = load_split(data_path, "train")
    if maps:
        X = X[:maps]
    scales = model.on_grid(*X.shape[-2:]).calibrate(X, percentile)
    model.act_scales = scales
    target = out or model_path
    model.save(target)
    report = {"model": str(target), "data": str(data_path), "percentile": percentile,
              "maps": len(X), "scales": [float(s) for s in scales]}
    if json_out:
        emit_json(report)
        return
    out_console.print(f"{target}: int8 scales {', '.join(f'{s:.6g}' for s in scales)} "
                      f"(input, then each conv layer) from {len(X)} training maps",
                      highlight=False)


def mirror_banks_command(
    model_path: ModelFile,
    out: Path = typer.Option(..., "--out", "-o", help="The model file to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
    json_out: JsonReport = False,
) -> None:
    """Write a global-pool model that reads every map in its four mirror orientations,
    logits averaged: one model of 4 x the filters and hidden units (block-diagonal
    weights), so it runs as any model does (`evaluate --dead`, `simulate infer`, `edge
    serve`), the mesh included: fewer errors with dead cells than the model alone, for
    4 x a halo's values and the conv layers' compute. The model's int8 scales are not
    carried over (the four orientations read wider): `meshdl calibrate` the banks."""
    from meshdl.model.cnn import CNN
    from meshdl.model.mirrors import mirror_banks

    file_to_write(out, force, ", or --out another file")
    model = CNN.load(model_path)
    banks = mirror_banks(model)
    banks.save(out)
    cfg = banks.config
    dropped = model.act_scales is not None
    report = {"model": str(model_path), "out": str(out), "filters": cfg.filters,
              "hidden": cfg.hidden, "parameters": int(banks.flat.size),
              "parameters_alone": int(model.flat.size), "int8_scales_dropped": dropped}
    if json_out:
        emit_json(report)
        return
    out_console.print(f"{out}: {model_path} in four mirror orientations, {cfg.filters} "
                      f"filters and {cfg.hidden} hidden units ({banks.flat.size:,} parameters, "
                      f"{model.flat.size:,} alone)", highlight=False)
    if dropped:
        err_console.print(f"int8 scales not carried over; for --activations int8-static "
                          f"run: meshdl calibrate {out} DATA", highlight=False)


class DeadDraw(NamedTuple):
    """One draw of dead cells and the model's predictions with them left out."""

    seed: int
    down: list[str]  # the cells' names (r1c2), as sim.json's down_cells
    predicted: np.ndarray


def dead_spread(draws: list[DeadDraw], y: np.ndarray) -> dict:
    """The draws' accuracies and their mean and spread (std over the draws, n - 1)."""
    import numpy as np

    accuracy = np.array([np.mean(d.predicted == y) if len(y) else np.nan for d in draws])
    spread = {"fault_seeds": [d.seed for d in draws],
              "accuracy_mean": float(accuracy.mean()),
              "accuracy_std": float(accuracy.std(ddof=1)) if len(draws) > 1 else 0.0,
              "accuracy_min": float(accuracy.min()), "accuracy_max": float(accuracy.max()),
              "per_seed": [{"fault_seed": d.seed, "accuracy": float(a), "down_cells": d.down}
                           for d, a in zip(draws, accuracy, strict=True)]}
    if len(draws) == 1:
        spread.update({"fault_seed": draws[0].seed, "down_cells": draws[0].down})
    return spread


def dead_lines(report: dict) -> list[str]:
    """What --dead measured, in a line or two under the confusion matrix."""
    share, count, seeds = report["dead"], report["dead_cells"], report["fault_seeds"]
    if len(seeds) == 1:
        return [f"--dead {share:g}: {count} dead cells (fault seed {seeds[0]}): "
                f"{', '.join(report['down_cells'])}"]
    return [f"--dead {share:g}: {count} dead cells, {len(seeds)} draws (fault seeds "
            f"{format_seeds(seeds)}): accuracy mean {report['accuracy_mean']:.4f}, std "
            f"{report['accuracy_std']:.4f}, min {report['accuracy_min']:.4f}, max "
            f"{report['accuracy_max']:.4f}",
            "  " + ", ".join(f"seed {d['fault_seed']} {d['accuracy']:.4f}"
                             for d in report["per_seed"])]


def parse_seeds(text: str) -> list[int]:
    """'0-9', '0,3,7' or '0-2,8' -> the seeds in that order (each once), or a UsageError."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            low, high = int(first), int(last or first)
            if low < 0 or high < low:
                raise ValueError(part)
            seeds += [s for s in range(low, high + 1) if s not in seeds]
    except ValueError:
        raise UsageError(f"--fault-seeds {text!r}: expected seeds as 0-9, 0,3,7 or 0-2,8 "
                         "(each at least 0)") from None
    return seeds


def format_seeds(seeds: list[int]) -> str:
    """The seeds as parse_seeds reads them, a run of consecutive ones as FIRST-LAST."""
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def infer(
    model_path: ModelFile,
    data_path: DataFile,
    mode: Literal["mesh", "central"] = typer.Option(
        "mesh", "--mode", help="mesh (inference waves in the virtual mesh) or central."),
    split: Literal["test", "train"] = typer.Option("test", "--split",
                                                   help="The samples to predict."),
    edge_at: EdgeAt = "0,0",
    activations: Activations = None,
    predictions: Path | None = typer.Option(
        None, "--predictions", help="Write each sample's prediction to this CSV file: "
        "sample, label (predicted), probability (of an anomaly, class 1, as the edge's "
        "alerts say; with more classes, of the label), true_label."),
    json_out: JsonReport = False,
) -> None:
    """Predict a data set with inference waves (the sensors' readings stay in the mesh)."""
    import numpy as np

    from meshdl.cli.common import parse_cell
    from meshdl.config import load_run_config
    from meshdl.data.datasets import check_label_range, load_dataset
    from meshdl.model.cnn import CNN
    from meshdl.training.loop import EVAL_BATCH, engine_for

    model = CNN.load(model_path)
    data = load_dataset(data_path)
    model = model.on_grid(data.rows, data.cols)  # global pooling: any grid
    y = data.y_test if split == "test" else data.y_train
    check_label_range(y, model.config.classes, f"y_{split}", str(data_path))  # before waves
    mesh = {"edge_at": parse_cell(edge_at)}
    if activations is not None:
        mesh["activations"] = activations
    if activations == "int8-static":
        model.scales_for_inference()  # said before any wave
    config = load_run_config(mode=mode, model=model.config.model_dump(), mesh=mesh)
    engine = engine_for(config, data)
    try:
        logits = np.concatenate([engine.logits(model, split, idx) for idx in
                                 np.array_split(np.arange(len(y)), -(-len(y) // EVAL_BATCH))])
        comm = engine.report()
    finally:
        engine.close()
    report = classification_report(y, logits.argmax(axis=1), model.config.classes)
    report.update({"model": str(model_path), "data": str(data_path), "split": split,
                   "mode": mode, "activations": config.mesh.activations, "comm": comm})
    if predictions is not None:
        write_predictions(predictions, logits, y)
        report["predictions"] = str(predictions)
    if json_out:
        emit_json(report)
        return
    out_console.print(f"{mode} inference on the {split} split: accuracy "
                      f"{report['accuracy']:.4f} ({report['samples']} samples)")
    if report["comm"]:
        from meshdl.cli.cost import print_comm_summary

        print_comm_summary(report["comm"], console=out_console)


def write_predictions(path: Path, logits: np.ndarray, y: np.ndarray) -> None:
    """One CSV line per sample: its index, predicted label, that prediction's probability
    (an anomaly's for two classes) and the true label."""
    import numpy as np

    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = p.argmax(axis=1)
    probability = p[:, 1] if p.shape[1] == 2 else p[np.arange(len(p)), labels]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["sample", "label", "probability", "true_label"])
        for i, (label, prob, true) in enumerate(zip(labels, probability, y, strict=True)):
            writer.writerow([i, int(label), f"{prob:.6f}", int(true)])


def classification_report(y: np.ndarray, predicted: np.ndarray, classes: int) -> dict:
    """Accuracy, confusion matrix (rows: true class) and per-class precision/recall."""
    import numpy as np

    confusion = np.zeros((classes, classes), np.int64)
    np.add.at(confusion, (y, predicted), 1)
    total = int(confusion.sum())
    per_class = {}
    for c in range(classes):
        tp = int(confusion[c, c])
        per_class[str(c)] = {
            "precision": tp / int(confusion[:, c].sum()) if confusion[:, c].sum() else None,
            "recall": tp / int(confusion[c].sum()) if confusion[c].sum() else None,
        }
    return {"samples": total, "accuracy": float(np.trace(confusion)) / total if total else None,
            "confusion": confusion.tolist(), "per_class": per_class}


def config_show(
    config_file: Config = None,
    json_out: json_option("Print JSON on stdout.") = False,
) -> None:
    """The effective configuration: defaults < TOML file < MESHDL_* environment."""
    from rich.table import Table

    from meshdl.config import load_run_config

    config = load_run_config(config_file)
    if json_out:
        emit_json(config.model_dump(mode="json"))
        return
    table = Table(title="effective configuration", show_header=True)
    table.add_column("key")
    table.add_column("value")
    for section, values in config.model_dump(mode="json").items():
        if isinstance(values, dict):
            for key, value in values.items():
                table.add_row(f"{section}.{key}", str(value))
        else:
            table.add_row(section, str(values))
    out_console.print(table)
    if not config.model.global_pool:  # data generate's default is the global head's size
        out_console.print(global_recipe_said(), highlight=False)


def global_recipe_said() -> str:
    """What a global head takes for what is left unset, in one sentence: `config show`
    of another model says it, since `data generate` makes the recipe's maps."""
    from meshdl.config import (
        GLOBAL_RECIPE,
        RECIPE_SMALL_HEAD,
        RECIPE_SMALL_MAPS,
        recipe_epochs_said,
    )

    model, data = GLOBAL_RECIPE["model"], GLOBAL_RECIPE["data"]
    return (f"A global head (pool = \"global\") takes its own recipe for what is unset: "
            f"{model['filters']} filters, the alive mask, failout, {data['train']:,} "
            f"training maps (`meshdl data generate`'s default), {model['conv_layers']} "
            f"conv layers with a bias per filter and cell at the last (on "
            f"{RECIPE_SMALL_MAPS:,} maps or fewer {RECIPE_SMALL_HEAD['conv_layers']}, "
            f"without it), and its epochs: {recipe_epochs_said()}.")


def config_init(
    path: Path = typer.Argument(..., metavar="FILE", help="The TOML file to write, e.g. "
                                "mesh.toml."),
    rows: Rows = None,
    cols: Cols = None,
    pool: Pool = None,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented configuration file with every setting at its default, the grid
    at --rows x --cols if given: the mesh file `--mesh` and `--config` read (edit, then
    check with `meshdl config show`). The grid is written once, under [model]. With
    --pool global, the settings the global head's recipe sets are written at its values."""
    from meshdl.config import commented_config

    file_to_write(path, force)
    grid = {axis: n for axis, n in (("rows", rows), ("cols", cols)) if n is not None}
    model = {**grid, **({} if pool is None else {"pool": pool})}
    text = commented_config({"model": model} if model else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    but = "".join(f", {axis} {n}" for axis, n in model.items())
    err_console.print(f"wrote {path}: every setting at its default{but}; `meshdl config "
                      f"show --config {path}` shows what a run will use", highlight=False)
