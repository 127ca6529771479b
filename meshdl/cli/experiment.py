"""`meshdl experiment NAME`: an experiment over a swept value and several seeds, written
to a run directory (meshdl/experiments/runner.py says what it holds).

The sweeps that differ only in the network setting they sweep (filter-size, filters,
hidden) are generated from one table, `TRAINING_SWEEPS`; every sweep's trial runner
flags (--jobs, --out, --json, --ray) are one group, `RUNNER`. A list flag repeats or
takes a comma list (meshdl/cli/lists.py); the network and training flags show in
`--help` the built-in configuration's value they leave (`_shown`)."""

from __future__ import annotations

import copy
import inspect
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from meshdl.cli.common import emit_json, err_console, out_console
from meshdl.cli.flags import GRID, NETWORK, TRAINING, Flags, Group, grouped, overrides
from meshdl.cli.lists import ListsCommand, list_option, number, pairs, whole, whole_value
from meshdl.cli.options import (
    BackhaulName,
    Batch,
    Cols,
    Epochs,
    LabelledData,
    Lr,
    Rows,
    json_option,
)
from meshdl.cli.sweep_progress import Estimate, Left, interrupted, taking
from meshdl.config import (
    GLOBAL_RECIPE,
    RECIPE_SMALL_HEAD,
    RECIPE_SMALL_MAPS,
    ModelConfig,
    RunConfig,
    load_run_config,
    recipe_epochs_said,
)
from meshdl.errors import MeshdlError, UsageError
from meshdl.experiments.columns import (
    Shown,
    columns,
    digits,
    fixed,
    ordered,
    over,
    percent,
    said,
    size,
)
from meshdl.experiments.runner import (
    Record,
    Trial,
    journal_key,
    read_journal,
    run_trials,
    summarize,
    write_run,
)

# The experiments themselves (numpy, the mesh, the simulator) load when a sweep runs,
# not for `meshdl --help`; the default values --help shows are written below, and
# tests/test_cli_startup.py checks that they are the experiments' own.
GRID_SIDES = (5, 10, 20, 40)  # sweep.SWEEPS["grid"].default
EDGE_CELLS = ((0, 0), (0, 12), (8, 0), (16, 24))  # sweep.SWEEPS["edge-position"].default
RADIOS = ("802.15.4", "ble", "wifi", "lora-sf7")  # edge_vs_cloud.RADIOS
LOSS_RATES = (0.0, 0.05, 0.1, 0.2, 0.3)  # faults.SWEEPS["loss"].default
DEAD_SHARES = (0.0, 0.05, 0.1, 0.2)  # faults.SWEEPS["failures"].default
FILL_INS = ("zero", "last", "neighbours")  # faults.POLICIES
MESH_COUNTS = (1, 2, 4, 8, 16)  # meshes.COUNTS
SYNC_MODES = ("bsp", "bsp+overlap", "ssp:2", "async")  # meshes.MODES
MESH_BATCH = 50  # meshes.DEFAULT_BATCH
COMPRESSIONS = ("none", "hylo", "intsum", "plan", "none/int8")  # compression.POLICIES
EPSILONS = (0.0, 0.01, 0.05, 0.1, 0.25)  # delta.EPSILONS
CROSSOVER_GRIDS = ("17x25", "30x40", "50x50", "100x100", "150x150")  # crossover.GRIDS
CROSSOVER_RADIOS = ("802.15.4", "ble")  # crossover.RADIOS
CROSSOVER_MACS = ("lpl", "tsch", "ideal", "scheduled",  # crossover.MACS
                  "scheduled-compensated")

app = typer.Typer(help="Experiments over a swept value and several seeds: tables, "
                  "plots and a summary in a run directory.", no_args_is_help=True)


Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Seeds per value (0, 1, ...).")]
FaultSeeds = Annotated[int, typer.Option("--seeds", min=1, help="Fault seeds per value (0, "
                                         "1, ...): which frames are lost, which nodes "
                                         "dead.")]
Radio = Annotated[str, typer.Option("--radio", help="Radio profile (its natural medium and "
                                    "devices).")]
Jobs = Annotated[int, typer.Option("--jobs", min=1, help="Trials at once, in worker "
                                   "processes (the same summary whatever the number).")]
Out = Annotated[Path | None, typer.Option("--out", help="Run directory (default: "
                                          "runs/<timestamp>-<experiment>/).")]
Ray = Annotated[str | None, typer.Option(
    "--ray", metavar="[ADDRESS]", help="Run the trials as Ray tasks: on the cluster at "
    "ADDRESS, or with no address on a local one of --jobs CPUs (the extra meshdl[ray]).")]
JsonSummary = json_option("Print summary.json on stdout.")

# What an unset network or training flag leaves: the built-in configuration's value,
# shown in --help (a sweep of hours should not hide that it trains 20 epochs on 17 x 25).
_BUILT_IN = RunConfig()
_SECTIONS = {**{name: "model" for name in ("rows", "cols", "kernel", "filters",
                                           "conv_layers", "pool", "hidden")},
             **{name: "train" for name in ("epochs", "batch", "lr", "failout")}}


def _with_default(alias: Any, shown: str) -> Any:
    """The option `alias` (an Annotated typer.Option) with `shown` as its default in
    --help; the option itself (its flag, help, checks) is the shared one. In the help
    text, as typer's `show_default` would put a text in parentheses: "[default: (20)]"."""
    base, info, *_ = typing.get_args(alias)
    info = copy.copy(info)
    info.help = f"{info.help or ''} \\[default: {shown}]".strip()
    return Annotated[base, info]


def common_head(base: RunConfig, others: list[ModelConfig]) -> ModelConfig:
    """The one model every trial of a sweep trains, so that its values compare on one
    head: `base`'s, or where a swept value's run takes another (the global recipe's
    table trains neither compressed nor overlapped: those runs take its head without
    it, `RECIPE_SMALL_HEAD`), that one."""
    return next((model for model in others if model != base.model), base.model)


