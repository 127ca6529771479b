"""Plots drawn headless, the same bytes for the same figures: matplotlib's Agg backend
(no display needed) and PNGs without the "Software" metadata (matplotlib's version).

Every plot is read in `meshdl report`'s page, whose column is `REPORT_WIDTH_PX` wide: a
wider PNG is shown shrunk. `save_png` therefore lifts every text of a figure (tick
labels, legends, titles) to a size that still shows `MIN_TEXT_PX` tall there, whatever
size its plot function asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

# The report's column: 60em (meshdl/report/page.py's style) at 16 px an em.
REPORT_WIDTH_PX = 960
# The smallest text a reader should have to read in that column, in pixels: about a
# 8 pt footnote on screen; matplotlib's 6-7 pt legends on a shrunk figure are half that.
MIN_TEXT_PX = 11.0


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported when a plot is drawn: it is slow
    to import and most commands draw none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def min_font_pt(figure: Any, dpi: int = 100) -> float:
    """The font size, in points, of a text of `figure` (saved at `dpi`) that shows
    `MIN_TEXT_PX` tall in the report's column."""
    width_px = figure.get_figwidth() * dpi
    shrink = min(1.0, REPORT_WIDTH_PX / width_px)
    return MIN_TEXT_PX * 72 / (dpi * shrink)


def readable(figure: Any, dpi: int = 100) -> None:
    """Lift every text of `figure` smaller than `min_font_pt` to it: tick labels (those
    the locators make at drawing time too), legends, titles, axis labels, notes."""
    from matplotlib.text import Text

    floor = min_font_pt(figure, dpi)
    for axes in figure.axes:
        for name, axis in (("x", axes.xaxis), ("y", axes.yaxis)):
            ticks = axis.get_major_ticks()
            if ticks and ticks[0].label1.get_fontsize() < floor:
                axes.tick_params(axis=name, which="both", labelsize=floor)
    for text in figure.findobj(Text):
        if text.get_fontsize() < floor:
            text.set_fontsize(floor)


def integer_ticks(axis: Any) -> None:
    """Ticks of `axis` on whole numbers only (epochs, rows, columns: no 2.5)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def plain_ticks(axis: Any) -> None:
    """Tick labels of `axis` as the numbers they are, thousands separated, no zeros
    added (a tick is a place on the scale, not a measured figure): 5,000, 0.5."""
    from meshdl.report.numbers import given

    axis.set_major_formatter(lambda value, _: given(value))


def save_png(figure: Any, target: Path | IO[bytes], dpi: int = 100) -> None:
    """Make `figure` readable in the report, lay it out (unless it has its own layout
    engine), write it as a PNG to `target` and free it."""
    readable(figure, dpi)
    if figure.get_layout_engine() is None:
        figure.tight_layout()
    figure.savefig(target, format="png", dpi=dpi, metadata={"Software": None})
    pyplot().close(figure)
