"""The mesh under simulated time: the virtual mesh's machines on a radio medium's clock.

The same node machines (one `NodeHost` per cell) and the same `EdgeMachine`, built as
for the virtual mesh (sim/parties.py), take the same messages; only the transport and
its clock change. Each
party has one CPU and one radio:

    message arrives -> waits for the party's CPU -> handled at `now` (the machine's
    kernels run for real) -> CPU busy for the device profile's time of the operations
    that message set off -> what it sent is queued on the party's radio -> the medium
    decides when each transmission holds the channel (sim/radio/media.py; without losses
    its contention runs compiled, sim/radio/air.py) -> delivered to the receivers when its
    last frame is through.

On the shared radio the messages one handling produces with the same kind, layer and
phase for several neighbours (a halo strip's copies, the parameters to the tree
children) go out as one broadcast carrying the union of their items. Only what one
handling makes is merged (a radio sends what it has), so the ledger's broadcast figure,
which merges over a whole wave, is a lower bound of these transmissions. On the MQTT
star every message goes up to the broker and down to each subscriber; the broker (on
the access point's side) spends `broker_s` per message it relays.

Since the protocol computes the same values in any delivery order, the clock changes
when things happen, never what is computed: training under simulated time gives the
virtual mesh's parameters (a test shows it).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshdl.edge.agent import EdgeMachine, WaveResult
from meshdl.errors import MeshdlError, UsageError
from meshdl.model.cnn import CNN
from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.host import NodeHost
from meshdl.protocol.accounting import message_items
from meshdl.protocol.deadlines import Margins
from meshdl.protocol.messages import ALL, DTYPES, EDGE, Kind, Message, payload_bytes
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import TopicNames
from meshdl.protocol.topology import Cell, Topology
from meshdl.protocol.work import optimizer_work
from meshdl.sim.besteffort import (
    PROBE_WAVES,
    BestEffort,
    Offsets,
    Receipt,
    latest,
    offsets_from,
)
from meshdl.sim.faults.stragglers import Stragglers
from meshdl.sim.parties import MeshParties
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.clock import Clock, EventQueue
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.media import (
    BROKER,
    KindFigures,
    Medium,
    MediumName,
    Tally,
    Transmission,
    medium_for,
)
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Party, Sent

HELLO_WAVES = 3  # a node says hello after this many of the longest waves without PARAMS
UNKNOWN_ROUNDS = 3  # end-to-end recoveries of a frame whose receiver has no deadline

# Mosquitto's work per relayed message on the broker's host: `meshdl bench mqtt`'s raw
# broker reference (mosquitto_pub -l to a subscriber) measured 29,244 messages a second
# here, 34 us a message with both clients' share; a Raspberry Pi 4 core is about 4 times
# slower than this machine's: 140 us.
BROKER_S = 140e-6


@dataclass(slots=True)
class _Cpu:
    """One party's processor: messages are handled one at a time; one that comes while
    it is busy waits in `inbox` until `free_at`."""

    inbox: deque[Message] = field(default_factory=deque)
    free_at: float = 0.0
    waking: bool = False  # an event at `free_at` will take the inbox's next
    seconds: float = 0.0  # computing, in total


@dataclass
class Usage:
    """What the waves of one mode took: simulated seconds, each party's seconds of
    computing within them, and the medium's account of their transmissions (each
    party's seconds of transmitting and receiving, bytes and frames by kind)."""

    waves: int = 0
    seconds: float = 0.0
    cpu: dict[Party, float] = field(default_factory=dict)
    radio: Tally = field(default_factory=Tally)
    down: dict[Party, float] = field(default_factory=dict)  # seconds each node was down

    @property
    def tx(self) -> dict[Party, float]:
        return self.radio.times.tx

    @property
    def rx(self) -> dict[Party, float]:
        return self.radio.times.rx

    @property
    def by_kind(self) -> dict[tuple[Kind, int], KindFigures]:
        return self.radio.by_kind

    @property
    def transmissions(self) -> int:
        return self.radio.transmissions

    def add(self, seconds: float, cpu_before: dict[Party, float],
            cpu_after: dict[Party, float]) -> None:
        """One more wave: its seconds, and what each CPU computed in it."""
        self.waves += 1
        self.seconds += seconds
        cpu = self.cpu
        for party, value in cpu_after.items():
            grown = value - cpu_before[party]
            if grown:
                cpu[party] = cpu.get(party, 0.0) + grown


