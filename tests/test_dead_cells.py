"""Dead cells: the plan goes around them (tree, pooling leaders and routes, halo
relays), what only they could give is filled in, and training goes on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig, ModelConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.protocol.deadlines import Policy
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topology import Topology
from meshdl.sim.besteffort import BestEffort
from meshdl.sim.faults.dead import DeadCells
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine, sim_report
from meshdl.sim.timed import TimedMesh
from meshdl.training.loop import train


def test_the_tree_and_the_halo_relays_go_around_a_dead_cell() -> None:
    """3 x 3, the centre dead: (1, 2) hangs under (0, 2) now, and no halo strip goes to
    or through the centre; (1, 0) cannot have (1, 2)'s value (only the centre relayed
    it along the row) but has (0, 2)'s, relayed down its column from (0, 0)."""
    topo = Topology(3, 3, (0, 0), 2, frozenset({(1, 1)}))
    assert (1, 1) not in topo.members and topo.absent == {(1, 1)}
    assert topo.parent[(1, 2)] == (0, 2) and topo.parent[(2, 1)] == (2, 0)
    assert (1, 1) not in topo.neighbours((1, 0))
    assert not topo.knows((1, 0), (1, 2)) and topo.knows((1, 0), (0, 2))
    assert topo.knows((1, 0), (0, 0)) and not topo.knows((1, 0), (1, 1))
    for cell in topo.members:
        for strip in topo.strips_from(cell, 1, 1):
            assert strip.dst != (1, 1) and (1, 1) not in strip.cells
            assert all(topo.knows(cell, x) for x in strip.cells)


def test_cells_only_dead_ones_link_to_the_edge_are_cut_off() -> None:
    topo = Topology(3, 3, (0, 0), 2, frozenset({(1, 2), (2, 1)}))
    assert topo.cut_off == {(2, 2)} and topo.absent == {(1, 2), (2, 1), (2, 2)}


def test_a_block_pools_its_members_that_reach_its_leader_around_the_dead() -> None:
    """4 x 4, pool 2: in block (0, 1) the leader (0, 2) reaches (1, 3) through (0, 3)
    when (1, 2) is dead; a block all dead has no leader."""
    dead = frozenset({(1, 2), (2, 0), (2, 1), (3, 0), (3, 1)})
    topo = Topology(4, 4, (0, 0), 2, dead)
    assert topo.leader[(0, 1)] == (0, 2)
    assert topo.pool_members((0, 1)) == [(0, 2), (0, 3), (1, 3)]
    assert topo.block_parent((1, 3)) == (0, 3)
    assert (1, 0) not in topo.leader
    assert (1, 0) not in topo.tree_blocks(topo.edge_at)


def test_without_dead_cells_the_plan_is_the_full_grids() -> None:
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=4)
    assert MeshSpec(1, config).sends == MeshSpec(1, config, dead=frozenset()).sends


def test_dead_cells_are_picked_by_seed_and_never_the_edges() -> None:
    cells = [(r, c) for r in range(4) for c in range(5)]
    picked = DeadCells(fraction=0.5, seed=3).pick(cells, (0, 0))
    assert len(picked) == 10 and (0, 0) not in picked
    assert picked == DeadCells(fraction=0.5, seed=3).pick(cells, (0, 0))
    assert picked != DeadCells(fraction=0.5, seed=4).pick(cells, (0, 0))


def _mesh(dead: frozenset, data, best_effort=None) -> TimedMesh:
    config = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree", dead=dead)
    return TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(config, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     best_effort=best_effort)


@pytest.mark.parametrize("policy", [None, *Policy])
def test_a_dead_cells_readings_never_reach_the_result(policy) -> None:
    """Whatever a dead cell's sensor log holds, the wave's gradients are the same: its
    reading is a missing input, filled in by the policy (zeros without one)."""
    dead = frozenset({(1, 2), (3, 0), (2, 4)})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=8, test=2, seed=1))
    grads = []
    for scale in (1.0, 100.0):
        changed = data.X_train.copy()
        for r, c in dead:
            changed[:, r, c] *= scale
        data_here = dataclasses.replace(data, X_train=changed)
        mesh = _mesh(dead, data_here, BestEffort(policy) if policy else None)
        result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
        assert set(mesh.down) == dead  # down from the start
        assert all(n.stats["absent_filled"] > 0 for c, n in mesh.nodes.items()
                   if c not in dead and
                   any(x in dead for x in mesh.spec.topology.window(c, 1, 1)))
        grads.append(result.grads.copy())
    assert np.array_equal(grads[0], grads[1])


