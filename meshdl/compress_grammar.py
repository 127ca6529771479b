"""The `--compress` language, read without the compressors themselves: each compressor's
name, its argument and the layers it applies to, and a policy over a model's layers
(compress/policy.py's docstring says what each policy means).

Configuration checks a value with it before anything runs (config.py) and the policy
builds its compressors from what it reads (compress/policy.py, compress/compressors.py):
one grammar, so both say the same about a bad value. It imports nothing of meshdl but
its errors, and it sits beside config.py rather than in compress/: configuration is a
leaf every folder imports, compress/ imports configuration (a policy is over a model's
layers), so a grammar inside compress/ made the two folders import each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from meshdl.errors import UsageError

INTSUM_LEVELS = 7
INTSUM_MAX_LEVELS = 127
# A layer's code must fit its uint16 byte count whatever the values: the sender's best
# Rice parameter writes no more than the largest one (31: one bit of quotient's end and
# 31 of remainder a value, for any sum an int32 holds), so 16,000 values (compress/intsum.py).
MAX_LAYER_VALUES = 16_000
HYLO_THRESHOLD = 64
HYLO_FACTOR = 2.0  # tau = 2 x mean |x| for the fc layers (validated: compress/policy.py)
PLAN = "plan"  # resolved by sim/studies/schedule.py before a run


class Rule(NamedTuple):
    """What a compressor's name allows."""

    takes: str  # what ARG means in NAME:ARG, for error messages ("": no argument)
    kinds: tuple[str, ...] | None  # the segment kinds it applies to (None: every one)
    valid: Callable[[float], bool] = lambda arg: 0 < arg <= 1  # is ARG one it takes?


_DENSITY = "a density in (0, 1]"


def _positive(arg: float) -> bool:
    return 0 < arg < math.inf


# Every compressor by name, in the order errors list them (compressors.COMPRESSORS
# holds the classes, in the same order).
RULES: dict[str, Rule] = {
    "none": Rule("", None),
    "fp16": Rule("", None),
    "int8": Rule("", None),
    "2bit": Rule("a fixed threshold tau > 0", None, _positive),
    "2bitmean": Rule("a factor c > 0 of the mean |x|", None, _positive),
    "ternary": Rule("", None),
    "topk": Rule(_DENSITY, None),
    "randk": Rule(_DENSITY, None),
    "ktopk": Rule(_DENSITY, ("conv",)),
    "powersgd": Rule("a whole rank r >= 1", ("conv", "fc"),
                     lambda arg: arg >= 1 and arg == int(arg)),
    "intsum": Rule(f"the levels either side of 0 of each node's share (1 to "
                   f"{INTSUM_MAX_LEVELS})", ("conv",),
                   lambda arg: 1 <= arg <= INTSUM_MAX_LEVELS and arg == int(arg)),
}


class Choice(NamedTuple):
    """A compressor as named: NAME or NAME:ARG."""

    name: str
    arg: float | None = None

    @property
    def spec(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg:g}"

    def applies_to(self, kind: str) -> bool:
        kinds = RULES[self.name].kinds
        return kinds is None or kind in kinds


class Layer(Protocol):
    """What the grammar knows of a layer (a `compressors.Segment` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def size(self) -> int: ...


def parse_choice(spec: str) -> Choice:
    """'topk:0.01' -> Choice('topk', 0.01); a UsageError naming the choices otherwise."""
    name, _, arg_text = spec.strip().partition(":")
    rule = RULES.get(name)
    if rule is None:
        raise UsageError(f"unknown compressor {name!r}: one of {', '.join(RULES)}")
    if not arg_text:
        return Choice(name)
    if not rule.takes:
        raise UsageError(f"compressor {name} takes no argument (got {spec!r})")
    try:
        arg = float(arg_text)
    except ValueError:
        raise UsageError(f"compressor {name}: {arg_text!r} is not a number "
                         f"({rule.takes})") from None
    if not rule.valid(arg):
        raise UsageError(f"compressor {name}: {arg_text} is not {rule.takes}")
    return Choice(name, arg)


def is_hylo(spec: str) -> bool:
    return spec == "hylo" or spec.startswith("hylo:")


def hylo_args(spec: str) -> tuple[int, float]:
    """'hylo' -> (64, 2.0); 'hylo:T' -> (T, 2.0); 'hylo:T:c' -> (T, c)."""
    _, _, text = spec.partition(":")
    threshold_text, _, factor_text = text.partition(":")
    if threshold_text and not threshold_text.isdigit():
        raise UsageError(f"--compress {spec}: the threshold is a whole number of parameters")
    threshold = int(threshold_text) if threshold_text else HYLO_THRESHOLD
    if not factor_text:
        return threshold, HYLO_FACTOR
    try:
        factor = float(factor_text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise UsageError(f"--compress {spec}: the factor c of tau = c x mean |x| is a "
                         "number above 0")
    return threshold, factor


def parse_policy(spec: str, layers: Sequence[Layer]) -> dict[str, Choice] | None:
    """A `--compress` value over `layers` (the model's, in the flat vector's order):
    layer name -> its compressor where one is named (the rest stay dense), or None for
    `hylo[:T[:c]]`, whose choices follow from the layers' shapes (policy.hylo). Every
    impossible value is a UsageError saying why."""
    spec = spec.strip()
    if spec == PLAN:
        raise UsageError("--compress plan is resolved before a run starts (meshdl "
                         "train and simulate do it); here it names no compressors")
    names = [layer.name for layer in layers]
    if spec in ("", "none"):
        chosen: dict[str, Choice] = {}
    elif "=" in spec:
        chosen = {}
        for entry in spec.split(","):
            layer, _, compressor = entry.partition("=")
            if layer.strip() not in names:
                raise UsageError(f"--compress: no layer {layer.strip()!r} in this model "
                                 f"(layers: {', '.join(names)})")
            chosen[layer.strip()] = parse_choice(compressor)
    elif is_hylo(spec):
        hylo_args(spec)
        return None
    else:
        choice = parse_choice(spec)
        chosen = {layer.name: choice for layer in layers if choice.applies_to(layer.kind)}
    for layer in layers:
        choice = chosen.get(layer.name)
        if choice is not None and not choice.applies_to(layer.kind):
            raise UsageError(f"--compress: {choice.spec} does not apply to "
                             f"{layer.name} (a {layer.kind} layer)")
    summed = [layer.name for layer in layers
              if (choice := chosen.get(layer.name)) is not None and choice.name == "intsum"]
    too_large = [layer.name for layer in layers if layer.name in summed and
                 layer.size > MAX_LAYER_VALUES]
    if too_large:
        raise UsageError(f"--compress: intsum sums layers of at most {MAX_LAYER_VALUES:,} "
                         f"values ({', '.join(too_large)} has more)")
    conv = [layer.name for layer in layers if layer.kind == "conv"]
    if summed and summed != conv:
        raise UsageError(f"--compress: intsum sums the REDUCE in the network, so it is "
                         f"for every conv layer or none (here: {', '.join(summed)})")
    return chosen
