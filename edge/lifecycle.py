"""The edge's wave lifecycle: its phases, the events that move it, and the one table of
which event is legal in which phase (after h11's `_state.py`).

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

from meshdl.protocol.transitions import transition


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


def next_phase(phase: EdgePhase, event: EdgeEvent) -> EdgePhase:
    """The phase `event` moves the edge to from `phase`; `IllegalTransition` if the
    table has no such move."""
    return transition(EDGE_TRANSITIONS, "edge", phase, event)
