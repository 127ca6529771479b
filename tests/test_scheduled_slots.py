"""Live inference on a schedule: the parameters sent once and cached, every slot's wave
started by the nodes' own clocks with no PARAMS and no BATCH; its predictions are those
of today's flooded waves and of central inference, and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import ModelConfig
from meshdl.errors import MeshdlError
from meshdl.protocol.messages import EDGE, Kind, Message, make
from meshdl.protocol.payloads import REPAIR
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh
from meshdl.sim.radio.device import device
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh
from tests.helpers import noise_dataset, normalized_model

# Slots are numbered by the clock (Unix time // slot length, `meshdl.nodes.live`), far
# past the few waves that brought the parameters.
FIRST_SLOT = 29_478_210
CONFIG = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=8, conv_layers=2, pool=2)


def live_mesh(config: ModelConfig = CONFIG) -> tuple[VirtualMesh, np.ndarray]:
    """A virtual mesh whose nodes have an empty LIVE ring, and a series of readings."""
    data = noise_dataset(config, samples=40)
    empty = np.full((LIVE_SLOTS, config.rows, config.cols), np.nan, np.float32)
    readings = {Split.TRAIN: data.X_train, Split.TEST: data.X_test, Split.LIVE: empty}
    labels = {Split.TRAIN: data.y_train, Split.TEST: data.y_test}
    mesh = VirtualMesh(MeshSpec(1, config), readings, normalized_model(config), labels)
    return mesh, data.X_train


def sample(mesh: VirtualMesh | TimedMesh, series: np.ndarray, slot: int) -> None:
    """Every node reads its sensor at the boundary of slot FIRST_SLOT + `slot`
    (`LiveSampler` does it live)."""
    for (r, c), node in mesh.nodes.items():
        node.record(Split.LIVE, (FIRST_SLOT + slot) % LIVE_SLOTS, series[slot, r, c])


def ring(slot: int) -> np.ndarray:
    return np.array([(FIRST_SLOT + slot) % LIVE_SLOTS])


def test_scheduled_slots_predict_what_flooded_waves_and_central_inference_predict() -> None:
    mesh, series = live_mesh()
    flooded_mesh, _ = live_mesh()
    slots = 12
    scheduled, flooded = [], []
    for slot in range(slots):
        sample(mesh, series, slot)
        sample(flooded_mesh, series, slot)
        result = mesh.run_wave(Mode.INFER, Split.LIVE, ring(slot)) \
            if slot == 0 else mesh.run_slot(FIRST_SLOT + slot)
        scheduled.append(result.logits)
        flooded.append(flooded_mesh.run_wave(Mode.INFER, Split.LIVE, ring(slot)).logits)
    central = mesh.edge.model.forward(series[:slots])
    assert np.array_equal(np.concatenate(scheduled), np.concatenate(flooded))
    np.testing.assert_allclose(np.concatenate(scheduled), central, rtol=1e-5, atol=1e-5)
    assert sum(node.stats["scheduled_slots"] for node in mesh.nodes.values()) == \
        (slots - 1) * len(mesh.nodes)


def test_a_scheduled_slot_sends_no_params_and_no_batch() -> None:
    mesh, series = live_mesh()
    sample(mesh, series, 0)
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    sent: list[Kind] = []
    record = mesh.ledger.record
    mesh.ledger.record = lambda message: (sent.append(message.header.kind), record(message))
    sample(mesh, series, 1)
    mesh.run_slot(FIRST_SLOT + 1)
    assert Kind.PARAMS not in sent and Kind.BATCH not in sent
    assert {Kind.HALO, Kind.POOL, Kind.GATHER} <= set(sent)


def test_the_edge_refuses_a_slot_once_its_model_changed_since_the_last_params() -> None:
    mesh, series = live_mesh()
    sample(mesh, series, 0)
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    mesh.edge.model.flat[0] += 1.0
    with pytest.raises(MeshdlError, match="PARAMS before scheduled slots"):
        mesh.edge.start_slot(FIRST_SLOT + 1)


def test_a_node_without_cached_params_or_reading_starts_no_slot() -> None:
    mesh, series = live_mesh()
    node = mesh.nodes[(2, 2)]
    # Without parameters it asks its tree parent for them (once per slot), and waits.
    asked = node.begin_slot(FIRST_SLOT + 1)
    assert [(m.header.kind, m.header.dst) for m in asked] == [(Kind.HEALTH, node.parent)]
    assert node.begin_slot(FIRST_SLOT + 1) == []
    assert node.stats["rejected:slot_without_params"] == 2
    sample(mesh, series, 0)
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    # Slot 1 was never sampled: its reading is missing, so no made-up number goes out.
    assert node.begin_slot(FIRST_SLOT + 1) == []
    assert node.stats["rejected:no_reading"] == 1
    sample(mesh, series, 1)
    assert node.begin_slot(FIRST_SLOT + 1) != []
    assert node.begin_slot(FIRST_SLOT + 1) == []  # a slot starts once
    assert node.stats["rejected:stale_slot"] == 1


def test_training_waves_after_scheduled_slots_train_as_before() -> None:
    """Scheduled slots leave training alone: the gradient of a training wave after them
    is the central one."""
    mesh, series = live_mesh()
    for slot in range(3):
        sample(mesh, series, slot)
        if slot == 0:
            mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
        else:
            mesh.run_slot(FIRST_SLOT + slot)
    indices = np.arange(4)
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, indices)
    data = noise_dataset(CONFIG, samples=40)
    central = normalized_model(CONFIG)  # the same parameters, never in a mesh
    central.gradient_pass(data.X_train[indices], data.y_train[indices])
    np.testing.assert_allclose(result.grads, central.grad_flat, rtol=1e-4, atol=1e-6)


def timed_live_mesh(loss: float = 0.0, compiled: bool = True) -> tuple[TimedMesh, np.ndarray]:
    data = noise_dataset(CONFIG, samples=40)
    empty = np.full((LIVE_SLOTS, CONFIG.rows, CONFIG.cols), np.nan, np.float32)
    mesh = TimedMesh(MeshSpec(1, CONFIG), {Split.TEST: data.X_test, Split.LIVE: empty},
                     normalized_model(CONFIG), {Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     seed=2, trace=True, loss=FrameLoss(loss, None, 5) if loss else None,
                     compiled=compiled)
    return mesh, data.X_train


@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_scheduled_slots_under_simulated_time_and_drifting_clocks_predict_as_flooded_waves(
        loss: float) -> None:
    """Nodes whose clocks are off by up to +-40 ms start their slots apart: a neighbour's
    halo that comes before a node's slot waits for it. Under 10 % frame loss (reliable
    mode) too, every slot's logits are the flooded waves' of the virtual mesh."""
    timed, series = timed_live_mesh(loss)
    virtual, _ = live_mesh()
    rng = np.random.default_rng(4)
    for slot in range(5):
        sample(timed, series, slot)
        sample(virtual, series, slot)
        flooded = virtual.run_wave(Mode.INFER, Split.LIVE, ring(slot)).logits
        if slot == 0:
            got = timed.run_wave(Mode.INFER, Split.LIVE, ring(slot)).logits
            timed.trace.clear()
        else:
            errors = {cell: float(rng.uniform(-0.04, 0.04)) for cell in timed.nodes}
            got = timed.run_slot(FIRST_SLOT + slot, errors).logits
        assert np.array_equal(got, flooded)
    sent = {Kind(s.kind) for s in timed.trace}
    assert Kind.PARAMS not in sent and Kind.BATCH not in sent
    early = sum(node.stats["buffered_future"] for node in timed.nodes.values())
    assert early > 0  # some halos did come before their receiver's clock reached the slot


@pytest.mark.parametrize("cell", [(2, 3), (0, 0)])
def test_a_node_that_booted_after_the_parameters_gets_them_from_its_parent_alone(
        cell: tuple[int, int]) -> None:
    """A node that crashed and came back has no parameters: at the next slot it asks its
    tree parent (the edge, for the cell the edge is linked to), which sends its cached
    PARAMS to it alone; the slot then completes with the flooded waves' logits."""
    timed, series = timed_live_mesh(compiled=False)  # (nodes go down)
    virtual, _ = live_mesh()
    for slot in range(3):
        sample(timed, series, slot)
        sample(virtual, series, slot)
        flooded = virtual.run_wave(Mode.INFER, Split.LIVE, ring(slot)).logits
        if slot == 0:
            got = timed.run_wave(Mode.INFER, Split.LIVE, ring(slot)).logits
        else:
            if slot == 2:
                timed.kill(cell)
                timed.revive(cell)
                sample(timed, series, slot)  # it reads its sensor as it boots
                timed.trace.clear()
            got = timed.run_slot(FIRST_SLOT + slot).logits
        assert np.array_equal(got, flooded)
    repair = [(Kind(s.kind), s.src, s.receivers) for s in timed.trace
              if s.kind in (Kind.HEALTH, Kind.PARAMS)]
    parent = timed.nodes[cell].parent
    assert repair == [(Kind.HEALTH, cell, (parent,)), (Kind.PARAMS, parent, (cell,))]
    assert timed.nodes[cell].stats["params_repaired"] == 1


