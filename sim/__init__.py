"""The simulator (imported as `meshdl.sim`): its drivers (the virtual mesh, the mesh under
simulated time, several meshes on one clock, the in-process broker) over the radio
physics (radio/), the faults they inject (faults/), and the studies run on them
(studies/)."""
