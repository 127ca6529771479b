"""Sensor drivers of a node (`meshdl.nodes.sensors`): where a cell's temperature comes from.

Every driver is a `Sensor`: a blocking `read() -> float` in °C that raises `SensorError`
for a reading it cannot vouch for (a failed checksum, a power-on value, an I/O error,
a gap in a log, a value outside the sensor's physical range: `valid_c`). `read_with_retry`
runs it off the event loop, retries with backoff, bounds each attempt with a timeout,
checks the value once more (finite, inside `valid_c`), and returns a `Reading` whose `ok`
is False instead of a number when nothing trustworthy came back: a bad reading is never
sent as a value.

Sources whose value is a function of the time slot (a replayed log, the synthetic room)
are also `SlotSensor`s: `read_slot(slot)` gives the value of that slot, the same however
often it is asked (a retry, a timed-out read finishing late), so a bad value costs its
own slot and never moves the source ahead of the clock. Their bad values raise
`SlotReadingError`, which is not retried: reading again gives the same.

    DS18B20(device_dir)        1-wire, through the kernel's w1_slave file
    BME280(bus=1, address=0x76) I2C via smbus2 (`pip install 'meshdl[sensors]'`)
    ReplaySensor(path, cell)   one cell's column of a CSV/NPZ log, slot after slot
    SyntheticSensor(cell, seed) plausible room temperatures, deterministic

`sensor_from_spec` reads the `--sensor` values of `meshdl node run`:
`ds18b20:/sys/bus/w1/devices/28-xxxx`, `bme280[:BUS[:ADDRESS]]`, `replay:PATH`,
`synthetic[:SEED]`.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from meshdl.errors import MeshdlError, UsageError
from meshdl.protocol.topology import Cell

__all__ = [
    "BME280",
    "BME280_RANGE",
    "DS18B20",
    "DS18B20_RANGE",
    "ROOM_RANGE",
    "Reading",
    "ReplaySensor",
    "Sensor",
    "SensorError",
    "SlotReadingError",
    "SlotSensor",
    "SyntheticSensor",
    "ValidRange",
    "read_with_retry",
    "sensor_from_spec",
]


class SensorError(MeshdlError):
    """A reading that cannot be trusted, or a sensor that cannot be reached."""


class SlotReadingError(SensorError):
    """A slot-addressed source's value of a slot is bad for good (a gap or an impossible
    value in a log): reading it again gives the same, so it is not retried."""


@dataclass(frozen=True)
class ValidRange:
    """The temperatures (°C, inclusive) a source can physically report: anything outside
    is a fault (a glitch, a corrupt log line), not weather, and is no reading."""

    low_c: float
    high_c: float

    def check(self, value: float, where: str,
              error: type[SensorError] | None = None) -> float:
        """`value`, or `error` (default `SensorError`) when it is NaN, inf or outside."""
        if not (math.isfinite(value) and self.low_c <= value <= self.high_c):
            raise (error or SensorError)(
                f"{where}: {value:g} °C is outside the sensor's range "
                f"{self.low_c:g}..{self.high_c:g} °C")
        return value


# Maxim Integrated DS18B20 datasheet (19-7487, rev. 6): "Measures Temperatures from
# -55°C to +125°C".
DS18B20_RANGE = ValidRange(-55.0, 125.0)
# Bosch BME280 datasheet (BST-BME280-DS002), table 1: operating range -40..+85 °C.
BME280_RANGE = ValidRange(-40.0, 85.0)
# Replayed logs and the synthetic room describe the air of a room: -30 °C (an unheated
# room in a continental winter) to 60 °C (a sun-baked attic) is generous for any real
# one; beyond it a logged value is a fault (3e38 from an uninitialised register, a unit
# mix-up), never a reading to alert on. Pass `valid_c` to the driver for another range.
ROOM_RANGE = ValidRange(-30.0, 60.0)
# What `read_with_retry` holds a sensor to that declares no `valid_c` (a driver of the
# caller's own): the widest range of the drivers here.
ANY_SENSOR_RANGE = DS18B20_RANGE


@runtime_checkable
class Sensor(Protocol):
    """A temperature source: `read()` blocks, returns °C or raises `SensorError`.
    A driver may say what it can physically report in a `valid_c: ValidRange`."""

    def read(self) -> float: ...


@runtime_checkable
class SlotSensor(Protocol):
    """A source whose value is a function of the time slot: `read_slot(slot)` returns
    the value of slot `slot` (a Unix-clock slot number, see `meshdl.nodes.live`), the
    same on every call for that slot, or raises `SensorError`."""

    def read_slot(self, slot: int) -> float: ...


@dataclass(frozen=True)
class Reading:
    """The outcome of `read_with_retry`: a finite value with `ok`, or why there is none."""

    value: float | None
    ok: bool
    error: str | None = None


async def read_with_retry(
    sensor: Sensor, attempts: int = 3, backoff_s: float = 0.5, timeout_s: float = 2.0,
    slot: int | None = None,
) -> Reading:
    """Read in a worker thread, up to `attempts` times, waiting backoff_s * 2**i between.

    With `slot`, a `SlotSensor` is asked for that slot's value (`read_slot`), so that
    every attempt reads the same slot; other sensors, and every sensor without `slot`,
    are `read()`. An attempt fails on `SensorError`, `OSError`, a non-finite value, a
    value outside the sensor's `valid_c` (`ANY_SENSOR_RANGE` if it names none), or no
    answer within `timeout_s`; a `SlotReadingError` ends the attempts (it would come
    again). A timed-out read cannot be cancelled (it is blocked in the kernel or a bus
    call); its thread finishes in the background and its value is dropped. Any other
    exception is a bug in the driver and propagates.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if slot is not None and isinstance(sensor, SlotSensor):
        def read() -> float:
            return sensor.read_slot(slot)
    else:
        read = sensor.read
    valid = getattr(sensor, "valid_c", None)
    valid = valid if isinstance(valid, ValidRange) else ANY_SENSOR_RANGE
    error = "no attempt made"
    for attempt in range(attempts):
        try:
            value = await asyncio.wait_for(asyncio.to_thread(read), timeout_s)
        except asyncio.TimeoutError:
            error = f"no reading within {timeout_s:g} s"
        except SlotReadingError as exc:
            return Reading(None, False, str(exc))
        except (SensorError, OSError) as exc:
            error = str(exc) or type(exc).__name__
        else:
            if isinstance(value, (int, float)) and math.isfinite(value):
                try:
                    return Reading(float(valid.check(float(value), repr(sensor))), True, None)
                except SensorError as exc:
                    error = str(exc)
            else:
                error = f"non-finite reading {value!r}"
        if attempt + 1 < attempts:
            await asyncio.sleep(backoff_s * 2**attempt)
    return Reading(None, False, f"{error} (after {attempts} attempt(s))")


