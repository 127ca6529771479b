"""`meshdl simulate live`: slot after slot of live inference with the real time between
them, and how long the nodes' batteries last, in the mesh and in the cloud.

The mesh runs live inference as a deployment would: the edge's first wave brings the
parameters (PARAMS and BATCH, flooded down the tree: the *install*), every node caches
them, and every later slot's wave starts at the slot boundary by each node's own clock
(`NodeMachine.begin_slot`), with nothing from the edge on the air. The nodes' readings
are a data set's maps replayed in time order, one per slot. On a radio mesh messages
carry the compact header (meshdl/protocol/compact.py). Each slot is a wave of the very
node and edge machines under simulated time (sim/timed.py), its transmissions counted
per node and priced under a MAC (sim/radio/mac.py) over the whole slot; batteries
(sim/radio/battery.py) turn each node's average power into years.

Clocks. Each node's crystal is off by a fixed drift drawn in +-`drift_ppm`; we assume
every slot's wave resynchronises it (its frames carry the time, as TSCH's do; not
priced), so at the next boundary it is off by drift times the slot length (under TSCH,
whose keep-alives hold every clock within the guard time, by at most the guard; under
the scheduled MAC, whose sync flood at the boundary sets every clock within a
microsecond, Glossy's figure, not at all: it is priced, sim/radio/mac.py). A node
that starts early sends its halos to neighbours that have not started yet: they keep
them until their own clock gets there.

Repetition, and what it allows. Without `--delta` and without loss, a scheduled slot
sends exactly the same messages (kinds, sizes, senders, receivers) whatever the readings:
the plan fixes them, and with them every party's frames, seconds on air (a frame's
airtime is its size's) and computing (the same kernels on the same shapes). So slot 1,
timed event by event, is priced once and its price stands for every live slot
(`run_mesh`); the slots up to `timed_slots` are timed too, each checked to be priced
alike (`same_price`: the same counts, the same seconds to the rounding of running
totals, or the run stops), and their waves' lengths, which differ with the backoffs, are
the makespan's figures. The values of the slots not timed are computed by the same node
machines on the in-process transport, one wave for up to LIVE_SLOTS slots of the ring at
once (a wave's samples never mix: tests/test_scheduled_slots.py), which is what makes a
year of slots take a minute. With `--delta` or loss every slot is timed and priced as it
went.

The cloud-heavy baseline ships each slot's readings up the same tree (aggregated), with
the same compact header, MAC, device, battery and value precision; under `--delta` its
nodes send on delta (sim/studies/sendondelta.py), the edge computing on the last values
it got. Both sides report what suppression costs in alerts.
"""

from __future__ import annotations

import functools
import gc
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np

from meshdl.errors import MeshdlError, UsageError
from meshdl.model.cnn import CNN
from meshdl.protocol.accounting import class_name
from meshdl.protocol.activations import STATIC
from meshdl.protocol.messages import Kind
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.protocol.topics import name_of
from meshdl.protocol.topology import Cell
from meshdl.report.numbers import figure, given, places
from meshdl.sim.mesh import VirtualMesh, cyclic_gc_paused
from meshdl.sim.radio.battery import Battery, battery, lifetime_years
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.mac import (
    MacEnergy,
    MacName,
    MacParams,
    RadioUse,
    mac_energy,
    radio_use,
    unsupported_reason,
)
from meshdl.sim.radio.media import MediumName
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party
from meshdl.sim.studies.cloud import Shipped, ship_readings
from meshdl.sim.studies.sendondelta import send_on_delta, senders_of
from meshdl.sim.timed import TimedMesh

T = TypeVar("T")

# Slots are numbered by the clock, as live nodes number them (Unix time // slot length,
# meshdl/nodes/live.py): a run's first slot is the one that begins at this instant.
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
# A 32.768 kHz tuning-fork crystal's frequency tolerance at 25 C (e.g. Abracon ABS07,
# Epson FC-135: +-20 ppm), the clock of a mote's sleep timer.
DRIFT_PPM = 20.0


IDLE = RadioUse(0.0, 0.0, 0, 0, 0, 0, 0)  # a party that neither sent nor took anything
# The MACs sim.json's `macs` prices on every run whose radio has them; `--mac`'s own is
# priced too when it is another (scheduled), so that record keeps its keys otherwise.
PRICED_MACS: tuple[MacName, ...] = ("always-on", "ideal", "lpl", "tsch")


@dataclass(frozen=True)
class LiveSettings:
    """What a live run simulates (the CLI's flags)."""

    slots: int = 48
    slot_s: float = 1800.0
    mac: MacName = "lpl"
    battery: Battery | None = None  # None: sim/radio/battery.py's default
    delta: float | None = None  # delta halos in the mesh, send-on-delta in the cloud
    timed_slots: int = 2  # slots timed event by event when slots repeat (see above)
    drift_ppm: float = DRIFT_PPM
    seed: int = 0
    loss: FrameLoss | None = None
    mac_params: MacParams = field(default_factory=MacParams)


