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

from meshdl.cli import bench, broker, cost, data, deploy, model, mqtt_run, train
from meshdl.cli.common import err_console, format_validation_error
from meshdl.errors import MeshdlError

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException, NoArgsIsHelpError

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
train.register(app)
model.register(app)
cost.register(app)
broker.register(app)
mqtt_run.register(app)


@app.callback()
def _global(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    """meshdl: distributed deep learning inside a sensor mesh."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every expected failure into one line."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # Not standalone: usage errors come back here to be said in one line.
        code = app(args=args, prog_name="meshdl", standalone_mode=False)
        if isinstance(code, int) and code:  # an explicit exit, such as --help's (0)
            sys.exit(code)
    except NoArgsIsHelpError as exc:  # `meshdl data`: the group's help, as asked
        exc.show()
        sys.exit(exc.exit_code)
    except ClickException as exc:  # a mistyped option, a missing argument
        err_console.print(f"[bold red]error:[/] {exc.format_message()} "
                          f"(see '{_command_of(exc)} --help')", highlight=False,
                          soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if debug:
            raise
        message, exit_code = _one_line(exc)
        err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
        sys.exit(exit_code)


def _command_of(exc: ClickException) -> str:
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
