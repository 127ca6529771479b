"""The cloud-heavy baseline: every node's readings go to the edge, which computes all.

This is what the source paper argues in-mesh computing beats, so it runs on the same
medium, radio and device profiles as the mesh and is timed the same way (sim/radio/media.py):

- over the radio mesh, up the same BFS tree, either *aggregated* (a node waits for its
  children and sends one message per tree link carrying its subtree's readings, cut to
  the mesh's message size limit) or *unaggregated* (every node's readings are one
  message, relayed hop by hop);
- over the MQTT star, each node publishes its readings and the broker passes them to
  the edge.

Messages carry the mesh's own header (48 bytes) and float32 values, so bytes compare
like for like. For inference the readings are one time slot (the batch); for training
the raw training set is shipped once and every epoch then runs at the edge (the cloud
behind it computes the same), against in-mesh training, which crosses the mesh at
every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from meshdl.config import param_shapes
from meshdl.protocol.messages import EDGE, HEADER_BYTES, ITEM_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import topic
from meshdl.protocol.topology import Cell, Topology
from meshdl.protocol.work import central_work, optimizer_work
from meshdl.sim.radio.clock import EventQueue
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.energy import energy_record
from meshdl.sim.radio.media import BROKER, Medium, MediumName, RadioTimes, Transmission, medium_for
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party
from meshdl.sim.timed import BROKER_S, publish_bytes

Variant = Literal["aggregated", "unaggregated"]


class Piece(NamedTuple):
    """One message of readings: its bytes, and the cells whose readings it completes."""

    size: int
    cells: int


@dataclass
class Shipped:
    """Readings shipped to the edge: when the last arrived, and what it cost."""

    variant: Variant
    makespan_s: float
    bytes: int  # unframed, every transmission (each hop, broker relays included)
    frames: int
    transmissions: int
    times: RadioTimes  # each party's seconds transmitting and receiving
    cpu_s: dict[Party, float]  # each party's seconds computing
    parties: _Parties

    @property
    def energy_j(self) -> dict[str, Any]:
        """sim/radio/energy.py's record over the shipping alone."""
        return self.energy_over(self.makespan_s, 0.0)

    def energy_over(self, seconds: float, edge_computing: float) -> dict[str, Any]:
        """The record over a window of `seconds` from the first reading sent, in which
        the edge also computes for `edge_computing` seconds after the last came: the
        nodes listen (always-on) or sleep (ideal MAC) meanwhile, as in the mesh."""
        p, cpu = self.parties, dict(self.cpu_s)
        cpu[EDGE] = cpu.get(EDGE, 0.0) + edge_computing
        return energy_record(p.radio, p.device, p.edge_device, p.cells, EDGE, self.times.tx,
                             self.times.rx, cpu, seconds)


class _Parties(NamedTuple):
    """Who ships: the cells on their devices and radio, and the edge's device."""

    radio: RadioProfile
    device: DeviceProfile
    edge_device: DeviceProfile
    cells: list[Cell]


def ship_readings(spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                  device: DeviceProfile, edge_device: DeviceProfile, samples: int,
                  variant: Variant = "aggregated", seed: int = 0) -> Shipped:
    """Time and cost of bringing `samples` readings of every node to the edge."""
    return _Shipping(spec, radio, medium, device, edge_device, samples, variant, seed).run()


