"""Dead cells found and left out in the mesh: the halo relays go around them (a diagonal
whose row-first relay is dead comes column first), the edge knows the cells that never
came up before the first wave (a roll call at commissioning), and from then on the mesh
computes what the central model computes with those cells left out."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import DataConfig, ModelConfig
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topology import Topology
from meshdl.sim.faults.dead import cell_numbers
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh

ROWS, COLS = 5, 6


def _data():
    return generate_lounge(DataConfig(rows=ROWS, cols=COLS, train=8, test=24, seed=2))


def _model(pool: int | str = "global") -> CNN:
    config = ModelConfig(rows=ROWS, cols=COLS, kernel=3, filters=3, hidden=6, pool=pool)
    model = CNN(config, seed=4)
    model.set_normalization(21.0, 2.0)
    return model


def _mesh(model: CNN, data, dead: frozenset = frozenset(), best_effort=None) -> TimedMesh:
    spec = MeshSpec(1, model.config, (0, 0), "tree", dead=dead)
    return TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test}, model,
                     {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"),
                     best_effort=best_effort, compiled=False)


def test_a_diagonal_whose_row_relay_is_dead_comes_column_first() -> None:
    """(2, 2) dead: (1, 2)'s diagonals (2, 1) and (2, 3) would come along row 2 to
    (2, 2), then up its column; they come up their own columns to (1, 1) and (1, 3)
    instead, then along row 1 (phase 2). Every live value of every live window is had."""
    topo = Topology(ROWS, COLS, (0, 0), 2, frozenset({(2, 2)}))
    assert not topo.knows((1, 2), (2, 1)) and not topo.knows((1, 2), (2, 3))
    detours = {(s.src, s.dst): s.cells for cell in topo.members
               for s in topo.strips_from(cell, 1, 1) if s.phase == 2}
    assert detours[((1, 1), (1, 2))] == ((2, 1),)
    assert detours[((1, 3), (1, 2))] == ((2, 3),)
    received = {cell: set() for cell in topo.members}
    for cell in topo.members:
        for s in topo.strips_from(cell, 1, 1):
            received[s.dst].update(s.cells)
    for cell in topo.members:
        had = received[cell] | {cell}
        live = {x for x in topo.window(cell, 1, 1) if x in topo.members}
        assert live <= had, (cell, live - had)


@pytest.mark.parametrize("pool", ["global", 2])
def test_a_mesh_planned_around_its_dead_cells_infers_as_central_with_them_left_out(
        pool) -> None:
    """With the dead cells planned around (every live value of a window had, by the
    relays or a detour), inference in the mesh is the central model's with those cells
    zeroed (`CNN.forward(X, cells)`), to float tolerance."""
    data, model = _data(), _model(pool)
    dead = frozenset({(2, 2), (3, 4), (1, 5)})
    mesh = _mesh(model, data, dead)
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(len(data.y_test)))
    want = model.forward(data.X_test, cell_numbers(dead, COLS))
    np.testing.assert_allclose(result.logits, want, rtol=1e-5, atol=1e-5)
