"""Option groups spliced into commands, and the one function from flags to configuration.

Many commands take the same runs of options (the grid, the network, the training run),
in the orders their help has always shown. A `Group` names such a run once; a command
lists it as one parameter (`net: Flags = NETWORK`) and `@grouped` splices its options
into the signature typer reads, in that place, then hands the command their values as
one dict. `overrides` turns collected flags into the nested overrides
`load_run_config` takes, so that a flag lands in the same configuration field whichever
command took it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshdl.cli.common import parse_cell
from meshdl.cli.options import (
    Activations,
    Batch,
    Cols,
    Compress,
    ConvLayers,
    Epochs,
    Failout,
    Filters,
    Hidden,
    Kernel,
    Lr,
    Pool,
    Rows,
)

Flags = dict[str, Any]  # a group's values, by parameter name


@dataclass(frozen=True)
class Group:
    """Options that travel together: (parameter name, Annotated alias, default) each."""

    options: tuple[tuple[str, Any, Any], ...]

    @classmethod
    def of(cls, **aliases: Any) -> Group:
        """Options by name: an alias, which defaults to None (the configuration's value
        unless given), or a pair (alias, default)."""
        return cls(tuple((name, *(alias if isinstance(alias, tuple) else (alias, None)))
                         for name, alias in aliases.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.options)

    def without(self, *names: str) -> Group:
        return Group(tuple(o for o in self.options if o[0] not in names))

    def only(self, *names: str) -> Group:
        return Group(tuple(o for o in self.options if o[0] in names))


GRID = Group.of(rows=Rows, cols=Cols)
NETWORK = Group.of(kernel=Kernel, filters=Filters, conv_layers=ConvLayers, pool=Pool,
                   hidden=Hidden)
TRAINING = Group.of(epochs=Epochs, batch=Batch, lr=Lr, failout=Failout)
TRAFFIC = Group.of(compress=Compress, activations=Activations)


def grouped(func: Callable[..., Any]) -> Callable[..., Any]:
    """The command `func` with each parameter whose default is a `Group` replaced, in
    its place, by the group's options; `func` gets their values as one dict."""
    signature = inspect.signature(func, eval_str=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, tuple[str, ...]] = {}
    for param in signature.parameters.values():
        if isinstance(param.default, Group):
            groups[param.name] = param.default.names
            parameters += [inspect.Parameter(name, param.kind, default=default,
                                             annotation=alias)
                           for name, alias, default in param.default.options]
        else:
            parameters.append(param)

    @functools.wraps(func)
    def command(**values: Any) -> Any:
        for name, members in groups.items():
            values[name] = {member: values.pop(member) for member in members}
        return func(**values)

    del command.__wrapped__  # typer must read the spliced signature, not func's
    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


# Where each flag lands in the run configuration: (section, field).
_FIELDS = {
    **{name: ("model", name) for name in ("rows", "cols", "kernel", "filters",
                                           "conv_layers", "pool", "hidden")},
    **{name: ("train", name) for name in ("epochs", "batch", "lr", "optimizer",
                                           "clip_norm", "augment", "seed", "failout")},
    "warmup": ("train", "warmup_fraction"),
    **{name: ("mesh", name) for name in ("edge_at", "wire", "dispatch", "compress",
                                          "activations", "auth")},
    **{name: ("parallel", name) for name in ("meshes", "sync", "overlap")},
}


def overrides(*groups: Mapping[str, Any], **flags: Any) -> dict[str, dict[str, Any]]:
    """The flags (groups' values and single ones) as `load_run_config`'s nested
    overrides, e.g. {"model": {"rows": 6}, "mesh": {"edge_at": (0, 0)}}; a flag left
    unset (None) leaves the lower layers' value."""
    nested: dict[str, dict[str, Any]] = {}
    for name, value in [kv for group in groups for kv in group.items()] + list(flags.items()):
        section, field = _FIELDS[name]
        if name == "edge_at":
            value = parse_cell(value) if value else None
        nested.setdefault(section, {})[field] = value
    return nested
