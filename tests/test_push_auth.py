"""Several meshes over the production setup: PUSH and WEIGHTS authenticated end to end
(issue 29, items 1 and 2).

Each building has its own Mosquitto (deploy/mosquitto/production.conf, the passwords and
ACL of `meshdl deploy credentials`) bridged to a central one (`meshdl deploy central`),
the bridge's password read through `include_dir` from its own 0600 file. Node hosts,
edges (`edge run --ps`) and the server (`ps run`) run as processes with the .env files
the deploy commands write, as systemd would start them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from meshdl.bench.hostile import _self_signed as self_signed_with_cryptography
from meshdl.config import RunConfig, load_run_config
from meshdl.data.datasets import save_dataset
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.model.optim import Optimizer
from meshdl.mqtt.localbroker import Mosquitto, free_port, production_config, stop_process
from meshdl.protocol.messages import EDGE, SERVER, Kind, encode, make
from meshdl.protocol.payloads import Push
from meshdl.protocol.topics import push_topic
from meshdl.server.machine import ParameterServer
from meshdl.sync import Sync
from meshdl.training.parallel import train_parallel
from tests.helpers import TWO_MESHES_TOML
from tests.mosquitto import mosquitto_binary, self_signed

MESHES = (1, 2)
STEPS = 2 * 4  # 2 epochs of 4 clocks: 40 samples, global batches of 2 x 5
PROCESS_TIMEOUT_S = 240.0


def _config(mesh: int) -> RunConfig:
    return RunConfig(model={"rows": 4, "cols": 5, "hidden": 8},
                     data={"train": 40, "test": 20, "seed": 4},
                     train={"epochs": 2, "batch": 5}, mesh={"mesh_id": mesh},
                     parallel={"meshes": 2, "first_mesh_id": 1, "sync": "bsp"})


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


def _meshdl(*args: str | Path) -> None:
    result = subprocess.run([sys.executable, "-m", "meshdl", *map(str, args)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr




class _Site:
    """The files of one deployment: mesh files, data, credentials, push keys, brokers'
    configurations (nothing running)."""

    def __init__(self, root: Path, tls_bridge: bool = False) -> None:
        """`tls_bridge`: the bridges reach the central broker on its TLS listener (as
        across buildings), else on its loopback one."""
        mosquitto_binary()
        mosquitto_binary("mosquitto_passwd")
        self.root = root
        self.mesh_files = {}
        for mesh in MESHES:
            self.mesh_files[mesh] = root / f"mesh{mesh}.toml"
            self.mesh_files[mesh].write_text(TWO_MESHES_TOML.format(mesh_id=mesh))
        self.config = load_run_config(self.mesh_files[1])
        self.data = generate_lounge(self.config.data)
        self.data_file = save_dataset(self.data, root / "data.npz")
        self.hq = root / "hq"
        self.central_tls, self.central_port = free_port(), free_port()
        central_ca = self.hq / "meshdl" / "tls" / "ca.crt"
        central = ("--central", f"mqtts://127.0.0.1:{self.central_tls}", "--central-ca",
                   central_ca) if tls_bridge else \
            ("--central", f"127.0.0.1:{self.central_port}")
        _meshdl("deploy", "central", "--mesh", self.mesh_files[1], *central, "--out",
                self.hq / "meshdl")
        self_signed_with_cryptography(self.hq / "meshdl" / "tls")
        (self.hq / "data").mkdir()
        self.buildings: dict[int, tuple[Path, int, int]] = {}  # folder, TLS and local ports
        for mesh in MESHES:
            folder = root / f"building{mesh}"
            _meshdl("deploy", "credentials", "--mesh", self.mesh_files[mesh], "--out",
                    folder / "meshdl", "--host", "floor=0-3,0-4",
                    "--keys-dir", folder / "meshdl" / "secrets")
            self_signed(folder / "meshdl" / "tls")
            (folder / "data").mkdir()
            # The bridge's connection, password and all, in a private directory that
            # the building's broker includes; its mosquitto.conf names only the folder.
            bridges = folder / "meshdl" / "bridge.d"
            bridges.mkdir(mode=0o700)
            shutil.copy(self.hq / "meshdl" / f"bridge-{mesh}.conf", bridges)
            os.chmod(bridges / f"bridge-{mesh}.conf", 0o600)
            self.buildings[mesh] = (folder, free_port(), free_port())

    def central_conf(self) -> str:
        return production_config(self.hq, self.central_tls, self.central_port)

    def building_conf(self, mesh: int) -> str:
        folder, tls, local = self.buildings[mesh]
        return production_config(folder, tls, local) + \
            f"\ninclude_dir {folder}/meshdl/bridge.d\n"

    def env(self, mesh: int | None, user: str) -> dict[str, str]:
        """A process's environment: its .env file (and an edge's push key file's, when
        `deploy central` wrote one), the key files where the secrets are installed."""
        secrets = self.hq / "meshdl" / "secrets"
        if mesh is None:
            env = _env(secrets / f"{user}.env")
        else:
            env = _env(self.buildings[mesh][0] / "meshdl" / "secrets" / f"{user}.env")
            if user == "edge" and (secrets / f"push-{mesh}.environment").exists():
                env |= _env(secrets / f"push-{mesh}.environment")
        # `deploy central` names them as installed on the machines (/etc/meshdl/secrets).
        return {key: value.replace("/etc/meshdl/secrets/", f"{secrets}/")
                for key, value in env.items()}

    def broker_url(self, mesh: int | None) -> str:
        port = self.central_port if mesh is None else self.buildings[mesh][2]
        return f"mqtt://127.0.0.1:{port}"


@pytest.fixture
def site(tmp_path) -> _Site:
    return _Site(tmp_path)


class _Processes:
    """meshdl processes with their logs; all stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs, self.running = logs, {}
        logs.mkdir(exist_ok=True)

    def start(self, name: str, env: dict[str, str], *args: str | Path) -> None:
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.running[name] = subprocess.Popen(
            [sys.executable, "-m", "meshdl", *map(str, args)],
            stdout=(self.logs / f"{name}.out").open("wb"),
            stderr=(self.logs / f"{name}.err").open("wb"), env=full)

    def wait(self, name: str, timeout: float = PROCESS_TIMEOUT_S) -> int:
        try:
            return self.running[name].wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still runs after {timeout:g} s: {self.err(name)[-2000:]}")

    def err(self, name: str) -> str:
        return (self.logs / f"{name}.err").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.running.values():
            stop_process(process, timeout=10)


