"""`meshdl simulate train|infer|compare`: the mesh under simulated time, on a radio.

`train` and `infer` take `meshdl train`'s flags and run the same loop with the virtual
mesh's machines on a discrete-event clock (sim/timed.py), over a shared radio or an
MQTT star; the run directory holds what `meshdl train` writes plus sim.json (makespans,
energy per node, bytes and frames, and the cloud-heavy baseline on the same radio),
trace.jsonl (one line per transmission) and energy.png (joules per node over the grid).
`compare` puts in-mesh computing next to shipping every reading to the edge, per radio
and per network shape.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from pydantic import ValidationError

from meshdl.cli.common import emit_json, err_console, parse_cell
from meshdl.cli.flags import GRID, NETWORK, TRAFFIC, TRAINING, Flags, Group, grouped, overrides
from meshdl.cli.options import (
    Activations,
    BackhaulName,
    Cols,
    ConvLayers,
    EdgeAt,
    Filters,
    ForceOut,
    Hidden,
    JsonSim,
    Kernel,
    LabelledData,
    Meshes,
    Pool,
    RadioFile,
    Rows,
    json_option,
)
from meshdl.cli.train import (
    Fit,
    Said,
    fit_with_progress,
    plan_for,
    said_on_interrupt,
    say_single_class,
)
from meshdl.compress_grammar import PLAN
from meshdl.config import RunConfig, load_run_config, model_from_flags, recipe_default
from meshdl.errors import UsageError, format_validation_error

STATIC = "int8-static"  # `--activations`'s exact 8-bit inference (protocol/activations.py)
CALIBRATION_MAPS = 2400  # a fresh model's calibration: one lounge's training maps

# The simulator, the model, the data and the protocol (numpy, Numba: most of a second)
# load when a command runs, not for `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.data.datasets import Dataset
    from meshdl.model.cnn import CNN
    from meshdl.protocol.spec import Mode
    from meshdl.protocol.topology import Cell
    from meshdl.sim.besteffort import BestEffort
    from meshdl.sim.faults.stragglers import Stragglers
    from meshdl.sim.radio.device import DeviceProfile
    from meshdl.sim.radio.mac import MacParams
    from meshdl.sim.radio.profiles import RadioProfile
    from meshdl.sim.timed import TimedMesh
    from meshdl.training.runs import RunDir

# Values --help shows, written here so that it need not load the simulator: the
# protocol's (protocol/deadlines.py DEFAULT_K, Policy) and the simulator's (built-in
# devices, media), which tests/test_cli_startup.py checks these agree with.
PATIENCE = 4.0
DeviceName = Literal["cortex-m4", "pi-zero-2w", "pi4"]
MediumName = Literal["shared", "star"]
RecoveryName = Literal["reliable", "best-effort"]
PolicyName = Literal["zero", "last", "neighbours"]

app = typer.Typer(help="Run the mesh under simulated time: radios, devices, energy, and "
                  "the cloud-heavy baseline.", no_args_is_help=True)

# The simulated radio, devices and faults: what `simulate train` and `infer` share.
Radio = Annotated[str, typer.Option("--radio", help="Radio profile (see meshdl radio "
                                    "list).")]
Medium = Annotated[MediumName, typer.Option(
    "--medium", help="shared (a radio mesh: one-hop neighbours share the air) or star "
    "(every node through an MQTT broker's access point).")]
NodeDevice = Annotated[DeviceName | None, typer.Option(
    "--device", help="Nodes' computer (default: a Pi Zero 2 W on Wi-Fi, a Cortex-M4 on "
    "the low-power radios, as their motes carry).")]
EdgeDevice = Annotated[DeviceName, typer.Option("--edge-device", help="The edge's computer.")]
Loss = Annotated[float, typer.Option(
    "--loss", help="Share of frames the links lose (0 <= P < 1). Reliable recovery: the "
    "link layer retries and senders recover what is still lost, so the results are the "
    "lossless run's, at the cost sim.json shows; best effort: what is still lost stays "
    "lost.")]
Dead = Annotated[float, typer.Option(
    "--dead", help="Share of the cells whose node is dead from the start (0 <= F < 1, "
    "picked by --fault-seed; never the edge's), for the protocol to find (best effort): "
    "the plan then goes around them and their readings are filled in by --policy.")]
Attach = Annotated[list[str] | None, typer.Option(
    "--attach", help="Another border cell R,C the edge may attach to when its own dies "
    "(repeat, in order of preference).")]
Recovery = Annotated[RecoveryName, typer.Option(
    "--recovery", help="reliable (every message arrives: exact) or best-effort (parties "
    "give up at deadlines and fill in what is missing by --policy).")]
FillIn = Annotated[PolicyName, typer.Option(
    "--policy", help="Best effort: what fills in a missing message: zero, last (its "
    "cells' last level) or neighbours (the mean of the neighbouring cells at hand).")]
Patience = Annotated[float, typer.Option(
    "--patience", help="Best effort: how many mean deviations past a message's smoothed "
    "arrival time a party waits for it (RFC 6298's K).")]
Burst = Annotated[float | None, typer.Option(
    "--burst", help="Mean burst of lost frames (Gilbert-Elliott links; default: each "
    "frame lost on its own, Bernoulli).")]
FaultSeed = Annotated[int, typer.Option("--fault-seed", help="Seed of the frames lost, "
                                        "the stragglers and the dead cells picked (--dead "
                                        "takes the cells `evaluate --dead --fault-seed` "
                                        "takes).")]
StragglerShare = Annotated[float, typer.Option(
    "--stragglers", help="Share of the cells whose CPU is slower than their device (0 to "
    "1, picked by --fault-seed).")]
Slowdown = Annotated[float, typer.Option("--straggler-slowdown", help="How many times "
                                         "slower a straggler computes.")]

SIMULATED = Group.of(
    radio=(Radio, "802.15.4"), medium=(Medium, "shared"), node_device=NodeDevice,
    edge_device=(EdgeDevice, "pi4"), radios=RadioFile, loss=(Loss, 0.0), burst=Burst,
    fault_seed=(FaultSeed, 0), stragglers=(StragglerShare, 0.0),
    slowdown=(Slowdown, 10.0), dead=(Dead, 0.0), attach=Attach,
    recovery=(Recovery, "reliable"), policy=(FillIn, "zero"),
    patience=(Patience, PATIENCE))


def _best_effort(recovery: str, policy: str, patience: float) -> BestEffort | None:
    from meshdl.protocol.deadlines import DEFAULT_K, Policy
    from meshdl.sim.besteffort import BestEffort

    if recovery == "reliable":
        if policy != Policy.ZERO or patience != DEFAULT_K:
            raise UsageError("--policy and --patience are for --recovery best-effort "
                             "(reliable recovery never fills anything in)")
        return None
    return BestEffort(Policy(policy), patience)


def _dead(fraction: float, seed: int, config: RunConfig, recovery: str) -> frozenset[Cell]:
    from meshdl.sim.faults.dead import dead_cells

    if fraction and recovery != "best-effort":
        raise UsageError(f"--dead {fraction}: dead nodes are found by missed deadlines, "
                         "which need --recovery best-effort (reliable recovery would "
                         "wait for them forever)")
    try:  # the draw `evaluate --dead --fault-seed` makes: the same seed, the same cells
        return dead_cells(config.model.rows, config.model.cols, fraction, seed,
                          config.mesh.edge_at)
    except ValidationError as exc:
        raise UsageError(f"--dead {fraction}: {format_validation_error(exc)}") from None


def _attach(cells: list[str] | None, config: RunConfig, recovery: str) -> tuple[Cell, ...]:
    from meshdl.protocol.topology import Topology

    chosen = tuple(parse_cell(cell) for cell in cells or ())
    if chosen and recovery != "best-effort":
        raise UsageError("--attach: the edge finds its cell dead by missed deadlines, "
                         "which need --recovery best-effort")
    for cell in chosen:
        if not Topology(config.model.rows, config.model.cols).on_border(cell):
            raise UsageError(f"--attach {cell[0]},{cell[1]}: the edge attaches to a cell "
                             f"on the border of the {config.model.rows} x "
                             f"{config.model.cols} grid")
    return chosen


def _stragglers(fraction: float, slowdown: float, seed: int) -> Stragglers:
    from meshdl.sim.faults.stragglers import Stragglers

    try:
        return Stragglers(fraction=fraction, slowdown=slowdown, seed=seed)
    except ValidationError as exc:
        raise UsageError(f"--stragglers {fraction} --straggler-slowdown {slowdown}: "
                         f"{format_validation_error(exc)}") from None


@app.callback()
def _simulate() -> None:
    """Simulated time, radios and energy."""


def _profiles(radio: str, medium: str, node: str | None, edge: str, radios: Path | None
              ) -> tuple[RadioProfile, DeviceProfile, DeviceProfile]:
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.profiles import profile

    chosen = profile(radio, radios)
    node = node or natural_device(chosen.name)
    return chosen, device(node), device(edge)


def _parties(sim: Flags, radio: str | None = None
             ) -> tuple[RadioProfile, DeviceProfile, DeviceProfile]:
    """The radio and the devices of the `SIMULATED` flags (on `radio` if given)."""
    return _profiles(radio or sim["radio"], sim["medium"], sim["node_device"],
                     sim["edge_device"], sim["radios"])


def _faults(sim: Flags, config: RunConfig, fault_seed: int) -> dict[str, Any]:
    """A mesh's faults and recovery as `SimEngine` takes them, drawn by `fault_seed`."""
    from meshdl.sim.radio.loss import FrameLoss

    recovery = sim["recovery"]
    return {"loss": FrameLoss(sim["loss"], sim["burst"], fault_seed),
            "stragglers": _stragglers(sim["stragglers"], sim["slowdown"], fault_seed),
            "best_effort": _best_effort(recovery, sim["policy"], sim["patience"]),
            "failing": _dead(sim["dead"], fault_seed, config, recovery),
            "attach": _attach(sim["attach"], config, recovery)}


