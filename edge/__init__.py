"""The edge side of the mesh (imported as `meshdl.edge`): the agent at the border of the
mesh that runs the fully-connected head, the loss and the optimizer."""
