"""`meshdl evaluate`, `meshdl infer` and `meshdl config show|init`: look at a trained model,
or at a configuration, or write one to start from.

numpy, the model (Numba) and the data sets are imported by the commands that use them,
not with the module: `meshdl --help` builds every command's options and runs none.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer

from meshdl.cli.common import emit_json, err_console, out_console
from meshdl.cli.options import (
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
from meshdl.errors import MeshdlError

if TYPE_CHECKING:
    import numpy as np


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
    app.command("infer")(infer)
    config_app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)
    config_app.command("show")(config_show)
    config_app.command("init")(config_init)
    app.add_typer(config_app, name="config")


def evaluate(
    model_path: ModelFile,
    data_path: DataFile,
    split: Literal["test", "train", "all"] = typer.Option("test", "--split",
                                                          help="The samples to evaluate."),
    dead: float = typer.Option(0.0, "--dead", min=0.0, max=0.99, help="Share of the cells "
                               "read as dead (no reading, no output: zeros), as failout "
                               "draws them."),
    dead_seed: int = typer.Option(0, "--dead-seed", min=0, help="Which cells --dead takes."),
    json_out: JsonReport = False,
) -> None:
    """Accuracy and confusion matrix of a saved model on a data set (all its cells, or
    with --dead some read as dead)."""
    import numpy as np
    from rich.table import Table

    from meshdl.data.datasets import check_label_range, load_split
    from meshdl.model.cnn import CNN
    from meshdl.training.failout import failout_cells

    model = CNN.load(model_path)
    # Only the splits asked for are read: a gap in the other one is no reason to refuse.
    names = ("train", "test") if split == "all" else (split,)
    parts = [load_split(data_path, part) for part in names]
    # The confusion matrix is indexed by the true labels: each must be a class.
    for part, (_, labels) in zip(names, parts, strict=True):
        check_label_range(labels, model.config.classes, f"y_{part}", str(data_path))
    X = np.concatenate([x for x, _ in parts])
    y = np.concatenate([t for _, t in parts])
    model = model.on_grid(*X.shape[1:])  # global pooling: any grid; else the model's
    cells = failout_cells(model.config.rows, model.config.cols, dead, dead_seed, 0)
    predicted = np.concatenate([model.predict(X[i : i + 500], cells)
                                for i in range(0, len(X), 500)])
    report = classification_report(y, predicted, model.config.classes)
    report.update({"model": str(model_path), "data": str(data_path), "split": split,
                   "dead": dead, "dead_cells": len(cells)})
    if json_out:
        emit_json(report)
        return
    table = Table(title=f"{split} split: accuracy {report['accuracy']:.4f} "
                        f"({report['samples']} samples)")
    table.add_column("true \\ predicted")
    for c in range(model.config.classes):
        table.add_column(str(c), justify="right")
    for c, row in enumerate(report["confusion"]):
        table.add_row(str(c), *(str(v) for v in row))
    out_console.print(table)


def infer(
    model_path: ModelFile,
    data_path: DataFile,
    mode: Literal["mesh", "central"] = typer.Option(
        "mesh", "--mode", help="mesh (inference waves in the virtual mesh) or central."),
    split: Literal["test", "train"] = typer.Option("test", "--split",
                                                   help="The samples to predict."),
    edge_at: EdgeAt = "0,0",
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
    config = load_run_config(mode=mode, model=model.config.model_dump(),
                             mesh={"edge_at": parse_cell(edge_at)})
    engine = engine_for(config, data)
    try:
        logits = np.concatenate([engine.logits(model, split, idx) for idx in
                                 np.array_split(np.arange(len(y)), -(-len(y) // EVAL_BATCH))])
        comm = engine.report()
    finally:
        engine.close()
    report = classification_report(y, logits.argmax(axis=1), model.config.classes)
    report.update({"model": str(model_path), "data": str(data_path), "split": split,
                   "mode": mode, "comm": comm})
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

    if path.exists() and not force:
        raise MeshdlError(f"{path} exists; pass --force to overwrite it")
    grid = {axis: n for axis, n in (("rows", rows), ("cols", cols)) if n is not None}
    model = {**grid, **({} if pool is None else {"pool": pool})}
    text = commented_config({"model": model} if model else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    but = "".join(f", {axis} {n}" for axis, n in model.items())
    err_console.print(f"wrote {path}: every setting at its default{but}; `meshdl config "
                      f"show --config {path}` shows what a run will use", highlight=False)
