"""Helpers shared by the CLI commands: consoles, JSON output, option groups."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

# Progress, tables and errors go to stderr so that stdout carries only `--json` output.
err_console = Console(stderr=True)
# A command's own human-readable result (a table, a report) goes to stdout.
out_console = Console()

# Options several commands share (the network's shape, the run's length): declared once,
# so that they read the same in every command's help.
ROWS = typer.Option(None, "--rows", help="Grid rows.")
COLS = typer.Option(None, "--cols", help="Grid columns.")
KERNEL = typer.Option(None, "--kernel", help="Filter size k.")
FILTERS = typer.Option(None, "--filters", help="Filters per conv layer.")
CONV_LAYERS = typer.Option(None, "--conv-layers", help="Conv layers.")
POOL = typer.Option(None, "--pool", help="Max-pool size.")
HIDDEN = typer.Option(None, "--hidden", help="Hidden FC units.")
EPOCHS = typer.Option(None, "--epochs", help="Training epochs.")
BATCH = typer.Option(None, "--batch", help="Batch size.")
LR = typer.Option(None, "--lr", help="Learning rate.")
ACTIVATIONS = typer.Option(None, "--activations", help="Forward activations between "
                           "nodes (HALO, POOL, GATHER): float32, or lossy fp16 or int8.")
COMPRESS = typer.Option(None, "--compress", help="Gradient compression with error "
                        "feedback (REDUCE in the mesh, edge to server): none, hylo[:T[:c]], "
                        "NAME[:ARG] or LAYER=NAME[:ARG],... (docs/compression.md).")


def emit_json(payload: Any, indent: int | None = 2) -> None:
    """Print one JSON document on stdout (the only thing `--json` commands print there);
    `indent=None` prints it on one line (a stream of records)."""
    sys.stdout.write(json.dumps(payload, indent=indent, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)


def parse_cell(text: str) -> tuple[int, int]:
    """'R,C' -> (R, C), or a UsageError saying what was expected."""
    from meshdl.errors import UsageError

    try:
        row, col = (int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"expected a cell as ROW,COL (e.g. 0,0), got {text!r}") from None
    return row, col