def with_links(use: dict[Party, RadioUse], links: Mapping[Party, int]
               ) -> dict[Party, RadioUse]:
    """Each party's radio use with the links its MAC keeps up (a scheduled MAC's
    connections): those of the plan, whether or not a slot used them all (a party
    that sent and took nothing still keeps its links up)."""
    every = {**dict.fromkeys(links, IDLE), **use}
    return {party: u._replace(links=links.get(party, u.links)) for party, u in every.items()}


def with_sync_hops(use: dict[Party, RadioUse], hops: Mapping[Party, int]
                   ) -> dict[Party, RadioUse]:
    """Each party's radio use with its hops from the edge, where the scheduled MAC's
    sync flood starts (every party of `hops` gets an entry)."""
    every = {**dict.fromkeys(hops, IDLE), **use}
    return {party: u._replace(sync_hops=hops.get(party, u.sync_hops))
            for party, u in every.items()}


def live_cells(spec: MeshSpec) -> list[Cell]:
    """The cells of a live run's nodes, in the topology's order."""
    return [cell for cell in spec.topology.cells() if cell in spec.topology.members]


def flood_hops(spec: MeshSpec) -> dict[Party, int]:
    """Hops from the edge to each live cell: the tree is the grid's BFS from the edge,
    so its depths are the sync flood's hop distances."""
    topo = spec.topology
    return {cell: topo.depth[cell] for cell in topo.cells() if cell in topo.members}


def plan_links(pairs: Iterable[tuple[Party, Party]]) -> dict[Party, int]:
    """How many radio links each party has, of `pairs` (each link once)."""
    count: dict[Party, int] = {}
    for a, b in pairs:
        count[a] = count.get(a, 0) + 1
        count[b] = count.get(b, 0) + 1
    return count


class SlotCost(NamedTuple):
    """What one slot cost: bytes and frames on air (by message class too), each party's
    radio use and seconds of computing, and how long its wave took."""

    bytes: int
    frames: int
    by_class: dict[str, int]
    use: dict[Party, RadioUse]
    cpu_s: dict[Party, float]
    makespan_s: float


class TimedSlot(NamedTuple):
    """A slot run on the event clock: what it cost, and the edge's logits."""

    cost: SlotCost
    logits: np.ndarray


class CloudRun(NamedTuple):
    """The cloud-heavy baseline over a run's slots: its side, and its alert labels."""

    side: Side
    labels: list[int]


@dataclass
class Side:
    """One side of the comparison (the mesh, or the cloud): its slots' costs and alerts.
    `repeats[i]` says how many slots cost what `costs[i]` did."""

    costs: list[SlotCost] = field(default_factory=list)
    repeats: list[float] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    install: SlotCost | None = None  # the mesh's first slot, which brings the parameters
    # Where one slot's price stands for the others (`run_mesh`): the timed slots' waves,
    # each its length and the slots it stands for, and how many were timed. None: each
    # cost's own.
    timings: list[tuple[float, float]] | None = None
    timed: int | None = None

    def add(self, cost: SlotCost, repeat: float = 1.0) -> None:
        self.costs.append(cost)
        self.repeats.append(repeat)

    def makespans(self) -> list[tuple[float, float]]:
        """Each timed wave's length in seconds, and how many slots it stands for."""
        if self.timings is not None:
            return self.timings
        return [(c.makespan_s, n) for c, n in zip(self.costs, self.repeats, strict=True)]

    @property
    def slots(self) -> float:
        return sum(self.repeats)

    def mean(self, figure: Callable[[SlotCost], float]) -> float:
        return sum(figure(c) * n for c, n in zip(self.costs, self.repeats, strict=True)) / \
            max(self.slots, 1)


class NodeSlot(NamedTuple):
    """One node over one slot: its joules (radio under the MAC, processor computing then
    idle) and its seconds on air under the MAC (strobes, long preambles, beacons too:
    what a duty-cycle rule, LoRa's in EU868, limits)."""

    joules: float
    on_air_s: float


# What `mac_energy` gave for a MAC and a party's radio use, within one run (its radio,
# slot length and MAC settings fixed): most nodes do the same in every slot, and many
# do what others do (a grid's inner nodes), so a run prices each distinct use once.
Memo = dict[tuple[MacName, RadioUse], MacEnergy]


def radio_joules(mac: MacName, radio: RadioProfile, use: RadioUse, slot_s: float,
                 params: MacParams, memo: Memo | None = None) -> MacEnergy:
    """`mac_energy` of one party's slot, looked up in `memo` first (the same floats:
    a pure function of its arguments, of which only `mac` and `use` vary in a run)."""
    if memo is None:
        return mac_energy(mac, radio, use, slot_s, params)
    key = (mac, use)
    priced = memo.get(key)
    if priced is None:
        priced = memo[key] = mac_energy(mac, radio, use, slot_s, params)
    return priced


def node_slot(cost: SlotCost, party: Party, mac: MacName, radio: RadioProfile,
              device: DeviceProfile, slot_s: float, params: MacParams,
              memo: Memo | None = None) -> NodeSlot:
    """What one node's slot of `cost` takes under `mac` (priced once for both): under
    the scheduled MAC its processor sleeps (`sleep_w`) when it does not compute."""
    cpu = cost.cpu_s.get(party, 0.0)
    radio_j = radio_joules(mac, radio, cost.use.get(party, IDLE), slot_s, params, memo)
    return NodeSlot(radio_j.total_j + processor_j(device, mac, cpu, slot_s),
                    radio_j.tx_j / radio.tx_w)


