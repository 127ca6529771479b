"""The wave lifecycles of the edge and of a node (meshdl/protocol/lifecycle.py):
one transition table each, walked by every kind of wave, and a typed error on an event
the table does not allow."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import ModelConfig
from meshdl.edge.agent import EdgeMachine
from meshdl.errors import IllegalTransition
from meshdl.model.cnn import CNN
from meshdl.protocol.deadlines import Margins, Policy
from meshdl.protocol.lifecycle import (
    EDGE_TRANSITIONS,
    NODE_TRANSITIONS,
    EdgeEvent,
    EdgePhase,
    NodeEvent,
    NodePhase,
    next_edge_phase,
)
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh, by_split
from tests.helpers import noise_dataset

P, E = EdgePhase, EdgeEvent
CONFIG = ModelConfig(rows=3, cols=4, kernel=3, filters=2, hidden=4)
SPEC = MeshSpec(1, CONFIG, (0, 0), "tree")
NO_MARGIN = Margins(0.0, 0.0)

# What the edge's code can do in each phase: the table must say where each leads.
CAN_SEE = {
    P.IDLE: {E.START},
    P.AWAITING_GATHER: {E.START, E.RESTART, E.GATHERED_TRAIN, E.GATHERED_INFER,
                        E.GATHER_FILLED, E.GATHER_MISSED},
    P.AWAITING_REDUCE: {E.START, E.RESTART, E.REDUCED, E.REDUCE_MISSED},
    P.DONE: {E.START},
    P.SKIPPED: {E.START},
}


def _recorded(edge: EdgeMachine) -> list[tuple[EdgeEvent, EdgePhase]]:
    """The (event, new phase) of every move `edge` makes from now on."""
    walk: list[tuple[EdgeEvent, EdgePhase]] = []
    move = edge._move

    def recording(event: EdgeEvent) -> None:
        move(event)
        walk.append((event, edge.phase))

    edge._move = recording  # type: ignore[method-assign]
    return walk


def _mesh() -> VirtualMesh:
    data = noise_dataset(CONFIG, samples=8)
    readings, labels = by_split(data)
    model = CNN(CONFIG, seed=2)
    model.set_normalization(20.0, 3.0)
    return VirtualMesh(SPEC, readings, model, labels)


def _edge(**kwargs) -> EdgeMachine:
    return EdgeMachine(SPEC, CNN(CONFIG), {Split.TRAIN: np.zeros(8, np.int64),
                                           Split.TEST: np.zeros(8, np.int64)}, **kwargs)


def test_the_table_says_where_every_event_a_phase_can_see_leads_and_no_more() -> None:
    by_phase: dict[EdgePhase, set[EdgeEvent]] = {phase: set() for phase in P}
    for phase, event in EDGE_TRANSITIONS:
        by_phase[phase].add(event)
    assert by_phase == CAN_SEE
    reached, frontier = {P.IDLE}, [P.IDLE]  # every phase is reachable from IDLE ...
    while frontier:
        phase = frontier.pop()
        for event in CAN_SEE[phase]:
            if (after := EDGE_TRANSITIONS[(phase, event)]) not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(P)
    # ... and from every phase the next request starts a wave.
    assert all(EDGE_TRANSITIONS[(phase, E.START)] == P.AWAITING_GATHER for phase in P)


def test_a_training_wave_walks_gather_then_reduce_to_done() -> None:
    mesh = _mesh()
    walk = _recorded(mesh.edge)
    assert mesh.edge.phase == P.IDLE
    result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert walk == [(E.START, P.AWAITING_GATHER), (E.GATHERED_TRAIN, P.AWAITING_REDUCE),
                    (E.REDUCED, P.DONE)]
    assert mesh.edge.result is result and result.grads is not None


def test_an_inference_wave_ends_at_its_gather() -> None:
    mesh = _mesh()
    walk = _recorded(mesh.edge)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    walk.clear()
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(3))
    assert walk == [(E.START, P.AWAITING_GATHER), (E.GATHERED_INFER, P.DONE)]
    assert result.logits.shape == (3, CONFIG.classes)


def test_a_wave_that_times_out_restarts_awaiting_its_gather_again() -> None:
    edge = _edge(wave_timeout=10.0)
    walk = _recorded(edge)
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4), now=0.0)
    assert edge.tick(9.9) == []
    assert edge.tick(10.0)  # PARAMS and BATCH again, under the next step
    assert walk == [(E.START, P.AWAITING_GATHER), (E.RESTART, P.AWAITING_GATHER)]
    assert edge.attempts == 2 and edge.result is None


def test_best_effort_skips_a_training_step_and_fills_in_an_inference_gather() -> None:
    edge = _edge()
    walk = _recorded(edge)
    edge.set_deadlines(Policy.ZERO, Mode.TRAIN, 4, 2.0, 1.0, NO_MARGIN, k=0.0)
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4), now=0.0)
    edge.tick(2.0)
    assert walk == [(E.START, P.AWAITING_GATHER), (E.GATHER_MISSED, P.SKIPPED)]
    assert edge.result is not None and edge.result.skipped
    assert edge.tick(3.0) == [] and edge.phase == P.SKIPPED  # nothing more to give up
    walk.clear()
    edge.set_deadlines(Policy.ZERO, Mode.INFER, 4, 2.0, None, NO_MARGIN, k=0.0)
    edge.start(Mode.INFER, Split.TEST, np.arange(4), now=10.0)
    edge.tick(12.0)
    assert walk == [(E.START, P.AWAITING_GATHER), (E.GATHER_FILLED, P.DONE)]
    assert edge.result is not None and not edge.result.skipped


def test_best_effort_fills_in_a_reduce_that_missed_its_deadline() -> None:
    mesh = _mesh()
    edge = mesh.edge
    edge.set_deadlines(Policy.ZERO, Mode.TRAIN, 4, 1e9, 1.0, NO_MARGIN, k=0.0)
    walk = _recorded(edge)
    mesh.send(edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4)))
    while edge.phase == P.AWAITING_GATHER:
        mesh.deliver_round()
    assert edge.phase == P.AWAITING_REDUCE
    edge.tick(edge.backward_at + 1.0)
    assert walk == [(E.START, P.AWAITING_GATHER), (E.GATHERED_TRAIN, P.AWAITING_REDUCE),
                    (E.REDUCE_MISSED, P.DONE)]
    assert edge.result is not None and edge.stats["filled_in:reduce"] == 1


def test_an_event_the_table_does_not_allow_raises_and_moves_nothing() -> None:
    edge = _edge()
    with pytest.raises(IllegalTransition) as raised:
        edge._move(E.REDUCED)
    assert raised.value.phase == P.IDLE and raised.value.event == E.REDUCED
    assert edge.phase == P.IDLE and "REDUCED" in str(raised.value)
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4))
    with pytest.raises(IllegalTransition):
        edge._move(E.REDUCE_MISSED)  # no SCATTER went: there is no REDUCE to miss
    assert edge.phase == P.AWAITING_GATHER
    for phase in (P.DONE, P.SKIPPED):
        with pytest.raises(IllegalTransition):
            next_edge_phase(phase, E.RESTART)  # a finished wave is not restarted


# ------------------------------------------------------------------------ a node
N, V = NodePhase, NodeEvent
NODE_CAN_SEE = {
    N.AWAITING_CONTROL: {V.STARTED, V.SUPERSEDED},
    N.FORWARD: {V.FORWARD_DONE, V.FINISHED, V.SUPERSEDED},
    N.BACKWARD: {V.FINISHED, V.SUPERSEDED},
    N.DONE: set(),  # the next wave replaces it: nothing happens to this one
    N.ABANDONED: set(),
}


def _node_walks(mesh: VirtualMesh) -> dict[tuple, list[tuple[NodeEvent, NodePhase]]]:
    """Per node, the (event, new phase) of every move of its waves from now on."""
    walks: dict[tuple, list[tuple[NodeEvent, NodePhase]]] = {}
    for cell, node in mesh.nodes.items():
        walk = walks[cell] = []

        def recording(wave, event: NodeEvent, move=node._move, walk=walk) -> None:
            move(wave, event)
            walk.append((event, wave.phase))

        node._move = recording  # type: ignore[method-assign]
    return walks


def test_the_node_table_says_where_every_event_a_phase_can_see_leads() -> None:
    by_phase: dict[NodePhase, set[NodeEvent]] = {phase: set() for phase in N}
    for phase, event in NODE_TRANSITIONS:
        by_phase[phase].add(event)
    assert by_phase == NODE_CAN_SEE
    assert {NODE_TRANSITIONS[key] for key in NODE_TRANSITIONS} == set(N) - {N.AWAITING_CONTROL}


def test_every_node_walks_forward_then_backward_in_training_and_forward_in_inference(
        ) -> None:
    mesh = _mesh()
    walks = _node_walks(mesh)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    for cell, walk in walks.items():
        assert walk == [(V.STARTED, N.FORWARD), (V.FORWARD_DONE, N.BACKWARD),
                        (V.FINISHED, N.DONE)], cell
        assert mesh.nodes[cell].wave.phase == N.DONE
        walk.clear()
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(3))
    for cell, walk in walks.items():
        assert walk == [(V.STARTED, N.FORWARD), (V.FINISHED, N.DONE)], cell


def test_a_node_abandons_a_wave_a_later_one_replaces() -> None:
    mesh = _mesh()
    walks = _node_walks(mesh)
    mesh.send(mesh.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4)))
    while mesh.edge.phase == P.AWAITING_GATHER:
        mesh.deliver_round()
    # The edge gives up on this wave: the next one's PARAMS replace it at every node.
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    abandoned = [cell for cell, walk in walks.items()
                 if (V.SUPERSEDED, N.ABANDONED) in walk]
    assert abandoned and all(mesh.nodes[c].stats["abandoned_waves"] == 1 for c in abandoned)
    assert all(walk[-1] == (V.FINISHED, N.DONE) for walk in walks.values())


def test_an_event_the_node_table_does_not_allow_raises() -> None:
    mesh = _mesh()
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(3))
    node = next(iter(mesh.nodes.values()))
    with pytest.raises(IllegalTransition) as raised:
        node._move(node.wave, V.FORWARD_DONE)  # a finished wave has no forward left
    assert raised.value.phase == N.DONE and node.wave.phase == N.DONE
