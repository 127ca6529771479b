"""The virtual mesh: in-process transport, virtual clock, link/radio/energy models, fault
injection, datasets, experiments."""
