"""`meshdl plan --cell r1c1`: what one node expects, computes and sends in a wave.

For people debugging a deployment: which messages a cell waits for (and on which
topics), which of its computations wait for which inputs, and what it sends, with the
bytes at a given batch; then every kind a node sends, as the protocol's table says
(meshdl/protocol/kinds.py, PROTOCOL.md's "Message kinds"). Everything comes from the
mesh spec alone (meshdl/protocol/spec.py) and the node's own plan (`NodePlan`), the very
objects a node runs on.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from meshdl.cli.common import emit_json, out_console
from meshdl.cli.flags import GRID, NETWORK, Flags, grouped, overrides
from meshdl.cli.options import EdgeAt, json_option
from meshdl.config import load_run_config
from meshdl.errors import UsageError

# The protocol and the node's plan (Numba kernels behind them) load when the command
# runs, not for `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.protocol.messages import Kind
    from meshdl.protocol.spec import MeshSpec
    from meshdl.protocol.topology import Cell


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


@grouped
def plan(
    cell: str = typer.Option(..., "--cell", help="The node: r<row>c<col> or R,C."),
    mesh: Path | None = typer.Option(None, "--mesh", "--config", help="The mesh file (TOML "
                                     "run configuration; default: the seed experiment)."),
    transport: Literal["mqtt", "radio"] = typer.Option(
        "mqtt", "--transport", help="mqtt (the edge publishes parameters to every node) or "
        "radio (they flood down the tree)."),
    grid: Flags = GRID,
    net: Flags = NETWORK.without("hidden"),
    edge_at: EdgeAt = None,
    auth: bool | None = typer.Option(None, "--auth/--no-auth", help="Every message with "
                                     "its link tag or the edge's signature (mesh.auth)."),
    batch: int | None = typer.Option(None, "--batch", min=1, help="Samples in the wave "
                                     "(default: the configuration's batch)."),
    json_out: json_option("Print the plan as JSON on stdout.") = False,
) -> None:
    """What one node expects, computes and sends in a training wave."""
    from meshdl.protocol.spec import MeshSpec

    # The flags `meshdl cost` takes, layered over the mesh file as `meshdl train` does:
    # the plan must be the one of the deployment being debugged, not of the defaults.
    config = load_run_config(mesh, **overrides(grid, net, batch=batch, edge_at=edge_at,
                                               auth=auth))
    spec = MeshSpec(config.mesh.mesh_id, config.model, config.mesh.edge_at,
                    "broadcast" if transport == "mqtt" else "tree",
                    config.mesh.max_message_bytes, config.mesh.auth)
    where = _parse_cell(cell, spec)
    report = node_plan(spec, where, config.train.batch)
    if json_out:
        emit_json(report)
        return
    _print(report)


def node_plan(spec: MeshSpec, cell: Cell, batch: int) -> dict[str, Any]:
    """The plan of `cell` as plain data: role, receives, computes, sends."""
    from meshdl.nodes.plan import NodePlan, Role
    from meshdl.protocol.kinds import Party, sent_by
    from meshdl.protocol.spec import Send
    from meshdl.protocol.topics import name_of

    topo = spec.topology
    node = NodePlan(spec, cell)
    block = topo.block_of(cell)
    role = {
        "parent": name_of(topo.parent[cell]),
        "children": [name_of(c) for c in topo.children[cell]],
        "neighbours": [name_of(c) for c in topo.neighbours(cell)],
        "pooling_block": list(block),
        "pooling_cells": [name_of(c) for c in topo.block_cells(block)],
        "pooling_leader": name_of(topo.leader[block]),
        "leads_its_block": topo.leader[block] == cell,
        "global_pooling": spec.model.global_pool,
        "linked_to_edge": cell == spec.edge_at,
        "control_from": name_of(spec.control_source(cell)),
    }
    receives = []
    for (kind, layer, phase, src), expect in node.inbox.items():
        per_sample, fixed = (expect.rows * expect.channels, 0) if expect.role == Role.ITEMS \
            else _relay_values(spec, kind)
        receives.append(_message(spec, kind, layer, phase, src, expect.dst, expect.rows or 1,
                                 per_sample, fixed, batch, expect.train_only))
    computes = []
    for index, task in enumerate(node.tasks):
        if isinstance(task, Send):
            continue
        waits = [_source(s, spec.model.global_pool) for s, tasks in node.waiters.items()
                 if index in tasks]
        computes.append({"task": task.step, "layer": task.layer, "stage": task.stage,
                         "train_only": node.train_only[index], "waits_for": waits})
    sends = [_message(spec, s.kind, s.layer, s.phase, cell, s.dst, len(s.items),
                      len(s.items) * spec.item_shape(s.field, 0)[0], 0, batch, s.train_only,
                      own=True) for s in spec.sends[cell]]
    # Then the relays: PARAMS and BATCH on to the children (radio), the REDUCE up the
    # tree; not HEALTH, which goes only when best effort finds silence.
    sends += [_message(spec, s.kind, 0, 0, cell, s.dst, 1, *_relay_values(spec, s.kind),
                       batch, s.train_only, own=True)
              for s in spec.relays[cell] if not s.occasional]
    # Every kind a node sends, from the protocol's table (meshdl/protocol/kinds.py):
    # whether this cell sends it in this plan's waves (HEALTH only when best effort
    # finds silence).
    planned = {m["kind"] for m in sends}
    kinds = [{**row.record(), "in_this_plan": row.kind.name in planned}
             for row in sent_by(Party.NODE)]
    return {"cell": name_of(cell), "mesh_id": spec.mesh_id, "batch": batch,
            "params_via": spec.params_via, "role": role, "receives": receives,
            "computes": computes, "sends": sends, "kinds": kinds}


def _message(spec: MeshSpec, kind: Kind, layer: int, phase: int, src: Cell, dst: Cell,
             items: int, per_sample: int, fixed: int, batch: int, train_only: bool,
             own: bool = False) -> dict[str, Any]:
    """One message of the plan: `own` for what the cell sends (the peer is `dst`)."""
    from meshdl.protocol.messages import ITEM_BYTES
    from meshdl.protocol.topics import name_of, topic

    values = per_sample * batch + fixed
    return {"kind": kind.name, "layer": layer, "phase": phase,
            "peer": name_of(dst if own else src), "topic": topic(spec.mesh_id, src, dst, kind),
            "items": items, "values_per_sample": per_sample,
            "bytes": spec.overhead(kind) + ITEM_BYTES * values, "train_only": train_only}


def _relay_values(spec: MeshSpec, kind: Kind) -> tuple[int, int]:
    """(per sample, fixed) values of a payload that carries no items."""
    from meshdl.protocol.messages import Kind
    from meshdl.protocol.payloads import BATCH_HEAD

    return {Kind.PARAMS: (0, spec.params_size), Kind.BATCH: (1, BATCH_HEAD),
            Kind.REDUCE: (0, spec.reduce_size)}[kind]


def _source(source: Hashable, global_pool: bool) -> str:
    """A task's input in words: a message of the plan, or what a computation makes."""
    from meshdl.protocol.messages import Kind
    from meshdl.protocol.spec import FieldKind
    from meshdl.protocol.topics import name_of

    if isinstance(source, tuple) and len(source) == 4 and isinstance(source[0], Kind):
        kind, layer, phase, src = source
        return f"{kind.name} layer {layer} phase {phase} from {name_of(src)}"
    field, item = source  # type: ignore[misc]
    what = " ".join(str(part) for part in field)
    if field[0] in (FieldKind.POOLED, FieldKind.DPOOLED) and not global_pool:
        # items: pooling blocks
        return f"{what} of block {tuple(item)}"
    if field[0] in (FieldKind.POOLED, FieldKind.DPOOLED, FieldKind.WINNER):
        return f"{what} of the subtree of {name_of(item)}"  # global pooling
    return f"{what} of {name_of(item)}"


