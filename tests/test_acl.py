"""The broker's access rules, proven against a real Mosquitto with real MQTT clients.

Credentials for a 3 x 4 mesh (edge at r0c0, one node host `floor1` serving rows 1-2)
come from `meshdl deploy credentials`; the broker runs with the passwd and acl files it
wrote. A node may publish as itself and its neighbour hears it; it cannot pose as
another node, publish parameters, or read messages not addressed to it by a neighbour;
wrong passwords and anonymous clients are refused. Every "nothing arrives" check is
followed by a control message that does arrive, so a silent subscriber cannot pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiomqtt
import pytest

from meshdl.cli import main
from meshdl.protocol.messages import ALL, EDGE, Kind
from meshdl.protocol.topics import alerts_topic, broadcast_filter, inbox_filter, status_topic, topic
from tests.helpers import SMALL_MESH_TOML
from tests.mosquitto import Mosquitto

MESH = 7
QUIET_S = 0.6  # how long "nothing arrives" waits
ARRIVE_S = 3.0  # how long a message that must arrive may take



class Mesh:
    """The running broker and every user's password."""

    def __init__(self, broker: Mosquitto, passwords: dict[str, str]) -> None:
        self.broker = broker
        self.passwords = passwords

    def client(self, user: str | None, password: str | None = None,
               **options: object) -> aiomqtt.Client:
        if user is not None and password is None:
            password = self.passwords[user]
        return aiomqtt.Client(self.broker.host, self.broker.port, username=user,
                              password=password, timeout=5, **options)


def _meshdl(*args: str | Path) -> int:
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if line and not line.startswith("#"))
    return dict(pairs)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("acl")
    (root / "mesh.toml").write_text(SMALL_MESH_TOML)
    creds = root / "creds"
    code = _meshdl("deploy", "credentials", "--mesh", root / "mesh.toml", "--out", creds,
                   "--host", "floor1=1-2,0-3")
    assert code == 0
    passwords = {}
    for env in (creds / "secrets").glob("*.env"):
        values = _read_env(env)
        passwords[values["MESHDL_MQTT_USER"]] = values["MESHDL_MQTT_PASSWORD"]
    with Mosquitto(root / "broker", password_file=creds / "passwd",
                   acl_file=creds / "acl") as broker:
        yield Mesh(broker, passwords)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


async def _next(client: aiomqtt.Client, seconds: float = ARRIVE_S) -> aiomqtt.Message:
    async def first() -> aiomqtt.Message:
        async for message in client.messages:
            return message
        raise AssertionError("the client disconnected")

    return await asyncio.wait_for(first(), seconds)


async def _quiet(client: aiomqtt.Client, seconds: float = QUIET_S) -> list[aiomqtt.Message]:
    """Every message that arrives within `seconds`."""
    got: list[aiomqtt.Message] = []

    async def collect() -> None:
        async for message in client.messages:
            got.append(message)

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(collect(), seconds)
    return got


# --------------------------------------------------------------------------- allowed


def test_a_node_reaches_its_neighbour(mesh: Mesh) -> None:
    async def test() -> None:
        halo = topic(MESH, (0, 1), (0, 2), Kind.HALO)
        async with mesh.client("r0c2") as r0c2, mesh.client("r0c1") as r0c1:
            await r0c2.subscribe(inbox_filter(MESH, (0, 1), (0, 2)), qos=1)
            await r0c1.publish(halo, b"halo from r0c1", qos=1)
            message = await _next(r0c2)
            assert (message.topic.value, message.payload) == (halo, b"halo from r0c1")

    run(test)


