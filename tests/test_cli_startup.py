"""`meshdl --help` starts at once (issue 33, item 9): building the app and rendering any
command's help loads neither Numba nor the protocol, the simulator, the nodes, the edge
or the training loop; each command loads them when it runs. The values --help shows
that those modules define are written in the command modules: checked here to be theirs.
(Speed itself is measured, not asserted: see tests/test_suite_rules.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import pytest

from tests.helpers import assert_one_line_error

# What a command loads when it runs, never for --help (the protocol's modules load Numba).
HEAVY = ("numba", "meshdl.protocol", "meshdl.sim", "meshdl.nodes", "meshdl.edge",
         "meshdl.training")
# Helps rendered in the probes: the app's, and the commands the issue timed.
HELPS = ([], ["train"], ["simulate", "train"], ["experiment", "meshes"],
         ["deploy", "credentials"], ["plan"], ["node", "run"], ["cost"], ["schedule"],
         ["bench", "kernels"])
_LOADED = ("print(json.dumps(sorted(m for m in sys.modules if any(m == h or "
           "m.startswith(h + '.') for h in HEAVY))))")


def _probe(body: str) -> list[str]:
    """The heavy modules loaded after `body` ran in a fresh interpreter."""
    code = (f"import contextlib, io, json, sys\nHEAVY = {HEAVY!r}\nHELPS = {HELPS!r}\n"
            f"{body}\n{_LOADED}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_building_the_app_and_rendering_every_help_loads_no_numba_nor_engines() -> None:
    loaded = _probe(
        "import meshdl.cli\n"
        "meshdl.cli.build_app()\n"
        "for args in HELPS:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        meshdl.cli.command().main(args=[*args, '--help'], prog_name='meshdl',\n"
        "                                  standalone_mode=False)")
    assert loaded == []


def test_meshdl_help_loads_no_numba_nor_engines() -> None:
    """The entry point's own path (`meshdl.cli.main`), as a user runs it."""
    loaded = _probe(
        "from meshdl.cli import main\n"
        "for args in HELPS:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), "
        "contextlib.suppress(SystemExit):\n"
        "        main([*args, '--help'])")
    assert loaded == []


# ----------------------------------------------------- the values help shows are theirs
def _choices(module: typing.Any, function: str, parameter: str) -> tuple[str, ...]:
    """The values of a command parameter declared `Literal[...]` (or `... | None`)."""
    hint = typing.get_type_hints(getattr(module, function), include_extras=True)[parameter]
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    literal = next(arg for arg in (*typing.get_args(hint), hint)
                   if typing.get_origin(arg) is typing.Literal)
    return typing.get_args(literal)


def test_the_simulators_values_in_help_are_the_simulators_own() -> None:
    from meshdl.cli import options, schedule, simulate
    from meshdl.config import MeshConfig
    from meshdl.protocol.deadlines import DEFAULT_K, Policy
    from meshdl.sim.radio import media
    from meshdl.sim.radio.backhaul import builtin_backhauls
    from meshdl.sim.radio.device import builtin_devices
    from meshdl.sim.studies.planner import MAX_ERROR

    assert simulate.PATIENCE == DEFAULT_K
    assert set(typing.get_args(simulate.DeviceName)) == set(builtin_devices())
    assert typing.get_args(simulate.MediumName) == typing.get_args(media.MediumName)
    assert typing.get_args(simulate.PolicyName) == tuple(Policy)
    assert set(typing.get_args(simulate.RecoveryName)) == set(typing.get_args(
        MeshConfig.model_fields["recovery"].annotation))
    assert set(typing.get_args(options.BackhaulName)) == set(builtin_backhauls())
    assert schedule.MAX_ERROR == MAX_ERROR


def test_the_experiments_defaults_in_help_are_the_experiments_own() -> None:
    from meshdl.cli import experiment as cli
    from meshdl.experiments import compression, delta, edge_vs_cloud, faults, meshes, sweep

    shown = {row.name: (f"model.{row.setting}", row.default) for row in cli.TRAINING_SWEEPS}
    assert shown == {name: (sweep.SWEEPS[name].setting, sweep.SWEEPS[name].default)
                     for name in shown}
    pairs = {"GRID_SIDES": sweep.SWEEPS["grid"].default,
             "EDGE_CELLS": sweep.SWEEPS["edge-position"].default,
             "RADIOS": edge_vs_cloud.RADIOS, "LOSS_RATES": faults.SWEEPS["loss"].default,
             "DEAD_SHARES": faults.SWEEPS["failures"].default, "FILL_INS": faults.POLICIES,
             "MESH_COUNTS": meshes.COUNTS, "SYNC_MODES": meshes.MODES,
             "MESH_BATCH": meshes.DEFAULT_BATCH, "COMPRESSIONS": compression.POLICIES,
             "EPSILONS": delta.EPSILONS}
    assert {name: getattr(cli, name) for name in pairs} == pairs