def _default_of(name: str, grid_from: str | None) -> str:
    section = _SECTIONS[name]
    value = getattr(getattr(_BUILT_IN, section), name)
    if grid_from and name in ("rows", "cols"):
        return f"{value}, or {grid_from}'s grid"
    if name == "epochs":  # the global head's follow its training maps (recipe_epochs)
        return f"{value}; with --pool global {recipe_epochs_said()}"
    if name == "failout" and "failout_max" in GLOBAL_RECIPE.get(section, {}):
        clean = GLOBAL_RECIPE[section].get("failout_clean", 0.0)
        return (f"{value}; {GLOBAL_RECIPE[section][name]}-"
                f"{GLOBAL_RECIPE[section]['failout_max']}"
                + (f" ({clean:.0%} clean)" if clean else "")
                + " with --pool global")
    if name in GLOBAL_RECIPE.get(section, {}):  # the global head's recipe differs
        recipe = GLOBAL_RECIPE[section][name]
        if section == "model" and name in RECIPE_SMALL_HEAD:  # its head follows the maps
            return (f"{value}; {recipe} with --pool global on more than "
                    f"{RECIPE_SMALL_MAPS:,} maps")
        return f"{value}; {recipe} with --pool global"
    return str(value)


def _shown(group: Group, grid_from: str | None = None) -> Group:
    """`group` with each option's built-in value in --help; rows and cols say that
    `grid_from` (a --data set, a --model) sets them when given."""
    return Group(tuple((name, _with_default(alias, _default_of(name, grid_from)), default)
                       for name, alias, default in group.options))


DATA_GRID = _shown(GRID, "the --data set")
SHOWN_GRID, SHOWN_NETWORK, SHOWN_TRAINING = _shown(GRID), _shown(NETWORK), _shown(TRAINING)
ShownBatch = _with_default(Batch, _default_of("batch", None))
ShownEpochs = _with_default(Epochs, _default_of("epochs", None))
ShownLr = _with_default(Lr, _default_of("lr", None))
ModelRows = _with_default(Rows, _default_of("rows", "--model's or the --data set"))
ModelCols = _with_default(Cols, _default_of("cols", "--model's or the --data set"))

# How every sweep runs its trials and where it writes them: a `Runner`.
RUNNER = Group.of(jobs=(Jobs, 1), out=Out, json_out=(JsonSummary, False), ray=Ray)


class Runner(NamedTuple):
    """The `RUNNER` flags."""

    jobs: int
    out: Path | None
    json_out: bool
    ray: str | None


class TrainingSweep(NamedTuple):
    """A command sweeping one setting of the network that training answers to
    (`sweep.SWEEPS`): the [model] field it sweeps and its default values (the sweep's
    own), its values' parameter, flag and help, and its own help."""

    name: str
    setting: str
    default: tuple[int, ...]
    param: str
    flag: str
    metavar: str
    help: str
    doc: str


TRAINING_SWEEPS = (
    TrainingSweep("filter-size", "kernel", (3, 4, 5, 6), "sizes", "--sizes", "K[,...]",
                  "Filter sizes k.",
                  "Accuracy and communication cost by filter size k, next to the source "
                  "paper's."),
    TrainingSweep("filters", "filters", (1, 2, 5, 8), "values", "--values", "H[,...]",
                  "Filters per conv layer h.",
                  "Accuracy and communication cost by the number of filters h (halos and "
                  "gathered\nfeatures grow with h)."),
    TrainingSweep("hidden", "hidden", (50, 100, 200, 400), "values", "--values",
                  "UNITS[,...]", "Hidden units of the head.",
                  "Accuracy by the head's hidden units: the edge's work, not the mesh's "
                  "(the\nnetwork's traffic does not change)."),
)


def _training_sweep(row: TrainingSweep) -> Callable[..., None]:
    """The command of `row`: its values, the seeds, every network and training flag
    but the swept one, the data and the runner's flags."""
    def command(seeds: int, grid: Flags, run: Flags, net: Flags, data: Path | None,
                runner: Flags, **values: list[int]) -> None:
        _check_values(row.flag, values[row.param], minimum=1)
        _experiment(row.name, values[row.param], seeds, data, overrides(grid, run, net),
                    Runner(**runner))

    def param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=annotation)

    values = list_option(row.flag, whole, row.default, row.help, row.metavar)
    command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        param(row.param, list[str], values),
        param("seeds", Seeds, 3), param("grid", Flags, DATA_GRID),
        param("run", Flags, SHOWN_TRAINING),
        param("net", Flags, SHOWN_NETWORK.without(row.setting)),
        param("data", LabelledData, None), param("runner", Flags, RUNNER)])
    command.__doc__ = row.doc
    command.__name__ = f"{row.name.replace('-', '_')}_command"
    return grouped(command)


for _row in TRAINING_SWEEPS:
    app.command(_row.name, cls=ListsCommand)(_training_sweep(_row))


def _cell(text: str) -> list[int]:
    """'R,C' -> [R, C] (--cells)."""
    try:
        row, col = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError("expected a cell as ROW,COL (e.g. 0,0)") from None
    return [row, col]


@app.command("grid", cls=ListsCommand)
@grouped
def grid_command(
    values: list[str] = list_option("--values", whole, GRID_SIDES,
                                    "Grid sides n of n x n meshes (100 takes a minute or "
                                    "two).", "N[,...]"),
    batch: ShownBatch = None, net: Flags = SHOWN_NETWORK.without("hidden"),
    runner: Flags = RUNNER,
) -> None:
    """How one training wave's cost grows with the mesh (n x n cells), with a line
    fitted to its bytes against the number of cells (cost only, one seed)."""
    _check_values("--values", values, minimum=1)
    _experiment("grid", values, 1, None, overrides(net, batch=batch), Runner(**runner))


