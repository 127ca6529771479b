"""Mirror banks: a global-pool model read in its four mirror orientations at once, as one
model of four filter banks (meshdl/model/mirrors.py). Its logits are the mean of the four
mirrored readings, dead cells mirrored with the map; it runs in the mesh as any model,
with cells left out; and `meshdl mirror-banks` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import DataConfig, ModelConfig
from meshdl.data.augment import FLIPS
from meshdl.data.lounge import generate_lounge
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN
from meshdl.model.mirrors import mirror_banks
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.faults.dead import cell_numbers
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh
from tests.test_cli_simulate import _meshdl

ROWS, COLS = 5, 6
DEAD = {(0, 1), (2, 2), (3, 5), (4, 0)}


def _model(layers: int = 2, seed: int = 4) -> CNN:
    config = ModelConfig(rows=ROWS, cols=COLS, pool="global", alive=True, filters=3,
                         hidden=5, conv_layers=layers)
    model = CNN(config, seed=seed)
    model.set_normalization(21.0, 2.0)
    return model


def _maps(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(21.0, 2.0, (count, ROWS, COLS)).astype(np.float32)


# Every flip of a map, spelled out here rather than taken from the module under test.
ALL_FLIPS = [(up_down, left_right) for up_down in (False, True) for left_right in (False, True)]


def _mirrored_mean(model: CNN, X: np.ndarray, dead: set) -> np.ndarray:
    """The four readings of test-time augmentation, done the long way: each map and its
    dead cells flipped, read by the model, the logits averaged."""
    total = np.zeros((len(X), model.config.classes), np.float64)
    for up_down, left_right in ALL_FLIPS:
        maps = X[..., ::-1, :] if up_down else X
        maps = np.ascontiguousarray(maps[..., ::-1] if left_right else maps)
        cells = {(ROWS - 1 - r if up_down else r, COLS - 1 - c if left_right else c)
                 for r, c in dead}
        total += model.forward(maps, cell_numbers(cells, COLS) if cells else None)
    return total / len(ALL_FLIPS)


def test_the_banks_are_the_four_flips_the_first_the_map_as_it_is() -> None:
    assert sorted(FLIPS) == ALL_FLIPS and FLIPS[0] == (False, False)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("dead", [set(), DEAD])
def test_the_banks_read_a_map_as_the_mean_of_its_four_mirrored_readings(layers, dead) -> None:
    model = _model(layers)
    banks = mirror_banks(model)
    assert (banks.config.filters, banks.config.hidden) == (12, 20)
    X = _maps(7, layers)
    got = banks.forward(X, cell_numbers(dead, COLS) if dead else None)
    np.testing.assert_allclose(got, _mirrored_mean(model, X, dead), rtol=1e-5, atol=1e-5)


def test_a_map_that_is_its_own_mirror_image_reads_as_the_model_alone() -> None:
    """Four equal readings average to one: the banks change nothing a flip cannot."""
    model = _model()
    X = _maps(4, 9)
    X = (X + X[..., ::-1, :] + X[..., ::-1] + X[..., ::-1, ::-1]) / 4  # symmetric maps
    np.testing.assert_allclose(mirror_banks(model).forward(X), model.forward(X),
                               rtol=1e-5, atol=1e-5)


def test_banks_beyond_what_a_model_may_hold_are_refused_before_anything_is_written() -> None:
    """A model file must load back: 300 filters make banks of 1,200, over the cap."""
    model = CNN(ModelConfig(rows=ROWS, cols=COLS, pool="global", filters=300, hidden=3))
    with pytest.raises(UsageError, match="filters"):
        mirror_banks(model)


def test_a_windowed_pool_or_an_even_kernel_is_refused() -> None:
    with pytest.raises(UsageError, match="global-pool"):
        mirror_banks(CNN(ModelConfig(rows=ROWS, cols=COLS, pool=2, filters=2, hidden=3)))
    with pytest.raises(UsageError, match="odd kernel"):
        mirror_banks(CNN(ModelConfig(rows=ROWS, cols=COLS, pool="global", kernel=2,
                                     filters=2, hidden=3)))


def test_the_banks_run_in_the_mesh_around_dead_cells_as_centrally() -> None:
    """One inference wave of the virtual mesh planned around four dead cells: the
    banks' logits are the central model's with the same cells left out."""
    banks = mirror_banks(_model())
    data = generate_lounge(DataConfig(rows=ROWS, cols=COLS, train=8, test=6, seed=2))
    spec = MeshSpec(1, banks.config, (0, 0), "tree", dead=frozenset(DEAD))
    X = {Split.TRAIN: banks.with_alive(data.X_train), Split.TEST: banks.with_alive(data.X_test)}
    mesh = TimedMesh(spec, X, banks, {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile("802.15.4"), "shared", device("cortex-m4"), device("pi4"))
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(6))
    np.testing.assert_allclose(result.logits,
                               banks.forward(data.X_test, cell_numbers(DEAD, COLS)),
                               rtol=1e-4, atol=1e-5)


def test_the_command_writes_the_banks_and_refuses_to_overwrite(tmp_path: Path) -> None:
    model = _model()
    model.act_scales = np.ones(3, np.float32)  # int8 scales: not carried over, and said so
    source, out = tmp_path / "model.npz", tmp_path / "banks.npz"
    model.save(source)
    code, printed, err = _meshdl("mirror-banks", source, "--out", out, "--json")
    assert code == 0, err
    report = json.loads(printed)
    assert (report["filters"], report["hidden"]) == (12, 20)
    assert report["int8_scales_dropped"] and CNN.load(out).act_scales is None
    X = _maps(3, 1)
    np.testing.assert_array_equal(CNN.load(out).forward(X), mirror_banks(model).forward(X))
    code, _, err = _meshdl("mirror-banks", source, "--out", out)
    assert code == 1 and "--force" in err and len(err.strip().splitlines()) == 1
