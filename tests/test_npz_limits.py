"""Files that unpack to far more than they weigh (issue 43, item 6): a 2 MB .npz of
deflated zeros held 2.1 GB of maps, and `data inspect` took 6 GB to read it. Every .npz
is refused by its headers, in one line, before an array is read."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from numpy.lib import format as npy

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import load_dataset, load_log
from meshdl.errors import DataError, ModelFileError
from meshdl.limits import MAX_FILE_ARRAY_BYTES
from tests.helpers import assert_one_line_error

_MIB = 1 << 20


class Entry(NamedTuple):
    """One deflated zip entry: its CRC-32, uncompressed size and compressed bytes."""

    crc: int
    size: int
    data: bytes


def npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    out = io.BytesIO()
    npy.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def deflated(prefix: bytes, zeros: int = 0, crc: bool = True) -> Entry:
    """`prefix` then `zeros` zero bytes, deflated without ever holding the zeros: a
    full flush resets the compressor, so each MiB of zeros deflates to the same bytes.
    Without `crc` the checksum is left 0 (a second per GB saved): for entries a test
    proves are never read."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(_MIB)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    full, rest = divmod(zeros, _MIB)
    tail = c.compress(bytes(rest)) + c.flush()
    check = zlib.crc32(prefix)
    for _ in range(full if crc else 0):
        check = zlib.crc32(chunk, check)
    check = zlib.crc32(bytes(rest), check) if crc else 0
    return Entry(check, len(prefix) + zeros, head + block * full + tail)


def array_entry(array: np.ndarray) -> Entry:
    out = io.BytesIO()
    np.save(out, array)
    return deflated(out.getvalue())


def write_zip(path: Path, entries: dict[str, Entry]) -> Path:
    """A zip of deflated entries, written by hand (zipfile would deflate every zero)."""
    body, directory = bytearray(), bytearray()
    for name, (crc, size, data) in entries.items():
        raw = name.encode()
        offset = len(body)
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(data),
                            size, len(raw), 0) + raw + data
        directory += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc,
                                 len(data), size, len(raw), 0, 0, 0, 0, 0, offset) + raw
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                      len(directory), len(body), 0)
    path.write_bytes(bytes(body + directory + end))
    return path


def zeros_data_set(path: Path, gigabytes: float) -> Path:
    """A 17 x 25 data set whose training maps are `gigabytes` of zeros (a few MB)."""
    n = int(gigabytes * 1e9) // (17 * 25 * 4)
    return write_zip(path, {
        "X_train.npy": deflated(npy_header((n, 17, 25), "<f4"), n * 17 * 25 * 4),
        "y_train.npy": deflated(npy_header((n,), "<i8"), n * 8),
        "X_test.npy": array_entry(np.zeros((2, 17, 25), np.float32)),
        "y_test.npy": array_entry(np.zeros(2, np.int64)),
    })


def run_measured(*args: str | Path) -> tuple[int, str, int]:
    """`meshdl ARGS` in a child process: exit code, stderr, and the child's peak RSS in
    bytes (a wrapper process whose only child it is reads it from getrusage)."""
    wrapper = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "meshdl",
                           *map(str, args)], capture_output=True, text=True, timeout=120)
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    return done.returncode, done.stderr, peak_kib * 1024


@pytest.fixture
def no_array_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any array of an .npz is read: refusals come from headers."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("an array was read before the file was refused")

    monkeypatch.setattr(npy, "read_array", refuse)


def test_a_2_gb_data_set_of_deflated_zeros_is_refused_in_one_line_under_200_mb(
        tmp_path: Path) -> None:
    bomb = zeros_data_set(tmp_path / "zeros.npz", 2.1)
    assert bomb.stat().st_size < 4 * _MIB
    model = tmp_path / "model.npz"
    CNN(ModelConfig(), seed=0).save(model)
    for command in (("data", "inspect", bomb), ("evaluate", model, bomb)):
        code, err, peak = run_measured(*command)
        assert_one_line_error(code, err, 1, str(bomb), "X_train", "at most")
        assert peak < 200 * _MIB, (command, peak)


def test_a_header_claiming_more_than_its_entry_holds_is_refused_before_reading(
        tmp_path: Path, no_array_read: None) -> None:
    forged = write_zip(tmp_path / "forged.npz", {
        "X_train.npy": deflated(npy_header((10**6, 17, 25), "<f4"), 100),
        "y_train.npy": array_entry(np.zeros(2, np.int64)),
    })
    with pytest.raises(DataError, match=r"X_train: its header says shape \(1000000, 17, 25\)"
                       r".*holds 100 bytes"):
        load_dataset(forged)


