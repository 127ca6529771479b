"""Sensor drivers: good readings pass, every kind of bad reading is flagged, never sent."""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from meshdl.errors import MeshdlError, UsageError
from meshdl.nodes.sensors import (
    BME280,
    DS18B20,
    Reading,
    ReplaySensor,
    Sensor,
    SensorError,
    SyntheticSensor,
    compensate_t,
    read_with_retry,
    sensor_from_spec,
)

# --------------------------------------------------------------------------- DS18B20

GOOD = "72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t=23125\n"


def _ds18b20(tmp_path: Path, text: str) -> DS18B20:
    device = tmp_path / "28-0123456789ab"
    device.mkdir(exist_ok=True)
    (device / "w1_slave").write_text(text)
    return DS18B20(device)


def test_ds18b20_reads_millidegrees_from_w1_slave(tmp_path) -> None:
    assert _ds18b20(tmp_path, GOOD).read() == pytest.approx(23.125)
    below_zero = GOOD.replace("t=23125", "t=-10250")
    assert _ds18b20(tmp_path, below_zero).read() == pytest.approx(-10.25)
    assert isinstance(_ds18b20(tmp_path, GOOD), Sensor)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (GOOD.replace("crc=57 YES", "crc=57 NO"), "CRC"),
        (GOOD.replace("t=23125", "t=85000"), "85 °C power-on"),
        (GOOD.replace("t=23125", "t=126000"), "outside"),
        (GOOD.replace("t=23125", "t=-56000"), "outside"),
        ("00 00 00 00 00 00 00 00 00 : crc=00 YES\n00 00 00 00 00 00 00 00 00 t=0\n",
         "all-zero"),
        ("72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n", "2 lines"),
        ("", "2 lines"),
        ("hello\nworld\n", "malformed"),
        (GOOD.replace("t=23125", "t=23.1"), "malformed"),
        (GOOD.replace("crc=57 YES", "crc=57 MAYBE"), "malformed"),
    ],
    ids=["crc-no", "power-on-85", "too-hot", "too-cold", "all-zero", "one-line", "empty",
         "garbage", "decimal", "bad-crc-word"],
)
def test_ds18b20_rejects_bad_readings(tmp_path, text: str, needle: str) -> None:
    with pytest.raises(SensorError, match=needle):
        _ds18b20(tmp_path, text).read()


def test_ds18b20_missing_device_says_to_enable_1wire(tmp_path) -> None:
    with pytest.raises(SensorError, match="w1-gpio"):
        DS18B20(tmp_path / "28-absent").read()


def test_sensor_error_is_a_meshdl_error() -> None:
    assert issubclass(SensorError, MeshdlError)


# --------------------------------------------------------------------------- BME280

# The worked example of Bosch's datasheet (BMP280 data sheet, "compensation formula"
# example; the BME280 uses the identical temperature compensation): this calibration and
# raw value give t_fine = 128422 and T = 25.08 °C.
DIG_T = (27504, 26435, -1000)
ADC_T = 519888


class FakeSMBus:
    """The BME280's registers behind smbus2's calls, with a busy status for one poll."""

    def __init__(self, chip_id: int = 0x60, adc_t: int = ADC_T, dig_t=DIG_T,
                 fail_reads: bool = False) -> None:
        t1, t2, t3 = dig_t
        calib = (t1.to_bytes(2, "little") + t2.to_bytes(2, "little", signed=True)
                 + t3.to_bytes(2, "little", signed=True))
        self.regs = {0xD0: chip_id, 0xF3: 0x00}
        self.regs.update({0x88 + i: b for i, b in enumerate(calib)})
        self.regs.update({0xFA: adc_t >> 12, 0xFB: (adc_t >> 4) & 0xFF,
                          0xFC: (adc_t & 0xF) << 4})
        self.writes: list[tuple[int, int, int]] = []
        self.busy_polls = 0
        self.fail_reads = fail_reads
        self.closed = False

    def read_byte_data(self, addr: int, reg: int) -> int:
        assert addr == 0x76
        if reg == 0xF3 and self.busy_polls:
            self.busy_polls -= 1
            return 0x08  # measuring
        return self.regs[reg]

    def write_byte_data(self, addr: int, reg: int, value: int) -> None:
        self.writes.append((addr, reg, value))
        if reg == 0xF4:
            self.busy_polls = 1

    def read_i2c_block_data(self, addr: int, reg: int, length: int) -> list[int]:
        if self.fail_reads and reg == 0xFA:
            raise OSError(121, "Remote I/O error")
        return [self.regs[reg + i] for i in range(length)]

    def close(self) -> None:
        self.closed = True


def test_bme280_compensation_matches_the_datasheet_example() -> None:
    assert compensate_t(ADC_T, *DIG_T) == pytest.approx(25.08)


