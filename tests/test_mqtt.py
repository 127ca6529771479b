"""Training over a real Mosquitto broker equals the virtual mesh; the broker can restart
mid-epoch; garbage on mesh topics is rejected and counted while training goes on."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import aiomqtt
import numpy as np
import pytest

from meshdl.config import RunConfig, load_run_config
from meshdl.data.datasets import Dataset, save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.edge.remote import MqttEngine
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress, Session
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.protocol.messages import EDGE, Kind, encode, make
from meshdl.protocol.topics import topic
from meshdl.training.loop import train
from tests.helpers import small_run_toml
from tests.mosquitto import Mosquitto

MESH_TOML = small_run_toml(10)


@pytest.fixture(scope="module")
def small_mesh(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Dataset, Path,
                                                                    Path, CNN]:
    """The mesh file, its data set, and the model the virtual mesh trains from them."""
    folder = tmp_path_factory.mktemp("mesh")
    mesh_file = folder / "mesh.toml"
    mesh_file.write_text(MESH_TOML)
    config = load_run_config(mesh_file)
    data = generate_lounge(config.data)
    data_file = save_dataset(data, folder / "data.npz")
    reference, _ = train(config, data)  # the virtual mesh
    return config, data, mesh_file, data_file, reference


def _assert_same_model(model: CNN, reference: CNN) -> None:
    scale = float(np.abs(reference.flat).max())
    np.testing.assert_allclose(model.flat, reference.flat, rtol=1e-5, atol=1e-5 * scale)


def _node_host_process(broker: Mosquitto, mesh_file: Path, data_file: Path,
                       cells: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "meshdl", "nodes", "run", "--cells", cells, "--broker",
               broker.url, "--mesh", str(mesh_file), "--data", str(data_file)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_training_over_mqtt_equals_the_virtual_mesh_with_nodes_in_two_processes(
        small_mesh, mosquitto, tmp_path) -> None:
    _, _, mesh_file, data_file, reference = small_mesh
    hosts = [_node_host_process(mosquitto, mesh_file, data_file, cells)
             for cells in ("0-1,0-4", "2-3,0-4")]
    try:
        edge = subprocess.run(
            [sys.executable, "-m", "meshdl", "edge", "run", "--broker", mosquitto.url,
             "--mesh", str(mesh_file), "--data", str(data_file), "--out",
             str(tmp_path / "run"), "--nodes-timeout", "60"],
            capture_output=True, text=True, timeout=240)
        assert edge.returncode == 0, edge.stderr
    finally:
        for host in hosts:
            host.terminate()
        for host in hosts:
            assert host.wait(30) == 0, host.stderr.read().decode()
    _assert_same_model(CNN.load(tmp_path / "run" / "model.npz"), reference)


def test_broker_restart_mid_epoch_loses_nothing_and_applies_nothing_twice(
        small_mesh, mosquitto) -> None:
    config, data, _, _, reference = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    restarted = threading.Event()

    def restart_after_a_few_steps(epoch: int, step: int, steps: int, loss: float) -> None:
        if epoch == 1 and step == 2 and not restarted.is_set():
            # Kill the broker while the next wave is under way, then bring it back.
            threading.Timer(0.05, lambda: (mosquitto.restart(kill=True),
                                           restarted.set())).start()

    # Two hosts: the broker carries their boundary traffic as well as the edge's.
    top, bottom = [c for c in cells if c[0] < 2], [c for c in cells if c[0] >= 2]
    with BackgroundNodeHost(config, top, address, data, client="top") as upper, \
            BackgroundNodeHost(config, bottom, address, data, client="bottom") as lower:
        engine = MqttEngine.for_run(config, data, address, wave_timeout=1.0,
                                    max_attempts=20)
        try:
            model, _ = train(config, data, engine=engine, progress=restart_after_a_few_steps)
            report = engine.report()
        finally:
            engine.close()
    assert restarted.is_set()
    assert report["session"]["reconnects"] >= 1
    for host in (upper, lower):
        assert host.host.node_stats()["accepted"] > 0
    _assert_same_model(model, reference)


def test_a_broker_away_beyond_the_edges_patience_leaves_a_checkpoint_to_resume_from(
        small_mesh, mosquitto, tmp_path) -> None:
    """The broker stops in the middle of epoch 2 and stays away longer than the edge
    waits: the run stops with a one-line error, keeping every update done; once the
    broker is back, resuming ends with the virtual mesh's parameters."""
    from meshdl.training.checkpoint import load_checkpoint

    config, data, _, _, reference = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]

    def stop_broker(epoch: int, step: int, _steps: int, _loss: float) -> None:
        if (epoch, step) == (2, 2):
            mosquitto.stop(kill=True)

    with BackgroundNodeHost(config, cells, address, data):
        engine = MqttEngine.for_run(config, data, address, wave_timeout=1.0,
                                    connect_timeout_s=1.5)
        try:
            with pytest.raises(MeshdlError, match="cannot reach the broker"):
                train(config, data, engine=engine, progress=stop_broker,
                      checkpoints=tmp_path)
        finally:
            engine.close()
        checkpoint = load_checkpoint(tmp_path)
        assert (checkpoint.epochs_done, checkpoint.steps_done) == (1, 2)
        mosquitto.start()
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        try:
            model, _ = train(config, data, engine=engine, checkpoints=tmp_path,
                             resume=checkpoint)
        finally:
            engine.close()
    _assert_same_model(model, reference)


