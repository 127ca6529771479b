"""docs/walk.md, one training wave through the code, names only what exists; and the
plan's rows are the protocol: every message of a wave is one row of `MeshSpec.sends` or
`MeshSpec.relays`, and every row is sent."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.protocol.messages import EDGE, Kind
from meshdl.sim.mesh import MeshEngine
from tests.helpers import recorded_sends

ROOT = Path(__file__).resolve().parents[1]
WALK = (ROOT / "docs" / "walk.md").read_text()


def test_every_file_the_walk_names_exists() -> None:
    paths = set(re.findall(r"`([\w/]+\.py)`", WALK))
    assert len(paths) >= 7
    assert [p for p in sorted(paths) if not (ROOT / p).is_file()] == []


def test_every_function_and_table_the_walk_names_is_defined_in_its_files() -> None:
    sources = "\n".join((ROOT / p).read_text()
                        for p in set(re.findall(r"`([\w/]+\.py)`", WALK)))
    names = set(re.findall(r"`((?:[A-Z]\w*\.)?_?[a-zA-Z]\w*)`", WALK))
    missing = []
    for name in sorted(names):
        last = name.split(".")[-1]
        if not re.search(rf"^\s*(def {last}\b|class {last}\b|{last}\b[^=\n]*=)", sources,
                         re.M):
            missing.append(name)
    assert missing == []


@pytest.mark.parametrize("params_via", ["tree", "broadcast"])
def test_a_training_wave_sends_exactly_the_rows_of_the_plan(params_via: str) -> None:
    config = ModelConfig(rows=4, cols=5)
    rng = np.random.default_rng(1)
    X = rng.normal(20.0, 2.0, (6, 4, 5)).astype(np.float32)
    y = rng.integers(0, 2, 6)
    # Every message as an object to record: through the node machines.
    engine = MeshEngine(Dataset(X, y, X[:1], y[:1], {"generator": "random"}), edge_at=(0, 2),
                        params_via=params_via, compiled=False)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 2.0)
    mesh = engine.mesh_for(model)
    sent = recorded_sends(mesh)
    engine.loss_and_grads(model, np.arange(6))
    spec = mesh.spec
    rows = {(src, s.kind, s.layer, s.phase, s.dst) for table in (spec.sends, spec.relays)
            for src, sends in table.items() for s in sends if not s.occasional}
    seen = [(m.header.src, Kind(m.header.kind), m.header.layer, m.header.phase,
             m.header.dst) for m in sent]
    assert len(seen) == len(set(seen)) == len(rows)  # each row once
    assert set(seen) == rows
    assert {k for src, k, *_ in seen if src != EDGE} >= {Kind.REDUCE, Kind.HALO}
