"""Several meshes training one model: bsp takes exactly the steps of one model with the
summed batch, ssp:0 is bsp, staleness stays within its bound, and the server and the
edges take only well-formed, in-order messages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshdl.config import RunConfig
from meshdl.data.augment import orientations, originals, training_data
from meshdl.data.datasets import Dataset
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.protocol.messages import EDGE, SERVER, Kind, Message, make
from meshdl.protocol.parts import Part, part_slice
from meshdl.protocol.payloads import Push
from meshdl.server.machine import ParameterServer
from meshdl.server.worker import Learnt, MeshWorker
from meshdl.sim.cluster import WaveShape
from meshdl.sync import Sync
from meshdl.training.loop import CentralEngine, batches, normalization
from meshdl.training.parallel import shards, train_parallel
from tests.test_mesh import _assert_same_parameters


def _data(rows: int, cols: int, samples: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    X = rng.normal(20.0, 3.0, (samples, rows, cols)).astype(np.float32)
    y = rng.integers(0, 2, samples)
    return Dataset(X, y, X[: samples // 2], y[: samples // 2], {})


def _config(rows: int, cols: int, meshes: int, sync: str, batch: int, epochs: int = 1,
            optimizer: str = "sgd", seed: int = 0, **train) -> RunConfig:
    return RunConfig(model={"rows": rows, "cols": cols, "filters": 2, "hidden": 6},
                     train={"epochs": epochs, "batch": batch, "optimizer": optimizer,
                            "lr": 0.05 if optimizer == "sgd" else 0.01, "seed": seed,
                            **train},
                     parallel={"meshes": meshes, "sync": sync})


def _central_steps(config: RunConfig, data: Dataset, batch: int) -> list[np.ndarray]:
    """The parameters of one model trained centrally with `batch`, after every step
    (as `training.train` does it: with the recipe's mirrored maps)."""
    tc = config.train
    data = training_data(tc, data)
    model = CNN(config.model, seed=tc.seed)
    model.set_normalization(*normalization(data.X_train))
    optimizer, engine = Optimizer(tc, model.flat.size), CentralEngine(data)
    rng = np.random.default_rng(tc.seed)
    n = originals(data)
    per_epoch = -(-n // batch)
    after = []
    for _ in range(tc.epochs):
        for idx in batches(n, batch, rng, orientations(tc)):
            _, _, grads = engine.loss_and_grads(model, idx)
            optimizer.step(model.flat, grads,
                           learning_rate(tc, optimizer.steps, tc.epochs * per_epoch))
            after.append(model.flat.copy())
    return after


def _parallel_steps(config: RunConfig, data: Dataset, **kwargs) -> tuple[list[np.ndarray],
                                                                          dict]:
    after: list[np.ndarray] = []
    _, history = train_parallel(config, data,
                                on_update=lambda _, params: after.append(params.copy()),
                                **kwargs)
    return after, history.parallel


def _as_model(config: RunConfig, flat: np.ndarray) -> CNN:
    model = CNN(config.model)
    model.flat[...] = flat
    return model


def _assert_steps_equal(config: RunConfig, actual: list[np.ndarray],
                        expected: list[np.ndarray]) -> None:
    optimizer = config.train.optimizer
    assert len(actual) == len(expected)
    for step, (mine, theirs) in enumerate(zip(actual, expected, strict=True), 1):
        _assert_same_parameters(_as_model(config, mine), _as_model(config, theirs),
                                elementwise=optimizer == "sgd", context=f"step {step}",
                                noise=None if optimizer == "sgd" else
                                np.abs(mine - theirs) > 1e-4 * (np.abs(theirs) + 1e-6),
                                bound=2 * config.train.lr * step)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meshes=st.integers(2, 4), rows=st.integers(3, 5), cols=st.integers(3, 6),
       batch=st.integers(1, 4), samples=st.integers(5, 30), seed=st.integers(0, 100),
       optimizer=st.sampled_from(["sgd", "adam"]), warmup=st.sampled_from([0.0, 0.5]),
       clip=st.sampled_from([0.0, 1e-3, 1.0]))
def test_bsp_on_n_meshes_equals_one_model_with_n_times_the_batch_after_every_step(
        meshes, rows, cols, batch, samples, seed, optimizer, warmup, clip) -> None:
    """Over many steps, with each mesh's gradient computed as the mesh computes it
    (tests/test_mesh.py proves the mesh equals the central model, step by step; over
    many steps a near-tie in a max-pool window can route one sample's gradient to
    another cell in the two summation orders, a different subgradient of the same
    loss, so the long runs here take the central engine for every mesh)."""
    data = _data(rows, cols, samples, seed)
    config = _config(rows, cols, meshes, "bsp", batch, epochs=2, optimizer=optimizer,
                     seed=seed, warmup_fraction=warmup, clip_norm=clip)
    config = config.model_copy(update={"mode": "central"})
    expected = _central_steps(config, data, meshes * batch)
    actual, report = _parallel_steps(config, data)
    assert report["updates"] == len(expected) and report["staleness"]["max"] == 0
    _assert_steps_equal(config, actual, expected)


@pytest.mark.parametrize("meshes, optimizer", [(2, "sgd"), (3, "adam"), (4, "sgd")])
def test_bsp_on_n_virtual_meshes_equals_one_model_with_n_times_the_batch(meshes,
                                                                        optimizer) -> None:
    data = _data(4, 5, 3 * meshes * 3, meshes)
    config = _config(4, 5, meshes, "bsp", 3, optimizer=optimizer, seed=meshes)
    _assert_steps_equal(config, _parallel_steps(config, data)[0],
                        _central_steps(config, data, meshes * 3))


def test_ssp_0_is_bsp_bit_for_bit() -> None:
    data = _data(4, 5, 40, 1)
    bsp, _ = _parallel_steps(_config(4, 5, 3, "bsp", 4, epochs=2), data)
    ssp0, _ = _parallel_steps(_config(4, 5, 3, "ssp:0", 4, epochs=2), data)
    assert len(bsp) == len(ssp0)
    for a, b in zip(bsp, ssp0, strict=True):
        assert a.tobytes() == b.tobytes()


def test_async_on_one_mesh_is_sequential_training() -> None:
    data = _data(4, 5, 24, 2)
    config = _config(4, 5, 1, "async", 5, epochs=2)
    expected = _central_steps(config, data, 5)
    actual, report = _parallel_steps(config, data)
    assert report["staleness"]["max"] == 0
    for mine, theirs in zip(actual, expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_n_asynchronous_updates_on_the_same_weights_add_up_to_one_synchronous_step() -> None:
    """Each asynchronous update is one mesh's share of a global batch (`Sync.lr_share`):
    plain SGD, the meshes' first gradients all on the initial weights."""
    data = _data(4, 5, 48, 2)
    plain = {"momentum": 0.0, "warmup_fraction": 0.0, "schedule": "constant",
             "clip_norm": 0.0}
    bsp, _ = _parallel_steps(_config(4, 5, 3, "bsp", 4, **plain), data)
    asynchronous, _ = _parallel_steps(_config(4, 5, 3, "async", 4, **plain), data)
    np.testing.assert_allclose(asynchronous[2], bsp[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(asynchronous[0], bsp[0], rtol=1e-5, atol=1e-6)


def _straggler(factor: float):
    """Mesh 0's waves take `factor` times the others'."""
    return lambda engines, i: WaveShape(factor, factor, factor) if i == 0 else \
        WaveShape(1.0, 1.0, 1.0)


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_ssp_staleness_never_exceeds_its_bound_even_with_a_straggler(bound) -> None:
    data = _data(3, 4, 80, 3)
    _, report = _parallel_steps(_config(3, 4, 4, f"ssp:{bound}", 2, epochs=2), data,
                                wave_time=_straggler(5.0))
    assert report["staleness"]["max"] == bound  # reached: the fast meshes run ahead
    fast = report["per_mesh"][1]
    assert fast["waited"] > 0  # ... and then wait for the straggler


def test_async_staleness_grows_with_a_straggler_and_nobody_waits() -> None:
    data = _data(3, 4, 80, 3)
    _, report = _parallel_steps(_config(3, 4, 4, "async", 2, epochs=1), data,
                                wave_time=_straggler(5.0))
    assert report["staleness"]["max"] > 3
    assert all(mesh["waited"] == 0 for mesh in report["per_mesh"])
    assert report["updates"] == sum(mesh["steps"] for mesh in report["per_mesh"])


def test_a_short_last_batch_leaves_some_meshes_an_empty_shard() -> None:
    parts = shards(np.arange(2), 4)
    assert [len(p) for p in parts] == [1, 1, 0, 0]
    data = _data(3, 4, 10, 4)  # batches of 4 x 2: the last global batch holds 2 samples
    config = _config(3, 4, 4, "bsp", 2)
    expected = _central_steps(config, data, 8)
    actual, report = _parallel_steps(config, data)
    np.testing.assert_allclose(actual[-1], expected[-1], rtol=1e-5, atol=1e-6)
    assert sum(mesh["samples"] for mesh in report["per_mesh"]) == 10


# -- the machines: what they take, what they refuse ---------------------------------------

def _server(sync: str = "bsp", meshes=(1, 2)) -> ParameterServer:
    config = _config(3, 4, len(meshes), sync, 2, clip_norm=0.0)
    model = CNN(config.model)
    return ParameterServer(model, Optimizer(config.train, model.flat.size), list(meshes),
                           Sync.parse(sync), lambda _: 0.1)


def _push(server: ParameterServer, mesh: int, clock: int, based_on: int = 0,
          samples: int = 2, value: float = 1.0, session: int = 0, size: int | None = None):
    gradient = np.full(size or server.model.flat.size, value, np.float32)
    return make(Kind.PUSH, mesh, clock, EDGE, SERVER,
                Push(based_on, samples, 1, 0.5, gradient).pack(), session=session)


def test_server_updates_once_every_mesh_pushed_a_clock_and_sends_to_all() -> None:
    server = _server()
    before = server.model.flat.copy()
    assert server.handle(_push(server, 1, 1)) == []
    assert server.version == 0
    out = server.handle(_push(server, 2, 1, value=3.0, samples=6))
    assert server.version == 1 and [m.header.mesh for m in out] == [1, 2]
    # The mean weighted by samples: (2 x 1 + 6 x 3) / 8 = 2.5, times lr 0.1.
    np.testing.assert_allclose(before - server.model.flat, 0.25, rtol=1e-6)
    assert out[0].kind == Kind.WEIGHTS and out[0].header.step == 1


@pytest.mark.parametrize("case, reason, answered", [
    ("duplicate", "duplicates", True),
    ("skipped clock", "rejected:out_of_order", True),
    ("unknown mesh", "rejected:not_for_me", False),
    ("wrong size", "rejected:bad_push", False),
    ("from the future", "rejected:bad_push", False),
    ("more correct than samples", "rejected:bad_push", False),
    ("too stale", "rejected:too_stale", False),
])
def test_server_refuses_what_is_not_the_next_valid_push_and_changes_nothing(
        case, reason, answered) -> None:
    server = _server("ssp:1")
    server.handle(_push(server, 1, 1))
    server.handle(_push(server, 2, 1))
    server.handle(_push(server, 1, 2))
    server.handle(_push(server, 2, 2))  # version 2, both meshes at clock 2
    message = {
        "duplicate": _push(server, 1, 2),
        "skipped clock": _push(server, 1, 4),
        "unknown mesh": _push(server, 9, 1),
        "wrong size": _push(server, 1, 3, based_on=2, size=5),
        "from the future": _push(server, 1, 3, based_on=3),
        "more correct than samples": make(
            Kind.PUSH, 1, 3, EDGE, SERVER,
            Push(2, 1, 5, 0.5, np.zeros(server.model.flat.size)).pack()),
        "too stale": _push(server, 1, 3, based_on=0),
    }[case]
    flat, clocks = server.model.flat.copy(), dict(server.clock)
    out = server.handle(message)
    # A duplicate's mesh missed the answer, a mesh ahead missed a restart: the weights
    # tell either where training stands.
    assert [(m.kind, m.header.mesh, m.header.step) for m in out] == \
        ([(Kind.WEIGHTS, 1, 2)] if answered else [])
    assert server.stats[reason] == 1
    assert server.clock == clocks and server.version == 2
    assert np.array_equal(server.model.flat, flat)


def test_a_push_whose_clock_waits_for_other_meshes_is_not_answered_twice() -> None:
    server = _server()
    server.handle(_push(server, 1, 1))
    assert server.handle(_push(server, 1, 1)) == []  # the update is not made yet
    assert server.stats["duplicates"] == 1 and server.stats["resent"] == 0


def test_an_edge_goes_on_from_the_weights_of_a_restarted_server() -> None:
    config = _config(3, 4, 2, "bsp", 2)
    model = CNN(config.model)
    worker = MeshWorker(1, Sync.parse("bsp"), model, session=None)
    worker.assign([np.arange(2)] * 4)
    worker.begin()
    worker.push(None)
    weights = np.full(model.flat.size, 1.0, np.float32)
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, weights, session=5))
    assert worker.session == 5 and worker.version == 1 and not worker.rewound
    worker.begin()
    worker.push(None)  # clock 2 pushed; then the server restarts from clock 1's checkpoint
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, weights * 2, session=6))
    assert worker.rewound and worker.clock == 1 and worker.version == 1
    assert np.all(model.flat == 2.0) and not worker.shards  # its shards from clock 1 again


