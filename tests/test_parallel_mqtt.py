"""Several meshes and a parameter server over one real Mosquitto: the same parameters
as the simulator's bsp."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from meshdl.config import RunConfig, load_run_config
from meshdl.data.datasets import Dataset
from meshdl.data.lounge import generate_lounge
from meshdl.edge.remote import MqttEngine
from meshdl.mqtt.localbroker import free_port
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import push_topic, weights_topic
from meshdl.training.checkpoint import load_checkpoint
from meshdl.training.edge_run import train_with_server
from meshdl.training.parallel import train_parallel
from meshdl.training.ps_run import ServerRun, serve
from tests.helpers import TWO_MESHES_TOML


def _config(folder: Path, mesh_id: int) -> RunConfig:
    path = folder / f"mesh{mesh_id}.toml"
    path.write_text(TWO_MESHES_TOML.format(mesh_id=mesh_id))
    return load_run_config(path)


class _Thread(threading.Thread):
    """A thread whose outcome (result or exception) the test reads after `join`."""

    def __init__(self, target, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn, self.result, self.error = target, None, None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _start_edges(configs: list[RunConfig], data: Dataset, address: BrokerAddress,
                 resend_s: float) -> list[tuple[MqttEngine, _Thread]]:
    """Each mesh's edge training with the server, in a thread: (engine, thread) each."""
    edges = []
    for config in configs:
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        edges.append((engine, _Thread(
            lambda c=config, e=engine: train_with_server(c, data, e, resend_s=resend_s,
                                                        patience_s=120.0),
            f"edge{config.mesh.mesh_id}")))
    for _, thread in edges:
        thread.start()
    return edges


@pytest.mark.slow
def test_two_meshes_and_a_server_over_mosquitto_train_to_the_simulators_bsp(
        mosquitto, tmp_path) -> None:
    configs = [_config(tmp_path, mesh_id) for mesh_id in (1, 2)]
    data = generate_lounge(configs[0].data)
    reference, _ = train_parallel(configs[0], data)  # two virtual meshes, bsp
    address = BrokerAddress.parse(mosquitto.url)
    run = ServerRun(configs[0], data, checkpoints=tmp_path / "ps")
    server = _Thread(lambda: asyncio.run(serve(run, address)), "ps")
    cells = list(MeshSpec(1, configs[0].model).topology.cells())
    with BackgroundNodeHost(configs[0], cells, address, data, client="hosts1"), \
            BackgroundNodeHost(configs[1], cells, address, data, client="hosts2"):
        server.start()
        edges = _start_edges(configs, data, address, resend_s=2.0)
        for engine, thread in edges:
            thread.join(300)
            engine.close()
            assert thread.error is None, thread.error
        server.join(60)
        assert server.error is None and not server.is_alive(), server.error
    scale = float(np.abs(reference.flat).max())
    np.testing.assert_allclose(run.model.flat, reference.flat, rtol=1e-5, atol=1e-5 * scale)
    for _, thread in edges:  # each edge ends holding the server's model
        model, history = thread.result
        np.testing.assert_array_equal(model.flat, run.model.flat)
        assert [e.epoch for e in history.epochs] == [1, 2]
    assert len(run.history.epochs) == 2 and (tmp_path / "ps" / "checkpoint.npz").exists()
    assert run.server.staleness == {0: 2 * 2 * 4}  # 2 meshes x 2 epochs x 4 steps


