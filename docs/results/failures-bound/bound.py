"""The bound model of issue 45: an independent PyTorch model told which cells are dead.

Readings normalized, dead cells' readings zeroed, plus an alive-mask channel; trained on
random masks of 5-25 % drawn per map; evaluated on the test split with the very cells
`meshdl evaluate --dead S --fault-seeds 0-9` kills (meshdl.sim.faults.dead.dead_cells).
Usage: bound.py DATA_SEED|DATA.npz TRAIN_MAPS EPOCHS [OUT.json]
(a data file: its own training maps; TRAIN_MAPS is then ignored)
"""
import json
import sys
import time

import numpy as np
import torch
from torch import nn

from meshdl.config import DataConfig
from meshdl.data.datasets import data_digest, load_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.sim.faults.dead import dead_cells

torch.set_num_threads(1)
source, n_train, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if source.endswith(".npz"):
    ds, data_seed = load_dataset(source), source
    n_train = len(ds.y_train)
else:
    data_seed = int(source)
    ds = generate_lounge(DataConfig(seed=data_seed, train=n_train))
R, C = ds.rows, ds.cols
mean, std = float(ds.X_train.mean()), float(ds.X_train.std())


def inputs(X: np.ndarray, alive: np.ndarray) -> torch.Tensor:
    """(N, 2, R, C): normalized readings zeroed where dead, and the alive mask."""
    x = (X - mean) / std * alive
    return torch.from_numpy(np.stack([x, alive.astype(np.float32)], 1).astype(np.float32))


class Bound(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2, 32, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.conv(x)
        alive = x[:, 1:2]
        peak = z.amax(dim=(2, 3))
        mean_live = (z * alive).sum(dim=(2, 3)) / alive.sum(dim=(2, 3)).clamp(min=1)
        return self.head(torch.cat([peak, mean_live], 1))


torch.manual_seed(0)
rng = np.random.default_rng(0)
model = Bound()
opt = torch.optim.Adam(model.parameters(), 2e-3)
steps = epochs * -(-n_train // 100)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=steps)
y_train = torch.from_numpy(ds.y_train)
started = time.perf_counter()
for _epoch in range(epochs):
    order = rng.permutation(n_train)
    for i in range(0, n_train, 100):
        idx = order[i:i + 100]
        share = rng.uniform(0.05, 0.25, len(idx))
        alive = (rng.random((len(idx), R, C)) >= share[:, None, None]).astype(np.float32)
        loss = nn.functional.cross_entropy(model(inputs(ds.X_train[idx], alive)), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
model.eval()


def accuracy(cells: frozenset) -> float:
    alive = np.ones((len(ds.y_test), R, C), np.float32)
    for r, c in cells:
        alive[:, r, c] = 0.0
    with torch.no_grad():
        pred = model(inputs(ds.X_test, alive)).argmax(1).numpy()
    return float(np.mean(pred == ds.y_test))


out = {"data_seed": data_seed, "data_digest": data_digest(ds), "train_maps": n_train,
       "epochs": epochs, "train_s": round(time.perf_counter() - started, 1),
       "clean": accuracy(frozenset())}
for share in (0.1, 0.2):
    accs = [accuracy(dead_cells(R, C, share, s)) for s in range(10)]
    out[f"dead_{share}"] = {"mean": float(np.mean(accs)), "std": float(np.std(accs, ddof=1)),
                            "per_seed": accs}
    out[f"lost_{share}"] = out["clean"] - float(np.mean(accs))
print(json.dumps(out))
if len(sys.argv) > 4:
    with open(sys.argv[4], "w") as file:
        file.write(json.dumps(out, indent=1))
