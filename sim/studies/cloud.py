"""The cloud-heavy baseline: every node's readings go to the edge, which computes all.

This is what the source paper argues in-mesh computing beats, so it runs on the same
medium, radio and device profiles as the mesh and is timed the same way (sim/radio/media.py):

- over the radio mesh, up the same BFS tree, either *aggregated* (a node waits for its
  children and sends one message per tree link carrying its subtree's readings, cut to
  the mesh's message size limit) or *unaggregated* (every node's readings are one
  message, relayed hop by hop);
- over the MQTT star, each node publishes its readings and the broker passes them to
  the edge.

Messages carry the mesh's own header (48 bytes) and its readings' width (float32; 16
bits where the mesh sends 16-bit readings, `--activations int8-static`:
`MeshSpec.reading_bytes`), so bytes compare like for like; a caller whose mesh sends a
smaller header (a compact radio header) passes its size (`header_bytes`), so that both
sides get the same care. For inference the readings are one time slot (the batch); for
training the raw training set is shipped once and every epoch then runs at the edge (the
cloud behind it computes the same), against in-mesh training, which crosses the mesh at
every step.

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
aggregated 100 x 100 slot ships, traced, in about half a second. The baseline's own
figures (`inference_slot`, `training_run`) also run the parties compiled
(`parties="compiled"`, `_Compiled`): no Python per hop, the same run to the bit, and the
unaggregated 100 x 100 slot 4 to 4.6 times faster again (2.3 s against 9.2-11 s on the
issue-34 machine, measured in one process).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from meshdl.config import param_shapes
from meshdl.protocol.messages import EDGE, HEADER_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import topic
from meshdl.protocol.topology import Cell, Topology
from meshdl.protocol.work import central_work, optimizer_work
from meshdl.sim.radio import air as kernels
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
Parties = Literal["python", "compiled"]


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
                  loss: FrameLoss | None = None, parties: Parties = "python") -> Shipped:
    """Time and cost of bringing `samples` readings of every node (of `senders` only,
    when given: live cells of the grid) to the edge, in messages of a `header_bytes`
    header. `traced`: keep the medium's trace (`Shipped.trace`). `compiled`: False runs
    the Python medium (the same figures, slower). `loss`: frames the links lose, the
    link layer and the senders recovering them as in the mesh's reliable mode.
    `parties`: where the parties' work on each message runs on the compiled medium:
    in Python (a call per hop, which a test may hook) or compiled with the medium
    (the same run to the bit, without Python per hop: `_Compiled`)."""
    return _Shipping(spec, radio, medium, device, edge_device, samples, variant, seed,
                     header_bytes, senders, [] if traced else None,
                     compiled and loss is None, loss, parties).run()


class _Shipping:
    """A convergecast of raw readings: each party's CPU takes a message at a time (the
    device's per-message cost) and its radio sends what it has, as in the mesh."""

    def __init__(self, spec: MeshSpec, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, samples: int,
                 variant: Variant, seed: int, header_bytes: int,
                 senders: frozenset[Cell] | None, trace: list[Sent] | None,
                 compiled: bool, loss: FrameLoss | None = None,
                 parties: Parties = "python") -> None:
        self.spec, self.radio, self.device, self.edge_device = spec, radio, device, \
            edge_device
        self.medium_name, self.variant = medium, variant
        self.header_bytes = header_bytes
        self.parties_run = parties
        topo = spec.topology
        self.topo = topo
        # Its readings, not the alive mask of a model that takes one: the edge knows
        # which cells' readings came (the mesh's nodes know their neighbours' too).
        self.values_per_cell = samples * spec.model.readings
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
        self.active = active = _subtree_counts(topo, self.cells, self.senders)
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
        if isinstance(self.queue, AirQueue) and self.parties_run == "compiled":
            _Compiled(self).run()
        else:
            for cell in self._starters():
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

    def _starters(self) -> list[Cell]:
        """The senders without a child to wait for, which start, in the grid's order."""
        return [cell for cell in self.cells
                if cell in self.senders and (self.relays or self.waiting[cell] == 0)]

    def _own_pieces(self, cell: Cell) -> tuple[int, list[int]]:
        """The readings a cell sends of its own (`_send_own`, `_send_subtree`) and the
        bytes of their pieces: its own when it relays, else its subtree's senders'."""
        cells = 1 if self.relays else self.active[cell]
        indexed = not self.relays and cells < self.subtree[cell]
        return cells, piece_sizes(cells, self.values_per_cell, indexed, self.header_bytes,
                                  self.spec.max_message_bytes, self.spec.reading_bytes)

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
                            self.spec.max_message_bytes, self.spec.reading_bytes)
        for size in sizes[:-1]:
            self._forward(src, Piece(size, 0))
        self._forward(src, Piece(sizes[-1], cells))  # the last piece completes them

    def _forward(self, src: Party, piece: Piece) -> None:
        """One message to the next hop."""
        self.medium.send(self._transmission(src, piece))

    def _next_hop(self, src: Party) -> Party:
        """The tree parent, the broker, or from the broker the edge."""
        if src == BROKER:
            return EDGE
        return BROKER if self.medium_name == "star" else self.topo.parent[src]

    def _transmission(self, src: Party, piece: Piece) -> Transmission:
        dst = self._next_hop(src)
        size = publish_bytes(self.topic_length, piece.size) if self.medium_name == "star" \
            else piece.size
        return Transmission(src, (dst,), Kind.GATHER, 0, size, [(dst, piece)])

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


