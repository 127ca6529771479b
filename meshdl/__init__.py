"""meshdl: train and run a convolutional network inside a mesh of IoT sensor nodes.

The public API: `ModelConfig` and `CNN` (the seed network on Numba kernels), the other
configuration models, and `load_run_config`, which merges defaults, TOML, environment
and flags.

Each name is imported when first asked for (PEP 562): `import meshdl` alone loads
neither pydantic nor Numba, so that `meshdl --version`, and any module that only needs
`meshdl.errors`, starts at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
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


def __getattr__(name: str) -> Any:
    """`meshdl.CNN` and the configuration names, imported on first use."""
    if name == "CNN":
        from meshdl.model.cnn import CNN

        return CNN
    if name in __all__:
        from meshdl import config

        return getattr(config, name)
    raise AttributeError(f"module 'meshdl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
