"""Parameter repair under the production setup.

Mosquitto runs deploy/mosquitto/production.conf with the passwords and ACL of `meshdl
deploy credentials`; the edge and two node hosts log in with the users it wrote and seal
their messages with its key files. Both hosts restart during live inference: no cell
holds the parameters. The cell the edge is linked to asks the edge, every other cell its
tree parent (nodes/agent.py, "Repair"), across the two hosts through the broker, and the
slots after give central inference's alerts, with no PARAMS flood from the edge. The
generated ACL refused both answers ("Not authorized"), so a restarted host recovered only
when the edge sent its PARAMS again.
"""

from __future__ import annotations

import time
from pathlib import Path

from meshdl.bench.hostile import _self_signed as self_signed_with_cryptography
from meshdl.bench.mqtt import _toml
from meshdl.config import RunConfig
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import serve
from meshdl.mqtt.localbroker import Mosquitto, free_port, production_config
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost, host_spec
from meshdl.protocol.auth import authenticator_for
from meshdl.protocol.messages import EDGE
from tests.mosquitto import mosquitto_binary
from tests.test_live_scheduled import BOTTOM, SLOT_S, TOP, _assert_central, _config, _host
from tests.test_live_scheduled import _model as live_model
from tests.test_push_auth import _env, _meshdl

HOSTS = {"top": TOP, "bottom": BOTTOM}
CELLS = {"top": "0-1,0-3", "bottom": "2,0-3"}


class _Production:
    """The credentials, key files and certificate of one mesh, and its broker."""

    def __init__(self, folder: Path) -> None:
        mosquitto_binary()
        mosquitto_binary("mosquitto_passwd")
        self.folder = folder
        mesh_file = folder / "mesh.toml"
        mesh_file.write_text(_toml(_config()))
        self.secrets = folder / "meshdl" / "secrets"
        _meshdl("deploy", "credentials", "--mesh", mesh_file, "--out", folder / "meshdl",
                *(f"--host={name}={cells}" for name, cells in CELLS.items()),
                "--keys-dir", self.secrets)
        self_signed_with_cryptography(folder / "meshdl" / "tls")
        (folder / "data").mkdir()
        tls, self.local = free_port(), free_port()
        self.broker = Mosquitto(folder, port=tls,
                                config_text=production_config(folder, tls, self.local))

    def config(self, user: str) -> RunConfig:
        """The mesh as `user`'s process runs it: its messages sealed with its key file."""
        config = _config()
        return config.model_copy(update={"mesh": config.mesh.model_copy(update={
            "auth": True, "keys": self.secrets / f"{user}.keys.json"})})

    def address(self, user: str) -> BrokerAddress:
        """The broker's loopback listener, with `user`'s login (a password still)."""
        return BrokerAddress.parse(f"mqtt://127.0.0.1:{self.local}",
                                   env=_env(self.secrets / f"{user}.env"))

    def host(self, name: str) -> BackgroundNodeHost:
        return _host(self.config(name), HOSTS[name], self.address(name), name)


def _connected(hosts: list[BackgroundNodeHost], timeout: float = 60.0) -> None:
    """Until every host has logged in and subscribed (a hang guard, not a claim)."""
    deadline = time.monotonic() + timeout
    while not all(h.host.stats["connections"] for h in hosts):
        assert time.monotonic() < deadline, "a node host did not connect"
        time.sleep(0.05)


def test_restarted_node_hosts_are_repaired_by_their_neighbours_and_the_edge_under_the_acl(
        tmp_path) -> None:
    site = _Production(tmp_path)
    model = live_model()
    edge_config = site.config("edge")
    auth = authenticator_for(host_spec(edge_config), [EDGE], edge_config.mesh.keys, True)
    # A slot that stays silent for 10 slots' time gets its PARAMS again: a repair takes
    # milliseconds, so none should be sent again after the restart.
    engine = MqttEngine(None, site.address("edge"), wave_timeout=10 * SLOT_S,
                        max_attempts=3, nodes_timeout=30, auth=auth)
    site.broker.start(timeout=10)
    try:
        with site.host("top"), site.host("bottom"):
            # Until a slot gives a result: then the nodes hold the parameters, and the
            # edge sends none with the next slot.
            before: list[dict] = []
            deadline = time.monotonic() + 120  # a hang guard, not a duration claim
            while not (before and "probability" in before[-1]):
                assert time.monotonic() < deadline, before
                before += serve(engine, model, SLOT_S, slots=1)
        resent_before = engine.stats["slot_params_resent"]
        with site.host("top") as top, site.host("bottom") as bottom:
            hosts = [top, bottom]
            _connected(hosts)
            after = serve(engine, model, SLOT_S, slots=2)
            stats = [h.host.node_stats() for h in hosts]
    finally:
        engine.close()
        site.broker.stop()
    _assert_central(model, [a for a in before if "probability" in a])
    # Both slots after the restart give central inference's alerts ...
    assert all("probability" in a for a in after), after
    _assert_central(model, after)
    # ... on parameters every cell got by repair: r0c0 from the edge (edge/r0c0/params),
    # the others from their tree parents, row 2 from row 1 across the hosts (through
    # the broker), with no flood from the edge.
    assert sum(s["params_repaired"] for s in stats) == len(TOP + BOTTOM), stats
    assert engine.stats["slot_params_resent"] == resent_before
    assert engine.edge is not None and engine.edge.stats["params_repairs_sent"] == 1
    rejected = {k: n for s in stats for k, n in s.items() if k.startswith("rejected:codec")}
    assert rejected == {}, rejected