def test_a_block_without_a_live_cell_is_filled_in_at_the_edge() -> None:
    dead = frozenset({(2, 0), (2, 1), (3, 0), (3, 1)})  # block (1, 0), all of it
    data = generate_lounge(DataConfig(rows=4, cols=5, train=8, test=2, seed=1))
    mesh = _mesh(dead, data, BestEffort(Policy.NEIGHBOURS))
    mesh.run_wave(Mode.INFER, Split.TRAIN, np.arange(4))
    assert mesh.edge.absent_blocks == [(1, 0)]
    assert mesh.edge.stats["absent_blocks_filled"] == 1
    assert (1, 0) not in mesh.spec.topology.leader  # nothing gathers it


def test_training_with_dead_cells_goes_on_and_names_them() -> None:
    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8, "filters": 2},
                             train={"epochs": 1, "batch": 8, "seed": 1})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=24, test=8, seed=3))
    dead = frozenset({(1, 1), (3, 4)})
    engine = SimEngine(training_data(config.train, data), profile("802.15.4"), "shared",
                       device("cortex-m4"), device("pi4"), known_dead=dead,
                       best_effort=BestEffort(Policy.NEIGHBOURS))
    model, history = train(config, data, engine=engine)
    faults = sim_report(engine.mesh, Mode.TRAIN)["faults"]
    assert faults["dead_cells"] == ["r1c1", "r3c4"] and faults["cut_off_cells"] == []
    assert faults["absent_filled"] > 0
    assert np.isfinite(model.flat).all() and history.epochs[0].skipped_steps == 0
    assert "r1c1" not in sim_report(engine.mesh, Mode.TRAIN)["energy_j"]["per_node"]


# ------------------------------------------------------------ at runtime
def _live_mesh(policy=Policy.ZERO) -> TimedMesh:
    data = generate_lounge(DataConfig(rows=4, cols=5, train=8, test=2, seed=1))
    return _mesh(frozenset(), data, BestEffort(policy))


def test_a_node_dying_mid_wave_leaves_a_wave_that_finishes_with_fill_ins() -> None:
    mesh = _live_mesh()
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    start = mesh.queue.now
    mesh.queue.at(start + 0.05, mesh.kill, (2, 2))  # while the forward pass runs
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert (2, 2) in mesh.down and mesh.filled_in() > 0
    assert result.skipped or np.isfinite(result.grads).all()
    # Its frames find no one: never acknowledged, retried, given up.
    faults = mesh.medium.faults
    assert faults["frames_lost"] > 0 and faults["messages_lost"] + faults["messages_expired"] > 0


def test_the_plan_the_edge_announces_with_the_parameters_is_every_nodes() -> None:
    """The edge replans without a dead cell: the next wave's PARAMS carry the plan, each
    node takes it on the way and the wave completes without the dead one; once it is
    back and the edge takes it in again, the nodes go back to the full plan."""
    mesh = _live_mesh()
    full = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4)).grads.copy()
    mesh.kill((2, 2))
    mesh.edge.replan((0, 0), frozenset({(2, 2)}))
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    live = [n for c, n in mesh.nodes.items() if c != (2, 2)]
    assert all(n.spec.dead == {(2, 2)} and n.stats["replanned"] == 1 for n in live)
    assert all(n.wave is not None and n.wave.finished_at.get("finished") for n in live)
    assert not result.skipped and mesh.edge.stats["filled_in:reduce"] == 0
    mesh.revive((2, 2))
    mesh.edge.replan((0, 0), frozenset())
    back = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert all(n.spec.dead == frozenset() for n in mesh.nodes.values())
    assert mesh.nodes[(2, 2)].wave.finished_at.get("finished")
    assert np.array_equal(back.grads, full)  # the same batch and parameters: the same


