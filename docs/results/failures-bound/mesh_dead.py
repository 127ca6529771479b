"""A model read in the virtual mesh with the dead cells named in each wave (the mesh's
failout: each dead cell zeroes its own input, mask included, and outputs), beside
`CNN.predict(X, cells)`, which is what `meshdl evaluate --dead` reads.

Usage: mesh_dead.py MODEL.npz DATA.npz FAULT_SEEDS  (17 x 25, edge at 0,0)
"""
import json
import sys

import numpy as np

from meshdl.config import TrainConfig
from meshdl.data.augment import training_data
from meshdl.data.datasets import Dataset, load_split
from meshdl.model.cnn import CNN
from meshdl.sim.faults.dead import cell_numbers, dead_cells
from meshdl.sim.mesh import MeshEngine

model = CNN.load(sys.argv[1])
X, y = load_split(sys.argv[2], "test")
view = training_data(TrainConfig(augment="none"), Dataset(X, y, X, y, {}), model.config)
engine = MeshEngine(view)
out = {}
for share in (0.1, 0.2):
    mesh_acc, central_acc, same = [], [], 0
    for seed in range(int(sys.argv[3])):
        cells = cell_numbers(dead_cells(17, 25, share, seed), 25)
        # A training wave carries the dead cells (its BATCH); its logits are the forward.
        pred = np.concatenate([
            engine.loss_and_grads(model, np.arange(i, min(i + 100, len(y))), cells)[1]
            .argmax(1) for i in range(0, len(y), 100)])
        ref = model.predict(X, cells)
        mesh_acc.append(float(np.mean(pred == y)))
        central_acc.append(float(np.mean(ref == y)))
        same += int(np.array_equal(pred, ref))
    out[share] = {"mesh": float(np.mean(mesh_acc)), "central": float(np.mean(central_acc)),
                  "draws_identical": same}
print(json.dumps(out))
