"""The compiled dispatch (nodes/compiled.py, sim/compiled.py) is the node machines to the
bit: the same losses, logits and gradients, the same counts, rounds and stage timing; a
wave it cannot run goes through the machines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.errors import MeshdlError
from meshdl.nodes.compiled import tabulate, validate
from meshdl.protocol.spec import LIVE_SLOTS, MeshSpec, Mode, Split
from meshdl.sim.mesh import MeshEngine, VirtualMesh
from meshdl.training.failout import failout_cells


def _data(config: ModelConfig, samples: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    X = rng.normal(20.0, 3.0, (samples, config.rows, config.cols)).astype(np.float32)
    y = rng.integers(0, config.classes, samples)
    return Dataset(X, y, X[: samples // 2], y[: samples // 2], {})


def _run(engine: MeshEngine, config: ModelConfig, batches: list[np.ndarray], seed: int,
         failout: float) -> list:
    """Training waves on `batches` (the model stepped by plain SGD after each), then an
    inference wave over the test split: everything each wave returned, and the report."""
    model = CNN(config, seed=seed)
    model.set_normalization(20.0, 3.0)
    results = []
    for step, batch in enumerate(batches):
        dead = failout_cells(config.rows, config.cols, failout, seed, step)
        loss, logits, grads = engine.loss_and_grads(model, batch, dead)
        results.append((loss, logits.copy(), grads.copy()))
        model.flat -= 0.05 * grads
    results.append(engine.logits(model, "test", np.arange(len(engine.data.y_test))))
    return [results, engine.report()]


def _assert_same(compiled: list, machines: list) -> None:
    (waves, report), (expected, expected_report) = compiled, machines
    for (loss, logits, grads), (loss_m, logits_m, grads_m) in zip(waves[:-1], expected[:-1],
                                                                   strict=True):
        assert loss == loss_m
        assert np.array_equal(logits, logits_m)
        assert np.array_equal(grads, grads_m)
    assert np.array_equal(waves[-1], expected[-1])
    assert report == expected_report  # counts, bytes, rounds, each node's stages


@st.composite
def meshes(draw):
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    config = ModelConfig(rows=rows, cols=cols,
                         kernel=draw(st.integers(1, min(5, max(rows, cols)))),
                         filters=draw(st.integers(1, 3)), conv_layers=draw(st.integers(1, 3)),
                         pool=draw(st.sampled_from([1, 2, 3, "global"])),
                         hidden=draw(st.integers(1, 6)), classes=draw(st.integers(2, 3)))
    border = [(r, c) for r in range(rows) for c in range(cols)
              if r in (0, rows - 1) or c in (0, cols - 1)]
    return config, draw(st.sampled_from(border))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=meshes(), seed=st.integers(0, 1000), batch=st.integers(1, 5),
       params_via=st.sampled_from(["tree", "broadcast"]), memory_plan=st.booleans(),
       failout=st.sampled_from([0.0, 0.3]))
def test_compiled_waves_are_the_node_machines_to_the_bit(setup, seed, batch, params_via,
                                                          memory_plan, failout) -> None:
    """Any grid, kernel, depth and pooling, edge on any border cell, parameters down the
    tree or broadcast, with and without the memory plan and failout; a last batch
    smaller than the others."""
    config, edge_at = setup
    data = _data(config, 3 * batch + 1, seed)
    batches = [np.arange(i * batch, (i + 1) * batch) for i in range(3)] + \
        [np.array([3 * batch])]
    runs = {}
    for compiled in (True, False):
        engine = MeshEngine(data, edge_at=edge_at, params_via=params_via,
                            memory_plan=memory_plan, compiled=compiled)
        runs[compiled] = _run(engine, config, batches, seed, failout)
        assert (engine.mesh._compiled is not None) == compiled
    _assert_same(runs[True], runs[False])


def test_the_seed_mesh_trains_as_its_node_machines_to_the_bit() -> None:
    config = ModelConfig()
    data = _data(config, 40, 0)
    batches = [np.arange(i * 16, (i + 1) * 16) for i in range(2)]
    runs = [_run(MeshEngine(data, compiled=compiled), config, batches, 0, 0.0)
            for compiled in (True, False)]
    _assert_same(*runs)


def test_a_mesh_on_the_wire_goes_through_the_node_machines() -> None:
    config = ModelConfig(rows=4, cols=5, hidden=4)
    engine = MeshEngine(_data(config, 6, 1), wire=True)
    _run(engine, config, [np.arange(3)], 0, 0.0)
    assert engine.mesh._compiled is None


@pytest.mark.parametrize("compiled", [True, False])
def test_parameters_the_nodes_refuse_stall_the_wave_and_say_so(compiled) -> None:
    """A PARAMS with a negative standard deviation: every node refuses it, as through
    the machines (the compiled dispatch leaves such a wave to them)."""
    config = ModelConfig(rows=3, cols=4, hidden=4)
    engine = MeshEngine(_data(config, 6, 2), compiled=compiled)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    model.norm_std[...] = -1.0
    with pytest.raises(MeshdlError, match="bad_params"):
        engine.loss_and_grads(model, np.arange(3))


def _live_mesh(compiled: bool) -> tuple[VirtualMesh, np.ndarray]:
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=8)
    data = _data(config, 40, 3)
    empty = np.full((LIVE_SLOTS, config.rows, config.cols), np.nan, np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    mesh = VirtualMesh(MeshSpec(1, config), {Split.TRAIN: data.X_train,
                                            Split.TEST: data.X_test, Split.LIVE: empty},
                       model, {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                       compiled=compiled)
    return mesh, data.X_train


def test_a_scheduled_slot_after_compiled_waves_runs_on_their_parameters() -> None:
    """Slots start on the parameters each node keeps from the last wave that brought
    them: after compiled waves, theirs (the machines' own waves keep them as they go)."""
    logits = {}
    for compiled in (True, False):
        mesh, series = _live_mesh(compiled)
        first = 29_478_210
        for slot in (0, 1):
            for (r, c), node in mesh.nodes.items():
                node.record(Split.LIVE, (first + slot) % LIVE_SLOTS, series[slot, r, c])
        mesh.run_wave(Mode.INFER, Split.LIVE, np.array([first % LIVE_SLOTS]))  # machines
        grads = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4)).grads
        mesh.edge.model.flat -= 0.5 * grads
        mesh.run_wave(Mode.INFER, Split.TEST, np.arange(2))  # the parameters slots use
        logits[compiled] = mesh.run_slot(first + 1).logits
        assert (mesh._compiled is not None) == compiled
    assert np.array_equal(logits[True], logits[False])
    np.testing.assert_allclose(logits[True], mesh.edge.model.forward(series[1:2]),
                               rtol=1e-5, atol=1e-6)