def test_a_params_tail_that_is_not_a_plan_is_rejected() -> None:
    from meshdl.nodes.agent import NodeMachine
    from meshdl.protocol.messages import make
    from meshdl.protocol.payloads import PlanTail

    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config)
    node = NodeMachine(spec, (1, 1), {Split.TRAIN: np.zeros((4, 1), np.float32)})
    params = spec.params_layout.pack(CNN(config).flat, np.zeros(1), np.ones(1))
    for tail in ([0, 2, 4], [0, 1, 99], [0, 1, 4.5], [4, 0], [0, 2, 5, 4], [0, 1, 0]):
        payload = np.concatenate([params, np.array(tail, np.float32)])
        node.handle(make(Kind.PARAMS, 1, 1, (0, 1), (1, 1), payload), 0.0)
    assert node.stats["rejected:bad_params"] == 6 and node.spec is spec
    good = PlanTail((0, 0), frozenset({(2, 2)})).pack(3)
    assert PlanTail.read(good, 3, 3) == PlanTail((0, 0), frozenset({(2, 2)}))


def test_a_dead_node_is_found_by_its_silence_planned_around_and_taken_back() -> None:
    """(2, 2) crashes: after a silent wave its neighbours report it up the tree, the
    edge leaves it out of the next wave's plan (its children hang under others now)
    and says so in the PARAMS; rebooted, it says hello, and the edge takes it back."""
    mesh = _live_mesh()
    batch = np.arange(4)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    mesh.kill((2, 2))
    for _ in range(4):
        result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
        if mesh.edge.spec.dead:
            break
    assert mesh.edge.spec.dead == {(2, 2)}
    assert mesh.edge.stats["health_reports"] > 0
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    live = [n for c, n in mesh.nodes.items() if c != (2, 2)]
    assert all(n.spec.dead == {(2, 2)} for n in live)
    assert not result.skipped
    mesh.revive((2, 2))
    for _ in range(8):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
        if not mesh.edge.spec.dead:
            break
    assert mesh.edge.spec.dead == frozenset() and mesh.nodes[(2, 2)].stats["hellos"] > 0
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    assert mesh.nodes[(2, 2)].wave is not None  # it takes part again


def test_when_its_own_cell_dies_the_edge_attaches_to_the_next() -> None:
    data = generate_lounge(DataConfig(rows=4, cols=5, train=8, test=2, seed=1))
    config = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree")
    mesh = TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(config, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     best_effort=BestEffort(Policy.ZERO), attach=((0, 4),))
    batch = np.arange(4)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    mesh.kill((0, 0))
    skipped = 0
    for _ in range(6):
        skipped += mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch).skipped
        if mesh.edge.spec.edge_at == (0, 4):
            break
    assert mesh.edge.spec.edge_at == (0, 4) and (0, 0) in mesh.edge.spec.dead
    assert mesh.edge.stats["reattached"] == 1 and skipped >= 2
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    assert not result.skipped and mesh.nodes[(0, 4)].parent == EDGE


def test_a_cell_cut_from_its_blocks_leader_is_pooled_by_nobody_and_the_wave_runs() -> None:
    dead = frozenset({(0, 3), (1, 2)})  # block (0, 1): (1, 3) cannot reach (0, 2)
    topo = Topology(4, 5, (0, 0), 2, dead)
    assert (1, 3) in topo.members and topo.pool_members((0, 1)) == [(0, 2)]
    data = generate_lounge(DataConfig(rows=4, cols=5, train=8, test=2, seed=1))
    mesh = _mesh(dead, data, BestEffort(Policy.NEIGHBOURS))
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert not result.skipped and np.isfinite(result.grads).all()
    assert mesh.nodes[(1, 3)].wave.finished_at.get("finished")