@app.command("edge-position", cls=ListsCommand)
@grouped
def edge_position_command(
    cells: list[str] = list_option("--cells", _cell, [",".join(map(str, c))
                                                      for c in EDGE_CELLS],
                                   "Border cells R,C the edge is linked to "
                                   "(a comma list: R,C,R,C...).", "R,C[,...]",
                                   split=pairs),
    grid: Flags = SHOWN_GRID, batch: ShownBatch = None,
    net: Flags = SHOWN_NETWORK.without("hidden"), runner: Flags = RUNNER,
) -> None:
    """Where to attach the edge: one training wave's depth, busiest link and bytes by
    the edge's cell (what is learned does not depend on it: cost only, one seed)."""
    values: list[list[int]] = cells  # type: ignore[assignment]  # parsed by _cell
    if len({tuple(v) for v in values}) != len(values):
        raise UsageError(f"--cells {' '.join(','.join(map(str, v)) for v in values)}: "
                         "distinct cells")
    _experiment("edge-position", values, 1, None, overrides(grid, net, batch=batch),
                Runner(**runner))


@app.command("edge-vs-cloud", cls=ListsCommand)
@grouped
def edge_vs_cloud_command(
    radios: list[str] = list_option("--radio", str, RADIOS,
                                    "Radio profiles (see meshdl radio list).",
                                    "RADIO[,...]"),
    seeds: Seeds = 3, grid: Flags = SHOWN_GRID, net: Flags = SHOWN_NETWORK,
    runner: Flags = RUNNER,
) -> None:
    """One inference slot in the mesh against shipping the readings to the edge, per
    radio, under simulated time (the seeds draw the backoffs)."""
    from meshdl.experiments import edge_vs_cloud
    from meshdl.sim.radio.profiles import profile

    if not radios or len(set(radios)) != len(radios):
        raise UsageError(f"--radio {' '.join(radios)}: distinct radio profiles")
    for radio in radios:
        profile(radio)  # an unknown name fails here, naming the known ones
    json_out = runner["json_out"]
    base = load_run_config(**overrides(grid, net))
    settings: Record = {"experiment": "edge-vs-cloud", "model": base.model.model_dump()}
    trials = [Trial(i, radio, seed, settings) for i, (radio, seed) in
              enumerate((r, s) for r in radios for s in range(seeds))]
    run_dir, records, rows_ = _run_sweep(
        "edge-vs-cloud", trials, f"{len(radios)} radios x {seeds} seed(s), one inference "
        "slot each", Runner(**runner), edge_vs_cloud.run, edge_vs_cloud.FIGURES,
        lambda record: said(record, [("mesh_makespan_s", digits(4)),
                                     ("mesh_bytes", size)]))
    summary = {"experiment": "edge-vs-cloud", "mode": "simulated time, one inference "
               "slot (batch 1) per trial", "values": radios, "seeds": seeds,
               "rows": rows_, "paper": []}
    _publish(run_dir, {"experiment": "edge-vs-cloud", "values": radios,
                       "seeds": list(range(seeds)), "settings": settings},
             records, summary, edge_vs_cloud.FIGURES,
             lambda: edge_vs_cloud.plot(run_dir, rows_), edge_vs_cloud.table(rows_),
             f"one inference slot, {over(seeds)}; cloud: the better variant",
             json_out)


