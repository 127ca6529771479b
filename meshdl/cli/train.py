"""`meshdl train`: fit the model on a data set and leave a run directory behind."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshdl.cli.common import emit_json, err_console, parse_cell
from meshdl.cli.cost import print_comm_summary
from meshdl.cli.mqtt_run import BackgroundNodeHost
from meshdl.config import RunConfig, load_run_config
from meshdl.data import Dataset, load_dataset
from meshdl.edge.remote import MqttEngine
from meshdl.errors import UsageError
from meshdl.model import CNN
from meshdl.mqtt import BrokerAddress
from meshdl.protocol import MeshSpec
from meshdl.runs import metrics_record, new_run_dir, single_class_warning, write_run
from meshdl.sim.lounge import generate_lounge
from meshdl.training import Engine, History
from meshdl.training import train as fit


def register(app: typer.Typer) -> None:
    app.command("train")(train)


def train(
    data: Path | None = typer.Option(None, "--data", help="Data set .npz (default: generate "
                                     "the synthetic lounge)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-<name>/)."),
    name: str | None = typer.Option(None, "--name", help="Label of the run directory."),
    config_file: Path | None = typer.Option(None, "--config", help="TOML configuration file."),
    mode: str | None = typer.Option(None, "--mode", help="Where the network runs: mesh "
                                    "(the virtual mesh, default) or central."),
    edge_at: str | None = typer.Option(None, "--edge-at", help="Border cell R,C the edge "
                                       "is linked to (mesh mode)."),
    transport: str = typer.Option("virtual", "--transport", help="Mesh mode: the "
                                  "in-process virtual mesh, or mqtt (the edge here and "
                                  "one node host for every cell, through --broker)."),
    broker: str | None = typer.Option(None, "--broker", help="With --transport mqtt: "
                                      "mqtt://host[:port]."),
    wire: bool | None = typer.Option(None, "--wire/--no-wire", help="Virtual mesh: pass "
                                     "every message through the binary codec, as over "
                                     "MQTT (slower, same results)."),
    rows: int | None = typer.Option(None, "--rows", help="Grid rows."),
    cols: int | None = typer.Option(None, "--cols", help="Grid columns."),
    kernel: int | None = typer.Option(None, "--kernel", help="Filter size k."),
    filters: int | None = typer.Option(None, "--filters", help="Filters per conv layer."),
    conv_layers: int | None = typer.Option(None, "--conv-layers", help="Conv layers."),
    pool: int | None = typer.Option(None, "--pool", help="Max-pool size."),
    hidden: int | None = typer.Option(None, "--hidden", help="Hidden FC units."),
    epochs: int | None = typer.Option(None, "--epochs", help="Training epochs."),
    batch: int | None = typer.Option(None, "--batch", help="Batch size."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate."),
    optimizer: str | None = typer.Option(None, "--optimizer", help="sgd or adam."),
    warmup: float | None = typer.Option(None, "--warmup", help="Share of the updates over "
                                        "which the learning rate ramps up to --lr."),
    clip_norm: float | None = typer.Option(None, "--clip-norm", help="Shorten gradients "
                                           "to this global L2 norm (0: never)."),
    augment: str | None = typer.Option(None, "--augment", help="mirror (train on flipped "
                                       "maps too) or none."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of init and batch order."),
    json_out: bool = typer.Option(False, "--json", help="Print metrics.json on stdout."),
) -> None:
    """Train the CNN and write model.npz, config.json and metrics.json."""
    dataset, source = (load_dataset(data), str(data)) if data else (None, "synthetic lounge")
    if dataset is not None:  # a data file fixes the grid unless the flags say otherwise
        rows = rows if rows is not None else dataset.rows
        cols = cols if cols is not None else dataset.cols
    config = load_run_config(
        config_file,
        mode=mode,
        model={"rows": rows, "cols": cols, "kernel": kernel, "filters": filters,
               "conv_layers": conv_layers, "pool": pool, "hidden": hidden},
        train={"epochs": epochs, "batch": batch, "lr": lr, "optimizer": optimizer,
               "warmup_fraction": warmup, "clip_norm": clip_norm, "augment": augment,
               "seed": seed},
        mesh={"edge_at": parse_cell(edge_at) if edge_at else None, "wire": wire},
    )
    if dataset is None:
        with err_console.status("generating the synthetic lounge data set"):
            dataset = generate_lounge(config.data)
    run_dir = out or new_run_dir(name=name or config.mode)
    if transport == "virtual":
        model, history = _fit_with_progress(config, dataset)
    elif transport == "mqtt" and config.mode == "mesh":
        if not broker:
            raise UsageError("--transport mqtt needs --broker mqtt://host[:port]")
        model, history = _fit_over_mqtt(config, dataset, BrokerAddress.parse(broker))
    else:
        raise UsageError(f"--transport {transport!r}: expected virtual or mqtt (mesh mode)")
    metrics = metrics_record(config, history)
    write_run(run_dir, config, model, metrics, source)
    final = history.final
    err_console.print(
        f"[bold]{config.mode}[/] training{' over MQTT' if transport == 'mqtt' else ''} "
        f"done in {history.wall_s:.1f} s: "
        f"train acc {final['train_acc']:.4f}, test acc {final['test_acc']:.4f} -> {run_dir}",
        highlight=False,
    )
    if warning := single_class_warning(final):
        err_console.print(warning, style="yellow", highlight=False)
    if json_out:
        emit_json(metrics)


def _fit_over_mqtt(config: RunConfig, dataset: Dataset,
                   address: BrokerAddress) -> tuple[CNN, History]:
    """The edge in this process, and a node host for every cell on a thread beside it."""
    cells = list(MeshSpec(config.mesh.mesh_id, config.model).topology.cells())
    with BackgroundNodeHost(config, cells, address, dataset):
        engine = MqttEngine.for_run(config, dataset, address)
        try:
            return _fit_with_progress(config, dataset, engine)
        finally:
            engine.close()


def _fit_with_progress(config: RunConfig, dataset: Dataset,
                       engine: Engine | None = None) -> tuple[CNN, History]:
    """Train with a progress bar on stderr, then list the epochs there."""
    epochs = config.train.epochs
    columns = (TextColumn("epoch {task.fields[epoch]}/" + str(epochs)), BarColumn(),
               MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.4f}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("train", total=None, epoch=1, loss=float("nan"))

        def on_step(epoch: int, step: int, steps: int, loss: float) -> None:
            bar.update(task, total=steps * epochs, completed=(epoch - 1) * steps + step,
                       epoch=epoch, loss=loss)

        model, history = fit(config, dataset, engine=engine, progress=on_step)
    if history.comm.get("classes"):
        print_comm_summary(history.comm)
    for e in history.epochs:
        err_console.print(
            f"epoch {e.epoch:3d}  loss {e.train_loss:.4f}  train {e.train_acc:.4f}  "
            f"test {e.test_acc:.4f}", highlight=False,
        )
    return model, history
