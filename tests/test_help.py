"""Help reads as a user of typer/rich CLIs expects (issue 33, item 9): flags show no value
type, an option of a few values shows them, every help text is shown whole (rich took
`[default: x]` for markup and dropped it), a command's line in its group's list is one
line, `-h` is `--help` everywhere; and `meshdl --version` imports no command module."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main

import meshdl.cli

WIDE = "1000"  # columns: no help line wraps


def _commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                           Any]]:
    """Every command and group of the app, by its path of names (as declared)."""
    cmd = cmd if cmd is not None else typer.main.get_command(meshdl.cli.app)
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = {" ".join(path): cmd for path, cmd in _commands()}


def _render(path: str, flag: str) -> str:
    """`meshdl PATH FLAG`'s output, as wide as it likes."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setenv("COLUMNS", WIDE)
        with contextlib.suppress(SystemExit):  # a group's help exits 0 (typer's way)
            meshdl.cli.main([*path.split(), flag])
    return out.getvalue()


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """Every command's --help, rendered once for the tests below."""
    return {path: _render(path, "--help") for path in COMMANDS}


def _words(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_flags_show_no_value_type_and_a_few_values_show_as_choices(helps) -> None:
    assert [path for path, text in helps.items() if "<bool>" in text] == []
    choices = [("train", "--optimizer", "[sgd|adam]"),
               ("train", "--activations", "[float32|fp16|int8|int8-static]"),
               ("evaluate", "--split", "[test|train|all]"),
               ("infer", "--mode", "[mesh|central]")]
    for path, option, values in choices:
        line = next(line for line in helps[path].splitlines() if f" {option} " in line)
        assert values in line, line


@pytest.mark.parametrize(("path", "option", "values"), [
    ("train", "--mode", "[mesh|central]"), ("train", "--transport", "[virtual|mqtt]"),
    ("train", "--augment", "[mirror|none]"), ("train", "--edge-at", "R,C"),
    ("simulate train", "--medium", "[shared|star]"),
    ("simulate train", "--device", "[cortex-m4|pi-zero-2w|pi4]"),
    ("simulate infer", "--edge-device", "[cortex-m4|pi-zero-2w|pi4]"),
    ("simulate infer", "--recovery", "[reliable|best-effort]"),
    ("simulate train", "--policy", "[zero|last|neighbours]"),
    ("simulate train", "--backhaul", "[wifi|ethernet|lte]"),
    ("experiment meshes", "--backhaul", "[wifi|ethernet|lte]"),
    ("bench recipe", "--mode", "[central|mesh]"),
    ("schedule", "--backhaul", "[wifi|ethernet|lte]"), ("plan", "--transport", "[mqtt|radio]")])
def test_an_option_of_a_few_fixed_values_shows_them_in_help(helps, path, option,
                                                             values) -> None:
    line = next(line for line in helps[path].splitlines() if f" {option} " in line)
    assert re.search(f" {re.escape(option)} +{re.escape(values)} ", line), line


def test_every_help_text_is_shown_whole(helps) -> None:
    cut = []
    for path, cmd in COMMANDS.items():
        shown = _words(helps[path])
        for param in cmd.params:
            text = getattr(param, "help", None)
            if text and _words(text.replace("\\[", "[")) not in shown:
                cut.append(f"{path} {param.name}: {text!r}")
    assert cut == []


def test_each_command_of_a_group_is_listed_on_one_line(helps) -> None:
    broken = []
    for path, cmd in COMMANDS.items():
        subs = getattr(cmd, "commands", {})
        if not subs:
            continue
        lines = [_words(line) for line in helps[path].splitlines()]
        for name, sub in subs.items():
            first = _words(sub.help.replace("\\[", "[").split("\n\n")[0])
            if not any(line.startswith(f"{name} {first}") for line in lines):
                broken.append(f"{path} {name}".strip())
    assert broken == []


def test_dash_h_is_help_for_every_command(helps) -> None:
    assert [path for path in COMMANDS if _render(path, "-h") != helps[path]] == []


def test_version_is_answered_before_any_command_module_or_numba_is_imported() -> None:
    probe = ("import sys; from meshdl.cli import main; main(['--version']); "
             "print(sorted(m for m in sys.modules if m.startswith('meshdl.cli.') "
             "or m in ('numba', 'numpy', 'pydantic', 'meshdl.config')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"meshdl {meshdl.__version__}", "[]"]


def test_the_package_loads_its_model_and_configuration_when_first_used() -> None:
    probe = ("import sys, meshdl; before = 'numba' in sys.modules or 'pydantic' in "
             "sys.modules; from meshdl import CNN, ModelConfig; "
             "print(before, CNN.__name__, ModelConfig().rows)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "CNN", "17"]
