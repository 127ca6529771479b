"""Shared fixtures: a small synthetic data set and an in-process CLI runner; and the
hypothesis profile: under CI the examples are derandomized and no example database is
read or written, so every run of the suite tries the same cases; hypothesis's other files
(its cache of constants found in our sources) go to a temporary directory removed at exit,
so a CI run leaves the checkout as it found it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from meshdl.cli import main
from meshdl.config import DataConfig
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.mqtt import localbroker
from meshdl.mqtt.localbroker import ephemeral_range
from tests.conftest_mqtt import mosquitto, mosquitto_factory  # noqa: F401  (fixtures)
from tests.mosquitto import worker_ports

# Parallel workers (pytest-xdist) each hand out listening ports of their own slice: a
# port one picked and has not yet bound cannot be the other's.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    localbroker.LISTEN_PORTS_FROM, localbroker.LISTEN_PORTS_BELOW = worker_ports(
        int(os.environ["PYTEST_XDIST_WORKER"][2:]),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
        localbroker.LISTEN_PORTS_FROM, ephemeral_range()[0])

# No per-example deadline: an example that compiles a Numba kernel on a fresh clone takes
# ~0.5 s, and which worker compiles first is not fixed ("Unreliable test timings").
settings.register_profile("local", deadline=None)
settings.register_profile("ci", derandomize=True, database=None, print_blob=True,
                          deadline=None)
settings.load_profile("local")
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
    _hypothesis_home = tempfile.mkdtemp(prefix="meshdl-hypothesis-")
    atexit.register(shutil.rmtree, _hypothesis_home, ignore_errors=True)
    set_hypothesis_home_dir(_hypothesis_home)


@pytest.fixture(scope="session")
def small_data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6 x 8 lounge data set, 120 train and 40 test maps."""
    path = tmp_path_factory.mktemp("data") / "small.npz"
    save_dataset(generate_lounge(DataConfig(rows=6, cols=8, train=120, test=40, seed=3)), path)
    return path


CliResult = tuple[int, str, str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `meshdl ARGS...` in this process: (exit code, stdout, stderr)."""

    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run
