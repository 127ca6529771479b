"""Experiments a researcher runs from the CLI (`meshdl experiment NAME`): trials over a
swept value and several seeds, summarized with means and deviations, tabled and
plotted (runner.py: trials and the run directory; one module per experiment)."""