def _data_and_config(data: Path | None, config_file: Path | None,
                     flags: dict[str, dict[str, Any]], grid: tuple[int, int] | None = None,
                     one_lounge: bool = False) -> tuple[Dataset, RunConfig, str]:
    """The run's data set, configuration and the data's source. The grid is the flags'
    (or the config file's), else the data file's, else `grid` (a trained model's), else
    the default; a data file of another grid than the run's is refused (its maps would
    be read out of bounds). `one_lounge`: a generated set's training split is at most
    one lounge's (`LOUNGE_TRAIN`), for a run that replays the test maps, which are the
    first lounge's whatever the training split (meshdl/data/lounge.py): 40,800 maps of
    100 x 100 took 2 minutes and 7 GB to make, and the global recipe's are four times as
    many."""
    from meshdl.data.datasets import load_dataset
    from meshdl.data.lounge import LOUNGE_TRAIN, generate_lounge

    dataset, source = (load_dataset(data), str(data)) if data else (None, "synthetic lounge")
    # A data set's size sets the global head's epochs (40 on 2,400 maps, 12 on 163,200).
    config = load_run_config(config_file, mode="mesh", **flags, data_grid=grid if
                             dataset is None else (dataset.rows, dataset.cols),
                             data_maps=None if dataset is None else len(dataset.y_train))
    run_grid = (config.model.rows, config.model.cols)
    if dataset is not None and (dataset.rows, dataset.cols) != run_grid:
        raise UsageError(f"{data} holds {dataset.rows} x {dataset.cols} maps but the run's "
                         f"grid is {run_grid[0]} x {run_grid[1]} (--rows/--cols or the "
                         "config file): drop them or pass data of that grid")
    if dataset is None and one_lounge and config.data.train > LOUNGE_TRAIN:
        config = config.model_copy(update={"data": config.data.model_copy(
            update={"train": LOUNGE_TRAIN})})
    if dataset is None:
        with err_console.status("generating the synthetic lounge data set"):
            dataset = generate_lounge(config.data)
    return dataset, config, source


