"""Dead cells found and left out in the mesh: the halo relays go around them (a diagonal
whose row-first relay is dead comes column first), the edge knows the cells that never
came up before the first wave (a roll call at commissioning), and from then on the mesh
computes what the central model computes with those cells left out."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import DataConfig, ModelConfig
from meshdl.data.lounge import generate_lounge
from meshdl.edge.agent import EdgeMachine
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.protocol.deadlines import Policy
from meshdl.protocol.messages import EDGE, Kind, make
from meshdl.protocol.payloads import PlanTail
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topology import Topology
from meshdl.sim.besteffort import BestEffort
from meshdl.sim.faults.dead import cell_numbers
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh

ROWS, COLS = 5, 6


def _data():
    return generate_lounge(DataConfig(rows=ROWS, cols=COLS, train=8, test=24, seed=2))


def _model(pool: int | str = "global") -> CNN:
    config = ModelConfig(rows=ROWS, cols=COLS, kernel=3, filters=3, hidden=6, pool=pool)
    model = CNN(config, seed=4)
    model.set_normalization(21.0, 2.0)
    return model


def _mesh(model: CNN, data, dead: frozenset = frozenset(), best_effort=None) -> TimedMesh:
    spec = MeshSpec(1, model.config, (0, 0), "tree", dead=dead)
    return TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test}, model,
                     {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     best_effort=best_effort, compiled=False)


def test_a_diagonal_whose_row_relay_is_dead_comes_column_first() -> None:
    """(2, 2) dead: (1, 2)'s diagonals (2, 1) and (2, 3) would come along row 2 to
    (2, 2), then up its column; they come up their own columns to (1, 1) and (1, 3)
    instead, then along row 1 (phase 2). Every live value of every live window is had."""
    topo = Topology(ROWS, COLS, (0, 0), 2, frozenset({(2, 2)}))
    assert not topo.knows((1, 2), (2, 1)) and not topo.knows((1, 2), (2, 3))
    detours = {(s.src, s.dst): s.cells for cell in topo.members
               for s in topo.strips_from(cell, 1, 1) if s.phase == 2}
    assert detours[((1, 1), (1, 2))] == ((2, 1),)
    assert detours[((1, 3), (1, 2))] == ((2, 3),)
    received = {cell: set() for cell in topo.members}
    for cell in topo.members:
        for s in topo.strips_from(cell, 1, 1):
            received[s.dst].update(s.cells)
    for cell in topo.members:
        had = received[cell] | {cell}
        live = {x for x in topo.window(cell, 1, 1) if x in topo.members}
        assert live <= had, (cell, live - had)


@pytest.mark.parametrize("pool", ["global", 2])
def test_a_mesh_planned_around_its_dead_cells_infers_as_central_with_them_left_out(
        pool) -> None:
    """With the dead cells planned around (every live value of a window had, by the
    relays or a detour), inference in the mesh is the central model's with those cells
    zeroed (`CNN.forward(X, cells)`), to float tolerance."""
    data, model = _data(), _model(pool)
    dead = frozenset({(2, 2), (3, 4), (1, 5)})
    mesh = _mesh(model, data, dead)
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(len(data.y_test)))
    want = model.forward(data.X_test, cell_numbers(dead, COLS))
    np.testing.assert_allclose(result.logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", list(Policy))
def test_cells_down_before_the_first_wave_are_left_out_of_it_by_the_roll_call(
        policy) -> None:
    """Best effort, three nodes down from the start (one of them cutting (4, 5) off):
    the roll call at commissioning answers for the others only, so the first wave's plan
    goes around all four, no message is waited out or filled in, and the wave's logits
    are the central model's with those cells left out, whatever the policy (a value
    the plan left out reads as zero)."""
    data, model = _data(), _model()
    mesh = _mesh(model, data, best_effort=BestEffort(policy))
    down = frozenset({(2, 2), (3, 5), (4, 4)})
    for cell in down:
        mesh.kill(cell)
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(len(data.y_test)))
    assert mesh.edge.spec.dead == down | {(4, 5)}  # (4, 5): up, but only they link it
    assert mesh.filled_in() == 0 and mesh.edge.stats["viewed_down"] == 4
    want = model.forward(data.X_test, cell_numbers(down | {(4, 5)}, COLS))
    np.testing.assert_allclose(result.logits, want, rtol=1e-5, atol=1e-5)


def test_the_edges_view_replans_at_once_and_a_slot_waits_for_params_of_the_new_plan(
        ) -> None:
    """A host's last will says (2, 2) is down: the edge plans around it from the next
    wave, and refuses to schedule a slot on the parameters the nodes cached under the
    old plan until PARAMS carry the new one; back up, it is planned back in."""
    model = _model()
    spec = MeshSpec(1, model.config, (0, 0), "broadcast")
    edge = EdgeMachine(spec, model, {})
    edge.start(Mode.INFER, Split.LIVE, np.array([3]), step=3)
    edge.handle(make(Kind.GATHER, 1, 3, (0, 0), EDGE, np.zeros((1, 3, 1), np.float32)))
    edge.view_down({(2, 2)})
    assert edge.spec.dead == {(2, 2)}
    with pytest.raises(MeshdlError, match="do not hold this plan"):
        edge.start_slot(4)
    sent = edge.start(Mode.INFER, Split.LIVE, np.array([4]), step=4)
    tail = PlanTail.read(sent[0].payload[spec.params_size:], ROWS, COLS)
    assert tail == PlanTail((0, 0), frozenset({(2, 2)}))
    edge.handle(make(Kind.GATHER, 1, 4, (0, 0), EDGE, np.zeros((1, 3, 1), np.float32)))
    assert edge.result is not None
    edge.start_slot(5)  # the nodes hold the new plan now
    edge.view_down(set())
    assert edge.spec.dead == frozenset()


def test_the_edges_view_of_its_own_cell_down_attaches_it_to_the_next() -> None:
    model = _model()
    edge = EdgeMachine(MeshSpec(1, model.config, (0, 0), "broadcast"), model, {})
    edge.attach_options = ((0, 0), (0, 5))
    edge.view_down({(0, 0), (1, 1)})
    assert edge.spec.edge_at == (0, 5) and edge.spec.dead == {(0, 0), (1, 1)}
    with pytest.raises(MeshdlError, match="every other it may attach to"):
        edge.view_down({(0, 0), (0, 5)})


@pytest.mark.parametrize("policy", list(Policy))
def test_a_pooling_block_without_a_live_cell_reads_as_zeros_whatever_the_policy(
        policy) -> None:
    """Block (1, 0) is all dead: the head reads 0 for it (the central model's maximum
    over outputs left out), never a neighbouring block's level or an old one."""
    data, model = _data(), _model(2)
    dead = frozenset({(2, 0), (2, 1), (3, 0), (3, 1)})
    mesh = _mesh(model, data, dead, BestEffort(policy))
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(4))
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(4, 8))
    assert mesh.edge.absent_blocks == [(1, 0)]
    assert not mesh.edge.trace.pooled[:, 1, 0].any()


def test_a_node_that_dies_mid_run_is_planned_around_from_the_wave_after_the_first_it_misses(
        ) -> None:
    """(2, 2) dies between waves: its neighbours find it silent in the first wave it
    misses and report it at once, as their part of that wave ends, so the edge's plan
    leaves it out from the next wave, which fills nothing in and computes what the
    central model does without it."""
    data, model = _data(), _model()
    mesh = _mesh(model, data, best_effort=BestEffort(Policy.ZERO))
    batch = np.arange(8)
    mesh.run_wave(Mode.INFER, Split.TEST, batch)
    mesh.kill((2, 2))
    mesh.run_wave(Mode.INFER, Split.TEST, batch)  # the first it misses: reported
    before = mesh.filled_in()
    result = mesh.run_wave(Mode.INFER, Split.TEST, batch)
    assert mesh.edge.spec.dead == {(2, 2)} and mesh.filled_in() == before
    want = model.forward(data.X_test[batch], cell_numbers({(2, 2)}, COLS))
    np.testing.assert_allclose(result.logits, want, rtol=1e-5, atol=1e-5)
