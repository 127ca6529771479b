"""The two wave lifecycles, after h11's `_state.py`: a node's and the edge's phases,
the events that move them, and one transition table each; `IllegalTransition` for a move
a table does not have.

A node's wave (`nodes/agent.py`, `Wave.phase`, changed only by `NodeMachine._move`):

    AWAITING_CONTROL --STARTED--> FORWARD         PARAMS and BATCH both in hand
    FORWARD --FORWARD_DONE--> BACKWARD            training: this node's forward tasks ran
    FORWARD --FINISHED--> DONE                    inference: every task ran
    BACKWARD --FINISHED--> DONE                   training: every task ran
    AWAITING_CONTROL | FORWARD | BACKWARD --SUPERSEDED--> ABANDONED
                                                  a later wave's PARAMS, or a new plan

A wave begins AWAITING_CONTROL when the first PARAMS of its step come (a node has no
wave before, nor after a PARAMS that brings another plan). Messages that move nothing
(items stored in their slots, duplicates, stale, early ones buffered) are not events.

The edge (`edge/agent.py`, `EdgeMachine.phase`, changed only by `EdgeMachine._move`):

    IDLE --START--> AWAITING_GATHER          PARAMS and BATCH sent
    AWAITING_GATHER --GATHERED_TRAIN--> AWAITING_REDUCE   head ran, SCATTER sent
    AWAITING_GATHER --GATHERED_INFER--> DONE              head ran: logits
    AWAITING_GATHER --GATHER_FILLED--> DONE               inference, GATHER overdue
    AWAITING_GATHER --GATHER_MISSED--> SKIPPED            training, GATHER overdue
    AWAITING_REDUCE --REDUCED--> DONE                     conv gradients in
    AWAITING_REDUCE --REDUCE_MISSED--> DONE               REDUCE overdue: conv gets 0
    AWAITING_* --RESTART--> AWAITING_GATHER  nothing heard for the wave timeout
    any --START--> AWAITING_GATHER           the next request (an unfinished wave is
                                             dropped: its caller gave up on it)

Messages that move nothing (stale, late, duplicate, HEALTH) are not events: the edge
counts them and stays where it is.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from meshdl.errors import IllegalTransition

PhaseT = TypeVar("PhaseT", bound=Enum)


def transition(table: dict[tuple[PhaseT, Enum], PhaseT], machine: str, phase: PhaseT,
               event: Enum) -> PhaseT:
    """The phase `event` moves `machine` to from `phase`, by `table`."""
    try:
        return table[(phase, event)]
    except KeyError:
        raise IllegalTransition(machine, phase, event) from None


# ------------------------------------------------------------------ a node's wave
class NodePhase(Enum):
    AWAITING_CONTROL = "awaiting control"  # PARAMS or BATCH still to come
    FORWARD = "forward"  # started: forward tasks still to run
    BACKWARD = "backward"  # training: forward tasks done, backward ones to run
    DONE = "done"  # every task of the wave's mode ran
    ABANDONED = "abandoned"  # replaced before it was done


class NodeEvent(Enum):
    STARTED = "started"
    FORWARD_DONE = "forward done"
    FINISHED = "finished"
    SUPERSEDED = "superseded"


P, E = NodePhase, NodeEvent

NODE_TRANSITIONS: dict[tuple[NodePhase, NodeEvent], NodePhase] = {
    (P.AWAITING_CONTROL, E.STARTED): P.FORWARD,
    (P.AWAITING_CONTROL, E.SUPERSEDED): P.ABANDONED,
    (P.FORWARD, E.FORWARD_DONE): P.BACKWARD,
    (P.FORWARD, E.FINISHED): P.DONE,
    (P.FORWARD, E.SUPERSEDED): P.ABANDONED,
    (P.BACKWARD, E.FINISHED): P.DONE,
    (P.BACKWARD, E.SUPERSEDED): P.ABANDONED,
}

del P, E


def next_node_phase(phase: NodePhase, event: NodeEvent) -> NodePhase:
    """The phase `event` moves a node's wave to from `phase`; `IllegalTransition` if the
    table has no such move."""
    return transition(NODE_TRANSITIONS, "node", phase, event)


def node_wave_events(training: bool) -> tuple[NodeEvent, ...]:
    """The events of a node's wave that runs every task of its mode, in order (a wave the
    compiled dispatch runs moves through them at once: sim/compiled.py)."""
    if training:
        return NodeEvent.STARTED, NodeEvent.FORWARD_DONE, NodeEvent.FINISHED
    return NodeEvent.STARTED, NodeEvent.FINISHED


def node_phase_after(events: tuple[NodeEvent, ...],
                     phase: NodePhase = NodePhase.AWAITING_CONTROL) -> NodePhase:
    """The phase `events` move a node's wave to from `phase`, one by one by the table."""
    for event in events:
        phase = next_node_phase(phase, event)
    return phase


