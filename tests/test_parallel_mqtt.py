"""Several meshes and a parameter server over one real Mosquitto: the same parameters
as the simulator's bsp."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from meshdl.config import RunConfig, load_run_config
from meshdl.edge.data_parallel import train_with_server
from meshdl.edge.remote import MqttEngine
from meshdl.mqtt import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost
from meshdl.parallel import train_parallel
from meshdl.protocol import MeshSpec
from meshdl.server.serve import ServerRun, serve
from meshdl.sim.lounge import generate_lounge

MESHES_TOML = """
[model]
rows = 4
cols = 5
hidden = 8

[data]
train = 40
test = 20
seed = 4

[train]
epochs = 2
batch = 5

[mesh]
mesh_id = {mesh_id}

[parallel]
meshes = 2
first_mesh_id = 1
sync = "bsp"
"""


def _config(folder: Path, mesh_id: int) -> RunConfig:
    path = folder / f"mesh{mesh_id}.toml"
    path.write_text(MESHES_TOML.format(mesh_id=mesh_id))
    return load_run_config(path)


class _Thread(threading.Thread):
    """A thread whose outcome (result or exception) the test reads after `join`."""

    def __init__(self, target, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn, self.result, self.error = target, None, None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.slow
def test_two_meshes_and_a_server_over_mosquitto_train_to_the_simulators_bsp(
        mosquitto, tmp_path) -> None:
    configs = [_config(tmp_path, mesh_id) for mesh_id in (1, 2)]
    data = generate_lounge(configs[0].data)
    reference, _ = train_parallel(configs[0], data)  # two virtual meshes, bsp
    address = BrokerAddress.parse(mosquitto.url)
    run = ServerRun(configs[0], data, checkpoints=tmp_path / "ps")
    server = _Thread(lambda: asyncio.run(serve(run, address)), "ps")
    cells = list(MeshSpec(1, configs[0].model).topology.cells())
    with BackgroundNodeHost(configs[0], cells, address, data, client="hosts1"), \
            BackgroundNodeHost(configs[1], cells, address, data, client="hosts2"):
        server.start()
        edges = []
        for config in configs:
            engine = MqttEngine.for_run(config, data, address, wave_timeout=5.0)
            edges.append((engine, _Thread(
                lambda c=config, e=engine: train_with_server(c, data, e, resend_s=2.0,
                                                            patience_s=120.0),
                f"edge{config.mesh.mesh_id}")))
        for _, thread in edges:
            thread.start()
        for engine, thread in edges:
            thread.join(300)
            engine.close()
            assert thread.error is None, thread.error
        server.join(60)
        assert server.error is None and not server.is_alive(), server.error
    scale = float(np.abs(reference.flat).max())
    np.testing.assert_allclose(run.model.flat, reference.flat, rtol=1e-5, atol=1e-5 * scale)
    for _, thread in edges:  # each edge ends holding the server's model
        model, history = thread.result
        np.testing.assert_array_equal(model.flat, run.model.flat)
        assert [e.epoch for e in history.epochs] == [1, 2]
    assert len(run.history.epochs) == 2 and (tmp_path / "ps" / "checkpoint.npz").exists()
    assert run.server.staleness == {0: 2 * 2 * 4}  # 2 meshes x 2 epochs x 4 steps
