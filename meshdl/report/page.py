"""`meshdl report RUN_DIR`: one self-contained HTML page for a run directory, to open in a
browser with no server: every plot embedded as a data URI, nothing fetched.

It knows every run directory the CLI writes by what it holds:
- an experiment's (`summary.json` with "experiment"): its table, plots and trials; one
  stopped before its summary (`journal.jsonl`): the trials it has;
- a training run's (`metrics.json`: `meshdl train`, `simulate train`, `edge run`,
  `ps run`): the training curves (drawn here), the final accuracies, the
  communication table, the meshes of a data-parallel run and the dead cells found;
- a simulated run's (`sim.json`: `simulate train`, and `simulate infer`, which writes no
  metrics.json): makespans, energy, the cloud-heavy baseline next to the mesh (in the
  mesh, or in the cloud?), the faults and dead cells, and the energy heat map;
- a run that has not finished (`config.json` alone, perhaps a checkpoint): what it is
  and how to go on.
Each page also shows the configuration, the software versions and, when meshdl runs
from a git checkout, its commit.
"""

from __future__ import annotations

import base64
import html
import io
import json
import platform
import subprocess
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from meshdl.errors import MeshdlError
from meshdl.report.baseline import FIGURES, Costs, Strongest, cloud_costs, strongest, variants
from meshdl.report.live import lifetime_figure, mac_figure, parts_figure
from meshdl.report.maps import energy_figure
from meshdl.report.numbers import figure as number
from meshdl.report.numbers import given, places, plus_minus
from meshdl.report.plots import integer_ticks, pyplot, save_png
from meshdl.report.warnings import warnings

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; display: block; margin: 1em 0; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
.warning { background: #fff4d6; border-left: 0.4em solid #d97706; padding: 0.6em 1em;
           margin: 0.8em 0; }
"""


def build_report(run_dir: Path) -> str:
    """The HTML page of `run_dir`: MeshdlError (exit 1, as any missing or wrong file:
    a directory given as a model file says so with 1 too) if it is not there or names
    a file rather than a directory."""
    if not run_dir.exists():
        raise MeshdlError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise MeshdlError(f"{run_dir}: is a file, not a run directory")
    title, body = _page(run_dir)
    metrics = _json(run_dir / "metrics.json")
    sim = _json(run_dir / "sim.json") or (metrics or {}).get("sim")
    alerts = "".join(f'<p class="warning" role="alert"><strong>Warning:</strong> '
                     f"{_escape(text)}</p>" for text in warnings(run_dir, metrics, sim))
    config = _json(run_dir / "config.json")
    if config is not None:
        body.append(_section("Configuration", f"<pre>{_escape(json.dumps(config, indent=2))}"
                                              "</pre>"))
    body.append(_section("Software", _table(["package", "version"], _versions())))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{_escape(title)}</h1><p>{_escape(str(run_dir))}</p>{alerts}"
            + "".join(body) + "</body></html>\n")


# ------------------------------------------------------------------ run kinds
def _page(run_dir: Path) -> tuple[str, list[str]]:
    """The title and sections of `run_dir`, by the files it holds (module docstring)."""
    summary = _json(run_dir / "summary.json")
    if summary is not None and "experiment" in summary:
        return _experiment(run_dir, summary)
    metrics = _json(run_dir / "metrics.json")
    if metrics is not None:
        return _training(run_dir, metrics)
    sim = _json(run_dir / "sim.json")
    if sim is not None and "slots" in sim and "macs" in sim:
        return "meshdl simulate live", _live(sim, _json(run_dir / "config.json") or {})
    if sim is not None:
        return "meshdl simulate run", _simulated(run_dir, sim)
    if (run_dir / "journal.jsonl").is_file():
        return _stopped_experiment(run_dir)
    if (run_dir / "config.json").is_file():
        return _unfinished(run_dir)
    raise MeshdlError(f"{run_dir}: no summary.json, metrics.json, sim.json or config.json: "
                      "not a run directory of meshdl experiment, train, simulate, edge run "
                      "or ps run")


def _experiment(run_dir: Path, summary: dict[str, Any]) -> tuple[str, list[str]]:
    """An experiment's table, its plots, and (folded) every figure it has."""
    name = summary["experiment"]
    printed = summary.get("table")
    body = _printed(summary, printed) if printed else _raw_summary(summary)
    body.append(_section("Plots", "".join(_image(p) for p in sorted(run_dir.glob("*.png")))))
    return f"meshdl experiment {name}", body


