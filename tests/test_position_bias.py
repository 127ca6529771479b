"""The position bias (`ModelConfig.position_bias`): a learned bias per filter and cell
at the last conv layer, what a filter shared by every cell cannot learn (where in this
room anomalies show). Its forward and gradient against PyTorch and finite differences,
its mirror (the room flips with the map while training on mirrors), the int8 emulation,
the mesh (which carries the table in PARAMS, runs it, and trains it as central training
does, step by step, over mirrored maps and cells failing out, in process and over the
wire), and the places that must refuse it (another grid, a windowed head, overlap)."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import ModelConfig, load_run_config
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN, oriented_position
from meshdl.model.mirrors import mirror_banks

ROWS, COLS = 5, 6


def _config(**over) -> ModelConfig:
    return ModelConfig(**{"rows": ROWS, "cols": COLS, "pool": "global", "alive": True,
                          "in_channels": 2, "filters": 3, "hidden": 7, "conv_layers": 2,
                          "position_bias": True, **over})


def _maps(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(batch, 2, ROWS, COLS)).astype(np.float32)
    X[:, 1] = 1.0  # the alive mask
    return X, rng.integers(0, 2, batch)


def _with_position(seed: int = 1) -> CNN:
    model = CNN(_config(), seed=0)
    rng = np.random.default_rng(seed)
    model.params["position"][...] = rng.normal(0, 0.5, model.params["position"].shape)
    return model


def test_a_zero_position_bias_is_the_plain_model_to_the_bit():
    plain = CNN(_config(position_bias=False), seed=0)
    model = CNN(_config(), seed=0)
    n = plain.flat.size
    assert np.array_equal(model.flat[:n], plain.flat)  # the other parameters keep places
    assert not model.params["position"].any()
    X, y = _maps(4)
    dead = np.array([3, 17], np.int32)
    loss, logits = model.gradient_pass(X, y, dead)
    loss0, logits0 = plain.gradient_pass(X, y, dead)
    assert loss == loss0 and np.array_equal(logits, logits0)
    assert np.array_equal(model.grad_flat[:n], plain.grad_flat)


@pytest.mark.torch
def test_forward_and_gradients_equal_pytorch_with_mirrored_maps_and_dead_cells():
    torch = pytest.importorskip("torch")
    model = _with_position()
    X, y = _maps(6)
    orientation = np.array([0, 1, 2, 3, 2, 0])
    dead = np.array([0, 8, 29], np.int32)
    loss, logits = model.gradient_pass(X, y, dead, orientation)
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in model.params.items()}
    alive = torch.ones(ROWS * COLS, dtype=torch.float64)
    alive[torch.from_numpy(dead.astype(np.int64))] = 0
    alive = alive.reshape(1, 1, ROWS, COLS)
    h = torch.tensor(X, dtype=torch.float64) * alive
    pos = torch.stack([p["position"], p["position"].flip(1), p["position"].flip(2),
                       p["position"].flip(1, 2)])[torch.from_numpy(orientation)]
    h = torch.relu(torch.nn.functional.conv2d(h, p["conv1.weight"], p["conv1.bias"],
                                              padding=1)) * alive
    h = torch.nn.functional.conv2d(h, p["conv2.weight"], p["conv2.bias"], padding=1) + pos
    h = torch.relu(h) * alive
    features = h.amax(dim=(2, 3))
    hidden = torch.relu(features @ p["fc1.weight"].T + p["fc1.bias"])
    out = hidden @ p["fc2.weight"].T + p["fc2.bias"]
    ref = torch.nn.functional.cross_entropy(out, torch.from_numpy(y))
    ref.backward()
    assert np.allclose(logits, out.detach().numpy(), atol=1e-5)
    assert loss == pytest.approx(ref.item(), abs=1e-5)
    for name, value in p.items():
        assert np.allclose(model._grads[name], value.grad.numpy(), atol=1e-5), name


def test_the_position_gradient_equals_finite_differences():
    model = _with_position()
    X, y = _maps(5, seed=3)
    orientation = np.array([1, 3, 0, 2, 1])
    model.gradient_pass(X, y, None, orientation)
    grad = model._grads["position"].copy()
    position = model.params["position"]
    for index in np.argsort(-np.abs(grad).ravel())[:4]:
        at = np.unravel_index(index, grad.shape)
        position[at] += 1e-3
        up, _ = model.gradient_pass(X, y, None, orientation)
        position[at] -= 2e-3
        down, _ = model.gradient_pass(X, y, None, orientation)
        position[at] += 1e-3
        assert grad[at] == pytest.approx((up - down) / 2e-3, rel=2e-2, abs=2e-4)


def test_a_mirrored_map_sees_the_room_mirrored_with_it():
    model = _with_position()
    X, y = _maps(1, seed=4)
    for o, flip in enumerate([lambda a: a, lambda a: a[..., ::-1, :],
                              lambda a: a[..., ::-1], lambda a: a[..., ::-1, ::-1]]):
        mirrored = np.ascontiguousarray(flip(X))
        _, as_mirror = model.gradient_pass(mirrored, y, None, np.array([o]))
        turned = CNN(model.config)
        turned.flat[...] = model.flat
        turned.params["position"][...] = flip(model.params["position"])
        _, as_room = turned.gradient_pass(mirrored, y)
        assert np.array_equal(as_mirror, as_room)
    assert oriented_position(model.params["position"], np.array([2])).shape == \
        (*model.params["position"].shape, 1)


def test_int8_emulation_adds_the_position_as_a_node_adds_its_bias():
    model = _with_position()
    constant = CNN(_config(), seed=0)
    constant.flat[...] = model.flat
    constant.params["position"][...] = 0.25
    shifted = CNN(_config(), seed=0)
    shifted.flat[...] = model.flat
    shifted.params["position"][...] = 0.0
    shifted.params["conv2.bias"][...] += np.float32(0.25)
    X, _ = _maps(8, seed=5)
    scales = constant.calibrate(X)
    shifted.act_scales = scales.copy()
    assert np.array_equal(constant.forward(X, quantized=True),
                          shifted.forward(X, quantized=True))


def test_another_grid_and_a_windowed_head_refuse_a_position_bias():
    with pytest.raises(ValueError, match="pool = 'global'"):
        load_run_config(mode="central", model={"position_bias": True})
    with pytest.raises(UsageError, match="cannot run on 7 x 6"):
        _with_position().on_grid(7, 6)


def test_the_position_bias_is_saved_and_loaded(tmp_path):
    model = _with_position()
    model.save(tmp_path / "m.npz")
    back = CNN.load(tmp_path / "m.npz")
    assert back.config.position_bias
    assert np.array_equal(back.flat, model.flat)


def test_mirror_banks_keep_the_room_in_place_for_every_bank():
    model = _with_position()
    banks = mirror_banks(model)
    X, _ = _maps(3, seed=6)
    readings = []
    for o, flip in enumerate([lambda a: a, lambda a: a[..., ::-1, :],
                              lambda a: a[..., ::-1], lambda a: a[..., ::-1, ::-1]]):
        x = np.ascontiguousarray(flip(X))
        readings.append(model.forward(x) if o == 0 else
                        _reading_with_room_flipped(model, x, flip))
    assert np.allclose(banks.forward(X), np.mean(readings, axis=0), atol=1e-5)


def _reading_with_room_flipped(model: CNN, x: np.ndarray, flip) -> np.ndarray:
    turned = CNN(model.config)
    turned.flat[...] = model.flat
    turned.params["position"][...] = flip(model.params["position"])
    return turned.forward(x)


def test_central_training_learns_a_position_bias_deterministically():
    cfg = load_run_config(mode="central", model={"pool": "global", "rows": ROWS,
                                                 "cols": COLS, "position_bias": True},
                          data={"train": 96, "test": 32}, train={"epochs": 1, "batch": 16})
    from meshdl.data.lounge import generate_lounge
    from meshdl.training.loop import train

    data = generate_lounge(cfg.data)
    first, _ = train(cfg, data)
    again, _ = train(cfg, data)
    assert first.params["position"].any()
    assert np.array_equal(first.flat, again.flat)


# ----------------------------------------------------------------------------- the mesh
DEAD = {(0, 1), (2, 2), (3, 5)}


def _mesh_with_position(spec_dead=frozenset(DEAD), compiled: bool = True):
    from meshdl.config import DataConfig
    from meshdl.data.lounge import generate_lounge
    from meshdl.protocol.spec import MeshSpec, Split
    from meshdl.sim.mesh import VirtualMesh

    model = _with_position()
    model.set_normalization(21.0, 2.0)
    data = generate_lounge(DataConfig(rows=ROWS, cols=COLS, train=8, test=6, seed=2))
    spec = MeshSpec(1, model.config, (0, 0), "tree", dead=spec_dead)
    X = {Split.TRAIN: model.with_alive(data.X_train), Split.TEST: model.with_alive(data.X_test)}
    labels = {Split.TRAIN: data.y_train, Split.TEST: data.y_test}
    return model, data, VirtualMesh(spec, X, model, labels, compiled=compiled)


def test_the_mesh_runs_the_position_bias_around_dead_cells_as_centrally():
    """One inference wave of the virtual mesh planned around three dead cells: each
    node adds its own column of the position table (PARAMS carry the whole table) and
    the logits are the central model's with the same cells left out. (A plan around
    dead cells runs on the machines; the compiled dispatch runs the table too.)"""
    from meshdl.protocol.spec import Mode, Split
    from meshdl.sim.compiled import unsupported
    from meshdl.sim.faults.dead import cell_numbers

    model, data, mesh = _mesh_with_position()
    assert unsupported(mesh.spec) == ["dead"]
    layout = mesh.spec.params_layout
    assert layout.position.stop - layout.position.start == 3 * ROWS * COLS
    result = mesh.run_wave(Mode.INFER, Split.TEST, np.arange(6))
    np.testing.assert_allclose(result.logits,
                               model.forward(data.X_test, cell_numbers(DEAD, COLS)),
                               rtol=1e-4, atol=1e-5)
    zeroed = CNN(model.config)
    zeroed.flat[...] = model.flat
    zeroed.set_normalization(21.0, 2.0)
    zeroed.params["position"][...] = 0.0
    assert not np.allclose(result.logits, zeroed.forward(data.X_test, cell_numbers(DEAD, COLS)),
                           atol=1e-3)  # (the table mattered)


def _mirrored_view(config: ModelConfig, maps: int, seed: int):
    """Random maps of `config`'s grid as training reads them with mirrors (four
    orientations, o x maps + i) and the alive mask."""
    from meshdl.config import TrainConfig
    from meshdl.data.augment import training_data
    from meshdl.data.datasets import Dataset

    rng = np.random.default_rng(seed)
    X = rng.normal(21.0, 2.0, (maps, ROWS, COLS)).astype(np.float32)
    y = rng.integers(0, 2, maps)
    return training_data(TrainConfig(augment="mirror"), Dataset(X, y, X[:4], y[:4], {}),
                         config)


@pytest.mark.parametrize("wire, memory_plan", [(False, True), (True, False)])
def test_the_mesh_trains_the_table_as_centrally_step_by_step_on_mirrors_and_failout(
        wire, memory_plan):
    """Each node adds, for a map in mirror o, the column of the cell mirror o puts at
    its place, and returns the table's gradient after the conv layers' in its REDUCE:
    the mesh's loss, logits and whole gradient are the central engine's (which flips the
    table with each map, `cnn.oriented_position`) at every step, with a fifth of the
    cells failing out, and the SGD steps keep the two models together."""
    from meshdl.config import TrainConfig
    from meshdl.model.optim import Optimizer
    from meshdl.sim.mesh import MeshEngine
    from meshdl.training.failout import failout_cells
    from meshdl.training.loop import CentralEngine

    config = _config()
    view = _mirrored_view(config, 10, seed=8)
    central, mesh = _with_position(), _with_position()
    for model in (central, mesh):
        model.set_normalization(21.0, 2.0)
    train = TrainConfig(optimizer="sgd", lr=0.05)
    opt_c, opt_m = Optimizer(train, central.flat.size), Optimizer(train, mesh.flat.size)
    ref, engine = CentralEngine(view), MeshEngine(view, wire=wire, memory_plan=memory_plan)
    table = central.params["position"].size
    batches = [np.array([0, 13, 27, 39, 4]), np.array([31, 2, 18, 25]), np.arange(11, 40, 7)]
    for step, indices in enumerate(batches):
        assert len(set(indices // 10)) > 1  # maps of several mirrors in one wave
        dead = failout_cells(ROWS, COLS, 0.2, 3, step)
        loss_c, logits_c, grads_c = ref.loss_and_grads(central, indices, dead)
        loss_m, logits_m, grads_m = engine.loss_and_grads(mesh, indices, dead)
        assert loss_m == pytest.approx(loss_c, rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(logits_m, logits_c, rtol=1e-4, atol=1e-5)
        assert np.abs(grads_c[-table:]).max() > 1e-3  # the table did get a gradient
        np.testing.assert_allclose(grads_m, grads_c, rtol=1e-4, atol=1e-6)
        opt_c.step(central.flat, grads_c, 0.05)
        opt_m.step(mesh.flat, grads_m, 0.05)
        np.testing.assert_allclose(mesh.flat, central.flat, rtol=1e-5, atol=1e-6)


def test_the_compiled_dispatch_trains_the_table_as_the_machines_do_to_the_bit():
    """The compiled loop reads each node's columns for the wave's maps (the nodes'
    own `mirrored_columns`) and sums the table's gradient into its REDUCE rows: a
    training wave over mirrored maps with cells failing out, and an evaluation wave,
    give the machines' loss, logits and gradient bit for bit."""
    from meshdl.sim.mesh import MeshEngine
    from meshdl.training.failout import failout_cells

    config = _config()
    view = _mirrored_view(config, 10, seed=9)
    indices, dead = np.array([3, 12, 25, 38, 7, 21]), failout_cells(ROWS, COLS, 0.2, 4, 0)
    results = []
    for compiled in (False, True):
        model = _with_position()
        model.set_normalization(21.0, 2.0)
        engine = MeshEngine(view, compiled=compiled)
        loss, logits, grads = engine.loss_and_grads(model, indices, dead)
        test = engine.logits(model, "test", np.arange(4))
        results.append((loss, logits.copy(), grads.copy(), test))
        assert (engine.mesh._compiled is not None) == compiled  # (it did run compiled)
    (loss_m, logits_m, grads_m, test_m), (loss_c, logits_c, grads_c, test_c) = results
    assert loss_c == loss_m
    for machines, compiled in ((logits_m, logits_c), (grads_m, grads_c), (test_m, test_c)):
        assert np.array_equal(compiled, machines)


