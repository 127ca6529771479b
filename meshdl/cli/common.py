"""Helpers shared by the CLI commands: consoles, JSON output, cells (options: options.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

# Progress, tables and errors go to stderr so that stdout carries only `--json` output.
err_console = Console(stderr=True)
# A command's own human-readable result (a table, a report) goes to stdout.
out_console = Console()

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


def file_to_write(path: Path, force: bool, other: str = "") -> Path:
    """`path`, checked before a command spends anything on what it will write there: a
    UsageError when it is a directory or sits under a file (no --force makes either a
    file it can write), a MeshdlError when it exists and `force` is off (`other`: what
    else the user may pass, e.g. ", or --out another file")."""
    from meshdl.errors import MeshdlError, UsageError

    if path.is_dir():
        raise UsageError(f"{path} is a directory; give the path of the file to write")
    above = next((parent for parent in path.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise UsageError(f"{path}: {above} is a file, not a directory")
    if path.exists() and not force:
        raise MeshdlError(f"{path} exists; pass --force to overwrite it{other}")
    return path
