"""Send-on-delta readings for the cloud-heavy baseline: which cells send in each time slot,
what the edge then holds, and how the readings of some cells are laid out in bytes.

The model: a cell sends its reading when it differs by more than EPS from the last value
it sent (the first slot always sends); the edge holds each cell's last value sent and
computes on those. EPS 0 sends every change, and a reading equal to the last one sent is
not sent. A cell whose reading is several values (one per input channel) sends all of
them when any differs by more than EPS. The difference is taken in float64, so that two
float32 readings are not compared through a float32 rounding of their difference.

Byte layout of the readings shipped in one slot (sim/studies/cloud.py ships them), V =
values of one cell (samples x input channels, float32 each, `ITEM_BYTES` = 4):

- **aggregated, up the BFS tree**: a node sends its parent one message with the readings
  of the senders in its subtree (itself and its descendants):
  - every cell of the subtree sends: header, then V values a cell, the cells in the
    subtree's order, which both ends know from the topology (no index);
  - some do not: header, then for each sender a 2-byte index (`INDEX_BYTES`: the cell's
    16-bit short address, row x cols + col, little-endian) and its V values;
  - none does: nothing; the link is silent.
- **unaggregated, relayed hop by hop**: each sender's own message, header and V values,
  relayed unchanged; the header's source names the cell, so no index.
- **MQTT star**: each sender publishes header and V values on its own topic (the topic
  names the cell), and the broker passes it to the edge.

A message above the mesh's limit (`max_message_bytes`) is cut into pieces, each with its
own header, reassembled in order: an unindexed payload at whole values (as the baseline
always has), an indexed one at whole bytes (the index-and-values stream, as a fragmented
payload is).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from meshdl.protocol.messages import ITEM_BYTES
from meshdl.protocol.topology import Cell

# A cell's index in an aggregated message: the node's 16-bit short address, as IEEE
# 802.15.4's MAC addressing fields carry it (macShortAddress, 16 bits; e.g. Zephyr's
# ieee802154_address, "16-bit short address", after IEEE Std 802.15.4 section 7.2.2).
INDEX_BYTES = 2
MAX_INDEXED_CELLS = 1 << (8 * INDEX_BYTES)  # what a 16-bit index can name


class SendOnDelta(NamedTuple):
    """Per slot and cell: did the cell send, and the value the edge then holds."""

    sends: np.ndarray  # bool (slots, cells)
    held: np.ndarray  # float32, the readings' shape (slots, cells, ...)


def send_on_delta(readings: np.ndarray, eps: float) -> SendOnDelta:
    """Which cells send in each slot of `readings` (slots, cells[, values a cell]) and
    what the edge holds, under send-on-delta with threshold `eps` >= 0."""
    values = np.asarray(readings, dtype=np.float32)
    if values.ndim < 2:
        raise ValueError(f"readings must be (slots, cells, ...), got shape {values.shape}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    if not np.isfinite(values).all():
        raise ValueError("readings must be finite: a NaN never differs by more than eps")
    slots, cells = values.shape[:2]
    sends = np.zeros((slots, cells), dtype=bool)
    held = np.empty_like(values)
    if slots == 0:
        return SendOnDelta(sends, held)
    last = values[0].copy()  # each cell's last value sent
    sends[0] = True
    held[0] = last
    within = tuple(range(1, values.ndim - 1))  # a cell's own values, when several
    for slot in range(1, slots):
        now = values[slot]
        change = np.abs(now.astype(np.float64) - last.astype(np.float64))
        if within:
            change = change.max(axis=within)
        sending = change > eps
        last[sending] = now[sending]
        sends[slot] = sending
        held[slot] = last
    return SendOnDelta(sends, held)


def senders_of(sends: np.ndarray, rows: int, cols: int) -> frozenset[Cell]:
    """The cells of a rows x cols grid that send, from one slot's row of `sends` (cells
    in row-major order, the topology's)."""
    row = np.asarray(sends, dtype=bool)
    if row.shape != (rows * cols,):
        raise ValueError(f"a slot of a {rows} x {cols} grid has {rows * cols} cells, "
                         f"got shape {row.shape}")
    return frozenset((int(i) // cols, int(i) % cols) for i in np.flatnonzero(row))


def piece_sizes(cells: int, values_per_cell: int, indexed: bool, header_bytes: int,
                max_message_bytes: int, value_bytes: int = ITEM_BYTES) -> list[int]:
    """Bytes of each message that carries `cells` cells' readings of `values_per_cell`
    values of `value_bytes` each (float32; 2 where the mesh sends 16-bit readings,
    int8-static), with an index a cell or not, within the limit (the module
    docstring's layout). At least one message: no reading at all is a header alone."""
    if header_bytes < 0:
        raise ValueError(f"header_bytes must be >= 0, got {header_bytes}")
    room = max_message_bytes - header_bytes
    if room < value_bytes:
        raise ValueError(f"a message of {max_message_bytes} bytes has no room for a "
                         f"value after a {header_bytes}-byte header")
    if indexed:  # the index-and-values stream, cut at whole bytes
        unit, per_message = 1, room
        total = cells * (INDEX_BYTES + value_bytes * values_per_cell)
    else:  # values, cut at whole values
        unit, per_message = value_bytes, room // value_bytes
        total = cells * values_per_cell
    pieces = max(1, math.ceil(total / per_message))
    return [header_bytes + unit * min(per_message, total - index * per_message)
            for index in range(pieces)]
