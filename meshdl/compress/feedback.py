"""Error feedback: what compression left out of one message is added to the next.

GRACE's Memory, kept apart from the compressor: `compensate` adds the residual to a new
gradient before it is compressed, `update` keeps what the decoded message misses. Over
a run, the decoded messages plus the final residual add up to the raw gradients (up to
float32 rounding), whatever the compressor: nothing is ever lost, only delayed.
"""

from __future__ import annotations

import numpy as np


class ErrorFeedback:
    """The residual of one sender's stream of one vector."""

    def __init__(self, size: int) -> None:
        self.residual = np.zeros(size, np.float32)

    def compensate(self, gradient: np.ndarray) -> np.ndarray:
        """The gradient plus what earlier messages left out (a new array)."""
        return gradient + self.residual

    def update(self, compensated: np.ndarray, decoded: np.ndarray) -> None:
        """Keep what this message left out."""
        np.subtract(compensated, decoded, out=self.residual)

    def reset(self) -> None:
        self.residual[...] = 0.0