def test_a_node_told_of_mirrors_its_readings_do_not_hold_is_refused():
    from meshdl.nodes.agent import NodeMachine
    from meshdl.protocol.spec import MeshSpec, Split

    spec = MeshSpec(1, _config())
    readings = {Split.TRAIN: np.ones((12, 2), np.float32)}
    NodeMachine(spec, (0, 0), readings, originals=3)  # 4 mirrors of 3 maps
    with pytest.raises(ValueError, match="4 x originals"):
        NodeMachine(spec, (0, 0), readings, originals=4)


def test_a_position_column_outside_params_is_refused_before_any_task_runs():
    from meshdl.errors import MeshdlError
    from meshdl.nodes.execute import P_OFF
    from meshdl.nodes.plan import Program
    from meshdl.protocol.spec import Mode, Split

    _, _, mesh = _mesh_with_position(frozenset(), compiled=False)  # (the machines' check)
    node = next(iter(mesh.nodes.values()))
    node.plan.program = Program(*(values.copy() for values in node.plan.program))
    layout = node.plan.program.layout
    layout[-1, P_OFF] = mesh.spec.params_layout.size  # past the end of PARAMS
    with pytest.raises(MeshdlError) as refused:
        mesh.run_wave(Mode.INFER, Split.TEST, np.arange(3))
    assert "values of PARAMS (its position bias)" in str(refused.value)
    assert node.flops == 0