def test_the_edge_broadcasts_to_nodes_and_hears_its_neighbour(mesh: Mesh) -> None:
    async def test() -> None:
        async with mesh.client("edge") as edge, mesh.client("r2c3") as far, \
                mesh.client("r0c0") as near:
            await far.subscribe(broadcast_filter(MESH), qos=1)
            await near.subscribe(inbox_filter(MESH, EDGE, (0, 0)), qos=1)
            await edge.subscribe(inbox_filter(MESH, (0, 0), EDGE), qos=1)

            await edge.publish(topic(MESH, EDGE, ALL, Kind.PARAMS), b"params", qos=1)
            assert (await _next(far)).payload == b"params"
            await edge.publish(topic(MESH, EDGE, (0, 0), Kind.SCATTER), b"scatter", qos=1)
            assert (await _next(near)).payload == b"scatter"
            await near.publish(topic(MESH, (0, 0), EDGE, Kind.GATHER), b"gather", qos=1)
            assert (await _next(edge)).payload == b"gather"

    run(test)


def test_a_node_host_acts_for_its_cells(mesh: Mesh) -> None:
    async def test() -> None:
        async with mesh.client("floor1") as host, mesh.client("r0c1") as r0c1, \
                mesh.client("r0c0") as r0c0:
            await r0c1.subscribe(inbox_filter(MESH, (1, 1), (0, 1)), qos=1)
            await host.subscribe(inbox_filter(MESH, (0, 0), (1, 0)), qos=1)
            await host.publish(topic(MESH, (1, 1), (0, 1), Kind.HALO), b"as r1c1", qos=1)
            assert (await _next(r0c1)).payload == b"as r1c1"
            await r0c0.publish(topic(MESH, (0, 0), (1, 0), Kind.HALO), b"to r1c0", qos=1)
            assert (await _next(host)).payload == b"to r1c0"

    run(test)


def test_status_and_alerts_reach_the_monitor(mesh: Mesh) -> None:
    async def test() -> None:
        async with mesh.client("r2c3") as node, mesh.client("edge") as edge:
            await node.publish(status_topic(MESH, "r2c3"), b'{"state": "online"}',
                               qos=1, retain=True)
            await edge.publish(alerts_topic(MESH), b'{"anomaly": true}', qos=1, retain=True)
        async with mesh.client("monitor") as monitor:
            await monitor.subscribe(status_topic(MESH, "r2c3"), qos=1)
            assert (await _next(monitor)).payload == b'{"state": "online"}'
            await monitor.subscribe(alerts_topic(MESH), qos=1)
            assert (await _next(monitor)).payload == b'{"anomaly": true}'

    run(test)


# --------------------------------------------------------------------------- refused


def test_a_node_cannot_pose_as_another_node(mesh: Mesh) -> None:
    async def test() -> None:
        forged = topic(MESH, (1, 1), (1, 2), Kind.HALO)
        async with mesh.client("r1c2") as victim, mesh.client("r0c1") as forger, \
                mesh.client("r1c1") as real:
            await victim.subscribe(inbox_filter(MESH, (1, 1), (1, 2)), qos=1)
            await forger.publish(forged, b"forged", qos=1)
            assert await _quiet(victim) == []
            await real.publish(forged, b"genuine", qos=1)  # control: the route works
            assert (await _next(victim)).payload == b"genuine"

    run(test)


def test_a_node_cannot_publish_parameters(mesh: Mesh) -> None:
    async def test() -> None:
        async with mesh.client("r1c1") as listener, mesh.client("r0c0") as near, \
                mesh.client("r0c1") as neighbour, mesh.client("edge") as edge:
            await listener.subscribe(broadcast_filter(MESH), qos=1)
            await near.subscribe(inbox_filter(MESH, EDGE, (0, 0)), qos=1)
            # r0c0 is the edge's neighbour, the best placed to forge the edge.
            await near.publish(topic(MESH, EDGE, ALL, Kind.PARAMS), b"evil params", qos=1)
            await neighbour.publish(topic(MESH, EDGE, (0, 0), Kind.PARAMS), b"evil", qos=1)
            assert await _quiet(listener) == []
            assert await _quiet(near, 0.1) == []
            await edge.publish(topic(MESH, EDGE, ALL, Kind.PARAMS), b"params", qos=1)
            assert (await _next(listener)).payload == b"params"

    run(test)