def test_garbage_forged_and_oversized_payloads_are_rejected_and_counted(
        small_mesh, mosquitto, cli) -> None:
    config, data, _, _, reference = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    halo = encode(make(Kind.HALO, 1, 2**31, (0, 1), (1, 1), np.zeros((1, 1, 10)), layer=1))
    junk = [
        (topic(1, (0, 1), (1, 1), Kind.HALO), b"\x00garbage"),  # not a message at all
        (topic(1, (0, 1), (1, 1), Kind.HALO), b"MD" + os.urandom(2 * 1024 * 1024)),  # big
        (topic(1, (0, 2), (1, 1), Kind.HALO), halo),  # header says (0, 1), topic (0, 2)
        (topic(1, EDGE, (0, 0), Kind.SCATTER), halo),  # header and topic disagree
        (topic(1, (0, 1), (1, 1), Kind.HALO), halo[:-3]),  # truncated
    ]

    async def publish_junk() -> None:
        async with aiomqtt.Client(mosquitto.host, mosquitto.port) as client:
            for _ in range(3):
                for name, payload in junk:
                    await client.publish(name, payload)
                await asyncio.sleep(0.3)

    # Every message through the broker, as between Pis: the cells hear the junk too.
    with BackgroundNodeHost(config, cells, address, data, local_delivery=False) as host:
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        thread = threading.Thread(target=lambda: (time.sleep(0.5),
                                                  asyncio.run(publish_junk())))
        try:
            thread.start()
            model, _ = train(config, data, engine=engine)
        finally:
            thread.join(30)
            engine.close()
        stats = host.host.node_stats()
        # The host's next heartbeat (every 5 s) carries its rejections in its status
        # record: ask doctor (2 s of listening each) until it has come.
        deadline = time.monotonic() + 60  # a hang limit, not a timing claim
        while True:
            _, out, _ = cli("doctor", "--broker", mosquitto.url, "--json")
            said = json.loads(out).get("rejected", {}).get("host-local", {})
            heard = said.get("codec:payload_size", 0) >= 3 and said.get("topic_mismatch", 0) >= 3
            if heard or time.monotonic() > deadline:
                break
    rejected = {k: v for k, v in stats.items() if k.startswith("rejected")}
    assert rejected.get("rejected:topic_mismatch", 0) >= 3
    _assert_same_model(model, reference)
    # Every rejection reaches what the user reads: the status record, and doctor.
    findings = json.loads(out)
    said = findings.get("rejected", {}).get("host-local", {})
    assert said.get("topic_mismatch", 0) >= 3 and said.get("codec:payload_size", 0) >= 3, \
        findings
    assert any(line.startswith("note: host-local has rejected") for line in findings["lines"])


NESTING_BOMB = b"[" * 3000 + b"]" * 3000  # json.loads: RecursionError


async def _publish(broker: Mosquitto, user: str, password: str, name: str,
                   payload: bytes) -> None:
    async with aiomqtt.Client(broker.host, broker.port, username=user,
                              password=password) as client:
        await client.publish(name, payload, qos=1)


def _start_fails(broker: Mosquitto, config: RunConfig, data: Dataset,
                 retained: dict[str, bytes], error: str) -> MqttEngine:
    """With `retained` records on the broker, an edge refuses to start, saying `error`."""
    asyncio.run(_retain(broker, retained))
    engine = MqttEngine.for_run(config, data, BrokerAddress.parse(broker.url),
                                nodes_timeout=1.0)
    try:
        with pytest.raises(MeshdlError, match=error):
            engine.open(CNN(config.model))
    finally:
        engine.close()
    return engine