def test_async_server_answers_only_the_mesh_that_pushed() -> None:
    server = _server("async")
    out = server.handle(_push(server, 2, 1))
    assert server.version == 1 and [m.header.mesh for m in out] == [2]
    server.handle(_push(server, 1, 1, based_on=0))
    assert server.staleness == {0: 1, 1: 1}


def test_worker_keeps_its_wave_on_one_set_of_weights() -> None:
    config = _config(3, 4, 2, "ssp:1", 2)
    model = CNN(config.model)
    worker = MeshWorker(1, Sync.parse("ssp:1"), model)
    worker.assign([np.arange(2), np.arange(2, 4), np.arange(4, 6)])
    step = worker.begin()
    assert step.based_on == 0
    fresh = np.full(model.flat.size, 7.0, np.float32)
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, fresh))
    assert worker.version == 0 and not np.all(model.flat == 7.0)  # held: a wave runs
    worker.push(Learnt(1, 0.3, np.zeros(model.flat.size, np.float32)))
    assert worker.version == 1 and np.all(model.flat == 7.0)  # taken when it ended
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, fresh * 0))  # not newer
    assert worker.stats["stale"] == 1 and np.all(model.flat == 7.0)
    worker.handle(make(Kind.WEIGHTS, 2, 5, SERVER, EDGE, fresh))  # another mesh's
    worker.handle(make(Kind.WEIGHTS, 1, 5, SERVER, EDGE, fresh[:3]))
    assert worker.stats["rejected:not_for_me"] == 1
    assert worker.stats["rejected:bad_shape"] == 1


