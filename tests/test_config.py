"""Configuration: validation names the bad field; sources layer as documented."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from meshdl import ModelConfig, TrainConfig, load_run_config


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: ModelConfig(kernel=30), "kernel"),
        (lambda: ModelConfig(filters=0), "filters"),
        (lambda: ModelConfig(rows=0), "rows"),
        (lambda: ModelConfig(classes=1), "classes"),
        (lambda: TrainConfig(lr=-0.1), "lr"),
        (lambda: TrainConfig(batch=0), "batch"),
        (lambda: TrainConfig(optimizer="rmsprop"), "optimizer"),
        (lambda: TrainConfig(warmup_fraction=1.5), "warmup_fraction"),
        (lambda: TrainConfig(clip_norm=-1.0), "clip_norm"),
        (lambda: TrainConfig(augment="rotate"), "augment"),
        (lambda: ModelConfig(kernels=3), "kernels"),
    ],
)
def test_impossible_configs_name_the_bad_field(factory, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        factory()
    assert field in str(info.value)


def test_sources_layer_defaults_toml_env_flags(tmp_path, monkeypatch) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("[model]\nfilters = 7\nkernel = 5\nhidden = 50\n[train]\nlr = 0.5\n")
    monkeypatch.setenv("MESHDL_MODEL__KERNEL", "4")
    monkeypatch.setenv("MESHDL_TRAIN__LR", "0.1")
    config = load_run_config(toml, model={"kernel": 2, "rows": None}, train={"epochs": 3})
    assert config.model.filters == 7  # TOML over default
    assert config.model.hidden == 50
    assert config.train.lr == 0.1  # environment over TOML
    assert config.model.kernel == 2  # flag over environment
    assert config.model.rows == 17  # an unset flag hides nothing
    assert config.train.epochs == 3


def test_grid_flags_set_the_data_grid_too() -> None:
    config = load_run_config(model={"rows": 5, "cols": 6})
    assert (config.data.rows, config.data.cols) == (5, 6)


def test_missing_toml_file_is_reported(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        load_run_config(tmp_path / "absent.toml")


def test_config_show_prints_effective_configuration(cli, tmp_path, monkeypatch) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("[model]\nfilters = 9\n")
    monkeypatch.setenv("MESHDL_TRAIN__EPOCHS", "4")
    code, out, _ = cli("config", "show", "--config", toml, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["model"]["filters"] == 9
    assert shown["train"]["epochs"] == 4


def test_bad_environment_value_is_a_one_line_usage_error(cli, monkeypatch) -> None:
    monkeypatch.setenv("MESHDL_MODEL__KERNEL", "zero")
    code, _, err = cli("config", "show")
    assert code == 2
    assert "model.kernel" in err
    assert "Traceback" not in err
