"""Services tell systemd when they are ready and ping its watchdog while their event loop
turns, even while the broker is away; outside systemd nothing is sent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshdl.mqtt.sdnotify import Notifier
from tests.mosquitto import Mosquitto

MESH_TOML = "[model]\nrows = 2\ncols = 3\nhidden = 4\n\n[data]\ntrain = 8\ntest = 4\n"


@pytest.fixture
def systemd_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd's, in the abstract namespace (no path
    length limit, nothing to clean up)."""
    name = f"@meshdl-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name[1:])
    sock.settimeout(0.2)
    yield sock, name
    sock.close()


def _queued(sock: socket.socket) -> list[str]:
    """The notifications already in the socket's queue, without waiting for more."""
    got: list[str] = []
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while True:
            got.append(sock.recv(4096).decode())
    except BlockingIOError:
        return got
    finally:
        sock.settimeout(timeout)


def _received(sock: socket.socket, until: Callable[[list[str]], bool],
              sender: subprocess.Popen[bytes] | None = None,
              within: float = 60.0) -> list[str]:
    """Notifications (one string each) as they arrive, until `until(got)` holds or the
    `sender` process has exited (what it sent before is still read). `within` only
    guards against a hang: a busy machine makes this slower, never different."""
    got: list[str] = []
    deadline = time.monotonic() + within
    while not until(got) and time.monotonic() < deadline:
        if sender is not None and sender.poll() is not None:
            return got + _queued(sock)
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
    return got


def _any(text: str) -> Callable[[list[str]], bool]:
    return lambda got: any(text in n for n in got)


def _pings(count: int) -> Callable[[list[str]], bool]:
    return lambda got: got.count("WATCHDOG=1") >= count


def test_notifications_reach_the_socket_systemd_names(systemd_socket) -> None:
    sock, name = systemd_socket
    systemd = Notifier({"NOTIFY_SOCKET": name})
    assert systemd.ready("connecting") and systemd.stopping()
    assert _queued(sock) == ["READY=1\nSTATUS=connecting", "STOPPING=1"]


def test_the_watchdog_is_pinged_at_half_its_interval(systemd_socket, monkeypatch) -> None:
    sock, name = systemd_socket
    systemd = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "100000"})
    assert systemd.watchdog_s == pytest.approx(0.1)
    # The loop's clock is not the test's business: count the waits between pings.
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise asyncio.CancelledError  # as when the service stops the task
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(systemd.keep_alive())
    assert waits == pytest.approx([0.05, 0.05, 0.05])
    assert _queued(sock) == ["WATCHDOG=1"] * 3  # one ping before each wait


def test_a_receiver_that_stopped_reading_never_blocks_the_sender(systemd_socket) -> None:
    _, name = systemd_socket  # bound, never read: its queue fills after a few datagrams
    queue = Path("/proc/sys/net/unix/max_dgram_qlen")
    overflow = (int(queue.read_text()) if queue.exists() else 512) + 50
    systemd = Notifier({"NOTIFY_SOCKET": name})
    sent: list[bool] = []
    # A blocking send would wait forever for a reader: the join's limit only bounds that.
    sender = threading.Thread(target=lambda: sent.extend(
        systemd.notify("WATCHDOG=1") for _ in range(overflow)), daemon=True)
    sender.start()
    sender.join(30)
    assert not sender.is_alive(), "a full queue blocked the sender"
    assert sent[0] and not sent[-1]  # the first went, the overflow is dropped


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": "relative/path"}])
def test_outside_systemd_nothing_is_sent(env) -> None:
    systemd = Notifier(env)
    assert not systemd.enabled
    assert not systemd.ready("x") and not systemd.stopping()


def test_a_watchdog_meant_for_another_process_is_not_fed(systemd_socket) -> None:
    sock, name = systemd_socket
    systemd = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "100000",
                        "WATCHDOG_PID": str(os.getpid() + 1)})
    assert systemd.watchdog_s is None
    asyncio.run(asyncio.wait_for(systemd.keep_alive(), 1.0))  # returns at once
    assert _queued(sock) == []  # anything it had sent would be queued by now


def _node_host(mesh_file: Path, url: str, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFY_SOCKET": name, "WATCHDOG_USEC": "200000"}
    return subprocess.Popen(
        [sys.executable, "-m", "meshdl", "nodes", "run", "--cells", "all", "--broker", url,
         "--mesh", str(mesh_file), "--sensor", "synthetic"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def test_a_node_host_is_ready_pings_and_says_it_stops(systemd_socket, mosquitto: Mosquitto,
                                                      tmp_path) -> None:
    sock, name = systemd_socket
    mesh_file = tmp_path / "mesh.toml"
    mesh_file.write_text(MESH_TOML)
    host = _node_host(mesh_file, mosquitto.url, name)
    try:
        started = _received(sock, _any("STATUS=serving"), sender=host)
        assert started[0].startswith("READY=1")
        assert any(n.startswith("STATUS=serving 6 cells") for n in started)
        # The pings go on while it serves (their interval: the test above).
        assert _received(sock, _pings(3), sender=host).count("WATCHDOG=1") >= 3
    finally:
        host.send_signal(signal.SIGTERM)
        stopping = _received(sock, _any("STOPPING=1"), sender=host)
        assert host.wait(30) == 0, host.stderr.read().decode()
    assert "STOPPING=1" in stopping


def test_a_node_host_waiting_for_its_broker_keeps_the_watchdog_fed(systemd_socket,
                                                                   tmp_path) -> None:
    sock, name = systemd_socket
    mesh_file = tmp_path / "mesh.toml"
    mesh_file.write_text(MESH_TOML)
    with socket.socket() as probe:  # a free port where no broker listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    host = _node_host(mesh_file, f"mqtt://127.0.0.1:{port}", name)
    try:
        started = _received(sock, _any("READY=1"), sender=host)
        assert started and started[-1].startswith("READY=1\nSTATUS=connecting")
        # Still no broker: the pings go on (at what interval: the test above).
        waiting = _received(sock, _pings(5), sender=host)
        assert waiting.count("WATCHDOG=1") >= 5
        assert not any(n.startswith("STATUS=serving") for n in waiting)
    finally:
        host.send_signal(signal.SIGTERM)
        assert host.wait(30) == 0, host.stderr.read().decode()
