"""Running a mesh over MQTT: `meshdl node run`, `meshdl nodes run`, `meshdl edge run`,
`meshdl ps run` (several meshes training one model), `meshdl doctor`.

The node hosts' serving loop is nodes/serve.py; the edge's engine edge/remote.py. Every
process reads the same mesh file (`--mesh mesh.toml`, the run configuration: grid,
model, mesh id, edge position) and talks to the broker at `--broker URL` with the login
of MESHDL_MQTT_USER / MESHDL_MQTT_PASSWORD (or one in the URL). Node hosts keep running
until stopped (Ctrl+C, SIGTERM); the edge trains and writes its run directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from meshdl.cli.common import err_console, out_console, parse_cell
from meshdl.cli.options import (
    Broker,
    ForceOut,
    JsonMetrics,
    MeshFile,
    NodesTimeout,
    ReplayData,
    RunDirectory,
    Sensor,
    SlotSeconds,
    TakeOver,
    json_option,
)
from meshdl.config import ModelConfig, RunConfig, load_run_config
from meshdl.errors import MeshdlError, UsageError

# The broker session, the node hosts, the edge and the protocol (Numba behind them) load
# when a command runs, not for `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.model.cnn import CNN
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.mqtt.status import StatusRecord
    from meshdl.protocol.topology import Cell
    from meshdl.training.checkpoint import Checkpoint
    from meshdl.training.runs import RunDir

node_app = typer.Typer(help="One sensor node (one cell) of a mesh over MQTT.",
                       no_args_is_help=True)
nodes_app = typer.Typer(help="A node host: many cells over one MQTT connection.",
                        no_args_is_help=True)
edge_app = typer.Typer(help="The edge of a mesh over MQTT.", no_args_is_help=True)
ps_app = typer.Typer(help="The parameter server of several meshes training one model.",
                     no_args_is_help=True)

def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
    app.add_typer(nodes_app, name="nodes")
    app.add_typer(edge_app, name="edge")
    app.add_typer(ps_app, name="ps")
    app.command("doctor")(doctor)


@node_app.command("run")
def node_run(cell: str = typer.Option(..., "--cell", help="This node's cell R,C."),
             broker: Broker = ..., mesh: MeshFile = ..., data: ReplayData = None,
             sensor: Sensor = None, slot_seconds: SlotSeconds = 60.0) -> None:
    """Serve one cell until stopped."""
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.nodes.serve import Readings, serve_cells
    from meshdl.protocol.topics import name_of

    config = load_run_config(mesh)
    where = parse_cell(cell)
    readings = Readings.choose(config, [where], data, sensor, slot_seconds)
    serve_cells(config, [where], BrokerAddress.parse(broker), readings, client=name_of(where),
                say=_say)


@nodes_app.command("run")
def nodes_run(cells: str = typer.Option(..., "--cells", help="ROWS,COLS ranges such as "
                                        "0-3,0-24 (inclusive), or 'all'."),
              broker: Broker = ..., mesh: MeshFile = ..., data: ReplayData = None,
              sensor: Sensor = None, slot_seconds: SlotSeconds = 60.0,
              name: str | None = typer.Option(None, "--name", help="Client name (default: "
                                              "the broker login, else host-<hostname>-<pid>)."
                                              ),
              via_broker: bool = typer.Option(False, "--via-broker", help="Send messages "
                                              "between the served cells through the broker "
                                              "too (as separate nodes would), instead of in "
                                              "process.")) -> None:
    """Serve many cells over one connection until stopped."""
    from meshdl.mqtt.acl import check_host_name
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.nodes.serve import Readings, serve_cells

    if name is not None:  # a node host's name, as its login has: never another's
        try:
            check_host_name(name)
        except ValueError as exc:
            raise UsageError(f"--name: {exc}") from None
    config = load_run_config(mesh)
    served = select_cells(cells, config)
    address = BrokerAddress.parse(broker)
    readings = Readings.choose(config, served, data, sensor, slot_seconds)
    serve_cells(config, served, address, readings, client=name or
                address.username or f"host-{socket.gethostname()}-{os.getpid()}",
                local_delivery=not via_broker, say=_say)


def _say(line: str) -> None:
    err_console.print(line, highlight=False, soft_wrap=True)


def select_cells(text: str, config: RunConfig) -> list[Cell]:
    from meshdl.mqtt.acl import parse_cells

    rows, cols = config.model.rows, config.model.cols
    if text == "all":
        return [(r, c) for r in range(rows) for c in range(cols)]
    try:
        return parse_cells(text, rows, cols)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def doctor(broker: Broker = ...,
           mesh: Path | None = typer.Option(None, "--mesh", help="Also check which cells "
                                            "have a node host online."),
           timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait."),
           json_out: json_option("Print findings as JSON.") = False) -> None:
    """Check the broker, the login and which clients are online (with --mesh: cells)."""
    from meshdl.mqtt.session import BrokerAddress

    address = BrokerAddress.parse(broker)
    config = load_run_config(mesh) if mesh else None
    findings = asyncio.run(_doctor(address, config, timeout))
    if json_out:
        out_console.print_json(json.dumps(findings))
    else:
        for line in findings["lines"]:
            err_console.print(line, highlight=False, soft_wrap=True)
    if not findings["ok"]:
        raise typer.Exit(1)


async def _doctor(address: BrokerAddress, config: RunConfig | None,
                  timeout: float) -> dict:
    from meshdl.mqtt.session import Session
    from meshdl.mqtt.status import parse_status
    from meshdl.protocol.spec import MeshSpec
    from meshdl.protocol.topics import name_of

    mesh_id = config.mesh.mesh_id if config else 1
    online: dict[str, StatusRecord] = {}
    malformed: set[str] = set()  # clients whose status topic holds no valid record
    stale: set[str] = set()  # "online" records replayed by the broker, heartbeat long past

    def status(client: str, payload: bytes, retained: bool) -> None:
        record = parse_status(payload)
        if record is None:
            malformed.add(client)
            return
        malformed.discard(client)
        if record.state == "online" and not record.fresh(time.time(), retained):
            stale.add(client)  # left behind: no host heartbeats under that name
            record = record.model_copy(update={"state": "offline"})
        else:
            stale.discard(client)
        online[client] = record

    lines, ok = [], True
    session = Session(address, mesh_id, f"doctor-{os.getpid()}",
                      [f"meshdl/{mesh_id}/status/#"], status={"role": "doctor"},
                      connect_timeout_s=timeout, on_status=status, presence=False)
    try:
        async with session:
            lines.append(f"ok: connected to {address}" +
                         (f" as {address.username}" if address.username else " anonymously"))
            deadline = time.monotonic() + min(timeout, 2.0)  # retained records come at once
            await session.run(lambda _t, _m: [], until=lambda: time.monotonic() > deadline)
    except MeshdlError as exc:
        return {"ok": False, "lines": [f"error: {exc}"], "online": {}}
    clients = {k: v for k, v in online.items() if not k.startswith("doctor-")}
    up = {k: v for k, v in clients.items() if v.state == "online"}
    lines.append(f"ok: {len(up)} clients online on mesh {mesh_id}"
                 f" ({len(clients) - len(up)} offline)")
    if malformed:
        names = sorted(malformed)
        lines.append(f"warning: {len(names)} status records are not valid and were ignored: "
                     f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
    if stale:
        names = sorted(stale)
        lines.append(f"warning: {len(names)} status records say online but have had no "
                     f"heartbeat for long (counted offline): "
                     f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
    rejected = {client: record.rejected for client, record in sorted(up.items())
                if record.rejected}
    for client, counts in rejected.items():
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:4]
        lines.append(f"note: {client} has rejected {sum(counts.values())} messages ("
                     f"{', '.join(f'{n} {reason}' for reason, n in top)})")
    for client, record in sorted(up.items()):
        if record.failed:
            ok = False
            lines.append(f"error: {client} isolated failing cells: "
                         f"{', '.join(record.failed[:8])}")
    if config is not None:
        served = set().union(*(v.served for v in up.values() if v.role == "node-host"))
        missing = [name_of(c) for c in MeshSpec(mesh_id, config.model).topology.cells()
                   if c not in served]
        if missing:
            ok = False
            lines.append(f"error: {len(missing)} cells have no node host online: "
                         f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        else:
            lines.append("ok: every cell has a node host online")
        if not any(v.role == "edge" for v in up.values()):
            lines.append("note: no edge online")
    return {"ok": ok, "lines": lines, "malformed": sorted(malformed), "stale": sorted(stale),
            "rejected": rejected,
            "online": {k: v.model_dump(mode="json") for k, v in up.items()}}


@edge_app.command("run")
def edge_run(broker: Broker = ..., mesh: MeshFile = ...,
             data: Path = typer.Option(..., "--data", help="Data set .npz (the edge uses "
                                       "its labels; the nodes hold the readings)."),
             out: RunDirectory = None,
             force: ForceOut = False,
             resume: Path | None = typer.Option(None, "--resume", help="Continue the run "
                                                "in this directory from its last "
                                                "checkpoint (same mesh file and data; "
                                                "metrics.json then covers the whole run). "
                                                "A finished run is left as it is; a mesh "
                                                "file with more epochs extends it if its "
                                                "learning rate does not depend on its "
                                                "length (schedule = \"constant\", "
                                                "warmup_fraction = 0)."),
             wave_timeout: float = typer.Option(10.0, "--wave-timeout", min=0.1,
                                                help="Seconds without a message of a wave before "
                                                "it is restarted (3 times this at most)."),
             nodes_timeout: NodesTimeout = 60.0,
             broker_patience: float = typer.Option(
                 120.0, "--broker-patience", min=0.0, help="Seconds to wait for the broker "
                 "when it is away (and, under 10, for any one acknowledgement: at least 1); "
                 "then a checkpoint of every finished update is saved and the run stops (go "
                 "on with --resume)."),
             patience: float = typer.Option(
                 600.0, "--patience", min=0.0, max=86400.0, help="Seconds a wave that fails "
                 "only for loss (every node host heard, nothing refused: a flood keeping a "
                 "host's broker queue full) is tried on after its 5 attempts, with a "
                 "growing timeout, counted from its first attempt; a checkpoint of every "
                 "finished update is saved as it begins (0: stop after the attempts)."),
             take_over: TakeOver = False,
             ps: bool = typer.Option(False, "--ps", help="Train with the other meshes of "
                                     "the mesh file's parallel section, through the "
                                     "parameter server (`meshdl ps run`) on this broker."),
             json_out: JsonMetrics = False) -> None:
    """Train: every batch is a wave through the node hosts; writes the run directory,
    with a checkpoint after every epoch (with --ps: this mesh's shard of every step,
    the server holding the model and its checkpoints)."""
    from meshdl.cli.common import emit_json
    from meshdl.cli.train import say_single_class
    from meshdl.data.datasets import load_dataset
    from meshdl.edge.remote import MqttEngine, Patience
    from meshdl.mqtt.sdnotify import Notifier
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.training.loop import train
    from meshdl.training.runs import (
        metrics_record,
        start_run,
        write_run,
    )

    if resume is not None and out is not None and out != resume:
        raise UsageError("--resume RUN_DIR writes into RUN_DIR: drop --out")
    config = load_run_config(mesh)
    if ps and resume is not None:
        raise UsageError("--ps with --resume: the parameter server holds the checkpoints "
                         "(resume it: `meshdl ps run --resume`); start the edge afresh")
    if ps and config.parallel.meshes < 2:
        raise UsageError(f"--ps: {mesh} trains one mesh alone; its [parallel] section "
                         "says how many meshes train together (meshes = N)")
    # How to go on from a checkpoint: the address as printed, never the password.
    command = (f"meshdl edge run --broker {BrokerAddress.parse(broker)} --mesh {mesh} "
               f"--data {data}")
    checkpoint = _checked_out(out, force, resume, command)
    if checkpoint is not None and _finished(resume, config, checkpoint, command, json_out):
        return
    dataset = load_dataset(data)
    engine = MqttEngine.for_run(config, dataset, BrokerAddress.parse(broker),
                                wave_timeout=wave_timeout, nodes_timeout=nodes_timeout,
                                connect_timeout_s=broker_patience, systemd=Notifier(),
                                take_over=take_over, patience=Patience(total_s=patience))
    engine.say = lambda line: err_console.print(line, highlight=False)
    claimed = _claim(out, force, resume, command, "mqtt")
    run_dir = claimed.path
    try:
        with _running(claimed, command, MeshdlError):
            start_run(run_dir, config, str(data))
            if ps:
                from meshdl.training.edge_run import train_with_server

                model, history = train_with_server(config, dataset, engine)
            else:
                model, history = train(config, dataset, engine=engine, checkpoints=run_dir,
                                       resume=checkpoint)
    finally:
        engine.close()
    metrics = metrics_record(config, history)
    write_run(run_dir, config, model, metrics, str(data))
    dead = history.comm.get("dead_cells")
    err_console.print(f"mqtt training done in {history.wall_s:.1f} s: test acc "
                      f"{history.final['test_acc']:.4f}"
                      f"{'; dead cells ' + ', '.join(dead) if dead else ''} -> {run_dir}",
                      highlight=False)
    say_single_class(history.final)
    if json_out:
        emit_json(metrics)


@ps_app.command("run")
def ps_run(broker: Broker = ..., mesh: MeshFile = ...,
           data: Path = typer.Option(..., "--data", help="Data set .npz (its training "
                                     "maps set the epochs and the normalization)."),
           out: RunDirectory = None,
           force: ForceOut = False,
           resume: Path | None = typer.Option(None, "--resume", help="Go on from the last "
                                              "checkpoint in this run directory."),
           broker_patience: float = typer.Option(120.0, "--broker-patience", min=0.0,
                                                 help="Seconds to wait for the broker (and, "
                                                 "under 10, for any one acknowledgement: at "
                                                 "least 1)."),
           edges_timeout: float = typer.Option(
               600.0, "--edges-timeout", min=1.0, help="Seconds a mesh with steps left "
               "may send nothing (its edge resends every 5 s while it waits); then the "
               "server stops, naming the silent meshes (go on with --resume)."),
           json_out: JsonMetrics = False) -> None:
    """Combine the pushes of the meshes of the mesh file's parallel section and update
    the model they train; a checkpoint after every epoch, model.npz at the end. With
    mesh.auth, every push must carry its mesh's tag (parallel.keys: the key file of
    `meshdl deploy central`)."""
    from meshdl.cli.common import emit_json
    from meshdl.data.augment import training_data
    from meshdl.data.datasets import load_dataset
    from meshdl.mqtt.session import BrokerAddress
    from meshdl.training.parallel import mesh_ids
    from meshdl.training.ps_run import EdgesSilent, ServerRun, serve
    from meshdl.training.runs import (
        metrics_record,
        start_run,
        write_run,
    )

    if resume is not None and out is not None and out != resume:
        raise UsageError("--resume RUN_DIR writes into RUN_DIR: drop --out")
    config = load_run_config(mesh)
    if config.parallel.meshes < 2:
        raise UsageError(f"{mesh}: its [parallel] section trains one mesh (meshes = 1); "
                         "a parameter server combines two or more")
    # How to go on from a checkpoint: the address as printed, never the password.
    command = (f"meshdl ps run --broker {BrokerAddress.parse(broker)} --mesh {mesh} "
               f"--data {data}")
    checkpoint = _checked_out(out, force, resume, command)
    if checkpoint is not None and _finished(resume, config, checkpoint, command, json_out):
        return
    dataset = load_dataset(data)
    claimed = _claim(out, force, resume, command, "ps")
    run_dir = claimed.path

    def said(e) -> None:
        err_console.print(f"epoch {e.epoch:3d}  loss {e.train_loss:.4f}  train (running) "
                          f"{e.train_acc:.4f}", highlight=False)

    run = ServerRun(config, training_data(config.train, dataset), checkpoints=run_dir,
                    resume=checkpoint, on_epoch=said)
    err_console.print(f"parameter server of meshes {', '.join(map(str, mesh_ids(config)))} "
                      f"({config.parallel.sync}) on {BrokerAddress.parse(broker)} -> "
                      f"{run_dir}", highlight=False)
    with _running(claimed, command, EdgesSilent):
        start_run(run_dir, config, str(data))
        asyncio.run(serve(run, BrokerAddress.parse(broker),
                          connect_timeout_s=broker_patience, edges_timeout_s=edges_timeout))
    history = run.history  # the whole run's: epochs, wall time, "parallel" (every stretch)
    metrics = metrics_record(config, history)
    write_run(run_dir, config, run.model, metrics, str(data))
    err_console.print(f"parameter server done: {run.server.version} updates, "
                      f"{run.server.stats['pushes']} pushes -> {run_dir}", highlight=False)
    if json_out:
        emit_json(metrics)


def fit_model_to_mesh(model: CNN, mesh: ModelConfig, model_file: Path) -> CNN:
    """`model` as the mesh file's nodes will run it: they build their layers from the
    mesh file, the edge its head from the model, so the layers must agree; a globally
    pooled model runs on the mesh's grid whatever grid it was trained on
    (`CNN.on_grid`), a windowed one only on its own. UsageError says what differs."""
    differ = [f"{name} {getattr(model.config, name)} against {getattr(mesh, name)}"
              for name in ("in_channels", "kernel", "filters", "conv_layers", "pool")
              if getattr(model.config, name) != getattr(mesh, name)]
    if differ:
        raise UsageError(f"{model_file} does not fit the mesh file's network (the nodes "
                         f"build theirs from it): {', '.join(differ)}; set them in the "
                         "mesh file's [model]")
    try:
        return model.on_grid(mesh.rows, mesh.cols)
    except UsageError as exc:
        raise UsageError(f"{model_file} does not fit the mesh's grid: {exc}") from None


@edge_app.command("serve")
def edge_serve(broker: Broker = ..., mesh: MeshFile = ...,
               model_file: Path = typer.Option(..., "--model", help="model.npz to run."),
               slot_seconds: SlotSeconds = 60.0,
               slots: int = typer.Option(0, "--slots", min=0, help="Stop after this many "
                                         "slots (0: run until stopped)."),
               threshold: float = typer.Option(0.5, "--threshold", min=0.0, max=1.0,
                                               help="Probability from which a slot is an "
                                               "anomaly."),
               nodes_timeout: NodesTimeout = 60.0,
               take_over: TakeOver = False,
               json_out: json_option("Print each alert as a JSON line on stdout.") = False,
               ) -> None:
    """Continuous inference: a wave per time slot on live readings; alerts published."""
    from meshdl.cli.common import emit_json
    from meshdl.edge.remote import MqttEngine
    from meshdl.edge.serve import serve
    from meshdl.model.cnn import CNN
    from meshdl.mqtt.sdnotify import Notifier
    from meshdl.mqtt.session import BrokerAddress

    config = load_run_config(mesh)
    model = fit_model_to_mesh(CNN.load(model_file), config.model, model_file)
    # A slot's wave starts halfway through the slot and must end (or fail) before the
    # next slot's: silent for a quarter of a slot, it gets its PARAMS and BATCH once more.
    engine = MqttEngine.for_run(config, None, BrokerAddress.parse(broker),
                                wave_timeout=slot_seconds / 4, max_attempts=2,
                                nodes_timeout=nodes_timeout, connect_timeout_s=None,
                                systemd=Notifier(), take_over=take_over)

    def show(alert: dict) -> None:
        if json_out:
            emit_json(alert, indent=None)
        else:
            what = (f"error: {alert['error']}" if "error" in alert else
                    f"p(anomaly) {alert['probability']:.3f} -> label {alert['label']}")
            err_console.print(f"{alert['timestamp']} slot {alert['slot']}: {what}",
                              highlight=False)

    try:
        serve(engine, model, slot_seconds, slots or None, threshold, on_alert=show)
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()


def _checked_out(out: Path | None, force: bool, resume: Path | None, command: str
                 ) -> Checkpoint | None:
    """Before anything is read, written or connected: `--out` refused in one line if it
    holds a run (unless `force`), naming `command --resume`; the checkpoint of
    `--resume`, if any."""
    from meshdl.training.checkpoint import load_checkpoint
    from meshdl.training.runs import check_run_dir

    if resume is not None:
        if force:
            raise UsageError("--force replaces the run in --out; --resume goes on with it: "
                             "drop one")
        return load_checkpoint(resume)
    if out is not None:
        check_run_dir(out, force, command)
    return None


@contextmanager
def _running(claimed: RunDir, command: str, failures: type[MeshdlError]) -> Iterator[None]:
    """A run in its claimed directory. If it fails before its first checkpoint, its
    config.json is taken back (it only said what to resume, and there is nothing); a
    failure of `failures` says how to go on, Ctrl-C says where the run stands in one
    line (exit code 130 still)."""
    from meshdl.training.runs import interrupted, with_resume_hint

    try:
        yield
    except failures as exc:
        claimed.abandon()
        raise with_resume_hint(exc, claimed.path, command) from None
    except KeyboardInterrupt:
        claimed.abandon()
        err_console.print(interrupted(claimed.path, command), highlight=False,
                          soft_wrap=True)
        raise
    except BaseException:
        claimed.abandon()
        raise


def _claim(out: Path | None, force: bool, resume: Path | None, command: str, name: str
           ) -> RunDir:
    """The run directory, once every check has passed: the resumed one, `--out` as
    `_checked_out` allowed it, else a new one under runs/ labelled `name`."""
    from meshdl.training.runs import RunDir, claim_run_dir, new_run_dir

    if resume is not None:  # it holds a checkpoint: a failure takes nothing back
        return RunDir(resume, created=False)
    if out is not None:
        return claim_run_dir(out, force, command)
    return RunDir(new_run_dir(name=name), created=True)


def _finished(resume: Path, config: RunConfig, checkpoint: Checkpoint, command: str,
              json_out: bool) -> bool:
    """`--resume` of `resume`: the same run (or more epochs of it), checked before
    anything connects or config.json is written again; True, said in one line and the
    run left as it is, when it has trained all its epochs."""
    from meshdl.cli.common import emit_json
    from meshdl.training.loop import check_same_run
    from meshdl.training.runs import finished_metrics, nothing_to_resume

    check_same_run(checkpoint.config, config)
    done = finished_metrics(resume, config, checkpoint)
    if done is None:
        return False
    err_console.print(nothing_to_resume(resume, config, command), highlight=False,
                      soft_wrap=True)
    if json_out:
        emit_json(done)
    return True