@dataclass
class WaveTiming:
    """When a wave's milestones happened, in simulated seconds."""

    mode: Mode
    start: float
    forward: float | None = None  # the edge has every pooled feature (head starts)
    backward: float | None = None  # training: the head's gradient is ready (SCATTER goes)
    end: float = 0.0
    filled_in: int = 0  # best effort: messages filled in at deadlines, edge's included


class TimedMesh:
    """Nodes, edge, medium, event queue and ledger of one mesh under simulated time."""

    def __init__(self, spec: MeshSpec, readings: dict[int, np.ndarray], model: CNN,
                 labels: dict[int, np.ndarray], radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, seed: int = 0,
                 trace: bool = False, broker_s: float = BROKER_S,
                 loss: FrameLoss | None = None,
                 stragglers: Stragglers | None = None,
                 best_effort: BestEffort | None = None, receipts: bool = False,
                 attach: tuple[Cell, ...] = (), compiled: bool = True,
                 memory_plan: bool = True, originals: int | None = None) -> None:
        """`loss`: frames the links lose (sim/radio/loss.py); the link layer retries and the
        sender recovers what is still lost, so every message arrives and the results
        are the lossless run's (reliable mode), at the cost the trace shows.
        `best_effort`: instead, what the link layer could not deliver is lost, and
        every party gives up on a message at its deadline (sim/besteffort.py).
        `stragglers`: cells whose CPU is slower than `device` (sim/faults/stragglers.py).
        `receipts`: keep every message as its receiver took it (also with `trace`).
        `attach`: border cells the edge may attach to instead of `spec.edge_at`, in
        order, when its own dies (the edge has a radio link to each).
        `compiled`: run the loss-free medium's contention compiled (sim/radio/air.py: the same
        events, faster) where it can be: without lossy links, best effort or dead
        cells. A mesh whose nodes will be killed, or whose radios get their own backoff
        streams, needs False. `memory_plan`, `originals`: see `MeshParties`."""
        if medium == "shared" and spec.params_via != "tree":
            raise UsageError("a radio mesh floods PARAMS down the tree: params_via "
                             "'broadcast' needs the MQTT star (--medium star)")
        self.spec = self.base_spec = spec  # as configured (the edge's may replan)
        self.medium_name = medium
        self.radio = radio
        self.device = device
        self.edge_device = edge_device
        self.broker_s = broker_s
        self._per_message_s, self._flops_per_s = device.per_message_s, device.flops_per_s
        self.stragglers = stragglers or Stragglers()
        topo = spec.topology
        members = [cell for cell in topo.cells() if cell in topo.members]  # not the dead
        self.slowdown = self.stragglers.pick(members)  # cell -> factor
        compiled = compiled and loss is None and best_effort is None and not spec.dead
        self.queue: Clock = AirQueue() if compiled else EventQueue()
        self.trace: list[Sent] | None = [] if trace else None
        # With the trace: every message as its receiver took it (time, receiver, header).
        self.receipts: list[Receipt] | None = [] if trace or receipts else None
        self.seed, self.readings = seed, readings
        # Every cell has its host, the dead too: a cell that comes back takes part again
        # once the edge's PARAMS bring a plan with it (sim/faults/dead.py).
        self.parties = MeshParties(spec, readings, model, labels, memory_plan, originals)
        self.ledger = self.parties.ledger
        self.hosts: dict[Cell, NodeHost] = self.parties.hosts
        self.nodes: dict[Cell, NodeMachine] = self.parties.nodes
        self.edge: EdgeMachine = self.parties.edge
        # Cells whose node is down, and since when: what reaches them is lost.
        self.down: dict[Cell, float] = dict.fromkeys(spec.dead, 0.0)
        self.retired: dict[Cell, Counter[str]] = {}  # the counts of nodes that crashed
        self._topics = TopicNames(spec.mesh_id)
        # A broadcast's bytes, and each of its messages' own (see `_broadcast`).
        self._broadcast_sizes: dict[tuple, tuple[int, tuple[int, ...]]] = {}
        self._sizes: dict[tuple, int] = {}  # (kind, shape): a message's bytes
        self.cpus: dict[Party, _Cpu] = {party: _Cpu() for party in [*self.hosts, EDGE]}
        # The air is the grid's, whoever is dead: a dead node's neighbours still hear
        # each other's transmissions around it.
        air = Topology(topo.rows, topo.cols, topo.edge_at, topo.pool)
        self.medium: Medium = medium_for(medium, air, radio, self.queue, seed, self._arrive,
                                         self.trace, loss, attach)
        self.medium.down.update(self.down)
        if medium == "star":
            self.cpus[BROKER] = _Cpu()
        self.best_effort = best_effort
        if best_effort is not None:  # dead cells found, announced, taken back in
            self.edge.watch_health = True
            self.edge.attach_options = (spec.edge_at, *attach)
        self.attach = attach
        self.rolled_call = False  # best effort: the roll call runs before the first wave
        self.plans_change = best_effort is not None
        # The first deadlines by (plan, mode, batch): for the nodes of now and those
        # that come back later.
        self._calibrated: dict[tuple, tuple[Offsets, Margins]] = {}
        self._probe: TimedMesh | None = None  # the loss-free mesh that measures them
        self._tick_at: dict[Party, float] = {}  # each party's next deadline event
        self._filled_before = 0
        self.hello_after: float | None = None  # set with the first deadlines
        self.waves: list[WaveTiming] = []
        self.usage: dict[Mode, Usage] = {}
        self._wave: WaveTiming | None = None
        # Far beyond what any wave needs (a handful of events a message, and a few
        # deferrals each): more means the wave hangs.
        messages = sum(len(sends) for sends in spec.sends.values()) + 2 * len(self.hosts)
        self.max_events = 100 * messages + 100_000

    # ---------------------------------------------------------------- waves
    def run_wave(self, mode: Mode, split: Split, indices: np.ndarray,
                 failout: np.ndarray | None = None, step: int | None = None) -> WaveResult:
        """One wave from the edge and back, in simulated time (`failout` and `step`, its
        number, as `EdgeMachine.start` takes them)."""
        queue, edge = self.queue, self.edge
        self._wave = WaveTiming(mode, queue.now)
        # The medium counts this wave's transmissions into the mode's own account.
        usage = self.usage.setdefault(mode, Usage(radio=self.medium.account(mode)))
        before = self._cpu_seconds()
        if self.best_effort is not None:
            if not self.rolled_call:  # commissioning: who is there, before any wave
                self.roll_call()
            edge.weigh_health()  # the plan of this wave, maybe without cells found dead
            if (edge.spec.plan_key, mode, len(indices)) not in self._calibrated:
                self._calibrate(mode, split, indices)
        self._handled(EDGE, edge.start(mode, split, indices, queue.now, step, failout),
                      queue.now)
        return self._run_out(mode, usage, before)

    def run_slot(self, slot: int, clock_errors: Mapping[Cell, float] | None = None
                 ) -> WaveResult:
        """One scheduled slot of live inference (reliable mode): the edge waits for the
        slot's GATHER and sends nothing; each node starts the slot on its cached
        parameters when its own clock reaches the boundary, `clock_errors[cell]` seconds
        after the edge's (negative: before; the wave starts with the earliest clock)."""
        if self.best_effort is not None:
            raise UsageError("scheduled slots run in reliable mode")
        queue, errors = self.queue, clock_errors or {}
        earliest = min(0.0, *errors.values()) if errors else 0.0
        self._wave = WaveTiming(Mode.INFER, queue.now)
        usage = self.usage.setdefault(Mode.INFER, Usage(radio=self.medium.account(Mode.INFER)))
        before = self._cpu_seconds()
        self._handled(EDGE, self.edge.start_slot(slot, queue.now - earliest), queue.now)
        for cell in self.nodes:
            if cell not in self.down:
                queue.at(queue.now + errors.get(cell, 0.0) - earliest, self._begin_slot,
                         (cell, slot))
        return self._run_out(Mode.INFER, usage, before)

    def _begin_slot(self, cell_slot: tuple[Cell, int]) -> None:
        """A node's clock reaches the slot boundary: it starts the slot once its CPU is
        free (a timer interrupt costs what a message's bookkeeping does)."""
        cell, slot = cell_slot
        cpu, now = self.cpus[cell], self.queue.now
        if cell in self.down:
            return
        if cpu.free_at > now:
            self.queue.at(cpu.free_at, self._begin_slot, cell_slot)
            return
        node = self.nodes[cell]
        before = node.flops
        out = node.begin_slot(slot, now)
        seconds = self._per_message_s + (node.flops - before) / self._flops_per_s
        if self.slowdown:
            seconds *= self.slowdown.get(cell, 1.0)
        cpu.seconds += seconds
        cpu.free_at = now + seconds
        self._handled(cell, out, now + seconds)

    def _run_out(self, mode: Mode, usage: Usage, before: dict[Party, float]) -> WaveResult:
        """Run the started wave to its end; count its seconds and what it used."""
        queue, edge = self.queue, self.edge
        if self.best_effort is not None:
            self._arm(EDGE)
        if self.best_effort is None:
            # The wave, and its tail (the last relays after the edge has its result).
            if not queue.run(self.max_events) or edge.result is None:
                self._stalled()
            # The wave is over when every CPU is too (the edge's head, say, after the
            # last GATHER): the next starts then.
            end = max(queue.now, *(cpu.free_at for cpu in self.cpus.values()))
        else:
            # Best effort: the edge goes on as soon as it has its result; what is still
            # on its way of this wave is left to be dropped as stale in the next.
            if not queue.run_until(lambda: edge.result is not None, self.max_events) \
                    or edge.result is None:
                self._stalled()
            end = max(queue.now, self.cpus[EDGE].free_at)
        if mode == Mode.TRAIN:  # the training loop applies the update before the next
            seconds = self.edge_device.cpu_s(optimizer_work(self.edge.model.flat.size)
                                             .at(0), messages=0)
            self.cpus[EDGE].seconds += seconds
            end += seconds
        if self.best_effort is None:
            queue.advance_to(end)
        else:
            queue.run_through(end)
        self._wave.end = end
        for cell, since in self.down.items():  # a down node draws no power
            usage.down[cell] = usage.down.get(cell, 0.0) + end - max(since,
                                                                     self._wave.start)
            self.down[cell] = end  # counted up to here
        if self.best_effort is not None:
            total = self.filled_in()
            self._wave.filled_in = total - self._filled_before
            self._filled_before = total
        self.waves.append(self._wave)
        usage.add(end - self._wave.start, before, self._cpu_seconds())
        self.ledger.tally()
        return edge.result

    # ------------------------------------------------------------ best effort
    def _calibrate(self, mode: Mode, split: Split, indices: np.ndarray) -> None:
        """Measure this kind of wave loss-free on a probe mesh (sim/besteffort.py): the
        first deadlines of every party."""
        if self._probe is None:
            copy = CNN(self.edge.model.config)
            self._probe = TimedMesh(
                self.spec, self.readings, copy, self.edge.labels, self.radio,
                self.medium_name, self.device, self.edge_device, self.seed,
                broker_s=self.broker_s, stragglers=self.stragglers, receipts=True,
                attach=self.attach, compiled=False,  # it kills and revives cells
                memory_plan=self.parties.memory_plan, originals=self.parties.originals)
            self._probe.plans_change = True
        probe, model, spec = self._probe, self.edge.model, self.edge.spec
        probe.edge.replan(*spec.plan_key)  # the mesh as it is now, its dead down
        for cell in set(probe.down) - spec.dead:
            probe.revive(cell)
        for cell in spec.dead:
            probe.kill(cell)
        probe.edge.model.flat[...] = model.flat
        probe.edge.model.set_normalization(model.norm_mean, model.norm_std)
        found = []
        for _ in range(PROBE_WAVES):
            probe.receipts.clear()
            start = probe.queue.now
            probe.run_wave(mode, split, indices)
            scatter_at = probe.edge.backward_at if mode == Mode.TRAIN else None
            found.append(offsets_from(probe.receipts, probe.nodes, start, scatter_at))
        offsets = latest(found)
        margins = offsets.margins(self.radio)
        policy, k, batch = self.best_effort.policy, self.best_effort.patience, len(indices)
        self._calibrated[(spec.plan_key, mode, batch)] = (offsets, margins)
        for cell, first in offsets.nodes.items():
            self.nodes[cell].set_deadlines(policy, mode, batch, first, margins, k, spec)
        # A node that hears no PARAMS for a few of the longest waves says hello.
        longest = max(w.end - w.start for w in probe.waves)
        self.hello_after = max(self.hello_after or 0.0, HELLO_WAVES * longest)
        for node in self.nodes.values():
            node.effort.hello_after = self.hello_after
        self.edge.set_deadlines(policy, mode, batch, offsets.gather, offsets.reduce,
                                margins, k, spec)

    def roll_call(self) -> frozenset[Cell]:
        """Commissioning's roll call (best effort), before the first wave: the edge
        floods a call from its cell, every node up rebroadcasts it once and answers up
        the tree of whom it first heard it from, as TAG builds its tree and Glossy
        floods (one flood of a few milliseconds over several hops). The answers reach
        the edge from exactly the nodes up and linked to it through nodes up; the
        others (down, or cut off behind them) are planned around from the first wave
        (`EdgeMachine.view_down`), so no wave waits out their silence. Its frames, as
        the deadline probe's, are commissioning's: left out of every figure, the
        outcome of a loss-free flood. Returns the cells that did not answer."""
        self.rolled_call = True
        topo, edge = self.base_spec.topology, self.edge
        for edge_at in edge.attach_options:
            if edge_at not in self.down:
                break
        else:
            raise MeshdlError("no cell the edge may attach to is up: nothing answers "
                              "the roll call")
        flood = Topology(topo.rows, topo.cols, edge_at, topo.pool, frozenset(self.down))
        silent = frozenset(topo.cells()) - flood.members
        edge.view_down(silent)
        return silent

    def kill(self, cell: Cell) -> None:
        """The node of `cell` goes down now: it takes nothing more, sends nothing, draws
        no power, and forgets everything (a crash)."""
        if cell not in self.down:
            self.medium.silence(cell)
            self.down[cell] = self.queue.now
            self._tick_at.pop(cell, None)
            self.cpus[cell].inbox.clear()
            self.cpus[cell].waking = False

    def revive(self, cell: Cell) -> None:
        """The node of `cell` comes back now, as it boots: its configured mesh, nothing
        of the waves before."""
        since = self.down.pop(cell, None)
        if since is None:
            return
        self.medium.down.discard(cell)
        if self._wave is not None and self.queue.now > since:  # down in this wave
            usage = self.usage.setdefault(self._wave.mode, Usage())
            usage.down[cell] = usage.down.get(cell, 0.0) + self.queue.now - max(
                since, self._wave.start)
        self.retired.setdefault(cell, Counter()).update(self.nodes[cell].stats)
        host = self.parties.host_for(cell)  # of the configured mesh (`base_spec`)
        self.hosts[cell], self.nodes[cell] = host, host.nodes[cell]
        node = host.nodes[cell]
        node.effort.heard_at, node.effort.hello_after = self.queue.now, self.hello_after
        node.plans_change = self.plans_change
        if self.best_effort is not None:  # the deadlines it would have been given
            node.effort.policy = self.best_effort.policy
            for (plan, mode, batch), (offsets, margins) in self._calibrated.items():
                if cell in offsets.nodes:
                    node.set_deadlines(self.best_effort.policy, mode, batch,
                                       offsets.nodes[cell], margins,
                                       self.best_effort.patience,
                                       self.base_spec.replanned(*plan))
            self._arm(cell)
        self.cpus[cell] = _Cpu(free_at=self.queue.now, seconds=self.cpus[cell].seconds)

    @property
    def plans_change(self) -> bool:
        """May the mesh be replanned (best effort, and its probe)? Then nodes keep a
        later wave's messages whatever their shape (nodes/agent.py)."""
        return self._plans_change

    @plans_change.setter
    def plans_change(self, value: bool) -> None:
        self._plans_change = value
        for node in self.nodes.values():
            node.plans_change = value

    def counts(self, cell: Cell) -> Counter[str]:
        """What the node of `cell` counted, its lives before a crash included."""
        retired = self.retired.get(cell)
        stats = self.nodes[cell].stats
        return stats if retired is None else stats + retired

    def filled_in(self) -> int:
        """Messages filled in at deadlines so far, by the nodes and the edge."""
        return sum(self.counts(cell)["filled_in"] for cell in self.nodes) + sum(
            count for key, count in self.edge.stats.items() if key.startswith("filled_in:"))

    def _arm(self, party: Party) -> None:
        """Make sure an event wakes `party` at its machine's next deadline."""
        machine = self.edge if party == EDGE else self.nodes[party]
        due = machine.next_deadline()
        if due is None or due >= self._tick_at.get(party, math.inf):
            return
        due = max(due, self.queue.now)
        self._tick_at[party] = due
        self.queue.at(due, self._tick, party)

    def _tick(self, party: Party) -> None:
        """A party's deadline: it gives up on what is overdue, once its CPU is free."""
        now = self.queue.now
        if self._tick_at.get(party) != now:  # an earlier deadline took this one's place
            return
        del self._tick_at[party]
        if party in self.down:
            return
        cpu = self.cpus[party]
        if cpu.free_at > now or cpu.inbox:  # after what it is computing and has waiting
            self._tick_at[party] = cpu.free_at + (1e-9 if cpu.inbox else 0.0)
            self.queue.at(self._tick_at[party], self._tick, party)
            return
        machine = self.edge if party == EDGE else self.nodes[party]
        before = machine.flops
        out = machine.tick(now)
        device = self.edge_device if party == EDGE else self.device
        seconds = device.cpu_s(machine.flops - before, messages=0)
        if party != EDGE and self.slowdown:
            seconds *= self.slowdown.get(party, 1.0)
        cpu.seconds += seconds
        cpu.free_at = now + seconds
        self._handled(party, out, now + seconds)
        self._arm(party)

    def _cpu_seconds(self) -> dict[Party, float]:
        return {party: cpu.seconds for party, cpu in self.cpus.items()}

    def _stalled(self) -> None:
        failed = [f"{cell}: {error}" for host in self.hosts.values()
                  for cell, error in host.failed.items()]
        raise MeshdlError(f"wave {self.edge.step} stalled at simulated "
                          f"{self.queue.now:.3f} s"
                          f"{'; failed cells ' + ', '.join(failed[:3]) if failed else ''}")

    # ------------------------------------------------------------- parties
    def _arrive(self, party: Party, message: Message) -> None:
        """A message reaches `party`: handled now, or queued while its CPU is busy (or
        lost, if its node is down)."""
        if self.down and party in self.down:
            self.medium.faults["messages_to_dead"] += 1
            return
        cpu, now = self.cpus[party], self.queue.now
        if cpu.free_at > now or cpu.inbox:
            cpu.inbox.append(message)
            if not cpu.waking:
                cpu.waking = True
                self.queue.at(cpu.free_at, self._wake, party)
            return
        self._handle(party, message, now)

    def _wake(self, party: Party) -> None:
        """The CPU is free again: take the next message waiting for it."""
        cpu, now = self.cpus[party], self.queue.now
        cpu.waking = False
        if not cpu.inbox or party in self.down:  # it crashed meanwhile
            return
        self._handle(party, cpu.inbox.popleft(), now)
        if cpu.inbox:
            cpu.waking = True
            self.queue.at(cpu.free_at, self._wake, party)

    def _handle(self, party: Party, message: Message, now: float) -> None:
        """The party's machine takes the message at `now` (its kernels run for real);
        its CPU is then busy for the device's time of what that set off, and what it
        sent goes on the radio when that time is over."""
        if self.receipts is not None:
            self.receipts.append(Receipt(now, party, message.header))
        node = self.nodes.get(party)
        if node is not None:  # a cell: by far the most messages (DeviceProfile.cpu_s)
            before = node.flops
            out: list[Any] = self.hosts[party].take(message, now)
            seconds = self._per_message_s + (node.flops - before) / self._flops_per_s
            if self.slowdown:
                seconds *= self.slowdown.get(party, 1.0)
        elif party == EDGE:
            edge = self.edge
            before = edge.flops
            out = edge.handle(message, now)
            seconds = self.edge_device.cpu_s(edge.flops - before)
            if message.header.kind == Kind.GATHER and edge.trace is not None \
                    and self._wave is not None and self._wave.forward is None:
                self._wave.forward = now - self._wave.start
                if out:  # the SCATTER: the head's gradient is ready once it is made
                    self._wave.backward = now + seconds - self._wave.start
        else:  # the broker
            out, seconds = self._fan_out(message), self.broker_s
        cpu = self.cpus[party]
        cpu.seconds += seconds
        cpu.free_at = now + seconds
        self._handled(party, out, now + seconds)
        if self.best_effort is not None and party != BROKER:
            self._arm(party)

    def _handled(self, party: Party, out: list[Any], ready: float) -> None:
        """Queue on `party`'s radio what it sent, to go on air from `ready`."""
        if not out:
            return
        send = self.medium.send if self.best_effort is None else self._send_expiring
        if party == BROKER:
            for dst, message in out:
                send(Transmission(BROKER, (dst,), message.header.kind, message.header.layer,
                                  self._mqtt_bytes(message), [(dst, message)]), ready)
            return
        self.ledger.record_all(out)
        if self.medium_name == "star":
            for message in out:
                send(Transmission(party, (BROKER,), message.header.kind, message.header.layer,
                                  self._mqtt_bytes(message), [(BROKER, message)]), ready)
            return
        if len(out) == 1:  # most handlings send one message, or none
            send(self._unicast(party, out[0]), ready)
            return
        groups: dict[tuple[int, int, int], list[Message]] = {}
        for message in out:
            h = message.header
            groups.setdefault((h.kind, h.layer, h.phase), []).append(message)
        for (kind, layer, phase), messages in groups.items():
            send(self._unicast(party, messages[0]) if len(messages) == 1 else
                 self._broadcast(party, kind, layer, phase, messages), ready)

    def _send_expiring(self, tx: Transmission, ready: float | None = None) -> None:
        """Best effort: `tx` expires when the last of its receivers stops waiting for
        what it carries. Where one has no deadline for it yet (PARAMS and BATCH, a
        message ahead of its receiver's wave), a lost frame is taken up again a few
        times (`UNKNOWN_ROUNDS`): a receiver that answers none of them is dead (the
        simulator asks the receiving machine what its sender could only estimate)."""
        latest = 0.0
        for _, message in tx.deliveries:
            h = message.header
            machine = self.edge if h.dst == EDGE else self.nodes.get(h.dst)
            due = None if machine is None or h.dst in self.down else machine.due(h)
            if due is None:
                tx.rounds = UNKNOWN_ROUNDS
                break
            latest = max(latest, due)
        else:
            tx.expires = latest
        self.medium.send(tx, ready)

    def _unicast(self, src: Party, message: Message) -> Transmission:
        h = message.header
        return Transmission(src, (h.dst,), h.kind, h.layer, self._bytes(message),
                            [(h.dst, message)])

    def _broadcast(self, src: Party, kind: int, layer: int, phase: int,
                   messages: list[Message]) -> Transmission:
        """Messages of one kind, layer and phase for several neighbours: one radio
        transmission carrying the union of their items (its size is worked out once per
        sender, receivers and batch: waves repeat them)."""
        receivers = tuple([m.header.dst for m in messages])
        key = (src, kind, layer, phase, receivers, messages[0].header.shape,
               self.nodes[src].spec.plan_key if src in self.nodes else None)
        sizes = self._broadcast_sizes.get(key)
        if sizes is None:
            items: set = set()
            per_item = 0
            for m in messages:
                carried = message_items(self.nodes[src].spec if src in self.nodes
                                        else self.edge.spec, src, m.header.dst, kind,
                                        layer, phase)
                items.update(carried)
                per_item = math.prod(m.header.shape) // len(carried)
            union = self.spec.overhead(Kind(kind)) + \
                DTYPES[messages[0].header.dtype].itemsize * per_item * len(items)
            sizes = self._broadcast_sizes[key] = (union, tuple(map(self._bytes, messages)))
        return Transmission(src, receivers, kind, layer, sizes[0],
                            list(zip(receivers, messages, strict=True)), True, 0.0, sizes[1])

    def _bytes(self, message: Message) -> int:
        h = message.header
        key = (h.kind, h.shape, h.dtype)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = self.spec.overhead(h.kind) + payload_bytes(h)
        return size

    def _mqtt_bytes(self, message: Message) -> int:
        return publish_bytes(len(self._topics.of(message.header)), self._bytes(message))

    def _fan_out(self, message: Message) -> list[tuple[Party, Message]]:
        """The broker: a copy to every subscriber of the message's topic."""
        dst = message.header.dst
        if dst == ALL:
            return [(cell, message) for cell in self.hosts]
        return [(dst, message)]


def publish_bytes(topic_length: int, message_bytes: int) -> int:
    """An MQTT 5 PUBLISH at QoS 0 carrying a message: fixed header (1 byte and the
    remaining length's 1 to 4), topic (2 + its length), properties' length (1)."""
    rest = 2 + topic_length + 1 + message_bytes
    length_bytes = 1 if rest < 128 else 2 if rest < 16384 else 3 if rest < 2097152 else 4
    return 1 + length_bytes + rest