@pytest.mark.slow
def test_a_server_stopped_after_an_epoch_and_resumed_ends_on_the_same_parameters(
        mosquitto, tmp_path) -> None:
    configs = [_config(tmp_path, mesh_id) for mesh_id in (1, 2)]
    data = generate_lounge(configs[0].data)
    reference, _ = train_parallel(configs[0], data)
    address = BrokerAddress.parse(mosquitto.url)
    first = ServerRun(configs[0], data, checkpoints=tmp_path / "ps", session=1)
    server = _Thread(lambda: asyncio.run(serve(
        first, address, stop=lambda: len(first.history.epochs) >= 1)), "ps")
    cells = list(MeshSpec(1, configs[0].model).topology.cells())
    with BackgroundNodeHost(configs[0], cells, address, data, client="hosts1"), \
            BackgroundNodeHost(configs[1], cells, address, data, client="hosts2"):
        server.start()
        edges = _start_edges(configs, data, address, resend_s=0.5)
        server.join(120)
        assert server.error is None and not server.is_alive(), server.error
        assert len(first.history.epochs) == 1  # stopped there: the edges wait
        again = ServerRun(configs[0], data, checkpoints=tmp_path / "ps",
                          resume=load_checkpoint(tmp_path / "ps"), session=2)
        assert again.server.version == 4
        assert [e.train_loss for e in again.history.epochs] == \
            [e.train_loss for e in first.history.epochs]
        resumed = _Thread(lambda: asyncio.run(serve(again, address)), "ps-again")
        resumed.start()
        for engine, thread in edges:
            thread.join(300)
            engine.close()
            assert thread.error is None, thread.error
        resumed.join(60)
        assert resumed.error is None, resumed.error
    scale = float(np.abs(reference.flat).max())
    np.testing.assert_allclose(again.model.flat, reference.flat, rtol=1e-5,
                               atol=1e-5 * scale)
    for _, thread in edges:
        model, history = thread.result
        np.testing.assert_array_equal(model.flat, again.model.flat)
        assert [e.epoch for e in history.epochs] == [1, 2]
        assert history.parallel["worker"].get("server_restarts", 0) >= 1


def _logins(folder: Path) -> dict[str, str]:
    logins = {}
    for env in (folder / "secrets").glob("*.env"):
        values = dict(line.split("=", 1) for line in env.read_text().splitlines()
                      if line and not line.startswith("#"))
        logins[values["MESHDL_MQTT_USER"]] = values["MESHDL_MQTT_PASSWORD"]
    return logins


async def _heard(listen: aiomqtt.Client, filter_: str, publish, seconds: float = 3.0
                 ) -> list[str]:
    """The first topic `listen` hears on `filter_` within `seconds` after `publish()`
    runs (none: an empty list)."""
    await listen.subscribe(filter_, 1)
    await asyncio.sleep(0.3)
    await publish()
    heard: list[str] = []
    with contextlib.suppress(asyncio.TimeoutError):
        async with asyncio.timeout(seconds):
            async for message in listen.messages:
                heard.append(message.topic.value)
                break
    await listen.unsubscribe(filter_)
    return heard


def test_a_buildings_bridge_carries_its_meshs_pushes_and_weights_and_nothing_else(
        mosquitto_factory, tmp_path, cli) -> None:
    central = tmp_path / "central"
    _config(tmp_path, 1)
    mesh_file = tmp_path / "mesh1.toml"
    port = free_port()
    code, _, err = cli("deploy", "central", "--mesh", mesh_file, "--central",
                       f"127.0.0.1:{port}", "--out", central)
    assert code == 0, err
    logins = _logins(central)
    assert set(logins) == {"ps", "bridge-1", "bridge-2"}
    hub = mosquitto_factory(password_file=central / "passwd", acl_file=central / "acl",
                            port=port)
    building = mosquitto_factory(extra=tuple(
        (central / "bridge-1.conf").read_text().splitlines()))

    async def check() -> None:
        async with aiomqtt.Client(hub.host, hub.port, username="ps",
                                  password=logins["ps"]) as ps, \
                aiomqtt.Client(building.host, building.port) as edge, \
                aiomqtt.Client(hub.host, hub.port, username="bridge-1",
                               password=logins["bridge-1"]) as intruder:
            await asyncio.sleep(1.0)  # the bridge connects
            assert await _heard(ps, "meshdl/+/edge/ps/push", lambda: edge.publish(
                push_topic(1), b"push", 1)) == [push_topic(1)]
            assert await _heard(edge, weights_topic(1), lambda: ps.publish(
                weights_topic(1), b"weights", 1)) == [weights_topic(1)]
            # Mesh 1's bridge cannot pose as mesh 2's edge, nor as the server.
            assert await _heard(ps, "meshdl/+/edge/ps/push", lambda: intruder.publish(
                push_topic(2), b"forged", 1), 1.0) == []
            assert await _heard(edge, weights_topic(1), lambda: intruder.publish(
                weights_topic(1), b"forged", 1), 1.0) == []

    asyncio.run(check())