# ---------------------------------------------------------------------- the edge
class EdgePhase(Enum):
    IDLE = "idle"  # no wave asked for yet
    AWAITING_GATHER = "awaiting gather"  # the wave's PARAMS and BATCH are out
    AWAITING_REDUCE = "awaiting reduce"  # training: the SCATTER is out
    DONE = "done"  # a result: logits, and in training loss and gradients
    SKIPPED = "skipped"  # best effort, training: no pooled features by the deadline


class EdgeEvent(Enum):
    START = "start"  # `start`: a new request, its first attempt
    RESTART = "restart"  # `tick`: the wave timed out, the same batch under a new step
    GATHERED_TRAIN = "gathered (train)"  # a GATHER in a training wave
    GATHERED_INFER = "gathered (infer)"  # a GATHER in an inference wave
    GATHER_FILLED = "gather filled in"  # inference: GATHER overdue, the policy's features
    GATHER_MISSED = "gather missed"  # training: GATHER overdue, the step is skipped
    REDUCED = "reduced"  # the REDUCE: the conv layers' summed gradients
    REDUCE_MISSED = "reduce missed"  # REDUCE overdue: the conv layers get no gradient


P, E = EdgePhase, EdgeEvent

EDGE_TRANSITIONS: dict[tuple[EdgePhase, EdgeEvent], EdgePhase] = {
    (P.IDLE, E.START): P.AWAITING_GATHER,
    (P.AWAITING_GATHER, E.GATHERED_TRAIN): P.AWAITING_REDUCE,
    (P.AWAITING_GATHER, E.GATHERED_INFER): P.DONE,
    (P.AWAITING_GATHER, E.GATHER_FILLED): P.DONE,
    (P.AWAITING_GATHER, E.GATHER_MISSED): P.SKIPPED,
    (P.AWAITING_GATHER, E.RESTART): P.AWAITING_GATHER,
    (P.AWAITING_GATHER, E.START): P.AWAITING_GATHER,
    (P.AWAITING_REDUCE, E.REDUCED): P.DONE,
    (P.AWAITING_REDUCE, E.REDUCE_MISSED): P.DONE,
    (P.AWAITING_REDUCE, E.RESTART): P.AWAITING_GATHER,
    (P.AWAITING_REDUCE, E.START): P.AWAITING_GATHER,
    (P.DONE, E.START): P.AWAITING_GATHER,
    (P.SKIPPED, E.START): P.AWAITING_GATHER,
}

# A wave under way: `tick` may restart it, its messages are taken.
UNDER_WAY = frozenset({P.AWAITING_GATHER, P.AWAITING_REDUCE})
# The wave has its result (`EdgeMachine.result`).
FINISHED = frozenset({P.DONE, P.SKIPPED})
# The head has run on this wave's pooled features (`EdgeMachine.trace` is set).
HEAD_RAN = frozenset({P.AWAITING_REDUCE, P.DONE})
# The events that give up on a message (a late copy of it is still timed).
GAVE_UP_GATHER = frozenset({E.GATHER_FILLED, E.GATHER_MISSED})
GAVE_UP_REDUCE = frozenset({E.REDUCE_MISSED})

del P, E


def next_edge_phase(phase: EdgePhase, event: EdgeEvent) -> EdgePhase:
    """The phase `event` moves the edge to from `phase`; `IllegalTransition` if the
    table has no such move."""
    return transition(EDGE_TRANSITIONS, "edge", phase, event)
