"""Cross-checks against PyTorch (skipped where PyTorch is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig, TrainConfig
from meshdl.model.optim import Optimizer, learning_rate
from tests.test_model_gradients import CONFIGS, _problem

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from meshdl.model.torch_compat import npz_state_dict, torch_sequential  # noqa: E402


def _torch_net(model: CNN):
    net = torch_sequential(model.config).double()
    net.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in
                         model.params.items()})
    return net


# PyTorch says it copies the input for an even kernel's 'same' padding: its own business.
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("name", CONFIGS)
def test_gradients_match_pytorch(name: str) -> None:
    config, batch = CONFIGS[name]
    model, X, y = _problem(config, batch)
    loss, grads = model.loss_and_grads(X, y)
    net = _torch_net(model)
    expected = torch.nn.functional.cross_entropy(net(torch.from_numpy(X).double()),
                                                 torch.from_numpy(y))
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for pname, p in net.named_parameters():
        ref = p.grad.numpy()
        error = np.linalg.norm(grads[pname] - ref) / max(np.linalg.norm(ref), 1e-8)
        assert error < 1e-4, f"{pname}: relative error {error:.2e}"


def test_saved_model_loads_into_pytorch_and_predicts_the_same(tmp_path) -> None:
    config = ModelConfig()
    model, X, _ = _problem(config, 64)
    model.set_normalization(0.5, 2.0)
    model.save(tmp_path / "model.npz")
    net = torch_sequential(config)
    net.load_state_dict(npz_state_dict(tmp_path / "model.npz"))
    with np.load(tmp_path / "model.npz") as npz:
        mean, std = float(npz["norm.mean"][0]), float(npz["norm.std"][0])
    with torch.no_grad():
        theirs = net((torch.from_numpy(X) - mean) / std).numpy()
    ours = CNN.load(tmp_path / "model.npz").forward(X)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert (ours.argmax(1) == theirs.argmax(1)).all()


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_steps_match_pytorch(optimizer: str, clip_norm: float) -> None:
    config = ModelConfig(rows=6, cols=8, filters=3, hidden=10)
    model, X, y = _problem(config, 16)
    train = TrainConfig(optimizer=optimizer, lr=0.05, momentum=0.9, weight_decay=1e-3,
                        clip_norm=clip_norm)
    net = _torch_net(model)
    if optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=0.05, weight_decay=1e-3)
    ours = Optimizer(train, model.flat.size)
    for _ in range(5):
        _, grads = model.loss_and_grads(X, y)
        ours.step(model.flat, np.concatenate([g.ravel() for g in grads.values()]))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.from_numpy(X).double()),
                                          torch.from_numpy(y)).backward()
        if clip_norm:
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), clip_norm)
            assert norm > clip_norm  # the check below covers a step that clipped
        opt.step()
    for pname, p in net.named_parameters():
        np.testing.assert_allclose(model.params[pname], p.detach().numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=pname)


@pytest.mark.parametrize(("warmup", "schedule"), [(0, "cosine"), (5, "cosine"),
                                                  (5, "constant"), (20, "cosine")])
def test_learning_rate_schedule_matches_pytorch_schedulers(warmup: int, schedule: str) -> None:
    total = 20
    train = TrainConfig(lr=0.15, warmup_fraction=warmup / total, schedule=schedule)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.15)
    after_warmup = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup)
                    if schedule == "cosine" and warmup < total
                    else torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0))
    if warmup:  # lr/w, 2 lr/w, ..., lr: then the schedule from its start
        ramp = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / warmup,
                                                 total_iters=max(warmup - 1, 1))
        scheduler = torch.optim.lr_scheduler.SequentialLR(opt, [ramp, after_warmup],
                                                          milestones=[warmup])
    else:
        scheduler = after_warmup
    theirs = []
    for _ in range(total):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    ours = [learning_rate(train, step, total) for step in range(total)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("first", [(0, 1), (1, 0)])
def test_global_pooling_sends_a_tied_maximum_gradient_to_the_first_cell_as_pytorch(
        first: tuple[int, int]) -> None:
    """Two cells hold the same maximum, made from different input channels: which
    cell got the gradient shows in conv1.weight's gradient."""
    config = ModelConfig(rows=2, cols=2, in_channels=2, kernel=1, conv_layers=1, filters=2,
                         pool="global", hidden=3)
    model = CNN(config, seed=3)
    model.params["conv1.weight"][...] = [[[[1.0]], [[1.0]]], [[[0.5]], [[-1.0]]]]
    model.params["conv1.bias"][...] = 0.0
    X = np.zeros((1, 2, 2, 2), np.float32)
    X[0, 0][first] = 2.0  # channel 0 at one cell ...
    X[0, 1][tuple(1 - i for i in first)] = 2.0  # ... channel 1 at the other: both sum 2
    y = np.array([1])
    _, grads = model.loss_and_grads(X, y)
    net = _torch_net(model)
    torch.nn.functional.cross_entropy(net(torch.from_numpy(X).double()),
                                      torch.from_numpy(y)).backward()
    ref = dict(net.named_parameters())["conv1.weight"].grad.numpy()
    assert ref[0, 0, 0, 0] != ref[0, 1, 0, 0]  # the tie was broken one way
    np.testing.assert_allclose(grads["conv1.weight"], ref, rtol=1e-5, atol=1e-7)
