"""Studies run on the simulator: the cloud-heavy baseline and its comparison with in-mesh
computing, and the per-layer compression plan (planner.py) measured by `meshdl schedule`."""
