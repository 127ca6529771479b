"""The broker's size limits follow the mesh (issue 43, item 3): `meshdl deploy
credentials` works out the largest message the mesh legitimately sends from its plan
(meshdl/mqtt/sizes.py), writes the broker's limits for it into limits.d/, which
production.conf reads last, and gives every process the same figure as its
mesh.max_message_bytes, so that evaluation waves are cut to fit. A stolen login's 1 MB
messages then never reach a neighbour: the broker throws the login out at the packet's
header."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from meshdl.config import load_run_config, param_shapes
from meshdl.edge.agent import EdgeMachine
from meshdl.mqtt.localbroker import production_config
from meshdl.mqtt.sizes import (
    PACKET_OVERHEAD,
    broker_limits,
    largest_messages,
    message_limits,
)
from meshdl.nodes.host import NodeHost, dataset_readings
from meshdl.protocol.auth import LINK_TAG_BYTES
from meshdl.protocol.messages import EDGE, HEADER_BYTES, Kind, encode
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import topic
from tests.helpers import assert_one_line_error, noise_dataset, normalized_model
from tests.mosquitto import free_port, mosquitto_binary, self_signed

MESH_TOML = """\
[model]
rows = {rows}
cols = {cols}

[train]
batch = {batch}

[mesh]
mesh_id = 7
"""


def _mesh_file(tmp_path: Path, rows: int = 4, cols: int = 5, batch: int = 100) -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(MESH_TOML.format(rows=rows, cols=cols, batch=batch))
    return path


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


@pytest.mark.parametrize(("rows", "cols", "blocks", "limit"),
                         [(17, 25, 9 * 13, 264_192), (6, 8, 3 * 4, 27_648)],
                         ids=["17x25", "6x8-mqtt-example"])
def test_the_readme_meshes_largest_message_is_the_gather_into_the_edge(
        rows, cols, blocks, limit) -> None:
    config = load_run_config(None, model={"rows": rows, "cols": cols})
    largest = largest_messages(config)[0]
    # Every pooling block's 5 filters for 100 samples in float32, the header and its tag.
    gather = blocks * 5 * 100 * 4 + HEADER_BYTES + LINK_TAG_BYTES
    assert (largest.kind, largest.bytes) == ("GATHER", gather)
    limits = broker_limits(config)
    assert limits.message_size_limit == limit  # an eighth more, in whole KiB
    assert gather + gather // 8 <= limit < gather + gather // 8 + 1024
    assert not limits.near_megabyte


def test_every_message_of_a_training_and_an_evaluation_wave_fits_the_derived_limit(
        ) -> None:
    """Played through the edge machine and node machines, each message encoded as it
    crosses the broker: the training wave's largest is the GATHER the limit is worked
    out from, and an evaluation wave as large as the limit allows (as the edge cuts
    them) stays within it."""
    config = load_run_config(None, model={"rows": 4, "cols": 5, "hidden": 8})
    limit = broker_limits(config).message_size_limit
    spec = MeshSpec(1, config.model, (0, 0), "broadcast", limit)
    data = noise_dataset(config.model, samples=200)
    host = NodeHost(spec, list(spec.topology.cells()), lambda c: dataset_readings(data, c))
    edge = EdgeMachine(spec, normalized_model(config.model), {Split.TRAIN: data.y_train})

    def sizes(mode: Mode, indices: np.ndarray) -> dict[Kind, int]:
        largest: dict[Kind, int] = {}
        pending = edge.start(mode, Split.TRAIN, indices, now=0.0)
        while pending:
            message = pending.pop(0)
            h = message.header
            largest[h.kind] = max(largest.get(h.kind, 0), len(encode(message)))
            pending += edge.handle(message, 0.0) if h.dst == EDGE else \
                host.handle(topic(1, h.src, h.dst, h.kind), message, 0.0)
        assert edge.result is not None
        return largest

    trained = sizes(Mode.TRAIN, np.arange(100))
    assert max(trained.values()) + LINK_TAG_BYTES == \
        next(m.bytes for m in largest_messages(config) if m.kind == "GATHER")
    assert spec.max_batch > 100  # the headroom: evaluation waves a little larger
    evaluated = sizes(Mode.INFER, np.arange(spec.max_batch))  # (no tags: this spec's)
    assert limit - 4 * 30 < max(evaluated.values()) <= limit  # 30 values a sample


def test_credentials_write_the_meshs_limits_and_give_every_process_the_same(
        cli, tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, stdout, err = cli("deploy", "credentials", "--mesh", _mesh_file(tmp_path),
                            "--out", out, "--host", "north=0-1,0-4", "--json")
    assert code == 0, err
    limits = json.loads(stdout)["limits"]
    # 4 x 5 at batch 100: 6 blocks x 5 filters x 100 samples x 4 B + 64 B: 12,064 B.
    assert limits["largest"] == {"kind": "GATHER", "bytes": 12_064,
                                 "what": "r0c0 -> edge at batch 100"}
    assert limits["message_size_limit"] == 14_336
    assert limits["max_packet_size"] == 14_336 + PACKET_OVERHEAD
    files = list((out / "limits.d").iterdir())
    assert [f.name for f in files] == ["message-size-000014336-mesh7.conf"]
    text = files[0].read_text()
    options = [line for line in text.splitlines() if not line.startswith("#")]
    assert options == ["message_size_limit 14336", "max_packet_size 15360"]
    assert "17 x 25 floor: largest GATHER 234,064 B, limit 264,192 B" in text
    assert "6 x 8 mesh of its MQTT example: largest GATHER 24,064 B, limit 27,648 B" in text
    for env in (out / "secrets").glob("*.env"):
        assert _env(env)["MESHDL_MESH__MAX_MESSAGE_BYTES"] == "14336", env.name
    assert "the broker takes messages of up to 14,336 bytes" in err
    assert "warning" not in err


def test_a_huge_batch_is_said_to_leave_the_limit_near_1_mb(cli, tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, stdout, err = cli("deploy", "credentials", "--out", out, "--json", "--mesh",
                            _mesh_file(tmp_path, 17, 25, batch=400))
    assert code == 0, err
    limits = json.loads(stdout)["limits"]
    assert limits["largest"]["bytes"] == 117 * 5 * 400 * 4 + 64  # 936,064
    assert limits["message_size_limit"] == 1_048_576  # mesh.max_message_bytes: no more
    assert limits["near_1mb"]
    assert "warning: mesh 7's largest legitimate message is itself near 1 MB " \
           "(936,064 bytes)" in err


def test_a_batch_beyond_the_meshs_message_limit_is_refused_in_one_line(cli,
                                                                      tmp_path) -> None:
    out = tmp_path / "creds"
    code, _, err = cli("deploy", "credentials", "--out", out, "--mesh",
                       _mesh_file(tmp_path, 17, 25, batch=500))
    assert_one_line_error(code, err, 2, "mesh.max_message_bytes 1048576", "GATHER",
                          "1,170,064", "batch")
    assert not out.exists()


async def _publish(port: int, tls: ssl.SSLContext, login: dict[str, str],
                   reader: dict[str, str], payloads: list[int]) -> tuple[list[int], bool]:
    """Publish payloads of these sizes as r1c1 to r1c2 (QoS 1) and read what r1c2
    gets; whether the broker threw r1c1 out."""
    got: list[int] = []
    async with aiomqtt.Client("127.0.0.1", port, tls_context=tls, timeout=5,
                              username=reader["MESHDL_MQTT_USER"],
                              password=reader["MESHDL_MQTT_PASSWORD"]) as node:
        await node.subscribe("meshdl/7/r1c1/r1c2/#", qos=1)
        thrown_out = False
        try:
            async with aiomqtt.Client("127.0.0.1", port, tls_context=tls, timeout=5,
                                      username=login["MESHDL_MQTT_USER"],
                                      password=login["MESHDL_MQTT_PASSWORD"]) as sender:
                for size in payloads:
                    await sender.publish("meshdl/7/r1c1/r1c2/halo", bytes(size))
                    await asyncio.sleep(0.3)
        except aiomqtt.MqttError:
            thrown_out = True

        async def take() -> None:
            async for message in node.messages:
                got.append(len(message.payload))
                if len(got) == 1:
                    return

        with contextlib.suppress(TimeoutError):  # a bound on the test, not a timing claim
            await asyncio.wait_for(take(), 3)
    return got, thrown_out


def test_production_conf_reads_the_credentials_limits_and_throws_out_a_larger_message(
        cli, tmp_path, mosquitto_factory) -> None:
    """production.conf keeps its 1 MiB and includes limits.d/ after it: Mosquitto 2.0
    takes message_size_limit and max_packet_size twice and keeps the included ones."""
    mosquitto_binary("mosquitto_passwd")
    code, stdout, err = cli("deploy", "credentials", "--mesh", _mesh_file(tmp_path),
                            "--out", tmp_path / "meshdl", "--json")
    assert code == 0, err
    limit = json.loads(stdout)["limits"]["message_size_limit"]
    self_signed(tmp_path / "meshdl" / "tls")
    (tmp_path / "data").mkdir()
    tls_port = free_port()
    broker = mosquitto_factory(port=tls_port, config_text=production_config(
        tmp_path, tls_port, free_port()))
    tls = ssl.create_default_context(cafile=str(tmp_path / "meshdl" / "tls" / "ca.crt"))
    secrets = tmp_path / "meshdl" / "secrets"
    login, reader = _env(secrets / "r1c1.env"), _env(secrets / "r1c2.env")

    got, thrown_out = asyncio.run(_publish(tls_port, tls, login, reader, [limit]))
    assert (got, thrown_out) == ([limit], False)  # the largest it allows gets through
    got, thrown_out = asyncio.run(_publish(tls_port, tls, login, reader,
                                           [limit + PACKET_OVERHEAD, 1_040_000]))
    assert (got, thrown_out) == ([], True)
    assert "disconnected due to oversize packet" in broker.log_text()
    # The factory's readiness probe opens and closes a bare TCP connection on the TLS
    # port; as the broker happens to read it (a loaded machine), it logs an OpenSSL
    # "unexpected eof" for a client it never knew: not the thrown-out message.
    probe = ("unexpected eof while reading", "Client <unknown> disconnected")
    assert not [line for line in broker.log_text().splitlines()
                if "Error" in line and not any(p in line for p in probe)]


def test_a_broker_shared_by_two_meshes_keeps_the_larger_limit(tmp_path,
                                                              mosquitto_factory) -> None:
    """Files of limits.d load in name order, the last value holding: the names carry the
    limit, so the larger mesh's messages are not thrown out."""
    from meshdl.mqtt.sizes import BrokerLimits, Largest, limits_conf, limits_file_name

    folder = tmp_path / "limits.d"
    folder.mkdir()
    for size in (27_648, 8_192):  # written in either order
        limits = BrokerLimits(Largest("GATHER", size - 2048, "test"), size, 1 << 20)
        (folder / limits_file_name(limits, f"mesh{size}")).write_text(limits_conf(limits, "test"))
    broker = mosquitto_factory(extra=("message_size_limit 1048576",
                                      f"include_dir {folder}"))

    async def main() -> list[int]:
        got: list[int] = []
        async with aiomqtt.Client(broker.host, broker.port) as listener:
            await listener.subscribe("meshdl/#")
            async with aiomqtt.Client(broker.host, broker.port) as sender:
                for size in (20_000, 27_648, 27_649):
                    await sender.publish("meshdl/1/r0c0/edge/gather", bytes(size), qos=1)

            async def take() -> None:
                async for message in listener.messages:
                    got.append(len(message.payload))
                    if len(got) == 2:
                        return

            await asyncio.wait_for(take(), 10)
            await asyncio.sleep(0.5)  # (27,649 B would come by now: dropped)
        return got

    assert asyncio.run(main()) == [20_000, 27_648]


@pytest.mark.parametrize("size", [1023, 1 << 20])
def test_message_limits_leave_room_for_topic_and_header(size: int) -> None:
    limits = message_limits(size)
    assert limits == {"message_size_limit": size, "max_packet_size": size + 1024}


def test_central_broker_limits_carry_the_whole_model(cli, tmp_path) -> None:
    from tests.helpers import TWO_MESHES_TOML

    mosquitto_binary("mosquitto_passwd")
    mesh = tmp_path / "mesh1.toml"
    mesh.write_text(TWO_MESHES_TOML.format(mesh_id=1))
    code, _, err = cli("deploy", "central", "--mesh", mesh, "--central", "hq:8883",
                       "--out", tmp_path / "hq")
    assert code == 0, err
    config = load_run_config(mesh)
    size = sum(int(np.prod(shape)) for shape in param_shapes(config.model).values())
    push = HEADER_BYTES + 4 * (4 + size)  # its head: step, samples, correct, loss
    (conf,) = (tmp_path / "hq" / "limits.d").iterdir()
    limit = int(next(line.split()[1] for line in conf.read_text().splitlines()
                     if line.startswith("message_size_limit")))
    assert push < limit <= push + push // 8 + 2048
