"""`meshdl train`: fit the model on a data set and leave a run directory behind."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from meshdl.cli.common import emit_json, err_console
from meshdl.cli.flags import GRID, NETWORK, TRAFFIC, TRAINING, Flags, Group, grouped, overrides
from meshdl.cli.options import Config, EdgeAt, ForceOut, JsonMetrics, Meshes, Optimizer
from meshdl.compress_grammar import PLAN
from meshdl.config import DataConfig, RunConfig, load_run_config
from meshdl.errors import MeshdlError, UsageError

# The data, the model, the training loop, the mesh's machines and the protocol (numpy,
# Numba: most of a second) load when a command runs, not for `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.data.datasets import Dataset
    from meshdl.model.cnn import CNN
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.training.checkpoint import Checkpoint
    from meshdl.training.loop import Engine, EpochMetrics, History
    from meshdl.training.runs import RunDir


def register(app: typer.Typer) -> None:
    app.command("train")(train)


# What still applies to a run `--resume` continues (--epochs: more of them, where its
# learning rate allows): everything else is its own.
_RESUMABLE = ("resume", "transport", "broker", "json_out", "epochs")

# When a run may be extended (loop.extension_refusal), said where --resume and --epochs
# are described.
_EXTENSION_RULE = ("A finished run is left as it is; with --epochs N (more than it has) "
                   "it trains on to N epochs, if its learning rate does not depend on its "
                   "length: schedule = \"constant\" and --warmup 0 (the default cosine "
                   "decay with warm-up spans exactly the run's epochs, so such a run is "
                   "refused).")


def _with_help(alias: Any, more: str) -> Any:
    """An Annotated option alias (cli/options.py) with `more` added to its help."""
    info = copy.copy(alias.__metadata__[0])
    info.help = f"{info.help} {more}"
    return Annotated[alias.__origin__, info]


_MORE_EPOCHS = ("With --resume: more epochs than the run has extend it, where its learning "
                "rate allows (see --resume).")
_TRAINING = Group(tuple((name, _with_help(alias, _MORE_EPOCHS) if name == "epochs"
                         else alias, default) for name, alias, default in TRAINING.options))


class Said(KeyboardInterrupt):
    """Ctrl-C whose line (where the run stands, how to go on) is said already."""


def said_on_interrupt(what: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command that says one line on Ctrl-C before `what` (its run) began (data being
    read or made, a plan computed); once the run has a directory, the command says its
    own and raises `Said`. Exit code 130 either way (typer's, for an interrupted
    command)."""
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            try:
                command(*args, **kwargs)
            except Said:
                raise
            except KeyboardInterrupt:
                err_console.print(f"interrupted before {what} began: nothing was written",
                                  highlight=False)
                raise
        return run
    return decorate


