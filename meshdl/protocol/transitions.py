"""A state machine's transition table, looked up one way for every machine.

The edge's and the node's wave lifecycles (edge/lifecycle.py, nodes/lifecycle.py) are
each a dict of (phase, event) -> next phase, after h11's `_state.py`; `transition` reads
one and raises `IllegalTransition` for a move the table does not have.
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
