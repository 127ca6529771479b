"""`meshdl schedule`: the per-layer compression plan that minimizes the simulated
training step (seed 000), against greedy and every single compressor (sim/studies/schedule.py)."""

from __future__ import annotations

import typer

from meshdl.cli.common import emit_json, err_console, out_console
from meshdl.cli.flags import GRID, NETWORK, Flags, grouped, overrides
from meshdl.cli.options import BackhaulName, Batch, json_option
from meshdl.config import load_run_config
from meshdl.errors import UsageError

# The planner's error budget (sim/studies/planner.py MAX_ERROR), written here so that
# --help need not load the simulator; tests/test_cli_startup.py checks they agree.
MAX_ERROR = 0.5


def register(app: typer.Typer) -> None:
    app.command("schedule")(schedule)


@grouped
def schedule(
    radio: str = typer.Option("802.15.4", "--radio", help="Radio profile of the mesh."),
    backhaul: BackhaulName = typer.Option("wifi", "--backhaul", help="With --meshes 2 or "
                                          "more: the edges' link to the server."),
    meshes: int = typer.Option(1, "--meshes", min=1, max=64, help="Meshes training one "
                               "model (bsp with overlap); 1: the mesh alone."),
    max_error: float = typer.Option(MAX_ERROR, "--max-error", min=0.0, help="Per-layer error "
                                    "budget: the largest relative L2 error an option may "
                                    "make of one step's gradient as it reaches the edge "
                                    "(conv layers: times the tree factor)."),
    candidates: list[str] | None = typer.Option(None, "--candidate", help="Compressors to "
                                                "choose from (repeat; default: none, fp16, "
                                                "int8, 2bit, topk:0.1, ktopk, powersgd:1, "
                                                "powersgd:2)."),
    waves: int = typer.Option(2, "--waves", min=1, help="Simulated training waves (steps "
                              "per mesh) per plan."),
    grid: Flags = GRID, net: Flags = NETWORK.only("kernel", "filters", "hidden"),
    batch: Batch = None,
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the backoffs."),
    json_out: json_option("Print the schedule as JSON.") = False,
) -> None:
    """Options table (per layer and compressor: bytes, error, communication,
    compression and overlapped time) and the optimal, greedy and uniform plans, each
    with its predicted and simulated step time."""
    from meshdl.compress.compressors import parse_compressor
    from meshdl.data.lounge import generate_lounge
    from meshdl.sim.radio.backhaul import backhaul_profile
    from meshdl.sim.radio.device import device, natural_device
    from meshdl.sim.radio.media import natural_medium
    from meshdl.sim.radio.profiles import profile
    from meshdl.sim.studies.planner import CANDIDATES
    from meshdl.sim.studies.schedule import Setting
    from meshdl.sim.studies.schedule import schedule as build

    chosen = tuple(dict.fromkeys(candidates or CANDIDATES))
    for spec in chosen:
        parse_compressor(spec)
    if "none" not in chosen:
        raise UsageError("--candidate: none must be among the candidates (the dense plan "
                         "anchors the model)")
    config = load_run_config(mode="mesh", **overrides(grid, net, batch=batch, seed=seed))
    radio_profile = profile(radio)
    link = backhaul_profile(backhaul)
    with err_console.status("generating the synthetic lounge data set"):
        data = generate_lounge(config.data)
    if waves * config.train.batch * meshes > len(data.y_train):
        raise UsageError(f"--waves {waves} of --batch {config.train.batch} on {meshes} "
                         f"mesh(es) need more than the {len(data.y_train)} training maps")
    setting = Setting(config, data, radio_profile, natural_medium(radio),
                      device(natural_device(radio)), device("pi4"),
                      link if meshes > 1 else None, meshes, waves, seed)
    err_console.print(f"schedule: simulating plans on {radio}"
                      f"{f', {meshes} meshes over {backhaul}' if meshes > 1 else ''} "
                      f"({waves} wave(s) each)", highlight=False)
    result = build(setting, chosen, max_error)
    if json_out:
        emit_json(result)
        return
    from rich.table import Table

    table = Table(title=f"per-layer compression on {radio}: step seconds")
    for column in ("plan", "per layer", "predicted s", "simulated s"):
        table.add_column(column, justify="right")
    plans = result["plans"]
    rows_ = [("optimal", plans["optimal"]), ("greedy", plans["greedy"])] + \
        [(f"uniform {k}", v) for k, v in plans["uniform"].items()]
    for name, plan in rows_:
        table.add_row(name, " ".join(f"{k}={v}" for k, v in plan["per_layer"].items()
                                     if v not in ("none", "float32")) or "dense",
                      f"{plan['predicted_step_s']:.3f}", f"{plan['simulated_step_s']:.3f}")
    out_console.print(table)