@grouped
@said_on_interrupt("training")
def train(
    ctx: typer.Context,
    data: Path | None = typer.Option(None, "--data", help="Data set .npz (default: generate "
                                     "the synthetic lounge)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-<name>/)."),
    name: str | None = typer.Option(None, "--name", help="Label of the run directory."),
    config_file: Config = None,
    mode: Literal["mesh", "central"] | None = typer.Option(
        None, "--mode", help="Where the network runs: mesh (the virtual mesh, default) or "
        "central."),
    edge_at: EdgeAt = None,
    transport: Literal["virtual", "mqtt"] = typer.Option(
        "virtual", "--transport", help="Mesh mode: the in-process virtual mesh, or mqtt "
        "(the edge here and one node host for every cell, through --broker)."),
    broker: str | None = typer.Option(None, "--broker", help="With --transport mqtt: "
                                      "mqtt://host[:port]."),
    wire: bool | None = typer.Option(None, "--wire/--no-wire", help="Virtual mesh: pass "
                                     "every message through the binary codec, as over "
                                     "MQTT (slower, same results)."),
    dispatch: Literal["compiled", "machines"] | None = typer.Option(
        None, "--dispatch", help="Virtual mesh: exact waves in one compiled loop over "
        "every node's plan [default: compiled], or every message through the node "
        "machines (as over MQTT; slower, the same bits)."),
    grid: Flags = GRID, net: Flags = NETWORK, run: Flags = _TRAINING,
    optimizer: Optimizer = None,
    warmup: float | None = typer.Option(None, "--warmup", help="Share of the updates over "
                                        "which the learning rate ramps up to --lr."),
    clip_norm: float | None = typer.Option(None, "--clip-norm", help="Shorten gradients "
                                           "to this global L2 norm (0: never)."),
    augment: Literal["mirror", "none"] | None = typer.Option(
        None, "--augment", help="mirror (train on flipped maps too) or none."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of init and batch order."),
    meshes: Meshes = None,
    sync: str | None = typer.Option(None, "--sync", help="Several meshes: bsp (each step "
                                    "is one model's with batch N x --batch), ssp:S (a "
                                    "mesh at most S updates behind) or async."),
    overlap: bool | None = typer.Option(None, "--overlap/--no-overlap", help="Several "
                                        "meshes: push the head's gradient while the mesh "
                                        "still runs the conv backward, and start each "
                                        "wave on the conv layers' new weights alone."),
    traffic: Flags = TRAFFIC,
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this "
                                       "directory from its last checkpoint, with its own "
                                       "configuration and data; metrics.json then covers "
                                       "the whole run. " + _EXTENSION_RULE),
    force: ForceOut = False,
    json_out: JsonMetrics = False,
) -> None:
    """Train the CNN and write model.npz, config.json and metrics.json."""
    from meshdl.data.datasets import load_dataset
    from meshdl.training.runs import (
        SYNTHETIC,
        RunDir,
        check_run_dir,
        claim_run_dir,
        data_source_of,
        finished_metrics,
        new_run_dir,
        nothing_to_resume,
        resumed_run,
        with_epochs,
    )

    if resume is not None:
        given = ["/".join(p.opts + p.secondary_opts) for p in ctx.command.params
                 if p.name not in _RESUMABLE and ctx.params[p.name] != p.default]
        if given:
            raise UsageError(f"--resume continues the run as it was configured: drop "
                             f"{', '.join(given)}")
        config, source, checkpoint = resumed_run(resume)
        config = with_epochs(config, run["epochs"])
        if (done := finished_metrics(resume, config, checkpoint)) is not None:
            err_console.print(nothing_to_resume(resume, config, _go_on_command(
                transport, broker)), highlight=False, soft_wrap=True)
            if json_out:
                emit_json(done)
            return
        dataset = (generate_lounge(config.data) if source == SYNTHETIC
                   else load_dataset(Path(source)))
        extended = "" if checkpoint.config["train"]["epochs"] == config.train.epochs else \
            f" (extended from {checkpoint.config['train']['epochs']})"
        err_console.print(f"resuming {resume} after epoch {checkpoint.epochs_done} of "
                          f"{config.train.epochs}{extended}", highlight=False)
        # Its own directory: it holds a checkpoint, so a failure takes nothing back.
        _run(config, dataset, source, lambda: RunDir(resume, created=False), checkpoint,
             transport, broker, json_out)
        return
    if out is not None:  # said before any data is read or made; claimed after validation
        check_run_dir(out, force)
    dataset = load_dataset(data) if data else None
    config = load_run_config(
        config_file,
        # A data file's grid is the grid unless the TOML file, the environment or the
        # flags say otherwise (then they must agree with it).
        data_grid=None if dataset is None else (dataset.rows, dataset.cols),
        # and its size the global recipe's epochs (config.recipe_epochs).
        data_maps=None if dataset is None else len(dataset.y_train),
        mode=mode,
        **overrides(grid, net, run, traffic, optimizer=optimizer, warmup=warmup,
                    clip_norm=clip_norm, augment=augment, seed=seed, edge_at=edge_at,
                    wire=wire, dispatch=dispatch, meshes=meshes, sync=sync,
                    overlap=overlap),
    )
    if dataset is None:
        with err_console.status("generating the synthetic lounge data set"):
            dataset = generate_lounge(config.data)

    def claim() -> RunDir:
        if out is not None:
            return claim_run_dir(out, force)
        return RunDir(new_run_dir(name=name or config.mode), created=True)

    _run(config, dataset, data_source_of(data), claim, None, transport, broker, json_out)