def test_worker_runs_at_most_its_bound_ahead_of_the_weights_it_holds() -> None:
    config = _config(3, 4, 2, "ssp:2", 2)
    model = CNN(config.model)
    worker = MeshWorker(1, Sync.parse("ssp:2"), model)
    worker.assign([np.arange(2)] * 5)
    for _ in range(3):  # clocks 1, 2, 3 on version 0: 0 >= 2 - 2
        assert worker.ready
        worker.begin()
        worker.push(None)
    assert not worker.ready  # clock 4 needs version >= 1
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, model.flat))
    assert worker.ready


@pytest.mark.parametrize("text", ["ssp", "ssp:-1", "ssp:1001", "BSP", "async:1", ""])
def test_an_unknown_sync_mode_is_a_usage_error(text) -> None:
    with pytest.raises(UsageError, match="expected bsp, ssp:S"):
        Sync.parse(text)


def test_sync_names_read_back() -> None:
    assert [str(Sync.parse(t)) for t in ("bsp", "ssp:0", "ssp:3", "async")] == \
        ["bsp", "bsp", "ssp:3", "async"]


def test_train_on_several_meshes_writes_the_servers_and_each_meshs_figures(cli,
                                                                             tmp_path) -> None:
    code, out, err = cli("train", "--rows", "4", "--cols", "5", "--epochs", "1", "--batch",
                         "40", "--meshes", "3", "--sync", "ssp:1", "--out", tmp_path / "run",
                         "--json")
    assert code == 0, err
    parallel = json.loads(out)["parallel"]
    assert parallel["meshes"] == 3 and parallel["sync"] == "ssp:1"
    assert parallel["staleness"]["max"] <= 1
    assert [m["mesh_id"] for m in parallel["per_mesh"]] == [1, 2, 3]
    assert sum(m["samples"] for m in parallel["per_mesh"]) == 2400
    assert "on 3 meshes (ssp:1)" in err


