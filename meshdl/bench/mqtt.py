"""Benchmark: training epochs over a real Mosquitto broker, against the broker's own
throughput measured in the same run.

The mesh: the seed configuration (or any), every cell in ONE node-host process, the edge
in this process, a private Mosquitto on a free loopback port (or `--broker`). The host
hands messages between its own cells over in process, so the broker carries the edge's
traffic; with `via_broker` every message of the mesh crosses the broker, as between
separate Pis. Two counts: the mesh's messages (the protocol's, on the virtual mesh's
ledger for the same waves: the protocol is deterministic) and the broker's deliveries
(the edge's session counts what it sent and received; via the broker, the ledger's
count is the deliveries). The reference: `mosquitto_pub -l` publishing as many
messages of the mean mesh message size to one `mosquitto_sub` through the same broker,
QoS 0, as fast as the tools go.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from meshdl.config import RunConfig
from meshdl.data.augment import training_data
from meshdl.data.datasets import Dataset, save_dataset
from meshdl.edge.remote import MqttEngine
from meshdl.errors import MeshdlError
from meshdl.mqtt.localbroker import Mosquitto, stop_process
from meshdl.mqtt.session import PASSWORD_ENV, USER_ENV, BrokerAddress
from meshdl.mqtt.tools import find_tool
from meshdl.sim.mesh import MeshEngine
from meshdl.training.loop import EVAL_BATCH, train


def mesh_messages(config: RunConfig, data: Dataset, clients: int = 1) -> tuple[int, int]:
    """(broker deliveries, bytes) of the waves one `train(config)` run sends over MQTT to
    `clients` node hosts, counted on the virtual mesh's ledger with the edge broadcasting
    parameters. The ledger counts a broadcast once per cell; a broker delivers it once
    per subscribed client."""
    engine = MeshEngine(training_data(config.train, data, config.model), config.mesh.edge_at,
                        config.mesh.mesh_id, params_via="broadcast")
    try:
        train(config, data, engine=engine)
        comm = engine.report()
    finally:
        engine.close()
    params = comm["classes"]["params"]
    per_cell = params["bytes"] // params["messages"]
    broadcasts = params["broadcast"]["transmissions"] * clients
    messages = comm["total_messages"] - params["messages"] + broadcasts
    return messages, comm["total_bytes"] - params["bytes"] + broadcasts * per_cell


def broker_throughput(address: BrokerAddress, messages: int, size: int,
                      timeout: float = 120.0) -> dict[str, float]:
    """Messages per second delivered from mosquitto_pub -l to mosquitto_sub through the
    broker at QoS 0, counted on the subscriber (QoS 0 may drop under overload: the rate
    is of what arrived, and the count says how much did)."""
    sub_tool, pub_tool = find_tool("mosquitto_sub"), find_tool("mosquitto_pub")
    # mosquitto_pub/sub take a password only as an argument: a benchmark on a local broker.
    login = ["-u", address.username, "-P", address.password or ""] if address.username else []
    where = ["-h", address.host, "-p", str(address.port)]
    # Lines of `size - 1` bytes and a newline: -l publishes each line as one message.
    line = b"x" * max(size - 1, 1) + b"\n"
    sub = subprocess.Popen([sub_tool, *where, *login, "-t", "meshdl-bench/#", "-q", "0",
                            "-F", "%l"], stdout=subprocess.PIPE)
    received, last = 0, 0.0

    def count() -> None:
        nonlocal received, last
        for _ in sub.stdout:
            received += 1
            last = time.perf_counter()

    reader = threading.Thread(target=count, daemon=True)
    reader.start()
    try:
        time.sleep(0.5)  # the subscription must exist before the first publish
        started = time.perf_counter()
        pub = subprocess.run([pub_tool, *where, *login, "-t", "meshdl-bench/x", "-l",
                              "-q", "0"], input=line * messages, timeout=timeout)
        if pub.returncode != 0:
            raise MeshdlError(f"mosquitto_pub failed with status {pub.returncode}")
        while received < messages and time.perf_counter() - max(last, started) < 1.0:
            time.sleep(0.05)  # until everything arrived, or nothing has for a second
    except subprocess.TimeoutExpired:
        raise MeshdlError(f"mosquitto_pub did not finish {messages} messages in "
                          f"{timeout:g} s") from None
    finally:
        sub.kill()
        reader.join(5)
    if received == 0:
        raise MeshdlError("mosquitto_sub received nothing from mosquitto_pub")
    return {"messages_per_s": received / (last - started), "received": received,
            "sent": messages, "size": size}


def bench_mqtt(config: RunConfig, data: Dataset, broker: str | None = None,
               log: Any = None, via_broker: bool = False) -> dict[str, Any]:
    """Train `config` over MQTT with one node host; time it; compare with the broker."""
    say = log or (lambda _text: None)
    with tempfile.TemporaryDirectory(prefix="meshdl-bench-") as tmp:
        folder = Path(tmp)
        private = None
        if broker is None:
            private = Mosquitto(folder / "broker").start()
            broker = private.url
        address = BrokerAddress.parse(broker)
        try:
            return _bench(config, data, address, folder, say, via_broker)
        finally:
            if private is not None:
                private.stop()


def _bench(config: RunConfig, data: Dataset, address: BrokerAddress, folder: Path,
           say: Any, via_broker: bool) -> dict[str, Any]:
    mesh_file, data_file = folder / "mesh.toml", folder / "data.npz"
    mesh_file.write_text(_toml(config))
    save_dataset(data, data_file)
    say("counting the epoch's messages on the virtual mesh")
    messages, nbytes = mesh_messages(config, data)
    say(f"starting one node host for {config.model.rows * config.model.cols} cells")
    host_log = folder / "node-host.log"
    # The login goes through the environment, never the command line (`ps` shows that).
    env = dict(os.environ)
    if address.username:
        env[USER_ENV], env[PASSWORD_ENV] = address.username, address.password or ""
    host = subprocess.Popen(
        [sys.executable, "-m", "meshdl", "nodes", "run", "--cells", "all", "--broker",
         f"{'mqtts' if address.tls else 'mqtt'}://{address.host}:{address.port}",
         "--mesh", str(mesh_file), "--data", str(data_file), "--name", "bench-host",
         *(["--via-broker"] if via_broker else [])],
        stdout=subprocess.DEVNULL, stderr=host_log.open("wb"), env=env)
    try:
        engine = MqttEngine.for_run(config, data, address, wave_timeout=60.0,
                                    nodes_timeout=120.0)
        try:
            say("training over MQTT")
            _, history = train(config, data, engine=engine)
            report = engine.report()
        except MeshdlError as exc:
            if host.poll() is not None:  # say why the node host died
                raise MeshdlError(f"{exc}; the node host exited: "
                                  f"{host_log.read_text(errors='replace')[-2000:]}") from None
            raise
        finally:
            engine.close()
    finally:
        stop_process(host, timeout=30)
    wall = history.wall_s
    edge_traffic = report["session"].get("sent", 0) + report["session"].get("received", 0)
    deliveries = messages if via_broker else edge_traffic
    say(f"measuring the broker alone with mosquitto_pub/sub ({messages} messages)")
    raw = broker_throughput(address, messages, max(1, nbytes // max(messages, 1)))
    return {
        "epochs": config.train.epochs, "cells": config.model.rows * config.model.cols,
        "train_samples": len(data.y_train), "batch": config.train.batch,
        "eval_batch": EVAL_BATCH, "via_broker": via_broker,
        "wall_s": wall, "wall_s_per_epoch": wall / config.train.epochs,
        "messages": messages, "bytes": nbytes, "messages_per_s": messages / wall,
        "broker_deliveries": deliveries, "broker_deliveries_per_s": deliveries / wall,
        "broker_messages_per_s": raw["messages_per_s"],
        "broker_messages_received": raw["received"],
        "ratio_to_broker": messages / wall / raw["messages_per_s"],
        "deliveries_ratio_to_broker": deliveries / wall / raw["messages_per_s"],
        "restarted_waves": report["edge"].get("restarted_waves", 0),
        "test_acc": history.final["test_acc"], "broker": str(address),
    }


def _toml(config: RunConfig) -> str:
    """The mesh file a node host reads: the run configuration as TOML."""
    lines = []
    for section in ("model", "data", "train", "mesh"):
        lines.append(f"[{section}]")
        for key, value in getattr(config, section).model_dump().items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            elif isinstance(value, tuple | list):
                lines.append(f"{key} = [{', '.join(str(v) for v in value)}]")
            elif value is not None:
                lines.append(f"{key} = {value}")
        lines.append("")
    return "\n".join(lines)

