"""The tests' Mosquitto: `meshdl.mqtt.localbroker.Mosquitto`, skipping a test when the binary
is missing (CI installs it, so there the tests run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meshdl.errors import MeshdlError
from meshdl.mqtt.localbroker import HOST, Mosquitto, free_port, wait_for_port

__all__ = ["HOST", "Mosquitto", "free_port", "mosquitto_binary", "self_signed",
           "wait_for_port", "worker_ports"]


def mosquitto_binary(name: str = "mosquitto") -> str:
    """The path of a Mosquitto program, or skip the test saying how to install it."""
    from meshdl.mqtt.tools import find_tool

    try:
        return find_tool(name)
    except MeshdlError as exc:
        pytest.skip(str(exc))


def self_signed(tls_dir: Path) -> None:
    """The certificate production.conf's TLS listener needs, self-signed for 127.0.0.1,
    with ca.crt its own copy (skip the test when openssl is missing)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    tls_dir.mkdir(parents=True)
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(tls_dir / "server.key"), "-out", str(tls_dir / "server.crt")],
        check=True, capture_output=True, timeout=30)
    shutil.copy(tls_dir / "server.crt", tls_dir / "ca.crt")


def worker_ports(worker: int, workers: int, low: int, below: int) -> tuple[int, int]:
    """The listening ports [from, below) of parallel test worker `worker` of `workers`:
    its own slice of [low, below), so that a port one worker picked and has not bound
    yet is never the other's (a worker that replaces a crashed one, numbered `workers`
    or above, takes the slice of the one it replaces)."""
    width = (below - low) // max(1, workers)
    worker %= max(1, workers)
    return low + worker * width, low + (worker + 1) * width
