"""Serving a node host over MQTT: its cells' readings, its connection, its loop.

`serve_cells` is what `meshdl node run` / `meshdl nodes run` run until SIGINT or SIGTERM;
`BackgroundNodeHost` runs the same loop on a thread of this process (`meshdl train
--transport mqtt`, tests). The loop: connect (waiting for the broker as long as it
takes), announce the host on its status topic with what the edge checks (cells, mesh
spec, data digest), hand every received message to `NodeHost.handle` and publish what
the cells send, until stopped; then say what was received, sent and rejected. With live
sensors it also samples them at the start of every slot and, halfway through it, starts
the slot's wave on its cells' cached parameters (`meshdl.nodes.live`: `LiveSampler`,
`SlotStarter`).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.augment import mirrors_of, training_data
from meshdl.data.datasets import Dataset, data_digest, load_dataset
from meshdl.errors import MeshdlError, UsageError
from meshdl.mqtt.sdnotify import Notifier, stop_task
from meshdl.mqtt.session import BrokerAddress, Session
from meshdl.mqtt.status import MAX_ERROR_CHARS
from meshdl.nodes.host import NodeHost, dataset_readings
from meshdl.nodes.live import LiveSampler, SlotStarter, live_ring
from meshdl.nodes.sensors import Sensor, sensor_from_spec
from meshdl.protocol.auth import SIGNED_KINDS, Authenticator, authenticator_for
from meshdl.protocol.deadlines import Learning, Policy
from meshdl.protocol.messages import Kind, Message
from meshdl.protocol.spec import MeshSpec, Split
from meshdl.protocol.topics import name_of
from meshdl.protocol.topology import Cell
from meshdl.protocol.wire import Wire

Say = Callable[[str], None]


# Best effort over MQTT: the least a deadline waits past a message's smoothed arrival
# time (a broker on a busy host delays a message by tens of milliseconds now and then).
MQTT_LEAST_MARGIN_S = 0.2


def _quiet(_line: str) -> None:
    """Say nothing (a host on a thread of a process that reports for itself)."""


@dataclass
class Readings:
    """What a node host's cells compute on: a data set's maps, or live sensors."""

    data: Dataset | None = None
    sensors: dict[Cell, Sensor] | None = None
    slot_s: float = 60.0
    channels: int = 1  # live: values a cell's ring holds (its reading, and the alive mask)
    data_digest: str | None = None  # of the data set as loaded (before augmentation)

    @classmethod
    def choose(cls, config: RunConfig, cells: list[Cell], data: Path | None,
               sensor: str | None, slot_s: float) -> Readings:
        if (data is None) == (sensor is None):
            raise UsageError("give either --data (replay a data set) or --sensor (live)")
        if data is not None:
            dataset = load_dataset(data)
            if (dataset.rows, dataset.cols) != (config.model.rows, config.model.cols):
                raise MeshdlError(f"data grid {dataset.rows} x {dataset.cols} does not match "
                                  f"the mesh {config.model.rows} x {config.model.cols}")
            return cls(data=training_data(config.train, dataset, config.model),
                       data_digest=data_digest(dataset))
        kind = sensor.partition(":")[0].lower()
        if len(cells) > 1 and kind in ("ds18b20", "bme280"):
            raise UsageError(f"--sensor {kind} is one physical sensor: serve one cell with "
                             "`meshdl node run`")
        if config.model.readings != 1:
            raise UsageError("live sensors give one reading per cell: the model must read "
                             "one input channel (and the alive mask, if it has one)")
        return cls(sensors={cell: sensor_from_spec(sensor, cell) for cell in cells},
                   slot_s=slot_s, channels=config.model.in_channels)

    @property
    def originals(self) -> int | None:
        """Maps per mirror of the training readings (`augment.mirrors_of`), or None."""
        return None if self.data is None else mirrors_of(self.data)

    def of(self, cell: Cell) -> dict[int, np.ndarray]:
        if self.data is not None:
            return dataset_readings(self.data, cell)
        return {Split.LIVE: live_ring(self.channels)}


def host_spec(config: RunConfig) -> MeshSpec:
    """The mesh a node host serves: over a broker, the edge publishes parameters once."""
    return MeshSpec(config.mesh.mesh_id, config.model, config.mesh.edge_at, "broadcast",
                    config.mesh.max_message_bytes, config.mesh.auth,
                    compress=config.mesh.compress, activations=config.mesh.activations,
                    delta=config.mesh.delta)


def best_effort(host: NodeHost, config: RunConfig) -> None:
    """With `mesh.recovery = "best-effort"`: every cell gives up on a message at a
    deadline learnt from the first wave of its kind, fills it in by `mesh.policy`,
    reports silent neighbours, and says hello when it hears no PARAMS for
    `mesh.hello_after_s` seconds (PROTOCOL.md, "Dead nodes")."""
    if config.mesh.recovery != "best-effort":
        return
    learning = Learning(config.mesh.patience, MQTT_LEAST_MARGIN_S)
    for node in host.nodes.values():
        node.learn_deadlines(Policy(config.mesh.policy), learning)
        node.effort.heard_at, node.effort.hello_after = host.clock(), config.mesh.hello_after_s


def serve_cells(config: RunConfig, cells: list[Cell], address: BrokerAddress,
                readings: Readings, client: str, stop: asyncio.Event | None = None,
                local_delivery: bool = True, say: Say = _quiet) -> NodeHost:
    """Run a node host for `cells` until SIGINT/SIGTERM (or `stop` is set); `say` gets
    the lines a person watching should read (serving, stopped, isolated cells)."""
    spec = host_spec(config)
    auth = authenticator_for(spec, cells, config.mesh.keys, config.mesh.auth)
    host = NodeHost(spec, cells, readings.of, time.monotonic, local_delivery,
                    originals=readings.originals)
    best_effort(host, config)
    sampler = None if readings.sensors is None else LiveSampler(
        host.nodes, readings.sensors, readings.slot_s, alive=config.model.alive)
    asyncio.run(serve_host(host, address, client, stop, sampler, Notifier(),
                           readings.data_digest, auth, say))
    return host


async def serve_host(host: NodeHost, address: BrokerAddress, client: str,
                     stop: asyncio.Event | None, sampler: LiveSampler | None = None,
                     systemd: Notifier | None = None, data: str | None = None,
                     auth: Authenticator | None = None, say: Say = _quiet) -> None:
    """Serve until `stop`; `systemd`: the process's unit, told when the host is ready
    (its kernels are compiled: it may connect to the broker later), what it does, and
    pinged while the loop turns; `data`: the digest of the data set it replays, and
    `auth`: its keys, when the mesh authenticates messages."""
    stop = stop or asyncio.Event()
    systemd = systemd or Notifier({})
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread: the caller stops us
            break
    # What the edge checks before its first wave: the mesh this host runs, its data.
    status = {"role": "node-host", "cells": [name_of(c) for c in host.nodes],
              "spec": host.spec.summary, "data": data}
    # A node host waits for its broker as long as it takes (until it is stopped).
    session = Session(address, host.spec.mesh_id, client, host.subscriptions(),
                      status=status, connect_timeout_s=None,
                      wire=Wire(host.spec.mesh_id, auth), stats=host.stats,
                      status_extra=lambda: {**rejections(host), **unread(sampler)},
                      sign_status=None if auth is None else auth.sign_status)
    sampling = None if sampler is None else asyncio.create_task(sampler.run(stop))
    # Live: every slot's wave starts here, by this host's clock (scheduled slots).
    starter = None if sampler is None else SlotStarter(host, sampler)
    keep_alive = systemd.start_keep_alive()
    systemd.ready(f"connecting to {address}")
    try:
        if await session.connect(stop.is_set):
            serving = (f"serving {len(host.nodes)} cells of mesh {host.spec.mesh_id} on "
                       f"{address} as {client}")
            say(serving)
            systemd.status(serving)
            await session.run(pinning(host, auth), tick=Ticker(host, session, starter,
                                                               sampler),
                              until=stop.is_set)
    finally:
        stop.set()
        systemd.stopping()
        if sampling is not None:
            await sampling
        await session.close()
        await stop_task(keep_alive)
    stats = host.node_stats()
    rejected = sum(rejections(host)["rejected"].values())
    say(f"stopped: {stats['received']} messages in from the broker, "
        f"{stats['delivered_locally']} handed over in process, {stats['sent']} "
        f"published; the cells accepted {stats['accepted']} and rejected {rejected}; "
        f"{stats['reconnects']} reconnects")
    for cell, error in host.failed.items():
        say(f"error: cell {name_of(cell)} failed and was isolated: {error}")


class Ticker:
    """What the receive loop runs between messages: start a slot that is due (live),
    the cells' deadlines (best effort), and a status record naming the cells that read
    nothing for the last slot."""

    def __init__(self, host: NodeHost, session: Session, starter: SlotStarter | None,
                 sampler: LiveSampler | None) -> None:
        self.host, self.session = host, session
        self.starter, self.sampler = starter, sampler
        self.told: int | None = None  # the last slot whose unread cells were announced

    async def __call__(self) -> None:
        out = [] if self.starter is None else self.starter.begin()
        out += self.host.tick(time.monotonic())
        if out:
            await self.session.send(out)
        sampler = self.sampler
        # At once, not with the next heartbeat: the edge names these cells when the
        # slot's wave gets no result, within this slot. Published as the heartbeat is,
        # beside the loop: awaiting its acknowledgement here held up everything received,
        # and under a flood its late PUBACK tore the connection down. One not published
        # (the last still unacknowledged) is tried again at the next tick.
        if sampler is not None and sampler.last_errors and sampler.sampled != self.told \
                and self.session.beat():
            self.told = sampler.sampled


def pinning(host: NodeHost, auth: Authenticator | None) -> Callable[[str, Message],
                                                                   list[Message]]:
    """`host.handle`, after which the authenticator keeps the edge's signature of the
    parameters each cell has cached (`Authenticator.pin`): what its repairs send, even
    after the edge has resent later slots the cells began on their own."""
    if auth is None:
        return host.handle

    def handle(topic: str, message: Message) -> list[Message]:
        out = host.handle(topic, message)
        if message.header.kind in SIGNED_KINDS:  # only these change what is cached
            auth.pin(Kind.PARAMS, {(node.cached.session, node.cached.step)
                                   for node in host.nodes.values() if node.cached})
        return out

    return handle


def rejections(host: NodeHost) -> dict[str, Any]:
    """Every rejection, wherever it was counted (by the cells, the host, its connection),
    by reason, what the broker refused of its messages, and the isolated cells: what the
    status record and the stop line say."""
    counts: Counter[str] = Counter()
    refused: Counter[str] = Counter()  # what the broker refused of ours (MQTT 5 reasons)
    for name, n in host.node_stats().items():
        if name.startswith("rejected:"):
            counts[name.removeprefix("rejected:")] += n
        elif name.startswith("refused:"):
            refused[name.removeprefix("refused:")] += n
    return {"rejected": dict(sorted(counts.items())), "refused": dict(sorted(refused.items())),
            "failed": [name_of(cell) for cell in host.failed]}


def unread(sampler: LiveSampler | None) -> dict[str, Any]:
    """What the status record says of the last sampled slot's cells without a valid
    reading (nothing when every cell was read)."""
    if sampler is None or not sampler.last_errors or sampler.sampled is None:
        return {}
    errors = sampler.last_errors
    first = min(errors)
    return {"unread": [name_of(cell) for cell in sorted(errors)],
            "unread_slot": sampler.sampled,
            "unread_error": f"{name_of(first)}: {errors[first]}"[:MAX_ERROR_CHARS]}


class BackgroundNodeHost:
    """A node host on a thread of this process (`meshdl train --transport mqtt`, tests)."""

    def __init__(self, config: RunConfig, cells: list[Cell], address: BrokerAddress,
                 data: Dataset | Readings, client: str = "host-local",
                 local_delivery: bool = True) -> None:
        readings = (data if isinstance(data, Readings)
                    else Readings(data=training_data(config.train, data, config.model),
                                  data_digest=data_digest(data)))
        spec = host_spec(config)
        self.data_digest = readings.data_digest
        self.auth = authenticator_for(spec, cells, config.mesh.keys, config.mesh.auth)
        self.host = NodeHost(spec, cells, readings.of, time.monotonic, local_delivery,
                             originals=readings.originals)
        best_effort(self.host, config)
        self.sampler = None if readings.sensors is None else LiveSampler(
            self.host.nodes, readings.sensors, readings.slot_s, alive=config.model.alive)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, args=(address, client),
                                        name=f"meshdl-{client}", daemon=True)

    def _main(self, address: BrokerAddress, client: str) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await serve_host(self.host, address, client, self._stop, self.sampler, None,
                             self.data_digest, self.auth)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by stop()
            self._error = exc
            self._ready.set()

    def __enter__(self) -> BackgroundNodeHost:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            self.stop()
            raise MeshdlError(f"node host did not start: {self._error or 'timed out'}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._thread.is_alive():
            raise MeshdlError("node host did not stop within 30 s")
        if self._error is not None:
            raise MeshdlError(f"node host failed: {self._error}") from self._error



