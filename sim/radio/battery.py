"""Batteries and how long they keep a node going.

A `Battery` is `cells` identical primary cells in series: the pack's charge is one cell's
`capacity_mah`, its voltage `cells` x `voltage_v`, so its energy is cells x capacity x
voltage. Capacity is the datasheet's at a low drain (tens of mA at most, where a sensor
node draws far less) to the datasheet's end voltage; voltage is the nominal one. Both
make the energy an upper bound: an alkaline cell's voltage falls from about 1.5 V to its
0.8 V end point as it discharges, and a node's radio or regulator may stop before the
cell's end point (the CC2420 needs 2.1 V, more than two spent alkaline cells give).

Lifetime (`lifetime_years`): the node draws `watts` on average and the cells lose a fixed
fraction `self_discharge_per_year` of their rated energy E0 every year,

    dE/dt = -P - s E0 / year,   so   t = E0 / (P + s E0 / year).

Linear rather than exponential because the datasheets give one point, the capacity left
after N years at 21 C (a fraction 1 - f), which a linear loss s = f / N meets exactly at
N years without assuming the curve's shape; it is also the cautious choice: an
exponential through the same point loses less as the cell empties (rate -ln(1 - f) / N
of what is left), so it gives longer lifetimes (two alkaline AA cells at 175 uW: 4.9
years against this model's 4.5). With P = 0 the battery is empty after 1 / s years.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

SECONDS_PER_YEAR = 365.25 * 86400.0  # a Julian year
JOULES_PER_MAH_VOLT = 3.6  # 1 mAh at 1 V: 1e-3 A x 3600 s


class Battery(BaseModel):
    """`cells` identical cells in series (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    capacity_mah: float = Field(gt=0, description="one cell's, at low drain")
    voltage_v: float = Field(gt=0, description="one cell's nominal voltage")
    cells: int = Field(1, ge=1, description="in series")
    self_discharge_per_year: float = Field(0.0, ge=0, lt=1, description="fraction of the "
                                           "rated energy lost per year at rest")
    source: str = Field(min_length=1)

    @property
    def energy_j(self) -> float:
        """Usable energy: cells x capacity x nominal voltage."""
        return self.cells * self.capacity_mah * self.voltage_v * JOULES_PER_MAH_VOLT


_BATTERIES = [
    Battery(
        name="2xAA", capacity_mah=2800.0, voltage_v=1.5, cells=2,
        # 85 % left after 4 years at 21 C: 15 % / 4 years.
        self_discharge_per_year=0.15 / 4,
        source="Two Energizer E91 alkaline AA cells in series. Capacity: about 2,800 mAh at "
               "25 mA continuous to 0.8 V at 21 C, as quoted from the E91 product datasheet "
               "(data.energizer.com/pdfs/e91.pdf; edition not verified here; the later "
               "'E91 MAX' edition's capacity chart reads about 3,000 mAh at 25 mA); nominal "
               "1.5 V. Self-discharge: 85 % of capacity left after 4 years at 21 C, the "
               "manufacturers' storage figure as summarised by anrieff.net's battery tests "
               "(Energizer states a 10-year shelf life without a retention figure)."),
    Battery(
        name="2xAA-lithium", capacity_mah=3000.0, voltage_v=1.5, cells=2,
        # 90 % of rated capacity after 15 years at 21 C: 10 % / 15 years.
        self_discharge_per_year=0.10 / 15,
        source="Two Energizer L91 Ultimate Lithium (Li/FeS2) AA cells in series. Capacity "
               "3,000 mAh, nearly independent of the load, and 'Shelf Life: 15 years at "
               "21 C (90 % of rated capacity)': the L91 datasheet edition that stated "
               "both (data.energizer.com/pdfs/l91.pdf, as quoted; later editions give "
               "3,500 mAh and a 20-25 year shelf life without a retention figure); "
               "nominal 1.5 V."),
    Battery(
        name="cr2032", capacity_mah=235.0, voltage_v=3.0, cells=1,
        self_discharge_per_year=0.01,
        source="One Energizer CR2032 lithium coin cell (Li/MnO2): 235 mAh to 2.0 V on a "
               "15 kOhm load (0.19 mA) at 21 C, nominal 3.0 V, self-discharge about 1 % a "
               "year (Energizer CR2032 product datasheet, data.energizer.com/pdfs/"
               "cr2032.pdf; edition not verified here). Its internal resistance (about "
               "10 Ohm fresh) limits pulses to a few mA, less than a CC2420 draws, so the "
               "figure is for comparison, not a claim that a coin cell runs such a node."),
]
BATTERIES: dict[str, Battery] = {b.name: b for b in _BATTERIES}


def battery(name: str) -> Battery:
    """A built-in battery by name; a ValueError listing the names if unknown."""
    try:
        return BATTERIES[name]
    except KeyError:
        raise ValueError(f"unknown battery {name!r} (known: {', '.join(BATTERIES)})") from None


def lifetime_years(battery: Battery, watts: float) -> float:
    """Years until `battery` is empty, drawing `watts` on average and losing its
    self-discharge (see the module docstring); math.inf if nothing drains it."""
    if not watts >= 0 or math.isinf(watts):
        raise ValueError(f"watts must be a finite number >= 0, got {watts}")
    energy = battery.energy_j
    drain = watts * SECONDS_PER_YEAR + battery.self_discharge_per_year * energy  # J/year
    return energy / drain if drain > 0 else math.inf
