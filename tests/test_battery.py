"""Batteries (sim/radio/battery.py): energy, lifetime against its closed form, the
built-ins' figures and sources."""

from __future__ import annotations

import math

import pytest

from meshdl.sim.radio.battery import BATTERIES, Battery, battery, lifetime_years
from meshdl.sim.radio.profiles import profile

YEAR_S = 365.25 * 24 * 3600


def _pack(self_discharge: float = 0.0) -> Battery:
    """Two 2,000 mAh 1.5 V cells in series: 2 x 2 Ah x 1.5 V x 3600 s = 21,600 J."""
    return Battery(name="test", capacity_mah=2000.0, voltage_v=1.5, cells=2,
                   self_discharge_per_year=self_discharge, source="a test's figures")


def test_energy_is_cells_times_capacity_times_voltage() -> None:
    assert _pack().energy_j == pytest.approx(21_600.0)


def test_always_on_lifetime_is_the_energy_over_the_listening_power() -> None:
    listening = profile("802.15.4").idle_w  # always-on: the radio listens all the time
    years = lifetime_years(_pack(), listening)
    assert years == pytest.approx(21_600.0 / listening / YEAR_S, rel=1e-9)
    assert years * 365.25 * 24 == pytest.approx(106.4, abs=0.1)  # hours: about 4.4 days


def test_self_discharge_shortens_the_lifetime_as_the_closed_form_says() -> None:
    watts = 200e-6
    leaky = _pack(self_discharge=0.04)
    # dE/dt = -P - s E0 per year: E0 = (P + s E0 / year) t
    expected = 21_600.0 / (watts * YEAR_S + 0.04 * 21_600.0)
    assert lifetime_years(leaky, watts) == pytest.approx(expected, rel=1e-12)
    assert lifetime_years(leaky, watts) < lifetime_years(_pack(), watts)
    assert lifetime_years(leaky, 0.0) == pytest.approx(1 / 0.04)  # at rest: 25 years
    assert lifetime_years(_pack(), 0.0) == math.inf


def test_more_power_empties_the_battery_sooner() -> None:
    b = battery("2xAA")
    lifetimes = [lifetime_years(b, w) for w in (1e-5, 1e-4, 1e-3, 1e-2)]
    assert lifetimes == sorted(lifetimes, reverse=True)


def test_negative_or_infinite_power_is_refused() -> None:
    for watts in (-1e-3, math.inf, math.nan):
        with pytest.raises(ValueError, match="watts"):
            lifetime_years(_pack(), watts)


def test_builtins_have_plausible_energies_and_their_sources() -> None:
    assert set(BATTERIES) == {"2xAA", "2xAA-lithium", "cr2032"}
    assert 20e3 <= battery("2xAA").energy_j <= 35e3
    assert 20e3 <= battery("2xAA-lithium").energy_j <= 40e3
    assert 1.5e3 <= battery("cr2032").energy_j <= 3.5e3
    assert battery("2xAA").cells == battery("2xAA-lithium").cells == 2
    for b in BATTERIES.values():
        assert b.source.strip() and 0 < b.self_discharge_per_year < 0.1
    # Lithium cells keep their charge far better than alkaline ones.
    assert battery("2xAA-lithium").self_discharge_per_year < \
        battery("2xAA").self_discharge_per_year


def test_an_unknown_battery_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown battery 'AAA'.*2xAA.*cr2032"):
        battery("AAA")


def test_a_battery_is_immutable_and_checked() -> None:
    with pytest.raises(ValueError):
        Battery(name="bad", capacity_mah=-1.0, voltage_v=1.5, source="x")
    with pytest.raises(ValueError):
        _pack().capacity_mah = 1.0  # type: ignore[misc]
