"""Reading an .npz file meshdl did not necessarily write (a data set, a sensor log, a
model, a checkpoint) without ever unpickling anything, and without ever allocating more
than its headers promise: every failure is one clear error of the caller's kind, and
none suggests loading the file unsafely.

numpy's own message for a file that is not an archive says it "contains pickled
(object) data" and how to unpickle it; a text file or a truncated download must not be
answered with that, so the file's first bytes are checked first.

A few MB of deflated zeros unpack to gigabytes (a 2 MB file held 2.1 GB: `np.load` took
6 GB to read it). So every entry's .npy header (its shape and dtype) is read first and
checked against the size the zip's directory gives the entry and against
`MAX_FILE_ARRAY_BYTES`; the caller may check the headers too (a data set's keys, ranks
and dtypes); only then is any array read.
"""

from __future__ import annotations

import math
import struct
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy

from meshdl.errors import MeshdlError
from meshdl.limits import MAX_FILE_ARRAY_BYTES

_ZIP = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header, or an empty archive's end
_NPY = b"\x93NUMPY"
_HEADER_READERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
# The length field after the version: numpy reads a header of whatever length it claims
# (up to 4 GiB in format 2.0) before its own bound (`max_header_size`, 10,000 bytes)
# refuses it, so a 200 KB file claiming a 200 MiB header took 440 MB. Checked first.
_HEADER_LENGTH = {(1, 0): struct.Struct("<H"), (2, 0): struct.Struct("<I")}
MAX_HEADER_BYTES = 10_000  # numpy's own bound on a header it reads safely


@dataclass(frozen=True)
class ArrayHeader:
    """What an entry's .npy header says of its array: enough to refuse the array before
    a byte of it is read. Has `shape`, `ndim` and `dtype` as an array has, so the checks
    a caller makes on arrays run on headers unchanged."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


#: A caller's check of the headers, run before any array is read: it raises the
#: caller's error; what it returns is ignored.
HeaderCheck = Callable[[Mapping[str, ArrayHeader]], object]


def read_npz(source: Path, what: str, error: type[MeshdlError],
             check: HeaderCheck | None = None,
             limit: int = MAX_FILE_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """All arrays of the .npz file `source` (a `what`: "data set", "model.npz", ...),
    refusing pickled objects, headers the entries' sizes contradict and arrays of more
    than `limit` bytes in all, then whatever `check` refuses of the headers; `error`
    for anything missing, unreadable or refused, all before any array is read."""
    if not source.exists():
        raise error(f"{what} not found: {source}")
    if source.is_dir():
        kind = what if what.endswith("file") else f"{what} file"
        inside = source / "model.npz"  # a run directory given for its model
        hint = f" (did you mean {inside}?)" if inside.is_file() else ""
        raise error(f"{source}: is a directory, not a {kind}{hint}")
    with open(source, "rb") as fh:
        magic = fh.read(6)
    if magic.startswith(_NPY):
        raise error(f"{source}: holds a single .npy array, not an .npz archive")
    if not magic.startswith(_ZIP):
        raise error(f"{source}: not an .npz file (no zip signature: a text file or a "
                    "truncated download?)")
    try:
        with zipfile.ZipFile(source) as archive:
            entries = {_key(info.filename): info for info in archive.infolist()}
            headers = {key: _header(archive, info, key, source, error)
                       for key, info in entries.items()}
            _check_total(headers, source, what, limit, error)
            if check is not None:
                check(headers)
            arrays = {}
            for key, info in entries.items():
                with archive.open(info) as fh:
                    arrays[key] = npy.read_array(fh, allow_pickle=False)
            return arrays
    except MeshdlError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"{source}: not a valid .npz file or corrupt ({reason})") from None


def _key(name: str) -> str:
    """An entry's key as `np.load` names it: the file name without `.npy`."""
    return name.removesuffix(".npy")


def _header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, source: Path,
            error: type[MeshdlError]) -> ArrayHeader:
    """The entry's .npy header, read from its first bytes alone and checked against the
    entry's size in the zip directory (which bounds what decompressing it can yield)."""
    with archive.open(info) as fh:
        if fh.read(len(_NPY)) != _NPY:
            raise error(f"{source}: entry {info.filename} is not a .npy array")
        fh.seek(0)
        version = npy.read_magic(fh)
        if version not in _HEADER_READERS:  # 3.0 only serves dtypes with non-Latin-1
            # field names, which no numeric array meshdl reads has
            raise error(f"{source}: key {key} has .npy format {version[0]}.{version[1]}; "
                        "meshdl reads formats 1.0 and 2.0")
        _check_header_length(fh, version, key, source, error)
        shape, _fortran, dtype = _HEADER_READERS[version](fh)
        start = fh.tell()
    if dtype.hasobject:
        raise error(f"{source}: key {key} holds pickled Python objects; refusing to load "
                    "them (store plain numeric arrays)")
    header = ArrayHeader(key, tuple(int(n) for n in shape), dtype)
    if start + header.nbytes != info.file_size:
        raise error(f"{source}: key {key}: its header says shape {header.shape} of "
                    f"{dtype} ({header.nbytes:,} bytes) but the entry holds "
                    f"{info.file_size - start:,} bytes of data (corrupt or forged)")
    return header


def _check_header_length(fh: BinaryIO, version: tuple[int, int], key: str, source: Path,
                         error: type[MeshdlError]) -> None:
    """Refuse a header longer than numpy reads safely, from its length field alone; leave
    `fh` where the version's header reader starts (just after the version)."""
    field = _HEADER_LENGTH[version]
    start = fh.tell()
    raw = fh.read(field.size)
    if len(raw) != field.size:
        raise error(f"{source}: key {key}: its .npy header is cut short (corrupt)")
    (length,) = field.unpack(raw)
    if length > MAX_HEADER_BYTES:
        raise error(f"{source}: key {key}: its .npy header claims {length:,} bytes; a header "
                    f"holds at most {MAX_HEADER_BYTES:,} (corrupt or forged)")
    fh.seek(start)


def _check_total(headers: Mapping[str, ArrayHeader], source: Path, what: str, limit: int,
                 error: type[MeshdlError]) -> None:
    total = sum(h.nbytes for h in headers.values())
    if total <= limit:
        return
    largest = max(headers.values(), key=lambda h: h.nbytes)
    raise error(f"{source}: its arrays would take {_megabytes(total)} in memory (key "
                f"{largest.key}: shape {largest.shape} of {largest.dtype}); meshdl reads at "
                f"most {_megabytes(limit)} from a {what}")


def _megabytes(n: int) -> str:
    return f"{math.ceil(n / 2**20):,} MiB"