def test_a_node_killed_with_messages_waiting_for_its_cpu_stops_cleanly() -> None:
    mesh = _live_mesh()
    mesh.slowdown = {(1, 1): 1000.0}  # its CPU backs up with messages
    start = mesh.queue.now
    mesh.queue.at(start + 0.2, mesh.kill, (1, 1))
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert result.skipped or np.isfinite(result.grads).all()
    mesh.revive((1, 1))
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))


def test_an_old_or_forged_params_with_a_plan_tail_changes_no_nodes_plan() -> None:
    from meshdl.nodes.agent import NodeMachine
    from meshdl.protocol.messages import make
    from meshdl.protocol.payloads import PlanTail

    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config)
    node = NodeMachine(spec, (1, 1), {Split.TRAIN: np.zeros((4, 1), np.float32)})
    parent = spec.topology.parent[(1, 1)]
    params = spec.params_layout.pack(CNN(config).flat, np.zeros(1), np.ones(1))
    tail = PlanTail((0, 0), frozenset({(2, 2)})).pack(3)
    node.handle(make(Kind.PARAMS, 1, 6, parent, (1, 1), params), 0.0)
    for step, mesh_id, src in ((5, 1, parent), (7, 9, parent), (7, 1, (9, 9))):
        node.handle(make(Kind.PARAMS, mesh_id, step, src, (1, 1),
                         np.concatenate([params, tail])), 0.0)
        assert node.spec is spec and node.wave.step == 6
    assert not node.stats["replanned"]


def test_a_health_naming_no_cell_of_the_grid_is_rejected() -> None:
    from meshdl.edge.agent import EdgeMachine
    from meshdl.protocol.messages import make

    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    edge = EdgeMachine(MeshSpec(1, config), CNN(config), {Split.TRAIN: np.zeros(4, np.int64)})
    for entries in ([np.iinfo(np.int32).min], [0], [10], [-10], list(range(1, 70))):
        edge.handle(make(Kind.HEALTH, 1, 0, (0, 0), EDGE, np.array(entries, np.int32)))
    assert edge.stats["rejected:bad_health"] == 5
    assert not edge.suspects and not edge.comebacks


def test_a_neighbour_whose_messages_come_late_is_not_reported_silent() -> None:
    from tests.test_best_effort import MISSING, _halos, _node, _start

    spec, node = _node(Policy.ZERO)
    for step in (1, 2, 3):
        _start(spec, node, step, now=10.0 * step)
        _halos(spec, node, step, 10.0 * step + 0.5, 1.0, but=MISSING)
        node.tick(10.0 * step + 9.0)  # (1, 0)'s halo filled in ...
        node.handle(make_halo(step), 10.0 * step + 9.5)  # ... and then it comes
    assert node.stats["late"] == 3 and node.effort.silent[(1, 0)] == 0


def make_halo(step: int):
    from meshdl.protocol.messages import make

    return make(Kind.HALO, 1, step, (1, 0), (1, 1), np.ones((1, 1, 4), np.float32), layer=1)


def test_a_node_taking_part_in_a_wave_never_says_hello_however_long_it_runs() -> None:
    from tests.test_best_effort import _node, _start

    spec, node = _node(Policy.ZERO)
    node.effort.hello_after = 1.0
    assert node.next_deadline() == pytest.approx(1.0)  # booted, no wave: hello is due
    assert len(node.tick(1.0)) == 4 and node.stats["hellos"] == 1  # to each neighbour
    _start(spec, node, 1, now=2.0)
    node.tick(1000.0)  # its wave long overdue: it fills in, it does not say hello
    assert node.stats["hellos"] == 1 and node.stats["filled_in"] > 0


def test_a_node_down_between_two_waves_draws_no_power_for_exactly_that_time() -> None:
    mesh = _live_mesh()
    batch = np.arange(4)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    mesh.kill((3, 4))
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    wave = mesh.waves[-1]
    mesh.revive((3, 4))
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, batch)
    assert mesh.usage[Mode.TRAIN].down[(3, 4)] == pytest.approx(wave.end - wave.start)
    faults = sim_report(mesh, Mode.TRAIN)["faults"]
    assert {"messages_lost", "messages_expired", "messages_to_dead"} <= set(faults)
