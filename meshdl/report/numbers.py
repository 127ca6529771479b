"""Numbers as people write them in a table, a sentence or a console line: the one
formatter of meshdl's figures (the report, the experiments' tables and plots, the
console lines of `meshdl simulate`).

The rule, everywhere:
- a few significant digits (4 unless a caller asks for fewer), thousands separated,
  never in e-notation (`1.121e+04` reads as a typo next to `710,296`);
- the zeros those digits end in are kept: "13.0 kB" beside "16.1 kB", "2.30 y" beside
  "2.22 y" (dropping them made one figure look less precise than its neighbour);
- a figure is never rounded above its units: 110,650 bytes a slot stays 110,650 (at four
  digits it was "110,600": a count people check against a README is shown whole);
- an int (a count) shows as it is, with separators;
- a tie is rounded half away from zero, on the decimal the float prints as (0.29485 ->
  0.2949, 0.125 -> 0.13), as people round by hand; Python's `round` rounds half to even
  on the binary value (round(110650, -2) == 110600, round(0.125, 2) == 0.12).
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal


def figure(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits (the module's rule): 0.29485 -> "0.2949",
    2.117e-05 -> "0.00002117", 1.5 -> "1.500", 13.0 at 3 -> "13.0", 11210.5 -> "11,211",
    110650.0 -> "110,650"; an int as it is (with separators), a bool as a word."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return f"{value:g}"
    if value == 0:
        return "0"
    exact = Decimal(repr(float(value)))
    decimals = max(0, digits - 1 - _exponent(exact))
    rounded = exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    if rounded and _exponent(rounded) > _exponent(exact) and decimals:
        # 9.9996 -> 10.000: one digit more before the point, one fewer after it.
        decimals -= 1
        rounded = rounded.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return f"{rounded:,.{decimals}f}"


def places(value: float, decimals: int) -> str:
    """`value` with `decimals` after the point, thousands separated, ties half away from
    zero (the module's rule): a table column of fixed decimals (percentages at one
    decimal: "97.1"; a deviation shown to its mean's decimals)."""
    if not math.isfinite(value):
        return f"{value:g}"
    exact = Decimal(repr(float(value)))
    rounded = exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return f"{rounded if rounded else abs(rounded):,.{decimals}f}"  # no "-0.0"


def given(value: float) -> str:
    """A value someone set (a swept loss rate, a threshold), as they wrote it: never
    rounded, no zeros added, thousands separated: 0.1 -> "0.1", 1800.0 -> "1,800"."""
    if isinstance(value, bool) or not math.isfinite(value):
        return str(value)
    return f"{Decimal(repr(float(value))).normalize():,f}"


def decimals_of(shown: str) -> int:
    """How many decimals a shown figure has ("16.1" -> 1): a deviation is written to
    its mean's."""
    return len(shown.partition(".")[2])


def plus_minus(mean: str, std: float | None) -> str:
    """A shown mean and its deviation, to the mean's decimals: "26.8 ± 0.1"; the mean
    alone where there is no deviation or it shows as zero at the mean's precision
    ("1.04 ± 0.00" says no more than "1.04")."""
    if std is None:
        return mean
    shown = places(std, decimals_of(mean))
    return f"{mean} ± {shown}" if any(c in "123456789" for c in shown) else mean


def _exponent(value: Decimal) -> int:
    """The power of ten of `value`'s first significant digit."""
    return value.adjusted()