def _grid_size(text: str) -> list[int]:
    """'100x100' -> [100, 100]: a grid's rows and columns."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise ValueError("not ROWSxCOLS")
    rows, cols = (int(part) for part in parts)
    if rows < 1 or cols < 1 or rows * cols < 2:
        raise ValueError("a grid of at least 2 cells")
    return [rows, cols]


@app.command("crossover", cls=ListsCommand)
@grouped
def crossover_command(
    grids: list[str] = list_option("--grid", _grid_size, CROSSOVER_GRIDS,
                                   "Grid sizes, ROWSxCOLS.", "RxC[,...]"),
    radios: list[str] = list_option("--radio", str, CROSSOVER_RADIOS,
                                    "Radio profiles (see meshdl radio list).",
                                    "RADIO[,...]"),
    macs: list[str] = list_option("--mac", str, CROSSOVER_MACS, "MACs priced (those a "
                                  "radio lacks are left out).", "MAC[,...]"),
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeds per point (the "
                                       "backoffs: they change no joules).")] = 1,
    activations: Annotated[Literal["float32", "int8-static"], typer.Option(
        "--activations", help="What the mesh's forward messages carry: float32, or "
        "int8-static's codes (int16 readings, uint8 activations); the cloud then ships "
        "16-bit readings, as lean as the mesh.")] = "float32",
    net: Flags = NETWORK, runner: Flags = RUNNER,
) -> None:
    """Where the mesh pays: the hottest node's joules a slot and the first death, mesh
    against cloud, by grid size, MAC and radio (live slots, the global head unless --pool
    says otherwise), and the sizes where the mesh draws 1x, 1/2 and 1/10 of the cloud."""
    from meshdl.experiments import crossover
    from meshdl.sim.radio.profiles import profile

    if not grids or len({tuple(g) for g in grids}) != len(grids):
        raise UsageError("--grid: distinct grid sizes")
    if not radios or len(set(radios)) != len(radios):
        raise UsageError(f"--radio {' '.join(radios)}: distinct radio profiles")
    if not macs or len(set(macs)) != len(macs) or any(m not in crossover.MACS for m in macs):
        raise UsageError(f"--mac {' '.join(macs)}: distinct ones of "
                         f"{', '.join(crossover.MACS)}")
    for radio in radios:
        if radio == "wifi":
            raise UsageError("--radio wifi: a star of Pis has no low-power MAC to compare")
        profile(radio)  # an unknown name fails here, naming the known ones
    flags = overrides(net)
    model = flags.setdefault("model", {})
    if model.get("pool") is None:  # the head made for the mesh, unless --pool says
        model["pool"] = "global"
    base = load_run_config(mode="mesh", **flags)
    settings: Record = {"experiment": "crossover", "model": base.model.model_dump(
        exclude={"rows", "cols"}), "activations": activations}
    points = [[*grid, radio] for radio in radios for grid in grids]
    trials = [Trial(i, value, seed, settings) for i, (value, seed) in
              enumerate((v, s) for v in points for s in range(seeds))]
    run_dir, records, rows_ = _run_sweep(
        "crossover", trials, f"{len(grids)} grids x {len(radios)} radio(s) x {seeds} "
        "seed(s), a live run each", Runner(**runner), crossover.run, crossover.FIGURES,
        lambda record: said(record, [("scheduled_ratio", digits(3)),
                                     ("tsch_ratio", digits(3))]),
        work=lambda trial: trial.value[0] * trial.value[1])  # a live run's time: its nodes
    fitted = crossover.crossovers(rows_, macs)
    summary = {"experiment": "crossover", "mode": "live slots under simulated time, the "
               "live slot's price for every slot", "values": points, "seeds": seeds,
               "rows": rows_, "paper": [], "macs": macs, "activations": activations,
               "crossover": fitted,
               "crossover_table": crossover.crossover_table(fitted)._asdict()}
    title = f"crossover: {over(seeds)}; hottest node, mesh / cloud"
    _publish(run_dir, {"experiment": "crossover", "values": points,
                       "seeds": list(range(seeds)), "settings": settings},
             records, summary, crossover.FIGURES,
             lambda: crossover.plot(run_dir, rows_, macs), crossover.table(rows_, macs),
             title, runner["json_out"], ("rows", "cols", "radio"))
    if not runner["json_out"]:
        _print_table(crossover.crossover_table(fitted), "mesh at 1x, 1/2, 1/10 of the "
                     "cloud (fitted; * extrapolated)")


@app.command("loss", cls=ListsCommand)
@grouped
def loss_command(
    rates: list[str] = list_option("--rates", number, LOSS_RATES,
                                   "Shares of frames lost (0 trains exactly, once).",
                                   "SHARE[,...]"),
    policies: list[str] = list_option("--policies", str, FILL_INS, "Best effort's "
                                      "fill-ins (zero, last, neighbours), or reliable.",
                                      "POLICY[,...]"),
    burst: float | None = typer.Option(None, "--burst", help="Mean burst of lost frames "
                                       "(Gilbert-Elliott; default Bernoulli)."),
    radio: Radio = "802.15.4", seeds: FaultSeeds = 3, grid: Flags = DATA_GRID,
    run: Flags = SHOWN_TRAINING, net: Flags = SHOWN_NETWORK, data: LabelledData = None,
    runner: Flags = RUNNER,
) -> None:
    """Test accuracy, time and energy of best-effort training by loss rate and fill-in
    policy, under simulated time (long: each trial trains in the simulated mesh)."""
    _fault_experiment("loss", rates, policies, 0.0, burst, radio, seeds, data,
                      overrides(grid, run, net), Runner(**runner))


@app.command("failures", cls=ListsCommand)
@grouped
def failures_command(
    fractions: list[str] = list_option("--fractions", number,
                                       DEAD_SHARES, "Shares of the "
                                       "nodes dead from the start (0 trains exactly, "
                                       "once).", "SHARE[,...]"),
    policies: list[str] = list_option("--policies", str, FILL_INS, "Best effort's "
                                      "fill-ins: zero, last, neighbours.", "POLICY[,...]"),
    loss: float = typer.Option(0.0, "--loss", help="Share of frames lost besides."),
    radio: Radio = "802.15.4", seeds: FaultSeeds = 3, grid: Flags = DATA_GRID,
    run: Flags = SHOWN_TRAINING, net: Flags = SHOWN_NETWORK, data: LabelledData = None,
    runner: Flags = RUNNER,
) -> None:
    """Test accuracy, time and energy of best-effort training by the share of dead
    nodes (random cells, found and planned around by the protocol) and fill-in policy,
    under simulated time."""
    if "reliable" in policies:
        raise UsageError("--policies reliable: dead nodes are found by missed deadlines, "
                         "which need best effort")
    _fault_experiment("failures", fractions, policies, loss, None, radio, seeds, data,
                      overrides(grid, run, net), Runner(**runner))


@app.command("compare")
def compare_command(
    runs: list[Path] = typer.Argument(..., metavar="RUN_DIR...", help="Finished run "
                                      "directories of one fault experiment (loss or "
                                      "failures), say one per network head."),
    out: Path = typer.Option(..., "--out", "-o", help="The PNG to write."),
    labels: list[str] | None = typer.Option(None, "--label", help="A run's name on the "
                                            "plot, once per RUN_DIR in order (default: "
                                            "its pooling and failout)."),
) -> None:
    """Plot the test accuracy of finished loss or failures sweeps against the share of
    faults in one figure, one colour per run: heads or settings measured the same way."""
    from meshdl.experiments import faults

    if len(runs) < 2:
        raise UsageError("compare needs at least two run directories")
    if labels and len(labels) != len(runs):
        raise UsageError(f"--label: {len(labels)} given for {len(runs)} run directories; "
                         "give one per run or none")
    sweeps, names = [], set()
    for index, run_dir in enumerate(runs):
        config, summary = _finished_sweep(run_dir)
        names.add(config["experiment"])
        settings = config["settings"]
        label = labels[index] if labels else (
            f"pool {settings['model']['pool']}, failout {settings['train'].get('failout', 0):g}")
        sweeps.append(faults.Sweep(label, summary["rows"]))
    if len(names) > 1 or not names <= set(faults.SWEEPS):
        raise UsageError(f"compare takes runs of one of {', '.join(faults.SWEEPS)}, "
                         f"got {', '.join(sorted(names))}")
    path = faults.compare_plot(out, names.pop(), sweeps)
    err_console.print(f"wrote {path}", highlight=False)


def _finished_sweep(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run directory's config.json and summary.json, or a one-line error (exit 1, as
    for any missing or corrupt file)."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError, RecursionError) as error:  # (nested past the parser)
        raise MeshdlError(f"{run_dir}: not a finished experiment's run directory "
                          f"({type(error).__name__}: {error})") from None
    if not (isinstance(config, dict) and isinstance(config.get("settings"), dict)
            and "model" in config["settings"] and "experiment" in config
            and isinstance(summary, dict) and isinstance(summary.get("rows"), list)):
        raise MeshdlError(f"{run_dir}: its config.json or summary.json is not an "
                          "experiment's")
    return config, summary


@app.command("meshes", cls=ListsCommand)
@grouped
def meshes_command(
    counts: list[str] = list_option("--counts", whole, MESH_COUNTS, "Numbers of meshes "
                                    "N.", "N[,...]"),
    modes: list[str] = list_option("--modes", str, SYNC_MODES, "bsp, ssp:S, async, each "
                                   "optionally +overlap.", "MODE[,...]"),
    straggler: bool = typer.Option(True, "--straggler/--no-straggler", help="Also run "
                                   "each N >= 2 with a straggler mesh."),
    straggler_loss: float = typer.Option(0.3, "--straggler-loss", help="The straggler "
                                         "mesh's links lose this share of frames "
                                         "(reliable: same values, more time)."),
    backhaul: BackhaulName = typer.Option("wifi", "--backhaul", help="The edges' link to "
                                          "the parameter server."),
    radio: Radio = "802.15.4",
    seeds: int = typer.Option(1, "--seeds", min=1, help="Seeds per value (the straggler's "
                              "lost frames)."),
    grid: Flags = DATA_GRID, epochs: ShownEpochs = None,
    batch: int = typer.Option(MESH_BATCH, "--batch", min=1, help="Samples per "
                              "mesh and step."),
    lr: ShownLr = None, net: Flags = SHOWN_NETWORK, data: LabelledData = None,
    runner: Flags = RUNNER,
) -> None:
    """Throughput in samples per simulated second, scaling efficiency and test accuracy
    of N meshes training one model, by sync mode, with and without a straggler mesh
    (long: each trial trains in N simulated meshes)."""
    from meshdl.experiments import meshes
    from meshdl.sim.radio.loss import FrameLoss
    from meshdl.sim.radio.profiles import profile
    from meshdl.sync import Sync

    _check_values("--counts", counts, 1)
    if any(n > 64 for n in counts):
        raise UsageError(f"--counts {' '.join(map(str, counts))}: at most 64 meshes")
    if not modes or len(set(modes)) != len(modes):
        raise UsageError("--modes: distinct ones of bsp, ssp:S, async (+overlap)")
    for mode in modes:
        sync, plus, extra = mode.partition("+")
        Sync.parse(sync)
        if plus and extra != "overlap":
            raise UsageError(f"--modes {mode}: expected MODE or MODE+overlap")
    profile(radio)
    if straggler:
        FrameLoss(straggler_loss)
    json_out = runner["json_out"]
    flags = _with_data_grid(overrides(grid, net, epochs=epochs, batch=batch, lr=lr), data)
    base = load_run_config(mode="mesh", **flags)
    overlapped = [load_run_config(mode="mesh", **flags, parallel={
        "meshes": 2, "overlap": True}).model] if any("+" in mode for mode in modes) else []
    settings: Record = {
        "experiment": "meshes", "model": common_head(base, overlapped).model_dump(),
        "train": base.train.model_dump(), "mesh": base.mesh.model_dump(mode="json"),
        "data": base.data.model_dump(), "radio": radio, "backhaul": backhaul,
        "straggler_loss": straggler_loss,
        "data_file": str(data.resolve()) if data is not None else None}
    swept = meshes.values(counts, modes, straggler)
    # Without a straggler nothing is drawn: one seed; with one, its lost frames.
    trials = [Trial(i, value, seed, settings) for i, (value, seed) in
              enumerate((v, s) for v in swept for s in range(seeds if v[2] else 1))]
    run_dir, records, rows_ = _run_sweep(
        "meshes", trials, f"{len(swept)} (N, mode, straggler) triples, "
        f"{base.train.epochs} epochs each", Runner(**runner), meshes.run, meshes.FIGURES,
        lambda record: said(record, [("samples_per_s", digits(4)), ("step_s", fixed(1)),
                                     ("test_acc", percent(2))]))
    batch_ = base.train.batch
    summary = {"experiment": "meshes", "mode": f"simulated time, {radio}, {backhaul} "
               f"backhaul, batch {batch_} per mesh, {base.train.epochs} epochs per trial",
               "values": swept, "seeds": seeds, "rows": rows_,
               "efficiency": [{"value": list(k), "efficiency": v}
                              for k, v in meshes.efficiencies(rows_).items()], "paper": []}
    _publish(run_dir, {"experiment": "meshes", "values": swept,
                       "seeds": list(range(seeds)), "settings": settings},
             records, summary, meshes.FIGURES, lambda: meshes.plot(run_dir, rows_),
             meshes.table(rows_), f"several meshes: {batch_} samples per mesh and step",
             json_out, meshes.VARIABLES)


@app.command("compression", cls=ListsCommand)
@grouped
def compression_command(
    policies: list[str] = list_option("--policies", str, COMPRESSIONS,
                                      "Gradient policy (as --compress: it may hold commas), "
                                      "optionally /fp16 or /int8 for the forward "
                                      "activations; none/float32 is always run.", "POLICY",
                                      split=whole_value),
    meshes_: int = typer.Option(1, "--meshes", min=1, max=64, help="Meshes training "
                                "one model (bsp), through the parameter server (1 too)."),
    radio: Radio = "802.15.4",
    sim_waves: int = typer.Option(2, "--sim-waves", min=1, help="Training waves timed "
                                  "under simulated time per trial."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Training seeds per policy."),
    grid: Flags = DATA_GRID, run: Flags = SHOWN_TRAINING, net: Flags = SHOWN_NETWORK,
    data: LabelledData = None, runner: Flags = RUNNER,
) -> None:
    """Test accuracy, REDUCE and edge -> server bytes per step and simulated seconds per
    epoch of each compression policy against the exact run, over training seeds (long:
    each trial trains in the virtual mesh)."""
    from meshdl.experiments import compression
    from meshdl.sim.radio.profiles import profile

    profile(radio)
    json_out = runner["json_out"]
    flags = _with_data_grid(overrides(grid, net, run), data)
    swept = list(dict.fromkeys(["none", *policies]))
    heads = []
    for value in swept:  # an impossible policy fails here, before any trial
        gradient, activations = compression.parse_value(value)
        heads.append(load_run_config(mode="mesh", **flags, mesh={
            "compress": gradient, "activations": activations}).model)
    base = load_run_config(mode="mesh", **flags)
    settings: Record = {
        "experiment": "compression", "model": common_head(base, heads).model_dump(),
        "train": base.train.model_dump(exclude={"seed"}),
        "mesh": base.mesh.model_dump(mode="json", exclude={"compress", "activations"}),
        "data": base.data.model_dump(), "radio": radio, "meshes": meshes_,
        "sim_waves": sim_waves,
        "data_file": str(data.resolve()) if data is not None else None}
    trials = [Trial(i, value, seed, settings) for i, (value, seed) in
              enumerate((v, s) for v in swept for s in range(seeds))]
    run_dir, records, rows_ = _run_sweep(
        "compression", trials, f"{len(swept)} policies x {seeds} seed(s), "
        f"{base.train.epochs} epochs each", Runner(**runner), compression.run,
        compression.FIGURES,
        lambda record: said(record, [("test_acc", percent(2)),
                                     ("gradient_bytes_per_step", size)]))
    compression.add_costs(rows_, records)
    where = "one mesh" if meshes_ == 1 else f"{meshes_} meshes (bsp)"
    summary = {"experiment": "compression", "mode": f"virtual mesh, {where}, "
               f"{base.train.epochs} epochs per trial; simulated time on {radio}",
               "values": swept, "seeds": seeds, "rows": rows_, "paper": []}
    _publish(run_dir, {"experiment": "compression", "values": swept,
                       "seeds": list(range(seeds)), "settings": settings},
             records, summary, compression.FIGURES,
             lambda: compression.plot(run_dir, rows_), compression.table(rows_),
             f"compression: {over(seeds)}, {where}", json_out)


@app.command("delta", cls=ListsCommand)
def delta_command(
    epsilons: list[str] = list_option("--epsilon", number, EPSILONS, "Change below "
                                      "which a HALO cell is not sent again (whole halos "
                                      "always run too).", "EPS[,...]"),
    slots: int = typer.Option(48, "--slots", min=1, help="Time slots of live inference "
                              "(48: a day of 30-minute slots)."),
    start: int = typer.Option(0, "--start", min=0, help="First test-period slot."),
    model_path: Path | None = typer.Option(None, "--model", help="model.npz to run "
                                           "(default: train one centrally first)."),
    rows: ModelRows = None, cols: ModelCols = None, epochs: ShownEpochs = None,
    data: LabelledData = None, out: Out = None, json_out: JsonSummary = False,
) -> None:
    """HALO bytes per slot of live inference with delta halos against whole halos, and
    the alerts that change, over a day of the lounge's test period."""
    from meshdl.data.datasets import load_dataset
    from meshdl.experiments import delta

    if any(e < 0 for e in epsilons):
        raise UsageError("--epsilon: changes are at least 0")
    if model_path is not None:  # a missing or corrupt file fails here, before any trial
        from meshdl.model.cnn import CNN

        trained = CNN.load(model_path).config
        rows, cols = rows or trained.rows, cols or trained.cols
    if data is not None:
        grid = load_dataset(data)
        rows, cols = rows or grid.rows, cols or grid.cols
    base = load_run_config(mode="central", model={"rows": rows, "cols": cols},
                           train={"epochs": epochs})
    if start + slots > base.data.test:
        raise UsageError(f"--start {start} --slots {slots}: the test period has "
                         f"{base.data.test} slots")
    settings: Record = {
        "experiment": "delta", "model": base.model.model_dump(),
        "train": base.train.model_dump(), "data": base.data.model_dump(),
        "slots": slots, "start": start,
        "model_file": str(model_path.resolve()) if model_path else None,
        "data_file": str(data.resolve()) if data is not None else None}
    swept = [delta.FULL, *dict.fromkeys(epsilons)]
    trials = [Trial(i, value, 0, settings) for i, value in enumerate(swept)]
    run_dir, records, rows_ = _run_sweep(
        "delta", trials, f"{slots} slots of live inference each",
        Runner(1, out, json_out, None), delta.run, delta.FIGURES,
        lambda record: said(record, [("halo_bytes_per_slot", size),
                                     ("alerts", fixed(0))]))
    delta.add_reference(rows_, records)
    summary = {"experiment": "delta", "mode": f"virtual mesh, {slots} live slots from "
               f"test slot {start}, batch 1", "values": swept, "seeds": 1, "rows": rows_,
               "paper": []}
    _publish(run_dir, {"experiment": "delta", "values": swept, "seeds": [0],
                       "settings": settings},
             records, summary, delta.FIGURES, lambda: delta.plot(run_dir, rows_),
             delta.table(rows_), f"delta halos over {slots} slots", json_out)