def _parse_cell(text: str, spec: MeshSpec) -> Cell:
    """`r1c1` (as in topics) or `1,1` (as in --edge-at), inside the grid; else exit 2."""
    from meshdl.protocol.topics import cell_of

    try:
        if text.startswith("r"):
            cell = cell_of(text)
        else:
            row, col = (int(part) for part in text.split(","))  # not 2 parts: ValueError
            cell = (row, col)
    except ValueError:
        raise UsageError(f"--cell {text}: expected r<row>c<col> or R,C") from None
    if not spec.topology.inside(cell):
        raise UsageError(f"--cell {text}: not a cell of the {spec.model.rows} x "
                         f"{spec.model.cols} grid")
    return cell


def _print(report: dict[str, Any]) -> None:
    """The human form: the role in words, then receives, computes, sends (a wave's order)."""
    role = report["role"]
    leader = "this cell" if role["leads_its_block"] else role["pooling_leader"]
    pooling = "global pooling: the maxima of its subtree up to its parent" \
        if role["global_pooling"] else f"pooling block {tuple(role['pooling_block'])} " \
        f"({', '.join(role['pooling_cells'])}) led by {leader}"
    computes = Table(title="computes, in plan order (each runs once all it waits for is in)")
    for column in ("stage", "waits for", "training only"):
        computes.add_column(column)
    for c in report["computes"]:
        computes.add_row(c["stage"], "; ".join(c["waits_for"]),
                         "yes" if c["train_only"] else "")
    receives = _messages("receives", "from", report["receives"])
    sends = _messages("sends", "to", report["sends"])
    console = _console_for(receives, sends)
    # soft_wrap: the role stays one line, to grep for.
    console.print(
        f"cell {report['cell']} of mesh {report['mesh_id']} (batch {report['batch']}, "
        f"parameters {report['params_via']} from {role['control_from']}): tree parent "
        f"{role['parent']}, children {', '.join(role['children']) or 'none'}; "
        f"{pooling}{'; the edge is linked here (edge_at)' if role['linked_to_edge'] else ''}",
        highlight=False, soft_wrap=True)
    for table in (receives, computes, sends):
        console.print(table)
    # PARAMS and REDUCE weigh the same at any batch; BATCH is 2 values plus 1 per sample.
    console.print("values/sample 0: a fixed-size message (PARAMS, REDUCE); bytes include "
                  f"the header, at batch {report['batch']}", highlight=False, soft_wrap=True)
    console.print(_kinds(report["kinds"]))  # wrapped to the console: long sentences