def test_an_impossible_sync_flag_is_a_one_line_usage_error(cli) -> None:
    code, _, err = cli("train", "--meshes", "2", "--sync", "ssp:x")
    assert code == 2
    assert err.count("\n") == 1 and "parallel.sync" in err


def _overlap(config: RunConfig, on: bool) -> RunConfig:
    return config.model_copy(update={"parallel": config.parallel.model_copy(
        update={"overlap": on})})


@pytest.mark.parametrize("sync", ["bsp", "ssp:2", "async"])
def test_overlap_changes_when_things_travel_never_the_values(sync) -> None:
    data = _data(4, 5, 40, 5)
    config = _config(4, 5, 3, sync, 4, epochs=2)
    plain, _ = _parallel_steps(config, data)
    overlapped, report = _parallel_steps(_overlap(config, True), data)
    assert report["overlap"] is True
    assert len(plain) == len(overlapped)
    for a, b in zip(plain, overlapped, strict=True):
        assert a.tobytes() == b.tobytes()


def _overlap_server() -> ParameterServer:
    config = _config(3, 4, 2, "bsp", 2, clip_norm=0.0)
    model = CNN(config.model)
    return ParameterServer(model, Optimizer(config.train, model.flat.size), [1, 2],
                           Sync.parse("bsp"), lambda _: 0.1, overlap=True)


