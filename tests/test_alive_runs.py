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