def test_the_central_engine_tells_each_mirrored_map_its_orientation():
    """`CentralEngine` reads a map's mirror from its index (o x originals + i, the
    training view's order): its gradient is the one of the maps with their
    orientations given by hand."""
    from meshdl.data.augment import mirrored
    from meshdl.data.datasets import Dataset
    from meshdl.training.loop import CentralEngine

    X, y = _maps(4, seed=7)
    view = mirrored(Dataset(X, y, X[:1], y[:1], {}))
    engine = CentralEngine(view)
    model = _with_position()
    indices = np.array([1, 6, 11, 12, 3])  # orientations 0, 1, 2, 3, 0
    engine.loss_and_grads(model, indices)
    by_engine = model.grad_flat.copy()
    model.gradient_pass(view.X_train[indices], view.y_train[indices], None,
                        np.array([0, 1, 2, 3, 0]))
    assert np.array_equal(by_engine, model.grad_flat)


def test_what_cannot_carry_the_table_refuses_it_in_one_line():
    from meshdl.errors import MeshdlError
    from meshdl.model.torch_compat import torch_sequential
    from meshdl.protocol.payloads import ParamsLayout

    with pytest.raises(MeshdlError, match=r"no torch\.nn\.Sequential twin"):
        torch_sequential(_config())
    with pytest.raises(ValueError, match="train it uncompressed"):
        load_run_config(mode="central", model={"pool": "global", "position_bias": True},
                        mesh={"compress": "2bit"})
    plain = ParamsLayout.of(_config(position_bias=False))
    model = _with_position()
    with pytest.raises(UsageError, match="spec and the model disagree"):
        plain.pack(model.flat, model.norm_mean, model.norm_std,
                   position=model.params["position"])
    with pytest.raises(UsageError, match="orientation is 0-3"):
        oriented_position(model.params["position"], np.array([0, 4]))
    from meshdl.protocol.spec import MeshSpec

    with pytest.raises(UsageError, match="trains uncompressed"):  # below RunConfig too
        MeshSpec(1, _config(), compress="2bit")
    with pytest.raises(ValueError, match="without overlap"):
        load_run_config(mode="mesh", model={"pool": "global", "position_bias": True},
                        parallel={"meshes": 2, "overlap": True})


