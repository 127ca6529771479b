"""`meshdl radio list`: the radio profiles a simulation can use, with their sources.

The built-in profiles come from sim/radio/radios.toml; `--file` adds a user's `[[radio]]`
tables (one named like a built-in replaces it). `--json` prints each profile's fields,
so the output can be read back as a profile.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from meshdl.cli.common import emit_json, out_console
from meshdl.cli.options import json_option

if TYPE_CHECKING:  # the simulator's radios load when the command runs, not for --help
    from meshdl.sim.radio.profiles import RadioProfile

app = typer.Typer(help="Radio profiles of the simulated mesh: figures and their sources.",
                  no_args_is_help=True)


@app.callback()
def _radio() -> None:
    """Radio profiles: bit rate, frame format, MAC timing, power and duty cycle."""


@app.command("list")
def list_profiles(
    file: Path | None = typer.Option(None, "--file", help="A TOML file of \\[\\[radio]] tables; "
                                     "a profile named like a built-in replaces it."),
    json_out: json_option("Print the profiles as a JSON list on stdout.") = False,
) -> None:
    """List the radio profiles: built-in ones and those of --file."""
    from meshdl.sim.radio.profiles import profiles

    known = profiles(file)
    if json_out:
        emit_json([radio.model_dump() for radio in known.values()])
        return
    table = profile_table(known.values())
    _console_for(table).print(table)
    for radio in known.values():
        out_console.print(f"[bold]{escape(radio.name)}[/]: {escape(radio.source)}",
                          highlight=False)


def profile_table(radios: Iterable[RadioProfile]) -> Table:
    """One row per profile: rate, frame sizes, a full frame's airtime, powers, duty cycle."""
    table = Table(title="radio profiles (a full frame's airtime; sources below)")
    columns = ("radio", "bitrate", "max frame B", "payload/frame B", "full frame ms",
               "tx mW", "rx mW", "idle mW", "sleep mW", "duty cycle")
    for column in columns:
        table.add_column(column, no_wrap=True, justify="left" if column == "radio" else "right")
    for r in radios:
        table.add_row(escape(r.name), _rate(r.bitrate_bps), str(r.max_frame_bytes),
                      str(r.payload_per_frame), f"{r.frame_airtime(r.max_frame_bytes) * 1e3:.3f}",
                      *(_milliwatts(w) for w in (r.tx_w, r.rx_w, r.idle_w, r.sleep_w)),
                      f"{r.duty_cycle:.0%}" if r.duty_cycle < 1 else "unlimited")
    return table


def _console_for(table: Table) -> Console:
    """`out_console`, or a copy as wide as the table: cut to 80 columns (a pipe) it would
    shorten names and figures to "…", while a line the terminal wraps loses nothing."""
    probe = Console(width=10_000)
    need = Measurement.get(probe, probe.options, table).maximum
    if need <= out_console.width:
        return out_console
    return Console(file=out_console.file, width=need, color_system=out_console.color_system,
                   force_terminal=out_console.is_terminal)


def _rate(bps: float) -> str:
    for scale, unit in ((1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def _milliwatts(watts: float) -> str:
    # Three significant figures: sleep powers are microwatts, transmit powers tens of mW.
    return f"{watts * 1e3:.3g}"