@app.command("train")
@grouped
@said_on_interrupt("the simulation")
def simulate_train(
    data: LabelledData = None,
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-simulate/)."),
    force: ForceOut = False,
    config_file: Path | None = typer.Option(None, "--config", help="TOML configuration."),
    edge_at: EdgeAt = None,
    grid: Flags = GRID, net: Flags = NETWORK, run: Flags = TRAINING,
    seed: int | None = typer.Option(None, "--seed", help="Seed of init, batch order and "
                                    "the radios' backoffs."),
    sim: Flags = SIMULATED,
    trace: bool = typer.Option(False, "--trace/--no-trace", help="Write trace.jsonl (one "
                               "line per transmission: long for long runs)."),
    meshes: Meshes = None,
    sync: str | None = typer.Option(None, "--sync", help="Several meshes: bsp, ssp:S or "
                                    "async."),
    overlap: bool | None = typer.Option(None, "--overlap/--no-overlap", help="Several "
                                        "meshes: layer-wise overlap of the backhaul "
                                        "with the waves."),
    backhaul: BackhaulName = typer.Option("wifi", "--backhaul", help="Several meshes: the "
                                          "edges' link to the server."),
    straggler_radio: str | None = typer.Option(None, "--straggler-radio", help="Several "
                                               "meshes: the last one runs on this radio "
                                               "(a straggler mesh)."),
    traffic: Flags = TRAFFIC,
    json_out: JsonSim = False,
) -> None:
    """Train in the mesh under simulated time; sim.json says what it took on the radio."""
    from meshdl.data.augment import originals, training_data
    from meshdl.model.cnn import CNN
    from meshdl.protocol.spec import Mode
    from meshdl.sim.radio.backhaul import backhaul_profile
    from meshdl.sim.simulate import SimEngine, mesh_summary
    from meshdl.sim.studies import cloud, compare
    from meshdl.training.runs import (
        check_run_dir,
        metrics_record,
        start_run,
        write_run,
    )

    if out is not None:  # said before any data is read or made; claimed after validation
        check_run_dir(out, force, resume=None)
    radio_profile, node, edge = _parties(sim)
    medium = sim["medium"]
    dataset, config, source = _data_and_config(data, config_file, overrides(
        grid, net, run, traffic, seed=seed, edge_at=edge_at, meshes=meshes, sync=sync,
        overlap=overlap))
    if config.mesh.compress == PLAN:
        config = plan_for(config, dataset, radio_profile.name, backhaul)
    n_meshes = config.parallel.meshes
    link = backhaul_profile(backhaul)
    if straggler_radio is not None and n_meshes < 2:
        raise UsageError("--straggler-radio needs --meshes 2 or more")
    view = training_data(config.train, dataset, config.model)

    def engine_of(i: int) -> SimEngine:
        """Mesh i: its own id, backoffs and faults (seeds offset by i); the last one
        on the straggler's radio, if any."""
        chosen, nodes = radio_profile, node
        if straggler_radio is not None and i == n_meshes - 1:
            chosen, nodes, _ = _parties(sim, straggler_radio)
        return SimEngine(view, chosen, medium, nodes, edge, seed=config.train.seed + i,
                         trace=trace and i == 0, edge_at=config.mesh.edge_at,
                         mesh_id=config.mesh.mesh_id if n_meshes == 1 else
                         config.parallel.first_mesh_id + i,
                         params_via=_params_via(config, medium),
                         max_message_bytes=config.mesh.max_message_bytes,
                         **_faults(sim, config, sim["fault_seed"] + i),
                         compress=config.mesh.compress,
                         activations=config.mesh.activations)

    engines = [engine_of(i) for i in range(n_meshes)]
    for one in engines:
        one.spec_for(CNN(config.model))  # an impossible mesh fails here, before the run
    engine = engines[0]
    claimed = _claim(out, force, "simulate")
    run_dir = claimed.path
    with _kept_if_finished(claimed, "meshdl simulate train"):
        start_run(run_dir, config, source)
        model, history = fit_with_progress(
            config, dataset, Fit(checkpoints=run_dir), engine if n_meshes == 1 else None,
            engines=engines, wave_time=lambda all_, i: all_[i].last_wave_shape,
            time_unit="s", backhaul=link)
        mesh = engine.mesh
        assert mesh is not None
        steps = sum(1 for w in mesh.waves if w.mode == Mode.TRAIN)
        # The edge mirrors maps itself: only the sensors' own readings are shipped.
        baseline = {variant: cloud.training_run(
            mesh.spec, radio_profile, medium, node, edge, originals(view), steps,
            config.train.batch, variant, config.train.seed)
            for variant in compare.variants(medium)}
        several = {} if n_meshes == 1 else {"parallel": history.parallel,
                                            "meshes": [mesh_summary(e) for e in engines]}
        report = _finish(run_dir, mesh, Mode.TRAIN, baseline, trace, several,
                         epochs=config.train.epochs)
        write_run(run_dir, config, model, metrics_record(config, history, {"sim": report}),
                  source)
    _say(report, run_dir)
    if several:
        _say_meshes(history.parallel)
    say_single_class(history.final)  # as `meshdl train` says it
    if json_out:
        emit_json(report)


