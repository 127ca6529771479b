"""meshdl: train and run a convolutional network inside a mesh of IoT sensor nodes.

The public API: `ModelConfig` and `CNN` (the seed network on Numba kernels), the other
configuration models, and `load_run_config`, which merges defaults, TOML, environment
and flags.
"""

from meshdl.config import (
    DataConfig,
    MeshConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
)
from meshdl.model.cnn import CNN

__all__ = [
    "CNN",
    "DataConfig",
    "MeshConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "load_run_config",
]
__version__ = "0.1.0"