def test_a_reading_recorded_after_compiled_waves_reaches_the_next_one() -> None:
    logits = {}
    for compiled in (True, False):
        mesh, _ = _live_mesh(compiled)
        mesh.run_wave(Mode.INFER, Split.TEST, np.arange(2))
        mesh.nodes[(2, 3)].record(Split.TEST, 1, 35.0)  # a hot spot in map 1
        logits[compiled] = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(2)).logits
    assert np.array_equal(logits[True], logits[False])


def _repeat_opening(edge) -> None:
    """Make `edge` send its wave's PARAMS and BATCH again with every reply."""
    opening: list = []
    start, handle = edge.start, edge.handle

    def start_again(*args, **kwargs):
        opening[:] = start(*args, **kwargs)
        return list(opening)

    edge.start = start_again
    edge.handle = lambda message, now=0.0: handle(message, now) + list(opening)


def test_the_edge_repeating_its_parameters_is_counted_as_duplicates_not_a_crash() -> None:
    """PARAMS and BATCH sent again with every reply: the nodes drop the copies, as the
    machines do, and the wave ends as it would have."""
    results = {}
    for compiled in (True, False):
        mesh, _ = _live_mesh(compiled)
        _repeat_opening(mesh.edge)
        result = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
        results[compiled] = (result.loss, result.grads.copy(), mesh.node_stats()["duplicates"])
    assert results[True][0] == results[False][0]
    assert np.array_equal(results[True][1], results[False][1])
    assert results[True][2] == results[False][2] > 0


def test_tables_whose_ranges_leave_their_pool_are_refused_before_the_loop_runs() -> None:
    """The loop reads without bounds checks: a range past the lists would read memory
    that is not the tables'."""
    mesh, _ = _live_mesh(True)
    nodes = [mesh.nodes[cell] for cell in mesh.spec.topology.cells()]
    tables = tabulate(mesh.spec, nodes).tables
    validate(tables)
    with pytest.raises(ValueError, match="msg_rows"):
        validate(tables._replace(msg_rows=tables.msg_rows + len(tables.lists)))