@app.command("infer")
@grouped
@said_on_interrupt("the simulation")
def simulate_infer(
    model_path: Path | None = typer.Option(None, "--model", help="A trained model.npz "
                                           "(default: a fresh one; the cost of a wave "
                                           "does not depend on the weights)."),
    data: LabelledData = None,
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-simulate-infer/)."),
    force: ForceOut = False,
    edge_at: EdgeAt = None,
    grid: Flags = GRID,
    net: Flags = NETWORK,
    batch: int = typer.Option(1, "--batch", help="Samples per wave (1: one time slot)."),
    waves: int = typer.Option(1, "--waves", help="Inference waves (time slots)."),
    activations: Activations = None,
    seed: int | None = typer.Option(None, "--seed", help="Seed of a fresh model and of the "
                                    "radios' backoffs."),
    sim: Flags = SIMULATED,
    trace: bool = typer.Option(True, "--trace/--no-trace", help="Write trace.jsonl."),
    json_out: JsonSim = False,
) -> None:
    """Inference waves under simulated time (one time slot each, by default)."""
    import numpy as np

    from meshdl.data.augment import as_read_by
    from meshdl.protocol.spec import Mode
    from meshdl.protocol.topics import name_of
    from meshdl.sim.faults.dead import cell_numbers, found_line
    from meshdl.sim.simulate import SimEngine
    from meshdl.sim.studies import cloud, compare
    from meshdl.training.runs import check_run_dir, start_run

    if batch < 1 or waves < 1:
        raise UsageError("--batch and --waves must be at least 1")
    if out is not None:  # said before any data is read or made; claimed after validation
        check_run_dir(out, force, resume=None)
    radio_profile, node, edge = _parties(sim)
    medium = sim["medium"]
    model, dataset, config, source = _model_and_data(model_path, data, grid, net, seed,
                                                     edge_at, activations=activations)
    # Its nodes hold the data as the model reads it (the alive mask beside each reading;
    # no mirrors: inference reads the test maps).
    view = as_read_by(dataset, config.model)
    engine = SimEngine(view, radio_profile, medium, node, edge, seed=config.train.seed,
                       trace=trace, edge_at=config.mesh.edge_at, mesh_id=config.mesh.mesh_id,
                       params_via=_params_via(config, medium),
                       max_message_bytes=config.mesh.max_message_bytes,
                       **_faults(sim, config, sim["fault_seed"]), lasting=True,
                       activations=config.mesh.activations)
    if batch > engine.spec_for(model).max_batch:
        raise UsageError(f"--batch {batch}: at most {engine.spec_for(model).max_batch} "
                         "samples fit the mesh's max_message_bytes")
    claimed = _claim(out, force, "simulate-infer")
    run_dir = claimed.path
    tests = len(dataset.y_test)
    with _kept_if_finished(claimed, "meshdl simulate infer"):
        predicted: list[np.ndarray] = []
        found_at: dict[Cell, int] = {}  # each cell the edge planned around: its first wave
        wave_maps = [np.arange(w * batch, (w + 1) * batch) % tests for w in range(waves)]
        for w, maps in enumerate(wave_maps):
            predicted.append(engine.logits(model, "test", maps).argmax(axis=1))
            assert engine.mesh is not None
            found_at.update({cell: w + 1 for cell in engine.mesh.edge.spec.dead
                             if cell not in found_at})
        mesh = engine.mesh
        assert mesh is not None
        baseline = {}
        for variant in compare.variants(medium):
            slot = cloud.inference_slot(mesh.spec, radio_profile, medium, node, edge, batch,
                                        variant, config.train.seed)
            baseline[variant] = cloud.times(slot, waves)
        start_run(run_dir, config, source)
        labels = np.concatenate(wave_maps)
        accuracy = float(np.mean(np.concatenate(predicted) == dataset.y_test[labels]))
        # The model run centrally with the down cells left out (`evaluate --dead`'s
        # reading): what the mesh would give if it lost nothing else.
        central = float(np.mean(model.predict(dataset.X_test[labels], cell_numbers(
            mesh.down, config.model.cols), quantized=config.mesh.activations == STATIC)
            == dataset.y_test[labels]))
        report = _finish(run_dir, mesh, Mode.INFER, baseline, trace, {
            "accuracy": accuracy, "central_accuracy": central,
            "dead_found_at_wave": {name_of(c): w for c, w in sorted(found_at.items())},
            "model": _model_record(model_path)})
    _say(report, run_dir)
    err_console.print(f"accuracy {accuracy:.4f} over {len(labels)} samples" + (
        f"; the model run centrally with the same {len(mesh.down)} cells left out: "
        f"{central:.4f}" if mesh.down else ""), highlight=False)
    if mesh.down or found_at:
        err_console.print(found_line(mesh.down, found_at), highlight=False)
    if json_out:
        emit_json(report)


