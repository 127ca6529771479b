"""One formatter of figures (issue 47, item 5): meshdl/report/numbers.py writes every
number of the report, the experiments' tables and the console's summary lines, with one
rule: significant digits with their zeros, never rounded above the units, ties half away
from zero on the decimal the float prints as."""

from __future__ import annotations

import pytest

from meshdl.experiments.columns import digits, fixed, size
from meshdl.report.numbers import figure, given, places


@pytest.mark.parametrize(("value", "text"), [
    (110650.0, "110,650"), (110650.4, "110,650"), (1946.5, "1,947"), (11210.5, "11,211")])
def test_a_figure_is_never_rounded_above_its_units(value, text) -> None:
    assert figure(value) == text


@pytest.mark.parametrize(("value", "count", "text"), [
    (0.125, 2, "0.13"), (0.29485, 4, "0.2949"), (-0.0012345, 4, "-0.001235"),
    (2.675, 3, "2.68")])
def test_a_tie_rounds_half_away_from_zero_on_the_printed_decimal(value, count, text) -> None:
    # round() gives 0.12, 0.2948 (binary 0.29484999...), 2.67: not what a reader does.
    assert figure(value, count) == text


def test_a_figure_keeps_the_zeros_of_its_significant_digits() -> None:
    assert (figure(2.3, 3), figure(2.2186, 3)) == ("2.30", "2.22")
    assert figure(9.9996) == "10.00" and figure(99.995) == "100.0"
    assert (size(13_000, None), size(16_100, None)) == ("13.0 kB", "16.1 kB")


def test_tables_columns_and_deviations_use_the_same_rule() -> None:
    assert fixed(1, 100)(0.97125, 0.00449) == "97.1 ± 0.4"
    assert places(0.125, 2) == "0.13" and places(-0.04, 1) == "0.0"
    assert digits(3)(2.3, 0.01) == "2.30 ± 0.01"
    assert digits(3)(2.3, 0.001) == "2.30"  # ± 0.00 says nothing


def test_a_set_value_is_written_as_it_was_given() -> None:
    assert (given(0.1), given(1800.0), given(1e-05)) == ("0.1", "1,800", "0.00001")
