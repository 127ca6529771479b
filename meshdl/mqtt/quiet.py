"""The CLI's quiet exit after an abandoned broker connection, apart from the session
(meshdl/mqtt/session.py loads the protocol and Numba: every `meshdl` command installs
this, `meshdl --help` too, which must not wait for them)."""

from __future__ import annotations

import sys
from typing import Any


def quiet_abandoned_clients() -> None:
    """Keep paho's finalizer of an abandoned connection from printing a traceback at exit.

    A connection attempt that timed out (a frozen broker) leaves paho's socket open;
    aiomqtt offers no way to close it, and when the client is collected, after its event
    loop has closed, paho tells that loop and Python prints "Exception ignored ...
    RuntimeError: Event loop is closed". The socket is closed all the same; the CLI
    installs this so that a user reads the one-line error and nothing else."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        where = getattr(unraisable.object, "__qualname__", "")
        module = getattr(unraisable.object, "__module__", "") or ""
        if where == "Client.__del__" and module.startswith("paho.") and \
                isinstance(unraisable.exc_value, RuntimeError) and \
                str(unraisable.exc_value) == "Event loop is closed":
            return
        previous(unraisable)

    sys.unraisablehook = hook
