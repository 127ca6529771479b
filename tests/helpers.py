"""Checks and inputs shared by several test modules."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import threading
from typing import Any

import aiomqtt
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.protocol.topics import alerts_topic

# A small mesh file (the run configuration TOML): 3 x 4 cells, mesh 7, edge at (0, 0).
SMALL_MESH_TOML = """\
[model]
rows = 3
cols = 4

[mesh]
mesh_id = 7
edge_at = [0, 0]
"""


def small_run_toml(batch: int) -> str:
    """A 4 x 5 mesh's run: 40 training and 20 test maps (data seed 4), 2 epochs."""
    return f"""
[model]
rows = 4
cols = 5
hidden = 8

[data]
train = 40
test = 20
seed = 4

[train]
epochs = 2
batch = {batch}
"""


# Two meshes (ids 1 and 2) of 4 x 5 cells training one model in bsp: format with mesh_id.
TWO_MESHES_TOML = small_run_toml(5) + """
[mesh]
mesh_id = {mesh_id}

[parallel]
meshes = 2
first_mesh_id = 1
sync = "bsp"
"""


def assert_one_line_error(code: int, err: str, expected_code: int, *needles: str) -> None:
    """A CLI failure: exit `expected_code`, one `error: ...` line naming every needle."""
    assert code == expected_code, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def noise_dataset(config: ModelConfig, samples: int = 24) -> Dataset:
    """Random maps around 20 degrees with random labels, on `config`'s grid (its first 4
    are also the test split): enough for gradients, not for learning."""
    rng = np.random.default_rng(1)
    X = rng.normal(20.0, 3.0, (samples, config.rows, config.cols)).astype(np.float32)
    y = rng.integers(0, 2, samples)
    return Dataset(X, y, X[:4], y[:4], {})


def normalized_model(config: ModelConfig) -> CNN:
    """A seeded model normalizing inputs as `noise_dataset`'s."""
    model = CNN(config, seed=3)
    model.set_normalization(20.0, 3.0)
    return model


def retained_alert(host: str, port: int, mesh_id: int = 1) -> dict:
    """The alert a late subscriber to a mesh's alerts topic gets (retained); {} if none
    comes within 10 s. Read on a thread of its own, beside any event loop of the test."""
    retained: dict = {}

    async def first() -> None:
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(alerts_topic(mesh_id), qos=1)
            async for message in client.messages:
                retained.update(json.loads(message.payload))
                return

    reader = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(first(), 10)))
    reader.start()
    reader.join(15)
    return retained


INTERRUPTED = 130  # a shell's code for a process stopped by SIGINT


def interrupt_at(monkeypatch: pytest.MonkeyPatch, update: int,
                 module: str = "meshdl.training.loop") -> None:
    """Press Ctrl-C at the run's `update`-th update (from 1), before it is applied, where
    `module` asks its learning rate (the loop of one mesh, or the server of several)."""
    where = importlib.import_module(module)
    real, calls = where.learning_rate, itertools.count(1)

    def pressed(*args):
        if next(calls) == update:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(where, "learning_rate", pressed)


def saved_figures(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Any]:
    """The figures `module` saves (through its `save_png`), each kept once saved."""
    saved: list[Any] = []
    real = module.save_png

    def keep(figure: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        real(figure, target, *args, **kwargs)
        saved.append(figure)

    monkeypatch.setattr(module, "save_png", keep)
    return saved


def recorded_sends(mesh: Any) -> list[Any]:
    """A list that fills with every message the virtual mesh `mesh` sends from now on,
    as it was sent (its `send` wrapped)."""
    sent: list[Any] = []
    send = mesh.send

    def recording(messages: list[Any]) -> None:
        sent.extend(messages)
        send(messages)

    mesh.send = recording
    return sent


def blas_threads() -> int:
    """The thread count BLAS runs with now (skips the test where threadpoolctl sees no
    BLAS)."""
    counts = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    if not counts:
        pytest.skip("no BLAS library that threadpoolctl can see")
    return max(counts)