class _Compiled:
    """A `_Shipping` on its `AirQueue`, run by the compiled convergecast
    (`kernels.gather_kernel`): the same events, with the same sequence numbers, as its
    Python parties push, so the same run to the bit, without a return to Python per
    hop (an unaggregated 100 x 100 slot is about a million). Its tables: every party
    (the live cells, the edge, the broker on the star) with its next hop, radio, CPU
    seconds a message, what an arrival makes it do, and the pieces it may send, each
    of a class of transmission the queue knows."""

    def __init__(self, shipping: _Shipping) -> None:
        self.shipping = s = shipping
        assert isinstance(s.queue, AirQueue)
        self.queue: AirQueue = s.queue
        self.parties: list[Party] = [*s.cells, EDGE] + \
            ([BROKER] if s.medium_name == "star" else [])
        # Who sends pieces of its own (a sender that relays, or a node that gathers
        # senders below), and who relays every piece of a sender below it.
        own = {cell: s._own_pieces(cell) for cell in s.cells
               if (cell in s.senders if s.relays else s.active[cell])}
        relaying = {cell for cell in s.cells if s.active[cell]} | {BROKER} \
            if s.relays else set()
        relayed = sorted({size for _, sizes in own.values() for size in sizes})
        self.party_i = np.full((len(self.parties), kernels.P_COLUMNS), -1, dtype=np.int64)
        self.party_f = np.zeros((len(self.parties), 3))
        own_sizes: list[int] = []
        classes: list[tuple[int, int]] = []
        number = {party: k for k, party in enumerate(self.parties)}
        for k, party in enumerate(self.parties):
            cells, sizes = own.get(party, (0, []))
            sends = sorted({*sizes, *relayed}) if party in relaying else sizes
            self._describe(k, party, cells, number)
            row = self.party_i[k]
            row[kernels.P_OWN_FIRST] = len(own_sizes)
            row[kernels.P_OWN_END] = len(own_sizes) + len(sizes)
            row[kernels.P_CLASS_FIRST], row[kernels.P_CLASS_END] = \
                len(classes), len(classes) + len(sends)
            own_sizes += sizes
            classes += [(size, self.queue.class_of(s._transmission(party, Piece(size, 0))))
                        for size in sends]
        starts = np.array([number[cell] for cell in s._starters()], dtype=np.int64)
        # An entry per action or piece in flight at once: at most a start each, and
        # each piece made; an event each at most, and a CCA per radio.
        n_entries = len(starts) + len(own_sizes) + 1
        self.queue.reserve(n_entries, n_entries + len(self.parties) + 2)
        entries = np.zeros((n_entries, 4), dtype=np.int64)
        entries[:, kernels.E_ACTION] = np.arange(1, n_entries + 1)  # the free chain
        entries[-1, kernels.E_ACTION] = -1
        self.state = np.zeros(4, dtype=np.int64)  # the chain starts at entry 0
        # A send makes all its pieces at once, each an event at most.
        self.room = max((len(sizes) for _, sizes in own.values()), default=1) + 1
        self.tables = (self.party_i, self.party_f, np.array(own_sizes, dtype=np.int64),
                       np.array(classes, dtype=np.int64).reshape(-1, 2), entries,
                       self.state, starts)

    def _describe(self, k: int, party: Party, cells: int, number: dict[Party, int]) -> None:
        """Party `k`'s row of the tables but its pieces: next hop, radio, what an
        arrival makes it do, readings held and expected, children to wait for, CPU."""
        s, row = self.shipping, self.party_i[k]
        row[kernels.P_NEXT] = -1 if party == EDGE else number[s._next_hop(party)]
        row[kernels.P_RADIO] = self.queue.radio_of(party)
        row[kernels.P_ARRIVAL] = kernels.COLLECT if party == EDGE else kernels.RELAY \
            if party == BROKER or s.variant == "unaggregated" else kernels.GATHER
        row[kernels.P_CARRIED] = s.carried.get(party, 0)
        row[kernels.P_WAITING] = s.waiting.get(party, 0)
        row[kernels.P_EXPECT] = cells
        self.party_f[k, kernels.F_COST] = BROKER_S if party == BROKER else \
            (s.edge_device if party == EDGE else s.device).cpu_s(0, 1)

    def run(self) -> None:
        """The convergecast to the end; the parties' CPU figures back to the shipping."""
        tables, room = self.tables, self.room
        code = self.queue.run_kernel(
            lambda i64, f64: kernels.gather_kernel(i64, f64, *tables, 2, room), 2, room)
        if code != kernels.EMPTY:
            raise RuntimeError(f"the compiled convergecast stopped early (code {code})")
        s, ranks = self.shipping, self.party_i[:, kernels.P_RANK]
        used = sorted(np.flatnonzero(ranks >= 0).tolist(), key=ranks.__getitem__)
        s.cpu_s = {self.parties[k]: float(self.party_f[k, kernels.F_USED]) for k in used}
        s.cpu_free = {self.parties[k]: float(self.party_f[k, kernels.F_FREE]) for k in used}
        s.arrived_cells = int(self.state[kernels.S_ARRIVED])


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
                            header_bytes=header_bytes, senders=senders, parties="compiled")
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
                            seed, header_bytes=header_bytes, parties="compiled")
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
