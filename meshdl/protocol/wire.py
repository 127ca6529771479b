"""How a process's mesh messages become bytes and back, and what it counts on the way.

One `Wire` per process (per party in the virtual mesh): `seal` a message for sending,
`receive` bytes that arrived. Received bytes are decoded and validated by the codec
(meshdl/protocol/messages.py) and, when the mesh authenticates messages, their tag or signature
checked with the process's keys (meshdl/protocol/auth.py); what fails is counted by reason
(`rejected:codec:<reason>`, a closed set) and dropped, never raised. Both transports, the
virtual mesh and MQTT, receive through here.
"""

from __future__ import annotations

from collections import Counter

from meshdl.errors import CodecError
from meshdl.protocol.auth import Authenticator
from meshdl.protocol.messages import Message, decode, encode


class Wire:
    """The codec of one process, with its keys when the mesh authenticates."""

    def __init__(self, mesh_id: int | None, auth: Authenticator | None = None) -> None:
        """`mesh_id`: the only mesh whose messages it takes (None: any, for a parameter
        server, which checks the mesh itself)."""
        self.mesh_id = mesh_id
        self.auth = auth

    def seal(self, message: Message) -> bytes:
        """The bytes to send: the codec's, and the tag when the mesh authenticates."""
        return encode(message) if self.auth is None else self.auth.seal(message)

    def open(self, data: bytes) -> Message:
        """Decode and verify; CodecError naming what is wrong."""
        return decode(data, mesh=self.mesh_id) if self.auth is None else self.auth.open(data)

    def receive(self, data: bytes, stats: Counter[str]) -> Message | None:
        """The message in `data`, or None (counted in `stats` by reason)."""
        try:
            return self.open(data)
        except CodecError as exc:
            stats[f"rejected:codec:{exc.reason.value}"] += 1
            return None