def _fault_experiment(name: str, shares: list[float], policies: list[str], loss: float,
                      burst: float | None, radio: str, seeds: int, data: Path | None,
                      flags: dict[str, Record], runner: Runner) -> None:
    """Check a fault sweep, run its trials, write its run directory, print its table."""
    from meshdl.experiments import faults
    from meshdl.protocol.deadlines import Policy
    from meshdl.sim.radio.loss import MAX_RATE, FrameLoss
    from meshdl.sim.radio.profiles import profile

    json_out = runner.json_out

    flag, top = ("--rates", MAX_RATE) if name == "loss" else ("--fractions", 0.9)
    if not shares or len(set(shares)) != len(shares) or \
            any(not 0.0 <= share <= top for share in shares):
        raise UsageError(f"{flag} {' '.join(map(str, shares))}: distinct shares from 0 to "
                         f"{top}")
    known = (*Policy, "reliable")
    if not policies or len(set(policies)) != len(policies) or \
            any(p not in known for p in policies):
        raise UsageError(f"--policies {' '.join(policies)}: distinct ones of "
                         f"{', '.join(known)}")
    profile(radio)  # an unknown name fails here, naming the known ones
    for rate in [*shares, loss] if name == "loss" else [loss]:
        if rate:
            FrameLoss(rate, burst)  # an impossible rate or burst fails here
    base = load_run_config(mode="mesh", **_with_data_grid(flags, data))
    settings: Record = {
        "experiment": name, "model": base.model.model_dump(),
        "train": base.train.model_dump(), "mesh": base.mesh.model_dump(mode="json"),
        "data": base.data.model_dump(), "radio": radio, "burst": burst, "loss": loss,
        "data_file": str(data.resolve()) if data is not None else None}
    swept = faults.values(shares, policies)
    # Without faults the fault seed draws nothing: the exact run once.
    trials = [Trial(i, value, seed, settings) for i, (value, seed) in
              enumerate((v, s) for v in swept for s in range(1 if v[0] == 0 else seeds))]
    run_dir, records, rows_ = _run_sweep(
        name, trials, f"{len(swept)} (share, policy) pairs x {seeds} fault seed(s), "
        f"{base.train.epochs} epochs each", runner, faults.run, faults.FIGURES,
        lambda record: said(record, [("test_acc", percent(2)),
                                     ("clean_test_acc", percent(2)),
                                     ("seconds_per_epoch", fixed(0))]))
    summary = {"experiment": name, "mode": f"simulated time, {radio}, training "
               f"{base.train.epochs} epochs per trial", "values": swept, "seeds": seeds,
               "rows": rows_, "paper": []}
    what = "over lossy links" if name == "loss" else "with dead nodes"
    _publish(run_dir, {"experiment": name, "values": swept, "seeds": list(range(seeds)),
                       "settings": settings},
             records, summary, faults.FIGURES, lambda: faults.plot(run_dir, name, rows_),
             faults.table(name, rows_), f"training {what}, {over(seeds, 'fault seed')}",
             json_out, faults.SWEEPS[name].variables)