def test_repairs_reach_the_child_from_its_tree_parent_and_from_the_edge(mesh: Mesh) -> None:
    """A restarted cell asks for the parameters (nodes/agent.py, "Repair"): the edge
    answers the cell it is linked to on edge/r0c0/params, a parent its child on
    <parent>/<child>/params. The ACL refused both (issue 43)."""
    async def test() -> None:
        async with mesh.client("r0c0") as near, mesh.client("r1c1") as child, \
                mesh.client("edge") as edge, mesh.client("r0c1") as parent:
            await near.subscribe(inbox_filter(MESH, EDGE, (0, 0)), qos=1)
            await child.subscribe(inbox_filter(MESH, (0, 1), (1, 1)), qos=1)
            await edge.publish(topic(MESH, EDGE, (0, 0), Kind.PARAMS), b"repair", qos=1)
            await parent.publish(topic(MESH, (0, 1), (1, 1), Kind.PARAMS), b"repair", qos=1)
            assert (await _next(near)).payload == b"repair"
            assert (await _next(child)).payload == b"repair"

    run(test)


def test_a_node_cannot_read_messages_not_addressed_to_it(mesh: Mesh) -> None:
    async def test() -> None:
        private = topic(MESH, (0, 1), (0, 2), Kind.HALO)
        async with mesh.client("r2c3") as stranger, mesh.client("r1c1") as neighbour, \
                mesh.client("r0c2") as addressee, mesh.client("r0c1") as sender:
            # Mosquitto may grant these subscriptions; the ACL filters every delivery.
            for filter_ in (inbox_filter(MESH, (0, 1), (0, 2)), f"meshdl/{MESH}/#", "#"):
                await stranger.subscribe(filter_, qos=1)
            # r1c1 is r0c1's neighbour, but the message is for r0c2.
            await neighbour.subscribe(f"meshdl/{MESH}/r0c1/#", qos=1)
            await addressee.subscribe(inbox_filter(MESH, (0, 1), (0, 2)), qos=1)
            await sender.publish(private, b"for r0c2 only", qos=1)
            assert (await _next(addressee)).payload == b"for r0c2 only"  # control
            assert await _quiet(stranger) == []
            assert await _quiet(neighbour, 0.1) == []

    run(test)


def test_a_node_cannot_write_alerts_or_read_status(mesh: Mesh) -> None:
    async def test() -> None:
        async with mesh.client("r1c3") as node, mesh.client("monitor") as monitor:
            await node.subscribe(f"meshdl/{MESH}/status/#", qos=1)
            await monitor.subscribe(alerts_topic(MESH), qos=1)
            await _quiet(monitor, 0.2)  # the retained alert, if an earlier test left one
            await node.publish(alerts_topic(MESH), b"false alarm", qos=1, retain=True)
            await monitor.publish(alerts_topic(MESH), b"false alarm", qos=1, retain=True)
            await node.publish(status_topic(MESH, "r1c2"), b"offline", qos=1)
            assert await _quiet(monitor) == []
            assert await _quiet(node, 0.1) == []

    run(test)


def test_a_node_cannot_leave_retained_messages_on_topics_the_protocol_does_not_use(
        mesh: Mesh) -> None:
    # A node's neighbour reads `meshdl/<m>/<node>/<neighbour>/#`: whatever the node may
    # write below that, the broker keeps (retained) and hands every later subscriber.
    async def test() -> None:
        inbox = inbox_filter(MESH, (1, 1), (1, 2))
        made_up = f"meshdl/{MESH}/r1c1/r1c2/fill/1"
        unused = topic(MESH, (1, 1), (1, 2), Kind.BATCH)  # no node sends a batch
        async with mesh.client("r1c1") as node:
            await node.publish(made_up, b"x" * 1000, qos=1, retain=True)
            await node.publish(unused, b"y" * 1000, qos=1, retain=True)
        async with mesh.client("r1c2") as neighbour, mesh.client("r1c1") as node:
            await neighbour.subscribe(inbox, qos=1)
            assert [m.topic.value for m in await _quiet(neighbour)] == []
            await node.publish(topic(MESH, (1, 1), (1, 2), Kind.HALO), b"halo", qos=1)
            assert (await _next(neighbour)).payload == b"halo"  # control: the route works

    run(test)


