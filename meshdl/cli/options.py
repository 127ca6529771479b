"""The options several commands take, each declared once as an `Annotated` alias.

A flag that means the same in every command is declared here, so that its name, help
and checks cannot drift apart between commands; the command sets its default with `=`
(`rows: Rows = None` to leave the configuration's, `rows: Rows = 17` to fix one).
Where a flag's help or checks genuinely differ between commands, it has an alias of
its own, named for what it means there. Options of one command stay in that command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

# The network's shape (ModelConfig).
Rows = Annotated[int | None, typer.Option("--rows", help="Grid rows.")]
Cols = Annotated[int | None, typer.Option("--cols", help="Grid columns.")]
Kernel = Annotated[int | None, typer.Option("--kernel", help="Filter size k.")]
Filters = Annotated[int | None, typer.Option("--filters", help="Filters per conv layer.")]
ConvLayers = Annotated[int | None, typer.Option("--conv-layers", help="Conv layers.")]


def _pool(value: str | int | None) -> int | str | None:
    """--pool N (a max-pool window) or --pool global (each channel's grid maximum)."""
    if value is None or isinstance(value, int) or value == "global":
        return value
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither a window size nor 'global'") from None


Pool = Annotated[str | None, typer.Option(
    "--pool", metavar="N|global", parser=_pool,
    help="Max-pool size, or global: each channel's maximum over the grid.")]
Hidden = Annotated[int | None, typer.Option("--hidden", help="Hidden FC units.")]

# The training run (TrainConfig).
Epochs = Annotated[int | None, typer.Option("--epochs", help="Training epochs.")]
Batch = Annotated[int | None, typer.Option("--batch", help="Batch size.")]
Lr = Annotated[float | None, typer.Option("--lr", help="Learning rate.")]
Failout = Annotated[float | None, typer.Option(
    "--failout", min=0.0, max=0.99, help="Share of the cells that act dead in each "
    "training step (no reading, no output), drawn anew every step.")]
Optimizer = Annotated[Literal["sgd", "adam"] | None, typer.Option("--optimizer",
                                                                  help="The optimizer.")]

# What travels between the parties (MeshConfig) and how several meshes train together.
EdgeAt = Annotated[str | None, typer.Option("--edge-at", metavar="R,C",
                                            help="Border cell R,C of the edge.")]
Auth = Annotated[bool | None, typer.Option("--auth", help="Every message with its link tag "
                                           "or the edge's signature (mesh.auth).")]
Activations = Annotated[Literal["float32", "fp16", "int8", "int8-static"] | None,
                        typer.Option(
    "--activations", help="Forward activations between nodes (HALO, POOL, GATHER): "
    "float32, lossy fp16 or int8 (a scale per message), or int8-static (inference "
    "only: the model's calibrated per-layer scales, exact to the central int8 "
    "emulation).")]
Compress = Annotated[str | None, typer.Option(
    "--compress", help="Gradient compression with error feedback (REDUCE in the mesh, "
    "edge to server): none, hylo[:T[:c]], NAME[:ARG] or LAYER=NAME[:ARG],... "
    "(docs/compression.md).")]
Meshes = Annotated[int | None, typer.Option(
    "--meshes", help="Meshes of this grid, each with its edge, training one model "
    "through a parameter server (--batch is each mesh's share).")]

# The links between the meshes' edges and the parameter server (sim/radio/backhauls.toml).
BackhaulName = Literal["wifi", "ethernet", "lte"]

# Files and directories.
Config = Annotated[Path | None, typer.Option("--config", help="TOML configuration file.")]
SeedConfig = Annotated[Path | None, typer.Option("--config", help="TOML configuration "
                                                 "(default: the seed experiment).")]
MeshFile = Annotated[Path, typer.Option("--mesh", help="The mesh file (TOML run "
                                        "configuration).")]
RunDirectory = Annotated[Path | None, typer.Option("--out", help="Run directory.")]
ForceOut = Annotated[bool, typer.Option("--force", help="Replace the run in --out (else a "
                                        "directory holding a run is refused).")]
LabelledData = Annotated[Path | None, typer.Option("--data", help="Data set .npz (default: "
                                                   "the synthetic lounge).")]
KeysDir = Annotated[Path, typer.Option(
    "--keys-dir", help="Where the secrets files will be installed on the machines (the "
    ".env files name the key files there).")]
RadioFile = Annotated[Path | None, typer.Option("--radios", help="A TOML file of "
                                                "[[radio]] profiles.")]
ModelFile = Annotated[Path, typer.Argument(metavar="MODEL", help="A model.npz.")]
DataFile = Annotated[Path, typer.Argument(metavar="DATA", help="A data set .npz.")]

# A mesh over MQTT.
Broker = Annotated[str, typer.Option("--broker", help="mqtt://host[:port] or "
                                     "mqtts://host[:port].")]
SlotSeconds = Annotated[float, typer.Option("--slot-seconds", min=0.05,
                                            help="Length of a live time slot.")]
NodesTimeout = Annotated[float, typer.Option("--nodes-timeout", min=0.0,
                                             help="Seconds to wait for node hosts.")]
TakeOver = Annotated[bool, typer.Option("--take-over", help="Start even while another "
                                        "edge holds the mesh: that edge stops.")]
Sensor = Annotated[str | None, typer.Option(
    "--sensor", help="Live readings for `edge serve`: ds18b20:DIR, bme280[:BUS[:ADDR]], "
    "replay:LOG or synthetic[:SEED].")]
ReplayData = Annotated[Path | None, typer.Option(
    "--data", help="Data set .npz whose readings the cells replay (training and "
    "evaluation).")]

def json_option(printed: str) -> Any:
    """`--json`, the one declaration of the flag every command offers; `printed` is its
    help: what the command prints on stdout instead of its human-readable output."""
    return Annotated[bool, typer.Option("--json", help=printed)]


JsonReport = json_option("Print the report as JSON on stdout.")
JsonFigures = json_option("Print the figures as JSON on stdout.")
JsonMetrics = json_option("Print metrics.json on stdout.")
JsonSim = json_option("Print sim.json on stdout.")