MacChoice = Literal["always-on", "ideal", "lpl", "tsch", "scheduled"]
BatteryName = Literal["2xAA", "2xAA-lithium", "cr2032"]


@app.command("live")
@grouped
@said_on_interrupt("the simulation")
def simulate_live(
    model_path: Path | None = typer.Option(None, "--model", help="A trained model.npz "
                                           "(default: a fresh one)."),
    data: LabelledData = None,
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: "
                                    "runs/<timestamp>-simulate-live/)."),
    force: ForceOut = False,
    edge_at: EdgeAt = None,
    grid: Flags = GRID,
    net: Flags = NETWORK,
    slots: int = typer.Option(48, "--slots", help="Time slots of live inference (the first "
                              "brings the parameters)."),
    slot_seconds: float = typer.Option(1800.0, "--slot-seconds", help="Seconds from one "
                                       "slot to the next."),
    mac: MacChoice | None = typer.Option(
        None, "--mac", help="The radios' MAC: always-on, ideal (asleep whenever not "
        "sending or receiving: a floor), lpl (low-power listening: ContikiMAC; LoRa's "
        "preamble sampling), tsch (6TiSCH minimal; BLE's connection events) or scheduled "
        "(a sync flood at each slot, deep sleep between). Default: scheduled where the "
        "radio has a deep sleep, else lpl, else tsch, else always-on."),
    battery: BatteryName = typer.Option("2xAA", "--battery", help="Each node's battery."),
    delta: float | None = typer.Option(None, "--delta", help="Suppress changes up to EPS: "
                                       "delta halos in the mesh, send-on-delta readings "
                                       "in the cloud (both report the alerts it costs)."),
    timed_slots: int = typer.Option(2, "--timed-slots", help="Slots timed event by "
                                    "event when slots repeat (no --delta, no --loss): slot "
                                    "1's price stands for every live slot, each timed slot "
                                    "checked to be priced alike; the makespan is the timed "
                                    "slots'."),
    drift_ppm: float | None = typer.Option(
        None, "--drift-ppm", help="Under --mac scheduled: the clock drift in ppm that the "
        "guard time covers (2 x ppm x the slot): each crystal's tolerance (default 40), "
        "or with --drift-compensated what compensation leaves (default 2)."),
    drift_compensated: bool = typer.Option(
        False, "--drift-compensated", help="Under --mac scheduled: each node learns its "
        "crystal's drift from the sync floods (as TSCH's adaptive timesync)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of a fresh model, of the "
                                    "radios' backoffs and of the clocks' drifts."),
    activations: Activations = None,
    sim: Flags = SIMULATED,
    json_out: JsonSim = False,
) -> None:
    """Live inference slot after slot, the real time between them: bytes, joules and
    battery lifetime of the mesh against the cloud-heavy baseline."""
    from meshdl.sim.studies import live
    from meshdl.training.runs import check_run_dir, start_run

    if sim["recovery"] != "reliable" or sim["dead"]:
        raise UsageError("live slots run in reliable mode: no --recovery best-effort, no "
                         "--dead")
    if out is not None:  # said before any data is read or made; claimed after validation
        check_run_dir(out, force, resume=None)
    radio_profile, node, edge = _parties(sim)
    params = _drift_params(mac, drift_ppm, drift_compensated)
    # The slots replay the test maps: one lounge's (`one_lounge`) hold them all.
    model, dataset, config, source = _model_and_data(model_path, data, grid, net, seed,
                                                     edge_at, one_lounge=True,
                                                     activations=activations)
    # Only the test maps are replayed: the training maps (which made the model's
    # normalization) go before the mesh is built.
    maps = dataset.X_test
    del dataset
    settings = live.settings_for(slots, slot_seconds, mac, battery, delta, timed_slots,
                                 config.train.seed, sim, radio_profile, params)
    claimed = _claim(out, force, "simulate-live")
    run_dir = claimed.path
    with _kept_if_finished(claimed, "meshdl simulate live"):
        start_run(run_dir, config, source)
        with _live_progress(slots) as say:
            report = live.simulate(maps, model, config, radio_profile, sim["medium"],
                                   node, edge, settings, say)
        report["model"] = _model_record(model_path)
        live.write(report, run_dir)
    err_console.print(live.summary_line(report, run_dir), highlight=False, soft_wrap=True)
    if json_out:
        emit_json(report)