def test_bme280_reads_a_forced_measurement_and_compensates_it() -> None:
    bus = FakeSMBus()
    sensor = BME280(bus, 0x76)
    assert sensor.dig_t == DIG_T
    assert sensor.read() == pytest.approx(25.08)
    # One forced measurement: temperature oversampling x1, pressure skipped, mode 01.
    assert (0x76, 0xF4, 0b001_000_01) in bus.writes
    assert bus.busy_polls == 0  # it waited for the status bit to clear


def test_bme280_rejects_another_chip() -> None:
    bus = FakeSMBus(chip_id=0x58)
    with pytest.raises(SensorError, match="BMP280"):
        BME280(bus, 0x76)
    assert bus.closed


def test_bme280_flags_a_skipped_measurement_and_bus_errors() -> None:
    with pytest.raises(SensorError, match="no temperature"):
        BME280(FakeSMBus(adc_t=0x80000)).read()
    with pytest.raises(SensorError, match="Remote I/O"):
        BME280(FakeSMBus(fail_reads=True)).read()


def test_bme280_without_smbus2_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "smbus2", None)  # import smbus2 -> ImportError
    with pytest.raises(SensorError, match=r"meshdl\[sensors\]"):
        BME280(1, 0x76)


# --------------------------------------------------------------------------- replay


def test_replay_returns_one_cells_column_and_flags_gaps(tmp_path) -> None:
    log = tmp_path / "log.csv"
    log.write_text(
        "timestamp,row,col,value\n"
        "2024-04-01T00:00,0,0,21.0\n2024-04-01T00:00,0,1,21.5\n"
        "2024-04-01T00:00,1,0,20.0\n2024-04-01T00:00,1,1,20.5\n"
        "2024-04-01T00:30,0,0,21.2\n2024-04-01T00:30,0,1,\n"
        "2024-04-01T00:30,1,0,20.1\n2024-04-01T00:30,1,1,20.6\n"
    )
    sensor = ReplaySensor(log, (0, 1))
    assert sensor.read() == pytest.approx(21.5)
    with pytest.raises(SensorError, match="no reading of cell"):
        sensor.read()
    assert sensor.read() == pytest.approx(21.5)  # loops back to the first slot
    assert ReplaySensor(log, (1, 0)).read() == pytest.approx(20.0)
    with pytest.raises(SensorError, match="outside"):
        ReplaySensor(log, (2, 0))


def test_replay_reads_npz_logs_and_can_stop_at_the_end(tmp_path) -> None:
    path = tmp_path / "log.npz"
    np.savez(path, X=np.arange(12, dtype=np.float32).reshape(3, 2, 2) + 18.0)
    sensor = ReplaySensor(path, (1, 1), loop=False)
    assert [sensor.read() for _ in range(3)] == [21.0, 25.0, 29.0]
    with pytest.raises(SensorError, match="no more slots"):
        sensor.read()


# --------------------------------------------------------------------------- synthetic


def test_synthetic_readings_are_plausible_and_deterministic() -> None:
    a = SyntheticSensor((3, 4), seed=7)
    b = SyntheticSensor((3, 4), seed=7)
    week_a = np.array([a.read() for _ in range(48 * 7)])
    week_b = np.array([b.read() for _ in range(48 * 7)])
    np.testing.assert_array_equal(week_a, week_b)
    assert np.isfinite(week_a).all()
    assert week_a.min() > 15.0 and week_a.max() < 28.0  # a heated and cooled room
    assert week_a.std() > 0.3  # a daily cycle, not a constant
    # No jumps: the steepest change is the HVAC's morning warm-up, under 3 °C a slot.
    assert np.abs(np.diff(week_a)).max() < 3.0
    other_seed = np.array([SyntheticSensor((3, 4), seed=8).read() for _ in range(48)])
    assert not np.array_equal(other_seed, week_a[:48])


def test_synthetic_neighbours_describe_the_same_room() -> None:
    here, there = SyntheticSensor((5, 5), seed=1), SyntheticSensor((5, 6), seed=1)
    diffs = [abs(here.read() - there.read()) for _ in range(96)]
    assert max(diffs) < 1.0  # neighbours agree to well under the 3 °C anomaly threshold
    assert min(diffs) > 0.0  # but each cell has its own offset and noise


# --------------------------------------------------------------------------- retries


class Flaky:
    """Fails `failures` times (as a sensor glitch would), then reads 21.5 °C."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def read(self) -> float:
        self.calls += 1
        if self.calls <= self.failures:
            raise SensorError(f"glitch {self.calls}")
        return 21.5


class Hanging:
    """A read that blocks (a stuck bus) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def read(self) -> float:
        self.calls += 1
        self.release.wait(10.0)
        return 21.0


class Returns:
    def __init__(self, value: object) -> None:
        self.value = value

    def read(self) -> object:
        return self.value


