"""What shows a run to people: the self-contained HTML page of a run directory
(page.py) and plots drawn headless, byte for byte reproducible (plots.py)."""
