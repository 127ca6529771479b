"""Gradient compression: compressors (compressors.py), error feedback (feedback.py),
several layers in one payload and one sender's stream (codec.py), the in-network sum
(intsum.py), and the `--compress` policy that says which layer gets which (policy.py)."""
