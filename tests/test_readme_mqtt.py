"""The README's MQTT block runs as pasted (issue 33, item 8): its commands, read from
README.md, run in a fresh directory against a broker on a free port, background (`&`)
commands as processes that `kill %N` stops; the run directories it writes hold the same
run twice. Beside it what the block needs: a mesh file that names its grid once, `data
generate --config`, `broker --host`, and an MQTT run's metrics.json counting the mesh's
bytes and waves as the virtual mesh counts them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import tomllib

import meshdl.cli.broker as broker_command
from meshdl.config import load_run_config
from meshdl.data.datasets import load_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.edge.remote import MqttEngine
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.training.loop import train
from tests.helpers import small_run_toml
from tests.mosquitto import free_port, mosquitto_binary

README = Path(__file__).resolve().parents[1] / "README.md"
README_PORT = "1884"
# One epoch instead of the mesh file's 20, through the environment (above the file):
# the commands stay as the README has them.
FAST = {"MESHDL_TRAIN__EPOCHS": "1", "PYTHONUNBUFFERED": "1"}


def mqtt_block() -> list[str]:
    """The command lines of the README's "Over MQTT through Mosquitto" block."""
    text = README.read_text()
    section = text[text.index("**Over MQTT through Mosquitto**"):]
    start = section.index("```bash\n") + len("```bash\n")
    return [line for line in section[start:section.index("\n```", start)].splitlines()
            if line.strip()]


def _command(words: list[str], port: int) -> list[str]:
    """`meshdl ...` as this interpreter's module, the README's port replaced."""
    assert words[0] == "meshdl", words
    return [sys.executable, "-m", "meshdl",
            *(word.replace(README_PORT, str(port)) for word in words[1:])]


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.terminate()
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(30)


def _run_block(lines: list[str], folder: Path, port: int) -> None:
    """Each line as a shell would: `cmd &` in the background (job %1, %2, ...), `kill
    %N ...` stops those jobs, anything else runs to its end and must succeed."""
    env = {**os.environ, **FAST}
    jobs: list[subprocess.Popen[bytes]] = []
    try:
        for number, line in enumerate(lines, 1):
            words = shlex.split(line, comments=True)
            log = folder / f"line{number}.log"
            if words[0] == "kill":
                for job in words[1:]:
                    assert _stop(jobs[int(job.removeprefix("%")) - 1]) == 0, \
                        f"{line}: {(folder / 'jobs.log').read_text()}"
            elif words[-1] == "&":
                with (folder / "jobs.log").open("ab") as out:
                    jobs.append(subprocess.Popen(_command(words[:-1], port), cwd=folder,
                                                 env=env, stdout=out, stderr=out))
            else:
                done = subprocess.run(_command(words, port), cwd=folder, env=env,
                                      capture_output=True, text=True, timeout=300)
                log.write_text(done.stderr)
                assert done.returncode == 0, f"{line}\n{done.stderr}"
    finally:
        for job in jobs:
            if job.poll() is None:
                _stop(job)


def test_the_readmes_mqtt_block_runs_as_pasted_and_writes_the_same_run_twice(tmp_path
                                                                             ) -> None:
    mosquitto_binary()  # `meshdl broker` runs it
    lines = mqtt_block()
    assert any(README_PORT in line for line in lines)
    assert any(line.rstrip().endswith("&") for line in lines)
    _run_block(lines, tmp_path, free_port())

    mesh = tomllib.loads((tmp_path / "mesh.toml").read_text())
    grid = (mesh["model"]["rows"], mesh["model"]["cols"])
    assert "rows" not in mesh["data"] and "cols" not in mesh["data"]  # the grid once
    data = load_dataset(tmp_path / "data" / "d.npz")
    assert (data.rows, data.cols) == grid
    runs = [tmp_path / "runs" / name for name in ("mqtt", "mqtt1")]
    for run in runs:
        assert {"model.npz", "config.json", "metrics.json"} <= {p.name for p in run.iterdir()}
    three_processes, one_command = (json.loads((run / "metrics.json").read_text())
                                    for run in runs)
    for metrics in (three_processes, one_command):
        assert metrics["config"]["model"]["rows"] == grid[0]
        assert metrics["comm"]["transport"] == "mqtt"
        assert metrics["comm"]["total_bytes"] > 0 and metrics["comm"]["waves"] > 0
    for key in ("total_bytes", "total_messages", "waves", "classes"):
        assert three_processes["comm"][key] == one_command["comm"][key], key
    assert three_processes["final"] == one_command["final"]
    first, second = (np.load(run / "model.npz") for run in runs)
    for name in first.files:
        if first[name].dtype.kind == "f":  # (the parameters; not the file's metadata)
            np.testing.assert_allclose(first[name], second[name], rtol=1e-5, atol=1e-6)


