"""Benchmark: a whole training run in the in-process virtual mesh, against the centralized
model trained on the same data and configuration in the same process and run.

Both runs go through the same training loop (same batches, same optimizer), so the ratio
is the price of the mesh itself: every value crossing a link as a message, encoded into a
header and an array, counted, delivered round by round and taken apart by a node's state
machine. Wall time is the training loop's own (`History.wall_s`: from the model's
creation to the final evaluation, data generation excluded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset
from meshdl.training.loop import train


def bench_mesh(config: RunConfig, data: Dataset,
               log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Train `config` centrally, then in the virtual mesh; the figures of both."""
    runs = {}
    for mode in ("central", "mesh"):
        log(f"training in {mode} mode")
        _, history = train(config.model_copy(update={"mode": mode}), data)
        runs[mode] = history
    central, mesh = runs["central"], runs["mesh"]
    messages, waves = mesh.comm["total_messages"], mesh.comm["waves"]
    return {
        "grid": [config.model.rows, config.model.cols],
        "train_samples": len(data.y_train),
        "batch": config.train.batch,
        "epochs": config.train.epochs,
        "central": {"wall_s": central.wall_s, "test_acc": central.final["test_acc"]},
        "mesh": {
            "wall_s": mesh.wall_s,
            "test_acc": mesh.final["test_acc"],
            "waves": waves,
            "messages": messages,
            "messages_per_s": messages / mesh.wall_s,
            "ms_per_wave": 1e3 * mesh.wall_s / waves,
        },
        "ratio_to_central": mesh.wall_s / central.wall_s,
    }
