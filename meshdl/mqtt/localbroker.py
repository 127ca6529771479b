"""A private Mosquitto broker: started on a free loopback port with its own config, stopped
at the end. The tests use it, and so do benchmarks that need a broker of their own.

    with Mosquitto(tmp_path) as broker:                  # anonymous
        ... aiomqtt.Client(broker.host, broker.port) ...
    with Mosquitto(tmp_path, password_file=p, acl_file=a) as broker:
        broker.restart(kill=True)                        # same port: clients see it drop

`start` waits until the broker accepts TCP connections (or raises with the broker's log
after `timeout`, never hangs); `stop` terminates it and kills it if it does not exit in
time.
"""

from __future__ import annotations

import os
import pwd
import random
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from meshdl.mqtt.tools import find_tool

HOST = "127.0.0.1"


# Listening ports are taken below the kernel's ephemeral range, where no outgoing
# connection takes its local port: a port the kernel hands out for binding 0 is an
# ephemeral one, and a bridge or client connecting before the broker meant to listen
# there starts may take it ("Address already in use": seen once in the suite). And not
# one this process handed out already, which nothing holds until its broker starts.
LISTEN_PORTS_FROM = 20000
# None: up to the ephemeral range; a parallel test worker's slice of it otherwise
# (tests/conftest.py), so that two processes never hand out one port.
LISTEN_PORTS_BELOW: int | None = None
_HANDED: set[int] = set()
_PICK = random.Random()  # which free port: no run's output depends on it


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral ports (Linux's ip_local_port_range; IANA's elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def free_port() -> int:
    """A TCP port nobody listens on now, below the ephemeral range and not handed out
    before by this process (else, the range too narrow, one the kernel chooses)."""
    low, _ = ephemeral_range()
    if LISTEN_PORTS_BELOW is not None:
        low = min(low, LISTEN_PORTS_BELOW)
    for _ in range(200 if low - LISTEN_PORTS_FROM >= 1000 else 0):
        port = _PICK.randrange(LISTEN_PORTS_FROM, low)
        if port in _HANDED:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float,
                  process: subprocess.Popen[bytes] | None = None) -> None:
    """Return once `host:port` accepts a connection; TimeoutError/RuntimeError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the process exited with status {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing accepts connections on {host}:{port} "
                                   f"after {timeout:g} s") from None
            time.sleep(0.02)


class Mosquitto:
    """One broker process with a generated config in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        *,
        password_file: Path | None = None,
        acl_file: Path | None = None,
        allow_anonymous: bool | None = None,
        extra: tuple[str, ...] = (),
        port: int | None = None,
        config_text: str | None = None,
    ) -> None:
        """`config_text`: a whole config of the caller's (`port` names its listener),
        instead of the one made from the other options."""
        self.binary = find_tool("mosquitto")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = HOST
        self.port = port if port is not None else free_port()
        self.config = self.workdir / "mosquitto.conf"
        self.log = self.workdir / "mosquitto.log"
        if allow_anonymous is None:
            allow_anonymous = password_file is None
        lines = [
            f"listener {self.port} {HOST}",
            f"allow_anonymous {'true' if allow_anonymous else 'false'}",
            "persistence false",
            # Run as whoever runs the tests: as root Mosquitto would otherwise drop to
            # the `mosquitto` user before reading the (0600) password and ACL files.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
        ]
        if password_file is not None:
            lines.append(f"password_file {password_file}")
        if acl_file is not None:
            lines.append(f"acl_file {acl_file}")
        self.config.write_text(config_text if config_text is not None else
                               "\n".join([*lines, *extra]) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self, timeout: float = 5.0) -> Mosquitto:
        if self.process is not None:
            raise RuntimeError("the broker is already running")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_for_port(self.host, self.port, timeout, self.process)
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            raise RuntimeError(f"mosquitto did not start: {exc}; its log:\n{self.log_text()}"
                               ) from None
        return self

    def stop(self, timeout: float = 3.0, kill: bool = False) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after `timeout` seconds), or kill
        it at once (`kill`: no goodbye to its clients, as in a crash)."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, timeout, kill)

    def restart(self, timeout: float = 5.0, kill: bool = False) -> Mosquitto:
        """Stop (or kill) and start again on the same port: clients see the connection
        drop; with persistence off, the broker forgets every session and message."""
        self.stop(kill=kill)
        return self.start(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> Mosquitto:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


PRODUCTION_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / \
    "production.conf"


def production_config(folder: Path, tls_port: int, local_port: int) -> str:
    """deploy/mosquitto/production.conf as it is, but for a private broker: its files
    under `folder` (meshdl/passwd, meshdl/acl, meshdl/tls/*, meshdl/limits.d/ with the
    size limits of `meshdl deploy credentials`, data/), its listeners on free loopback
    ports, run as this user. Raises if the file no longer says what is replaced (a
    change there must be seen here)."""
    if not PRODUCTION_CONF.is_file():
        raise FileNotFoundError(f"{PRODUCTION_CONF} (the production config is in a source "
                                "checkout of meshdl)")
    text = PRODUCTION_CONF.read_text()
    replacements = {
        "/etc/mosquitto/meshdl/": f"{folder}/meshdl/",
        "/var/lib/mosquitto/": f"{folder}/data/",
        "\nlistener 8883\n": f"\nlistener {tls_port} {HOST}\n",
        "\nlistener 1883 127.0.0.1\n": f"\nlistener {local_port} {HOST}\n",
        "\nuser mosquitto\n": f"\nuser {pwd.getpwuid(os.getuid()).pw_name}\n",
    }
    for old, new in replacements.items():
        if old not in text:
            raise ValueError(f"production.conf no longer contains {old!r}")
        text = text.replace(old, new)
    return text


def stop_process(process: subprocess.Popen[bytes], timeout: float = 3.0,
                 kill: bool = False) -> None:
    """SIGTERM a child process and reap it, with SIGKILL if it outlives `timeout`
    seconds (`kill`: SIGKILL at once, as in a crash)."""
    if process.poll() is not None:
        return
    if kill:
        process.kill()
    else:
        process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)