def _repair_params(mesh: VirtualMesh, src: tuple[int, int], dst: tuple[int, int]) -> Message:
    cached = mesh.nodes[(0, 0)].cached
    assert cached is not None
    return make(Kind.PARAMS, 1, cached.step, src, dst, cached.payload, phase=REPAIR,
                session=cached.session)


def test_repair_params_come_only_from_the_tree_parent_and_only_when_asked_for() -> None:
    mesh, series = live_mesh()
    sample(mesh, series, 0)
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    node = mesh.nodes[(2, 3)]
    node.cached = None  # as a node that booted after the parameters came
    not_parent = next(n for n in node.neighbours if n != node.parent)
    assert node.handle(_repair_params(mesh, not_parent, node.cell)) == []
    assert node.stats["rejected:bad_params"] == 1
    assert node.handle(_repair_params(mesh, node.parent, node.cell)) == []  # not asked
    assert node.stats["rejected:unasked_repair"] == 1 and node.cached is None
    sample(mesh, series, 1)
    node.begin_slot(FIRST_SLOT + 1)  # asks
    assert node.handle(_repair_params(mesh, node.parent, node.cell)) != []
    assert node.cached is not None and node.stats["params_repaired"] == 1


def test_an_ask_for_parameters_is_answered_only_for_a_tree_child_and_once_a_slot_by_the_edge(
        ) -> None:
    mesh, series = live_mesh()
    sample(mesh, series, 0)
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    parent = mesh.nodes[(1, 1)]
    stranger = next(n for n in parent.neighbours if n not in parent.children)
    own = stranger[0] * CONFIG.cols + stranger[1] + 1
    ask = make(Kind.HEALTH, 1, FIRST_SLOT + 1, stranger, parent.cell,
               np.array([-own], np.int32), phase=REPAIR)
    assert parent.handle(ask) == []
    assert parent.stats["rejected:bad_health"] == 1
    # The edge answers the cell it is linked to, for itself, once per slot.
    edge, at = mesh.edge, mesh.spec.edge_at
    ask = make(Kind.HEALTH, 1, FIRST_SLOT + 1, at, EDGE,
               np.array([-(at[0] * CONFIG.cols + at[1] + 1)], np.int32), phase=REPAIR)
    answer = edge.handle(ask)
    assert [(m.header.kind, m.header.dst, m.header.phase) for m in answer] == \
        [(Kind.PARAMS, at, REPAIR)]
    assert edge.handle(ask) == []  # the same slot again: not answered twice
    other = make(Kind.HEALTH, 1, FIRST_SLOT + 2, at, EDGE, np.array([-7], np.int32),
                 phase=REPAIR)
    assert edge.handle(other) == []  # an ask that names another cell
    assert edge.stats["rejected:bad_health"] == 1


