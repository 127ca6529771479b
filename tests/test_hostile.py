"""The production setup under attack, end to end (meshdl/bench_hostile.py on a small mesh).

Mosquitto with deploy/mosquitto/production.conf (TLS, passwords, the generated ACL, the
1 MiB limit), node hosts and edge as separate processes with their own message keys,
and a client logged in with one node's password flooding every topic it may write:
the trained parameters are the virtual mesh's, every process lives, and memory stays
within 1.5 times the clean run's.
"""

from __future__ import annotations

import re

import pytest

from meshdl.bench_hostile import bench_hostile
from meshdl.config import load_run_config
from meshdl.sim.lounge import generate_lounge
from tests.mosquitto import mosquitto_binary

MESH = {"model": {"rows": 4, "cols": 5, "hidden": 8},
        "data": {"train": 40, "test": 20, "seed": 4},
        "train": {"epochs": 2, "batch": 10}}


def test_a_flood_from_a_stolen_node_login_changes_nothing_under_the_production_setup(
        ) -> None:
    mosquitto_binary("mosquitto_passwd")
    config = load_run_config(**MESH)
    result = bench_hostile(config, generate_lounge(config.data))
    for name in ("clean", "attack"):
        run = result[name]
        assert run["edge_exit"] == 0
        assert all(run["node_hosts_alive_at_end"].values()), run
        assert run["max_param_diff_relative"] <= 1e-5, run  # the virtual mesh's parameters
        assert all(s < 2.0 for s in run["sigterm_s"].values()), run["sigterm_s"]
    attack = result["attack"]
    assert sum(attack["attacker_sent"].values()) > 1000
    # The south host hears the attacker's topics, and rejected what came (forged tags,
    # garbage, replays under the wrong topic); nothing of it was accepted.
    south = attack["host_stop_lines"]["south"]
    rejected = int(re.search(r"rejected (\d+)", south).group(1))
    assert rejected > 0, south
    assert all(ratio <= 1.5 for ratio in attack["memory_vs_clean"].values()), attack
    assert pytest.approx(result["clean"]["test_acc"]) == attack["test_acc"]
