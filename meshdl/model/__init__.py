"""The seed CNN on Numba kernels: its kernels, the network itself (cnn.py), its
optimizers, and the equivalent PyTorch model for cross-checks."""