def test_mqtt_metrics_count_the_mesh_as_the_virtual_mesh_does(mosquitto, tmp_path) -> None:
    """The same bytes, messages, waves and classes as the virtual mesh whose edge
    broadcasts parameters, as every MQTT edge does."""
    (tmp_path / "mesh.toml").write_text(small_run_toml(10))
    config = load_run_config(tmp_path / "mesh.toml")
    data = generate_lounge(config.data)
    broadcast = config.model_copy(update={"mesh": config.mesh.model_copy(
        update={"params_via": "broadcast"})})
    _, virtual = train(broadcast, data)
    address = BrokerAddress.parse(mosquitto.url)
    cells = [(r, c) for r in range(config.model.rows) for c in range(config.model.cols)]
    with BackgroundNodeHost(config, cells, address, data):
        engine = MqttEngine.for_run(config, data, address)
        try:
            _, over_mqtt = train(config, data, engine=engine)
        finally:
            engine.close()
    for key in ("total_bytes", "total_messages", "waves", "classes", "halo",
                "busiest_link", "broadcast_bytes"):
        assert over_mqtt.comm[key] == virtual.comm[key], key
    assert over_mqtt.comm["bytes_exact"] is True
    assert over_mqtt.comm["transport"] == "mqtt"  # and the transport's own counts stay
    assert over_mqtt.comm["session"]["sent"] > 0


def test_a_mesh_file_names_its_grid_once_and_data_generate_reads_it(cli, tmp_path) -> None:
    mesh = tmp_path / "mesh.toml"
    code, _, err = cli("config", "init", mesh, "--rows", "6", "--cols", "8")
    assert code == 0, err
    text = mesh.read_text()
    assert text.count("\nrows = ") == 1 and "\nrows = 6\n" in text
    code, out, err = cli("data", "generate", "--config", mesh, "--train", "30", "--test",
                         "10", "--out", tmp_path / "d.npz", "--json")
    assert code == 0, err
    assert (json.loads(out)["config"]["rows"], json.loads(out)["config"]["cols"]) == (6, 8)
    # Edited in one place, [model], the data set follows.
    mesh.write_text(text.replace("\nrows = 6\n", "\nrows = 5\n"))
    code, out, err = cli("data", "generate", "--config", mesh, "--train", "30", "--test",
                         "10", "--out", tmp_path / "e.npz", "--json")
    assert code == 0, err
    assert load_dataset(tmp_path / "e.npz").X_train.shape[1:] == (5, 8)
    code, out, _ = cli("config", "show", "--config", mesh, "--json")
    assert json.loads(out)["data"]["rows"] == 5
    # A flag still wins over the file.
    code, out, err = cli("data", "generate", "--config", mesh, "--rows", "4", "--train", "30",
                         "--test", "10", "--out", tmp_path / "f.npz", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["rows"] == 4


def test_broker_listens_on_the_host_it_is_given(cli, monkeypatch) -> None:
    mosquitto_binary()
    configs = []

    def run(command: list[str]) -> int:
        configs.append(Path(command[-1]).read_text())
        return 0

    monkeypatch.setattr(broker_command, "_run_foreground", run)
    code, _, err = cli("broker", "--host", "0.0.0.0", "--port", "18831")
    assert code == 0, err
    assert "listener 18831 0.0.0.0" in configs[-1].splitlines()
    assert "0.0.0.0" in err and "other machines" in err  # said: open to the network
    code, _, err = cli("broker", "--host", "::1")
    assert code == 0, err
    assert "listener 1883 ::1" in configs[-1].splitlines()  # the config's port kept
    assert "other machines" not in err
    code, _, err = cli("broker")
    assert "listener 1883 127.0.0.1" in configs[-1].splitlines()  # the default: loopback