def test_a_node_host_leaves_retained_messages_only_on_links_that_leave_it(
        mesh: Mesh) -> None:
    """Issue 43: a host login could write every topic of its cells (the union of their
    grants) and left one retained message of up to the broker's limit on each. Its
    cells hand each other their messages in process, so only its links to other hosts'
    cells (and the edge) are its to write: a retained fill between its own cells, or on
    its cells' own status topics, is refused; one on a link that leaves it is kept, one
    a topic, as a node's."""
    floor = [(r, c) for r in (1, 2) for c in range(4)]
    inner = [(cell, n) for cell in floor for n in ((cell[0] + 1, cell[1]),
                                                   (cell[0], cell[1] + 1)) if n in floor]
    fill = b"x" * 1000

    async def test() -> None:
        async with mesh.client("floor1") as host:
            for a, b in inner:  # both ways, every kind a cell sends a neighbour
                for src, dst in ((a, b), (b, a)):
                    for kind in (Kind.HALO, Kind.SCATTER, Kind.PARAMS, Kind.POOL):
                        await host.publish(topic(MESH, src, dst, kind), fill, qos=1,
                                           retain=True)
            await host.publish(status_topic(MESH, "r1c1"), fill, qos=1, retain=True)
            await host.publish(topic(MESH, (1, 1), (0, 1), Kind.HALO), b"kept", qos=1,
                               retain=True)
        async with mesh.client("r2c1") as cell, mesh.client("r0c1") as outside, \
                mesh.client("monitor") as monitor:
            for n in ((1, 1), (2, 0), (2, 2)):  # r2c1's neighbours on its own host
                await cell.subscribe(inbox_filter(MESH, n, (2, 1)), qos=1)
            await monitor.subscribe(status_topic(MESH, "r1c1"), qos=1)
            await outside.subscribe(inbox_filter(MESH, (1, 1), (0, 1)), qos=1)
            assert (await _next(outside)).payload == b"kept"  # control: the route works
            assert [m.topic.value for m in await _quiet(cell)] == []
            assert [m.topic.value for m in await _quiet(monitor, 0.1)] == []
        async with mesh.client("floor1") as host:  # the kept one gone for later tests
            await host.publish(topic(MESH, (1, 1), (0, 1), Kind.HALO), b"", qos=1,
                               retain=True)

    run(test)


@pytest.mark.parametrize(
    ("user", "password"),
    [("r0c1", "not-the-password"), ("edge", ""), ("intruder", "guess"), (None, None)],
    ids=["wrong-password", "empty-password", "unknown-user", "anonymous"],
)
def test_bad_logins_are_refused_at_connect(mesh: Mesh, user: str | None,
                                           password: str | None) -> None:
    async def test() -> None:
        with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authori[sz]ed"):
            async with mesh.client(user, password):
                pass

    run(test)


def test_another_users_password_does_not_open_a_node(mesh: Mesh) -> None:
    async def test() -> None:
        with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authori[sz]ed"):
            async with mesh.client("edge", mesh.passwords["r0c0"]):
                pass

    run(test)


# --------------------------------------------------------------------------- the broker


def test_the_test_broker_restarts_on_the_same_port(mosquitto_factory) -> None:
    broker = mosquitto_factory()  # anonymous

    async def ping() -> None:
        async with aiomqtt.Client(broker.host, broker.port, timeout=5) as client:
            await client.publish("meshdl/ping", b"1", qos=1)

    port = broker.port
    asyncio.run(ping())
    broker.restart()
    assert broker.port == port
    asyncio.run(ping())
    broker.stop()
    with pytest.raises(aiomqtt.MqttError):
        asyncio.run(ping())