def _kinds(rows: list[dict[str, Any]]) -> Table:
    """The protocol's rows of the kinds a node sends (PROTOCOL.md, "Message kinds")."""
    table = Table(title="message kinds a node sends (PROTOCOL.md)")
    for column in ("kind", "from -> to", "when", "payload", "class", "auth", "QoS",
                   "this cell"):
        table.add_column(column, no_wrap=column in ("kind", "class", "QoS"))
    for k in rows:
        route = f"{k['from']} -> {k['to']}" + (f" ({k['alternative']})"
                                               if k["alternative"] else "")
        payload = Text(k["payload"].replace("`", ""))  # plain: no Markdown, no markup
        table.add_row(k["kind"], route, f"{k['phase']}: {k['when']}", payload, k["class"],
                      k["auth"], str(k["qos"]), "yes" if k["in_this_plan"] else "")
    return table


def _messages(title: str, peer: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for column in ("kind", "layer", "phase", peer, "topic", "items", "values/sample",
                   "bytes", "training only"):
        table.add_column(column, no_wrap=True, justify="right" if column in (
            "items", "values/sample", "bytes") else "left")
    for m in rows:
        table.add_row(m["kind"], str(m["layer"]), str(m["phase"]), m["peer"], m["topic"],
                      str(m["items"]), str(m["values_per_sample"]), f"{m['bytes']:,}",
                      "yes" if m["train_only"] else "")
    return table


def _console_for(*tables: RenderableType) -> Console:
    """`out_console`, or a copy as wide as the widest table: a message table cut to the
    terminal (or to 80 columns in a pipe) would shorten topics and byte counts to "…",
    and a line the terminal wraps loses nothing."""
    probe = Console(width=10_000)
    need = max(Measurement.get(probe, probe.options, t).maximum for t in tables)
    if need <= out_console.width:
        return out_console
    return Console(file=out_console.file, width=need, color_system=out_console.color_system,
                   force_terminal=out_console.is_terminal)