def test_a_run_in_the_virtual_mesh_learns_the_table_as_a_central_run_does():
    """The training loop, mirrors and failout as the global recipe draws them: the
    model the mesh trains (its waves through the compiled dispatch) is the central
    run's."""
    from meshdl.data.lounge import generate_lounge
    from meshdl.training.loop import train

    over = {"model": {"pool": "global", "rows": ROWS, "cols": COLS, "position_bias": True},
            "data": {"train": 48, "test": 8}, "train": {"epochs": 1, "batch": 16}}
    mesh_cfg, central_cfg = (load_run_config(mode=mode, **over) for mode in ("mesh", "central"))
    assert mesh_cfg.train.augment == "mirror" and mesh_cfg.train.failout > 0
    data = generate_lounge(mesh_cfg.data)
    in_mesh, _ = train(mesh_cfg, data)
    central, _ = train(central_cfg, data)
    assert in_mesh.params["position"].any()
    np.testing.assert_allclose(in_mesh.flat, central.flat, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_from_before_the_field_resumes():
    """A checkpoint's configuration written before `model.position_bias` existed lacks
    the key: it is the same run, not another configuration."""
    from meshdl.errors import MeshdlError
    from meshdl.training.loop import check_same_run

    cfg = load_run_config(mode="central", model={"pool": "global", "position_bias": False})
    saved = cfg.model_dump(mode="json")
    del saved["model"]["position_bias"]
    check_same_run(saved, cfg)
    saved["model"]["filters"] += 1
    with pytest.raises(MeshdlError, match="another configuration"):
        check_same_run(saved, cfg)


def test_the_cli_trains_it_in_the_mesh_as_centrally(tmp_path):
    """A config file's `[model] position_bias = true`: `meshdl train` in its default
    mode (the virtual mesh) and `--mode central` write models with the same table."""
    from tests.test_cli_simulate import _meshdl

    data, config = tmp_path / "d.npz", tmp_path / "pos.toml"
    config.write_text("[model]\nposition_bias = true\n")
    code, _, err = _meshdl("data", "generate", "--rows", ROWS, "--cols", COLS, "--train",
                           48, "--test", 8, "--out", data)
    assert code == 0, err
    common = ("train", "--data", data, "--pool", "global", "--config", config,
              "--epochs", 1)
    code, _, err = _meshdl(*common, "--out", tmp_path / "mesh")
    assert code == 0, err
    code, _, err = _meshdl(*common, "--mode", "central", "--out", tmp_path / "central")
    assert code == 0, err
    in_mesh, central = (CNN.load(tmp_path / run / "model.npz") for run in ("mesh", "central"))
    assert central.config.position_bias and central.params["position"].any()
    np.testing.assert_allclose(in_mesh.flat, central.flat, rtol=1e-4, atol=1e-5)
