"""The tests' Mosquitto: `meshdl.localbroker.Mosquitto`, skipping a test when the binary
is missing (CI installs it, so there the tests run)."""

from __future__ import annotations

import pytest

from meshdl.errors import MeshdlError
from meshdl.localbroker import HOST, Mosquitto, free_port, wait_for_port

__all__ = ["HOST", "Mosquitto", "free_port", "mosquitto_binary", "wait_for_port"]


def mosquitto_binary(name: str = "mosquitto") -> str:
    """The path of a Mosquitto program, or skip the test saying how to install it."""
    from meshdl.cli.broker import find_tool

    try:
        return find_tool(name)
    except MeshdlError as exc:
        pytest.skip(str(exc))