def _run(config: RunConfig, dataset: Dataset, source: str, claim: Callable[[], RunDir],
         checkpoint: Checkpoint | None, transport: str, broker: str | None,
         json_out: bool) -> None:
    """Train (from `checkpoint`, if any), checkpointing into the run directory `claim()`
    gives once every check has passed (a refused run writes nothing); then report."""
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.training.runs import (
        interrupted,
        metrics_record,
        start_run,
        with_resume_hint,
        write_run,
    )

    if transport not in ("virtual", "mqtt") or (transport == "mqtt" and config.mode != "mesh"):
        raise UsageError(f"--transport {transport!r}: expected virtual or mqtt (mesh mode)")
    if transport == "mqtt" and not broker:
        raise UsageError("--transport mqtt needs --broker mqtt://host[:port]")
    if transport == "mqtt" and config.parallel.meshes > 1:
        raise UsageError("--meshes runs virtual meshes: several meshes over MQTT are "
                         "not built yet")
    dataset.require_classes(config.model.classes, source)  # before a run directory exists
    if config.mesh.compress == PLAN:
        config = plan_for(config, dataset, PLAN_RADIO, "wifi")
    address = BrokerAddress.parse(broker) if transport == "mqtt" else None
    if address is not None:  # before a run directory or a progress bar
        address.check_reachable()
    claimed = claim()
    run_dir = claimed.path
    command = _go_on_command(transport, broker)
    try:
        start_run(run_dir, config, source)
        fit = Fit(checkpoints=run_dir, resume=checkpoint)
        if address is None:
            model, history = fit_with_progress(config, dataset, fit)
        else:
            model, history = _fit_over_mqtt(config, dataset, address, fit)
    except MeshdlError as exc:  # a broker away too long, a diverged run: say how to go on
        claimed.abandon()
        raise with_resume_hint(exc, run_dir, command) from None
    except KeyboardInterrupt:  # Ctrl-C: say where the run stands (exit code 130 still)
        claimed.abandon()
        err_console.print(interrupted(run_dir, command), highlight=False, soft_wrap=True)
        raise Said from None
    except BaseException:  # a bug: no config.json without a checkpoint
        claimed.abandon()
        raise
    metrics = metrics_record(config, history)
    write_run(run_dir, config, model, metrics, source)
    final = history.final
    meshes = f" on {config.parallel.meshes} meshes ({history.parallel['sync']})" \
        if history.parallel else ""
    err_console.print(
        f"[bold]{config.mode}[/] training{meshes}"
        f"{' over MQTT' if transport == 'mqtt' else ''} "
        f"done in {history.wall_s:.1f} s: "
        f"train acc {final['train_acc']:.4f}, test acc {final['test_acc']:.4f} -> {run_dir}",
        highlight=False,
    )
    say_single_class(final)
    if json_out:
        emit_json(metrics)


def say_single_class(final: dict[str, Any]) -> None:
    """The one-line warning of a run that ended predicting one class (runs.py's
    `single_class_warning`), on stderr; nothing for any other run."""
    from meshdl.training.runs import single_class_warning

    if warning := single_class_warning(final):
        err_console.print(warning, style="yellow", highlight=False, soft_wrap=True)


def _go_on_command(transport: str, broker: str | None) -> str:
    """The command that resumes a run as it was trained (over MQTT: through the same
    broker, its address as printed: never a password)."""
    from meshdl.mqtt.session import BrokerAddress

    if transport != "mqtt" or not broker:
        return "meshdl train"
    return f"meshdl train --transport mqtt --broker {BrokerAddress.parse(broker)}"


PLAN_RADIO = "802.15.4"  # what `--compress plan` plans for in the virtual mesh