def _printed(summary: dict[str, Any], printed: dict[str, Any]) -> list[str]:
    """The table as the console printed it (summary.json's "table": its titles, its
    order, `±` where it put one), then every figure of summary.json under its title
    ("columns"), folded: the console leaves some out for width. The titles come from
    the summary, not from meshdl.experiments, which the report layer may not import."""
    caption = "; ".join(str(t) for t in (printed.get("title"), summary.get("mode")) if t)
    body = [_section("Summary", _paragraph(caption)
                     + _table(printed["header"], printed["rows"]))]
    columns = summary.get("columns") or []
    rows = summary.get("rows") or []
    if columns and rows:
        every = _table(["value", "seeds", *(c["title"] for c in columns)],
                       ([_value(row.get("value")), row.get("seeds"),
                         *(_mean_std(_scaled(row.get(c["key"]), c["title"]),
                                     row.get("seeds", 1)) for c in columns)]
                        for row in rows))
        body.append(_section("Every figure", "<details><summary>summary.json's figures, "
                             "mean ± std over the seeds</summary>" + every + "</details>"))
    return body


def _scaled(figure: dict[str, float] | None, title: str) -> dict[str, float] | None:
    """A figure as its title says: a share (0.9712, kept so in summary.json) in percent
    under a title in % ("test %": 97.12), as the console's table shows it."""
    if figure is None or not title.endswith("%"):
        return figure
    return {k: 100.0 * v for k, v in figure.items() if k in ("mean", "std")}


def _value(value: Any) -> str:
    """A swept value: 0.1, r0c12's [0, 12] as "0, 12", [0.1, "zero"] as "0.1, zero"."""
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return given(value)  # set, not measured: as the sweep was asked
    return _cell(value)


def _raw_summary(summary: dict[str, Any]) -> list[str]:
    """A summary.json from before "table" and "columns": its figures by their keys, the
    headline ones first, and the source paper's figures."""
    rows = summary.get("rows", [])
    figures = sorted((key for key in (rows[0] if rows else {})
                      if key not in ("value", "seeds")), key=_leading)
    table = _table(["value", "seeds", *figures],
                   ([row["value"], row["seeds"],
                     *(_mean_std(row.get(f), row.get("seeds", 1)) for f in figures)]
                    for row in rows))
    seeds = summary.get("seeds", "?")
    how = "mean ± std" if not isinstance(seeds, int) or seeds > 1 else "one seed"
    body = [_section(f"Summary ({seeds} seeds each, {how})",
                     f"<p>{_escape(str(summary.get('mode', '')))}</p>{table}")]
    paper = summary.get("paper")
    if paper:
        keys = ["value", *(k for k in paper[0] if k != "value")]
        body.append(_section("The source paper's figures (its own data)",
                             _table(keys, ([p[k] for k in keys] for p in paper))))
    return body


# An experiment's headline figures, first in its table (the others in their order).
_LEADING = ("test_acc", "train_acc", "clean_test_acc")


def _leading(figure_name: str) -> int:
    return _LEADING.index(figure_name) if figure_name in _LEADING else len(_LEADING)


def _training(run_dir: Path, metrics: dict[str, Any]) -> tuple[str, list[str]]:
    body = []
    final = metrics.get("final") or {}
    if final:
        body.append(_section("Result", _table(
            ["figure", "value"], ([_RESULT.get(k, k), _result(k, v)] for k, v in final.items()
                                  if isinstance(v, (int, float, bool))))))
    epochs = metrics.get("epochs") or []
    if epochs:
        body.append(_section("Training curves", _png_tag(_curves(epochs))))
    comm = metrics.get("comm") or {}
    if comm.get("classes"):
        rows = ([name, c.get("values"), c.get("messages"), c.get("bytes")]
                for name, c in comm["classes"].items())
        body.append(_section("Communication per run", _table(
            ["class", "values", "messages", "bytes"], rows)))
    if comm.get("dead_cells"):  # an MQTT run's edge found them
        body.append(_section("Dead cells", _table(
            ["figure", "value"], [["planned around", ", ".join(comm["dead_cells"])]])))
    sim = metrics.get("sim") or _json(run_dir / "sim.json")
    if metrics.get("parallel") and not sim:  # sim.json shows its own, with the meshes
        body.append(_section("Several meshes", _table(
            ["figure", "value"], _flat(metrics["parallel"]))))
    if sim:
        body += _simulated(run_dir, sim)
    kind = "simulate" if sim else "train"
    return f"meshdl {kind} run", body