def _drift_params(mac: str | None, drift_ppm: float | None, compensated: bool
                  ) -> MacParams:
    """The scheduled MAC's settings of `--drift-ppm` and `--drift-compensated` (refused
    under another MAC, whose clocks they do not set)."""
    from meshdl.sim.radio.mac import MacParams

    if mac != "scheduled":
        if drift_ppm is not None or compensated:
            raise UsageError("--drift-ppm and --drift-compensated set the scheduled MAC's "
                             "guard time: add --mac scheduled")
        return MacParams()
    if drift_ppm is not None and not (math.isfinite(drift_ppm) and drift_ppm >= 0):
        raise UsageError("--drift-ppm must be at least 0")
    if compensated:
        return MacParams(sched_drift_compensation=True, **(
            {} if drift_ppm is None else {"sched_compensated_ppm": drift_ppm}))
    return MacParams(**({} if drift_ppm is None else {"sched_drift_ppm": drift_ppm}))


def _claim(out: Path | None, force: bool, name: str) -> RunDir:
    """The run directory, once every check has passed: `--out` (refused if it holds a
    run, unless `force`; there is no --resume to go on with), else a new one under runs/
    labelled `name`."""
    from meshdl.training.runs import RunDir, claim_run_dir, new_run_dir

    if out is not None:
        return claim_run_dir(out, force, resume=None)
    return RunDir(new_run_dir(name=name), created=True)


@contextmanager
def _kept_if_finished(claimed: RunDir, command: str) -> Iterator[None]:
    """The run's files are kept only if it finishes: a simulated run cannot go on from a
    checkpoint (the simulated clocks, energy and traffic are not in it), so a failure or
    Ctrl-C takes back what it wrote, the latter saying so in one line (exit code 130)."""
    try:
        yield
    except KeyboardInterrupt:
        claimed.discard()
        err_console.print(f"interrupted; a simulated run cannot go on from where it "
                          f"stopped (its clocks are not checkpointed), so nothing of it was "
                          f"kept: start it over with the same `{command}` command",
                          highlight=False, soft_wrap=True)
        raise Said from None
    except BaseException:
        claimed.discard()
        raise


