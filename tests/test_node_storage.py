"""A node keeps each field's values in one array per wave and reuses it for the next
wave, but never while a payload it sent still views it: what a receiver holds does not
change under it. The memory plan (nodes/memory.py) gives an inference wave no
gradient buffers and lets an exact training wave's gradients coming down the tree use the
memory of the features that went up."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import ModelConfig
from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.memory import GRADIENTS
from meshdl.protocol.deadlines import Policy
from meshdl.protocol.messages import Kind, Message, make
from meshdl.protocol.spec import MeshSpec, Mode, Split

CONFIG = ModelConfig(rows=4, cols=4, kernel=3, filters=2, hidden=4)
CELL = (1, 1)


RELAY = (0, 1)  # relays its subtree's features: pooled and dpooled
LEADER = (2, 2)  # leads a pooling block and relays features too


def _node(cell: tuple[int, int] = CELL,
          memory_plan: bool = True) -> tuple[NodeMachine, MeshSpec]:
    spec = MeshSpec(1, CONFIG)
    readings = {Split.TRAIN: np.arange(8, dtype=np.float32).reshape(8, 1)}
    return NodeMachine(spec, cell, readings, memory_plan=memory_plan), spec


def _start_wave(node: NodeMachine, spec: MeshSpec, step: int, samples: list[int],
                mode: Mode = Mode.TRAIN) -> list[Message]:
    """PARAMS and BATCH from the tree parent; returns what the node sends at once (its
    own readings' halo strips)."""
    cell = node.cell
    parent = spec.topology.parent[cell]
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0  # std; mean 0: the normalized reading is the reading
    node.handle(make(Kind.PARAMS, 1, step, parent, cell, params))
    batch = np.array([mode, Split.TRAIN, *samples], np.int32)
    sent = node.handle(make(Kind.BATCH, 1, step, parent, cell, batch))
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


def _field_buffer(node: NodeMachine, field: tuple) -> np.ndarray | None:
    return node.wave.buffers[node.plan.buffers[field]]


def test_an_inference_wave_gives_the_gradient_fields_no_memory() -> None:
    node, spec = _node(RELAY)
    _start_wave(node, spec, 1, [0, 1], Mode.INFER)
    for field in node.plan.buffers:
        buffer = _field_buffer(node, field)
        assert (buffer is None) == (field[0] in GRADIENTS), field
    _start_wave(node, spec, 2, [0, 1], Mode.TRAIN)  # a training wave has them all
    assert all(_field_buffer(node, field) is not None for field in node.plan.buffers)


def test_an_exact_training_wave_writes_gradients_over_the_dead_forward_values() -> None:
    node, spec = _node(LEADER)
    _start_wave(node, spec, 1, [0, 1])
    assert _field_buffer(node, ("dpooled",)) is _field_buffer(node, ("pooled",))
    assert _field_buffer(node, ("dz", 2)) is _field_buffer(node, ("a", 1))
    kept = node.wave.kept[1]  # this cell's a_1, apart from its window's memory
    assert kept is not None and np.shares_memory(kept, _field_buffer(node, ("dz", 1)))
    assert _field_buffer(node, ("route",)) is _field_buffer(node, ("a", 2))  # a leader
    assert node.wave.kept[2] is not None  # its own a_2: dz_top's mask
    shared = (("dpooled",), ("dz", 2), ("dz", 1), ("route",))
    alone = [f for f in node.plan.buffers if f not in shared]
    arrays = [id(_field_buffer(node, f)) for f in alone]
    assert len(set(arrays)) == len(arrays)  # nothing else shares


def test_shared_fields_alias_slots_of_one_arena_per_channel_count() -> None:
    """The memory plan as slot aliasing: every field buffer (and kept activation) is a
    range of slots of the node's arena of its channel count, the arrays end to end, and
    two fields that share memory are the same slots."""
    node, spec = _node(LEADER)
    _start_wave(node, spec, 1, [0, 1])
    memory = node.plan.memory(Mode.TRAIN, True)
    views = [b for b in (*node.wave.buffers, *node.wave.kept) if b is not None]
    arenas: dict[int, np.ndarray] = {}
    for view in views:
        assert view.base is not None and view.base.shape[1:] == view.shape[1:]
        assert arenas.setdefault(view.shape[1], view.base) is view.base  # one a count
    assert sorted(a.shape[:2] for a in arenas.values()) == sorted(memory.arenas)
    for arena in arenas.values():  # no slot of an arena left unused
        rows = {(v.__array_interface__["data"][0], v.shape[0]) for v in views
                if v.base is arena}
        assert sum(n for _, n in rows) == arena.shape[0]
    dz2, a1 = _field_buffer(node, ("dz", 2)), _field_buffer(node, ("a", 1))
    assert dz2 is a1 and np.shares_memory(dz2, a1)


def test_best_effort_keeps_the_features_apart_from_the_gradients() -> None:
    """A late GATHER may still come in after the SCATTER there."""
    node, spec = _node(RELAY)
    node.effort.policy = Policy.ZERO
    _start_wave(node, spec, 1, [0, 1])
    buffers = [_field_buffer(node, f) for f in node.plan.buffers]
    assert len({id(b) for b in buffers}) == len(buffers)
    assert all(k is None for k in node.wave.kept)


def test_without_the_memory_plan_every_field_has_its_own_buffer() -> None:
    node, spec = _node(RELAY, memory_plan=False)
    _start_wave(node, spec, 1, [0, 1], Mode.INFER)
    buffers = [_field_buffer(node, f) for f in node.plan.buffers]
    assert all(b is not None for b in buffers) and len({id(b) for b in buffers}) == len(buffers)


@pytest.mark.parametrize("mode, at_most", [("train", 0.8), ("infer", 0.7)])
def test_the_memory_plan_lowers_the_peak_a_wave_allocates(mode, at_most) -> None:
    """tracemalloc over one wave of a 6 x 8 mesh (`meshdl bench memory` measures the
    seed's; the edge's head is in it too)."""
    from meshdl.bench.memory import MemoryCase, measure

    case = MemoryCase(6, 8, 64, mode)
    without, with_plan = measure(case, plan=False), measure(case, plan=True)
    assert with_plan["traced_peak_mb"] <= at_most * without["traced_peak_mb"]