def _run_sweep(name: str, trials: list[Trial], what: str, runner: Runner,
               run: Callable[[Trial], Record], figures: tuple[str, ...],
               describe: Callable[[Record], str],
               work: Callable[[Trial], float] | None = None
               ) -> tuple[Path, list[Record], list[Record]]:
    """Announce a sweep, run its trials with `run` and summarize them: its run directory,
    the trials' records and the summary's rows. `work`: a trial's size (`Estimate`)."""
    run_dir = _announce(name, trials, what, runner.jobs, runner.ray, runner.out)
    records = _run_with_progress(run, trials, runner.jobs, runner.ray, run_dir, describe,
                                 work)
    return run_dir, records, summarize(trials, records, figures)


def _run_with_progress(run: Callable[[Trial], Record], trials: list[Trial], jobs: int,
                       ray: str | None, run_dir: Path,
                       describe: Callable[[Record], str],
                       work: Callable[[Trial], float] | None = None) -> list[Record]:
    """The trials' records, with one progress bar for the whole sweep on stderr (the
    time left measured from the trials as they finish) and a line for each trial as it
    finishes (the lines alone where stderr is no terminal). Each finished trial goes
    to the run directory's journal at once: the same command with `--out` of a sweep
    that was stopped runs only what it had not finished. Ctrl-C stops the trials and
    says so in one line (exit 130). `work`: a trial's size, for the time left (`Estimate`);
    None, every trial alike."""
    journal = run_dir / "journal.jsonl"
    finished = read_journal(journal)
    stamps: dict[str, str | None] = {}
    to_run = [trial for trial in trials if journal_key(trial, stamps) not in finished]
    taken = len(trials) - len(to_run)
    if taken:
        err_console.print(taking(taken, len(trials), journal), highlight=False,
                          soft_wrap=True)
    size = work or (lambda trial: 1.0)
    estimate = Estimate(len(to_run), 1 if ray is None and jobs <= 1 else jobs,
                        work=sum(map(size, to_run)))
    columns_ = (TextColumn("trials"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), Left(estimate))
    done = [taken]
    try:
        # No bar where stderr is no terminal: its lines alone (a bar that is not drawn
        # still ends in a blank line).
        with Progress(*columns_, console=err_console, transient=True,
                      disable=not err_console.is_terminal) as bar:
            task = bar.add_task("sweep", total=len(trials), completed=taken)

            def on_done(trial: Trial, record: Record) -> None:
                done[0] += 1
                estimate.finished(size(trial))
                bar.advance(task)
                left = "" if done[0] == len(trials) else f"; {estimate.said()}"
                bar.console.print(f"trial {done[0]}/{len(trials)}: {_value(trial.value)} "
                                  f"seed {trial.seed}: {describe(record)}{left}",
                                  highlight=False, soft_wrap=True)

            return run_trials(run, trials, jobs, on_done, ray=ray, journal=journal)
    except KeyboardInterrupt:
        err_console.print(interrupted(done[0], len(trials), run_dir), highlight=False,
                          soft_wrap=True)  # one line, however long: a log's, a grep's
        raise typer.Exit(130) from None


