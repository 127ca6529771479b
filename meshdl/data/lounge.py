"""The synthetic lounge: temperature maps a building engineer would find plausible.

No public copy of the seed experiment's data exists (a ~1,400 m² lounge, a 17 x 25 sensor
grid, one map per 30-minute slot), so this module simulates one. Every slot is a point in
time (consecutive slots from a Monday in early spring) and its map is the sum of

- the room air temperature: a first-order building model that follows the set point while
  the HVAC runs and drifts toward the outdoor temperature (a diurnal cycle with day-to-day
  weather) while it is off;
- HVAC outlets: cool (or, on cold days, warm) plumes at fixed diffusers, on a schedule;
- the window wall (row 0): a solar gain strip whose sunlit patch follows the sun along the
  façade and fades with cloud cover, and a cold strip at night;
- occupants: warm Gaussian blobs, many during opening hours, none at night;
- a spatially smooth, slowly wandering background (stratification, furniture, drafts);
- sensor effects: a fixed calibration offset per sensor, reading noise, a few sensors
  that drift and a few that get stuck;
- real anomalies as events lasting a few slots: a space heater (a sharp warm blob), an
  open door (outdoor air spilling in along a wall) and an HVAC fault (one outlet blowing
  unmixed cold or hot supply air).

Calibration. A classifier must not be able to separate the classes by a wide margin, so
the strengths of the features are calibrated per map. Each slot gets a target for its
largest neighbour difference: above the threshold for most anomaly slots, below it for
most others, and in each split 28 % of the positives within [thr, thr + 0.6) °C and 28 %
of the negatives within [thr - 0.6, thr) (quotas, not coin flips, so this holds for every
seed; the acceptance rule asks for 25 %). Then the ordinary gradients (sun, airflow,
people) or the anomaly are scaled so the map's largest difference lands exactly on the
target. The largest difference of `base + s * feature` is a convex, piecewise linear
function of `s`, so the scale has a closed form (`_scale_to_target`), and targets are only
handed to slots whose feature can reach them within its cap. The maps stay physical: only
the strengths of features that really vary (sun and clouds, airflow, heater power, how far
a door is open) change, within plausible caps. Labels are then computed from the final
float32 maps by `label_maps`, so they are exact.

The anomaly events cover about half of the time (30-45 % of the maps end up positive), far
more than in a real lounge: the generator produces a curated, balanced training set, as a
study collecting anomalies would. The split is chronological, like `dataset_from_log`:
the first `train` slots are the training split (shuffled with the seed), the last `test`
slots the test split (in time order). Everything is vectorized numpy; one
`numpy.random.SeedSequence` stream per ingredient keeps the output a pure function of the
`DataConfig`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from numba import njit

from meshdl.blas import one_blas_thread
from meshdl.config import DataConfig
from meshdl.data.datasets import NEAR_BAND, Dataset, label_maps

__all__ = ["START", "generate_lounge"]

#: The first slot: a Monday, 00:00, early spring (heating in the morning, cooling later).
START = datetime(2024, 4, 1)
GENERATOR_VERSION = 1
_JIT = {"cache": True, "nogil": True, "boundscheck": False}
OCCUPANT_CHUNK = 32  # slots whose occupants are summed at once (a few MB of Gaussians)

# Share of slots with an anomaly event, and how likely each class lands where.
ANOMALY_SHARE = 0.50
P_POSITIVE_IF_ANOMALY = 0.85  # the rest are weak anomalies that stay below the threshold
P_POSITIVE_IF_NORMAL = 0.08  # strong sun or airflow crossing the threshold on its own
NEAR_POSITIVES = 0.28  # share of positives aimed into [thr, thr + 0.6), in each split
NEAR_NEGATIVES = 0.28  # share of negatives aimed into [thr - 0.6, thr), in each split
MIN_POSITIVES = 0.30  # each split gets at least this share of positives when attainable
TAIL_MEAN = 0.9  # °C beyond the band, mean of the exponential tail of strong anomalies
TAIL_MAX = 4.0  # °C above the threshold at most

# Anomaly kinds: (name, share of events, mean duration in hours, peak cap in °C).
ANOMALIES = (
    ("heater", 0.40, 3.0, 11.0),
    ("door", 0.35, 1.0, 6.0),
    ("hvac_fault", 0.25, 4.0, 8.0),
)
GRADIENT_CAP = 3.0  # the gradient features may be at most this many times their nominal

SETPOINT = 22.0  # °C while the HVAC runs
SENSOR_NOISE = 0.06  # °C, per reading
SENSOR_OFFSET = 0.10  # °C, fixed calibration error per sensor
STUCK_PER_SENSOR_DAY = 1.5e-4  # rate of stuck-sensor episodes


@dataclass(frozen=True)
class _Clock:
    """What time it is in every slot."""

    hour: np.ndarray  # (n,) hour of day, float
    day: np.ndarray  # (n,) day index from START
    is_open: np.ndarray  # (n,) lounge open (occupants come)
    hvac_on: np.ndarray  # (n,) HVAC schedule: from one hour before opening to closing

    @property
    def n(self) -> int:
        return len(self.hour)


@dataclass(frozen=True)
class _Grid:
    """Cell coordinates and the fixed installations of the room, in cell units."""

    rows: int
    cols: int

    @property
    def y(self) -> np.ndarray:
        return np.arange(self.rows, dtype=np.float64)

    @property
    def x(self) -> np.ndarray:
        return np.arange(self.cols, dtype=np.float64)

    def at(self, fy: float, fx: float) -> tuple[float, float]:
        """The point at fractions (fy, fx) of the room."""
        return fy * (self.rows - 1), fx * (self.cols - 1)

    @property
    def outlets(self) -> list[tuple[float, float]]:
        """Six ceiling diffusers in two rows of three."""
        return [self.at(fy, fx) for fy in (0.3, 0.75) for fx in (1 / 6, 3 / 6, 5 / 6)]

    @property
    def sockets(self) -> list[tuple[float, float]]:
        """Wall and pillar sockets, where a space heater gets plugged in."""
        spots = [
            (0.1, 0.1), (0.1, 0.5), (0.1, 0.9),  # under the windows
            (0.9, 0.35), (0.9, 0.9),  # back wall
            (0.5, 0.05), (0.3, 0.95), (0.7, 0.95),  # side walls
            (0.5, 0.33), (0.5, 0.67),  # pillars
        ]
        return [self.at(fy, fx) for fy, fx in spots]

    @property
    def doors(self) -> list[tuple[float, float, str]]:
        """Two doors in the back wall (last row), one in the left wall (col 0)."""
        back = self.rows - 1
        return [
            (float(back), 0.2 * (self.cols - 1), "back"),
            (float(back), 0.7 * (self.cols - 1), "back"),
            (0.6 * (self.rows - 1), 0.0, "left"),
        ]


@one_blas_thread  # a busy core made 2 threads' 4 s 100 x 100 lounge take 20-40 s; same bits
def generate_lounge(cfg: DataConfig) -> Dataset:
    """A synthetic lounge data set for `cfg` (grid, split sizes, threshold, slot, seed).

    Deterministic for a given config. Works for any grid from 1 x 1 (where no neighbour
    pair exists, every label is 0) and any split sizes from 1.

    One lounge logs at most `LOUNGE_TRAIN` training maps before its test period (the
    source paper's 2,400: 50 days of 30-minute slots, over which its weather warms
    through a spring and its drifting sensors drift; much longer, the weather and the
    drift run out of their plausible ranges and every map crosses the threshold). A
    larger training split is that lounge's training period and those of more lounges of
    the same design, each with its own weather, sensors, people and anomalies
    (`_more_lounges`); the test split is always the first lounge's, after its training
    period. A training split of at most `LOUNGE_TRAIN` is the first lounge's alone, as
    it always was.
    """
    _require_memory(cfg)
    first = min(cfg.train, LOUNGE_TRAIN)
    lounge = _lounge(cfg.model_copy(update={"train": first}), cfg.seed)
    if first == cfg.train:
        return lounge
    return _more_lounges(cfg, lounge)


def _require_memory(cfg: DataConfig) -> None:
    """MemoryError naming the whole request when what generating it holds at its peak
    exceeds this machine's memory: every lounge's maps (float32, written in place) and
    one lounge's working arrays (`_working_bytes`). Raised before a lounge is drawn, not
    at some lounge's arrays minutes in, whose size says nothing of what was asked."""
    maps = cfg.train + cfg.test
    need = maps * cfg.rows * cfg.cols * np.dtype(np.float32).itemsize + _working_bytes(cfg)
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have:
        raise MemoryError(f"{_binary(need)} for {maps:,} maps of {cfg.rows} x {cfg.cols}, "
                          f"on a machine of {_binary(have)}")


