"""A capacity probe (PyTorch, central only): how little can a model that reads only the
live cells lose with 10 % of them dead, when nothing of the mesh constrains it?

Fully convolutional: (reading, alive) -> L x [3x3 conv F, ReLU] -> 1x1 conv: a logit per
cell; the map's logit is the max over live cells. Trained on the same generated lounge
as the recipe (data seed DS, 163,200 maps), with a mask drawn per MAP (the recipe draws
one per update), mirrors, Adam, and (AUX > 0) dense per-cell labels: a cell is 1 where
one of its 4-neighbour pairs differs by >= 3 degC in the true readings (dead or not).
Read as tune.py reads: test split clean and with the cells `meshdl evaluate --dead`
kills at 10 / 20 %, fault seeds 0-9.

Usage: probe.py DS TS LAYERS FILTERS EPOCHS AUX OUT.jsonl
"""
import json
import sys
import time

import numpy as np
import torch
from torch import nn

from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.sim.faults.dead import cell_numbers, dead_cells

ds, ts, layers, filters, epochs = (int(a) for a in sys.argv[1:6])
aux, out = float(sys.argv[6]), sys.argv[7]
torch.manual_seed(ts)
torch.set_num_threads(int(__import__("os").environ.get("PROBE_THREADS", "1")))
rng = np.random.default_rng([ts, 0x9B0BE])
cfg = load_run_config(mode="central", model={"pool": "global"},
                      data={"seed": ds, "train": 163200}, train={"seed": ts})
t0, c0 = time.perf_counter(), time.process_time()
data = generate_lounge(cfg.data)
Xtr = data.X_train.astype(np.float32)
ytr = data.y_train.astype(np.float32)
R, C = Xtr.shape[1:]
mean, std = float(Xtr.mean()), float(Xtr.std())
THR = np.float32(3.0)


def cell_labels(x: torch.Tensor) -> torch.Tensor:
    """(B, R, C) readings -> (B, R, C) 1 where a 4-neighbour pair through the cell
    differs by >= 3 degC."""
    dv = (x[:, 1:, :] - x[:, :-1, :]).abs() >= THR
    dh = (x[:, :, 1:] - x[:, :, :-1]).abs() >= THR
    y = torch.zeros_like(x, dtype=torch.bool)
    y[:, 1:, :] |= dv
    y[:, :-1, :] |= dv
    y[:, :, 1:] |= dh
    y[:, :, :-1] |= dh
    return y.float()


class Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        c = 2
        for _ in range(layers):
            mods += [nn.Conv2d(c, filters, 3, padding=1), nn.ReLU()]
            c = filters
        self.body = nn.Sequential(*mods)
        self.cell = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.stack([(x - mean) / std * alive, alive], 1)
        # a dead cell computes nothing: its outputs are 0 at every layer, as in the mesh
        for i, m in enumerate(self.body):
            h = m(h)
            if i % 2 == 1:
                h = h * alive[:, None]
        s = self.cell(h)[:, 0]
        pooled = s.masked_fill(alive == 0, -1e9).flatten(1).amax(1)
        return pooled, s


def masks(batch: int) -> torch.Tensor:
    alive = np.ones((batch, R * C), np.float32)
    for b in range(batch):
        if rng.uniform() < 0.3:
            continue
        k = round(rng.uniform(0.05, 0.25) * R * C)
        alive[b, rng.choice(R * C, k, replace=False)] = 0.0
    return torch.from_numpy(alive.reshape(batch, R, C))


model = Probe()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
B = 128
steps = epochs * (len(ytr) // B)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
bce = nn.BCEWithLogitsLoss()
Xt, yt = torch.from_numpy(Xtr), torch.from_numpy(ytr)
for epoch in range(epochs):
    order = torch.from_numpy(rng.permutation(len(ytr)))
    total = 0.0
    for i in range(len(ytr) // B):
        idx = order[i * B:(i + 1) * B]
        x = Xt[idx]
        if rng.uniform() < 0.5:
            x = x.flip(1)
        if rng.uniform() < 0.5:
            x = x.flip(2)
        alive = masks(B)
        pooled, s = model(x, alive)
        loss = bce(pooled, yt[idx])
        if aux > 0:
            per = nn.functional.binary_cross_entropy_with_logits(s, cell_labels(x),
                                                                 reduction="none")
            loss = loss + aux * (per * alive).sum() / alive.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        total += float(loss)
    print(f"epoch {epoch} loss {total / (len(ytr) // B):.4f} {time.perf_counter() - t0:.0f}s",
          file=sys.stderr, flush=True)

model.eval()
X, y = torch.from_numpy(data.X_test.astype(np.float32)), data.y_test


def accuracy(alive: np.ndarray) -> float:
    with torch.no_grad():
        a = torch.from_numpy(np.broadcast_to(alive, X.shape).astype(np.float32).copy())
        pooled, _ = model(X, a)
    return float(np.mean((pooled.numpy() > 0).astype(np.int64) == y))


record = {"probe": f"L{layers}F{filters}E{epochs}aux{aux}", "data_seed": ds, "train_seed": ts,
          "clean": accuracy(np.ones((R, C), np.float32))}
for share in (0.1, 0.2):
    accs = []
    for s in range(10):
        alive = np.ones(R * C, np.float32)
        alive[cell_numbers(dead_cells(R, C, share, s), C)] = 0.0
        accs.append(accuracy(alive.reshape(R, C)))
    record[f"dead_{share}"] = round(float(np.mean(accs)), 5)
    record[f"lost_{share}"] = round(100 * (record["clean"] - record[f"dead_{share}"]), 2)
record["clean"] = round(record["clean"], 5)
record["cpu_s"] = round(time.process_time() - c0, 1)
record["wall_s"] = round(time.perf_counter() - t0, 1)
line = json.dumps(record)
print(line, flush=True)
with open(out, "a") as f:
    f.write(line + "\n")