# --------------------------------------------------------------------------- DS18B20

_CRC_LINE = re.compile(r"^((?:[0-9a-f]{2} ){9}): crc=([0-9a-f]{2}) (YES|NO)$")
_T_LINE = re.compile(r"^(?:[0-9a-f]{2} ){9}t=(-?\d+)$")
POWER_ON_MILLI_C = 85000  # the scratchpad's reset value: no conversion happened


class DS18B20:
    """A DS18B20 on the 1-wire bus, read through the kernel's `w1_slave` file.

    `device_dir` is `/sys/bus/w1/devices/28-xxxxxxxxxxxx` (or the w1_slave file itself).
    Reading the file makes the kernel run a conversion (~750 ms at 12 bits) and returns
    the 9 scratchpad bytes twice:

        72 01 4b 46 7f ff 0e 10 57 : crc=57 YES
        72 01 4b 46 7f ff 0e 10 57 t=23125

    Rejected: a failed CRC (`NO`: noise on a long bus), 85 °C (the power-on value: the
    conversion did not run, typically too little power in parasite mode), an all-zero
    scratchpad (a shorted bus passes the CRC with zeros), values outside -55..125 °C,
    and anything else that does not look like the above.
    """

    valid_c = DS18B20_RANGE

    def __init__(self, device_dir: str | Path) -> None:
        path = Path(device_dir)
        self.path = path if path.name == "w1_slave" else path / "w1_slave"

    def __repr__(self) -> str:
        return f"DS18B20({str(self.path.parent)!r})"

    def read(self) -> float:
        try:
            text = self.path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            raise SensorError(f"no DS18B20 at {self.path.parent} (is 1-wire enabled: "
                              "dtoverlay=w1-gpio, and the sensor wired?)") from None
        except OSError as exc:
            raise SensorError(f"DS18B20 {self.path.parent}: {exc.strerror or exc}") from None
        return parse_w1_slave(text, str(self.path.parent))


