"""In-mesh training equals centralized training, step by step, for many configurations;
the halo counts are exact; the wave is pipelined."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshdl import CNN, ModelConfig, TrainConfig
from meshdl.config import param_shapes
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import views
from meshdl.model.optim import Optimizer, learning_rate
from meshdl.protocol.accounting import Ledger, formula_halo_values, needed_halo_values
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topology import window_offsets
from meshdl.sim.faults.chaos import Chaos
from meshdl.sim.mesh import MeshEngine
from meshdl.training.failout import failout_cells
from meshdl.training.loop import CentralEngine


def _dataset(config: ModelConfig, samples: int, seed: int, levels: int = 0
             ) -> Dataset | SimpleNamespace:
    """Random maps; several input channels need (N, c, rows, cols), which the engines
    take but a temperature Dataset does not hold. `levels`: readings take only that
    many values, so that windows repeat and maxima tie."""
    rng = np.random.default_rng(seed)
    shape = (samples, config.in_channels, config.rows, config.cols)
    X = rng.normal(20.0, 3.0, shape).astype(np.float32)
    if levels:
        X = (20.0 + 3.0 * rng.integers(0, levels, shape)).astype(np.float32)
    y = rng.integers(0, config.classes, samples)
    half = max(1, samples // 2)
    if config.in_channels > 1:
        return SimpleNamespace(X_train=X, y_train=y, X_test=X[:half], y_test=y[:half])
    return Dataset(X[:, 0], y, X[:half, 0], y[:half], {})


def _assert_lockstep(config: ModelConfig, edge_at, batch: int, steps: int, optimizer: str,
                     seed: int = 0, chaos: Chaos | None = None,
                     wire: bool = True, params_via: str = "tree", auth: bool = False,
                     memory_plan: bool = True, levels: int = 0, failout: float = 0.0,
                     **recipe: Any) -> MeshEngine:
    """Train a central and a mesh model side by side; parameters agree after every step.

    `wire`: every message crosses as bytes through the codec (as over MQTT), or as the
    in-process objects of the default virtual mesh; `auth`: every message sealed and
    opened with its parties' keys (meshdl/protocol/auth.py). `recipe`: TrainConfig fields beyond
    the optimizer (warm-up, clipping), at their defaults unless given; the learning
    rate follows the schedule over `steps` updates as in `training.train`."""
    data = _dataset(config, batch * steps, seed, levels)
    train = TrainConfig(optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.01,
                        **recipe)
    central, mesh = CNN(config, seed=seed), CNN(config, seed=seed)
    for model in (central, mesh):
        model.set_normalization(20.0, 3.0)
    opt_c, opt_m = Optimizer(train, central.flat.size), Optimizer(train, mesh.flat.size)
    ref = CentralEngine(data)
    engine = MeshEngine(data, edge_at=edge_at, chaos=chaos, wire=wire, params_via=params_via,
                        auth=auth, memory_plan=memory_plan)
    noise = np.zeros(central.flat.size, bool)  # gradients Adam amplifies float32 noise of
    for step in range(steps):
        idx = np.arange(step * batch, (step + 1) * batch)
        dead = failout_cells(config.rows, config.cols, failout, seed, step)
        loss_c, logits_c, grads_c = ref.loss_and_grads(central, idx, dead)
        loss_m, logits_m, grads_m = engine.loss_and_grads(mesh, idx, dead)
        assert loss_m == pytest.approx(loss_c, rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(logits_m, logits_c, rtol=1e-4, atol=1e-5)
        # Adam's first step moves a weight by lr * g / (|g| + eps): a summation-order
        # difference d in g shows as d / (|g| + eps) of lr, large where |g| ~ eps.
        noise |= np.abs(grads_m - grads_c) > 1e-4 * (np.abs(grads_c) + 1e-8)
        assert np.linalg.norm(grads_m - grads_c) <= 1e-5 * np.linalg.norm(grads_c) + 1e-9
        lr = learning_rate(train, step, steps)
        opt_c.step(central.flat, grads_c, lr)
        opt_m.step(mesh.flat, grads_m, lr)
        _assert_same_parameters(mesh, central, elementwise=optimizer == "sgd",
                                context=f"step {step + 1}",
                                noise=noise if optimizer == "adam" else None,
                                bound=2 * train.lr * (step + 1))
    test_idx = np.arange(len(data.y_test))
    np.testing.assert_allclose(engine.logits(mesh, "test", test_idx),
                               central.forward(data.X_test), rtol=1e-4, atol=1e-5)
    return engine


def _assert_same_parameters(mesh: CNN, central: CNN, elementwise: bool, context: str,
                            noise: np.ndarray | None = None, bound: float = 0.0) -> None:
    """Every parameter tensor agrees to 1e-5 relative (in norm); elementwise too for SGD.

    Adam divides each gradient by its own running magnitude, so a weight whose gradient
    is near Adam's eps (~1e-8, e.g. fed by a ReLU output that rounds to 0 in one
    summation order and to 1e-9 in another) moves by up to the learning rate either way
    for a float32 difference far below 1e-5. Those elements (`noise`) are held to that
    bound instead; the gradients themselves agree to float32 rounding.
    """
    if noise is None:
        noise = np.zeros(central.flat.size, bool)
    noisy = views(noise, param_shapes(central.config))
    for name, expected in central.params.items():
        actual = mesh.params[name]
        mask = noisy[name]
        assert np.all(np.abs(actual - expected)[mask] <= bound + 1e-6), f"{context}: {name}"
        actual, expected = np.where(mask, 0, actual), np.where(mask, 0, expected)
        # 1e-5 relative, with the elementwise check's 1e-6 as an absolute floor: a tensor
        # of tiny values (a bias near 1e-4) differs by float32 rounding far above 1e-5 of
        # its own norm.
        difference = float(np.linalg.norm(actual - expected))
        allowed = 1e-5 * float(np.linalg.norm(expected)) + 1e-6 * np.sqrt(expected.size)
        assert difference <= allowed, (f"{context}: {name} differs by {difference:.2e} "
                                       f"(norm; allowed {allowed:.2e})")
        if elementwise:
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{context}: {name}")


def test_parameter_check_accepts_float32_rounding_of_tiny_parameters() -> None:
    # Once seen from hypothesis (2 x 7 grid, k 5, batch 1, SGD): conv1.bias 1.7399e-4 in
    # the mesh vs 1.7398e-4 centrally, 6e-5 of the bias's norm but one float32 rounding.
    config = ModelConfig(rows=2, cols=7, kernel=5, filters=1, hidden=2)
    central, mesh = CNN(config, seed=0), CNN(config, seed=0)
    central.params["conv1.bias"][...] = 1.7398e-4
    mesh.params["conv1.bias"][...] = 1.7399e-4
    _assert_same_parameters(mesh, central, elementwise=True, context="rounding")
    mesh.params["conv1.bias"][...] = 1.9e-4  # a real difference still fails
    with pytest.raises(AssertionError, match=r"conv1\.bias"):
        _assert_same_parameters(mesh, central, elementwise=False, context="bug")


@st.composite
def mesh_setups(draw):
    rows = draw(st.integers(1, 6))
    cols = draw(st.integers(1, 7))
    kernel = draw(st.integers(1, min(5, max(rows, cols))))
    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=draw(st.integers(1, 3)),
                         conv_layers=draw(st.integers(1, 3)),
                         pool=draw(st.sampled_from([1, 2, 3, "global"])),
                         in_channels=draw(st.integers(1, 2)), hidden=draw(st.integers(1, 8)),
                         classes=draw(st.integers(2, 3)))
    border = [(r, c) for r in range(rows) for c in range(cols)
              if r in (0, rows - 1) or c in (0, cols - 1)]
    return config, draw(st.sampled_from(border)), draw(st.integers(1, 6)), \
        draw(st.sampled_from(["sgd", "adam"]))


# The recipe's parts that act on the whole gradient: a clip norm of 1e-3 shortens every
# step's gradient (the edge computes the norm from the reduced flat vector), 1.0 some.
recipes = st.fixed_dictionaries({
    "warmup_fraction": st.sampled_from([0.0, 0.5, 1.0]),
    "clip_norm": st.sampled_from([0.0, 1e-3, 1.0]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=mesh_setups(), seed=st.integers(0, 1000), wire=st.booleans(),
       params_via=st.sampled_from(["tree", "broadcast"]), recipe=recipes,
       memory_plan=st.booleans(), failout=st.sampled_from([0.0, 0.0, 0.2, 0.5]))
def test_mesh_training_equals_central_training_after_every_step(setup, seed, wire,
                                                                 params_via, recipe,
                                                                 memory_plan, failout) -> None:
    """With the memory plan (nodes/memory.py: weight gradients above the first layer
    split by input cell, gradients over dead activations) and without it; with cells
    failing out of each step (the same in both) and without."""
    config, edge_at, batch, optimizer = setup
    _assert_lockstep(config, edge_at, batch, steps=3, optimizer=optimizer, seed=seed,
                     wire=wire, params_via=params_via, memory_plan=memory_plan,
                     failout=failout, **recipe)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=mesh_setups(), seed=st.integers(0, 1000), levels=st.integers(1, 3),
       memory_plan=st.booleans())
def test_global_pooling_in_the_mesh_equals_central_training_when_readings_repeat(
        setup, seed, levels, memory_plan) -> None:
    """Readings of one to three values: windows repeat, so maxima tie between cells
    (with equal windows; the test below makes different windows tie)."""
    config, edge_at, batch, optimizer = setup
    config = config.model_copy(update={"pool": "global"})
    _assert_lockstep(config, edge_at, batch, steps=3, optimizer=optimizer, seed=seed,
                     memory_plan=memory_plan, levels=levels)


@pytest.mark.parametrize("edge_at", [(0, 0), (16, 24), (8, 0)])
def test_seed_grid_with_global_pooling_trains_identically_in_the_mesh(edge_at) -> None:
    _assert_lockstep(ModelConfig(pool="global"), edge_at, batch=20, steps=2,
                     optimizer="adam")


@pytest.mark.parametrize("pool", [2, "global"])
def test_seed_grid_with_a_fifth_of_the_cells_failing_out_trains_identically_in_the_mesh(
        pool) -> None:
    _assert_lockstep(ModelConfig(pool=pool), (0, 0), batch=20, steps=2, optimizer="adam",
                     failout=0.2)


def test_messages_as_objects_or_as_bytes_give_bit_identical_steps() -> None:
    config = ModelConfig(rows=7, cols=9, hidden=8)
    data = _dataset(config, 12, seed=5)
    results = []
    for wire in (False, True):
        model = CNN(config, seed=1)
        model.set_normalization(20.0, 3.0)
        engine = MeshEngine(data, wire=wire)
        loss, logits, grads = engine.loss_and_grads(model, np.arange(12))
        results.append((loss, logits.copy(), grads.copy(), engine.report()))
    (loss_o, logits_o, grads_o, comm_o), (loss_w, logits_w, grads_w, comm_w) = results
    assert loss_o == loss_w
    np.testing.assert_array_equal(logits_o, logits_w)
    np.testing.assert_array_equal(grads_o, grads_w)
    assert comm_o["classes"] == comm_w["classes"]  # the same bytes are counted


@pytest.mark.parametrize("edge_at", [(0, 0), (16, 24), (8, 0), (0, 12)])
def test_seed_configuration_trains_identically_in_the_mesh(edge_at) -> None:
    _assert_lockstep(ModelConfig(), edge_at, batch=20, steps=2, optimizer="adam")


@pytest.mark.parametrize(("rows", "cols", "kernel", "c_in"),
                         [(17, 25, 3, 1), (6, 9, 4, 2), (5, 5, 5, 1), (1, 7, 3, 1),
                          (4, 4, 1, 3), (3, 8, 6, 1)])
def test_needed_halo_values_equal_the_exact_border_aware_count(rows, cols, kernel, c_in):
    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, in_channels=c_in, filters=2,
                         hidden=4)
    before, after = window_offsets(kernel)
    # Closed form: a cell obtains its neighbour at offset (dy, dx) iff that neighbour is in
    # the grid, which holds for (rows - |dy|) * (cols - |dx|) cells.
    exact = sum(max(rows - abs(dy), 0) * max(cols - abs(dx), 0)
                for dy in range(-before, after + 1) for dx in range(-before, after + 1)
                if (dy, dx) != (0, 0))
    spec = MeshSpec(1, config)
    assert needed_halo_values(spec, 1) == exact * c_in
    assert needed_halo_values(spec, 2) == exact * config.filters
    assert formula_halo_values(spec, 1) == (kernel**2 - 1) * rows * cols * c_in
    engine = _assert_lockstep(config, (0, 0), batch=3, steps=1, optimizer="sgd")
    halo = engine.report()["halo"]
    # The relays carry nothing a receiver's window does not need: transmitted == needed.
    assert halo["conv1"]["transmitted"] == exact * c_in
    assert halo["conv2"]["transmitted"] == exact * config.filters


def test_wave_is_pipelined_and_as_deep_as_the_mesh() -> None:
    engine = _assert_lockstep(ModelConfig(), (0, 0), batch=4, steps=1, optimizer="sgd")
    depth = engine.report()["wave_depth"]
    stages = depth["finished_round"]
    near_conv2 = stages["conv2"]["r0c0"]
    far_conv1 = stages["conv1"]["r16c24"]
    assert near_conv2 < far_conv1, "a node near the edge finishes conv2 before the far " \
        "side has finished conv1"
    assert depth["diameter"] == 40
    assert 0 <= depth["forward_rounds"] - depth["edge_hops_to_far_corner"] <= 6


def test_counts_cover_every_message_class() -> None:
    engine = _assert_lockstep(ModelConfig(rows=6, cols=8, hidden=4), (0, 0), batch=2, steps=1,
                              optimizer="sgd")
    comm = engine.report()
    assert set(comm["classes"]) == {"params", "halo/conv1", "halo/conv2", "pool", "gather",
                                    "scatter", "grad-halo/conv2", "reduce"}
    for counts in comm["classes"].values():
        assert counts["bytes"] > counts["values"] * 4  # headers are counted
        assert 0 < counts["broadcast"]["transmissions"] <= counts["messages"]
    assert comm["total_messages"] == sum(c["messages"] for c in comm["classes"].values())
    assert comm["busiest_link"]["bytes"] > 0


def test_a_wave_that_sends_the_same_messages_in_another_order_counts_as_a_repeat() -> None:
    """Under simulated time backoffs reorder a wave's messages: the ledger takes such a
    wave for a repeat of the one before (no recount), a wave of as many other messages
    for a wave of its own, and counts the run as the sum of its waves."""
    config = ModelConfig(rows=4, cols=5, hidden=4)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    # Every message as an object to record: through the node machines.
    engine = MeshEngine(_dataset(config, 6, seed=3), compiled=False)
    engine.loss_and_grads(model, np.arange(2))
    spec = engine.mesh.spec
    waves: list[list] = []
    for _ in range(4):
        engine.mesh.ledger = Ledger(spec)
        engine.mesh.ledger.record = (wave := []).append  # type: ignore[method-assign]
        engine.loss_and_grads(model, np.arange(2))
        waves.append(wave)
    rng = np.random.default_rng(0)
    shuffled = [waves[1][i] for i in rng.permutation(len(waves[1]))]
    other = [*waves[2][:-1], waves[2][0]]  # as many messages, one of them another's
    run = [waves[0], shuffled, other, waves[3]]
    ledger = Ledger(spec)
    repeats = []
    for wave in run:
        for message in wave:
            ledger.record(message)
        ledger.tally()
        repeats.append(ledger._repeats)  # before the next wave closes this one
    ledger._end_wave()
    repeats.append(ledger._repeats)
    assert repeats[1:] == [1, 2, 1, 1]  # the shuffled wave repeats; the other does not

    def counted(wave: list) -> dict:
        alone = Ledger(spec)
        for message in wave:
            alone.record(message)
        return alone.report()

    report, parts = ledger.report(), [counted(wave) for wave in run]
    assert report["waves"] == 4
    for figure in ("total_messages", "total_bytes", "broadcast_transmissions",
                   "broadcast_bytes"):
        assert report[figure] == sum(part[figure] for part in parts), figure
    for name, counts in report["classes"].items():
        assert counts["bytes"] == sum(part["classes"][name]["bytes"] for part in parts)


def test_broadcast_parameters_reach_every_node_in_one_publish() -> None:
    config = ModelConfig(rows=4, cols=5, hidden=4)
    engine = _assert_lockstep(config, (0, 0), batch=2, steps=1, optimizer="sgd",
                              params_via="broadcast")
    report = engine.report()
    params, waves = report["classes"]["params"], report["waves"]
    assert params["broadcast"]["transmissions"] == 2 * waves  # PARAMS and BATCH, once each
    assert params["messages"] == 2 * waves * 4 * 5  # a broker delivers each to all 20 nodes


def test_the_ledger_counts_a_run_as_the_sum_of_its_waves() -> None:
    """Repeated waves are counted as repeats of one; a different wave between them (an
    inference pass, another batch size) is counted on its own; nothing is lost."""
    config = ModelConfig(rows=4, cols=5, hidden=4)
    data = _dataset(config, 6, seed=3)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)

    def comm(*waves: tuple[str, int]) -> dict:
        engine = MeshEngine(data)
        for kind, batch in waves:
            if kind == "train":
                engine.loss_and_grads(model, np.arange(batch))
            else:
                engine.logits(model, "test", np.arange(batch))
        return engine.report()

    run = comm(("train", 2), ("train", 2), ("infer", 3), ("train", 2), ("train", 3))
    parts = [comm(("train", 2)), comm(("infer", 3)), comm(("train", 3))]
    expected = [3, 1, 1]  # times each part occurs in the run
    assert run["waves"] == 5
    for figure in ("total_messages", "total_bytes", "broadcast_transmissions",
                   "broadcast_bytes"):
        assert run[figure] == sum(n * part[figure] for n, part in zip(expected, parts,
                                                                        strict=True)), figure
    for name, counts in run["classes"].items():
        for figure in ("values", "messages", "bytes"):
            assert counts[figure] == sum(n * part["classes"].get(name, {}).get(figure, 0)
                                         for n, part in zip(expected, parts, strict=True))


@pytest.mark.parametrize("edge_at", [(0, 0), (2, 2), (0, 1), (1, 0)])
def test_global_pooling_gives_a_tie_between_different_windows_to_the_first_cell(
        edge_at) -> None:
    """Two cells of each map hold the same maximum from different input channels
    ((2, 0) and (0, 2) under equal weights), so which cell wins shows in conv1's weight
    gradient; over many placements the two subtrees, and a cell and its own tree
    ancestor, tie both ways round."""
    config = ModelConfig(rows=3, cols=3, in_channels=2, kernel=1, conv_layers=1, filters=2,
                         pool="global", hidden=4)
    rng = np.random.default_rng(3)
    samples = 24
    X = np.zeros((samples, 2, 3, 3), np.float32)
    for sample in range(samples):
        first, second = rng.choice(9, size=2, replace=False)
        X[sample, 0].flat[first] = 2.0
        X[sample, 1].flat[second] = 2.0
    y = rng.integers(0, 2, samples)
    data = SimpleNamespace(X_train=X, y_train=y, X_test=X, y_test=y)
    central, mesh = CNN(config, seed=1), CNN(config, seed=1)
    for model in (central, mesh):
        model.params["conv1.weight"][0] = 1.0  # filter 0: the two channels alike
        model.params["conv1.bias"][0] = 0.0
    for index in range(samples):  # one map a step: each tie decides a whole gradient
        _, _, grads_c = CentralEngine(data).loss_and_grads(central, np.array([index]))
        _, _, grads_m = MeshEngine(data, edge_at=edge_at).loss_and_grads(
            mesh, np.array([index]))
        np.testing.assert_allclose(grads_m, grads_c, rtol=1e-5, atol=1e-7)
