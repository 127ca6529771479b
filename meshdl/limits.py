"""The sizes a mesh message may have: what the codec accepts at all, and the default
most one message may weigh. Configuration bounds `mesh.max_message_bytes` by them and
the codec (protocol/messages.py) enforces them, so they live below both."""

from __future__ import annotations

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # what the codec accepts at all
# What one message may weigh, header included, unless the mesh configuration says
# otherwise: the production broker's message_size_limit (deploy/mosquitto/production.conf).
MAX_MESSAGE_BYTES = 1024 * 1024
# What the arrays of one .npz file meshdl reads (a data set, a sensor log, a model, a
# checkpoint) may take in memory, by their headers, before any is read: a few MB of
# deflated zeros unpack to gigabytes. A year of 30-minute maps of a 100 x 100 grid in
# float32 is 700 MB; the source paper's data set is 5 MB.
MAX_FILE_ARRAY_BYTES = 1024 * 1024 * 1024