def _part(server: ParameterServer, mesh: int, part: Part, samples: int = 2,
          clock: int = 1) -> Message:
    size = server.model.flat[part_slice(part, server.model.config)].size
    return make(Kind.PUSH, mesh, clock, EDGE, SERVER,
                Push(0, samples, 1, 0.5, np.ones(size, np.float32)).pack(), layer=part)


def test_with_overlap_the_server_updates_once_both_parts_of_every_mesh_are_in() -> None:
    server = _overlap_server()
    for mesh in (1, 2):
        assert server.handle(_part(server, mesh, Part.HEAD)) == []
    assert server.handle(_part(server, 1, Part.CONV)) == []
    out = server.handle(_part(server, 2, Part.CONV))
    assert server.version == 1
    # The conv layers' weights to every mesh first, then the head's.
    assert [(m.header.layer, m.header.mesh) for m in out] == \
        [(Part.CONV, 1), (Part.CONV, 2), (Part.HEAD, 1), (Part.HEAD, 2)]


@pytest.mark.parametrize("case", ["parts disagree", "whole with overlap", "part twice"])
def test_with_overlap_the_server_refuses_parts_that_do_not_make_one_step(case) -> None:
    server = _overlap_server()
    server.handle(_part(server, 1, Part.HEAD))
    message, reason = {
        "parts disagree": (_part(server, 1, Part.CONV, samples=3), "rejected:parts_disagree"),
        "whole with overlap": (_push(server, 1, 1), "rejected:bad_part"),
        "part twice": (_part(server, 1, Part.HEAD), "duplicates"),
    }[case]
    assert server.handle(message) == []
    assert server.stats[reason] == 1 and server.clock[1] == 0
    plain = _server()
    assert plain.handle(_part(plain, 1, Part.HEAD)) == []  # parts without overlap
    assert plain.stats["rejected:bad_part"] == 1


def test_a_wave_started_on_new_conv_weights_takes_the_heads_of_its_version_at_once() -> None:
    config = _config(3, 4, 2, "bsp", 2)
    model = CNN(config.model)
    worker = MeshWorker(1, Sync.parse("bsp"), model)
    worker.assign([np.arange(2), np.arange(2, 4)])
    conv, head = part_slice(Part.CONV, config.model), part_slice(Part.HEAD, config.model)
    worker.begin()
    worker.push(None, Part.HEAD)
    worker.push(None, Part.CONV)
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, np.full(model.flat[conv].size, 2.0),
                       layer=Part.CONV))
    step = worker.begin()  # on the conv layers' version 1, the head's still 0
    assert step.based_on == 1 and not worker.head_ready
    worker.handle(make(Kind.WEIGHTS, 1, 1, SERVER, EDGE, np.full(model.flat[head].size, 3.0),
                       layer=Part.HEAD))
    assert worker.head_ready and np.all(model.flat[head] == 3.0)  # taken mid-wave
    worker.handle(make(Kind.WEIGHTS, 1, 2, SERVER, EDGE, np.full(model.flat[conv].size, 4.0),
                       layer=Part.CONV))
    assert np.all(model.flat[conv] == 2.0)  # the next version's: held till the wave ends
