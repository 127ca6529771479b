"""systemd's service notifications: READY, STATUS, STOPPING and the watchdog's pings.

Under a unit with `Type=notify` systemd passes `$NOTIFY_SOCKET`, and with `WatchdogSec=`
also `$WATCHDOG_USEC`; the service sends datagrams such as `WATCHDOG=1` to that socket,
and systemd kills and restarts it when the pings stop for longer than the watchdog
interval. The pings come from a task on the process's asyncio loop, so what they prove
is that the loop still turns: a wave stuck in a blocking call, a deadlock or a runaway
computation stops them. Waiting for a broker that is down does not (the process is
doing its job; restarting it would not bring the broker back).

The protocol is one datagram per notification, so no libsystemd is needed. Outside
systemd every call does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Mapping


class Notifier:
    """The notifications of this process to its systemd unit (if any)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        # A socket path, or '@name' for the abstract namespace (a leading NUL).
        self.address = "\0" + address[1:] if address.startswith("@") else \
            address if address.startswith("/") else None
        self.watchdog_s = _watchdog_seconds(env)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send `KEY=value` fields in one datagram; False when there is no systemd to
        tell, or it could not be told (never raises: a service runs on without it)."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never wait: a receiver that stopped reading would freeze the event
                # loop once its queue is full; a ping that cannot go now is dropped.
                sock.setblocking(False)
                sock.sendto("\n".join(fields).encode(), self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    async def keep_alive(self) -> None:
        """Ping the watchdog at half its interval for as long as the loop runs (cancel
        the task to stop); returns at once when no watchdog is set."""
        if self.address is None or self.watchdog_s is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s / 2)

    def start_keep_alive(self) -> asyncio.Task[None]:
        """`keep_alive` as a task of the running loop."""
        return asyncio.get_running_loop().create_task(self.keep_alive())


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a keep-alive task and wait until it has stopped."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    """The watchdog interval, if it is meant for this process (`$WATCHDOG_PID`)."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
        pid = int(env.get("WATCHDOG_PID", os.getpid()))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 and pid == os.getpid() else None
