"""Options that take a list: repeated (`--sizes 3 --sizes 5`) or as one comma list
(`--sizes 3,5`), and a one-line refusal of the space-separated list a shell user tries
first (`--sizes 3 5`), naming both forms.

Typer reads a `list[...]` option only by repetition: `--fractions 0,0.1` failed with
"Input should be a valid number" and `--sizes 3 5` with "unexpected extra argument",
neither saying the flag repeats. `list_option` declares the option as text, splits
and converts it in its callback; `ListsCommand` is the command class that looks at the
arguments before typer does. (Generic to any command; it lives here rather than in
options.py while the experiments are its only users.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperCommand

Parse = Callable[[str], Any]
Split = Callable[[str], list[str]]


def commas(text: str) -> list[str]:
    """'3,5' -> ['3', '5']: the comma list of one value each."""
    return [part.strip() for part in text.split(",")]


def pairs(text: str) -> list[str]:
    """'0,0,0,12' -> ['0,0', '0,12']: a comma list of ROW,COL cells; an odd count is
    left whole, for the cell parser to refuse."""
    parts = commas(text)
    if len(parts) % 2:
        return [text]
    return [f"{parts[i]},{parts[i + 1]}" for i in range(0, len(parts), 2)]


def whole_value(text: str) -> list[str]:
    """One value as given: values that may hold commas themselves."""
    return [text]


def list_option(flag: str, parse: Parse, default: Sequence[Any], help: str,
                metavar: str, *, split: Split = commas) -> Any:
    """A `list[str]` option `flag` whose values (repeated, each split by `split`) `parse`
    turns into the command's list; `help` says what one value is."""
    forms = "Repeat the flag." if split is whole_value else \
        "Repeat the flag or give a comma list."
    return typer.Option(list(map(str, default)), flag, metavar=metavar,
                        help=f"{help} {forms}", callback=_converter(flag, parse, split))


def _converter(flag: str, parse: Parse, split: Split) -> Callable[[list[str]], list[Any]]:
    def convert(values: list[str]) -> list[Any]:
        return parse_list(flag, values, parse, split)

    return convert


def parse_list(flag: str, values: Sequence[str], parse: Parse,
               split: Split = commas) -> list[Any]:
    """Each value of `flag`, split by `split`, through `parse`; a value `parse` refuses
    (ValueError) is a `typer.BadParameter` naming it."""
    items = [item for value in values for item in split(value)]
    forms = "repeats" if split is whole_value else "repeats or takes a comma list"
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except ValueError as exc:
            reason = str(exc) or "not a valid value"
            raise typer.BadParameter(f"{item!r}: {reason} ({flag} {forms})",
                                     param_hint=f"'{flag}'") from None
    return out


def number(text: str) -> float:
    """A float, refused in words a user reads (not Python's "could not convert")."""
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not a whole number") from None


class ListsCommand(TyperCommand):
    """A command of no positional arguments whose list options refuse a value left
    standing after theirs (`--sizes 3 5`) in one line that shows both list forms."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not any(getattr(p, "param_type_name", "") == "argument" for p in self.params):
            repeated = {opt: p for p in self.params if getattr(p, "multiple", False)
                        for opt in p.opts}
            stray = spread_value(args, repeated)
            if stray is not None:
                flag, first, second = stray
                raise typer.BadParameter(
                    f"{second!r} after {flag} {first}: the flag takes one value at a time; "
                    f"repeat it ({flag} {first} {flag} {second}) or give a comma list "
                    f"({flag} {first},{second})", ctx=ctx, param_hint=f"'{flag}'")
        return super().parse_args(ctx, args)


def spread_value(args: Sequence[str], flags: Any) -> tuple[str, str, str] | None:
    """The first list flag in `args` followed by a second bare value, as (flag, its
    value, the stray one); None if there is none. Stops at `--`."""
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        flag, inline, value = arg.partition("=")
        if flag not in flags:
            continue
        at = i + 1 if inline else i + 2
        first = value if inline else (args[i + 1] if i + 1 < len(args) else None)
        if first is not None and not first.startswith("-") and at < len(args) and \
                not args[at].startswith("-"):
            return flag, first, args[at]
    return None