class _Shipping:
    """A convergecast of raw readings: each party's CPU takes a message at a time (the
    device's per-message cost) and its radio sends what it has, as in the mesh."""

    def __init__(self, spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, samples: int,
                 variant: Variant, seed: int) -> None:
        self.spec, self.radio, self.device, self.edge_device = spec, radio, device, \
            edge_device
        self.medium_name, self.variant = medium, variant
        topo = spec.topology
        self.topo = topo
        self.values_per_cell = samples * spec.model.in_channels
        self.queue = EventQueue()
        # The live cells' readings (dead ones have none), on the grid's air.
        self.cells = [cell for cell in topo.cells() if cell in topo.members]
        air = Topology(topo.rows, topo.cols, topo.edge_at, topo.pool)
        self.medium: Medium = medium_for(medium, air, radio, self.queue, seed, self._arrive)
        self.waiting = {cell: len(topo.children[cell]) for cell in self.cells}
        self.carried = {cell: 1 for cell in self.cells}  # cells' readings held, own first
        self.cpu_free: dict[Party, float] = {}
        self.cpu_s: dict[Party, float] = {}
        self.arrived_cells = 0
        # A topic as long as the mesh's own, for the MQTT overhead.
        self.topic_length = len(topic(spec.mesh_id, (0, 0), EDGE, Kind.GATHER))

    def run(self) -> Shipped:
        for cell in self.cells:
            if self.medium_name == "star" or self.variant == "unaggregated" or \
                    self.waiting[cell] == 0:
                self._after_cpu(cell, 1, self._send_own if self.variant == "unaggregated"
                                or self.medium_name == "star" else self._send_subtree)
        self.queue.run(1 << 62)
        assert self.arrived_cells == len(self.cells), "every reading reaches the edge"
        total = max(self.queue.now, *self.cpu_free.values())
        sizes = sum(f.bytes for f in self.medium.by_kind.values())
        return Shipped(self.variant, total, sizes, self.medium.frames,
                       self.medium.transmissions, self.medium.times, self.cpu_s,
                       _Parties(self.radio, self.device, self.edge_device, self.cells))

    # ------------------------------------------------------------ parties
    def _after_cpu(self, party: Party, messages: int, then: Callable[[Party, Any], None],
                   argument: Any = None) -> None:
        """Run `then(party, argument)` once the party's CPU has handled `messages`."""
        device = self.edge_device if party == EDGE else self.device
        seconds = BROKER_S * messages if party == BROKER else device.cpu_s(0, messages)
        start = max(self.queue.now, self.cpu_free.get(party, 0.0))
        self.cpu_free[party] = start + seconds
        self.cpu_s[party] = self.cpu_s.get(party, 0.0) + seconds
        self.queue.at(start + seconds, lambda _: then(party, argument))

    def _send_own(self, cell: Cell, _: Any) -> None:
        self._send(cell, 1)

    def _send_subtree(self, cell: Cell, _: Any) -> None:
        self._send(cell, self.carried[cell])

    def _send(self, src: Party, cells: int) -> None:
        """Readings of `cells` cells to the next hop, in messages within the limit."""
        per_message = (self.spec.max_message_bytes - HEADER_BYTES) // ITEM_BYTES
        values = cells * self.values_per_cell
        pieces = max(1, math.ceil(values / per_message))
        for index in range(pieces):
            share = min(per_message, values - index * per_message)
            last = index == pieces - 1
            self._forward(src, Piece(HEADER_BYTES + ITEM_BYTES * share, cells if last else 0))

    def _forward(self, src: Party, piece: Piece) -> None:
        """One message to the next hop: the tree parent, the broker, or from the broker
        the edge."""
        if src == BROKER:
            dst: Party = EDGE
        elif self.medium_name == "star":
            dst = BROKER
        else:
            dst = self.topo.parent[src]
        size = publish_bytes(self.topic_length, piece.size) if self.medium_name == "star" \
            else piece.size
        self.medium.send(Transmission(src, (dst,), Kind.GATHER, 0, size, [(dst, piece)]))

    def _arrive(self, party: Party, piece: Piece) -> None:
        if party == EDGE:
            self._after_cpu(EDGE, 1, lambda *_: None)
            self.arrived_cells += piece.cells
        elif party == BROKER or self.variant == "unaggregated":
            self._after_cpu(party, 1, self._forward, piece)  # relayed as it came
        else:
            self._after_cpu(party, 1, self._took, piece)

    def _took(self, cell: Cell, piece: Piece) -> None:
        """A piece of a child's subtree is in; after the last, the subtree goes up (one
        more message to compose)."""
        if piece.cells:
            self.carried[cell] += piece.cells
            self.waiting[cell] -= 1
            if self.waiting[cell] == 0:
                self._after_cpu(cell, 1, self._send_subtree)


def inference_slot(spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                   device: DeviceProfile, edge_device: DeviceProfile, batch: int,
                   variant: Variant = "aggregated", seed: int = 0) -> dict[str, Any]:
    """One time slot: readings to the edge, then the whole network at the edge."""
    shipped = ship_readings(spec, radio, medium, device, edge_device, batch, variant, seed)
    compute = edge_device.cpu_s(central_work(spec.model, training=False).at(batch), 0)
    return _figures(shipped, compute, edge_device)


def training_run(spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, train_samples: int,
                 steps: int, batch: int, variant: Variant = "aggregated",
                 seed: int = 0) -> dict[str, Any]:
    """The raw training set shipped once, then `steps` steps of `batch` at the edge."""
    shipped = ship_readings(spec, radio, medium, device, edge_device, train_samples, variant,
                            seed)
    parameters = _parameters(spec)
    per_step = central_work(spec.model, training=True).at(batch) + \
        optimizer_work(parameters).at(0)
    compute = edge_device.cpu_s(per_step * steps, 0)
    return _figures(shipped, compute, edge_device)


def _parameters(spec: MeshSpec) -> int:
    return sum(math.prod(shape) for shape in param_shapes(spec.model).values())


def _figures(shipped: Shipped, compute_s: float, edge_device: DeviceProfile
             ) -> dict[str, Any]:
    """sim.json's baseline record: the readings shipped, then the edge computes for
    `compute_s`; energy over the whole window (the nodes listen or sleep meanwhile)."""
    return {"variant": shipped.variant,
            "makespan_s": shipped.makespan_s + compute_s,
            "ship_s": shipped.makespan_s, "compute_s": compute_s,
            "energy_j": shipped.energy_over(shipped.makespan_s + compute_s, compute_s),
            "edge_compute_j": compute_s * (edge_device.cpu_w - edge_device.idle_w),
            "bytes": shipped.bytes, "frames": shipped.frames,
            "transmissions": shipped.transmissions}


def times(record: dict[str, Any], slots: int) -> dict[str, Any]:
    """`slots` time slots of one slot's `record` (each slot ships and computes alike):
    every figure multiplied, names of cells and the variant kept."""
    scaled = _scaled(record, slots)
    scaled["slots"] = slots
    return scaled


def _scaled(value: Any, factor: int) -> Any:
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return value * factor