def test_read_with_retry_recovers_from_transient_failures(monkeypatch) -> None:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:  # the backoffs, without the waiting
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    sensor = Flaky(failures=2)
    reading = asyncio.run(read_with_retry(sensor, attempts=3, backoff_s=0.01, timeout_s=1.0))
    assert reading == Reading(21.5, True, None)
    assert sensor.calls == 3
    assert waits == pytest.approx([0.01, 0.02])  # backoff doubled between attempts


def test_read_with_retry_gives_up_with_the_last_error() -> None:
    reading = asyncio.run(read_with_retry(Flaky(failures=5), attempts=2, backoff_s=0.0))
    assert not reading.ok and reading.value is None
    assert "glitch 2" in reading.error and "2 attempt" in reading.error


def test_read_with_retry_times_out_a_hanging_read() -> None:
    sensor = Hanging()

    async def run() -> Reading:
        try:
            return await read_with_retry(sensor, attempts=2, backoff_s=0.0, timeout_s=0.1)
        finally:
            sensor.release.set()  # let the worker threads end before the loop closes

    # Had the timeout not worked, the reads would end (after 10 s) with a good value.
    reading = asyncio.run(run())
    assert reading.ok is False and reading.value is None
    assert "no reading within 0.1 s" in reading.error
    assert sensor.calls == 2


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None, "21.0"])
def test_non_finite_or_non_numeric_readings_are_never_ok(value) -> None:
    reading = asyncio.run(read_with_retry(Returns(value), attempts=2, backoff_s=0.0))
    assert reading.ok is False and reading.value is None
    assert "non-finite" in reading.error


def test_io_errors_of_a_driver_count_as_failed_attempts() -> None:
    class Broken:
        def read(self) -> float:
            raise OSError(5, "Input/output error")

    reading = asyncio.run(read_with_retry(Broken(), attempts=1))
    assert not reading.ok and "Input/output error" in reading.error


# --------------------------------------------------------------------------- --sensor


def test_sensor_specs_build_their_drivers(tmp_path, monkeypatch) -> None:
    ds = sensor_from_spec("ds18b20:/sys/bus/w1/devices/28-0123456789ab", (0, 0))
    assert isinstance(ds, DS18B20)
    assert ds.path == Path("/sys/bus/w1/devices/28-0123456789ab/w1_slave")
    synthetic = sensor_from_spec("synthetic:5", (1, 2))
    assert isinstance(synthetic, SyntheticSensor) and synthetic.seed == 5
    assert sensor_from_spec("synthetic", (1, 2)).seed == 0
    np.savez(tmp_path / "log.npz", X=np.full((2, 3, 3), 20.0, np.float32))
    replay = sensor_from_spec(f"replay:{tmp_path / 'log.npz'}", (2, 2))
    assert isinstance(replay, ReplaySensor) and replay.read() == 20.0

    opened: list[int] = []

    def fake_smbus(bus: int) -> FakeSMBus:
        opened.append(bus)
        return FakeSMBus()

    fake_module = type(sys)("smbus2")
    fake_module.SMBus = fake_smbus
    monkeypatch.setitem(sys.modules, "smbus2", fake_module)
    bme = sensor_from_spec("bme280:3:0x76", (0, 0))
    assert isinstance(bme, BME280) and opened == [3] and bme.read() == pytest.approx(25.08)
    assert isinstance(sensor_from_spec("bme280", (0, 0)), BME280) and opened == [3, 1]


@pytest.mark.parametrize(
    "spec", ["thermistor:1", "ds18b20", "ds18b20:", "bme280:one", "bme280:1:0x76:9",
             "bme280:1:0x99", "synthetic:x", "synthetic:-1", "replay:", ""],
)
def test_bad_sensor_specs_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError):
        sensor_from_spec(spec, (0, 0))


def test_a_replay_started_again_reads_the_same_row_for_a_slot(tmp_path) -> None:
    # Issue 43, item 10a: a node host started again began its replay at row 0 while the
    # others went on, so one slot's map mixed rows of different times.
    path = tmp_path / "log.npz"
    np.savez(path, X=np.arange(20, dtype=np.float32).reshape(5, 2, 2) + 18.0)
    running = ReplaySensor(path, (0, 0))
    before = [running.read_slot(slot) for slot in range(1_000, 1_003)]
    restarted = ReplaySensor(path, (0, 0))  # the host's process started again
    later = [restarted.read_slot(slot) for slot in range(1_003, 1_008)]
    assert later == [running.read_slot(slot) for slot in range(1_003, 1_008)]
    assert before + later == [18.0 + 4 * (slot % 5) for slot in range(1_000, 1_008)]
    # A host that started on another slot reads the same rows too.
    other = ReplaySensor(path, (0, 0))
    assert other.read_slot(1_006) == later[3]