def _value(value: Any) -> str:
    """A swept value in a progress line: 0.1, zero (not [0.1, 'zero'])."""
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _check_values(flag: str, values: list[int], minimum: int) -> None:
    if not values or any(v < minimum for v in values) or len(set(values)) != len(values):
        raise UsageError(f"{flag} {' '.join(map(str, values))}: distinct values of at "
                         f"least {minimum}")


def _with_data_grid(flags: dict[str, Any], data: Path | None) -> dict[str, Any]:
    """`flags` with the grid of the data set `data` (if any) where they leave it unset:
    its grid is the network's; and its training maps as `data_maps`, which the global
    head's epochs follow (`load_run_config`: 40 on 2,400 maps, not the 12 of the
    default 163,200)."""
    from meshdl.data.datasets import load_dataset

    if data is not None:
        grid = load_dataset(data)
        model = flags.setdefault("model", {})
        model["rows"] = model.get("rows") or grid.rows
        model["cols"] = model.get("cols") or grid.cols
        flags["data_maps"] = len(grid.y_train)
    return flags


def _experiment(name: str, values: list, seeds: int, data: Path | None,
                flags: dict[str, Record], runner: Runner) -> None:
    """Run one sweep's trials, write its run directory, print its table."""
    from meshdl.experiments import sweep
    from meshdl.protocol.spec import MeshSpec

    json_out = runner.json_out
    base = load_run_config(mode="central", **_with_data_grid(flags, data))
    settings: Record = {
        "experiment": name, "model": base.model.model_dump(),
        "train": base.train.model_dump(exclude={"seed"}),
        "mesh": base.mesh.model_dump(mode="json"), "data": base.data.model_dump(),
        "data_file": str(data.resolve()) if data is not None else None}  # workers: any cwd
    # A trial's time goes with its cells (a 40 x 40 grid's trains 64 times a 5 x 5's).
    cells: dict[str, float] = {}
    for value in values:  # an impossible value fails here, before any trial
        config = sweep.trial_config(settings, value, 0)
        cells[json.dumps(value)] = float(config.model.rows * config.model.cols)
        if name == "edge-position":
            _check_border(config.mesh.edge_at, config.model.rows, config.model.cols)
        spec = MeshSpec(config.mesh.mesh_id, config.model, config.mesh.edge_at,
                        config.mesh.params_via, config.mesh.max_message_bytes)
        if config.train.batch > spec.max_batch:
            raise UsageError(f"{sweep.SWEEPS[name].axis} = {value}: a wave of "
                             f"{config.train.batch} samples needs messages above "
                             f"{config.mesh.max_message_bytes} bytes; at most "
                             f"{spec.max_batch} fit (lower --batch)")
    trials = [Trial(i, value, seed, settings) for i, (value, seed) in
              enumerate((v, s) for v in values for s in range(seeds))]
    what = "training and one mesh wave" if sweep.SWEEPS[name].trains else "one mesh wave"
    run_dir, records, rows = _run_sweep(
        name, trials, f"{len(values)} values x {seeds} seed(s), {what} each", runner,
        sweep.run, sweep.figures(name),
        lambda record: said(record, [("test_acc", percent(1)), ("wave_bytes", size)]),
        work=lambda trial: cells[json.dumps(trial.value)])
    summary = {"experiment": name, "setting": sweep.SWEEPS[name].setting,
               "mode": ("central (accuracy); " if sweep.SWEEPS[name].trains else "")
               + "one mesh training wave per value (cost)",
               "values": values, "seeds": seeds, "rows": rows,
               "paper": sweep.paper_rows(name, values),
               "seeds_differ": sweep.seeds_differ(records)}
    title = f"{name}: {over(seeds)}" + (
        "; paper: seed 001's own data" if summary["paper"] else "")
    if name == "grid":
        fit = summary["fit"] = sweep.fit_bytes(rows)
        if fit["r2"] is not None:
            sign = "-" if fit["intercept"] < 0 else "+"
            title += (f"; bytes = {fit['bytes_per_cell']:,.0f} x cells {sign} "
                      f"{abs(fit['intercept']):,.0f} (R² {fit['r2']:.4f})")
    _publish(run_dir, {"experiment": name, "values": values, "seeds": list(range(seeds)),
                       "settings": settings},
             records, summary, sweep.figures(name),
             lambda: sweep.plot(run_dir, name, rows, summary["paper"]),
             sweep.table(name, rows), title, json_out, sweep.variables(name))


