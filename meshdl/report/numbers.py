"""Numbers as people write them in a table or a sentence: a few significant digits,
thousands separated, never in e-notation (`1.121e+04` reads as a typo next to `710,296`).
"""

from __future__ import annotations

import math


def figure(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits, thousands separated: 11210.5 ->
    "11,210", 2.117e-05 -> "0.00002117", 0.29485 -> "0.2949", 1.5 -> "1.5"; an int as
    it is (with separators)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    rounded = round(value, digits - 1 - _exponent(value))
    decimals = max(0, digits - 1 - _exponent(rounded)) if rounded else 0
    text = f"{rounded:,.{decimals}f}"
    # 1.500 -> 1.5: the zeros a rounding leaves say nothing a reader needs.
    return text.rstrip("0").rstrip(".") if "." in text else text


def _exponent(value: float) -> int:
    """The power of ten of `value`'s first significant digit."""
    return math.floor(math.log10(abs(value)))
