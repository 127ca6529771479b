"""The parties of one mesh, built once for both drivers: a node host per cell, the edge
machine and the ledger that counts what they send.

The virtual mesh (sim/mesh.py) and the mesh under simulated time (sim/timed.py) move
the same parties' messages, one over a broker in rounds, the other over a radio medium
on a clock; what the parties are, and how each is set up, is decided here alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshdl.data.datasets import cell_series
from meshdl.edge.agent import EdgeMachine
from meshdl.model.cnn import CNN
from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.host import NodeHost
from meshdl.protocol.accounting import Ledger
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topology import Cell


class MeshParties:
    """Every cell's node host (the dead's too: a cell that comes back takes part again
    once the edge's PARAMS bring a plan with it), its node machine, the edge machine
    and the ledger of one mesh."""

    def __init__(self, spec: MeshSpec, readings: dict[int, np.ndarray], model: CNN,
                 labels: dict[int, np.ndarray], memory_plan: bool = True,
                 originals: int | None = None) -> None:
        """`readings[split]` holds maps, (samples, [in_channels,] rows, cols): each node
        gets its cell's. `memory_plan`: the nodes and the edge lay their buffers out by
        the memory plan (nodes/memory.py); False only to measure what it saves
        (`meshdl bench memory`) or to test without it. `originals`: the training maps
        hold mirrors, o x originals + i (`augment.mirrors_of`; a node reads a position
        bias by them), or None."""
        self.spec, self.readings, self.memory_plan = spec, readings, memory_plan
        self.originals = originals
        self.ledger = Ledger(spec)
        # One node host per cell, as one Raspberry Pi per cell: each receives through its
        # own topics, checks them against the headers and isolates a failing cell, on
        # the very path of a deployment (nodes/host.py).
        self.hosts: dict[Cell, NodeHost] = {
            cell: self.host_for(cell) for cell in spec.topology.cells()}
        self.nodes: dict[Cell, NodeMachine] = {
            cell: host.nodes[cell] for cell, host in self.hosts.items()}
        self.edge = EdgeMachine(spec, model, labels, memory_plan=memory_plan)

    def host_for(self, cell: Cell) -> NodeHost:
        """A new node host for `cell`, as it boots: the configured mesh, no wave yet
        (a node that crashed and comes back gets one too)."""
        return NodeHost(self.spec, [cell], cell_readings(self.readings),
                        local_delivery=False, memory_plan=self.memory_plan,
                        originals=self.originals)


def cell_readings(readings: dict[int, np.ndarray]) -> Callable[[Cell], dict[int, np.ndarray]]:
    """A node host's readings: its cell's series of every split."""
    return lambda cell: {split: cell_series(x, cell) for split, x in readings.items()}
