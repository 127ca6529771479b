"""The sizes a mesh message may have: what the codec accepts at all, and the default
most one message may weigh. Configuration bounds `mesh.max_message_bytes` by them and
the codec (protocol/messages.py) enforces them, so they live below both."""

from __future__ import annotations

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # what the codec accepts at all
# What one message may weigh, header included, unless the mesh configuration says
# otherwise: the production broker's message_size_limit (deploy/mosquitto/production.conf).
MAX_MESSAGE_BYTES = 1024 * 1024
