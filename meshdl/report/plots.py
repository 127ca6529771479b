"""Plots drawn headless, the same bytes for the same figures: matplotlib's Agg backend
(no display needed) and PNGs without the "Software" metadata (matplotlib's version)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported when a plot is drawn: it is slow
    to import and most commands draw none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure: Any, target: Path | IO[bytes], dpi: int = 100) -> None:
    """Lay `figure` out, write it as a PNG to `target` and free it."""
    figure.tight_layout()
    figure.savefig(target, format="png", dpi=dpi, metadata={"Software": None})
    pyplot().close(figure)