def parse_w1_slave(text: str, where: str = "DS18B20") -> float:
    """°C from the text of a w1_slave file (see `DS18B20`), or `SensorError`."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if len(lines) != 2:
        raise SensorError(f"{where}: expected 2 lines in w1_slave, got {len(lines)}")
    crc = _CRC_LINE.match(lines[0])
    temp = _T_LINE.match(lines[1])
    if crc is None or temp is None:
        raise SensorError(f"{where}: malformed w1_slave text {text.strip()[:80]!r}")
    if crc[3] != "YES":
        raise SensorError(f"{where}: CRC check failed (crc={crc[2]} NO): noise on the bus")
    if crc[1].split() == ["00"] * 9:
        raise SensorError(f"{where}: all-zero scratchpad (shorted or unpowered bus)")
    milli = int(temp[1])
    if milli == POWER_ON_MILLI_C:
        raise SensorError(f"{where}: 85 °C power-on value (no conversion: check the "
                          "sensor's power and pull-up)")
    return DS18B20_RANGE.check(milli / 1000.0, where)


# --------------------------------------------------------------------------- BME280


class _I2CBus(Protocol):
    """What BME280 uses of `smbus2.SMBus`."""

    def read_byte_data(self, i2c_addr: int, register: int) -> int: ...
    def write_byte_data(self, i2c_addr: int, register: int, value: int) -> None: ...
    def read_i2c_block_data(self, i2c_addr: int, register: int, length: int) -> list[int]: ...
    def close(self) -> None: ...


class BME280:
    """A Bosch BME280 over I2C, temperature only, one forced-mode measurement per read.

    `bus` is the I2C bus number (/dev/i2c-1 on a Raspberry Pi) or an open SMBus-like
    object. On open it checks the chip id (0x60; a BMP280 answers 0x58) and reads the
    temperature calibration dig_T1..dig_T3 (0x88..0x8D). Each `read()` starts a forced
    measurement (temperature x1, pressure and humidity skipped), waits for it, reads
    the 20-bit raw value and applies the datasheet's 32-bit integer compensation.
    """

    CHIP_ID = 0x60
    REG_CALIB_T = 0x88  # dig_T1 u16, dig_T2 s16, dig_T3 s16, little-endian
    REG_CHIP_ID = 0xD0
    REG_CTRL_HUM = 0xF2
    REG_STATUS = 0xF3
    REG_CTRL_MEAS = 0xF4
    REG_TEMP = 0xFA  # temp_msb, temp_lsb, temp_xlsb
    FORCED_T1 = 0b001_000_01  # osrs_t x1, osrs_p skipped, forced mode
    STATUS_MEASURING = 0x08
    SKIPPED = 0x80000  # the raw value when no temperature was measured
    MEASURE_TIMEOUT_S = 0.1  # datasheet: at most 1.25 + 2.3 ms with osrs_t x1
    valid_c = BME280_RANGE

    def __init__(self, bus: int | _I2CBus = 1, address: int = 0x76) -> None:
        self.address = address
        self._where = f"BME280 at {address:#04x} on " + (
            f"/dev/i2c-{bus}" if isinstance(bus, int) else "the given bus")
        self.bus: _I2CBus = _open_smbus(bus) if isinstance(bus, int) else bus
        try:
            chip = self.bus.read_byte_data(address, self.REG_CHIP_ID)
            if chip != self.CHIP_ID:
                hint = " (a BMP280: no humidity, other id)" if chip == 0x58 else ""
                raise SensorError(f"{self._where}: chip id {chip:#04x}, expected "
                                  f"{self.CHIP_ID:#04x}{hint}")
            self.dig_t = calibration_t(bytes(
                self.bus.read_i2c_block_data(address, self.REG_CALIB_T, 6)))
            # ctrl_hum only takes effect with the next ctrl_meas write: skip humidity.
            self.bus.write_byte_data(address, self.REG_CTRL_HUM, 0x00)
        except OSError as exc:
            self.close()
            raise SensorError(f"{self._where}: {exc.strerror or exc} (wired? i2c "
                              "enabled? try `i2cdetect -y 1`)") from None
        except SensorError:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"BME280({self._where})"

    def read(self) -> float:
        try:
            self.bus.write_byte_data(self.address, self.REG_CTRL_MEAS, self.FORCED_T1)
            deadline = time.monotonic() + self.MEASURE_TIMEOUT_S
            time.sleep(0.002)
            while self.bus.read_byte_data(self.address, self.REG_STATUS) & \
                    self.STATUS_MEASURING:
                if time.monotonic() > deadline:
                    raise SensorError(f"{self._where}: measurement did not finish")
                time.sleep(0.001)
            msb, lsb, xlsb = self.bus.read_i2c_block_data(self.address, self.REG_TEMP, 3)
        except OSError as exc:
            raise SensorError(f"{self._where}: {exc.strerror or exc}") from None
        adc_t = (msb << 12) | (lsb << 4) | (xlsb >> 4)
        if adc_t == self.SKIPPED:
            raise SensorError(f"{self._where}: no temperature was measured")
        return BME280_RANGE.check(compensate_t(adc_t, *self.dig_t), self._where)

    def close(self) -> None:
        close = getattr(self.bus, "close", None)
        if close is not None:
            close()


def _open_smbus(bus: int) -> Any:
    try:
        from smbus2 import SMBus
    except ImportError:
        raise SensorError("the BME280 driver needs smbus2: pip install 'meshdl[sensors]'"
                          ) from None
    try:
        return SMBus(bus)
    except OSError as exc:
        raise SensorError(f"cannot open /dev/i2c-{bus}: {exc.strerror or exc} (enable I2C "
                          "with raspi-config; is the user in the i2c group?)") from None


def calibration_t(raw: bytes) -> tuple[int, int, int]:
    """dig_T1 (unsigned), dig_T2, dig_T3 (signed) from the 6 bytes at 0x88."""
    if len(raw) != 6:
        raise SensorError(f"BME280 calibration: expected 6 bytes, got {len(raw)}")
    t1 = int.from_bytes(raw[0:2], "little", signed=False)
    t2 = int.from_bytes(raw[2:4], "little", signed=True)
    t3 = int.from_bytes(raw[4:6], "little", signed=True)
    if t1 == 0 or t1 == 0xFFFF:
        raise SensorError(f"BME280 calibration looks blank (dig_T1 = {t1:#06x})")
    return t1, t2, t3


def compensate_t(adc_t: int, dig_t1: int, dig_t2: int, dig_t3: int) -> float:
    """°C from the raw 20-bit value: the datasheet's BME280_compensate_T_int32.

    Python's >> on negative ints floors, as the reference's arithmetic shift on
    two's-complement int32 does; the intermediate values fit int32 for every
    calibration the chip can hold, so the result is bit-exact with Bosch's C code.
    """
    var1 = (((adc_t >> 3) - (dig_t1 << 1)) * dig_t2) >> 11
    var2 = (((((adc_t >> 4) - dig_t1) * ((adc_t >> 4) - dig_t1)) >> 12) * dig_t3) >> 14
    t_fine = var1 + var2
    return ((t_fine * 5 + 128) >> 8) / 100.0


# --------------------------------------------------------------------------- replay


class ReplaySensor:
    """One cell's readings from a sensor log (CSV/NPZ, `meshdl.data.datasets.load_log`), in order.

    Each `read()` returns the next row of the log; `read_slot(slot)` the row of that
    time slot, the same row however often a slot is read. Looping (the default), the
    row of slot s is s mod the log's length: a function of the slot number alone, so
    that every host of a mesh, and a host started again, reads the same row for the
    same slot (issue 43: a restarted host started again at row 0 and the maps mixed rows
    of different times); a slot the host missed skips its row. Without `loop`, the
    first slot asked for is the row `read()` would give next and each later slot the row
    as many rows on, until the log ends. A missing reading (NaN or inf in the log) or a
    value outside `valid_c` (`ROOM_RANGE` unless given) raises `SlotReadingError` for
    that slot, as a dead sensor would. At the end it starts over (`loop=True`) or raises.
    """

    def __init__(self, path: str | Path, cell: Cell, loop: bool = True,
                 valid_c: ValidRange = ROOM_RANGE) -> None:
        from meshdl.data.datasets import load_log

        log = load_log(path)
        row, col = cell
        if not (0 <= row < log.rows and 0 <= col < log.cols):
            raise SensorError(f"replay {path}: cell {cell} is outside the log's "
                              f"{log.rows} x {log.cols} grid")
        self.path = Path(path)
        self.cell = cell
        self.values = log.maps[:, row, col].astype(np.float64)
        self.timestamps = log.timestamps
        self.loop = loop
        self.valid_c = valid_c
        self.position = 0  # the row `read()` gives next
        self.first_slot: int | None = None  # the slot of row 0 (`read_slot`)
        self._lock = threading.Lock()  # a timed-out read may still run beside a retry

    def __repr__(self) -> str:
        return f"ReplaySensor({str(self.path)!r}, {self.cell})"

    def read(self) -> float:
        with self._lock:
            row = self._row(self.position)
            self.position = row + 1
        return self._value(row)

    def read_slot(self, slot: int) -> float:
        with self._lock:
            if self.first_slot is None:
                # Looping: slot s is row s mod n, whoever reads it and whenever it started.
                n = len(self.values)
                self.first_slot = slot - slot % n if self.loop and n else \
                    slot - self.position
            if slot < self.first_slot:
                raise SlotReadingError(f"replay {self.path}: slot {slot} comes before the "
                                       "replay's first slot (the clock went back)")
            row = self._row(slot - self.first_slot)
            self.position = row + 1
        return self._value(row)

    def _row(self, index: int) -> int:
        """The log row of the `index`-th slot since the start (looping), or an error."""
        n = len(self.values)
        if index >= n:
            if not self.loop or n == 0:
                raise SlotReadingError(f"replay {self.path}: the log has no more slots")
            index %= n
        return index

    def _value(self, row: int) -> float:
        value = float(self.values[row])
        if math.isnan(value):
            raise SlotReadingError(f"replay {self.path}: no reading of cell {self.cell} "
                                   f"at {self.timestamps[row]}")
        return self.valid_c.check(value, f"replay {self.path}: cell {self.cell} at "
                                  f"{self.timestamps[row]}", SlotReadingError)


# --------------------------------------------------------------------------- synthetic


class SyntheticSensor:
    """Plausible readings of one cell of the lounge, a pure function of (cell, seed).

    Read k is the room at slot k (30 minutes apart from `meshdl.data.lounge.START`): the
    room air follows the set point while the HVAC runs (7:00-22:00) and drifts toward
    a cooler night temperature otherwise, with a slow wobble shared by the whole room
    (so neighbouring cells agree); the cell adds its own fixed offset, a gentle gradient
    from the window wall (row 0: warm in the afternoon sun, cool at night) and reading
    noise. Every sensor of a mesh started with one seed describes the same room.
    """

    def __init__(self, cell: Cell, seed: int = 0, slot_minutes: int = 30,
                 valid_c: ValidRange = ROOM_RANGE) -> None:
        self.cell = cell
        self.seed = seed
        self.slot_minutes = slot_minutes
        self.valid_c = valid_c
        self.first_slot: int | None = None  # the slot of read 0 (`read_slot`)
        self._lock = threading.Lock()  # a timed-out read may still run beside a retry
        self._start()

    def _start(self) -> None:
        """The room before its first slot (again: the readings are a pure function)."""
        from meshdl.data.lounge import SENSOR_NOISE, SENSOR_OFFSET, SETPOINT

        seed, cell = self.seed, self.cell
        self._setpoint = SETPOINT
        self._noise_sd = SENSOR_NOISE
        self._room_rng = np.random.default_rng([seed, 0xA11])  # shared by every cell
        self._cell_rng = np.random.default_rng([seed, 0xCE11, cell[0], cell[1]])
        self._offset = float(self._cell_rng.normal(0.0, SENSOR_OFFSET))
        self._air = SETPOINT - 1.0
        self._wobble = 0.0
        self.slot = 0  # reads made: the next read is of slot `slot`
        self._last = math.nan  # the value of read slot - 1

    def __repr__(self) -> str:
        return f"SyntheticSensor({self.cell}, seed={self.seed})"

    def read(self) -> float:
        with self._lock:
            value = self._step()
        return self._checked(value, self.slot - 1)

    def read_slot(self, slot: int) -> float:
        """The reading of `slot`: the first slot asked for is the next `read()`'s, and
        each later one as many reads on; asked again, the same value."""
        with self._lock:
            if self.first_slot is None:
                self.first_slot = slot - self.slot
            index = slot - self.first_slot
            if index < 0:
                raise SlotReadingError(f"{self!r}: slot {slot} comes before its first "
                                       "slot (the clock went back)")
            if index < self.slot - 1:  # an earlier slot: the room again from the start
                self._start()
            while self.slot <= index:
                self._step()
            value = self._last
        return self._checked(value, index)

    def _checked(self, value: float, index: int) -> float:
        return self.valid_c.check(value, f"{self!r} read {index}", SlotReadingError)

    def _step(self) -> float:
        """The room one slot on: the value of read `slot`, which it advances."""
        minutes = self.slot * self.slot_minutes
        hour = (minutes % 1440) / 60.0
        self.slot += 1
        hvac_on = 7.0 <= hour < 22.0
        outdoor = 12.0 + 5.0 * math.cos(2.0 * math.pi * (hour - 15.0) / 24.0)
        target = self._setpoint if hvac_on else 0.55 * self._setpoint + 0.45 * outdoor + 1.0
        # First-order room: ~45 min to settle with the HVAC on, ~6 h to drift off.
        tau = 45.0 if hvac_on else 360.0
        self._air += (1.0 - math.exp(-self.slot_minutes / tau)) * (target - self._air)
        self._wobble = 0.9 * self._wobble + float(self._room_rng.normal(0.0, 0.065))
        sun = max(0.0, math.sin(math.pi * (hour - 6.0) / 12.5))
        window = (1.2 * sun - 0.6 * (1.0 - sun)) * math.exp(-self.cell[0] / 2.0)
        noise = float(self._cell_rng.normal(0.0, self._noise_sd))
        self._last = round(self._air + self._wobble + self._offset + window + noise, 3)
        return self._last


# --------------------------------------------------------------------------- --sensor


def sensor_from_spec(spec: str, cell: Cell) -> Sensor:
    """The sensor a `--sensor` value names (UsageError for a malformed value)."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "ds18b20":
        if not rest:
            raise UsageError("--sensor ds18b20:DEVICE_DIR, e.g. "
                             "ds18b20:/sys/bus/w1/devices/28-0123456789ab")
        return DS18B20(rest)
    if kind == "bme280":
        parts = rest.split(":") if rest else []
        if len(parts) > 2:
            raise UsageError(f"--sensor {spec}: expected bme280[:BUS[:ADDRESS]], e.g. "
                             "bme280:1:0x76")
        bus = _int(parts[0], spec, "bus") if parts else 1
        address = _int(parts[1], spec, "address") if len(parts) > 1 else 0x76
        if not 0x03 <= address <= 0x77:
            raise UsageError(f"--sensor {spec}: {address:#x} is not a 7-bit I2C address")
        return BME280(bus, address)
    if kind == "replay":
        if not rest:
            raise UsageError("--sensor replay:PATH (a CSV or NPZ sensor log)")
        return ReplaySensor(rest, cell)
    if kind == "synthetic":
        seed = _int(rest, spec, "seed") if rest else 0
        if seed < 0:
            raise UsageError(f"--sensor {spec}: the seed must be >= 0")
        return SyntheticSensor(cell, seed)
    raise UsageError(f"--sensor {spec!r}: expected ds18b20:DIR, bme280[:BUS[:ADDRESS]], "
                     "replay:PATH or synthetic[:SEED]")


def _int(text: str, spec: str, what: str) -> int:
    try:
        return int(text.strip(), 0)  # 0x76 and 118 both work
    except ValueError:
        raise UsageError(f"--sensor {spec}: {what} {text!r} is not a number") from None