def generate_lounge(config: DataConfig) -> Dataset:
    """The synthetic lounge data set (meshdl/data/lounge.py), its generator loaded when
    first used; a name of this module, so that a test can replace it."""
    from meshdl.data.lounge import generate_lounge as generate

    return generate(config)


def plan_for(config: RunConfig, dataset: Dataset, radio: str, backhaul: str) -> RunConfig:
    """`--compress plan`: the run with the optimal plan for `radio` (sim/studies/schedule.py),
    said on stderr."""
    from meshdl.data.augment import training_data
    from meshdl.sim.radio.backhaul import backhaul_profile
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.studies.schedule import resolve_plan

    with err_console.status(f"planning the compression for {radio}"):
        config, plan = resolve_plan(config, training_data(config.train, dataset, config.model),
                                    profile(radio), natural_medium(radio),
                                    backhaul_profile(backhaul))
    err_console.print(f"compression plan for {radio}: "
                      + ", ".join(f"{k} {v}" for k, v in plan.items()), highlight=False)
    return config


@dataclass(frozen=True)
class Fit:
    """Where a run checkpoints, and the checkpoint it goes on from."""

    checkpoints: Path
    resume: Checkpoint | None = None


def _fit_over_mqtt(config: RunConfig, dataset: Dataset, address: BrokerAddress,
                   fit: Fit) -> tuple[CNN, History]:
    """The edge in this process, and a node host for every cell on a thread beside it."""
    from meshdl.edge.remote import MqttEngine
    from meshdl.nodes.serve import BackgroundNodeHost
    from meshdl.protocol.spec import MeshSpec

    cells = list(MeshSpec(config.mesh.mesh_id, config.model).topology.cells())
    with BackgroundNodeHost(config, cells, address, dataset):
        engine = MqttEngine.for_run(config, dataset, address)
        try:
            return fit_with_progress(config, dataset, fit, engine)
        finally:
            engine.close()


def fit_with_progress(config: RunConfig, dataset: Dataset, fit: Fit,
                       engine: Engine | None = None, **parallel: Any) -> tuple[CNN, History]:
    """Train with a progress bar on stderr and each epoch's line as it ends (plain lines
    when stderr is not a terminal: a CI log or `| tee` sees the run go); the
    communication summary comes after the epochs. Several meshes train through
    `train_parallel`, which `parallel` options go to (engines, clock, backhaul)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from meshdl.cli.cost import print_comm_summary
    from meshdl.training.loop import train as train_model
    from meshdl.training.parallel import train_parallel

    epochs = config.train.epochs
    columns = (TextColumn("epoch {task.fields[epoch]}/" + str(epochs)), BarColumn(),
               MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.4f}"),
               TimeElapsedColumn())
    # No bar off a terminal: it would only leave a blank line where it stopped.
    with Progress(*columns, console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task("train", total=None, epoch=1, loss=float("nan"))

        def on_step(epoch: int, step: int, steps: int, loss: float) -> None:
            bar.update(task, total=steps * epochs, completed=(epoch - 1) * steps + step,
                       epoch=epoch, loss=loss)

        def on_epoch(e: EpochMetrics) -> None:
            # "running": the epoch's own forward passes, before each update (the final
            # line's train acc is the trained model's, read afterwards)
            bar.console.print(f"epoch {e.epoch:3d}  loss {e.train_loss:.4f}  train (running) "
                              f"{e.train_acc:.4f}  test {e.test_acc:.4f}", highlight=False)

        if config.parallel.meshes > 1:
            model, history = train_parallel(config, dataset, progress=on_step,
                                            checkpoints=fit.checkpoints, resume=fit.resume,
                                            on_epoch=on_epoch, **parallel)
        else:
            model, history = train_model(config, dataset, engine=engine, progress=on_step,
                                         checkpoints=fit.checkpoints, resume=fit.resume,
                                         on_epoch=on_epoch)
    if history.comm.get("classes"):
        print_comm_summary(history.comm)
    return model, history
