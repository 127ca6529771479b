"""Every command that trains the global recipe's head, which reads the alive mask as a
second input channel, builds its engine on the data as that head reads it (issue 45)."""

from __future__ import annotations

import json


def test_simulate_train_runs_the_global_recipe_with_its_alive_mask(cli, tmp_path) -> None:
    data = tmp_path / "d.npz"
    code, _, err = cli("data", "generate", "--rows", "4", "--cols", "5", "--train", "40",
                       "--test", "20", "--seed", "3", "--out", data)
    assert code == 0, err
    code, _, err = cli("simulate", "train", "--data", data, "--pool", "global", "--epochs",
                       "1", "--batch", "20", "--out", tmp_path / "run")
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["alive"] is True and config["model"]["in_channels"] == 2


def test_simulate_infer_of_a_head_with_the_alive_mask_is_its_central_accuracy(cli, tmp_path
                                                                              ) -> None:
    data = tmp_path / "d.npz"
    code, _, err = cli("data", "generate", "--rows", "6", "--cols", "8", "--train", "600",
                       "--test", "100", "--seed", "4", "--out", data)
    assert code == 0, err
    code, _, err = cli("train", "--mode", "central", "--data", data, "--pool", "global",
                       "--epochs", "6", "--batch", "20", "--out", tmp_path / "m")
    assert code == 0, err
    code, _, err = cli("simulate", "infer", "--model", tmp_path / "m" / "model.npz",
                       "--data", data, "--batch", "100", "--json",
                       "--out", tmp_path / "inf")
    assert code == 0, err
    sim = json.loads((tmp_path / "inf" / "sim.json").read_text())
    # A model that tells the classes apart (a collapsed one would agree with anything);
    # before, its nodes held the readings alone and the mesh scored 0.50 to its 0.88.
    assert sim["central_accuracy"] > 0.7
    assert sim["accuracy"] == sim["central_accuracy"]


def test_nodes_holding_fewer_values_a_cell_than_the_model_reads_are_refused_in_one_line(
        ) -> None:
    """The compiled loop checks no bounds: nodes whose logs hold one value a cell, for a
    model that reads two (the alive mask), are refused before it runs; before, it read
    past their logs (IndexError under NUMBA_BOUNDSCHECK=1, made-up values without).
    (Engines give their nodes the data as the model reads it: `augment.as_read_by`.)"""
    import numpy as np
    import pytest

    from meshdl.config import DataConfig, load_run_config
    from meshdl.data.lounge import generate_lounge
    from meshdl.errors import MeshdlError
    from meshdl.model.cnn import CNN
    from meshdl.protocol.spec import MeshSpec, Mode, Split
    from meshdl.sim.mesh import VirtualMesh, by_split

    config = load_run_config(model={"rows": 3, "cols": 4, "hidden": 4, "pool": "global"})
    assert config.model.alive
    data = generate_lounge(DataConfig(rows=3, cols=4, train=8, test=8, seed=1))
    readings, labels = by_split(data)  # the readings alone
    model = CNN(config.model, seed=1)
    with pytest.raises(MeshdlError, match=r"hold 1 values a cell .* the model reads 2"):
        mesh = VirtualMesh(MeshSpec(1, config.model, (0, 0), "tree"), readings, model,
                           labels, compiled=True)
        mesh.run_wave(Mode.INFER, Split.TEST, np.arange(4))
