"""The `meshdl` command line: one typer app, one sub-app per topic.

Conventions every command keeps: progress and messages go to stderr (rich), `--json`
prints the machine-readable result alone on stdout, and a failure is one line
`error: ...` with exit code 1 (something failed) or 2 (the request itself is wrong).
`meshdl --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError
from rich.markup import escape

from meshdl import __version__
from meshdl.cli import (
    bench,
    broker,
    cost,
    data,
    deploy,
    experiment,
    model,
    mqtt_run,
    plan,
    radio,
    report,
    schedule,
    simulate,
    train,
)
from meshdl.cli.common import err_console
from meshdl.errors import MeshdlError, format_validation_error
from meshdl.mqtt.session import quiet_abandoned_clients

# A usage error (a mistyped option, a missing argument): typer's own click copy raises
# a typer.TyperException; a typer on top of click, a click.ClickException.
try:
    from click import ClickException as _ClickException
except ImportError:  # pragma: no cover - click is typer's own
    UsageFailure: tuple[type[Exception], ...] = (typer.TyperException,)
else:
    UsageFailure = (typer.TyperException, _ClickException)


def _help_shown(exc: Exception) -> bool:
    """`meshdl data`: typer has printed the group's help already (click >= 8.2); by
    name, as typer itself tells it (its class is not public)."""
    return type(exc).__name__ == "NoArgsIsHelpError"


app = typer.Typer(
    name="meshdl",
    help="Train and run a CNN inside a mesh of sensor nodes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(data.app, name="data")
app.add_typer(bench.app, name="bench")
app.add_typer(deploy.app, name="deploy")
app.add_typer(radio.app, name="radio")
app.add_typer(simulate.app, name="simulate")
app.add_typer(experiment.app, name="experiment")
train.register(app)
model.register(app)
cost.register(app)
plan.register(app)
report.register(app)
broker.register(app)
mqtt_run.register(app)
schedule.register(app)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"meshdl {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    _version: bool = typer.Option(False, "--version", callback=_print_version,
                                  is_eager=True, help="Print meshdl's version and exit."),
) -> None:
    """meshdl: distributed deep learning inside a sensor mesh."""


# Options whose value may be left out, and what they then mean (`--ray` alone: a local
# Ray cluster). Typer's parser has no optional values, so the default is written in.
_OPTIONAL_VALUES = {"--ray": "local"}


def _optional_values(args: list[str]) -> list[str]:
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg in _OPTIONAL_VALUES and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(_OPTIONAL_VALUES[arg])
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every expected failure into one line."""
    args = _optional_values(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if not debug:
        quiet_abandoned_clients()
    try:
        # Not standalone: usage errors come back here to be said in one line.
        code = app(args=args, prog_name="meshdl", standalone_mode=False)
        if isinstance(code, int) and code:  # a typer.Exit(code) comes back as its code
            sys.exit(code)
    except UsageFailure as exc:  # a mistyped option, a missing argument
        if _help_shown(exc):
            sys.exit(exc.exit_code)
        # The message repeats what the user typed: never rich markup.
        err_console.print(f"[bold red]error:[/] {escape(exc.format_message())} "
                          f"(see '{escape(_command_of(exc))} --help')", highlight=False,
                          soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if debug:
            raise
        message, exit_code = _one_line(exc)
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                          soft_wrap=True)
        sys.exit(exit_code)


def _command_of(exc: Exception) -> str:
    """The command a usage error is about, e.g. `meshdl train`."""
    ctx = getattr(exc, "ctx", None)
    return ctx.command_path if ctx is not None else "meshdl"


def _one_line(exc: Exception) -> tuple[str, int]:
    """The message and exit code for an exception a user may well cause."""
    if isinstance(exc, MeshdlError):
        return str(exc), exc.exit_code
    if isinstance(exc, ValidationError):
        return f"invalid configuration: {format_validation_error(exc)}", 2
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename or exc}", 1
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), 1
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 1
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", 1