def processor_j(device: DeviceProfile, mac: MacName, cpu_s: float, slot_s: float) -> float:
    """A node's processor over a slot: computing `cpu_s`, idle the rest, or asleep (its
    `sleep_w`) under the scheduled MAC."""
    rest_w = device.deep_sleep_w if mac == "scheduled" else device.idle_w
    return cpu_s * device.cpu_w + max(slot_s - cpu_s, 0.0) * rest_w


def _per_node(side: Side, cells: list[Cell], mac: MacName, radio: RadioProfile,
              device: DeviceProfile, settings: LiveSettings, memo: Memo | None = None
              ) -> tuple[dict[Cell, float], dict[Cell, float]]:
    """Each node's joules and seconds on air a slot (the mesh's install apart)."""
    share = max(side.slots, 1)
    per_node: dict[Cell, float] = {}
    on_air: dict[Cell, float] = {}
    for cell in cells:
        slots = [(node_slot(c, cell, mac, radio, device, settings.slot_s,
                            settings.mac_params, memo), n)
                 for c, n in zip(side.costs, side.repeats, strict=True)]
        per_node[cell] = sum(s.joules * n for s, n in slots) / share
        on_air[cell] = sum(s.on_air_s * n for s, n in slots) / share
    return per_node, on_air


# The parts of a node's joules a slot, as the report draws them (issue 47 item 1): what
# the MAC spends of itself whatever the traffic (its checks, strobes, beacons, idle
# listening), the traffic's own frames and ACKs, the radio asleep, the processor.
PARTS = ("MAC floor", "sleep", "traffic", "processor")


def node_parts(side: Side, cell: Cell, mac: MacName, radio: RadioProfile,
               device: DeviceProfile, settings: LiveSettings, memo: Memo | None = None
               ) -> dict[str, float]:
    """One node's joules a slot split into PARTS (they add up to its joules a slot).
    The MAC floor is mac_energy's overhead (beyond the traffic's frames and ACKs); the
    processor is its computing and its idle (or, scheduled, sleeping) time."""
    slot_s, total = settings.slot_s, {part: 0.0 for part in PARTS}
    for cost, n in zip(side.costs, side.repeats, strict=True):
        radio_j = radio_joules(mac, radio, cost.use.get(cell, IDLE), slot_s,
                               settings.mac_params, memo)
        cpu = cost.cpu_s.get(cell, 0.0)
        for part, joules in zip(PARTS, (
                radio_j.overhead_j, radio_j.sleep_j,
                radio_j.total_j - radio_j.sleep_j - radio_j.overhead_j,
                processor_j(device, mac, cpu, slot_s)), strict=True):
            total[part] += joules * n
    return {part: joules / max(side.slots, 1) for part, joules in total.items()}


def node_figures(side: Side, cells: list[Cell], mac: MacName, radio: RadioProfile,
                 device: DeviceProfile, settings: LiveSettings, battery: Battery,
                 memo: Memo | None = None) -> dict[str, Any]:
    """sim.json's map of one side under the run's MAC: each node's joules a slot and
    lifetime on `battery`, and the hottest node's joules by part (the report's
    pictures)."""
    per_node, _ = _per_node(side, cells, mac, radio, device, settings, memo)
    hottest = max(per_node, key=per_node.__getitem__)
    return {"j_per_slot": {name_of(c): j for c, j in per_node.items()},
            "years": {name_of(c): lifetime_years(battery, j / settings.slot_s)
                      for c, j in per_node.items()},
            "hottest_parts_j_per_slot": node_parts(side, hottest, mac, radio, device,
                                                   settings, memo)}


def side_summary(side: Side, cells: list[Cell], mac: MacName, radio: RadioProfile,
                 device: DeviceProfile, settings: LiveSettings, battery: Battery,
                 memo: Memo | None = None) -> dict[str, Any]:
    """sim.json's figures of one side: per slot (the mesh's install apart), and each
    node's lifetime on `battery` at its mean power."""
    slot_s = settings.slot_s
    per_node, on_air = _per_node(side, cells, mac, radio, device, settings, memo)
    years = {cell: lifetime_years(battery, joules / slot_s) for cell, joules in per_node.items()}
    busiest = max(on_air, key=on_air.__getitem__)
    hottest = max(per_node, key=per_node.__getitem__)
    first = min(years, key=years.__getitem__)
    spans = side.makespans()
    longest = max((m for m, _ in spans), default=0.0)
    by_class: dict[str, float] = {}
    for cost, n in zip(side.costs, side.repeats, strict=True):
        for name, size in cost.by_class.items():
            by_class[name] = by_class.get(name, 0.0) + size * n / max(side.slots, 1)
    return {
        "bytes_per_slot": round(side.mean(lambda c: c.bytes), 3),
        "frames_per_slot": round(side.mean(lambda c: c.frames), 3),
        "bytes_per_slot_by_class": dict(sorted(by_class.items())),
        "hottest_node_j_per_slot": per_node[hottest],
        "hottest_cell": name_of(hottest),
        "mean_node_j_per_slot": float(np.mean(list(per_node.values()))),
        "first_death_years": years[first],
        "median_years": float(np.median(list(years.values()))),
        "first_cell": name_of(first),
        "max_tx_share": on_air[busiest] / slot_s,
        "max_tx_share_cell": name_of(busiest),
        "within_duty_cycle": on_air[busiest] <= radio.duty_cycle * slot_s,
        "makespan_s": {"mean": sum(m * n for m, n in spans) / max(side.slots, 1),
                       "max": longest},
        # A slot's wave must be over before the next slot begins.
        "fits_slot": longest <= slot_s,
    }