# metrics.json's final figures by what a reader calls them.
_RESULT = {"train_acc": "train accuracy (%)", "test_acc": "test accuracy (%)",
           "train_loss": "training loss",
           "single_class": "predicts one class for every sample (collapsed)"}


def _result(key: str, value: Any) -> Any:
    """A final figure as its title says: accuracies in percent."""
    if key.endswith("_acc") and isinstance(value, float):
        return 100.0 * value
    return value


def _simulated(run_dir: Path, sim: dict[str, Any]) -> list[str]:
    """What a run under simulated time took, against the cloud-heavy baseline, with
    its faults and (several meshes) its meshes."""
    span, energy = sim.get("makespan_s", {}), sim.get("energy_j", {})
    waves = sim.get("waves")
    rows = [["mode", f"{sim.get('mode')}, {waves} wave{'' if waves == 1 else 's'}"],
            ["radio", sim.get("radio", {}).get("name")], ["medium", sim.get("medium")],
            ["device", sim.get("device")],
            ["makespan, total (s)", span.get("total")],
            ["makespan, a wave (s): mean over the run's waves", span.get("per_wave_mean")],
            ["its forward pass, to the edge's result (s): mean", span.get("forward_mean")],
            ["energy, total (J)", energy.get("total")],
            ["energy, hottest node (J)", energy.get("max_node")],
            ["hottest node", energy.get("max_node_cell")]]
    if "first_mesh_waves" in span:
        rows.insert(5, ["makespan, the first mesh's waves (s)", span["first_mesh_waves"]])
    if "accuracy" in sim:
        rows.append(["accuracy of the waves", sim["accuracy"]])
    body = [_section("Under simulated time", _table(["figure", "value"], rows))]
    if sim.get("baseline"):
        body.append(_section("In the mesh, or in the cloud?", _against_cloud(sim)))
    faults = sim.get("faults") or {}
    if _faulty(faults):
        body.append(_section("Faults and dead cells", _table(
            ["figure", "value"], _fault_rows(faults))))
    if sim.get("meshes"):
        keys = ["mesh_id", "radio", "waves", "makespan_s", "energy_j", "frames", "bytes"]
        body.append(_section("Several meshes", _table(
            ["mesh", "radio", "waves", "makespan (s)", "energy (J)", "frames", "bytes"],
            ([m.get(k) for k in keys] for m in sim["meshes"]))
            + _table(["figure", "value"], _flat(sim.get("parallel") or {}))))
    body.append(_energy_map(run_dir, sim))
    return body


def _energy_map(run_dir: Path, sim: dict[str, Any]) -> str:
    """The energy map, drawn from sim.json (an energy.png of an older meshdl may have
    its colours from 0 J: one uniform field); energy.png where sim.json cannot draw it
    (no per-node figures, no grid in config.json)."""
    model = (_json(run_dir / "config.json") or {}).get("model") or {}
    per_node = (sim.get("energy_j") or {}).get("per_node")
    if per_node and model.get("rows") and model.get("cols") and sim.get("radio"):
        drawn = _png(energy_figure(sim, model["rows"], model["cols"]))
        return _section("Energy per node", _png_tag(drawn, "energy per node"))
    images = [p for p in (run_dir / "energy.png",) if p.is_file()]
    return _section("Energy per node", "".join(_image(p) for p in images)) if images else ""


LIVE_FIGURES = (("bytes on air a slot", "bytes_per_slot"),
                ("frames a slot", "frames_per_slot"),
                ("hottest node, J a slot", "hottest_node_j_per_slot"),
                ("hottest node", "hottest_cell"),
                ("first death (years)", "first_death_years"),
                ("first to die", "first_cell"),
                ("median node (years)", "median_years"))


