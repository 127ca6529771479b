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
like for like; a caller whose mesh sends a smaller header (a compact radio header) passes
its size (`header_bytes`), so that both sides get the same care. For inference the
readings are one time slot (the batch); for training the raw training set is shipped
once and every epoch then runs at the edge (the cloud behind it computes the same),
against in-mesh training, which crosses the mesh at every step.

A slot may ship only some cells' readings (`senders`: send-on-delta, whose cells and
byte layout are sim/studies/sendondelta.py's): aggregated, a node sends its parent one
message with the readings of the senders in its subtree (each with its index unless the
whole subtree sends), and a node with no sender in its subtree stays silent, its parent
waiting only for the children that have something to send (as a slotted schedule lets it
know; the timing is that of a node told, not of one that waits for a deadline).
Unaggregated and over the star, each sender's own message goes up; the others send none.

The medium's trace of a slot (`ship_readings(traced=True)`: one `Sent` per transmission)
and each party's seconds transmitting and receiving (`Shipped.times`) are what a caller
turns into each node's radio use under a MAC model. The convergecast runs on the
compiled medium (sim/radio/air.py: the same events, to the bit, as the Python one; about
2.5 times faster on the million hops of an unaggregated 100 x 100 slot), and an
aggregated 100 x 100 slot ships, traced, in about half a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from meshdl.config import param_shapes
from meshdl.protocol.messages import EDGE, HEADER_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import topic
from meshdl.protocol.topology import Cell, Topology
from meshdl.protocol.work import central_work, optimizer_work
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.clock import Clock, EventQueue
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.energy import energy_record
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.media import BROKER, Medium, MediumName, RadioTimes, Transmission, medium_for
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party, Sent
from meshdl.sim.studies.sendondelta import MAX_INDEXED_CELLS, piece_sizes
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
    trace: list[Sent] | None = None  # one record per transmission, when asked for

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
                  variant: Variant = "aggregated", seed: int = 0, *,
                  header_bytes: int = HEADER_BYTES, senders: frozenset[Cell] | None = None,
                  traced: bool = False, compiled: bool = True,
                  loss: FrameLoss | None = None) -> Shipped:
    """Time and cost of bringing `samples` readings of every node (of `senders` only,
    when given: live cells of the grid) to the edge, in messages of a `header_bytes`
    header. `traced`: keep the medium's trace (`Shipped.trace`). `compiled`: False runs
    the Python medium (the same figures, slower). `loss`: frames the links lose, the
    link layer and the senders recovering them as in the mesh's reliable mode."""
    return _Shipping(spec, radio, medium, device, edge_device, samples, variant, seed,
                     header_bytes, senders, [] if traced else None,
                     compiled and loss is None, loss).run()