def test_a_flood_that_overtakes_asks_for_parameters_voids_them(
        ) -> None:
    """Over MQTT the first slot's PARAMS may come just after the nodes' clocks started
    it: every node gets the flood, so the asks it overtook are dropped, none answered
    with parameters of its own and none left waiting."""
    mesh, series = live_mesh()
    sample(mesh, series, 0)
    node = mesh.nodes[(1, 1)]
    child = node.children[0]
    asked = node.begin_slot(FIRST_SLOT)  # no parameters yet: it asks
    assert [m.header.kind for m in asked] == [Kind.HEALTH]
    own = child[0] * CONFIG.cols + child[1] + 1
    node.handle(make(Kind.HEALTH, 1, FIRST_SLOT, child, node.cell,
                     np.array([-own], np.int32), phase=REPAIR))
    assert node.asking == {child}
    sent: list[Message] = []
    record = mesh.ledger.record
    mesh.ledger.record = lambda message: (sent.append(message), record(message))
    mesh.run_wave(Mode.INFER, Split.LIVE, ring(0))
    assert node.asking == set() and node.pending_slot is None
    assert [m for m in sent if m.header.kind == Kind.PARAMS and m.header.phase == REPAIR] == []
    assert mesh.nodes[child].cached is not None  # from the flood