async def _retain(broker: Mosquitto, records: dict[str, bytes]) -> None:
    async with aiomqtt.Client(broker.host, broker.port) as client:
        for name, payload in records.items():
            await client.publish(name, payload, qos=1, retain=True)


def test_bad_retained_status_records_are_ignored_and_counted_not_fatal(
        small_mesh, mosquitto, cli, tmp_path) -> None:
    config, data, mesh_file, _, reference = small_mesh
    asyncio.run(_retain(mosquitto, {
        "meshdl/1/status/r0c1": NESTING_BOMB,
        "meshdl/1/status/r0c2": b'{"role": "node-host", "state": "online", "mesh": 1, '
                                b'"cells": ["edge"]}',  # not a sensor cell
        "meshdl/1/status/r0c3": b"{" + b" " * (300 * 1024) + b"}",  # beyond the size limit
    }))
    code, out, err = cli("doctor", "--broker", mosquitto.url, "--mesh", mesh_file, "--json")
    assert code == 1, err  # no node host serves the cells: a finding, not a crash
    assert "unexpected" not in err
    findings = json.loads(out)
    assert findings["malformed"] == ["r0c1", "r0c2", "r0c3"]
    assert any(line.startswith("warning: 3 status records") for line in findings["lines"])
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    with BackgroundNodeHost(config, cells, address, data):
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        try:
            model, history = train(config, data, engine=engine)
        finally:
            engine.close()
    assert history.comm["engine"]["rejected:bad_status"] >= 3
    _assert_same_model(model, reference)


def test_evaluation_waves_fit_a_broker_message_size_limit(small_mesh,
                                                          mosquitto_factory) -> None:
    # With the production broker's 1 MiB limit, the seed configuration's 1,024-sample
    # evaluation waves (GATHER of 2.4 MB) once got every client disconnected. Here the
    # same at a small scale: GATHER of 20 test samples is 2,448 bytes, the limit 2,048.
    config, data, _, _, reference = small_mesh
    limit = 2048
    config = config.model_copy(update={"mesh": config.mesh.model_copy(
        update={"max_message_bytes": limit})})
    broker = mosquitto_factory(extra=(f"message_size_limit {limit}",
                                      f"max_packet_size {limit + 1024}"))
    address = BrokerAddress.parse(broker.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    with BackgroundNodeHost(config, cells, address, data, local_delivery=False):
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0, max_attempts=2)
        try:
            model, history = train(config, data, engine=engine)
        finally:
            engine.close()
    assert engine.spec_for(model).max_batch == 16  # (2048 - 48) // 4 // 30
    _assert_same_model(model, reference)
    assert history.final["test_acc"] == pytest.approx(
        float(np.mean(reference.predict(data.X_test) == data.y_test)))


def test_messages_the_broker_refuses_as_too_large_are_named_in_the_edges_error(
        small_mesh, mosquitto_factory) -> None:
    """The mesh file says 1 MiB, the broker takes packets of 2 KiB: the node host's
    GATHER of an evaluation wave gets it disconnected with MQTT 5's reason "packet too
    large", which its status record carries to the edge's error. (A payload above
    message_size_limit but within max_packet_size is dropped without a word at QoS 0:
    production.conf keeps the two 1 KiB apart, and the edge's error still asks.)"""
    config, data, *_ = small_mesh
    broker = mosquitto_factory(extra=("max_packet_size 2048",))
    address = BrokerAddress.parse(broker.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    with BackgroundNodeHost(config, cells, address, data, local_delivery=False) as host:
        engine = MqttEngine.for_run(config, data, address, wave_timeout=4.0, max_attempts=2)
        try:
            with pytest.raises(MeshdlError, match=r"the broker refused messages as too "
                                                  r"large \(from node host host-local\): "
                                                  r"mesh.max_message_bytes \(1048576\) must "
                                                  "not exceed what it takes"):
                train(config, data, engine=engine)
        finally:
            engine.close()
    assert host.host.stats["refused:packet_too_large"] >= 1, host.host.stats


class _Stopped(Exception):
    """Stands for the edge being killed mid-epoch."""


def test_an_edge_stopped_mid_epoch_resumes_to_the_virtual_meshs_parameters(
        small_mesh, mosquitto, tmp_path) -> None:
    from meshdl.training.checkpoint import load_checkpoint

    config, data, _, _, reference = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]

    def kill(epoch: int, step: int, _steps: int, _loss: float) -> None:
        if (epoch, step) == (2, 3):
            raise _Stopped

    with BackgroundNodeHost(config, cells, address, data):
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
        with pytest.raises(_Stopped):
            train(config, data, engine=engine, progress=kill, checkpoints=tmp_path)
        engine.close()
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)  # a new edge
        try:
            model, _ = train(config, data, engine=engine, checkpoints=tmp_path,
                             resume=load_checkpoint(tmp_path))
        finally:
            engine.close()
    _assert_same_model(model, reference)


