"""What node plans of the same content hold once: their programs, their computations'
jobs, their small tuples of task numbers and their slices.

Most cells of a grid have the same neighbourhood (a 100 x 100 mesh's 10,000 nodes have 9
distinct programs), and so the same program to the number (nodes/plan.py `Program`):
each plan builds its own, then keeps the one already held for its content instead (a
digest of its arrays' bytes). Held is shared: its arrays are made read-only, so that
no plan can change another's (a tampered program is a plan's own copy, tests/
test_machine_program_validated.py). A 100 x 100 live run's plans held 49 KB a node
before, half of it copies of nine programs and their jobs; 26 KB now (SIMULATION.md,
"One slot priced, every slot counted").
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

import numpy as np

# Distinct contents kept: far more than any mesh has (9 programs on a grid, a few per
# dead cell or tree shape); beyond it the oldest goes (a plan then keeps its own copy).
KEPT = 4096

# A plan's `Program` (nodes/plan.py), a NamedTuple of arrays: named by a type variable,
# not imported, since plan.py imports this module.
P = TypeVar("P", bound=tuple)


class Held(Generic[P]):
    """A program held once, and the jobs of its computations, made for it once (by
    task number and the node's own figures a job also carries)."""

    __slots__ = ("jobs", "program")

    def __init__(self, program: P) -> None:
        self.program = program
        self.jobs: dict[Hashable, Any] = {}


_HELD: OrderedDict[bytes, Held[Any]] = OrderedDict()
_TUPLES: dict[tuple[int, ...], tuple[int, ...]] = {}
_SLICES: dict[tuple[int, int], slice] = {}


def hash_arrays(digest: Any, arrays: Iterable[np.ndarray]) -> None:
    """Feed arrays' dtypes, shapes and bytes, in order, to a hashlib digest."""
    for values in arrays:
        values = np.ascontiguousarray(values)
        digest.update(f"{values.dtype.str}{values.shape}".encode())
        digest.update(values.tobytes())


def content_digest(arrays: tuple[np.ndarray, ...]) -> bytes:
    """BLAKE2b (16 bytes) of arrays' dtypes, shapes and bytes, in order."""
    digest = hashlib.blake2b(digest_size=16)
    hash_arrays(digest, arrays)
    return digest.digest()


def held_program(program: P) -> Held[P]:
    """The program held for `program`'s content: this one (made read-only) if none is."""
    key = content_digest(tuple(program))
    held = _HELD.get(key)
    if held is not None:
        with contextlib.suppress(KeyError):  # let go meanwhile (a node host's thread)
            _HELD.move_to_end(key)
        return held
    for values in program:
        values.flags.writeable = False
    held = _HELD[key] = Held(program)
    if len(_HELD) > KEPT:
        _HELD.popitem(last=False)
    return held


def read_only(values: np.ndarray) -> np.ndarray:
    """`values`, no longer writable (an array a held job shares)."""
    values.flags.writeable = False
    return values


def interned(numbers: tuple[int, ...]) -> tuple[int, ...]:
    """One tuple object for each distinct tuple of task numbers (a plan's waiters:
    most are one or two tasks, the same numbers in every plan of a program)."""
    if len(_TUPLES) > 16 * KEPT:
        _TUPLES.clear()
    return _TUPLES.setdefault(numbers, numbers)


def slice_of(start: int, stop: int) -> slice:
    """One slice object for each run of slots."""
    if len(_SLICES) > 16 * KEPT:
        _SLICES.clear()
    key = (start, stop)
    held = _SLICES.get(key)
    if held is None:
        held = _SLICES[key] = slice(start, stop)
    return held
