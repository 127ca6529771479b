"""Several meshes training one model (imported as `meshdl.server`): the parameter
server that combines the meshes' gradients and updates, and each edge's side of it.

Both are sans-I/O machines like the nodes and the edge: messages in, messages out,
time only as `now`. The simulator (sim/cluster.py) and MQTT drive them alike.
"""
