"""The README's countable figures of the seed run are what the mesh counts: its waves
(the training loop's batches and evaluation passes) and its messages (a training wave's
and an inference wave's, measured here)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from meshdl.config import ModelConfig, load_run_config
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import CNN
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.mesh import MeshEngine
from meshdl.training.loop import EVAL_BATCH

README = Path(__file__).resolve().parent.parent / "README.md"


def _waves(config, spec: MeshSpec) -> tuple[int, int]:
    """(training waves, inference waves) of a run: every epoch's batches and its test
    pass, then the final pass over the training set; a pass goes in EVAL_BATCH chunks,
    each as many waves as the message size limit needs."""
    def passes(n: int) -> int:
        return sum(math.ceil(min(EVAL_BATCH, n - start) / spec.max_batch)
                   for start in range(0, n, EVAL_BATCH))

    train, test = config.data.train, config.data.test
    epochs = config.train.epochs
    return epochs * math.ceil(train / config.train.batch), \
        epochs * passes(test) + passes(train)


def test_the_readmes_seed_run_figures_are_what_the_mesh_counts() -> None:
    text = " ".join(README.read_text().split())
    found = re.search(r"20 epochs: (\d+) waves, ([\d.]+) million messages", text)
    assert found, "the README no longer states the seed run's waves and messages"
    config = load_run_config()  # the seed experiment's defaults
    spec = MeshSpec(1, config.model, config.mesh.edge_at)
    training, inference = _waves(config, spec)
    assert training + inference == int(found.group(1))

    maps = np.zeros((config.train.batch, config.model.rows, config.model.cols), np.float32)
    labels = np.zeros(len(maps), np.int64)
    engine = MeshEngine(Dataset(maps, labels, maps, labels, {}))
    model = CNN(ModelConfig())
    model.set_normalization(20.0, 2.0)
    engine.loss_and_grads(model, np.arange(len(maps)))
    per_training_wave = engine.report()["total_messages"]
    engine.logits(model, "test", np.arange(len(maps)))
    per_inference_wave = engine.report()["total_messages"] - per_training_wave
    total = training * per_training_wave + inference * per_inference_wave
    assert round(total / 1e6, 2) == float(found.group(2))
