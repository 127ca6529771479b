"""Errors meshdl raises on purpose: each says in one line what is wrong with the input.

The CLI turns `MeshdlError` into a one-line message and an exit code; `UsageError`
(the user asked for something impossible) exits 2, every other `MeshdlError` exits 1.
"""

from __future__ import annotations


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