def test_the_training_choices_are_the_configurations_own() -> None:
    from meshdl.cli import train
    from meshdl.config import RunConfig, TrainConfig

    for parameter, field in (("mode", RunConfig.model_fields["mode"]),
                             ("augment", TrainConfig.model_fields["augment"])):
        assert set(_choices(train, "train", parameter)) == set(typing.get_args(
            field.annotation))


# --------------------------------------------------------------- a value not among them
@pytest.mark.parametrize("args", [
    ("train", "--transport", "pigeon"), ("train", "--augment", "rotate"),
    ("simulate", "infer", "--device", "pi5"), ("simulate", "train", "--medium", "mesh"),
    ("plan", "--cell", "r0c0", "--transport", "wire"),
    ("experiment", "meshes", "--backhaul", "5g"), ("bench", "recipe", "--mode", "edge"),
    ("schedule", "--backhaul", "5g")])
def test_a_value_not_among_the_choices_is_a_one_line_usage_error(cli, args) -> None:
    code, out, err = cli(*args)
    assert_one_line_error(code, err, 2, args[-2], repr(args[-1]))
    assert out == ""
    assert "Value error" not in err  # pydantic's prefix, not a word for the user


def test_no_help_read_off_a_terminal_cuts_an_option_or_a_default_short() -> None:
    """Piped into a pager or a log, rich would draw help 80 columns wide and cut long
    option names and defaults with an ellipsis ("--straggler-slowd…"): every command's
    help, as `meshdl` renders it with stdout not a terminal, shows each whole."""
    code = (
        "import contextlib, io, json\n"
        "from meshdl.cli import command, main\n"
        "def paths(cmd, prefix):\n"
        "    yield prefix\n"
        "    for name, sub in getattr(cmd, 'commands', {}).items():\n"
        "        yield from paths(sub, [*prefix, name])\n"
        "cut = {}\n"
        "for args in paths(command(), []):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main([*args, '--help'])\n"
        "    assert 'Usage: meshdl' in out.getvalue(), args\n"
        "    cut[' '.join(args)] = [line.strip() for line in out.getvalue().splitlines()\n"
        "                           if '\u2026' in line]\n"
        "print(json.dumps(cut))")
    env = {key: value for key, value in os.environ.items()
           if key not in ("TERMINAL_WIDTH", "COLUMNS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    cut = json.loads(done.stdout.splitlines()[-1])
    assert len(cut) > 40  # every command of every group was rendered
    assert {args: lines for args, lines in cut.items() if lines} == {}


def test_help_keeps_a_terminals_width_or_the_one_asked_for(monkeypatch) -> None:
    """Off every terminal help is drawn 120 wide; piped to a pager from a terminal, rich
    reads the terminal's width; COLUMNS and typer's TERMINAL_WIDTH win; a command that
    shows no help leaves the width alone."""
    import typer.rich_utils

    from meshdl import cli

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)  # restored after the test
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: False)
    cli.set_help_width(["train", "--help"])
    assert typer.rich_utils.MAX_WIDTH == cli.HELP_WIDTH_OFF_TERMINAL
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: stream is sys.stderr)
    cli.set_help_width(["train", "--help"])
    assert typer.rich_utils.MAX_WIDTH is None  # `meshdl train --help | less`
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: False)
    monkeypatch.setenv("COLUMNS", "200")
    cli.set_help_width(["--help"])
    assert typer.rich_utils.MAX_WIDTH is None
    monkeypatch.setenv("TERMINAL_WIDTH", "90")
    cli.set_help_width(["--help"])
    assert typer.rich_utils.MAX_WIDTH == 90
    typer.rich_utils.MAX_WIDTH = 7
    cli.set_help_width(["train", "--epochs", "3"])
    assert typer.rich_utils.MAX_WIDTH == 7