def _announce(name: str, trials: list[Trial], what: str, jobs: int, ray: str | None,
              out: Path | None) -> Path:
    """The run directory of a sweep about to start, said on stderr with what it runs:
    how many trials, on what, and when the time they take will be known."""
    from meshdl.training.runs import new_run_dir

    run_dir = out or new_run_dir(name=name)
    where = f"Ray ({ray})" if ray else f"{jobs} job(s)"
    err_console.print(f"{name}: {len(trials)} trials ({what}) on {where} -> {run_dir}; "
                      "the time left shows once the first trial has finished",
                      highlight=False, soft_wrap=True)
    return run_dir


def _publish(run_dir: Path, config: Record, records: list[Record], summary: Record,
             figures: tuple[str, ...], plot: Callable[[], list[Path]], table: Shown,
             title: str, json_out: bool, variables: tuple[str, ...] = ("value",)) -> None:
    """Write the run directory and its plots; then print summary.json (`--json`) or the
    table. summary.json keeps the printed table and every figure's title, in the
    table's order (what `meshdl report` and other readers show); table.csv has the
    same order, one column per swept variable (`variables`)."""
    order = ordered(table.keys, figures)
    summary["columns"] = columns(order)
    summary["table"] = {"title": title, "header": table.header, "rows": table.rows}
    write_run(run_dir, config, records, summary, order, variables)
    plots = plot()
    if json_out:
        emit_json(json.loads((run_dir / "summary.json").read_text()))
        return
    _print_table(table, title)
    err_console.print(f"wrote {run_dir}: summary.json, table.csv, trials.jsonl, "
                      f"{', '.join(p.name for p in plots)}", highlight=False)


def _print_table(table: Shown, title: str) -> None:
    """The table on stdout: within the console's width (80 columns in a log) where its
    figures fit whole, titles wrapped; wider where they do not, rather than a number cut
    or split over lines."""
    printed = Table(title=title, show_edge=False)  # no outer edge: 4 columns more
    for i, column in enumerate(table.header):
        printed.add_column(column, justify="right", overflow="fold",
                           min_width=max((cell_len(row[i]) for row in table.rows), default=1))
    for row in table.rows:
        printed.add_row(*(Text(cell, no_wrap=True) for cell in row))
    console = out_console
    wide = console.options.update_width(10_000)
    needed = Measurement.get(console, wide, printed)
    if needed.minimum > console.width:  # rich prints no wider than its console
        console = Console(file=out_console.file, width=needed.maximum,
                          no_color=out_console.no_color,
                          force_terminal=out_console.is_terminal)
    console.print(printed)


def _check_border(cell: tuple[int, int], rows: int, cols: int) -> None:
    r, c = cell
    if not (0 <= r < rows and 0 <= c < cols) or (r not in (0, rows - 1) and \
            c not in (0, cols - 1)):
        raise UsageError(f"--cells {r},{c}: the edge links to a border cell of the "
                         f"{rows} x {cols} grid")
