"""Delta halos: in live inference, slot after slot, a node sends a neighbour only the
cells of a HALO whose values changed by more than epsilon since what that neighbour
holds (`mesh.delta`).

Temperatures change slowly, so from one time slot to the next most of a strip's cells
move by less than a sensor's noise. The sender keeps, per message it sends, the values
its receiver holds; the receiver keeps them too, per message it receives, and overwrites
the cells that came. Where the changed cells with their indices would weigh as much as
the whole strip, the whole strip goes. At epsilon 0 every change is sent and the
receiver computes on exactly the values a whole halo would have brought; above, each
value it holds is within epsilon of the sender's. Only inference waves use it (training
waves send every value), and only from one wave to the next of the same batch: the
first, a new plan, a new batch size and every `REFRESH`-th wave send the whole strip,
so a receiver that lost its state (a restarted node host) is back in step within
`REFRESH` waves. Epsilon is in the units the HALO carries: normalized readings for the
first layer, activations above.

Under best effort a delta that comes after its deadline (its wave filled it in) is still
applied to what the receiver holds, since the sender's next delta is against it
(nodes/agent.py `_take_items`). One lost outright, or one that comes once the receiver
has begun a later wave (counted stale), is not: the rows it changed stay at their older
values at the receiver until they change again or the next whole strip, at most
`REFRESH` waves on.

Payload (bytes): mode u8 (0 full, 1 delta), 3 zero bytes, count u32, then for a delta
the count rows' indices (u16, increasing, padded with zeros to 4 bytes), then the rows'
values (rows, channels, batch): float32, or under int8-static the codes a whole HALO
carries (`RowForm`: int16 readings, uint8 activations; meshdl/protocol/activations.py).
Those values were quantized where they were made, so a code's row is its row exactly,
and a delta over codes computes what one over float32 does, in a quarter or half of
the bytes.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from meshdl.protocol.activations import StaticCodes
from meshdl.protocol.messages import Kind

REFRESH = 16  # waves between whole strips
FULL, DELTA = 0, 1
_HEAD = 8


class RowForm:
    """How a delta payload carries its rows' values: float32 (this class), or the codes
    of a message's layer (`CodedRows`). Its `tag` names the form: a delta applies only
    to rows held in the same one (a new scale after a model update: a whole strip)."""

    itemsize = 4
    tag: float | None = None

    def to_bytes(self, values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, "<f4").reshape(-1).view(np.uint8)

    def from_bytes(self, payload: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
        """The values of `shape` (the payload is that many values' bytes); None if
        one is not finite."""
        values = payload.copy().view("<f4").reshape(shape)
        return values if np.all(np.isfinite(values)) else None


FLOAT32_ROWS = RowForm()


class CodedRows(RowForm):
    """int8-static: a HALO's rows as its layer's codes (`StaticCodes`, with the wave's
    scales from PARAMS)."""

    def __init__(self, codes: StaticCodes, scales: np.ndarray, kind: Kind, layer: int) -> None:
        self.codes, self.scales, self.kind, self.layer = codes, scales, kind, layer
        self.itemsize = codes.itemsize(kind, layer)
        self.tag = float(scales[codes.layer_of(kind, layer)])

    def to_bytes(self, values: np.ndarray) -> np.ndarray:
        return self.codes.encode(values, self.scales, self.kind, self.layer)

    def from_bytes(self, payload: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
        """None if a code is one no node makes."""
        return self.codes.decode(payload, shape, self.scales, self.kind, self.layer)


def _indices_bytes(count: int) -> int:
    return (2 * count + 3) // 4 * 4


class DeltaSender:
    """A node's side of its delta HALOs: what each receiver holds."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon
        self.held: dict[Hashable, np.ndarray] = {}
        self.forms: dict[Hashable, float | None] = {}  # the `RowForm.tag` held in
        self.since_full: dict[Hashable, int] = {}
        self.rows_sent = self.rows_skipped = 0

    def reset(self) -> None:
        self.held.clear()
        self.forms.clear()
        self.since_full.clear()

    def encode(self, key: Hashable, values: np.ndarray,
               rows: RowForm = FLOAT32_ROWS) -> np.ndarray:
        """The payload for `values` (rows, channels, batch) of message `key`, its
        values as `rows` carries them."""
        held = self.held.get(key)
        waves = self.since_full.get(key, REFRESH)
        if held is None or held.shape != values.shape or waves >= REFRESH or \
                self.forms[key] != rows.tag:
            self.held[key] = values.copy()
            self.forms[key] = rows.tag
            self.since_full[key] = 1
            self.rows_sent += values.shape[0]
            return _payload(FULL, values.shape[0], None, rows.to_bytes(values))
        changed = np.flatnonzero(
            np.abs(values - held).reshape(values.shape[0], -1).max(axis=1) > self.epsilon)
        per_row = rows.itemsize * values[0].size
        if _indices_bytes(changed.size) + per_row * changed.size >= per_row * len(values):
            # Nearly everything moved: the whole strip is smaller than its changes.
            held[...] = values
            self.since_full[key] = waves + 1
            self.rows_sent += values.shape[0]
            return _payload(FULL, values.shape[0], None, rows.to_bytes(values))
        held[changed] = values[changed]
        self.since_full[key] = waves + 1
        self.rows_sent += changed.size
        self.rows_skipped += values.shape[0] - changed.size
        return _payload(DELTA, changed.size, changed, rows.to_bytes(values[changed]))


def _payload(mode: int, count: int, rows: np.ndarray | None,
             values: np.ndarray) -> np.ndarray:
    """The payload's bytes: `values` are the rows' values as bytes already."""
    head = np.zeros(_HEAD, np.uint8)
    head[0] = mode
    head[4:8] = np.array([count], "<u4").view(np.uint8)
    parts = [head]
    if rows is not None:
        index = np.zeros(_indices_bytes(count) // 2, "<u2")
        index[:count] = rows
        parts.append(index.view(np.uint8))
    parts.append(values)
    return np.concatenate(parts)


class DeltaReceiver:
    """A node's side of the delta HALOs it receives: what each sender last brought."""

    def __init__(self) -> None:
        self.held: dict[Hashable, np.ndarray] = {}
        self.forms: dict[Hashable, float | None] = {}  # the `RowForm.tag` held in

    def reset(self) -> None:
        self.held.clear()
        self.forms.clear()

    def decode(self, key: Hashable, payload: np.ndarray, shape: tuple[int, int, int],
               rows_as: RowForm = FLOAT32_ROWS) -> np.ndarray | None:
        """The (rows, channels, batch) values message `key` brings, its values as
        `rows_as` carries them, or None if the payload is not a well-formed one for
        `shape` (or a delta with nothing to apply it to)."""
        if payload.dtype != np.uint8 or payload.ndim != 1 or payload.size < _HEAD:
            return None
        mode, count = int(payload[0]), int(payload[4:8].copy().view("<u4")[0])
        rows, per_row = shape[0], shape[1] * shape[2] * rows_as.itemsize
        if mode not in (FULL, DELTA) or payload[1:4].any() or count > rows:
            return None
        if mode == FULL:
            if count != rows or payload.size != _HEAD + rows * per_row:
                return None
            values = rows_as.from_bytes(payload[_HEAD:], shape)
            if values is None:
                return None
            self.held[key] = values.copy()
            self.forms[key] = rows_as.tag
            return values
        held = self.held.get(key)
        start = _HEAD + _indices_bytes(count)
        if held is None or held.shape != shape or self.forms[key] != rows_as.tag or \
                payload.size != start + count * per_row:
            return None
        index = payload[_HEAD:start].copy().view("<u2").astype(np.int64)
        picked, pad = index[:count], index[count:]
        if pad.any() or (count and (picked[-1] >= rows or np.any(np.diff(picked) <= 0))):
            return None
        values = rows_as.from_bytes(payload[start:], (count, *shape[1:]))
        if values is None:
            return None
        held[picked] = values
        return held.copy()
