"""`meshdl report RUN_DIR`: a self-contained HTML report of a run directory
(meshdl/report/page.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from meshdl.cli.common import err_console


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory of meshdl "
                                   "experiment, train, simulate train or infer, edge run "
                                   "or ps run (finished or not)."),
    out: Path | None = typer.Option(None, "--out", help="The HTML file (default: "
                                    "RUN_DIR/report.html)."),
) -> None:
    """Write a self-contained HTML report (tables, plots, configuration, versions) that
    opens in a browser with no server; a simulated run's sets the mesh beside the
    cloud-heavy baseline and names its dead cells."""
    from meshdl.report.page import build_report

    page = build_report(run_dir)
    target = out or run_dir / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    err_console.print(f"wrote {target}", highlight=False)
