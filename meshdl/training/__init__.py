"""A training run: the loop every mode shares (loop.py), several meshes training one
model (parallel.py), checkpoints, and the run directory a run leaves behind."""