async def _forge(url: str, login: dict[str, str], stop: threading.Event,
                 sent: list[int]) -> None:
    """The issue's attacker: mesh 1's edge login on its building's broker, publishing
    pushes of every clock that claim many samples and a large gradient, with a tag of
    random bytes where the edge's would be (the login is not the key file)."""
    size = CNN(_config(1).model).flat.size
    rng = np.random.default_rng(29)
    async with aiomqtt.Client("127.0.0.1", int(url.rsplit(":", 1)[1]),
                              username=login["MESHDL_MQTT_USER"],
                              password=login["MESHDL_MQTT_PASSWORD"]) as client:
        while not stop.is_set():
            for clock in range(1, STEPS + 1):
                for based_on in (clock - 1, 0):
                    forged = Push(based_on, 10_000, 0, 0.1,
                                  np.full(size, 5.0, np.float32)).pack()
                    for session in (0, int(rng.integers(1 << 16))):
                        data = encode(make(Kind.PUSH, 1, clock, EDGE, SERVER, forged,
                                           session=session)) + rng.bytes(16)
                        await client.publish(push_topic(1), data, qos=1)
                        sent[0] += 1
            await asyncio.sleep(0.2)


def _train(site: _Site, logs: Path, attack: bool) -> dict:
    """Both meshes and the server over the production brokers; returns what the server
    and the edges wrote (metrics, models) and how many forgeries went out."""
    runs = site.root / "runs"
    processes = _Processes(logs)
    stop, sent = threading.Event(), [0]
    attacker = None
    with contextlib.ExitStack() as stack:
        central = Mosquitto(site.root / "central-broker", port=site.central_tls,
                            config_text=site.central_conf()).start(timeout=10)
        stack.callback(central.stop)
        for mesh in MESHES:
            broker = Mosquitto(site.root / f"broker{mesh}", port=site.buildings[mesh][1],
                               config_text=site.building_conf(mesh)).start(timeout=10)
            stack.callback(broker.stop)
        stack.callback(processes.stop_all)
        common = ("--mesh", site.mesh_files[1], "--data", site.data_file)
        processes.start("ps", site.env(None, "ps"), "ps", "run", "--broker",
                        site.broker_url(None), *common, "--out", runs / "ps",
                        "--edges-timeout", "120")
        if attack:
            attacker = threading.Thread(target=lambda: asyncio.run(_forge(
                site.broker_url(1), site.env(1, "edge"), stop, sent)), daemon=True)
            attacker.start()
            stack.callback(lambda: (stop.set(), attacker.join(30)))
        for mesh in MESHES:
            mesh_args = ("--mesh", site.mesh_files[mesh], "--data", site.data_file)
            processes.start(f"floor{mesh}", site.env(mesh, "floor"), "nodes", "run",
                            "--cells", "all", "--broker", site.broker_url(mesh), *mesh_args)
            processes.start(f"edge{mesh}", site.env(mesh, "edge"), "edge", "run", "--ps",
                            "--broker", site.broker_url(mesh), *mesh_args,
                            "--out", runs / f"edge{mesh}")
        codes = {name: processes.wait(name) for name in ("edge1", "edge2", "ps")}
        for name, code in codes.items():
            assert code == 0, f"{name} exited {code}: {processes.err(name)[-3000:]}"
    return {"ps": json.loads((runs / "ps" / "metrics.json").read_text()),
            "model": CNN.load(runs / "ps" / "model.npz"),
            "edges": {m: CNN.load(runs / f"edge{m}" / "model.npz") for m in MESHES},
            "edge_metrics": {m: json.loads((runs / f"edge{m}" / "metrics.json").read_text())
                             for m in MESHES},
            "forged_sent": sent[0]}


