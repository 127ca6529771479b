"""The sensor-node side of the mesh (imported as `meshdl.nodes`): the node agent that
computes its cell's share of convolution and pooling, and the sensor drivers."""
