"""The `meshdl` command line: one typer app, one sub-app per topic.

Conventions every command keeps: progress and messages go to stderr (rich), `--json`
prints the machine-readable result alone on stdout, and a failure is one line
`error: ...` with exit code 1 (something failed) or 2 (the request itself is wrong).
`meshdl --debug ...` shows the traceback instead.

The command modules load Numba, numpy and the protocol, about a second: they are
imported when the app is built, not with this package, so `meshdl --version` answers
before any of them loads (`meshdl.cli.train` and the others still work as attributes,
PEP 562).
"""

from __future__ import annotations

import importlib
import os
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from meshdl import __version__

if TYPE_CHECKING:
    import typer

# The command modules, in no particular order: each registers its commands on the app.
COMMAND_MODULES = ("bench", "broker", "cost", "data", "deploy", "experiment", "model",
                   "mqtt_run", "plan", "radio", "report", "schedule", "simulate", "train")
HELP_OPTIONS = ["-h", "--help"]


def __getattr__(name: str) -> Any:
    """`meshdl.cli.app` (built on first use) and the command modules, imported when
    first asked for."""
    if name == "app":
        return build_app()
    if name in COMMAND_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _help_shown(exc: Exception) -> bool:
    """`meshdl data`: typer has printed the group's help already (click >= 8.2); by
    name, as typer itself tells it (its class is not public)."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def _print_version(asked: bool) -> None:
    import typer

    if asked:
        typer.echo(f"meshdl {__version__}")
        raise typer.Exit()


@cache
def build_app() -> typer.Typer:
    """The app with every command registered (imports every command module)."""
    import typer

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

    app = typer.Typer(
        name="meshdl",
        help="Train and run a CNN inside a mesh of sensor nodes.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        # Inherited by every sub-command's context: `meshdl train -h` too.
        context_settings={"help_option_names": HELP_OPTIONS},
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

    @app.callback()
    def _global(
        debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
        _version: bool = typer.Option(False, "--version", callback=_print_version,
                                      is_eager=True, help="Print meshdl's version and exit."),
    ) -> None:
        """meshdl: distributed deep learning inside a sensor mesh."""

    return app


@cache
def command() -> Any:
    """The click command of the app, its help made readable (`tidy_help`); built once
    (the commands' functions are looked up when they run, so patching a module's names
    still takes effect)."""
    import typer.main

    root = typer.main.get_command(build_app())
    tidy_help(root)
    return root


# ------------------------------------------------------------------------- help
HELP_WIDTH_OFF_TERMINAL = 120  # the widest option row of any command fits whole


def set_help_width(args: list[str]) -> None:
    """Help read off any terminal (a log, a captured subprocess): rich would draw it 80
    columns wide and cut long option names and defaults short with an ellipsis
    ("--straggler-slowd…", "runs/<timestamp>-simu…"); drawn `HELP_WIDTH_OFF_TERMINAL`
    wide, none is cut. Where a standard stream is a terminal (help piped to a pager),
    rich reads its width, as it reads a COLUMNS the user set; typer's own TERMINAL_WIDTH
    wins over all. Only where help may be shown (a help option, or a group alone):
    typer's help module costs every other command 30 ms to load. Set on every call: a
    process may run several."""
    if not any(arg in HELP_OPTIONS for arg in args) and \
            sum(not arg.startswith("-") for arg in args) > 1:
        return
    try:
        import typer.rich_utils
    except ValueError:  # typer reads TERMINAL_WIDTH as a number: it fails as it would
        return
    asked = os.environ.get("TERMINAL_WIDTH", "")
    if asked.isdigit():
        typer.rich_utils.MAX_WIDTH = int(asked)
    elif os.environ.get("COLUMNS") or any(_is_terminal(stream) for stream in
                                           (sys.stdin, sys.stdout, sys.stderr)):
        typer.rich_utils.MAX_WIDTH = None  # rich reads them
    else:
        typer.rich_utils.MAX_WIDTH = HELP_WIDTH_OFF_TERMINAL


def _is_terminal(stream: Any) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # a closed stream
        return False


def tidy_help(cmd: Any) -> None:
    """Help as a reader expects it, for every command below `cmd`, whoever declared it:
    - a flag shows no value type (typer's panel prints `<bool>` for `--json`);
    - an option of a few values shows them, `[mesh|central]`, not `<str>`;
    - help texts are plain text: rich would take `[default: x]` or `[model]` for markup
      and drop it ("Mosquitto config file ."), so brackets are escaped (texts already
      escaped for rich, `\\[\\[radio]]`, are read as they render);
    - a command's line in its group's list is its docstring's first paragraph on one
      line (typer keeps the docstring's line breaks there: "that / opens")."""
    # The help option is made when a context first asks for it (its names are the
    # context's): made here, with the names every context inherits, to tidy it too.
    help_option = cmd.get_help_option(_HelpNames())
    for param in [*cmd.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "help", None):
            param.help = _plain_markup(param.help)
        if param.metavar is None:
            param.metavar = _metavar(param)
    if cmd.help:
        cmd.help = _plain_markup(cmd.help)
    for sub in getattr(cmd, "commands", {}).values():
        tidy_help(sub)
        if sub.short_help is None and sub.help:  # (escaped by now)
            sub.short_help = " ".join(sub.help.split("\n\n")[0].split())


class _HelpNames:
    """What `Command.get_help_option` reads of a context: the help option's names."""

    help_option_names = HELP_OPTIONS


def _plain_markup(text: str) -> str:
    """`text`, meant as plain text, as rich markup that renders to it."""
    from rich.markup import escape

    return escape(text.replace("\\[", "["))


def _metavar(param: Any) -> str | None:
    """An option's: '' for a flag (nothing to show), '[a|b]' for a choice, else None
    (typer's own). An argument's metavar is its name in the usage line: left alone."""
    if getattr(param, "param_type_name", None) != "option":
        return None
    if getattr(param, "is_flag", False) and not getattr(param, "count", False):
        return ""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None and descriptor.is_choice and not descriptor.is_list \
            and descriptor.choices:
        return "[" + "|".join(str(c) for c in descriptor.choices) + "]"
    return None


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


def _asks_version(args: list[str]) -> bool:
    """`meshdl [--debug] --version`: a global option, before any command's name."""
    for arg in args:
        if arg == "--version":
            return True
        if not arg.startswith("-"):
            return False
    return False


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every expected failure into one line."""
    args = _optional_values(sys.argv[1:] if argv is None else argv)
    if _asks_version(args):  # before any command module is imported
        sys.stdout.write(f"meshdl {__version__}\n")
        return
    from rich.markup import escape

    from meshdl.cli.common import err_console
    from meshdl.mqtt.quiet import quiet_abandoned_clients

    set_help_width(args)
    debug = "--debug" in args
    if not debug:
        quiet_abandoned_clients()
    try:
        # Not standalone: usage errors come back here to be said in one line.
        code = command().main(args=args, prog_name="meshdl", standalone_mode=False)
        if isinstance(code, int) and code:  # a typer.Exit(code) comes back as its code
            sys.exit(code)
    except _usage_failures() as exc:  # a mistyped option, a missing argument
        if _help_shown(exc):
            sys.exit(exc.exit_code)
        # The message repeats what the user typed: never rich markup.
        # (A value typer checks through pydantic comes prefixed "Value error, ".)
        message = exc.format_message().replace("Value error, ", "")
        err_console.print(f"[bold red]error:[/] {escape(message)} "
                          f"(see '{escape(_command_of(exc))} --help')", highlight=False,
                          soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if debug:
            raise
        message, exit_code = _one_line(exc, service=_is_service(args))
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                          soft_wrap=True)
        sys.exit(exit_code)


def _usage_failures() -> tuple[type[Exception], ...]:
    """A usage error (a mistyped option, a missing argument): typer's own click copy
    raises a typer.TyperException; a typer on top of click, a click.ClickException."""
    import typer

    try:
        from click import ClickException
    except ImportError:  # pragma: no cover - click is typer's own
        return (typer.TyperException,)
    return (typer.TyperException, ClickException)


def _command_of(exc: Exception) -> str:
    """The command a usage error is about, e.g. `meshdl train`."""
    ctx = getattr(exc, "ctx", None)
    return ctx.command_path if ctx is not None else "meshdl"


# The long-running commands deploy/systemd/ runs: their units restart them on any exit
# but 2 (RestartPreventExitStatus=2, "the request itself is wrong").
SERVICES = frozenset({("node", "run"), ("nodes", "run"), ("edge", "serve")})


def _is_service(args: list[str]) -> bool:
    """Whether the command line runs one of the `SERVICES` (global options skipped)."""
    words = [a for a in args if not a.startswith("-")][:2]
    return tuple(words) in SERVICES


def _one_line(exc: Exception, service: bool = False) -> tuple[str, int]:
    """The message and exit code for an exception a user may well cause (`service`: the
    command is a long-running service, which a shortage met while running must not
    stop for good)."""
    from pydantic import ValidationError

    from meshdl.errors import MeshdlError, format_validation_error

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
    # Both come from the size of what was asked, not from a fault of meshdl's: numpy's
    # "Unable to allocate 12.2 TiB for an array with shape (100100, 4096, 4096)" for
    # `data generate --train 100000` on the largest grid; a recursion as deep as the
    # mesh's tree (`simulate compare --rows 3000 --cols 3000`) or a file's nesting (a
    # TOML array nested 100,000 deep). So a usage line, exit code 2.
    if service and isinstance(exc, (MemoryError, RecursionError)):
        # Met while serving (a Pi short of memory under a flood), not asked for: exit 1,
        # so that systemd starts the service again.
        return (f"{'out of memory' if isinstance(exc, MemoryError) else 'recursion too deep'}"
                f" while running ({exc or type(exc).__name__}); a service manager starts it "
                "again"), 1
    if isinstance(exc, MemoryError):
        return (f"not enough memory for this request ({exc or 'out of memory'}): ask for a "
                "smaller grid, batch or data set"), 2
    if isinstance(exc, RecursionError):
        return ("the request is too large or too deeply nested to handle (maximum recursion "
                "depth exceeded: a grid hundreds of hops across, a file nested thousands "
                "deep): ask for a smaller grid or a flatter file"), 2
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", 1
