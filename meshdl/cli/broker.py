"""`meshdl broker`: run a Mosquitto broker in the foreground, for development on one machine.

By default it runs the project's `deploy/mosquitto/local.conf` (loopback only, anonymous,
nothing persisted); `--config` runs another file, and `--port` and `--host` move the
config's single listener to another port and address. Mosquitto's own log goes to the
terminal; Ctrl+C (or SIGTERM) stops it cleanly. The program is found by meshdl/mqtt/tools.py.
"""

from __future__ import annotations

import re
import signal
import subprocess
import tempfile
from pathlib import Path

import typer

from meshdl.cli.common import err_console
from meshdl.errors import MeshdlError, UsageError
from meshdl.mqtt.tools import find_tool

LOCAL_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "local.conf"
_LISTENER = re.compile(r"^(\s*listener\s+)(\d+)(.*)$")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def register(app: typer.Typer) -> None:
    app.command("broker")(broker)


def broker(
    port: int | None = typer.Option(
        None, "--port", min=1, max=65535,
        help="Listen on this port instead of the config's (which must have one listener)."),
    host: str | None = typer.Option(
        None, "--host", help="Listen on this address instead of the config's (the default "
        "config's is 127.0.0.1, this machine only; 0.0.0.0: every interface, for other "
        "machines such as Raspberry Pi nodes)."),
    config: Path | None = typer.Option(
        None, "--config", help="Mosquitto config file (default: deploy/mosquitto/local.conf)."),
) -> None:
    """Run a Mosquitto broker in the foreground (Ctrl+C stops it)."""
    binary = find_tool("mosquitto")
    conf = config if config is not None else LOCAL_CONF
    if not conf.is_file():
        hint = "" if config is not None else " (not in a source checkout? pass --config FILE)"
        raise MeshdlError(f"mosquitto config not found: {conf}{hint}")
    with tempfile.TemporaryDirectory(prefix="meshdl-broker-") as tmp:
        run_conf = conf
        if port is not None or host is not None:
            run_conf = Path(tmp) / conf.name
            run_conf.write_text(with_listener(conf.read_text(), port, host, conf))
        where = ", ".join(listeners(run_conf.read_text())) or "mosquitto's default port"
        if host is not None and host not in LOOPBACK:
            err_console.print(f"[yellow]warning:[/] listening on {host}: other machines "
                              "can reach this broker (with the default config, anonymously)",
                              highlight=False)
        err_console.print(f"mosquitto on {where}, config {conf} (Ctrl+C stops it)",
                          highlight=False)
        code = _run_foreground([binary, "-c", str(run_conf)])
    if code != 0:
        raise MeshdlError(f"mosquitto exited with status {code} (its log is above)")


def listeners(text: str) -> list[str]:
    """'PORT' or 'ADDRESS:PORT' for each `listener` line of a config."""
    out = []
    for line in text.splitlines():
        match = _LISTENER.match(line)
        if match:
            address = match[3].split()
            out.append(f"{address[0]}:{match[2]}" if address else match[2])
    return out


def with_listener(text: str, port: int | None, host: str | None = None,
                  source: Path | str = "the config") -> str:
    """The config with its single `listener` moved to `port` and `host` (each: None keeps
    the config's); a UsageError if the config has not exactly one listener."""
    flag = "--port" if host is None else "--host" if port is None else "--port/--host"
    if host is not None and (not host or any(c.isspace() for c in host)):
        raise UsageError(f"--host: expected an address or host name, got {host!r}")
    lines = text.splitlines()
    at = [i for i, line in enumerate(lines) if _LISTENER.match(line)]
    if len(at) != 1:
        raise UsageError(f"{flag} needs a config with exactly one `listener` line; "
                         f"{source} has {len(at)}")
    match = _LISTENER.match(lines[at[0]])
    assert match is not None
    rest = match[3] if host is None else f" {host}"  # `listener PORT [ADDRESS]`
    lines[at[0]] = f"{match[1]}{match[2] if port is None else port}{rest}"
    return "\n".join(lines) + "\n"


def _run_foreground(command: list[str]) -> int:
    """Run the broker attached to this terminal; SIGINT/SIGTERM stop it and we wait."""
    process = subprocess.Popen(command)

    def stop(signum: int, _frame: object) -> None:
        # systemd or `kill` signal only us: pass it on, then wait for a clean shutdown.
        process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            try:
                return process.wait()
            except KeyboardInterrupt:
                # Ctrl+C reached mosquitto too (same process group); a `kill -INT` of
                # this process alone did not, so forward it: a second SIGINT is harmless.
                process.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
