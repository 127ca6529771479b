"""Benchmarks behind `meshdl bench ...`: speed against a reference measured in the same
run (the kernels against PyTorch, the virtual mesh, MQTT, memory, compression, the
simulator, an attacked mesh)."""
