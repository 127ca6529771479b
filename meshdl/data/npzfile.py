"""Reading an .npz file meshdl did not necessarily write (a data set, a sensor log, a
model, a checkpoint) without ever unpickling anything: every failure is one clear error
of the caller's kind, and none suggests loading the file unsafely.

numpy's own message for a file that is not an archive says it "contains pickled
(object) data" and how to unpickle it; a text file or a truncated download must not be
answered with that, so the file's first bytes are checked first.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from meshdl.errors import MeshdlError

_ZIP = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header, or an empty archive's end
_NPY = b"\x93NUMPY"


def read_npz(source: Path, what: str, error: type[MeshdlError]) -> dict[str, np.ndarray]:
    """All arrays of the .npz file `source` (a `what`: "data set", "model.npz", ...),
    refusing pickled objects; `error` for anything missing or unreadable."""
    if not source.exists():
        raise error(f"{what} not found: {source}")
    if source.is_dir():
        raise error(f"{source}: is a directory, not a {what} file")
    with open(source, "rb") as fh:
        magic = fh.read(6)
    if magic.startswith(_NPY):
        raise error(f"{source}: holds a single .npy array, not an .npz archive")
    if not magic.startswith(_ZIP):
        raise error(f"{source}: not an .npz file (no zip signature: a text file or a "
                    "truncated download?)")
    try:
        with np.load(source, allow_pickle=False) as archive:
            arrays = {}
            for key in archive.files:
                try:
                    arrays[key] = archive[key]
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        raise error(f"{source}: key {key} holds pickled Python objects; "
                                    "refusing to load them (store plain numeric arrays)"
                                    ) from None
                    raise
            return arrays
    except MeshdlError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"{source}: not a valid .npz file or corrupt ({reason})") from None