def _assert_the_virtual_bsp_runs_parameters(site: _Site, result: dict) -> None:
    reference, _ = train_parallel(site.config, site.data)  # two virtual meshes, bsp
    scale = float(np.abs(reference.flat).max())
    np.testing.assert_allclose(result["model"].flat, reference.flat, rtol=1e-5,
                               atol=1e-5 * scale)
    for model in result["edges"].values():  # each edge ends on the server's model
        np.testing.assert_array_equal(model.flat, result["model"].flat)
    server = result["ps"]["parallel"]["server"]
    assert server["pushes"] == len(MESHES) * STEPS
    assert result["ps"]["parallel"]["updates"] == STEPS


@pytest.mark.slow
def test_two_meshes_with_auth_on_train_through_ps_run_to_the_virtual_bsp_parameters(
        site, tmp_path) -> None:
    result = _train(site, tmp_path / "logs", attack=False)
    _assert_the_virtual_bsp_runs_parameters(site, result)
    assert "rejected:codec:forged" not in result["ps"]["parallel"]["connection"]
    # No building's mosquitto.conf holds the bridge's password: only its 0600 file.
    for mesh in MESHES:
        password = _env(site.hq / "meshdl" / "secrets" / f"bridge-{mesh}.env")[
            "MESHDL_MQTT_PASSWORD"]
        assert password not in site.building_conf(mesh)
        folder = site.buildings[mesh][0]
        assert (folder / "meshdl" / "bridge.d" / f"bridge-{mesh}.conf").stat().st_mode \
            & 0o777 == 0o600


