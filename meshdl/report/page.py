"""`meshdl report RUN_DIR`: one self-contained HTML page for a run directory, to open in a
browser with no server: every plot embedded as a data URI, nothing fetched.

It knows three kinds of run directory by what they hold:
- an experiment's (`summary.json` with "experiment"): its table, plots and trials;
- a training run's (`metrics.json`): the training curves (drawn here), the final
  accuracies and the communication table;
- a simulated run's (`sim.json` too): makespans, energy and the energy heat map.
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

from meshdl.errors import UsageError
from meshdl.report.plots import pyplot, save_png

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; display: block; margin: 1em 0; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
"""


def build_report(run_dir: Path) -> str:
    """The HTML page of `run_dir` (a `UsageError` if it is no run directory)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory")
    summary = _json(run_dir / "summary.json")
    metrics = _json(run_dir / "metrics.json")
    if summary is not None and "experiment" in summary:
        title, body = _experiment(run_dir, summary)
    elif metrics is not None:
        title, body = _training(run_dir, metrics)
    else:
        raise UsageError(f"{run_dir}: no summary.json or metrics.json: not a run "
                         "directory of meshdl experiment, train or simulate")
    config = _json(run_dir / "config.json")
    if config is not None:
        body.append(_section("Configuration", f"<pre>{_escape(json.dumps(config, indent=2))}"
                                              "</pre>"))
    body.append(_section("Software", _table(["package", "version"], _versions())))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{_escape(title)}</h1><p>{_escape(str(run_dir))}</p>"
            + "".join(body) + "</body></html>\n")


# ------------------------------------------------------------------ run kinds
def _experiment(run_dir: Path, summary: dict[str, Any]) -> tuple[str, list[str]]:
    name = summary["experiment"]
    rows = summary.get("rows", [])
    figures = [key for key in (rows[0] if rows else {}) if key not in ("value", "seeds")]
    table = _table(["value", "seeds", *figures],
                   ([row["value"], row["seeds"],
                     *(_mean_std(row.get(f)) for f in figures)] for row in rows))
    body = [_section(f"Summary ({summary.get('seeds', '?')} seeds each, mean ± std)",
                     f"<p>{_escape(str(summary.get('mode', '')))}</p>{table}")]
    paper = summary.get("paper")
    if paper:
        keys = ["value", *(k for k in paper[0] if k != "value")]
        body.append(_section("The source paper's figures (its own data)",
                             _table(keys, ([p[k] for k in keys] for p in paper))))
    body.append(_section("Plots", "".join(_image(p) for p in sorted(run_dir.glob("*.png")))))
    return f"meshdl experiment {name}", body


def _training(run_dir: Path, metrics: dict[str, Any]) -> tuple[str, list[str]]:
    body = []
    final = metrics.get("final") or {}
    if final:
        body.append(_section("Result", _table(
            ["figure", "value"], ([k, v] for k, v in final.items()
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
    sim = metrics.get("sim") or _json(run_dir / "sim.json")
    if sim:
        body.append(_section("Under simulated time", _table(["figure", "value"], [
            ["radio", sim.get("radio", {}).get("name")], ["medium", sim.get("medium")],
            ["device", sim.get("device")],
            ["makespan, total (s)", sim.get("makespan_s", {}).get("total")],
            ["energy, total (J)", sim.get("energy_j", {}).get("total")],
            ["energy, hottest node (J)", sim.get("energy_j", {}).get("max_node")]])))
        images = [p for p in (run_dir / "energy.png",) if p.is_file()]
        if images:
            body.append(_section("Energy per node", "".join(_image(p) for p in images)))
    kind = "simulate" if sim else "train"
    return f"meshdl {kind} run", body


def _curves(epochs: list[dict[str, Any]]) -> bytes:
    """Loss and accuracies by epoch, as a PNG."""
    plt = pyplot()
    xs = [e["epoch"] for e in epochs]
    figure, (loss, accuracy) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100)
    loss.plot(xs, [e["train_loss"] for e in epochs], marker="o")
    loss.set(xlabel="epoch", ylabel="training loss")
    for key, label in (("train_acc", "train"), ("test_acc", "test")):
        accuracy.plot(xs, [e[key] * 100 for e in epochs], marker="o", label=label)
    accuracy.set(xlabel="epoch", ylabel="accuracy (%)")
    accuracy.legend()
    buffer = io.BytesIO()
    save_png(figure, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------ pieces
def _json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None


def _section(title: str, content: str) -> str:
    return f"<h2>{_escape(title)}</h2>{content}"


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    head = "".join(f"<th>{_escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return (f'<div style="overflow-x: auto"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _mean_std(figure: dict[str, float] | None) -> str:
    return "" if figure is None else f"{figure['mean']:.6g} ± {figure['std']:.2g}"


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