def _live(sim: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """A live run (`simulate live`): its slots, its pictures (each node's lifetime, the
    hottest node's joules by part, the mesh against the cloud by MAC), then the mesh
    against the cloud-heavy baseline under the run's MAC and under every other MAC the
    radio has."""
    alerts = sim.get("alerts", {})
    mesh = sim.get("mesh", {})
    model = config.get("model") or {}
    rows, cols = model.get("rows"), model.get("cols")
    trained = (sim.get("model") or {}).get("trained")
    rows_table = [
        ["grid", f"{rows} x {cols} nodes" if rows and cols else "?"],
        ["model", {True: f"trained ({(sim.get('model') or {}).get('file')})",
                   False: "fresh, never trained (no --model)"}.get(trained, "not recorded")],
        ["slots", f"{sim.get('slots')} of {given(sim.get('slot_seconds') or 0)} s, from "
                  f"{sim.get('first_slot')}"],
        ["radio", f"{sim.get('radio', {}).get('name')} ({sim.get('medium')}), "
                  f"{sim.get('device')} nodes, {sim.get('header_bytes')}-byte headers"],
        ["MAC", sim.get("mac")], ["battery", sim.get("battery", {}).get("name")],
        ["delta", sim.get("delta") if sim.get("delta") is not None else "off"],
        ["alerts equal central inference", sim.get("alerts_equal_central")],
        ["alerts differing (mesh, cloud)",
         f"{alerts.get('mesh_differ_from_central')}, "
         f"{alerts.get('cloud_differ_from_central')}"],
        ["parameter bytes after the first slot", mesh.get("params_bytes")],
        ["first slot (parameters sent), bytes", mesh.get("install_bytes")]]
    body = [_section("Live inference", _table(["figure", "value"], rows_table))]
    pictures = []
    if sim.get("nodes") and rows and cols:
        edge = config.get("mesh", {}).get("edge_at")
        pictures.append(_png_tag(_png(lifetime_figure(
            sim, rows, cols, f"r{edge[0]}c{edge[1]}" if edge else None)), "lifetime map"))
    if sim.get("nodes"):
        pictures.append(_png_tag(_png(parts_figure(sim)), "hottest node's joules by part"))
    if sim.get("macs"):
        pictures.append(_png_tag(_png(mac_figure(sim)), "mesh against cloud by MAC"))
    if pictures:
        body.append(_section("Where the batteries die, and why", "".join(pictures)))
    for mac, sides in (sim.get("macs") or {}).items():
        table = _table(["", "in the mesh", "cloud-heavy"],
                       ([label, _live_cell(key, sides["mesh"].get(key)),
                         _live_cell(key, sides["cloud"].get(key))]
                        for label, key in LIVE_FIGURES))
        chosen = " (the run's)" if mac == sim.get("mac") else ""
        body.append(_section(f"In the mesh, or in the cloud? MAC {mac}{chosen}", table))
    return body


def _live_cell(key: str, value: Any) -> Any:
    """Bytes and frames a slot are counts (a mean over identical slots): whole."""
    if key in ("bytes_per_slot", "frames_per_slot") and isinstance(value, float):
        return places(value, 0)
    return value


def _against_cloud(sim: dict[str, Any]) -> str:
    """The mesh next to each cloud-heavy variant on the same radio (every reading
    shipped to the edge, which computes everything), and a sentence of the answer against
    the strongest variant (meshdl/report/baseline.py)."""
    energy, span = sim.get("energy_j", {}), sim.get("makespan_s", {})
    # Several meshes: the baseline ships and trains the first mesh's steps, whose
    # waves, energy and bytes the mesh's figures are.
    mesh = Costs(span.get("first_mesh_waves", span.get("total")), energy.get("total"),
                 energy.get("max_node"), sum((sim.get("bytes") or {}).values()))
    ideal = (energy.get("ideal_mac") or {}).get("total")
    rows = [["in the mesh", mesh.time, mesh.energy, mesh.hottest, ideal, mesh.bytes]]
    best = strongest(sim["baseline"])
    for variant, cloud in variants(sim["baseline"]).items():
        costs = cloud_costs(cloud)
        mark = " (the strongest)" if best and variant == best.variant else ""
        rows.append([f"cloud-heavy, {variant}{mark}", costs.time, costs.energy,
                     costs.hottest, ((cloud.get("energy_j") or {}).get("ideal_mac") or {})
                     .get("total"), costs.bytes])
    table = _table(["", "makespan (s)", "energy (J)", "hottest node (J)",
                    "energy, ideal MAC (J)", "bytes"], rows)
    if best:
        against = sim["baseline"][f"cloud_heavy_{best.variant}"]
        return f"<p>{_escape(_verdict(mesh, against, best))}</p>{table}"
    main = sim["baseline"].get("cloud_heavy")  # an old sim.json: one variant, unnamed
    return f"<p>{_escape(_verdict(mesh, main, None))}</p>{table}" if main else table


def _verdict(mesh: Costs, cloud: dict[str, Any], best: Strongest | None) -> str:
    """"The mesh takes 5.7 times the time ..." against the strongest cloud-heavy variant,
    named, with why it is the strongest."""
    theirs = cloud_costs(cloud)
    pairs = list(zip(FIGURES, mesh, theirs, strict=True))
    said = [f"{number(ours / other, 3)} times the {what}" for what, ours, other in pairs
            if ours is not None and other]
    cheaper = [what for what, ours, other in pairs
               if ours is not None and other is not None and ours < other]
    variant = cloud.get("variant")
    if best and best.of > 1:
        why = (f"the strongest of the {best.of} variants below, the cheapest in "
               f"{_listed(best.cheapest_in) or 'none of the figures'}")
        which = f"the strongest cloud-heavy baseline, {variant} ({why})"
    else:
        which = f"the cloud-heavy baseline, {variant}"
    return (f"Against {which}: every reading shipped to the edge, which computes "
            f"everything. The mesh takes {', '.join(said)}; it is cheaper in "
            f"{_listed(cheaper) or 'none of them'}.")


def _listed(items: Iterable[str]) -> str:
    """"a, b and c"."""
    items = list(items)
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else \
        "".join(items)


def _faulty(faults: dict[str, Any]) -> bool:
    """Whether a run's faults are worth a section: anything lost, down or slow."""
    return bool(faults.get("recovery") == "best-effort" or faults.get("lost")
                or faults.get("down_cells") or faults.get("dead_cells")
                or faults.get("stragglers"))


def _fault_rows(faults: dict[str, Any]) -> list[list[Any]]:
    down, found = faults.get("down_cells", []), faults.get("dead_cells", [])
    rows = [["recovery", faults.get("recovery")], ["policy", faults.get("policy")],
            ["dead cells (down at the end)", ", ".join(down) or "none"],
            ["found and planned around", ", ".join(found) or "none"],
            ["not found by the end", ", ".join(c for c in down if c not in found) or "none"],
            ["cut off", ", ".join(faults.get("cut_off_cells", [])) or "none"],
            ["edge attached at", faults.get("edge_at")]]
    for key, label in (("absent_filled", "values of absent cells filled in"),
                       ("substituted", "messages filled in at deadlines"),
                       ("skipped_steps", "steps skipped"), ("lost", "frames lost"),
                       ("messages_lost", "messages given up")):
        rows.append([label, faults.get(key)])
    if faults.get("stragglers"):
        rows.append(["stragglers", f"{', '.join(faults['stragglers'])} (x "
                                   f"{faults.get('straggler_slowdown')})"])
    return rows


def _flat(record: dict[str, Any]) -> list[list[Any]]:
    """A record's figures one level deep ("staleness max"), lists and long texts left
    out: the table of a data-parallel run's "parallel"."""
    rows = []
    for key, value in record.items():
        if isinstance(value, dict):
            rows += [[f"{key} {k}", v] for k, v in value.items()
                     if isinstance(v, (int, float, bool)) or
                     (isinstance(v, str) and len(v) < 40)]
        elif isinstance(value, (int, float, bool, str)):
            rows.append([key, value])
    return rows


def _curves(epochs: list[dict[str, Any]]) -> bytes:
    """Loss and accuracies by epoch, as a PNG."""
    return _png(curves_figure(epochs))


def _png(figure: Any) -> bytes:
    """`figure` as PNG bytes, saved readable at the report's width."""
    buffer = io.BytesIO()
    save_png(figure, buffer)
    return buffer.getvalue()


def curves_figure(epochs: list[dict[str, Any]]) -> Any:
    """Loss and accuracies by epoch, on whole epochs (a figure a run's epochs lack,
    a parameter server's test accuracy before its first evaluation, is left out)."""
    plt = pyplot()
    figure, (loss, accuracy) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100)
    _series(loss, epochs, "train_loss", None)
    loss.set(xlabel="epoch", ylabel="training loss")
    for key, label in (("train_acc", "train"), ("test_acc", "test")):
        _series(accuracy, epochs, key, label, scale=100)
    accuracy.set(xlabel="epoch", ylabel="accuracy (%)")
    accuracy.legend()
    for panel in (loss, accuracy):
        integer_ticks(panel.xaxis)
        if len(epochs) < 3:  # one or two points: the locator's ticks were 0.945, 0.96
            panel.set_xticks([e["epoch"] for e in epochs])
    return figure


