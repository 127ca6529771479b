"""The broker's size limits follow the mesh (issue 43, item 3): a mesh whose
mesh.max_message_bytes is N gets a broker that refuses anything larger (`message_limits`,
and production.conf rewritten with them), so a stolen login's 1 MB messages never reach
a neighbour: the broker throws the login out at the packet's header."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest

from meshdl.mqtt.localbroker import (
    PACKET_OVERHEAD,
    PRODUCTION_CONF,
    message_limits,
    production_config,
)

LIMIT = 8192  # what the hostile bench's 4 x 5 mesh is given: its GATHER is 1,264 B


def test_production_conf_ships_the_default_mesh_limit_and_is_rewritten_to_a_meshs(
        tmp_path) -> None:
    from meshdl.limits import MAX_MESSAGE_BYTES

    shipped = PRODUCTION_CONF.read_text()
    for option, value in message_limits(MAX_MESSAGE_BYTES).items():
        assert f"\n{option} {value}\n" in shipped, option
    text = production_config(tmp_path, 18883, 11883, max_message_bytes=LIMIT)
    assert f"\nmessage_size_limit {LIMIT}\n" in text
    assert f"\nmax_packet_size {LIMIT + PACKET_OVERHEAD}\n" in text
    assert "1048576" not in text and "1049600" not in text


def test_a_broker_with_a_meshs_limits_throws_out_a_login_sending_1_mb(
        mosquitto_factory) -> None:
    broker = mosquitto_factory(extra=tuple(f"{k} {v}" for k, v in
                                           message_limits(LIMIT).items()))

    async def main() -> tuple[list[int], bool]:
        got: list[int] = []
        async with aiomqtt.Client(broker.host, broker.port) as listener:
            await listener.subscribe("meshdl/1/#")
            thrown_out = False
            try:
                async with aiomqtt.Client(broker.host, broker.port) as attacker:
                    for _ in range(3):  # the first is refused, the others find no socket
                        await attacker.publish("meshdl/1/r0c1/r1c1/halo", bytes(1_040_000))
                        await asyncio.sleep(0.2)
            except aiomqtt.MqttError:
                thrown_out = True
            async with aiomqtt.Client(broker.host, broker.port) as node:
                await node.publish("meshdl/1/r0c0/r1c0/gather", bytes(LIMIT), qos=1)

            async def take() -> None:
                async for message in listener.messages:
                    got.append(len(message.payload))
                    if len(message.payload) == LIMIT:
                        return

            await asyncio.wait_for(take(), 20)  # a bound on the test, not a timing claim
        return got, thrown_out

    got, thrown_out = asyncio.run(main())
    assert got == [LIMIT]  # the legitimate message of the limit's size, nothing else
    assert thrown_out
    assert "disconnected due to oversize packet" in broker.log_text()


@pytest.mark.parametrize("size", [1023, 1 << 20])
def test_message_limits_leave_room_for_topic_and_header(size: int) -> None:
    limits = message_limits(size)
    assert limits == {"message_size_limit": size, "max_packet_size": size + 1024}
