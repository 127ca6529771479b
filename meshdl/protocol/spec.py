"""The wave protocol's plan: who sends what to whom, derived from the mesh spec alone.

A wave computes one batch. Each message carries the values of a list of *items* of a
*field* (`FieldKind`, with a conv layer where it has one): cells' activations
(A, layer), cells' output gradients (DZ, layer), blocks' pooled features (POOLED),
blocks' pooled gradients (DPOOLED), cells' routed max-pool gradients (ROUTE). The plan
lists, for every cell and the edge, the messages it sends (`Send`: kind, layer, phase,
destination, field, items) and so, by inversion, the messages it expects. A message
is sent the moment all its items are known; this single rule makes the wave pipelined
(no barrier between layers) and tolerant of any delivery order.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import Any, Literal

import numpy as np

from meshdl.compress.codec import VectorCodec
from meshdl.compress.compressors import Compressor
from meshdl.compress.intsum import SumCodec, SumShare
from meshdl.compress.policy import CompressionPolicy, reduce_segments
from meshdl.config import ModelConfig
from meshdl.errors import UsageError
from meshdl.limits import MAX_MESSAGE_BYTES
from meshdl.protocol.activations import STATIC, StaticCodes, activation_compressor
from meshdl.protocol.auth import link, tag_bytes
from meshdl.protocol.compact import (
    ANY,
    COMPACT_HEADER_BYTES,
    HeaderFormat,
    PlanKey,
    Shape,
    ShapeOf,
)
from meshdl.protocol.messages import (
    ALL,
    BYTES,
    EDGE,
    FLOAT32,
    HEADER_BYTES,
    ITEM_BYTES,
    Header,
    Kind,
)
from meshdl.protocol.payloads import BATCH_HEAD, ParamsLayout
from meshdl.protocol.topology import Cell, Topology, window_offsets

Field = tuple[Hashable, ...]  # (FieldKind,) or (FieldKind, layer)


class FieldKind(StrEnum):
    """What the items of a field are. Each equals (and hashes as) its string, so a field
    written ("a", 1) elsewhere is the same key as (FieldKind.A, 1)."""

    A = "a"  # cells' activations after conv `layer` (0: the input)
    DZ = "dz"  # cells' d(loss)/d(output of conv `layer`)
    POOLED = "pooled"  # blocks' pooled features
    DPOOLED = "dpooled"  # blocks' d(loss)/d(pooled)
    ROUTE = "route"  # cells' max-pool gradient, routed from their block's leader
    # Global pooling: the items are subtrees, known by their root cell.
    WINNER = "winner"  # subtrees' first cells holding each pooled maximum (row x cols + col)


class Mode(IntEnum):
    TRAIN = 0  # forward, backward, reduce
    INFER = 1  # forward and gather only


class Split(IntEnum):
    TRAIN = 0
    TEST = 1
    LIVE = 2  # live sensor readings: a ring of the last LIVE_SLOTS time slots


KEPT_REPLANS = 16  # plans of one mesh kept for its parties (dead cells come and go)
LIVE_SLOTS = 64  # time slots a node keeps: a BATCH of LIVE indexes slot % LIVE_SLOTS


@dataclass(frozen=True)
class Send:
    """One message a party sends in a wave. An item-carrying one (`MeshSpec.sends`)
    goes out once its items are known; a relay (`MeshSpec.relays`, no field, no items)
    when its kind's row in meshdl/protocol/kinds.py says."""

    kind: Kind
    layer: int
    phase: int
    dst: Cell
    field: Field
    items: tuple[Hashable, ...]
    train_only: bool
    occasional: bool = False  # sent only when there is something to say (HEALTH)


