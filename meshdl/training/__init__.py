"""A training run: the loop every mode shares (loop.py), several meshes training one
model (parallel.py in process; over MQTT, the parameter server's run, ps_run.py, and an
edge's beside it, edge_run.py), checkpoints, and the run directory a run leaves behind."""
