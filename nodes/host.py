"""A node host: the node machines of several cells behind one MQTT connection.

One Raspberry Pi runs a host of one cell; a gateway (or a test bench) runs one for many.
The host only routes. A message from the broker goes to the cell its *topic* names, and
its header must agree with that topic. The topic is what the broker's ACL authenticates
(only `r0c1` may publish under `meshdl/<mesh>/r0c1/`), so a client cannot reach a cell by
writing one address on the topic and another in the header.

A message from one hosted cell to another is handed over in process, as a gateway
relays between the radios it serves, and never crosses the broker (unless
`local_delivery` is off: then every message makes the round trip, as between Pis). The
node machines cannot tell the difference; only the host's counts and the broker's load
do.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from meshdl.data.datasets import Dataset, cell_series
from meshdl.nodes import compute
from meshdl.nodes.agent import NodeMachine
from meshdl.protocol.messages import ALL, Message
from meshdl.protocol.spec import MeshSpec, Split
from meshdl.protocol.topics import TopicNames, broadcast_filter, inbox_filter
from meshdl.protocol.topology import Cell


@cache
def _warm_up() -> None:
    """Compile the kernels (`compute.warm_up`) once a process: the hosts after the first
    find them compiled (a simulated 100 x 100 mesh has 10,000 hosts)."""
    compute.warm_up()


def dataset_readings(data: Dataset, cell: Cell) -> dict[int, np.ndarray]:
    """One cell's (samples, channels) log of each split, from a data set on this host."""
    return {Split.TRAIN: cell_series(data.X_train, cell),
            Split.TEST: cell_series(data.X_test, cell)}