@dataclass(frozen=True)
class MeshSpec:
    """What every agent of one mesh agrees on: its id, the model and the topology."""

    mesh_id: int
    model: ModelConfig
    edge_at: Cell = (0, 0)
    # How PARAMS and BATCH reach every node: flooded down the BFS tree, one hop at a time
    # (a radio mesh), or published once by the edge to all nodes (through an MQTT broker,
    # whose ACL then lets nobody but the edge write parameters).
    params_via: Literal["tree", "broadcast"] = "tree"
    # No message of a wave may weigh more (header included): the broker's limit. Waves
    # are planned from it (`max_batch`); a node refuses a BATCH beyond.
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # Every message carries a link tag or the edge's signature (meshdl/protocol/auth.py).
    auth: bool = False
    # Cells the plan goes around (meshdl/protocol/topology.py): the edge announces them with the
    # parameters of every wave, so every party plans the same mesh.
    dead: frozenset[Cell] = frozenset()
    # The configured edge_at, where the edge may have moved (it re-attaches when its
    # cell dies); None: edge_at. PARAMS carry the plan when it is not (home, no dead).
    home: Cell | None = None
    # The --compress policy (meshdl/compress/policy.py): REDUCE carries the conv layers'
    # gradients compressed as it says, re-compressed at every hop.
    compress: str = "none"
    # HALO, POOL and GATHER payloads: float32, lossy fp16 / int8, or int8-static: the
    # codes of calibrated per-layer scales, which PARAMS carry (protocol/activations.py).
    activations: str = "float32"
    # Live inference: HALOs carry only the cells that changed by more than this since
    # the last wave (nodes/delta.py); None sends every value.
    delta: float | None = None
    # Each message's header: the 48 bytes of messages.py, or the 8 a radio stack needs
    # beside its MAC frame (meshdl/protocol/compact.py). What is counted as sent (bytes,
    # airtime) follows it; the ledger reports both.
    header: HeaderFormat = "full"
    topology: Topology = field(init=False, compare=False)

    def __post_init__(self) -> None:
        topo = Topology(self.model.rows, self.model.cols, self.edge_at, self.model.window,
                        frozenset(self.dead))
        object.__setattr__(self, "topology", topo)
        if self.model.position_bias and self.compress != "none":  # (as RunConfig refuses)
            raise UsageError("a position bias trains uncompressed: its REDUCE carries the "
                             "table's gradient, which no --compress policy knows")
        params = self.overhead(Kind.PARAMS) + ITEM_BYTES * self.params_size
        if params > self.max_message_bytes or self.max_batch < 1:
            need = max(params, self.overhead(Kind.GATHER) + ITEM_BYTES * self.values_per_sample)
            raise UsageError(f"mesh.max_message_bytes: {self.max_message_bytes} is too small "
                             f"for this model's messages (at least {need} bytes)")

    @property
    def planned(self) -> bool:
        """Is this not the configured plan (dead cells, or the edge moved)? Its PARAMS
        then carry it (`PlanTail`)."""
        return bool(self.dead) or (self.home is not None and self.home != self.edge_at)

    @property
    def plan_key(self) -> tuple[Cell, frozenset[Cell]]:
        """What tells this spec's plan from its replans'."""
        return self.edge_at, self.dead

    def replanned(self, edge_at: Cell, dead: frozenset[Cell]) -> MeshSpec:
        """This mesh with the edge at `edge_at` and `dead` cells (one object per plan,
        shared by every party of this process: its plan is worked out once)."""
        if (edge_at, dead) == self.plan_key:
            return self
        replans = self._replans
        spec = replans.pop((edge_at, dead), None)
        if spec is None:
            if len(replans) >= KEPT_REPLANS:  # the least recently used goes
                del replans[next(iter(replans))]
            spec = MeshSpec(self.mesh_id, self.model, edge_at, self.params_via,
                            self.max_message_bytes, self.auth, frozenset(dead),
                            self.home or self.edge_at, self.compress, self.activations,
                            self.delta, self.header)
            spec.__dict__["_replans"] = replans  # one family of plans
        replans[(edge_at, dead)] = spec
        return spec

    @cached_property
    def _replans(self) -> dict[tuple[Cell, frozenset[Cell]], MeshSpec]:
        return {self.plan_key: self}

    @cached_property
    def params_layout(self) -> ParamsLayout:
        """Where each conv layer's weights, biases, the normalization and (intsum) the
        sum scales sit in PARAMS."""
        summed = self.reduce_sum
        return ParamsLayout.of(self.model, 0 if summed is None else len(summed.parts),
                               self.activations == STATIC)

    @cached_property
    def params_size(self) -> int:
        """Values of a PARAMS payload: the conv parameters, then normalization mean, std."""
        return self.params_layout.size

    @cached_property
    def values_per_sample(self) -> int:
        """Values per sample of a wave's largest message (the GATHER into the edge,
        usually: every block's pooled features)."""
        return max(len(s.items) * self.item_shape(s.field, 0)[0]
                   for sends in self.sends.values() for s in sends)

    @cached_property
    def max_batch(self) -> int:
        """The most samples one wave may carry with every message within
        `max_message_bytes` (a BATCH holds mode, split and an index per sample)."""
        values = (self.max_message_bytes - self.overhead(Kind.GATHER)) // ITEM_BYTES
        indices = (self.max_message_bytes - self.overhead(Kind.BATCH)) // ITEM_BYTES - \
            BATCH_HEAD
        return min(values // self.values_per_sample, indices)

    @property
    def max_batch_values(self) -> int:
        """The most values a BATCH holds: mode, split, `max_batch` indices and (failout)
        up to every cell of the grid."""
        return BATCH_HEAD + self.max_batch + self.model.rows * self.model.cols

    def overhead(self, kind: Kind, header: HeaderFormat | None = None) -> int:
        """Bytes of a message of `kind` besides its values: the header (this mesh's, or
        the `header` format given), and the tag or signature when the mesh authenticates
        its messages."""
        form = self.header if header is None else header
        if form == "compact":
            size = COMPACT_HEADER_BYTES
        elif form == "full":
            size = HEADER_BYTES
        else:
            raise UsageError(f"mesh header: {form!r} is neither 'full' nor 'compact'")
        return size + (tag_bytes(kind) if self.auth else 0)

    @cached_property
    def links(self) -> frozenset[tuple[Cell, Cell]]:
        """The pairs of parties that exchange link messages (each shares a key when the
        mesh authenticates): neighbours, and the edge with the cell it is linked to (its
        tree parent)."""
        return frozenset(link(src, s.dst) for table in (self.sends, self.relays)
                         for src, sends in table.items() for s in sends if s.dst != ALL)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """What node hosts and the edge must agree on before the first wave: every
        setting a node's plan or kernels depend on. Node hosts put it in their status
        record; the edge names the fields that differ from its own."""
        m = self.model
        return {"mesh_id": self.mesh_id, "rows": m.rows, "cols": m.cols,
                "in_channels": m.in_channels, "kernel": m.kernel, "filters": m.filters,
                "conv_layers": m.conv_layers, "pool": m.pool,
                "edge_at": list(self.edge_at), "params_via": self.params_via,
                "max_message_bytes": self.max_message_bytes, "auth": self.auth,
                "compress": self.compress, "activations": self.activations,
                "delta": self.delta, "header": self.header}

    def differences(self, summary: dict[str, Any]) -> list[str]:
        """"kernel 5 (here 3)" for each field of another agent's `summary` that differs."""
        return [f"{key} {summary.get(key, 'missing')} (here {mine})"
                for key, mine in self.summary.items() if summary.get(key) != mine]

    def control_source(self, cell: Cell) -> Cell:
        """Who sends `cell` its PARAMS and BATCH."""
        return EDGE if self.params_via == "broadcast" else self.topology.parent[cell]

    @property
    def control_destination(self) -> Cell | None:
        """The edge's PARAMS and BATCH go to every node at once, or to `edge_at` (None)."""
        return ALL if self.params_via == "broadcast" else None

    @property
    def offsets(self) -> tuple[int, int]:
        """(before, after): how far a forward window reaches from its centre."""
        return window_offsets(self.model.kernel)

    @property
    def conv_size(self) -> int:
        """Values of the conv parameters: a REDUCE's first."""
        return self.params_layout.conv_size

    @property
    def reduce_size(self) -> int:
        """Values of a REDUCE payload: the conv gradients, then a position bias's."""
        return self.params_layout.reduce_size

    @cached_property
    def reduce_codec(self) -> VectorCodec | None:
        """How a REDUCE's conv gradients are compressed at every hop; None: plain
        float32, or summed as whole numbers (`reduce_sum`)."""
        if self.reduce_sum is not None:
            return None
        codec = CompressionPolicy.parse(self.compress, self.model).codec(
            reduce_segments(self.model))
        return None if codec.lossless else codec

    @cached_property
    def reduce_sum(self) -> SumCodec | None:
        """The in-network sum of the REDUCE under intsum (compress/intsum.py), else None."""
        return CompressionPolicy.parse(self.compress, self.model).sum_codec(
            reduce_segments(self.model))

    @cached_property
    def reduce_operations(self) -> int:
        """Operations of encoding and decoding one REDUCE (charged half and half)."""
        codec = self.reduce_codec or self.reduce_sum
        return 0 if codec is None else codec.operations

    def empty_reduce(self) -> np.ndarray | SumShare:
        """What a subtree that sent nothing adds (best effort): zeros."""
        summed = self.reduce_sum
        return np.zeros(self.reduce_size, np.float32) if summed is None else summed.zeros()

    @cached_property
    def activation_codec(self) -> Compressor | StaticCodes | None:
        """How forward activations travel (HALO, POOL, GATHER); None: float32."""
        return activation_compressor(self.activations, self.model.conv_layers)

    @property
    def reading_bytes(self) -> int:
        """Bytes of one reading (a value of the input) on the air: 2 under int8-static
        (int16 codes), else 4 (float32). The cloud baseline ships its readings so too."""
        return 2 if self.activations == STATIC else ITEM_BYTES

    def read_reduce(self, header: Header, payload: np.ndarray
                    ) -> np.ndarray | SumShare | None:
        """A REDUCE's gradients (float32, `reduce_size`; under intsum its subtree's
        whole-number sums), or None if its payload is not the one this mesh sends (dtype,
        shape); CodecError if compressed bytes are not any its compressors write."""
        summed = self.reduce_sum
        if summed is not None:
            cells = self.topology.subtree_sizes.get(header.src)
            if header.dtype != BYTES or payload.ndim != 1 or cells is None or \
                    payload.size > summed.max_nbytes(cells):
                return None
            return summed.decode(payload, cells)
        codec = self.reduce_codec
        if codec is None:
            ok = header.dtype == FLOAT32 and payload.shape == (self.reduce_size,)
            return payload if ok else None
        if header.dtype != BYTES or payload.shape != (codec.nbytes,):
            return None
        return codec.decode(payload)

    def channels(self, layer: int) -> int:
        """Channels of activation (A, layer): the input's for 0, filters after."""
        return self.model.in_channels if layer == 0 else self.model.filters

    # ------------------------------------------------------------------ plan
    @cached_property
    def sends(self) -> dict[Cell, list[Send]]:
        """Every message of a training wave, by sender (cells and the edge)."""
        topo, layers = self.topology, self.model.conv_layers
        before, after = self.offsets
        members = [cell for cell in topo.cells() if cell in topo.members]
        plan: dict[Cell, list[Send]] = {cell: [] for cell in members}
        pooling = self._aggregation_sends if self.model.global_pool else self._block_sends
        for cell in members:
            out = plan[cell]
            for layer in range(1, layers + 1):
                for s in topo.strips_from(cell, before, after):
                    out.append(Send(Kind.HALO, layer, s.phase, s.dst,
                                    (FieldKind.A, layer - 1), s.cells, False))
            out.extend(pooling(cell))
            # The gradient exchange mirrors the window: (after, before).
            for layer in range(layers, 1, -1):
                for s in topo.strips_from(cell, after, before):
                    out.append(Send(Kind.GRAD_HALO, layer, s.phase, s.dst,
                                    (FieldKind.DZ, layer), s.cells, True))
        root_items = (topo.edge_at,) if self.model.global_pool else \
            tuple(topo.tree_blocks(topo.edge_at))
        plan[EDGE] = [Send(Kind.SCATTER, 0, 0, topo.edge_at, (FieldKind.DPOOLED,), root_items,
                           True)]
        return plan

    def _block_sends(self, cell: Cell) -> list[Send]:
        """Windowed max-pooling: a cell's last conv output towards its block's leader
        (POOL), the pooled blocks of its subtree to its tree parent (GATHER), and back
        down their gradients (SCATTER) and the leader's routed ones (ROUTE)."""
        topo, layers, out = self.topology, self.model.conv_layers, []
        up = topo.block_parent(cell)
        if up is not None:
            out.append(Send(Kind.POOL, layers, 0, up, (FieldKind.A, layers),
                            tuple(topo.block_subtree(cell)), False))
        blocks = tuple(topo.tree_blocks(cell))
        if blocks:
            out.append(Send(Kind.GATHER, 0, 0, topo.parent[cell], (FieldKind.POOLED,),
                            blocks, False))
        for child in topo.children[cell]:
            child_blocks = tuple(topo.tree_blocks(child))
            if child_blocks:
                out.append(Send(Kind.SCATTER, 0, 0, child, (FieldKind.DPOOLED,),
                                child_blocks, True))
        for child in topo.block_children[cell]:
            out.append(Send(Kind.ROUTE, layers, 0, child, (FieldKind.ROUTE,),
                            tuple(topo.block_subtree(child)), True))
        return out

    def _aggregation_sends(self, cell: Cell) -> list[Send]:
        """Global pooling, TAG's MAX up the tree: one GATHER to the tree parent with the
        maximum of the cell's subtree (per channel and sample); in training a second
        (phase 1) with the first cell holding each maximum, which ties need (not to the
        edge: it routes nothing), and SCATTER down to each child with the gradient of
        what its subtree won."""
        topo, parent = self.topology, self.topology.parent[cell]
        out = [Send(Kind.GATHER, 0, 0, parent, (FieldKind.POOLED,), (cell,), False)]
        if parent != EDGE:
            out.append(Send(Kind.GATHER, 0, 1, parent, (FieldKind.WINNER,), (cell,), True))
        out.extend(Send(Kind.SCATTER, 0, 0, child, (FieldKind.DPOOLED,), (child,), True)
                   for child in topo.children[cell])
        return out

    @cached_property
    def relays(self) -> dict[Cell, list[Send]]:
        """The messages of a wave that carry no field's items, by sender: the edge's
        PARAMS and BATCH (to every node at once, or to `edge_at`), each node's copies of
        them for its tree children (radio), its REDUCE up the tree (training waves, its
        last task) and its HEALTH report (best effort, when a neighbour went silent).
        With `sends`, every message of a wave."""
        topo = self.topology
        empty: tuple[Hashable, ...] = ()
        plan: dict[Cell, list[Send]] = {
            cell: [] for cell in topo.cells() if cell in topo.members}
        plan[EDGE] = [Send(kind, 0, 0, self.control_destination or self.edge_at, empty,
                           empty, False) for kind in (Kind.PARAMS, Kind.BATCH)]
        for cell, out in plan.items():
            if cell == EDGE:
                continue
            for child in topo.children[cell] if self.params_via == "tree" else ():
                out.append(Send(Kind.PARAMS, 0, 0, child, empty, empty, False))
                out.append(Send(Kind.BATCH, 0, 0, child, empty, empty, False))
            out.append(Send(Kind.REDUCE, 0, 0, topo.parent[cell], empty, empty, True))
            out.append(Send(Kind.HEALTH, 0, 0, topo.parent[cell], empty, empty, False,
                            occasional=True))
        return plan

    @cached_property
    def expects(self) -> dict[Cell, dict[tuple[Kind, int, int, Cell], Send]]:
        """Item-carrying messages each agent receives, keyed (kind, layer, phase, src)."""
        inbox: dict[Cell, dict[tuple[Kind, int, int, Cell], Send]] = {
            cell: {} for cell in self.sends}
        for src, sends in self.sends.items():
            for s in sends:
                inbox[s.dst][(s.kind, s.layer, s.phase, src)] = s
        return inbox

    def item_shape(self, f: Field, batch: int) -> tuple[int, int]:
        """Shape of one item's values: (channels, batch)."""
        if f[0] == FieldKind.A:
            return self.channels(int(f[1])), batch
        return self.model.filters, batch


# What a receiver of compact headers (compact.py) knows of a message's shape: it is the
# plan's, so it is read here from the spec, and compact.py takes it as a function.
def expected_shape(spec: MeshSpec, dst: Cell, key: PlanKey, batch: int) -> Shape | None:
    """The shape of the payload `dst` expects for a message of its plan, keyed (kind,
    layer, phase, src), in a wave of `batch` samples (a float32 or int32 one: compressed
    payloads are their bytes); None if its plan has no such message. The items a message
    carries are rows of (channels, batch) values (nodes/plan.py, `Expect`); a REDUCE is
    the conv gradients; PARAMS and BATCH (which says the batch), and HEALTH, are as long
    as the frame says: PARAMS end with a plan tail only they announce."""
    kind, layer, phase, src = key
    send = spec.expects.get(dst, {}).get(key)
    if send is not None:
        return (len(send.items), *spec.item_shape(send.field, batch))
    relayed = any(s.kind == kind and s.layer == layer and s.phase == phase and s.dst == dst
                  for s in spec.relays.get(src, ()))
    if kind == Kind.HEALTH and layer == phase == 0 and spec.topology.inside(src) and \
            spec.topology.inside(dst) and abs(src[0] - dst[0]) + abs(src[1] - dst[1]) == 1:
        relayed = True  # a hello: a cell the plan may leave out greets its grid neighbours
    if not relayed:
        return None
    return (spec.reduce_size,) if kind == Kind.REDUCE else (ANY,)


def plan_shapes(spec: MeshSpec, dst: Cell, batch: int) -> ShapeOf:
    """`expected_shape` for one receiver and batch: a `CompactContext.shapes`."""
    def shape_of(key: PlanKey) -> Shape | None:
        return expected_shape(spec, dst, key, batch)
    return shape_of
