"""Global pooling and failout from the outside: the configuration takes them, a global
model runs on any grid, failout draws the same cells for the same update."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshdl import CNN, ModelConfig, load_run_config
from meshdl.config import DataConfig
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.errors import UsageError
from meshdl.sim.faults.dead import cell_numbers, dead_cells
from meshdl.training.failout import failout_cells
from tests.helpers import assert_one_line_error


def test_pool_global_comes_from_a_file_the_environment_or_a_flag(tmp_path, monkeypatch) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\npool = "global"\n')
    assert load_run_config(toml).model.global_pool
    monkeypatch.setenv("MESHDL_MODEL__POOL", "global")
    assert load_run_config().model.pool == "global"
    monkeypatch.setenv("MESHDL_MODEL__POOL", "3")
    assert load_run_config().model.pool == 3
    assert load_run_config(model={"pool": "global", "filters": 7}).model.features == 7


def test_a_pool_that_is_neither_a_window_nor_global_is_refused(cli) -> None:
    code, _, err = cli("train", "--pool", "widest", "--epochs", "1")
    assert_one_line_error(code, err, 2, "--pool", "widest")
    with pytest.raises(ValueError):
        ModelConfig(pool=9)


def test_a_globally_pooled_model_predicts_any_grid_with_the_same_parameters() -> None:
    model = CNN(ModelConfig(rows=6, cols=8, pool="global", hidden=12), seed=2)
    model.set_normalization(20.0, 2.0)
    bigger = model.on_grid(9, 13)
    assert bigger.config.rows == 9 and bigger.config.cols == 13
    np.testing.assert_array_equal(bigger.flat, model.flat)
    # A 6 x 8 map inside a 9 x 13 one of the same constant value: the features of the
    # interior are the same, only borders differ; the model reads the larger grid.
    X = np.random.default_rng(0).normal(20.0, 2.0, (4, 9, 13)).astype(np.float32)
    assert bigger.forward(X).shape == (4, 2)


def test_a_windowed_model_refuses_another_grid() -> None:
    model = CNN(ModelConfig(rows=6, cols=8, hidden=12))
    with pytest.raises(UsageError, match="pool = 'global'"):
        model.on_grid(7, 8)
    assert model.on_grid(6, 8) is model


def test_model_evaluate_runs_a_global_model_on_a_data_set_of_another_grid(
        cli, small_data_file, tmp_path: Path) -> None:
    """A global head without a position bias (the recipe's on a small data set) runs on
    any grid; one with the table, which holds a value per cell of its own grid (the
    recipe's on the default data set), refuses another in one line."""
    table = tmp_path / "table.toml"
    table.write_text("[model]\nposition_bias = true\n")
    common = ("train", "--data", small_data_file, "--epochs", "1", "--batch", "32",
              "--hidden", "8", "--pool", "global", "--mode", "central", "--json")
    code, _, err = cli(*common, "--out", tmp_path / "run")
    assert code == 0, err
    other = tmp_path / "other.npz"
    save_dataset(generate_lounge(DataConfig(rows=5, cols=11, train=10, test=30, seed=4)),
                 other)
    code, out, err = cli("evaluate", tmp_path / "run" / "model.npz", other, "--json")
    assert code == 0, err
    assert json.loads(out)["samples"] == 30
    code, out, err = cli("infer", tmp_path / "run" / "model.npz", other, "--json")
    assert code == 0, err
    assert json.loads(out)["samples"] == 30
    code, _, err = cli(*common, "--out", tmp_path / "table", "--config", table)
    assert code == 0, err
    code, _, err = cli("evaluate", tmp_path / "table" / "model.npz", other, "--json")
    assert code != 0 and "cannot run on 5 x 11" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_failout_draws_the_same_cells_for_the_same_update_and_others_for_the_next(
        share: float) -> None:
    first = failout_cells(17, 25, share, seed=3, update=7)
    assert len(first) == round(share * 425)
    assert np.all(np.diff(first) > 0) and first[0] >= 0 and first[-1] < 425
    np.testing.assert_array_equal(first, failout_cells(17, 25, share, seed=3, update=7))
    assert not np.array_equal(first, failout_cells(17, 25, share, seed=3, update=8))
    assert len(failout_cells(17, 25, 0.0, seed=3, update=7)) == 0


def test_training_with_failout_resumes_to_the_same_model(cli, small_data_file,
                                                          tmp_path: Path) -> None:
    """The cells of each update come from the seed and the update's number alone: a
    run cut after its first epoch and resumed ends where the whole run does."""
    constant = tmp_path / "constant.toml"  # a run may go on to more epochs (no decay)
    constant.write_text('[train]\nschedule = "constant"\nwarmup_fraction = 0\n')
    args = ("--data", small_data_file, "--batch", "32", "--hidden", "8", "--failout", "0.2",
            "--mode", "central", "--config", constant, "--json")
    code, _, err = cli("train", *args, "--epochs", "2", "--out", tmp_path / "whole")
    assert code == 0, err
    code, _, err = cli("train", *args, "--epochs", "1", "--out", tmp_path / "cut")
    assert code == 0, err
    code, _, err = cli("train", "--resume", tmp_path / "cut", "--epochs", "2", "--json")
    assert code == 0, err
    whole = CNN.load(tmp_path / "whole" / "model.npz").flat
    np.testing.assert_array_equal(CNN.load(tmp_path / "cut" / "model.npz").flat, whole)


def test_an_inference_wave_sends_one_gather_a_node_and_a_training_wave_one_more_but_edge_ats(
        ) -> None:
    """TAG's MAX: every node tells its parent its subtree's maxima once; training adds
    the first cells (not from the cell linked to the edge); no POOL, no ROUTE."""
    from meshdl.sim.mesh import MeshEngine
    from tests.helpers import noise_dataset, normalized_model

    config = ModelConfig(rows=5, cols=6, filters=3, pool="global", hidden=8)
    data, model = noise_dataset(config), normalized_model(config)
    cells, batch = 30, 4
    engine = MeshEngine(data)
    engine.logits(model, "test", np.arange(batch))
    classes = engine.report()["classes"]
    assert classes["gather"]["messages"] == cells
    assert classes["gather"]["values"] == cells * config.filters * batch
    assert "pool" not in classes and "scatter" not in classes
    engine = MeshEngine(data)
    engine.loss_and_grads(model, np.arange(batch))
    classes = engine.report()["classes"]
    assert classes["gather"]["messages"] == cells + cells - 1
    assert classes["scatter"]["messages"] == cells  # the edge's, and one per tree link
    assert "pool" not in classes and "route" not in classes


def test_model_evaluate_reads_a_share_of_the_cells_as_dead_when_asked(
        cli, small_data_file, tmp_path: Path) -> None:
    from meshdl.data.datasets import load_dataset

    code, _, err = cli("train", "--data", small_data_file, "--out", tmp_path / "run",
                       "--epochs", "1", "--batch", "32", "--hidden", "8", "--mode", "central",
                       "--json")
    assert code == 0, err
    model, data = CNN.load(tmp_path / "run" / "model.npz"), load_dataset(small_data_file)
    code, out, err = cli("evaluate", tmp_path / "run" / "model.npz", small_data_file,
                         "--dead", "0.5", "--dead-seed", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["dead_cells"] == 24  # half of 6 x 8
    predicted = model.predict(data.X_test, cell_numbers(dead_cells(6, 8, 0.5, 1), 8))
    assert report["confusion"] == [[int(np.sum((data.y_test == t) & (predicted == p)))
                                    for p in range(2)] for t in range(2)]


def test_a_failout_of_ones_own_drops_the_recipes_range_and_clean_updates(
        tmp_path, monkeypatch) -> None:
    """`--failout 0` with the global head meant no failout and trained with 0-25 % of
    the cells dead: the recipe's failout_max stayed below the flag."""
    off = load_run_config(model={"pool": "global"}, train={"failout": 0.0})
    assert (off.train.failout, off.train.failout_max, off.train.failout_clean) == (0.0, None, 0.0)
    one = load_run_config(model={"pool": "global"}, train={"failout": 0.1})
    assert (one.train.failout, one.train.failout_max) == (0.1, None)
    same = load_run_config(model={"pool": "global"}, train={"failout": 0.05})  # the recipe's
    assert (same.train.failout, same.train.failout_max, same.train.failout_clean) == \
        (0.05, None, 0.0)
    ranged = load_run_config(model={"pool": "global"}, train={"failout": 0.1,
                                                               "failout_max": 0.3})
    assert (ranged.train.failout, ranged.train.failout_max) == (0.1, 0.3)
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\npool = "global"\n[train]\nfailout = 0.0\n')
    assert load_run_config(toml).train.failout_max is None
    monkeypatch.setenv("MESHDL_TRAIN__FAILOUT", "0.1")
    env = load_run_config(model={"pool": "global"})
    assert (env.train.failout, env.train.failout_max) == (0.1, None)
    monkeypatch.delenv("MESHDL_TRAIN__FAILOUT")
    recipe = load_run_config(model={"pool": "global"})
    assert (recipe.train.failout, recipe.train.failout_max) == (0.05, 0.25)


def test_the_global_head_trains_by_its_own_recipe_unless_a_setting_is_given(tmp_path) -> None:
    from meshdl.config import GLOBAL_RECIPE

    config = load_run_config(model={"pool": "global"})
    for part, values in GLOBAL_RECIPE.items():
        values = {k: v for k, v in values.items() if k != "epochs"}  # they follow the maps
        assert {k: getattr(getattr(config, part), k) for k in values} == values
    assert (config.model.filters, config.model.conv_layers, config.data.train,
            config.train.epochs) == (16, 3, 163_200, 12)
    assert config.model.position_bias
    # Compression and overlap know no position bias: a run asking for either trains the
    # head before the table (two layers); one that also asks for the table is refused.
    for mesh, parallel in (({"compress": "2bit"}, {}), ({}, {"meshes": 2, "overlap": True})):
        other = load_run_config(model={"pool": "global"}, mesh=mesh, parallel=parallel)
        assert not other.model.position_bias and other.model.conv_layers == 2
        with pytest.raises(ValueError, match="position_bias"):
            load_run_config(model={"pool": "global", "position_bias": True}, mesh=mesh,
                            parallel=parallel)
    # On 2,400 maps or fewer (or a data set of unknown size), the head of the recipe
    # before three layers and the table: they were tuned on 163,200.
    small = load_run_config(model={"pool": "global"}, data_maps=2400)
    assert (small.train.epochs, small.model.conv_layers, small.model.position_bias) == \
        (40, 2, False)
    grid = load_run_config(model={"pool": "global"}, data_grid=(17, 25))
    assert (grid.model.conv_layers, grid.model.position_bias) == (2, False)
    mine = load_run_config(model={"pool": "global", "conv_layers": 3}, data_maps=2400)
    assert mine.model.conv_layers == 3  # one's own setting wins
    assert load_run_config(model={"pool": "global"}, data_maps=2401).model.position_bias
    seed = load_run_config()
    assert seed.train.augment == "mirror" and seed.train.failout == 0.0  # the seed's own
    assert (seed.model.filters, seed.train.epochs) == (5, 20)
    small = load_run_config(data_grid=(6, 8), model={"pool": "global"})  # both layers
    assert (small.model.rows, small.model.cols, small.model.filters) == (6, 8, 16)
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\npool = "global"\nfilters = 4\n[train]\naugment = "none"\n')
    mine = load_run_config(toml, train={"failout": 0.0})
    assert mine.train.augment == "none" and mine.train.failout == 0.0  # not the recipe's
    assert mine.model.filters == 4 and mine.train.epochs == 12  # unset: the recipe's


def test_sweeps_of_compression_or_overlap_train_every_trial_on_one_head_all_can_train(
        cli, tmp_path: Path) -> None:
    """On more than 2,400 maps the recipe's head has the table, which trains neither
    compressed nor overlapped: `experiment compression` and `experiment meshes` then
    train every trial, the uncompressed and plain ones too, on the head without it."""
    data = tmp_path / "d.npz"
    save_dataset(generate_lounge(DataConfig(rows=4, cols=5, train=2500, test=40)), data)
    common = ("--pool", "global", "--data", data, "--epochs", "1", "--json")
    for sweep in (("compression", "--policies", "2bit", "--seeds", "1"),
                  ("meshes", "--counts", "2", "--modes", "bsp,bsp+overlap")):
        out = tmp_path / sweep[0]
        code, _, err = cli("experiment", *sweep, *common, "--out", out)
        assert code == 0, err
        model = json.loads((out / "config.json").read_text())["settings"]["model"]
        assert (model["conv_layers"], model["position_bias"]) == (2, False), sweep[0]
    assert load_run_config(model={"pool": "global"}, data_maps=2500).model.position_bias


def test_commands_without_a_config_file_take_the_global_recipe_too(cli) -> None:
    """`meshdl cost` and `simulate compare` build their network from flags alone: an
    unset --filters is the recipe's 16 with --pool global, as `plan` and `train` give."""
    def conv2_formula(*flags: str) -> int:
        code, out, err = cli("cost", "--rows", "4", "--cols", "5", *flags, "--json")
        assert code == 0, err
        return json.loads(out)["halo"]["conv2"]["formula"]  # 8 neighbours x cells x filters

    assert conv2_formula("--pool", "global") == 8 * 20 * 16
    assert conv2_formula("--pool", "global", "--filters", "5") == 8 * 20 * 5
    assert conv2_formula() == 8 * 20 * 5  # the seed network
    code, out, err = cli("cost", "--rows", "4", "--cols", "5", "--pool", "global")
    assert code == 0, err
    assert "16 filters, 3 conv layers, pool global" in " ".join(out.split())  # says which
    code, out, err = cli("simulate", "compare", "--radio", "802.15.4", "--rows", "4",
                         "--cols", "5", "--pool", "global", "--train-samples", "0", "--json")
    assert code == 0, err
    assert json.loads(out)["model"]["filters"] == 16


def test_config_init_with_pool_global_writes_the_recipe(cli, tmp_path) -> None:
    code, _, err = cli("config", "init", tmp_path / "g.toml", "--pool", "global",
                       "--rows", "6")
    assert code == 0, err
    written = load_run_config(tmp_path / "g.toml")
    assert written == load_run_config(model={"pool": "global", "rows": 6})
    assert (written.model.filters, written.train.epochs) == (16, 12)
    code, _, err = cli("config", "init", tmp_path / "seed.toml")
    assert code == 0, err
    assert load_run_config(tmp_path / "seed.toml") == load_run_config()
    assert "config init --pool global" in (tmp_path / "seed.toml").read_text()


def test_edge_serve_refuses_a_model_whose_network_the_mesh_file_does_not_build(
        cli, tmp_path) -> None:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text('[model]\nrows = 4\ncols = 5\npool = "global"\n')  # 16 filters
    CNN(ModelConfig(rows=4, cols=5, pool="global", filters=5)).save(tmp_path / "m.npz")
    code, _, err = cli("edge", "serve", "--broker", "mqtt://127.0.0.1:1", "--mesh", mesh,
                       "--model", tmp_path / "m.npz", "--slots", "1")
    assert_one_line_error(code, err, 2, "does not fit the mesh file", "filters 5 against 16")


def test_edge_serve_runs_a_global_model_on_the_mesh_files_grid_and_a_windowed_one_on_its_own(
        ) -> None:
    """'A model trained on one grid runs on any': `edge serve` refused a 17 x 25 global
    model on a 12 x 20 mesh file by its grid alone."""
    from meshdl.cli.mqtt_run import fit_model_to_mesh

    trained = CNN(ModelConfig(rows=17, cols=25, pool="global", filters=4, hidden=6), seed=1)
    served = fit_model_to_mesh(trained, ModelConfig(rows=12, cols=20, pool="global",
                                                    filters=4), Path("m.npz"))
    assert (served.config.rows, served.config.cols) == (12, 20)
    np.testing.assert_array_equal(served.flat, trained.flat)
    windowed = CNN(ModelConfig(rows=17, cols=25, filters=4, hidden=6))
    with pytest.raises(UsageError, match=r"does not fit the mesh.s grid.*runs on any grid"):
        fit_model_to_mesh(windowed, ModelConfig(rows=12, cols=20, filters=4), Path("m.npz"))
    assert fit_model_to_mesh(windowed, ModelConfig(filters=4), Path("m.npz")) is windowed
