"""What goes over the mesh and who sends it: messages and their codec, payload layouts,
topology, topic names, authentication, the mesh spec and its sends table (spec.py),
best-effort deadlines, and the accounting of what a wave sends and computes."""