def labels_of(logits: np.ndarray, threshold: float = 0.5) -> list[int]:
    """Alert labels as `edge serve` gives them: softmax probability of class 1 at least
    `threshold` (edge/serve.py)."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return [int(p >= threshold) for p in z[:, 1] / z.sum(axis=1)]


@contextmanager
def kept_out_of_the_collector() -> Iterator[None]:
    """The cyclic collector paused while a mesh is built (`cyclic_gc_paused`), and
    what was made then frozen (`gc.freeze`): a 100 x 100 mesh's millions of long-lived
    objects, which every collection after would traverse again (at 100 x 100, 7 s of a
    run's 60, measured). Whoever freezes thaws (`thawed_on_return`): `simulate` as it
    returns, `LiveMesh.release_timed` as it lets its timed mesh go (only the cyclic
    collector frees that)."""
    with cyclic_gc_paused():
        yield
        gc.freeze()


def thawed_on_return(function: Callable[..., T]) -> Callable[..., T]:
    """`function`, giving what `kept_out_of_the_collector` froze back to the cyclic
    collector as it returns or raises."""
    @functools.wraps(function)
    def thawed(*args: Any, **kwargs: Any) -> T:
        try:
            return function(*args, **kwargs)
        finally:
            gc.unfreeze()
    return thawed


class LiveMesh:
    """The mesh side of a live run: a timed mesh whose nodes sample a series of maps,
    and, for slots that repeat, the same machines in process for their values."""

    def __init__(self, spec: MeshSpec, model: CNN, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile,
                 settings: LiveSettings) -> None:
        self.spec, self.model, self.settings = spec, model, settings
        self.radio = radio
        empty = np.full((LIVE_SLOTS, spec.model.in_channels, spec.model.rows, spec.model.cols),
                        np.nan, np.float32)
        self._timed: TimedMesh | None = TimedMesh(
            spec, {Split.LIVE: empty}, model, {}, radio, medium, device, edge_device,
            settings.seed, trace=True, loss=settings.loss)
        self.cells = live_cells(spec)
        rng = np.random.default_rng(settings.seed)
        drift = rng.uniform(-settings.drift_ppm, settings.drift_ppm, len(self.cells)) * 1e-6
        self.drift = dict(zip(self.cells, drift.tolist(), strict=True))
        self.first_slot = int(EPOCH.timestamp() // settings.slot_s)
        # The links of the plan: neighbours that exchange halos, tree parent and children.
        self.links = plan_links(link for link in spec.links)
        self.hops = flood_hops(spec)
        self._virtual: VirtualMesh | None = None

    @property
    def timed(self) -> TimedMesh:
        """The mesh under simulated time (until `release_timed`)."""
        if self._timed is None:
            raise MeshdlError("the timed mesh of this live run was released")
        return self._timed

    def release_timed(self) -> None:
        """Let the timed mesh go once its slots are run: its machines, queue and medium
        are as large as the in-process mesh's that computes the slots left (at 100 x 100,
        most of the memory of a run). Its objects go back to the cyclic collector, the
        only one that can free them (`kept_out_of_the_collector`)."""
        self._timed = None
        gc.unfreeze()

    # ------------------------------------------------------------------ slots
    def clock_errors(self) -> dict[Cell, float]:
        """How far each node's clock is off at a slot boundary (see the module's
        docstring)."""
        settings = self.settings
        errors = {cell: d * settings.slot_s for cell, d in self.drift.items()}
        if settings.mac == "tsch":
            guard = settings.mac_params.tsch_guard_s
            errors = {cell: max(-guard, min(guard, e)) for cell, e in errors.items()}
        elif settings.mac == "scheduled":
            errors = dict.fromkeys(errors, 0.0)
        return errors

    def sample(self, nodes: Mapping[Cell, Any], reading: np.ndarray, slot: int) -> None:
        """Every node reads its sensor at the boundary of `slot` (a run's slot index):
        `reading` is that slot's map, ([channels,] rows, cols). A model that takes the
        alive mask reads each reading beside a 1: its node is alive, it read it (as a
        live sensor's node records it, nodes/live.py `as_recorded`)."""
        at = (self.first_slot + slot) % LIVE_SLOTS
        values = reading.reshape(-1, *reading.shape[-2:])
        model = self.spec.model
        if model.alive and len(values) == model.readings:
            values = np.concatenate([values, np.ones_like(values[:1])])
        for (r, c), node in nodes.items():
            node.record(Split.LIVE, at, values[:, r, c])

    def timed_slot(self, series: np.ndarray, slot: int) -> TimedSlot:
        """Run slot `slot` on the event clock: the install (slot 0) or a scheduled one."""
        timed = self.timed
        self.sample(timed.nodes, series[slot], slot)
        trace_from = len(timed.trace)
        tally = timed.medium.account(Mode.INFER)
        tx, rx = dict(tally.times.tx), dict(tally.times.rx)
        kinds = tally.by_kind
        cpu = {party: c.seconds for party, c in timed.cpus.items()}
        start = timed.queue.now
        if slot == 0:
            # Numbered as the slot, as every live wave (a scheduled slot's step must be
            # later than the install's, and near it: compact headers widen 16 bits).
            ring = np.array([self.first_slot % LIVE_SLOTS])
            result = timed.run_wave(Mode.INFER, Split.LIVE, ring, step=self.first_slot)
        else:
            result = timed.run_slot(self.first_slot + slot, self.clock_errors())
        # The next slot begins slot_s after this one (the radio idles between), or when
        # this one's wave is over, if it overran its slot (`fits_slot` says so).
        timed.queue.advance_to(max(start + self.settings.slot_s, timed.queue.now))
        after = timed.medium.account(Mode.INFER)
        sent = timed.trace[trace_from:]
        del timed.trace[:]  # a year of traces would not fit: each slot's is used here
        if timed.receipts is not None:  # kept with the trace; nothing here reads them
            del timed.receipts[:]
        tx_slot = _grown(after.times.tx, tx)
        rx_slot = _grown(after.times.rx, rx)
        by_class: dict[str, int] = {}
        frames = 0
        for (kind, layer), figures in after.by_kind.items():
            old = kinds.get((kind, layer))
            size = figures.bytes - (old.bytes if old else 0)
            frames += figures.frames - (old.frames if old else 0)
            if size:
                name = class_name(Kind(kind), layer)
                by_class[name] = by_class.get(name, 0) + size
        use = with_sync_hops(with_links(radio_use(sent, self.radio, tx_slot, rx_slot),
                                        self.links), self.hops)
        cost = SlotCost(sum(by_class.values()), frames, by_class, use,
                        _grown({p: c.seconds for p, c in timed.cpus.items()}, cpu),
                        timed.waves[-1].end - timed.waves[-1].start)
        return TimedSlot(cost, result.logits)

    def in_one_wave(self, slots: range) -> bool:
        """Do `slots` fit one wave (as many slots of the ring as a wave may carry)?"""
        return len(slots) <= self._chunk()

    def _chunk(self) -> int:
        return max(1, min(LIVE_SLOTS, self.spec.max_batch))

    def logits_in_process(self, series: np.ndarray, slots: range) -> np.ndarray:
        """Logits of `slots` computed by the same node machines, as many slots of the
        ring per wave as one wave may carry (their samples never mix): on the timed
        mesh while it is kept (its waves' figures are no slot's: they are not read), else
        on the in-process transport's mesh, built once (compiled dispatch: the same
        bits). One wave on the mesh built costs less than building another; many cost
        more."""
        if self._timed is not None:
            mesh: TimedMesh | VirtualMesh = self._timed
        else:
            if self._virtual is None:
                empty = np.full((LIVE_SLOTS, self.spec.model.in_channels,
                                 self.spec.model.rows, self.spec.model.cols), np.nan,
                                np.float32)
                self._virtual = VirtualMesh(self.spec, {Split.LIVE: empty}, self.model, {},
                                            compiled=True)
            mesh = self._virtual
        chunk = self._chunk()
        out = []
        for first in range(slots.start, slots.stop, chunk):
            block = range(first, min(first + chunk, slots.stop))
            for slot in block:
                self.sample(mesh.nodes, series[slot], slot)
            ring = np.array([(self.first_slot + s) % LIVE_SLOTS for s in block])
            out.append(mesh.run_wave(Mode.INFER, Split.LIVE, ring).logits)
            if self._timed is not None:  # not read: a year of them would not fit
                del self._timed.trace[:]
                if self._timed.receipts is not None:
                    del self._timed.receipts[:]
        return np.concatenate(out) if out else np.zeros((0, self.spec.model.classes))


def _grown(after: Mapping[Party, float], before: Mapping[Party, float]) -> dict[Party, float]:
    """What each party's figure grew by."""
    return {p: v - before.get(p, 0.0) for p, v in after.items() if v - before.get(p, 0.0)}


def same_traffic(a: SlotCost, b: SlotCost) -> bool:
    """Did two slots send the same (bytes and frames per class, every party's counts)?"""
    return a.bytes == b.bytes and a.frames == b.frames and a.by_class == b.by_class and \
        {p: u[2:] for p, u in a.use.items()} == {p: u[2:] for p, u in b.use.items()}


# Two slots of the same traffic differ in their seconds on air and computing by the
# rounding of the running totals they are read from (a slot's is the total after it less
# the total before: 1e-17 s at most, measured), never by more than this share.
SAME_SECONDS = 1e-9


def same_price(a: SlotCost, b: SlotCost) -> bool:
    """Would two slots be priced alike: the same traffic (`same_traffic`), and every
    party on air (sending, receiving) and computing for the same seconds, to rounding?"""
    def close(x: float, y: float) -> bool:
        return math.isclose(x, y, rel_tol=SAME_SECONDS, abs_tol=1e-15)

    return same_traffic(a, b) and all(
        close(u.tx_s, b.use[p].tx_s) and close(u.rx_s, b.use[p].rx_s)
        for p, u in a.use.items()) and all(
        close(a.cpu_s.get(p, 0.0), b.cpu_s.get(p, 0.0)) for p in {*a.cpu_s, *b.cpu_s})


def run_mesh(live: LiveMesh, series: np.ndarray, say: Callable[[int], None]) -> Side:
    """Every slot of the mesh side.

    With `--delta` or loss every slot is timed and priced as it went. Else a live slot
    sends the same messages as every other (the plan fixes them), so it costs what slot 1
    costs: the same frames of the same sizes between the same parties (so the same
    seconds on air: a frame's airtime is its size's), the same kernels at every node (so
    the same seconds computing). Only its wave's length differs, with its backoffs. So
    slot 1's price (`SlotCost` but its makespan) is reused for every live slot; the
    slots up to `timed_slots` are timed anyway, each checked to be priced alike
    (`same_price`, or the run stops), and their waves' lengths are the makespan's figures.
    The values (the alerts) of the slots not timed are computed in process."""
    settings = live.settings
    side = Side()
    repeat = settings.delta is None and settings.loss is None
    timed = settings.slots if not repeat else min(settings.slots, max(settings.timed_slots, 2))
    logits = []
    spans: list[float] = []
    with cyclic_gc_paused():
        for slot in range(timed):
            cost, slot_logits = live.timed_slot(series, slot)
            logits.append(slot_logits)
            if slot == 0:
                side.install = cost
            elif not repeat:
                side.add(cost)
            elif not side.costs:
                side.add(cost, settings.slots - 1)  # slot 1's price, for every live slot
                spans.append(cost.makespan_s)
            elif same_price(cost, side.costs[0]):
                spans.append(cost.makespan_s)
            else:
                raise MeshdlError(f"slot {slot} was priced other than slot 1 (other "
                                  "messages, or other seconds on air or computing): slots "
                                  "do not repeat, and slot 1's price cannot stand for them")
            say(slot + 1)
    if repeat:
        side.timings = [(m, (settings.slots - 1) / len(spans)) for m in spans]
        side.timed = len(spans)
    rest = range(timed, settings.slots)
    if not live.in_one_wave(rest):
        # The slots left run on machines of their own: the timed mesh's go first (its
        # parties refer to each other, so only the cyclic collector frees them).
        live.release_timed()
        gc.collect()
    with cyclic_gc_paused():
        for first in range(rest.start, rest.stop, 1024):
            block = range(first, min(first + 1024, rest.stop))
            logits.append(live.logits_in_process(series, block))
            say(block.stop)
    side.labels = labels_of(np.concatenate(logits))
    return side


def readings_series(maps: np.ndarray, slots: int) -> tuple[np.ndarray, dict[str, Any]]:
    """A reading per slot: a data set's test maps (`maps`) in time order, from the start
    again when the run is longer."""
    if not len(maps):
        raise UsageError("the data set has no test maps to replay")
    index = np.arange(slots) % len(maps)
    return np.ascontiguousarray(maps[index], np.float32), {
        "split": "test", "maps": len(maps), "wrapped": slots > len(maps)}


def slot_stamp(first_slot: int, slot_s: float) -> str:
    return datetime.fromtimestamp(first_slot * slot_s, timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def check_settings(settings: LiveSettings, radio: RadioProfile | None = None) -> None:
    if settings.slots < 2:
        raise UsageError("--slots must be at least 2: the first brings the parameters, "
                         "the others are live slots")
    if not math.isfinite(settings.slot_s) or settings.slot_s <= 0:
        raise UsageError("--slot-seconds must be positive")
    if settings.delta is not None and (not math.isfinite(settings.delta) or
                                       settings.delta < 0):
        raise UsageError("--delta must be at least 0")
    why = None if radio is None else unsupported_reason(settings.mac, radio,
                                                        settings.mac_params)
    if why is not None:
        raise UsageError(f"--mac {settings.mac}: {why}")


def natural_mac(radio: RadioProfile, params: MacParams) -> MacName:
    """The MAC a live run's radio runs by default. One wave a slot at a time every party
    knows: wake for it and sleep in between (`scheduled`, as TAG's epochs and the
    Low-power Wireless Bus do, the sync flood a service of the MAC, priced by it) where
    the radio has a deep sleep; else low-power listening, else TSCH, else none (always
    on: Wi-Fi's power save is not modelled)."""
    for mac in ("scheduled", "lpl", "tsch"):
        if unsupported_reason(mac, radio, params) is None:
            return mac
    return "always-on"


def settings_for(slots: int, slot_s: float, mac: MacName | None, battery_name: str,
                 delta: float | None, timed_slots: int, seed: int,
                 sim: Mapping[str, Any], radio: RadioProfile,
                 mac_params: MacParams | None = None) -> LiveSettings:
    """The settings of the CLI's flags (`sim`: `meshdl simulate`'s radio and fault
    flags; `radio` chooses the default MAC), checked before anything is written."""
    params = mac_params or MacParams()
    mac = mac or natural_mac(radio, params)
    settings = LiveSettings(slots=slots, slot_s=slot_s, mac=mac, battery=battery(battery_name),
                            delta=delta, timed_slots=timed_slots, seed=seed,
                            loss=FrameLoss(sim["loss"], sim["burst"], sim["fault_seed"])
                            if sim["loss"] else None, mac_params=params)
    check_settings(settings, radio)
    return settings


def cloud_cost(shipped: Shipped, radio: RadioProfile, cells: list[Cell],
               links: Mapping[Party, int], hops: Mapping[Party, int] | None = None
               ) -> SlotCost:
    """What one slot of the baseline cost (its readings shipped, with their trace);
    `hops`: each cell's from the edge, for the scheduled MAC's sync flood."""
    use = radio_use(shipped.trace or [], radio, shipped.times.tx, shipped.times.rx)
    return SlotCost(shipped.bytes, shipped.frames, {"readings": shipped.bytes},
                    with_sync_hops(with_links(use, links), hops or {}),
                    {cell: shipped.cpu_s.get(cell, 0.0) for cell in cells},
                    shipped.makespan_s)


def run_cloud(spec: MeshSpec, model: CNN, series: np.ndarray, radio: RadioProfile,
              medium: MediumName, device: DeviceProfile, edge_device: DeviceProfile,
              settings: LiveSettings, cells: list[Cell]) -> CloudRun:
    """The cloud-heavy baseline over the same slots, as lean as the mesh: the same
    header, MAC, devices and float32 values. Up the tree aggregated on a radio mesh
    (each node one message with its subtree's readings), published through the broker
    on the star. Under `--delta` the nodes send on delta and the edge computes on what
    it holds; else every slot ships every reading, the same messages every time. As the
    mesh's install, its first slot (every reading, under --delta too) is left out of the
    per-slot figures. Under --loss its links lose frames as the mesh's do."""
    variant = "aggregated" if medium == "shared" else "unaggregated"
    header = spec.overhead(Kind.HALO)  # the mesh's own, compact on a radio mesh
    topo = spec.topology
    # A scheduled MAC keeps up the tree's links (a node's parent and children).
    links = plan_links((cell, parent) for cell, parent in topo.parent.items()
                       if cell in topo.members)
    hops = flood_hops(spec)  # the same sync flood as the mesh's: it sleeps too

    def ship(senders: frozenset[Cell] | None) -> SlotCost:
        shipped = ship_readings(spec, radio, medium, device, edge_device, 1, variant,
                                settings.seed, header_bytes=header, senders=senders,
                                traced=True, loss=settings.loss)
        return cloud_cost(shipped, radio, cells, links, hops)

    side = Side()
    if settings.delta is None:
        side.add(ship(None), settings.slots - 1)
        return CloudRun(side, central_labels(model, series, spec.activations == STATIC))
    # Channels last: a cell's values together.
    flat = np.moveaxis(series.reshape(len(series), -1, spec.model.rows * spec.model.cols),
                       1, 2)
    sod = send_on_delta(flat, settings.delta)
    rows, cols = spec.model.rows, spec.model.cols
    for slot in range(1, len(series)):
        side.add(ship(senders_of(sod.sends[slot], rows, cols)))
    held = np.moveaxis(sod.held, 2, 1).reshape(series.shape)
    return CloudRun(side, central_labels(model, held, spec.activations == STATIC))


def central_labels(model: CNN, series: np.ndarray, quantized: bool = False,
                   chunk: int = 1024) -> list[int]:
    """Central inference on the same readings, as alerts (`quantized`: the central
    int8 emulation, what a mesh under int8-static computes)."""
    labels: list[int] = []
    for first in range(0, len(series), chunk):
        labels += labels_of(model.forward(series[first:first + chunk], quantized=quantized))
    return labels


def live_spec(config: Any, model: CNN, medium: MediumName, settings: LiveSettings
              ) -> MeshSpec:
    """The mesh of a live run: `config`'s, with the model's network; parameters down the
    tree and compact headers on a radio mesh (TCP/IP is not the constraint on the
    star)."""
    return MeshSpec(config.mesh.mesh_id, model.config, config.mesh.edge_at,
                    "tree" if medium == "shared" else "broadcast",
                    config.mesh.max_message_bytes, delta=settings.delta,
                    header="compact" if medium == "shared" else "full",
                    activations=config.mesh.activations)


@thawed_on_return
def simulate(maps: np.ndarray, model: CNN, config: Any, radio: RadioProfile,
             medium: MediumName, device: DeviceProfile, edge_device: DeviceProfile,
             settings: LiveSettings, say: Callable[[int], None] = lambda _: None
             ) -> dict[str, Any]:
    """A live run, mesh and cloud, as sim.json records it: its slots replay `maps`, a
    data set's test maps (`readings_series`)."""
    check_settings(settings, radio)
    spec = live_spec(config, model, medium, settings)
    series, readings = readings_series(maps, settings.slots)
    # Central inference and the cloud first: what they worked with is freed before the
    # mesh is built, the most of a run's memory (at 100 x 100, 1.2 GB of its 1.6).
    central = central_labels(model, series, spec.activations == STATIC)
    cloud_side, cloud_labels = run_cloud(spec, model, series, radio, medium, device,
                                         edge_device, settings, live_cells(spec))
    with kept_out_of_the_collector():
        live = LiveMesh(spec, model, radio, medium, device, edge_device, settings)
    mesh = run_mesh(live, series, say)
    gc.freeze()  # and what its waves made and keep (their buffers' owners, tallies)
    bat = settings.battery or battery("2xAA")
    memo: Memo = {}
    summaries = {mac: {"mesh": side_summary(mesh, live.cells, mac, radio, device, settings,
                                            bat, memo),
                       "cloud": side_summary(cloud_side, live.cells, mac, radio, device,
                                             settings, bat, memo)}
                 for mac in priced_macs(settings.mac)
                 if unsupported_reason(mac, radio, settings.mac_params) is None}
    chosen = summaries[settings.mac]
    install = mesh.install
    # Parameters (PARAMS and BATCH) on the air after the first slot: a scheduled slot
    # carries none, as its counts show.
    params = round(sum(cost.by_class.get("params", 0) * n
                       for cost, n in zip(mesh.costs, mesh.repeats, strict=True)))
    report: dict[str, Any] = {
        "slots": settings.slots,
        "slot_seconds": settings.slot_s,
        "first_slot": slot_stamp(live.first_slot, settings.slot_s),
        "timed_slots": (len(mesh.costs) if mesh.timed is None else mesh.timed) + 1,
        "radio": radio.model_dump(), "medium": medium, "device": device.name,
        "edge_device": edge_device.name,
        "header_bytes": spec.overhead(Kind.HALO),
        "mac": settings.mac,
        "mac_params": settings.mac_params.model_dump(),
        "battery": bat.model_dump(),
        "delta": settings.delta,
        "loss": None if settings.loss is None else {
            "rate": settings.loss.rate, "burst": settings.loss.burst,
            "seed": settings.loss.seed},
        "clock": {"drift_ppm": settings.drift_ppm,
                  "max_error_s": max(abs(e) for e in live.clock_errors().values())},
        "readings": readings,
        "alerts_equal_central": mesh.labels == central,
        "alerts": {"central_positive": sum(central),
                   "mesh_positive": sum(mesh.labels),
                   "cloud_positive": sum(cloud_labels),
                   "mesh_differ_from_central": _differ(mesh.labels, central),
                   "cloud_differ_from_central": _differ(cloud_labels, central)},
        "mesh": {**chosen["mesh"], "params_bytes": params,
                 "install_bytes": 0 if install is None else install.bytes,
                 "install_makespan_s": 0.0 if install is None else install.makespan_s},
        "cloud": {**chosen["cloud"], "variant": "aggregated" if medium == "shared"
                  else "unaggregated"},
        "macs": summaries,
        "nodes": {name: node_figures(side, live.cells, settings.mac, radio, device,
                                     settings, bat, memo)
                  for name, side in (("mesh", mesh), ("cloud", cloud_side))},
    }
    report["alert_series"] = {"mesh": mesh.labels, "central": central, "cloud": cloud_labels}
    return report


def priced_macs(chosen: MacName) -> tuple[MacName, ...]:
    """The MACs a live run prices: PRICED_MACS, and the chosen one."""
    return PRICED_MACS if chosen in PRICED_MACS else (*PRICED_MACS, chosen)


def _differ(a: list[int], b: list[int]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def write(report: dict[str, Any], run_dir: Path) -> None:
    """sim.json (without the per-slot series) and alerts.jsonl: one line per slot, the
    mesh's, the cloud's and central inference's alert labels."""
    series = report["alert_series"]
    record = {k: v for k, v in report.items() if k != "alert_series"}
    (run_dir / "sim.json").write_text(json.dumps(record, indent=2) + "\n")
    first = datetime.strptime(report["first_slot"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()
    with (run_dir / "alerts.jsonl").open("w") as out:
        for slot, (mesh, central, cloud) in enumerate(zip(
                series["mesh"], series["central"], series["cloud"], strict=True)):
            stamp = datetime.fromtimestamp(first + slot * report["slot_seconds"],
                                           timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.write(json.dumps({"slot": slot, "timestamp": stamp, "mesh": mesh,
                                  "cloud": cloud, "central": central}) + "\n")


def summary_line(report: dict[str, Any], run_dir: Path) -> str:
    """The comparison in one line, every figure by the report's formatter (the same
    digits on both sides: "2.372 y" beside "2.451 y", not "2.37" beside "2.3")."""
    mesh, cloud = report["mesh"], report["cloud"]
    return (f"{report['slots']} slots of {given(report['slot_seconds'])} s on "
            f"{report['radio']['name']} ({report['medium']}, {report['mac']}): mesh "
            f"{places(mesh['bytes_per_slot'], 0)} B/slot, hottest {mesh['hottest_cell']} "
            f"{figure(mesh['hottest_node_j_per_slot'])} J/slot, first death "
            f"{figure(mesh['first_death_years'])} y ({mesh['first_cell']}); cloud "
            f"{places(cloud['bytes_per_slot'], 0)} B/slot, hottest "
            f"{figure(cloud['hottest_node_j_per_slot'])} J/slot, first death "
            f"{figure(cloud['first_death_years'])} y ({cloud['first_cell']}); alerts equal "
            f"central: {report['alerts_equal_central']} -> {run_dir}")