def _series(axes: Any, epochs: list[dict[str, Any]], key: str, label: str | None,
            scale: float = 1.0) -> None:
    points = [(e["epoch"], e[key] * scale) for e in epochs if e.get(key) is not None]
    if points:
        axes.plot(*zip(*points, strict=True), marker="o", label=label)


def _stopped_experiment(run_dir: Path) -> tuple[str, list[str]]:
    """An experiment stopped before its summary: how many trials it journaled."""
    lines = (run_dir / "journal.jsonl").read_text(encoding="utf-8").splitlines()
    done = sum(1 for line in lines if line.strip().endswith("}"))
    return "meshdl experiment (stopped)", [_section("Not finished", _paragraph(
        f"The experiment stopped before its summary: {done} trials are in its "
        "journal.jsonl. Run the same command with the same --out to go on; it takes "
        "the journaled trials as they are."))]


def _unfinished(run_dir: Path) -> tuple[str, list[str]]:
    """A run directory whose run has not finished (or is still running)."""
    checkpoint = (run_dir / "checkpoint.npz").is_file()
    text = ("The run has not finished: there is no metrics.json yet. "
            + (f"Its last epoch's checkpoint is here: go on with the command that "
               f"started it and --resume {run_dir}."
               if checkpoint else "It left no checkpoint (no epoch finished)."))
    return "meshdl run (not finished)", [_section("Not finished", _paragraph(text))]