#: One lounge's working arrays at their peak, in float64 maps of that lounge: the base,
#: its gradients and anomaly fields and their calibration (3.2-4.5 measured with
#: tracemalloc on 24 x 30 lounges; tests/test_lounge_many.py holds the generator to it).
WORKING_MAPS = 6


def _working_bytes(cfg: DataConfig) -> int:
    """What one lounge (training period and test period) holds while it is drawn."""
    slots = min(cfg.train, LOUNGE_TRAIN) + cfg.test
    return WORKING_MAPS * slots * cfg.rows * cfg.cols * np.dtype(np.float64).itemsize


def _binary(size: int) -> str:
    """Bytes in binary units, as numpy's allocation errors give them (12.2 TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"


LOUNGE_TRAIN = 2400  # the most training maps one lounge logs (the source paper's)
LOUNGE_STREAM = 0x1A0E  # seeds each further lounge: SeedSequence([seed, this, i])


def _more_lounges(cfg: DataConfig, first: Dataset) -> Dataset:
    """`first` (the first lounge, training split and test split) with the training
    periods of as many further lounges as `cfg.train` needs, shuffled together.

    The maps are those of every lounge's training period one after the other, in the
    order of a permutation drawn from the seed; each lounge is written straight to its
    places in the one output array and let go, so the peak is the data set and one
    lounge, not the lounges, their concatenation and its shuffled copy (3 x the data
    set: 100 x 100 cells of 163,200 maps would not fit in 24 GiB)."""
    per = LOUNGE_TRAIN
    order = np.random.default_rng([cfg.seed, LOUNGE_STREAM]).permutation(cfg.train)
    place = np.empty_like(order)  # where the j-th map of the lounges in turn goes
    place[order] = np.arange(cfg.train)
    X = np.empty((cfg.train, *first.X_train.shape[1:]), dtype=first.X_train.dtype)
    y = np.empty(cfg.train, dtype=first.y_train.dtype)
    X[place[:per]], y[place[:per]] = first.X_train, first.y_train
    others = []
    for i, start in enumerate(range(per, cfg.train, per), start=1):
        size = min(per, cfg.train - start)
        entropy = [cfg.seed, LOUNGE_STREAM, i]
        # Its own test period too, so its calibration quotas are those of any lounge.
        part = _lounge(cfg.model_copy(update={"train": size}), entropy)
        to = place[start:start + size]
        X[to], y[to] = part.X_train, part.y_train
        others.append({"seed_entropy": entropy, "train": size,
                       "train_positives": int(part.y_train.sum())})
        del part
    meta = dict(first.meta)
    meta["config"] = cfg.model_dump()
    meta["counts"] = {**meta["counts"], "train": cfg.train,
                      "train_positives": int(y.sum())}
    meta["split"] = (f"the first lounge's first {per} slots and the first slots of "
                     f"{len(others)} more lounges (the same design, their own weather, "
                     "sensors, people and anomalies) are train, shuffled with the seed; the "
                     "first lounge's last `test` slots are test (in time order)")
    meta["more_lounges"] = others
    return Dataset(X, y, first.X_test, first.y_test, meta)


def _lounge(cfg: DataConfig, entropy: int | list[int]) -> Dataset:
    """One lounge, its slots drawn from `entropy` (the seed, for the first lounge)."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(entropy).spawn(9)]
    grid = _Grid(cfg.rows, cfg.cols)
    clock = _make_clock(cfg.train + cfg.test, cfg.slot_minutes)
    t_out, cloud = _weather(clock, streams[0])
    occupancy = _occupancy(clock)
    t_in, heating = _room_air(clock, t_out, occupancy, cfg.slot_minutes, streams[1])

    # Sums in place (the same additions, bit for bit: no (n, rows, cols) array more).
    base = _background(grid, clock.n, streams[2])
    base += t_in[:, None, None]
    drifting = _add_sensor_offsets(base, grid, clock, cfg.slot_minutes, streams[3])
    _add_noise(base, streams[4])
    stuck, stuck_cells = _stuck_sensors(grid, base, cfg.slot_minutes, streams[5])

    gradients = _window(grid, clock, t_in, t_out, cloud)
    gradients += _hvac(grid, clock, heating)
    gradients += _occupants(grid, occupancy, streams[6])
    events = _anomaly_events(clock, cfg.slot_minutes, streams[7])
    anomaly, caps = _anomaly_fields(grid, events, t_in, t_out, streams[7])
    gradients[stuck] = 0.0  # a stuck sensor reports its frozen value, whatever happens
    anomaly[stuck] = 0.0

    # The maps as stored (float32, each value rounded from its float64 sum as
    # `astype` rounds it), without a float64 copy; the working maps go before labelling.
    maps = _calibrate(base, gradients, anomaly, caps, events > 0, cfg, streams[8])
    del base, gradients, anomaly, stuck
    labels = label_maps(maps, cfg.threshold)
    order = streams[8].permutation(cfg.train)
    meta = _meta(cfg, grid, events, labels, drifting=drifting, stuck=stuck_cells)
    return Dataset(
        X_train=maps[: cfg.train][order],
        y_train=labels[: cfg.train][order],
        # A copy, not a view that would keep every map of the lounge (the training
        # ones twice: shuffled above) for as long as the test maps are used.
        X_test=maps[cfg.train :].copy(),
        y_test=labels[cfg.train :],
        meta=meta,
    )


