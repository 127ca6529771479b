"""A node's wave lifecycle: the phases of its current wave, the events that move it,
and the one table of which event is legal in which phase (after h11's `_state.py`).

    AWAITING_CONTROL --STARTED--> FORWARD         PARAMS and BATCH both in hand
    FORWARD --FORWARD_DONE--> BACKWARD            training: this node's forward tasks ran
    FORWARD --FINISHED--> DONE                    inference: every task ran
    BACKWARD --FINISHED--> DONE                   training: every task ran
    AWAITING_CONTROL | FORWARD | BACKWARD --SUPERSEDED--> ABANDONED
                                                  a later wave's PARAMS, or a new plan

A wave begins AWAITING_CONTROL when the first PARAMS of its step come (a node has no
wave before, nor after a PARAMS that brings another plan). Messages that move nothing
(items stored in their slots, duplicates, stale, early ones buffered) are not events.
"""

from __future__ import annotations

from enum import Enum

from meshdl.protocol.transitions import transition


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


def next_phase(phase: NodePhase, event: NodeEvent) -> NodePhase:
    """The phase `event` moves a node's wave to from `phase`; `IllegalTransition` if the
    table has no such move."""
    return transition(NODE_TRANSITIONS, "node", phase, event)