# ------------------------------------------------------------------ pieces
def _json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        # (RecursionError: nested deeper than the parser goes, the file's fault too)
        raise MeshdlError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from None


def _section(title: str, content: str) -> str:
    return f"<h2>{_escape(title)}</h2>{content}"


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    head = "".join(f"<th>{_escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return (f'<div style="overflow-x: auto"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _paragraph(text: str) -> str:
    return f"<p>{_escape(text)}</p>"


def _cell(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value)
    return "" if value is None else str(value)


def _mean_std(figure: dict[str, float] | None, seeds: int = 2) -> str:
    """Mean ± standard deviation; the mean alone from one seed or seeds that agree
    (their ± 0 says nothing)."""
    if figure is None:
        return ""
    std = figure.get("std") if seeds >= 2 else None
    return plus_minus(number(figure["mean"]), std or None)


def _image(path: Path) -> str:
    return f"<figure>{_png_tag(path.read_bytes(), path.name)}<figcaption>" \
           f"{_escape(path.name)}</figcaption></figure>"


def _png_tag(png: bytes, alt: str = "plot") -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_escape(alt)}" src="data:image/png;base64,{data}">'


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _versions() -> list[list[str]]:
    rows = [["python", platform.python_version()]]
    for package in ("meshdl", "numpy", "numba", "matplotlib", "pydantic"):
        try:
            rows.append([package, version(package)])
        except PackageNotFoundError:
            rows.append([package, "not installed"])
    commit = _git_commit()
    if commit:
        rows.append(["meshdl git commit", commit])
    return rows


def _git_commit() -> str | None:
    """The commit of the checkout meshdl runs from, if it runs from one."""
    source = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else None