class _Shipping:
    """A convergecast of raw readings: each party's CPU takes a message at a time (the
    device's per-message cost) and its radio sends what it has, as in the mesh."""

    def __init__(self, spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, samples: int,
                 variant: Variant, seed: int, header_bytes: int,
                 senders: frozenset[Cell] | None, trace: list[Sent] | None,
                 compiled: bool, loss: FrameLoss | None = None) -> None:
        self.spec, self.radio, self.device, self.edge_device = spec, radio, device, \
            edge_device
        self.medium_name, self.variant = medium, variant
        self.header_bytes = header_bytes
        topo = spec.topology
        self.topo = topo
        self.values_per_cell = samples * spec.model.in_channels
        # Refuses at once a header that leaves no room for a value.
        piece_sizes(0, 0, False, header_bytes, spec.max_message_bytes)
        self.queue: Clock = AirQueue() if compiled else EventQueue()
        # The live cells' readings (dead ones have none), on the grid's air.
        self.cells = [cell for cell in topo.cells() if cell in topo.members]
        self.senders = _senders(topo, self.cells, senders)
        air = Topology(topo.rows, topo.cols, topo.edge_at, topo.pool)
        self.medium: Medium = medium_for(medium, air, radio, self.queue, seed, self._arrive,
                                         trace, loss)
        # Each node relays its children's messages as they come (unaggregated, the
        # star), or waits for those of its children that have readings to send and
        # then sends its subtree's (aggregated).
        self.relays = medium == "star" or variant == "unaggregated"
        if senders is not None and not self.relays and \
                topo.rows * topo.cols > MAX_INDEXED_CELLS:
            raise ValueError(f"a {topo.rows} x {topo.cols} grid has more cells than a "
                             f"{MAX_INDEXED_CELLS.bit_length() - 1}-bit index names")
        self.subtree = _subtree_counts(topo, self.cells, set(self.cells))
        active = _subtree_counts(topo, self.cells, self.senders)
        self.waiting = {cell: sum(1 for child in topo.children[cell] if active.get(child))
                        for cell in self.cells}
        # Cells' readings held, own first.
        self.carried = {cell: int(cell in self.senders) for cell in self.cells}
        self.cpu_free: dict[Party, float] = {}
        self.cpu_s: dict[Party, float] = {}
        self.arrived_cells = 0
        # A topic as long as the mesh's own, for the MQTT overhead.
        self.topic_length = len(topic(spec.mesh_id, (0, 0), EDGE, Kind.GATHER))

    def run(self) -> Shipped:
        for cell in self.cells:  # the senders without a child to wait for start
            if cell in self.senders and (self.relays or self.waiting[cell] == 0):
                self._after_cpu(cell, 1, self._send_own if self.relays
                                else self._send_subtree)
        self.queue.run(1 << 62)
        assert self.arrived_cells == len(self.senders), "every reading reaches the edge"
        total = max([self.queue.now, *self.cpu_free.values()])
        times = self.medium.times  # settles the compiled medium: its trace is in
        sizes = sum(f.bytes for f in self.medium.by_kind.values())
        return Shipped(self.variant, total, sizes, self.medium.frames,
                       self.medium.transmissions, times, self.cpu_s,
                       _Parties(self.radio, self.device, self.edge_device, self.cells),
                       self.medium.trace)

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
        self._send(cell, 1, indexed=False)

    def _send_subtree(self, cell: Cell, _: Any) -> None:
        carried = self.carried[cell]  # indexed unless the whole subtree sends
        self._send(cell, carried, indexed=carried < self.subtree[cell])

    def _send(self, src: Party, cells: int, indexed: bool) -> None:
        """Readings of `cells` cells to the next hop, in messages within the limit."""
        sizes = piece_sizes(cells, self.values_per_cell, indexed, self.header_bytes,
                            self.spec.max_message_bytes)
        for size in sizes[:-1]:
            self._forward(src, Piece(size, 0))
        self._forward(src, Piece(sizes[-1], cells))  # the last piece completes them

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


def _senders(topo: Topology, cells: list[Cell], senders: frozenset[Cell] | None
             ) -> frozenset[Cell]:
    """The live cells that send: all, or those named (a dead cell reads nothing)."""
    if senders is None:
        return frozenset(cells)
    outside = [cell for cell in senders if not topo.inside(cell)]
    if outside:
        raise ValueError(f"senders outside the {topo.rows} x {topo.cols} grid: "
                         f"{sorted(outside)}")
    return senders & frozenset(cells)


def _subtree_counts(topo: Topology, cells: list[Cell], counted: set[Cell] | frozenset[Cell]
                    ) -> dict[Cell, int]:
    """For each live cell, how many cells of its BFS subtree are `counted`."""
    counts: dict[Cell, int] = {}
    for cell in sorted(cells, key=topo.depth.__getitem__, reverse=True):  # leaves first
        counts[cell] = int(cell in counted) + sum(counts.get(child, 0)
                                                  for child in topo.children[cell])
    return counts


def inference_slot(spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                   device: DeviceProfile, edge_device: DeviceProfile, batch: int,
                   variant: Variant = "aggregated", seed: int = 0, *,
                   header_bytes: int = HEADER_BYTES,
                   senders: frozenset[Cell] | None = None) -> dict[str, Any]:
    """One time slot: readings (of `senders`, when given) to the edge, then the whole
    network at the edge, on the values it holds."""
    shipped = ship_readings(spec, radio, medium, device, edge_device, batch, variant, seed,
                            header_bytes=header_bytes, senders=senders)
    return slot_record(shipped, spec, edge_device, batch)


def slot_record(shipped: Shipped, spec: MeshSpec, edge_device: DeviceProfile, batch: int
                ) -> dict[str, Any]:
    """sim.json's record of one inference slot already shipped (say, with its trace):
    the shipping, then the whole network of `batch` samples at the edge."""
    compute = edge_device.cpu_s(central_work(spec.model, training=False).at(batch), 0)
    return _figures(shipped, compute, edge_device)


def training_run(spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, train_samples: int,
                 steps: int, batch: int, variant: Variant = "aggregated",
                 seed: int = 0, *, header_bytes: int = HEADER_BYTES) -> dict[str, Any]:
    """The raw training set shipped once, then `steps` steps of `batch` at the edge."""
    shipped = ship_readings(spec, radio, medium, device, edge_device, train_samples, variant,
                            seed, header_bytes=header_bytes)
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
