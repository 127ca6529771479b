"""Benchmark: a whole training run in the in-process virtual mesh, against the centralized
model trained on the same data and configuration in the same process and run.

Both runs go through the same training loop (same batches, same optimizer), so the ratio
is the price of the mesh itself: every message of every node's plan delivered round by
round, counted, and what it completes run, in the compiled dispatch (sim/compiled.py).
With `machines`, the same run a third time with every message through the node machines
(encoded into a header and an array, taken apart by a node's state machine: the path
MQTT and simulated time take), and whether it ends with the very same model. Wall time
is the training loop's own (`History.wall_s`: from the model's creation to the final
evaluation, data generation excluded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset
from meshdl.training.loop import train


def bench_mesh(config: RunConfig, data: Dataset, machines: bool = False,
               log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Train `config` centrally, then in the virtual mesh (and through its node machines);
    the figures of each."""
    runs, models = {}, {}
    mesh_config = config.model_copy(update={"mode": "mesh"})
    setups = {"central": config.model_copy(update={"mode": "central"}),
              "mesh": mesh_config.model_copy(update={"mesh": mesh_config.mesh.model_copy(
                  update={"dispatch": "compiled"})})}
    if machines:
        setups["machines"] = mesh_config.model_copy(update={
            "mesh": mesh_config.mesh.model_copy(update={"dispatch": "machines"})})
    for name, setup in setups.items():
        log(f"training: {name}")
        models[name], runs[name] = train(setup, data)
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
    } | ({} if not machines else {"machines": {
        "wall_s": runs["machines"].wall_s,
        "test_acc": runs["machines"].final["test_acc"],
        "ratio_to_central": runs["machines"].wall_s / central.wall_s,
        # The compiled dispatch is the machines' arithmetic: the same model, bit for bit.
        "same_model": bool(np.array_equal(models["mesh"].flat, models["machines"].flat)),
    }})
