"""Errors meshdl raises on purpose: each says in one line what is wrong with the input.

The CLI turns `MeshdlError` into a one-line message and an exit code; `UsageError`
(the user asked for something impossible) exits 2, every other `MeshdlError` exits 1.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class MeshdlError(Exception):
    """A failure with a message fit to show a user as it is."""

    exit_code = 1


class UsageError(MeshdlError):
    """An impossible configuration or request: fix the flags or the config file."""

    exit_code = 2


class DataError(MeshdlError):
    """A data file that is missing, corrupt, of the wrong shape, or holds NaN readings."""


class ModelFileError(MeshdlError):
    """A model.npz that is missing, corrupt, or does not match its configuration."""


class NonFiniteError(MeshdlError):
    """A computation produced NaN or inf (in training: the run diverged)."""


class CodecReason(str, Enum):
    """Why bytes are not a valid mesh message: a closed set, so that counting rejections
    by reason stays a handful of counters however varied the garbage."""

    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    BAD_MAGIC = "bad_magic"
    VERSION = "version"
    BAD_SHAPE = "bad_shape"
    INVALID_HEADER = "invalid_header"
    OTHER_MESH = "other_mesh"
    PAYLOAD_SIZE = "payload_size"
    CHECKSUM = "checksum"
    NOT_FINITE = "not_finite"
    FORGED = "forged"  # a tag or signature that does not verify (meshdl/protocol/auth.py)
    BAD_COMPRESSED = "bad_compressed"  # bytes no compressor sends (meshdl/compress)


class CodecError(MeshdlError):
    """A payload that is not a valid mesh message: `reason` for counting, the text for
    people."""

    def __init__(self, reason: CodecReason, text: str) -> None:
        super().__init__(text)
        self.reason = reason


class StepSkipped(Exception):
    """Not a failure: a best-effort training wave whose pooled features missed their
    deadline. The training loop applies no update for that batch and goes on."""


def format_validation_error(exc: ValidationError) -> str:
    """Pydantic's report folded into one line: `model.kernel: ...; train.lr: ...`."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


class IllegalTransition(Exception):
    """A state machine was handed an event its transition table does not allow in its
    phase (meshdl/protocol/lifecycle.py): a bug in the caller or the machine,
    not in the input, so it is not a `MeshdlError` the CLI would print as one line."""

    def __init__(self, machine: str, phase: Enum, event: Enum) -> None:
        super().__init__(f"{machine}: event {event.name} is illegal in phase {phase.name}")
        self.machine, self.phase, self.event = machine, phase, event
