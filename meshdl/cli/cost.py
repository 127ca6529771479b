"""`meshdl cost`: what one training wave costs on the network, measured and analytical."""

from __future__ import annotations

from typing import Any

import typer

from meshdl.cli.common import emit_json, out_console, parse_cell
from meshdl.cli.options import Cols, ConvLayers, EdgeAt, Filters, JsonReport, Kernel, Pool, Rows
from meshdl.config import model_from_flags


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)


def cost(
    rows: Rows = 17, cols: Cols = 25, kernel: Kernel = 3, filters: Filters = None,
    conv_layers: ConvLayers = None, pool: Pool = 2,
    batch: int = typer.Option(100, "--batch", min=1, help="Samples in the wave."),
    edge_at: EdgeAt = "0,0",
    auth: bool = typer.Option(False, "--auth", help="Every message with its link tag or "
                              "the edge's signature (mesh.auth)."),
    json_out: JsonReport = False,
) -> None:
    """Run one dry training wave on random data and report its communication cost."""
    from meshdl.sim.mesh import dry_wave  # the virtual mesh: when the command runs

    # (an unset --filters: the field's default, or the global head's recipe's)
    config = model_from_flags(rows=rows, cols=cols, kernel=kernel, filters=filters,
                              conv_layers=conv_layers, pool=pool, hidden=8)
    report = dry_wave(config, batch, parse_cell(edge_at), auth)
    report["model"] = config.model_dump(mode="json", exclude={"hidden", "classes"})
    if json_out:
        emit_json(report)
        return
    out_console.print(f"one training wave of {batch} samples: {config.rows} x {config.cols} "
                      f"cells, kernel {config.kernel}, {config.filters} filters, "
                      f"{config.conv_layers} conv layers, pool {config.pool}", highlight=False)
    print_comm_summary(report, console=out_console)


def print_comm_summary(comm: dict[str, Any], console: Any = None) -> None:
    """Tables of a "comm" report: classes, halo against the formula, wave depth."""
    from rich.table import Table

    from meshdl.cli.common import err_console

    console = console or err_console
    waves = max(comm.get("waves", 1), 1)
    table = Table(title=f"communication per wave (average of {waves})")
    for column in ("class", "values", "messages", "bytes", "radio tx", "radio bytes"):
        table.add_column(column, justify="left" if column == "class" else "right")
    for name, c in comm["classes"].items():
        b = c.get("broadcast", {})
        table.add_row(name, f"{c['values'] / waves:,.0f}", f"{c['messages'] / waves:,.0f}",
                      f"{c['bytes'] / waves:,.0f}", f"{b.get('transmissions', 0) / waves:,.0f}",
                      f"{b.get('bytes', 0) / waves:,.0f}")
    console.print(table)
    halo = Table(title="halo values per sample: needed, transmitted, (k^2-1)*m*n*c_in")
    for column in ("layer", "needed", "transmitted", "formula"):
        halo.add_column(column, justify="right")
    for layer, h in comm["halo"].items():
        halo.add_row(layer, f"{h['needed']:,}", f"{h['transmitted']:,.0f}", f"{h['formula']:,}")
    console.print(halo)
    depth = comm.get("wave_depth", {})
    busiest = comm.get("busiest_link") or {}
    if "wave_s" in depth:  # simulated time: seconds, not rounds
        # The run's last wave alone (after training: an evaluation's, forward only, on
        # a batch of its own), not the mean a training run's summary gives of its waves.
        from meshdl.report.numbers import figure

        wave = depth.get("wave") or "?"
        only = ", forward only" if wave == "infer" else ""
        extent = (f"the run's last wave ({wave}{only}): its forward pass "
                  f"{figure(depth.get('forward_s') or 0.0)} s, the whole wave "
                  f"{figure(depth.get('wave_s') or 0.0)} s (mesh diameter "
                  f"{depth.get('diameter')}, edge to far corner "
                  f"{depth.get('edge_hops_to_far_corner')} hops); ")
    elif "wave_rounds" in depth:  # the virtual mesh delivers in rounds
        extent = (f"forward wave depth {depth.get('forward_rounds', 0):.0f} rounds (mesh "
                  f"diameter {depth.get('diameter')}, edge to far corner "
                  f"{depth.get('edge_hops_to_far_corner')} hops); whole wave "
                  f"{depth.get('wave_rounds')} rounds; ")
    else:  # over MQTT nobody sees the rounds or the time of a wave inside the mesh
        extent = ""
    console.print(
        f"{extent}busiest link "
        f"{busiest.get('link')} ({busiest.get('bytes', 0) / waves:,.0f} bytes per wave). "
        "Needed < formula because windows reaching past the border read zeros that "
        "nobody sends.", highlight=False)