def test_an_edge_restarted_after_a_faster_predecessor_takes_the_mesh_back(
        small_mesh, mosquitto, monkeypatch) -> None:
    # Wave numbers count sixteenths of a second: a predecessor that ran faster than 16
    # waves/s (here: a million steps ahead) once left every node treating new waves as old.
    import meshdl.edge.remote as remote

    config, data, _, _, reference = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    clock = remote.clock_step
    with BackgroundNodeHost(config, cells, address, data) as host:
        monkeypatch.setattr(remote, "clock_step", lambda: clock() + 1_000_000)
        fast = MqttEngine.for_run(config, data, address, wave_timeout=5.0, session=1)
        try:
            fast.loss_and_grads(CNN(config.model, seed=1), np.arange(10))
        finally:
            fast.close()
        monkeypatch.setattr(remote, "clock_step", clock)
        engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0, max_attempts=1,
                                    session=2)
        try:
            model, _ = train(config, data, engine=engine)
        finally:
            engine.close()
        assert host.host.node_stats()["resynchronised"] > 0
    _assert_same_model(model, reference)


def test_a_retained_claim_with_no_host_behind_it_starts_no_waves(small_mesh, mosquitto, cli
                                                                  ) -> None:
    config, data, mesh_file, _, _ = small_mesh
    cells = [f"r{r}c{c}" for r in range(4) for c in range(5)]
    claim = {"role": "node-host", "state": "online", "mesh": 1, "cells": cells,
             "time": time.time() - 3600}  # written an hour ago by a client long gone
    engine = _start_fails(mosquitto, config, data,
                          {"meshdl/1/status/r0c1": json.dumps(claim).encode()},
                          r"20 cells have no node host online .*"
                          r"r0c1's status claims cells but is 360[0-9] s old")
    assert engine.report()["edge"] == {}  # not one wave was started
    code, out, _ = cli("doctor", "--broker", mosquitto.url, "--mesh", mesh_file, "--json")
    assert code == 1 and json.loads(out)["stale"] == ["r0c1"]


def test_broker_urls_are_parsed_and_never_print_the_password() -> None:
    address = BrokerAddress.parse("mqtts://r0c1:s%40cret@pi.local", env={})
    assert (address.host, address.port, address.tls) == ("pi.local", 8883, True)
    assert (address.username, address.password) == ("r0c1", "s@cret")
    assert "s@cret" not in str(address)
    env = {"MESHDL_MQTT_USER": "edge", "MESHDL_MQTT_PASSWORD": "pw"}
    assert BrokerAddress.parse("broker:1884", env=env).username == "edge"
    with pytest.raises(Exception, match="expected mqtt://"):
        BrokerAddress.parse("http://x", env={})


def test_training_runs_under_the_generated_credentials_and_acl(small_mesh, mosquitto_factory,
                                                               tmp_path, cli) -> None:
    """The ACL grants everything the protocol needs: node host and edge log in with their
    own generated passwords, authenticate every message with their generated keys, and
    the run equals the virtual mesh."""
    config, data, mesh_file, _, reference = small_mesh
    # The host below sends every message through the broker (--via-broker's grants).
    code, _, err = cli("deploy", "credentials", "--mesh", str(mesh_file), "--out",
                       str(tmp_path / "creds"), "--host", "gw=0-3,0-4", "--via-broker")
    assert code == 0, err
    logins = {}
    for env in (tmp_path / "creds" / "secrets").glob("*.env"):
        values = dict(line.split("=", 1) for line in env.read_text().splitlines()
                      if line and not line.startswith("#"))
        logins[values["MESHDL_MQTT_USER"]] = values["MESHDL_MQTT_PASSWORD"]
    broker = mosquitto_factory(password_file=tmp_path / "creds" / "passwd",
                               acl_file=tmp_path / "creds" / "acl")
    as_host = BrokerAddress(broker.host, broker.port, username="gw", password=logins["gw"])
    as_edge = BrokerAddress(broker.host, broker.port, username="edge",
                            password=logins["edge"])
    cells = [(r, c) for r in range(4) for c in range(5)]
    # Each process authenticates its messages with its own key file, as the .env says.
    secrets = tmp_path / "creds" / "secrets"
    host_config, edge_config = (config.model_copy(update={"mesh": config.mesh.model_copy(
        update={"auth": True, "keys": secrets / f"{user}.keys.json"})}) for user in ("gw", "edge"))
    # Every message through the broker, so that every grant of the ACL is exercised.
    with BackgroundNodeHost(host_config, cells, as_host, data, client="gw",
                            local_delivery=False) as host:
        engine = MqttEngine.for_run(edge_config, data, as_edge, nodes_timeout=20)
        try:
            model, _ = train(config, data, engine=engine)
        finally:
            engine.close()
        # r1c0's login, not its keys: what it writes within its ACL is tagged wrongly.
        forged = encode(make(Kind.HALO, 1, 5, (1, 0), (1, 1), np.ones((1, 1, 10)),
                             layer=1)) + os.urandom(16)
        asyncio.run(_publish(broker, "r1c0", logins["r1c0"],
                             topic(1, (1, 0), (1, 1), Kind.HALO), forged))
        time.sleep(0.5)
        stats = host.host.node_stats()
    _assert_same_model(model, reference)
    assert stats["rejected:codec:forged"] == 1