def test_a_data_set_of_the_wrong_form_is_refused_by_its_headers(
        tmp_path: Path, no_array_read: None) -> None:
    maps = np.zeros((3, 4, 5), np.float32)
    wrong = write_zip(tmp_path / "ints.npz", {
        "X_train.npy": array_entry(maps.astype(np.int32)),
        "y_train.npy": array_entry(np.zeros(3, np.int64)),
        "X_test.npy": array_entry(maps),
        "y_test.npy": array_entry(np.zeros(3, np.int64)),
    })
    with pytest.raises(DataError, match="X_train has dtype int32"):
        load_dataset(wrong)
    short = write_zip(tmp_path / "short.npz", {
        "X_train.npy": array_entry(maps),
        "y_train.npy": array_entry(np.zeros(2, np.int64)),
        "X_test.npy": array_entry(maps),
        "y_test.npy": array_entry(np.zeros(3, np.int64)),
    })
    with pytest.raises(DataError, match="X_train holds 3 maps but y_train 2 labels"):
        load_dataset(short)


def test_a_sensor_log_of_more_than_the_limit_is_refused_by_its_headers(
        tmp_path: Path, no_array_read: None) -> None:
    n = MAX_FILE_ARRAY_BYTES // (17 * 25 * 4) + 1
    log = write_zip(tmp_path / "log.npz", {
        "X.npy": deflated(npy_header((n, 17, 25), "<f4"), n * 17 * 25 * 4, crc=False)})
    with pytest.raises(DataError, match=r"at most .* from a sensor log"):
        load_log(log)


def test_a_model_file_of_more_than_the_limit_is_refused_in_one_line(
        tmp_path: Path, cli, no_array_read: None) -> None:
    n = MAX_FILE_ARRAY_BYTES // 4 + 1
    model = write_zip(tmp_path / "model.npz", {
        "fc1.weight.npy": deflated(npy_header((n,), "<f4"), n * 4, crc=False)})
    data = tmp_path / "data.npz"
    data.write_bytes(b"")  # never reached: the model is read first
    code, _, err = cli("evaluate", model, data)
    assert_one_line_error(code, err, 1, "fc1.weight", "from a model file")
    with pytest.raises(ModelFileError, match="at most"):
        CNN.load(model)


def test_the_peak_rss_measure_sees_what_the_child_allocates() -> None:
    """The measure the bomb test relies on: a child that allocates 300 MB shows it."""
    done = subprocess.run(
        [sys.executable, "-c", "import resource, subprocess, sys; subprocess.call(["
         "sys.executable, '-c', 'b = bytearray(300 << 20); b[::4096] = b\"x\" * len(b[::4096])"
         "']); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"],
        capture_output=True, text=True, timeout=60, check=True)
    assert int(done.stdout.strip()) * 1024 > 300 * _MIB


def test_a_model_file_whose_config_describes_a_huge_network_is_refused_by_its_arrays(
        tmp_path: Path, cli) -> None:
    # The config is the model file's header too: a 4096 x 4096 grid of 1,024 filters is
    # a petabyte of parameters, none of which the file holds.
    config = ModelConfig(rows=4096, cols=4096, filters=1024, hidden=65536)
    model = tmp_path / "model.npz"
    np.savez(model, config=np.array(config.model_dump_json()))
    data = tmp_path / "data.npz"
    data.write_bytes(b"")  # never reached: the model is read first
    code, _, err = cli("evaluate", model, data)
    assert_one_line_error(code, err, 1, str(model), "lacks parameter conv1.weight")


def test_a_model_config_nested_too_deep_is_the_files_one_line_error(tmp_path: Path,
                                                                     cli) -> None:
    model = tmp_path / "model.npz"
    np.savez(model, config=np.array("[" * 100_000 + "]" * 100_000))
    data = tmp_path / "data.npz"
    data.write_bytes(b"")  # never reached: the model is read first
    code, _, err = cli("evaluate", model, data)
    assert_one_line_error(code, err, 1, str(model), "config nested too deeply")


def test_a_header_claiming_hundreds_of_megabytes_is_refused_before_it_is_read(
        tmp_path: Path) -> None:
    """numpy reads a .npy header of whatever length its field claims before its own
    bound refuses it: a 200 KB file whose header claims 200 MiB (of spaces) took 440 MB.
    The length field is checked first."""
    claimed = 200 * _MIB
    prefix = npy.MAGIC_PREFIX + bytes([2, 0]) + struct.pack("<I", claimed)
    bomb = write_zip(tmp_path / "header.npz",
                     {"X_train.npy": deflated(prefix, claimed, crc=False)})
    assert bomb.stat().st_size < _MIB
    code, err, peak = run_measured("data", "inspect", bomb)
    assert_one_line_error(code, err, 1, str(bomb), "X_train", "209,715,200 bytes")
    assert peak < 100 * _MIB, peak