@contextmanager
def _live_progress(slots: int) -> Iterator[Callable[[int], None]]:
    """`say(done)`: a bar on a terminal; elsewhere a line at every tenth of the slots."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("slots"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task("slots", total=slots)
        step = max(1, slots // 10)
        said = [0]

        def say(done: int) -> None:
            bar.update(task, completed=done)
            if not err_console.is_terminal and (done - said[0] >= step or done == slots):
                said[0] = done
                err_console.print(f"slot {done}/{slots}", highlight=False)

        yield say


def _model_and_data(model_path: Path | None, data: Path | None, grid: Flags, net: Flags,
                    seed: int | None, edge_at: str | None, one_lounge: bool = False,
                    activations: str | None = None
                    ) -> tuple[CNN, Dataset, RunConfig, str]:
    """The model an inference run computes with (a trained one, whose shape fixes the
    grid, or a fresh one normalizing as the data, and under int8-static calibrated on
    its training maps), its data set, configuration and the data's source
    (`one_lounge`: as `_data_and_config` takes it). A trained model without int8
    scales under int8-static: UsageError (calibrate it first)."""
    from meshdl.model.cnn import CNN
    from meshdl.training.loop import normalization

    trained = CNN.load(model_path) if model_path else None
    flags = overrides(grid, net, seed=seed, edge_at=edge_at, activations=activations)
    if trained is None:
        dataset, config, source = _data_and_config(data, None, flags, None, one_lounge)
        model = CNN(config.model, seed=config.train.seed)
        model.set_normalization(*normalization(dataset.X_train))
        if config.mesh.activations == STATIC:
            model.calibrate(dataset.X_train[:CALIBRATION_MAPS])
        return model, dataset, config, source
    if activations == STATIC and trained.act_scales is None:
        raise UsageError(f"{model_path} has no int8 activation scales: run `meshdl "
                         f"calibrate {model_path} DATA` (models trained since int8-static "
                         "have them)")
    own = trained.config
    differ = [f"--{name.replace('_', '-')} {value} (the model's: {getattr(own, name)})"
              for name, value in net.items() if value is not None
              and value != getattr(own, name)]
    if differ:
        raise UsageError(f"{model_path} has its own network: drop {', '.join(differ)}")
    # The model's network, on the grid the flags or the data ask, else its own.
    asked = {axis: n for axis, n in grid.items() if n is not None}
    flags["model"] = {**own.model_dump(exclude={"rows", "cols"}), **asked}
    dataset, config, source = _data_and_config(data, None, flags, (own.rows, own.cols),
                                               one_lounge)
    try:  # a globally pooled model runs on any grid; a windowed one on its own alone
        model = trained.on_grid(config.model.rows, config.model.cols)
    except UsageError as exc:
        raise UsageError(f"{model_path} does not fit the run's grid: {exc}") from None
    return model, dataset, config, source


def _model_record(model_path: Path | None) -> dict[str, Any]:
    """sim.json's "model": whether the run's model was trained (a --model file) or a
    fresh one, whose alerts and accuracy mean nothing (the report warns of it)."""
    return {"trained": model_path is not None,
            "file": None if model_path is None else str(model_path)}


def _params_via(config: RunConfig, medium: str) -> str:
    """The configuration's on the radio mesh; through a broker the edge always publishes
    the parameters once (as over MQTT)."""
    return config.mesh.params_via if medium == "shared" else "broadcast"


def _finish(run_dir: Path, mesh: TimedMesh, mode: Mode, baseline: dict[str, Any],
            trace: bool, extra: dict[str, Any] | None = None, epochs: int | None = None
            ) -> dict[str, Any]:
    """Write sim.json, trace.jsonl and energy.png; return sim.json's content."""
    from meshdl.report.baseline import strongest
    from meshdl.sim.simulate import plot_energy, run_makespan, sim_report, write_trace

    # The main baseline, the console's, is the strongest variant (the report's): the
    # aggregated one was the main while the unaggregated one was cheaper (1,946 s
    # against 907 s training), which flattered the mesh.
    variants = {f"cloud_heavy_{v}": b for v, b in baseline.items()}
    best = strongest(variants)
    main = baseline[best.variant] if best else next(iter(baseline.values()))
    record = {"cloud_heavy": main, **variants,
              "lossless_links": True}  # whatever --loss says of the mesh's
    report = {**sim_report(mesh, mode, record, epochs), **(extra or {})}
    if "parallel" in report:  # several meshes: the headline is the whole run's time
        report["makespan_s"] = run_makespan(report["makespan_s"], report["parallel"],
                                            epochs)
    (run_dir / "sim.json").write_text(json.dumps(report, indent=2) + "\n")
    if trace and mesh.trace is not None:
        write_trace(mesh.trace, run_dir / "trace.jsonl")
    plot_energy(report, mesh.spec.model.rows, mesh.spec.model.cols, run_dir / "energy.png")
    return report


def _say_meshes(parallel: dict[str, Any]) -> None:
    """Several meshes: their throughput, staleness and backhaul in one line."""
    from meshdl.report.numbers import figure

    link = parallel["backhaul"]
    err_console.print(
        f"{parallel['meshes']} meshes ({parallel['sync']}, {link['name']} backhaul): "
        f"{figure(parallel['samples_per_time'])} samples per simulated second over "
        f"{figure(parallel['elapsed'])} s; staleness max {parallel['staleness']['max']}; "
        f"backhaul {link['bytes_up'] + link['bytes_down']:,} bytes", highlight=False)