class NodeHost:
    """The cells of one process, and the routing of messages to them."""

    def __init__(self, spec: MeshSpec, cells: list[Cell],
                 readings: Callable[[Cell], dict[int, np.ndarray]],
                 clock: Callable[[], float] = lambda: 0.0,
                 local_delivery: bool = True, memory_plan: bool = True,
                 originals: int | None = None) -> None:
        topo = spec.topology
        for cell in cells:
            if not topo.inside(cell):
                raise ValueError(f"cell {cell} is outside the {topo.rows} x {topo.cols} grid")
        self.spec = spec
        # `originals`: the training readings hold mirrors (`NodeMachine`).
        self.nodes = {cell: NodeMachine(spec, cell, readings(cell), memory_plan, originals)
                      for cell in cells}
        _warm_up()
        self.clock = clock
        self.local_delivery = local_delivery
        self.stats: Counter[str] = Counter()
        self.failed: dict[Cell, str] = {}  # isolated cells, with what they raised
        self.topics = TopicNames(spec.mesh_id)

    def subscriptions(self) -> list[str]:
        """What this host's cells receive through the broker: their neighbours' messages
        (only those of other hosts' cells, under local delivery), the edge's
        broadcasts."""
        mesh, topo = self.spec.mesh_id, self.spec.topology
        filters = [inbox_filter(mesh, n, cell) for cell in self.nodes
                   for n in topo.neighbours(cell)
                   if not (self.local_delivery and n in self.nodes)]
        return [*filters, broadcast_filter(mesh)]

    def handle(self, topic: str, message: Message, now: float | None = None
               ) -> list[Message]:
        """Route one decoded message from the broker by its topic; returns what the
        cells send to the edge and to other hosts' cells (under local delivery, the
        messages between this host's own cells are handled within this call). `now`:
        the transport's time (default: the host's clock)."""
        route = self.topics.route(topic)
        if route is None:
            self.stats["rejected:bad_topic"] += 1
            return []
        if not route.agrees_with(message.header):
            self.stats["rejected:topic_mismatch"] += 1
            return []
        now = self.clock() if now is None else now
        dst = route.dst
        if dst == ALL:
            out: list[Message] = []
            for node in self.nodes.values():
                out.extend(self._handle_in(node, message, now))
        else:
            node = self.nodes.get(dst)
            if node is None:
                self.stats["rejected:not_hosted"] += 1
                return []
            out = self._handle_in(node, message, now)
        return self._deliver_locally(out, now) if self.local_delivery else out

    def take(self, message: Message, now: float) -> list[Message]:
        """A message whose receiver the transport already knows, as a radio delivers to
        the node a frame addressed (simulated time): no topic to check; the header's
        destination picks the cell (every hosted one for a broadcast). A cell's failure
        is isolated as in `handle`."""
        dst = message.header.dst
        if dst == ALL:
            out: list[Message] = []
            for node in self.nodes.values():
                out.extend(self._handle_in(node, message, now))
            return out
        node = self.nodes.get(dst)
        if node is None:
            self.stats["rejected:not_hosted"] += 1
            return []
        if dst in self.failed:  # `_handle_in` and `_isolated`, inline: the simulator's
            self.stats["rejected:cell_failed"] += 1  # every message comes this way
            return []
        try:
            return node.handle(message, now)
        except Exception as exc:
            return self._isolate(node, exc)

    def tick(self, now: float | None = None) -> list[Message]:
        """Let every cell give up on what is overdue (best effort: deadlines, hellos);
        returns what they send to the edge and other hosts' cells."""
        now = self.clock() if now is None else now
        out: list[Message] = []
        for node in self.nodes.values():
            due = node.next_deadline()
            if due is not None and due <= now and node.cell not in self.failed:
                out.extend(self._isolated(node, node.tick, now))
        return self._deliver_locally(out, now) if self.local_delivery else out

    def _handle_in(self, node: NodeMachine, message: Message, now: float) -> list[Message]:
        """One cell takes a message. Whatever a message does to a cell stays in that cell:
        a cell whose machine raises is isolated (it takes nothing more) and reported,
        and the host goes on serving the others."""
        if node.cell in self.failed:
            self.stats["rejected:cell_failed"] += 1
            return []
        return self._isolated(node, node.handle, message, now)

    def begin_slot(self, slot: int, now: float | None = None) -> list[Message]:
        """Start time slot `slot`'s wave (`NodeMachine.begin_slot`) in every hosted cell
        that is not in it already (the edge's PARAMS may have started it); returns what
        goes to the edge and other hosts' cells (what the cells send one another is handed
        over here, as `handle` does). `now`: the transport's time (default: the host's
        clock)."""
        now = self.clock() if now is None else now
        out: list[Message] = []
        for cell, node in self.nodes.items():
            if cell in self.failed or node.began(slot):
                continue
            # A cell's failure stays in the cell, as for a message.
            out.extend(self._isolated(node, node.begin_slot, slot, now))
        self.stats["slots_begun"] += 1
        return self._deliver_locally(out, now) if self.local_delivery else out

    def _isolated(self, node: NodeMachine, call: Callable[..., list[Message]],
                  *args: Any) -> list[Message]:
        """`call(*args)` of one cell's machine; if it raises (a bug, whatever the input),
        the cell is isolated and named, never the whole host."""
        try:
            return call(*args)
        except Exception as exc:
            return self._isolate(node, exc)

    def _isolate(self, node: NodeMachine, exc: Exception) -> list[Message]:
        """`node`'s machine raised `exc`: it takes nothing more, and is named."""
        self.failed[node.cell] = f"{type(exc).__name__}: {exc}"[:200]
        self.stats["failed_cells"] += 1
        return []

    def _deliver_locally(self, messages: list[Message], now: float) -> list[Message]:
        """Hand messages between hosted cells over in process (first in, first out: in
        hops, as the broker would); returns those for the edge and other hosts' cells."""
        queue, nodes, remote = deque(messages), self.nodes, []
        local = 0
        while queue:
            message = queue.popleft()
            node = nodes.get(message.header.dst)
            if node is None:
                remote.append(message)
            else:
                local += 1
                queue.extend(self._handle_in(node, message, now))
        self.stats["delivered_locally"] += local
        return remote

    def node_stats(self) -> Counter[str]:
        total = Counter(self.stats)
        for node in self.nodes.values():
            total.update(node.stats)
        return total