def test_train_command_runs_edge_and_node_host_over_a_broker(small_mesh, mosquitto, cli,
                                                              tmp_path) -> None:
    _, _, mesh_file, data_file, reference = small_mesh
    code, _, err = cli("train", "--transport", "mqtt", "--broker", mosquitto.url, "--config",
                       str(mesh_file), "--data", str(data_file), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _assert_same_model(CNN.load(tmp_path / "r" / "model.npz"), reference)


def test_compressed_gradients_and_int8_activations_over_mqtt_equal_the_virtual_mesh(
        small_mesh, mosquitto, cli, tmp_path) -> None:
    """The same policy, the same bytes: a REDUCE re-compressed at every hop with each
    node's error feedback, and int8 HALO, POOL and GATHER, through a real broker."""
    config, data, _, data_file, _ = small_mesh
    mesh_file = tmp_path / "compressed.toml"
    mesh_file.write_text(MESH_TOML + '\n[mesh]\ncompress = "hylo:4"\nactivations = "int8"\n')
    compressed = load_run_config(mesh_file)
    reference, _ = train(compressed, data)  # the virtual mesh, same policy
    code, _, err = cli("train", "--transport", "mqtt", "--broker", mosquitto.url, "--config",
                       str(mesh_file), "--data", str(data_file), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _assert_same_model(CNN.load(tmp_path / "r" / "model.npz"), reference)
    plain, _ = train(config, data)
    assert not np.allclose(reference.flat, plain.flat)  # the policy did change training


def test_global_pooling_with_failout_over_mqtt_equals_the_virtual_mesh(
        small_mesh, mosquitto, cli, tmp_path) -> None:
    """The subtree maxima and their first cells up the tree, the cells that fail out
    named in each BATCH, through a real broker: the virtual mesh's model."""
    _, data, _, data_file, _plain = small_mesh
    mesh_file = tmp_path / "global.toml"
    mesh_file.write_text(MESH_TOML.replace("[model]", '[model]\npool = "global"')
                         .replace("[train]", "[train]\nfailout = 0.2"))
    config = load_run_config(mesh_file)
    assert config.model.global_pool and config.train.failout == 0.2
    reference, _ = train(config, data)  # the virtual mesh, same head and failout
    code, _, err = cli("train", "--transport", "mqtt", "--broker", mosquitto.url, "--config",
                       str(mesh_file), "--data", str(data_file), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _assert_same_model(CNN.load(tmp_path / "r" / "model.npz"), reference)


def test_a_position_bias_trained_over_mqtt_on_mirrors_equals_the_virtual_mesh(
        small_mesh, mosquitto, cli, tmp_path) -> None:
    """The global head with a position bias, on mirrored maps (the recipe's): each node
    host tells its maps' mirrors by their indices and reads the mirrored cell's column;
    the REDUCE brings the table's gradient through a real broker."""
    _, data, _, data_file, _plain = small_mesh
    mesh_file = tmp_path / "position.toml"
    mesh_file.write_text(MESH_TOML.replace("[model]", '[model]\npool = "global"\n'
                                           "position_bias = true"))
    config = load_run_config(mesh_file)
    assert config.model.position_bias and config.train.augment == "mirror"
    reference, _ = train(config, data)  # the virtual mesh
    assert reference.params["position"].any()
    code, _, err = cli("train", "--transport", "mqtt", "--broker", mosquitto.url, "--config",
                       str(mesh_file), "--data", str(data_file), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _assert_same_model(CNN.load(tmp_path / "r" / "model.npz"), reference)


# ------------------------------------------------------------------- one edge, one mesh


async def _read_retained(broker: Mosquitto, name: str, wait_s: float = 2.0) -> bytes | None:
    async with aiomqtt.Client(broker.host, broker.port) as client:
        await client.subscribe(name, qos=1)
        try:
            message = await asyncio.wait_for(anext(client.messages), wait_s)
        except asyncio.TimeoutError:
            return None
        return bytes(message.payload)


def test_a_second_edge_refuses_to_start_while_another_holds_the_mesh(small_mesh, mosquitto
                                                                      ) -> None:
    config, data, *_ = small_mesh
    lease = json.dumps({"role": "edge", "state": "online", "mesh": 1, "session": 77,
                        "since": time.time() - 60, "time": time.time()}).encode()
    _start_fails(mosquitto, config, data, {"meshdl/1/status/edge": lease},
                 r"another edge holds mesh 1 \(session 77, heartbeat \d+ s ago\).*--take-over")
    # It wrote nothing: the holder's lease stands.
    assert asyncio.run(_read_retained(mosquitto, "meshdl/1/status/edge")) == lease


def test_an_edge_that_takes_the_mesh_over_keeps_it_and_the_other_edge_stops(
        small_mesh, mosquitto) -> None:
    config, data, *_ = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    model, batch = CNN(config.model, seed=1), np.arange(10)
    with BackgroundNodeHost(config, cells, address, data):
        first = MqttEngine.for_run(config, data, address, wave_timeout=2.0, session=1)
        taker = MqttEngine.for_run(config, data, address, wave_timeout=2.0, session=3,
                                   take_over=True)
        try:
            expected = first.loss_and_grads(model, batch)
            refused = MqttEngine.for_run(config, data, address, session=2)
            try:
                with pytest.raises(MeshdlError, match=r"another edge holds mesh 1 "
                                                      r"\(session 1,"):
                    refused.open(model)
            finally:
                refused.close()
            taken = taker.loss_and_grads(model, batch)
            with pytest.raises(MeshdlError, match=r"another edge \(session 3\) took mesh 1 "
                                                  "over: this edge stops"):
                first.loss_and_grads(model, batch)
            first.close()
            again = taker.loss_and_grads(model, batch)
        finally:
            first.close()
            taker.close()
    for result in (taken, again):
        assert result[0] == pytest.approx(expected[0])
        np.testing.assert_allclose(result[2], expected[2], rtol=1e-5, atol=1e-7)
    # The edge that stopped left the lease to the one that took it (which said goodbye).
    lease = json.loads(asyncio.run(_read_retained(mosquitto, "meshdl/1/status/edge")))
    assert (lease["session"], lease["state"]) == (3, "offline")


def test_the_edge_refuses_node_hosts_of_another_mesh_or_data_naming_what_differs(
        small_mesh, mosquitto) -> None:
    config, data, *_ = small_mesh
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(4) for c in range(5)]
    other_mesh = config.model_copy(update={"model": config.model.model_copy(
        update={"kernel": 5, "pool": 3})})
    other_data = generate_lounge(config.data.model_copy(update={"seed": 99}))
    cases = [(other_mesh, data, r"node host floor2 runs another mesh: kernel 5 \(here 3\), "
                                r"pool 3 \(here 2\); give it this edge's mesh file"),
             (config, other_data, r"node host floor2 replays another data set \(digest "
                                  r"[0-9a-f]{16}, here [0-9a-f]{16}\)")]
    for host_config, host_data, error in cases:
        with BackgroundNodeHost(config, cells[:10], address, data, client="floor1"), \
                BackgroundNodeHost(host_config, cells[10:], address, host_data,
                                   client="floor2"):
            engine = MqttEngine.for_run(config, data, address, nodes_timeout=20.0)
            try:
                with pytest.raises(MeshdlError, match=error):
                    engine.open(CNN(config.model))
            finally:
                engine.close()
            assert engine.report()["edge"] == {}  # not one wave was started


def test_a_frozen_broker_ends_the_run_in_one_line_and_every_process_obeys_sigterm(
        small_mesh, mosquitto, tmp_path) -> None:
    """The broker stops answering mid-run (SIGSTOP): `edge run` gives up after its wave
    attempts with one error line that says how to go on, no traceback, a checkpoint
    kept; node hosts told to stop while their broker hangs go at once, with their stop
    line."""
    import signal

    _, _, mesh_file, data_file, _ = small_mesh
    host = _node_host_process(mosquitto, mesh_file, data_file, "all")
    edge = subprocess.Popen(
        [sys.executable, "-m", "meshdl", "edge", "run", "--broker", mosquitto.url,
         "--mesh", str(mesh_file), "--data", str(data_file), "--out", str(tmp_path / "run"),
         "--nodes-timeout", "60", "--wave-timeout", "1", "--broker-patience", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    frozen = False
    try:
        deadline = time.monotonic() + 120  # a bound on the test, not a timing claim
        while not (tmp_path / "run" / "checkpoint.npz").exists():
            assert edge.poll() is None and time.monotonic() < deadline, edge.stderr.read()
            time.sleep(0.05)
        os.kill(mosquitto.process.pid, signal.SIGSTOP)  # epoch 1 done: now freeze it
        frozen = True
        _, err = edge.communicate(timeout=120)
        host.send_signal(signal.SIGTERM)
        host_err = host.communicate(timeout=30)[1].decode()
    finally:
        if frozen:
            os.kill(mosquitto.process.pid, signal.SIGCONT)
        for process in (edge, host):
            if process.poll() is None:
                process.kill()
    lines = err.decode().strip().splitlines()
    assert edge.returncode == 1
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:], lines  # one error line, the last
    # On a loaded machine the wave's attempts can run out while the hosts' last
    # heartbeats are still fresh: the edge then says, once, that it tries on (a progress
    # line, wrapped as the console wraps it) before the broker's silence ends the run.
    before = " ".join(lines[:-1])
    assert not before or (before.startswith("wave ") and "trying on" in before), lines
    assert "--resume" in lines[-1]
    assert "Traceback" not in host_err and "Event loop is closed" not in host_err, host_err
    assert host.returncode == 0 and "stopped:" in host_err, host_err


@pytest.mark.parametrize(("patience", "timeout"), [(2.0, 2.0), (0.0, 1.0), (120.0, 10.0),
                                                (None, 10.0)])
def test_a_client_waits_for_one_answer_no_longer_than_the_brokers_patience(
        patience: float | None, timeout: float) -> None:
    """A frozen broker (socket open, nothing answered) held `--broker-patience 2` for
    31 s: each CONNACK or acknowledgement was given aiomqtt's 10 s regardless."""
    import asyncio

    async def client_timeout() -> float:
        session = Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 1, "edge", [],
                          connect_timeout_s=patience)
        return session._new_client().timeout

    assert asyncio.run(client_timeout()) == timeout


def test_a_client_still_waiting_for_its_broker_says_so_and_a_short_wait_does_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """`meshdl edge serve` waited for an unreachable broker without a word (a daemon's
    only sign of life is its log). Reported once the wait has lasted `say_after`, then
    every `say_every`; a short wait (doctor's 5 s) ends in its one-line error alone."""
    import asyncio

    from meshdl.mqtt.session import Backoff

    async def wait(backoff: Backoff, patience: float) -> None:
        session = Session(BrokerAddress.parse("mqtt://127.0.0.1:1"), 1, "edge", [],
                          connect_timeout_s=patience, backoff=backoff)
        with pytest.raises(MeshdlError, match="cannot reach the broker"):
            await session.connect()

    quick = Backoff(first=0.01, most=0.01, say_after=0.0, say_every=3600.0)
    with caplog.at_level(logging.WARNING, logger="meshdl.mqtt.session"):
        asyncio.run(wait(quick, 0.3))
    said = [r.getMessage() for r in caplog.records if r.name == "meshdl.mqtt.session"]
    assert len(said) == 1, said  # once, then not again within say_every
    assert "edge: still cannot reach the broker at mqtt://127.0.0.1:1" in said[0]
    assert "trying again for" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="meshdl.mqtt.session"):
        asyncio.run(wait(Backoff(first=0.01, most=0.01), 0.3))  # say_after 10 s
    assert not [r for r in caplog.records if r.name == "meshdl.mqtt.session"]


def test_the_mqtt_benchmark_trains_the_configured_run_and_reports_its_ratios(
        small_mesh) -> None:
    from meshdl.bench.mqtt import bench_mqtt

    config, data, *_ = small_mesh
    result = bench_mqtt(config.model_copy(update={"train": config.train.model_copy(
        update={"epochs": 1})}), data)
    assert result["train_samples"] == len(data.y_train)
    assert result["messages"] > 0 and result["broker_messages_per_s"] > 0
    assert result["ratio_to_broker"] == pytest.approx(
        result["messages_per_s"] / result["broker_messages_per_s"])


class BestEffortRun(NamedTuple):
    """A best-effort run over MQTT: its edge process, three node hosts (rows 0-1, row 2,
    row 3), the mesh file and the run directory."""

    edge: subprocess.Popen[str]
    hosts: list[subprocess.Popen[bytes]]
    mesh_file: Path
    run: Path


def _best_effort_run(small_mesh, mosquitto: Mosquitto, tmp_path: Path, epochs: int,
                     mesh: str) -> BestEffortRun:
    _, _, mesh_file, data_file, _ = small_mesh
    best = tmp_path / "best.toml"
    best.write_text(mesh_file.read_text().replace("epochs = 2", f"epochs = {epochs}") +
                    f'\n[mesh]\nrecovery = "best-effort"\n{mesh}\n')
    hosts = [_node_host_process(mosquitto, best, data_file, cells)
             for cells in ("0-1,0-4", "2,0-4", "3,0-4")]
    run = tmp_path / "run"
    edge = subprocess.Popen(
        [sys.executable, "-m", "meshdl", "edge", "run", "--broker", mosquitto.url,
         "--mesh", str(best), "--data", str(data_file), "--out", str(run),
         "--nodes-timeout", "60", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return BestEffortRun(edge, hosts, best, run)


def _wait_for(done: Callable[[], bool], edge: subprocess.Popen[str]) -> None:
    """Until `done()` holds or the edge has stopped, for at most 4 minutes."""
    for _ in range(2400):
        if done() or edge.poll() is not None:
            return
        time.sleep(0.1)


def test_a_node_host_killed_for_good_leaves_training_to_finish_around_its_cells(
        small_mesh, mosquitto, tmp_path) -> None:
    """Best effort over MQTT: three node hosts; after the first epoch the one serving
    row 3 is killed (SIGKILL) and never restarted. Row 2 misses its messages at the
    deadlines it learnt, reports it silent, the edge plans around row 3, and training
    finishes, the edge naming the dead cells."""
    edge, hosts, _, run = _best_effort_run(small_mesh, mosquitto, tmp_path, 4,
                                           'policy = "neighbours"')
    try:
        _wait_for((run / "checkpoint.npz").exists, edge)  # the first epoch is done
        hosts[2].kill()
        out, err = edge.communicate(timeout=240)
        assert edge.returncode == 0, err
    finally:
        edge.kill()
        for host in hosts:
            host.terminate()
        for host in hosts[:2]:
            assert host.wait(30) == 0, host.stderr.read().decode()
        hosts[2].wait(30)
    dead = [f"r3c{c}" for c in range(5)]
    metrics = json.loads(out)
    assert metrics["comm"]["dead_cells"] == dead
    assert "planning around dead cells " + ", ".join(dead) in err
    assert len(metrics["epochs"]) == 4 and np.isfinite(metrics["final"]["test_acc"])


def test_a_node_host_that_comes_back_says_hello_and_is_planned_back_in(
        small_mesh, mosquitto, tmp_path) -> None:
    """Best effort over MQTT: the host of row 3 is killed after the first epoch; once the
    edge plans around its cells it starts again, says hello after `hello_after_s`, and
    the edge takes its cells back in before training ends."""
    edge, hosts, best, run = _best_effort_run(small_mesh, mosquitto, tmp_path, 12,
                                              "hello_after_s = 1.0")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(edge.stderr), daemon=True)
    reader.start()
    try:
        _wait_for((run / "checkpoint.npz").exists, edge)
        hosts[2].kill()
        hosts[2].wait(30)
        _wait_for(lambda: any("planning around dead cells r3c0" in line for line in lines),
                  edge)
        hosts[2] = _node_host_process(mosquitto, best, small_mesh[3], "3,0-4")
        out = edge.stdout.read()
        assert edge.wait(240) == 0, "".join(lines)
    finally:
        edge.kill()
        for host in hosts:
            host.terminate()
        for host in hosts:
            host.wait(30)
    said = "".join(lines)
    assert "planning around dead cells r3c0, r3c1, r3c2, r3c3, r3c4" in said
    assert "planning around dead cells (none)" in said  # back in
    assert json.loads(out)["comm"]["dead_cells"] == []