# --------------------------------------------------------------------------- time and air


def _make_clock(n: int, slot_minutes: int) -> _Clock:
    minutes = np.arange(n, dtype=np.int64) * slot_minutes
    hour = (minutes % 1440) / 60.0
    day = minutes // 1440
    weekend = day % 7 >= 5
    opens = np.where(weekend, 10.0, 8.0)
    closes = np.where(weekend, 18.0, 22.0)
    return _Clock(
        hour=hour,
        day=day,
        is_open=(hour >= opens) & (hour < closes),
        hvac_on=(hour >= opens - 1.0) & (hour < closes),
    )


def _ar1(rng: np.random.Generator, n: int, rho: float, sd: float, width: int = 1) -> np.ndarray:
    """(n, width) stationary AR(1) series: slowly wandering quantities."""
    shocks = rng.normal(0.0, sd * np.sqrt(1.0 - rho * rho), (n, width))
    out = np.empty((n, width))
    state = rng.normal(0.0, sd, width)
    for i in range(n):
        state = rho * state + shocks[i]
        out[i] = state
    return out


def _weather(clock: _Clock, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Outdoor temperature (°C) and cloud cover (0..1) per slot.

    Daily means warm through spring with day-to-day weather on top; clear days swing more.
    """
    days = int(clock.day.max()) + 1
    cloud_day = rng.beta(0.9, 0.9, days)
    mean_day = 12.0 + 6.0 * np.arange(days) / 60.0 + _ar1(rng, days, 0.7, 2.5)[:, 0]
    swing_day = 3.0 + 4.0 * (1.0 - cloud_day)
    t_out = mean_day[clock.day] + swing_day[clock.day] * np.cos(
        2.0 * np.pi * (clock.hour - 15.0) / 24.0
    )
    cloud = np.clip(cloud_day[clock.day] + _ar1(rng, clock.n, 0.8, 0.12)[:, 0], 0.0, 1.0)
    return t_out, cloud


def _occupancy(clock: _Clock) -> np.ndarray:
    """0..1 how busy the lounge is: lunch and early-evening peaks, quieter weekends."""
    h = clock.hour
    profile = 0.25 + 0.75 * np.exp(-0.5 * ((h - 12.5) / 1.3) ** 2)
    profile += 0.6 * np.exp(-0.5 * ((h - 18.5) / 1.5) ** 2)
    weekend = clock.day % 7 >= 5
    return np.where(clock.is_open, np.minimum(profile, 1.0) * np.where(weekend, 0.6, 1.0), 0.0)


def _sun(hour: np.ndarray) -> np.ndarray:
    """0..1 sun elevation proxy: up from 6:00 to 18:30."""
    return np.clip(np.sin(np.pi * (hour - 6.0) / 12.5), 0.0, None)


def _room_air(
    clock: _Clock,
    t_out: np.ndarray,
    occupancy: np.ndarray,
    slot_minutes: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Room air temperature per slot (first-order model) and the HVAC mode (True = heat).

    With the HVAC on the room settles toward the set point within about an hour (plus a
    little overshoot from people); with it off it relaxes over about six hours toward a
    mix of the outdoor temperature and the building mass.
    """
    heating = t_out < 15.0
    k_on = 1.0 - np.exp(-slot_minutes / 45.0)
    k_off = 1.0 - np.exp(-slot_minutes / 360.0)
    target = np.where(
        clock.hvac_on,
        SETPOINT + 0.8 * occupancy + 0.2 * _sun(clock.hour),
        0.55 * SETPOINT + 0.45 * t_out + 1.0,
    )
    rate = np.where(clock.hvac_on, k_on, k_off)
    wobble = _ar1(rng, clock.n, 0.9, 0.15)[:, 0]
    t_in = np.empty(clock.n)
    state = SETPOINT - 1.0
    for i in range(clock.n):
        state += rate[i] * (target[i] - state)
        t_in[i] = state
    return t_in + wobble, heating


# --------------------------------------------------------------------------- fields


def _gauss(coord: np.ndarray, centre: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """exp(-(coord - centre)^2 / 2 sigma^2) with the batch axes of centre in front."""
    c = np.asarray(centre, dtype=np.float64)[..., None]
    s = np.asarray(sigma, dtype=np.float64)[..., None]
    return np.exp(-0.5 * ((coord - c) / s) ** 2)


def _background(grid: _Grid, n: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth, slowly changing deviations: three low-order cosine modes (~0.25 °C each)."""
    modes = []
    for _ in range(3):
        fy, fx = rng.integers(0, 3, 2)
        if fy == fx == 0:
            fx = 1
        py, px = rng.uniform(0.0, 2.0 * np.pi, 2)
        my = np.cos(np.pi * fy * (grid.y + 0.5) / grid.rows + py)
        mx = np.cos(np.pi * fx * (grid.x + 0.5) / grid.cols + px)
        modes.append(np.outer(my, mx))
    amplitude = _ar1(rng, n, 0.97, 0.25, width=3)
    return np.einsum("nk,krc->nrc", amplitude, np.stack(modes))


def _add_sensor_offsets(
    base: np.ndarray, grid: _Grid, clock: _Clock, slot_minutes: int, rng: np.random.Generator
) -> list[dict[str, float]]:
    """Adds to `base` (n, rows, cols) per-sensor calibration offsets, plus a linear drift
    for about 1 % of the sensors; returns a record of the drifting ones.

    In place, with the bits of adding the (n, rows, cols) array of offsets the first
    version made: a drifting sensor's offset and drift are summed first, then added."""
    offsets = rng.normal(0.0, SENSOR_OFFSET, (grid.rows, grid.cols))
    cells = grid.rows * grid.cols
    n_drift = int(rng.binomial(cells, 0.01))
    days = np.arange(clock.n) * slot_minutes / 1440.0
    drifting: list[dict[str, float]] = []
    summed: list[tuple[int, int, np.ndarray]] = []  # a drifting sensor's readings
    for cell in rng.choice(cells, size=n_drift, replace=False):
        r, c = divmod(int(cell), grid.cols)
        onset = float(rng.uniform(0.0, 0.7 * days[-1]))
        rate = float(rng.uniform(0.005, 0.02) * rng.choice((-1.0, 1.0)))  # °C per day
        summed.append((r, c, base[:, r, c] + (offsets[r, c] + rate * np.clip(
            days - onset, 0.0, None))))
        drifting.append({"row": r, "col": c, "onset_day": round(onset, 2),
                         "degC_per_day": round(rate, 4)})
    base += offsets
    for r, c, readings in summed:
        base[:, r, c] = readings
    return drifting


NOISE_CHUNK = 64  # slots whose reading noise is drawn at once (the same draws in order)


def _add_noise(base: np.ndarray, rng: np.random.Generator) -> None:
    """Adds each reading's noise to `base` in place: `rng`'s normal draws of the whole
    (n, rows, cols) at once, drawn a few slots at a time (a generator's draws are the
    same numbers in the same order however they are split)."""
    for start in range(0, len(base), NOISE_CHUNK):
        part = base[start : start + NOISE_CHUNK]
        part += rng.normal(0.0, SENSOR_NOISE, part.shape)


def _stuck_sensors(
    grid: _Grid, base: np.ndarray, slot_minutes: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """A few sensors freeze for 1..6 h, reporting the value they froze at.

    Episodes come at STUCK_PER_SENSOR_DAY (about four in the default data set), so a big
    grid or a long run gets more of them but never a room full of frozen sensors. Writes
    the frozen values into `base`; returns the (n, rows, cols) mask of frozen readings and
    a record of each episode.
    """
    n = base.shape[0]
    mask = np.zeros(base.shape, dtype=bool)
    episodes: list[dict[str, int]] = []
    sensor_days = grid.rows * grid.cols * n * slot_minutes / 1440.0
    for _ in range(int(rng.poisson(STUCK_PER_SENSOR_DAY * sensor_days))):
        r, c = int(rng.integers(0, grid.rows)), int(rng.integers(0, grid.cols))
        start = int(rng.integers(0, n))
        hours = float(rng.uniform(1.0, 6.0))
        stop = min(n, start + max(1, round(hours * 60.0 / slot_minutes)))
        base[start:stop, r, c] = base[start, r, c]
        mask[start:stop, r, c] = True
        episodes.append({"row": r, "col": c, "first_slot": start, "slots": stop - start})
    return mask, episodes


def _window(
    grid: _Grid, clock: _Clock, t_in: np.ndarray, t_out: np.ndarray, cloud: np.ndarray
) -> np.ndarray:
    """The window wall (row 0): sunlit strip by day, cold strip by night.

    The sunlit patch moves along the façade from the east end (right) in the morning to
    the west end (left) in the afternoon; cloud cover takes most of the direct gain away.
    """
    sun = _sun(clock.hour)
    direct = 2.2 * sun * (1.0 - 0.8 * cloud)
    patch_centre = np.interp(clock.hour, [8.0, 17.0], [0.85, 0.15]) * (grid.cols - 1)
    along = 0.35 + 0.65 * _gauss(grid.x, patch_centre, np.full(clock.n, 0.3 * grid.cols + 0.5))
    depth_sun = np.exp(-grid.y / 1.6)
    depth_cold = np.exp(-grid.y / 1.0)
    cold = -0.08 * np.clip(t_in - t_out, 0.0, None) * (1.0 - sun)
    # direct * depth_sun * along + cold * depth_cold, in numpy's order and roundings.
    out = np.empty((clock.n, grid.rows, grid.cols))
    _row_times_col_plus(direct[:, None] * depth_sun[None, :], along,
                        cold[:, None] * depth_cold[None, :], out)
    return out


def _hvac(grid: _Grid, clock: _Clock, heating: np.ndarray) -> np.ndarray:
    """Supply-air plumes under the diffusers while the HVAC runs (cool, or warm if heating).

    Warm supply air rises toward the ceiling, so a heating plume is weaker at sensor height.
    """
    plumes = np.stack(
        [np.outer(_gauss(grid.y, cy, 1.4), _gauss(grid.x, cx, 1.4)) for cy, cx in grid.outlets]
    )
    plumes /= max(1.0, float(plumes.sum(axis=0).max()))  # small rooms: plumes overlap
    strength = np.where(heating, 1.3, -2.2) * clock.hvac_on
    # Each diffuser's damper trims its own flow a little, slot by slot.
    trim = 1.0 + 0.15 * np.sin(np.arange(clock.n)[:, None] * 0.37 + np.arange(len(plumes)))
    return np.einsum("nk,krc->nrc", strength[:, None] * trim, plumes)


def _occupants(grid: _Grid, occupancy: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """People as warm Gaussian blobs (a group at a table: +0.3..0.8 °C over ~1.5 m)."""
    n = len(occupancy)
    expected = occupancy * max(1.0, grid.rows * grid.cols / 40.0)
    most = int(np.ceil(expected.max() * 2.0)) + 3
    count = np.minimum(rng.poisson(expected), most)
    present = np.arange(most)[None, :] < count[:, None]
    amp = rng.uniform(0.3, 0.8, (n, most)) * present
    sigma = rng.uniform(0.6, 1.2, (n, most))
    cy = rng.uniform(0.0, grid.rows - 1, (n, most))
    cx = rng.uniform(0.0, grid.cols - 1, (n, most))
    return _blobs(grid, present, amp, sigma, cy, cx)


def _blobs(grid: _Grid, present: np.ndarray, amp: np.ndarray, sigma: np.ndarray,
           cy: np.ndarray, cx: np.ndarray) -> np.ndarray:
    """(n, rows, cols): the sum of each slot's present blobs, amp * gy gx^T.

    As one (rows, most) x (most, cols) product a slot, with every candidate blob a term:
    BLAS's bits depend on the product's shape, so the shape stays that of the first
    version of the data (BLAS runs on one thread: `generate_lounge`). Only the Gaussians
    of present blobs are worked out, the absent ones being zero on both sides (a zero term
    adds nothing, in any order of summation), and a slot without anyone is zero without a
    product; the slots go in chunks, so that no (n, most, rows) array is ever made.
    """
    n, most = present.shape
    out = np.zeros((n, grid.rows, grid.cols))
    busy = np.flatnonzero(present.any(axis=1))
    for start in range(0, len(busy), OCCUPANT_CHUNK):
        slots = busy[start : start + OCCUPANT_CHUNK]
        here = present[slots]
        gy = np.zeros((len(slots), most, grid.rows))
        gx = np.zeros((len(slots), most, grid.cols))
        s = sigma[slots][here]
        gy[here] = _gauss(grid.y, cy[slots][here], s) * amp[slots][here][:, None]
        gx[here] = _gauss(grid.x, cx[slots][here], s)
        out[slots] = np.matmul(gy.transpose(0, 2, 1), gx)
    return out


# --------------------------------------------------------------------------- anomalies


def _anomaly_events(clock: _Clock, slot_minutes: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) kind per slot: 0 none, else 1 + index into ANOMALIES; events last a few slots.

    Gaps between events are drawn so that about ANOMALY_SHARE of the slots hold one. An
    HVAC fault needs the fans running, so an event that starts while the HVAC is off is a
    heater or a door (left on, left open).
    """
    n = clock.n
    shares = np.array([a[1] for a in ANOMALIES])
    no_fault = np.array([name != "hvac_fault" for name, *_ in ANOMALIES]) * shares
    no_fault /= no_fault.sum()
    durations = np.array([max(1.0, a[2] * 60.0 / slot_minutes) for a in ANOMALIES])
    mean_duration = float(shares @ durations)
    mean_gap = max(1.0, mean_duration * (1.0 - ANOMALY_SHARE) / ANOMALY_SHARE)
    kinds = np.zeros(n, dtype=np.int64)
    t = int(rng.geometric(1.0 / mean_gap)) - 1
    while t < n:
        kind = int(rng.choice(len(ANOMALIES), p=shares if clock.hvac_on[t] else no_fault))
        length = int(rng.geometric(1.0 / durations[kind]))
        kinds[t : t + length] = kind + 1
        t += length + int(rng.geometric(1.0 / mean_gap))
    return kinds


def _anomaly_fields(
    grid: _Grid,
    kinds: np.ndarray,
    t_in: np.ndarray,
    t_out: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit-peak anomaly shapes per slot (zero where no event) and the peak cap per slot.

    Each event keeps its place for its whole duration: a heater next to a socket, a door
    at one of the doors (cold or warm air depending on the outdoor temperature, spilling
    along the wall), a fault at one of the diffusers (unmixed cold or hot supply air).
    """
    n = len(kinds)
    starts = np.flatnonzero(np.diff(kinds, prepend=0) != 0)
    event = np.cumsum(np.isin(np.arange(n), starts)) - 1  # event index of each slot
    m = len(starts)
    socket = np.array(grid.sockets)[rng.integers(0, len(grid.sockets), m)]
    heater_y = np.clip(socket[:, 0] + rng.uniform(-0.3, 0.3, m), 0.0, grid.rows - 1)
    heater_x = np.clip(socket[:, 1] + rng.uniform(-0.3, 0.3, m), 0.0, grid.cols - 1)
    door = rng.integers(0, len(grid.doors), m)
    outlet = rng.integers(0, len(grid.outlets), m)
    fault_sign = np.where(rng.random(m) < 0.6, -1.0, 1.0)
    sharp = rng.uniform(0.6, 0.9, m)

    cy, cx, sy, sx = (np.zeros(n) for _ in range(4))
    sign = np.zeros(n)
    caps = np.zeros(n)
    for k, (name, _, _, cap) in enumerate(ANOMALIES, start=1):
        slots = np.flatnonzero(kinds == k)
        e = event[slots]
        caps[slots] = cap
        if name == "heater":
            cy[slots], cx[slots] = heater_y[e], heater_x[e]
            sy[slots] = sx[slots] = sharp[e]
            sign[slots] = 1.0
        elif name == "door":
            where = [grid.doors[int(d)] for d in door[e]]
            cy[slots] = [w[0] for w in where]
            cx[slots] = [w[1] for w in where]
            back = np.array([w[2] == "back" for w in where], dtype=bool)
            sy[slots] = np.where(back, 1.3, sharp[e])  # deeper into the room than wide
            sx[slots] = np.where(back, sharp[e], 1.3)
            sign[slots] = np.where(t_out[slots] > t_in[slots], 1.0, -1.0)
            # Air from outside cannot be colder (or warmer) than outside.
            gap = np.abs(t_out[slots] - t_in[slots])
            caps[slots] = np.clip(0.8 * gap, 1.5, cap)
        else:
            spots = [grid.outlets[int(o)] for o in outlet[e]]
            cy[slots] = [s[0] for s in spots]
            cx[slots] = [s[1] for s in spots]
            sy[slots] = sx[slots] = sharp[e]
            sign[slots] = fault_sign[e]
    active = kinds > 0
    sy[~active] = sx[~active] = 1.0
    # gauss_y gauss_x * (sign * active), in numpy's order and roundings.
    out = np.empty((n, grid.rows, grid.cols))
    _outer_times(_gauss(grid.y, cy, sy), _gauss(grid.x, cx, sx), sign * active, out)
    return out, caps


@njit(**_JIT)
def _row_times_col_plus(p: np.ndarray, q: np.ndarray, r: np.ndarray, out: np.ndarray) -> None:
    """out[i, y, x] = p[i, y] * q[i, x] + r[i, y], each operation rounded on its own."""
    n, rows, cols = out.shape
    for i in range(n):
        for y in range(rows):
            for x in range(cols):
                out[i, y, x] = p[i, y] * q[i, x] + r[i, y]


@njit(**_JIT)
def _outer_times(p: np.ndarray, q: np.ndarray, m: np.ndarray, out: np.ndarray) -> None:
    """out[i, y, x] = p[i, y] * q[i, x] * m[i], each operation rounded on its own."""
    n, rows, cols = out.shape
    for i in range(n):
        for y in range(rows):
            for x in range(cols):
                out[i, y, x] = p[i, y] * q[i, x] * m[i]


# --------------------------------------------------------------------------- calibration


def _calibrate(
    base: np.ndarray,
    gradients: np.ndarray,
    anomaly: np.ndarray,
    caps: np.ndarray,
    anomalous: np.ndarray,
    cfg: DataConfig,
    rng: np.random.Generator,
) -> np.ndarray:
    """The final maps (float32, as stored): base plus the gradients and the anomaly at
    their calibrated strengths.

    In anomaly slots the ordinary gradients are first set to a calm level (below the band),
    so the anomaly is the sharpest feature and carries the target; in the other slots the
    gradients carry it. What each carrier can reach at its cap (`reach`) and what the map
    shows without it (`floor`) decide which targets are attainable (`_targets`). The caps
    suit the seed's 3 °C rule; a larger threshold widens them in proportion, since a rule
    about 10 °C differences can only be exercised by stronger features.
    """
    thr = float(cfg.threshold)
    widen = max(1.0, thr / 3.0)
    gradient_cap, caps = GRADIENT_CAP * widen, caps * widen
    calm = rng.uniform(0.3 * thr, max(thr - NEAR_BAND, 0.3 * thr), len(anomalous))
    # Each map's figures only where they are used: anomaly slots with their gradients
    # calmed, the others with theirs. `_Maps` works out base + s1 f1 + s2 f2 cell by
    # cell, without making it; each figure is an entry of `np.where` as before.
    anomalies, normal = np.flatnonzero(anomalous), np.flatnonzero(~anomalous)
    plain = _Maps(base, gradients)  # the base alone
    s_calm = _scale_to_target(plain, gradients, calm, gradient_cap, anomalies)
    calmed = _Maps(base, gradients, s_calm)
    floor = np.where(anomalous, _max_diff(calmed, anomalies), _max_diff(plain, normal))
    reach = np.where(
        anomalous,
        _max_diff(_Maps(base, gradients, s_calm, anomaly, caps), anomalies),
        _max_diff(_Maps(base, gradients, np.full(len(anomalous), gradient_cap)), normal),
    )
    splits = [slice(0, cfg.train), slice(cfg.train, cfg.train + cfg.test)]
    target = _targets(anomalous, floor, reach, thr, splits, rng)
    s_normal = _scale_to_target(plain, gradients, target, gradient_cap, normal)
    s_gradients = np.where(anomalous, s_calm, s_normal)
    s_anomaly = np.where(anomalous, _scale_to_target(calmed, anomaly, target, caps, anomalies),
                         0.0)
    return _Maps(base, gradients, s_gradients, anomaly, s_anomaly).made(np.float32)


def _targets(
    anomalous: np.ndarray,
    floor: np.ndarray,
    reach: np.ndarray,
    threshold: float,
    splits: list[slice],
    rng: np.random.Generator,
) -> np.ndarray:
    """Target largest neighbour difference per slot, only where it can be reached.

    `floor` is what a map shows with its carrier (the gradients, or the anomaly) at zero,
    `reach` what it shows with the carrier at its cap; a target in between is met exactly.
    A slot becomes positive with probability P_POSITIVE_IF_* when its carrier can lift it
    past the band (or when its floor is over the threshold anyway). Then, in each split,
    quotas rather than coin flips send NEAR_POSITIVES of the positives into [thr, thr + 0.6)
    and NEAR_NEGATIVES of the negatives into [thr - 0.6, thr), counting the maps whose floor
    lies there already, so the acceptance fractions hold for every seed. When too few
    negatives can reach the band (e.g. slots only at night), some anomalies are weakened
    into near misses. The rest aim at an exponential tail above the band (positives) or a
    calm level in [0.3 thr, thr - 0.6) (negatives).
    """
    n = len(anomalous)
    thr, w = float(threshold), NEAR_BAND
    margin = 0.005 * w  # keeps float32 rounding from moving a map across a band edge
    band_lo = max(thr - w, 0.0)
    wants = rng.random(n) < np.where(anomalous, P_POSITIVE_IF_ANOMALY, P_POSITIVE_IF_NORMAL)
    positive = (wants & (reach >= thr + w)) | (floor >= thr)
    near = np.zeros(n, dtype=bool)
    for part in splits:
        positive[part], near[part] = _band_quotas(
            positive[part], anomalous[part], floor[part], reach[part], thr, rng
        )
    tail = thr + w + np.minimum(rng.exponential(TAIL_MEAN, n), TAIL_MAX - w)
    calm = rng.uniform(0.3 * thr, max(band_lo, 0.3 * thr), n)
    band_top = np.clip(np.minimum(thr, reach) - margin, band_lo + margin, None)
    near_miss = band_lo + margin + rng.random(n) * (band_top - band_lo - margin)
    near_hit = rng.uniform(thr + margin, thr + w - margin, n)
    return np.where(positive, np.where(near, near_hit, tail), np.where(near, near_miss, calm))


def _band_quotas(
    positive: np.ndarray,
    anomalous: np.ndarray,
    floor: np.ndarray,
    reach: np.ndarray,
    thr: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """For one split: the final positives and which slots aim into the band next to thr."""
    w = NEAR_BAND
    band_lo = max(thr - w, 0.0)
    positive = positive.copy()
    forced = floor >= thr
    # A quiet stretch (few anomaly events) would leave the split short of positives.
    short = math.ceil(MIN_POSITIVES * len(positive)) - np.count_nonzero(positive)
    if short > 0:
        able = ~positive & (reach >= thr + w)
        first = _pick(able & anomalous, short, rng)
        positive |= first | _pick(able & ~anomalous, short - np.count_nonzero(first), rng)
    neg_anyway = ~positive & (floor >= band_lo)
    neg_able = ~positive & ~neg_anyway & (reach > band_lo + 0.01 * w)
    shortfall = NEAR_NEGATIVES * np.count_nonzero(~positive) - np.count_nonzero(
        neg_anyway | neg_able
    )
    if shortfall > 0:  # weaken anomalies into near misses, keeping enough positives
        spare = np.count_nonzero(positive) - math.ceil(MIN_POSITIVES * len(positive))
        convert = min(math.ceil(shortfall / (1.0 - NEAR_NEGATIVES)), max(spare, 0))
        weakened = _pick(positive & ~forced & anomalous & (floor < band_lo), convert, rng)
        positive &= ~weakened
        neg_able |= weakened
    neg_need = math.ceil(NEAR_NEGATIVES * np.count_nonzero(~positive))
    near = _pick(neg_able, neg_need - np.count_nonzero(neg_anyway), rng)
    pos_anyway = forced & (floor < thr + w)  # aimed into the band, they stay put there
    pos_need = math.ceil(NEAR_POSITIVES * np.count_nonzero(positive))
    near |= pos_anyway | _pick(positive & ~forced, pos_need - np.count_nonzero(pos_anyway), rng)
    return positive, near


def _pick(mask: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """A random subset of `count` (at most all) of the True entries of `mask`."""
    chosen = np.zeros(len(mask), dtype=bool)
    where = np.flatnonzero(mask)
    count = int(min(max(count, 0), len(where)))
    chosen[rng.choice(where, size=count, replace=False)] = True
    return chosen


@dataclass(frozen=True)
class _Maps:
    """Maps `base + s1 f1 + s2 f2` (per map scales s1, s2; zero when not given), in
    numpy's order of operations and roundings: (base + s1 * f1) + s2 * f2. The kernels
    work them out cell by cell instead of making (n, rows, cols) arrays. Numba rounds
    each multiplication and addition on its own, as numpy does: without `fastmath` it
    gives LLVM no fast-math flag, contraction into fused multiply-adds included (Numba
    docs, "Performance Tips: Fastmath"). A zero scale adds a zero, which leaves a
    value as it was (but for the sign of a zero, which no difference of two cells sees)."""

    base: np.ndarray
    f1: np.ndarray
    s1: np.ndarray | None = None
    f2: np.ndarray | None = None
    s2: np.ndarray | None = None

    def scales(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(self.base)
        zero = np.zeros(n)
        return (self.base, self.f1, zero if self.s1 is None else self.s1,
                self.f1 if self.f2 is None else self.f2, zero if self.s2 is None else self.s2)

    def made(self, dtype: type = np.float64) -> np.ndarray:
        """The maps themselves (in float32: each value rounded from its float64 sum,
        as `astype` rounds it)."""
        out = np.empty(self.base.shape, dtype)
        _made(*self.scales(), out)
        return out


def _max_diff(maps: _Maps, rows: np.ndarray) -> np.ndarray:
    """Float64 largest neighbour difference of each map in `rows` (0 without neighbour
    pairs); 0 for the maps not in `rows`, which are not looked at."""
    out = np.zeros(len(maps.base))
    _largest_diffs(*maps.scales(), np.asarray(rows, dtype=np.int64), out)
    return out


def _scale_to_target(
    maps: _Maps, feature: np.ndarray, target: np.ndarray, cap: float | np.ndarray,
    rows: np.ndarray,
) -> np.ndarray:
    """For each map in `rows`, the scale s in [0, cap] with max_neighbour_diff(map + s
    feature) = target; min(1, cap) for the maps not in `rows`, which are not looked at.

    For one neighbour pair with map difference a and feature difference b, |a + s b| <=
    target holds up to s = (target - sign(b) a) / |b|; the largest difference is convex in
    s, so the smallest of these bounds over all pairs is exactly where it reaches the target.
    When the map alone already exceeds the target the scale is 0; when the feature has no
    differences (a 1 x 1 grid, a zero feature) it is 1, i.e. nominal strength.
    """
    bound = np.full(len(maps.base), np.inf)
    _bounds(*maps.scales(), feature, target, np.asarray(rows, dtype=np.int64), bound)
    s = np.where(np.isfinite(bound), bound, 1.0)
    return np.clip(s, 0.0, cap)


@njit(**_JIT)
def _value(base: np.ndarray, f1: np.ndarray, s1: float, f2: np.ndarray, s2: float, i: int,
           y: int, x: int) -> float:
    """One cell of a `_Maps` map, rounded as numpy rounds it."""
    return (base[i, y, x] + s1 * f1[i, y, x]) + s2 * f2[i, y, x]


@njit(**_JIT)
def _made(base: np.ndarray, f1: np.ndarray, s1: np.ndarray, f2: np.ndarray, s2: np.ndarray,
          out: np.ndarray) -> None:
    n, rows, cols = base.shape
    for i in range(n):
        for y in range(rows):
            for x in range(cols):
                out[i, y, x] = _value(base, f1, s1[i], f2, s2[i], i, y, x)


@njit(**_JIT)
def _largest_diffs(base: np.ndarray, f1: np.ndarray, s1: np.ndarray, f2: np.ndarray,
                   s2: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i]: the largest |difference| of two neighbouring cells of map i, i in rows."""
    _, n_rows, n_cols = base.shape
    for i in rows:
        largest = 0.0
        for y in range(n_rows):
            for x in range(n_cols):
                here = _value(base, f1, s1[i], f2, s2[i], i, y, x)
                if y + 1 < n_rows:
                    largest = max(largest, abs(
                        _value(base, f1, s1[i], f2, s2[i], i, y + 1, x) - here))
                if x + 1 < n_cols:
                    largest = max(largest, abs(
                        _value(base, f1, s1[i], f2, s2[i], i, y, x + 1) - here))
        out[i] = largest


@njit(**_JIT)
def _bound(target: float, a: float, b: float, smallest: float) -> float:
    """The pair's bound (target - sign(b) a) / |b| if it moves, against the smallest."""
    if b > 1e-9:
        return min(smallest, (target - a) / b)
    if b < -1e-9:
        return min(smallest, (target + a) / -b)
    return smallest


@njit(**_JIT)
def _bounds(base: np.ndarray, f1: np.ndarray, s1: np.ndarray, f2: np.ndarray, s2: np.ndarray,
            feature: np.ndarray, target: np.ndarray, rows: np.ndarray,
            out: np.ndarray) -> None:
    """out[i]: the smallest bound over the pairs of map i whose feature moves (inf if
    none does), i in rows."""
    _, n_rows, n_cols = base.shape
    for i in rows:
        smallest = np.inf
        for y in range(n_rows):
            for x in range(n_cols):
                here = _value(base, f1, s1[i], f2, s2[i], i, y, x)
                if y + 1 < n_rows:
                    smallest = _bound(
                        target[i], _value(base, f1, s1[i], f2, s2[i], i, y + 1, x) - here,
                        feature[i, y + 1, x] - feature[i, y, x], smallest)
                if x + 1 < n_cols:
                    smallest = _bound(
                        target[i], _value(base, f1, s1[i], f2, s2[i], i, y, x + 1) - here,
                        feature[i, y, x + 1] - feature[i, y, x], smallest)
        out[i] = smallest


# --------------------------------------------------------------------------- metadata


def _meta(
    cfg: DataConfig,
    grid: _Grid,
    kinds: np.ndarray,
    labels: np.ndarray,
    drifting: list[dict[str, float]],
    stuck: list[dict[str, int]],
) -> dict[str, object]:
    """The JSON-able record of how the data set was made (kept in the .npz)."""
    train, test = slice(0, cfg.train), slice(cfg.train, None)
    end = START + timedelta(minutes=cfg.slot_minutes * (cfg.train + cfg.test))

    def events(part: slice) -> dict[str, int]:
        return {name: int((kinds[part] == k).sum()) for k, (name, *_) in enumerate(ANOMALIES, 1)}

    return {
        "generator": "meshdl.data.lounge.generate_lounge",
        "generator_version": GENERATOR_VERSION,
        "config": cfg.model_dump(),
        "seed": cfg.seed,
        "slot_minutes": cfg.slot_minutes,
        "threshold": cfg.threshold,
        "start": START.isoformat(timespec="minutes"),
        "end": end.isoformat(timespec="minutes"),
        "split": "chronological: first `train` slots are train (shuffled with the seed), "
        "the last `test` slots are test (in time order)",
        "counts": {
            "train": cfg.train,
            "test": cfg.test,
            "train_positives": int(labels[train].sum()),
            "test_positives": int(labels[test].sum()),
        },
        "anomaly_slots": {"train": events(train), "test": events(test)},
        "layout": {
            "window_wall": "row 0",
            "outlets": [[round(y, 2), round(x, 2)] for y, x in grid.outlets],
            "doors": [[round(y, 2), round(x, 2)] for y, x, _ in grid.doors],
        },
        "drifting_sensors": drifting,
        "stuck_sensor_episodes": stuck,
    }