@pytest.mark.slow
def test_two_meshes_bridged_to_the_central_brokers_tls_listener_train_to_the_bsp_parameters(
        tmp_path) -> None:
    # Issue 43: a bridge written for HOST:8883 had no CA, spoke MQTT in clear to the TLS
    # listener ("wrong version number") and never connected.
    site = _Site(tmp_path, tls_bridge=True)
    for mesh in MESHES:
        bridge = (site.hq / "meshdl" / f"bridge-{mesh}.conf").read_text().splitlines()
        assert f"address 127.0.0.1:{site.central_tls}" in bridge  # the TLS listener only
        assert f"bridge_cafile {site.hq / 'meshdl' / 'tls' / 'ca.crt'}" in bridge
    result = _train(site, tmp_path / "logs", attack=False)
    _assert_the_virtual_bsp_runs_parameters(site, result)
    log = (tmp_path / "central-broker" / "mosquitto.log").read_text(errors="replace")
    assert "wrong version number" not in log
    assert all(f"as meshdl-bridge-{mesh}" in log for mesh in MESHES), log[-3000:]


@pytest.mark.slow
def test_forged_pushes_with_a_stolen_edge_login_are_rejected_and_change_nothing(
        site, tmp_path) -> None:
    result = _train(site, tmp_path / "logs", attack=True)
    assert result["forged_sent"] > 0
    connection = result["ps"]["parallel"]["connection"]
    assert connection.get("rejected:codec:forged", 0) > 0, connection
    # Every genuine push was taken (none dropped as a duplicate of a forged one), and
    # the model is the virtual bsp run's.
    _assert_the_virtual_bsp_runs_parameters(site, result)


def test_ps_run_gives_up_naming_the_meshes_whose_edges_are_gone(site, tmp_path) -> None:
    with Mosquitto(tmp_path / "central-broker", port=site.central_tls,
                   config_text=site.central_conf()):
        processes = _Processes(tmp_path / "logs")
        try:
            processes.start("ps", site.env(None, "ps"), "ps", "run", "--broker",
                            site.broker_url(None), "--mesh", site.mesh_files[1], "--data",
                            site.data_file, "--out", tmp_path / "ps", "--edges-timeout", "2")
            code = processes.wait("ps", timeout=120)
        finally:
            processes.stop_all()
    lines = [line for line in processes.err("ps").splitlines() if line.strip()]
    assert code == 1, lines
    assert "no push from meshes 1, 2 for 2 s (--edges-timeout)" in lines[-1], lines


# -- the server machine: what a push weighs, which run it is for ---------------------------

def _server(session: int = 7, sized: bool = True) -> ParameterServer:
    """Two meshes in bsp; `sized`: the server knows every step's shard holds 5 samples."""
    config = _config(1)
    model = CNN(config.model)
    unclipped = config.train.model_copy(update={"clip_norm": 0.0})
    sizes = {"shard_sizes": lambda mesh, clock: 5} if sized else {}
    return ParameterServer(model, Optimizer(unclipped, model.flat.size), [1, 2],
                           Sync.parse("bsp"), lambda _: 0.1, session=session, **sizes)


def _push(server: ParameterServer, mesh: int, samples: int = 5, session: int = 7):
    gradient = np.ones(server.model.flat.size, np.float32)
    return make(Kind.PUSH, mesh, 1, EDGE, SERVER,
                Push(0, samples, min(samples, 1), 0.5, gradient).pack(), session=session)


def test_a_push_claiming_more_samples_than_its_meshs_shard_is_rejected() -> None:
    server = _server()
    flat = server.model.flat.copy()
    assert server.handle(_push(server, 1, samples=10_000)) == []
    assert server.stats["rejected:bad_samples"] == 1 and server.clock[1] == 0
    server.handle(_push(server, 1))  # the genuine one is still taken
    server.handle(_push(server, 2, samples=0))  # a wave that missed its deadline
    assert server.version == 1
    np.testing.assert_allclose(flat - server.model.flat, 0.1, rtol=1e-6)  # mesh 1's alone


def test_a_push_of_another_server_run_is_answered_with_the_weights_and_not_taken() -> None:
    server = _server(session=7, sized=False)
    out = server.handle(_push(server, 1, session=3))  # a replay of an earlier run's
    assert server.stats["rejected:other_session"] == 1 and server.clock[1] == 0
    assert [(m.kind, m.header.session, m.header.step) for m in out] == \
        [(Kind.WEIGHTS, 7, 0)]  # how an edge that has not heard this run learns it
