"""Stragglers (sim/faults/stragglers.py): cells picked by seed compute slower; in reliable mode
the results are unchanged and the cost shows in time and energy."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from meshdl import load_run_config
from meshdl.config import DataConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.protocol.spec import Mode, Split
from meshdl.sim.faults.stragglers import Stragglers
from meshdl.sim.mesh import MeshEngine
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine
from meshdl.training.loop import train
from tests.test_simulated_time import _mesh

CELLS = [(r, c) for r in range(4) for c in range(5)]


def test_the_same_seed_picks_the_same_stragglers_and_another_seed_others() -> None:
    picked = Stragglers(fraction=0.25, slowdown=4, seed=3).pick(CELLS)
    assert picked == Stragglers(fraction=0.25, slowdown=4, seed=3).pick(list(reversed(CELLS)))
    assert len(picked) == 5 and set(picked.values()) == {4}
    assert picked != Stragglers(fraction=0.25, slowdown=4, seed=4).pick(CELLS)
    assert Stragglers(fraction=0.0).pick(CELLS) == {}
    assert set(Stragglers(fraction=1.0).pick(CELLS)) == set(CELLS)


@pytest.mark.parametrize("fields", [{"fraction": -0.1}, {"fraction": 1.5},
                                    {"slowdown": 0.5}, {"slowdown": float("nan")}])
def test_an_impossible_straggler_setting_is_refused(fields) -> None:
    with pytest.raises(ValidationError):
        Stragglers(**fields)


def test_a_stragglers_cpu_takes_slowdown_times_its_devices_time() -> None:
    slow = device("cortex-m4")
    fast_mesh = _mesh(4, 5, profile("802.15.4"), "shared", node=slow)
    slow_mesh = _mesh(4, 5, profile("802.15.4"), "shared", node=slow)
    # Far slower than the radio (50 ms of bookkeeping a message): the wave must wait.
    slow_mesh.slowdown = Stragglers(fraction=0.2, slowdown=1000, seed=1).pick(CELLS)
    for mesh in (fast_mesh, slow_mesh):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    for cell in CELLS:
        factor = slow_mesh.slowdown.get(cell, 1.0)
        assert slow_mesh.cpus[cell].seconds == pytest.approx(
            factor * fast_mesh.cpus[cell].seconds, rel=1e-12)
    assert slow_mesh.waves[-1].end > fast_mesh.waves[-1].end


def test_training_with_stragglers_gives_the_parameters_of_training_without() -> None:
    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8, "filters": 2},
                             train={"epochs": 1, "batch": 8, "seed": 2})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=24, test=8, seed=3))
    view = training_data(config.train, data)
    plain, _ = train(config, data, engine=MeshEngine(view))
    engine = SimEngine(view, profile("802.15.4"), "shared", device("cortex-m4"),
                       device("pi4"), stragglers=Stragglers(fraction=0.3, slowdown=50))
    slowed, _ = train(config, data, engine=engine)
    assert np.array_equal(slowed.flat, plain.flat)
    assert engine.mesh is not None and len(engine.mesh.slowdown) == 6