def _say(report: dict[str, Any], run_dir: Path) -> None:
    """The comparison in a few lines on stderr, every figure by the report's formatter.
    A wave's seconds are the mean over the run's waves of its mode (a training wave:
    forward, backward and the update), apart from the last wave's that the communication
    summary printed above them (an evaluation's, forward only, on a batch of its own)."""
    from meshdl.report.baseline import strongest
    from meshdl.report.numbers import figure

    span, energy = report["makespan_s"], report["energy_j"]
    cloud_heavy = report["baseline"]["cloud_heavy"]
    mode = report["mode"]
    forward = (f" (its forward pass {figure(span['forward_mean'])} s)"
               if mode == "train" and span.get("forward_mean") else "")
    err_console.print(
        f"{report['waves']} {mode} waves on {report['radio']['name']} "
        f"({report['medium']}): {figure(span['per_wave_mean'])} s a {mode} wave on average"
        f"{forward}, {figure(span['total'])} s in all; energy {figure(energy['total'])} J, "
        f"hottest node {energy['max_node_cell']} {figure(energy['max_node'])} J -> {run_dir}",
        highlight=False)
    best = strongest(report["baseline"])
    which = (f"strongest of {best.of} ({cloud_heavy['variant']})" if best and best.of > 1
             else f"({cloud_heavy['variant']})")
    err_console.print(
        f"cloud-heavy, {which}: {figure(cloud_heavy['makespan_s'])} s, "
        f"{figure(cloud_heavy['energy_j']['total'])} J, hottest node "
        f"{figure(cloud_heavy['energy_j']['max_node'])} J, {cloud_heavy['bytes']:,} bytes "
        f"(in-mesh: {sum(report['bytes'].values()):,} bytes)", highlight=False)
    if line := dead_cells_line(report["faults"]):
        err_console.print(line, highlight=False)


def dead_cells_line(faults: dict[str, Any]) -> str | None:
    """The nodes that were down, the ones the edge found and planned around, and where
    it ended attached, in one line (None when every node was up)."""
    down, found = faults.get("down_cells", []), faults.get("dead_cells", [])
    if not down and not found:
        return None
    line = f"dead cells: {', '.join(down) or 'none down at the end'}"
    if found == down:
        line += " (found and planned around)"
    else:
        missed = [cell for cell in down if cell not in found]
        line += f"; planned around: {', '.join(found) or 'none'}"
        if missed:
            line += f"; not found by the end: {', '.join(missed)}"
    if faults.get("cut_off_cells"):
        line += f"; cut off: {', '.join(faults['cut_off_cells'])}"
    if faults.get("edge_at"):
        line += f"; edge at {faults['edge_at']}"
    return line


@app.command("compare")
def simulate_compare(
    radio: list[str] = typer.Option(None, "--radio", help="Radio profiles to compare "
                                    "(repeat; default: every one, Wi-Fi on the star, the "
                                    "others as a radio mesh)."),
    rows: Rows = 17, cols: Cols = 25, kernel: Kernel = 3, filters: Filters = None,
    pool: Pool = 2, conv_layers: ConvLayers = None, hidden: Hidden = 200,
    batch: int = typer.Option(1, "--batch", help="Samples of an inference slot."),
    train_samples: int = typer.Option(2400, "--train-samples", help="Training maps of "
                                      "an epoch (0: no epoch comparison)."),
    train_batch: int = typer.Option(100, "--train-batch", help="Training batch."),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs of the whole "
                                      "training run compared (the raw data is shipped "
                                      "once for all; default: 20, 40 with --pool global)."),
    sweep: bool = typer.Option(False, "--sweep", help="Also the inference slot over "
                               "network shapes (k 1/3, filters 1/2/5, pool 2/3/4, 1 or 2 "
                               "conv layers) on the first radio: where does the mesh win?"),
    seed: int = typer.Option(0, "--seed", help="Seed of the backoffs."),
    radios: RadioFile = None,
    json_out: json_option("Print the comparison as JSON.") = False,
) -> None:
    """In-mesh computing against shipping every reading to the edge, measured."""
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profiles
    from meshdl.sim.studies import compare

    known = profiles(radios)
    names = radio or list(known)
    model = model_from_flags(rows=rows, cols=cols, kernel=kernel, filters=filters,
                             pool=pool, conv_layers=conv_layers, hidden=hidden)
    if epochs is None:
        epochs = recipe_default("train", "epochs", model.global_pool)
    results: dict[str, Any] = {"model": model.model_dump(), "batch": batch, "radios": []}
    for name in names:
        medium = natural_medium(name)
        chosen, node, edge = _profiles(name, medium, None, "pi4", radios)
        err_console.print(f"{name} ({medium}): inference slot", highlight=False)
        entry: dict[str, Any] = {"radio": name, "medium": medium, "device": node.name,
                                 "inference": compare.inference_slot(
                                     model, chosen, medium, node, edge, batch, seed)}
        if train_samples:
            err_console.print(f"{name} ({medium}): one training epoch", highlight=False)
            entry["epoch"] = compare.training_epoch(model, chosen, medium, node, edge,
                                                    train_samples, train_batch, seed, epochs)
            if "run" in entry["epoch"]:
                entry["run"] = entry["epoch"].pop("run")
        results["radios"].append(entry)
    if sweep:
        medium = natural_medium(names[0])
        chosen, node, edge = _profiles(names[0], medium, None, "pi4", radios)
        err_console.print(f"{names[0]} ({medium}): 36 network shapes", highlight=False)
        results["sweep"] = compare.sweep(rows, cols, hidden, chosen, medium, node, edge,
                                         batch, seed)
    if json_out:
        emit_json(results)
        return
    sys.stdout.write(compare.markdown(results) + "\n")  # markdown: never wrapped
