"""A node keeps each field's values in one array per wave and reuses it for the next
wave, but never while a payload it sent still views it: what a receiver holds does not
change under it."""

from __future__ import annotations

import numpy as np

from meshdl import ModelConfig
from meshdl.messages import Kind, Message, make
from meshdl.nodes.agent import NodeMachine
from meshdl.protocol import MeshSpec, Mode, Split

CONFIG = ModelConfig(rows=4, cols=4, kernel=3, filters=2, hidden=4)
CELL = (1, 1)


def _node() -> tuple[NodeMachine, MeshSpec]:
    spec = MeshSpec(1, CONFIG)
    readings = {Split.TRAIN: np.arange(8, dtype=np.float32).reshape(8, 1)}
    return NodeMachine(spec, CELL, readings), spec


def _start_wave(node: NodeMachine, spec: MeshSpec, step: int, samples: list[int]
                ) -> list[Message]:
    """PARAMS and BATCH from the tree parent; returns what the node sends at once (its
    own readings' halo strips)."""
    parent = spec.topology.parent[CELL]
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0  # std; mean 0: the normalized reading is the reading
    node.handle(make(Kind.PARAMS, 1, step, parent, CELL, params))
    batch = np.array([Mode.TRAIN, Split.TRAIN, *samples], np.int32)
    sent = node.handle(make(Kind.BATCH, 1, step, parent, CELL, batch))
    halo = [m for m in sent if m.kind == Kind.HALO]
    assert halo, "a started node sends its readings to its neighbours"
    return halo


def test_a_sent_payload_kept_by_a_receiver_never_changes_in_later_waves() -> None:
    node, spec = _node()
    kept = _start_wave(node, spec, 1, [0, 1])
    before = [m.payload.copy() for m in kept]
    later = _start_wave(node, spec, 2, [6, 7])  # same batch size, other readings
    for message, values in zip(kept, before, strict=True):
        np.testing.assert_array_equal(message.payload, values)
    assert not np.array_equal(later[0].payload, before[0])
    assert node.wave.buffers is not None and all(
        not np.shares_memory(message.payload, buffer)
        for message in kept for buffer in node.wave.buffers)


def test_buffers_are_reused_once_nothing_outside_the_node_views_them() -> None:
    node, spec = _node()
    _start_wave(node, spec, 1, [0, 1])  # its messages are dropped at once
    first = node.wave.buffers
    _start_wave(node, spec, 2, [2, 3])
    assert node.wave.buffers is first
    _start_wave(node, spec, 3, [2, 3, 4])  # another batch size needs other buffers
    assert node.wave.buffers is not first
