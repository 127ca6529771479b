"""The production setup under attack, end to end (meshdl/bench/hostile.py on a small mesh).

Mosquitto with deploy/mosquitto/production.conf (TLS, passwords, the generated ACL, its
1 MiB fallback limit), node hosts and edge as separate processes with their own message keys,
and a client logged in with one node's password flooding every topic it may write,
plus (issue 29) a status record claiming one cell ~32,750 times once a second, a burst
of 1.2 GB of 1,040,000-byte messages to its neighbour on the other host, and 400
retained messages of that size below its own name. One clean run and one attack run:
the trained parameters are the virtual mesh's in both, every process lives and stops
cleanly when told to, memory stays within 150 MB of the clean run's, and the broker's
store holds at most one retained message per topic the attacker's login may write.

Then (issue 43, item 3) the set-up as `meshdl deploy credentials` gives it, the broker's
limits derived from the mesh: a sustained flood of 1 MB messages at full speed gets the
login thrown out at every message, and training ends with the virtual mesh's parameters
and no process more than 150 MB above the clean run.
"""

from __future__ import annotations

import re

import pytest

from meshdl.bench.hostile import (
    FLOOD_FIRST,
    FLOOD_TOTAL,
    RETAINED_FILL,
    Flood,
    bench_hostile,
)
from meshdl.config import load_run_config
from meshdl.data.lounge import generate_lounge
from meshdl.mqtt.sizes import PRODUCTION_MESSAGE_BYTES, broker_limits
from meshdl.sim.faults.hostile import FLOOD_BYTES
from tests.mosquitto import mosquitto_binary

MESH = {"model": {"rows": 4, "cols": 5, "hidden": 8},
        "data": {"train": 40, "test": 20, "seed": 4},
        "train": {"epochs": 2, "batch": 10}}
# What the attack may add to a process's peak memory (issue 29). Each process's share is
# a bounded queue of 1 MB messages: a host's inbox (32 MiB, 8 MiB per sender,
# meshdl/mqtt/session.py); the broker's QoS 0 queue of the flooded client (100 messages,
# production.conf) plus the attacker's retained messages (one per topic its login may
# write: 33 here), 128 MiB at most; beyond that, the few copies of a 1 MB message being
# read, decoded and checked at once, and the allocator's slack around them.
MEMORY_MARGIN_MB = 150


@pytest.fixture(scope="module")
def result() -> dict:
    mosquitto_binary("mosquitto_passwd")
    config = load_run_config(**MESH)
    # Each test below asserts its own part, whatever became of the others. Issue 29's
    # burst under production.conf's own 1 MiB (its fallback, with no limits file of the
    # mesh's): what a login may do where the mesh's messages are near 1 MB.
    return bench_hostile(config, generate_lounge(config.data), raise_on_failure=False,
                         broker_message_bytes=PRODUCTION_MESSAGE_BYTES)


@pytest.fixture(scope="module")
def derived() -> dict:
    """A sustained 1 MB flood at full speed under the limits `deploy credentials`
    derives for the mesh (its largest message is a status record of ~5.5 KB)."""
    mosquitto_binary("mosquitto_passwd")
    config = load_run_config(**MESH)
    return bench_hostile(config, generate_lounge(config.data), raise_on_failure=False,
                         flood=Flood(total=None, mb_per_s=None), run_limit_s=600)


@pytest.mark.parametrize("run", ["clean", "attack"])
def test_training_over_the_production_setup_gives_the_virtual_mesh_parameters(
        result: dict, run: str) -> None:
    outcome = result[run]
    assert outcome["edge_exit"] == 0, outcome["edge_error"]
    assert all(outcome["node_hosts_alive_at_end"].values()), outcome
    assert outcome["max_param_diff_relative"] <= 1e-5, outcome


@pytest.mark.parametrize("run", ["clean", "attack"])
def test_node_hosts_stop_on_sigterm_with_exit_code_0_and_their_stop_line(
        result: dict, run: str) -> None:
    # A SIGTERM the host does not honour ends in the harness's SIGKILL after 10 s (a
    # hang guard, not a measurement): exit code -9 and no stop line.
    outcome = result[run]
    assert outcome["host_exits"] == {"north": 0, "south": 0}, outcome["sigterm_s"]
    assert all(line is not None for line in outcome["host_stop_lines"].values()), outcome


def test_a_flood_from_a_stolen_node_login_is_rejected_and_changes_nothing(
        result: dict) -> None:
    attack = result["attack"]
    assert sum(attack["attacker_sent"].values()) > 1000
    # The south host hears the attacker's topics, and rejected what came (forged tags,
    # garbage, replays under the wrong topic); nothing of it was accepted.
    south = attack["host_stop_lines"]["south"]
    rejected = int(re.search(r"rejected (\d+)", south).group(1))
    assert rejected > 0, south
    assert pytest.approx(result["clean"]["test_acc"]) == attack["test_acc"]


def test_a_status_record_claiming_one_cell_32_thousand_times_does_not_stop_the_edge(
        result: dict) -> None:
    attack = result["attack"]
    assert attack["attacker_sent"]["claim_bomb"] >= 1
    assert attack["edge_exit"] == 0, attack["edge_error"]
    refused = attack["edge_rejected"]
    assert refused.get("rejected:bad_status", 0) + refused.get("rejected:unsigned_status", 0) \
        >= 1, refused


def test_memory_stays_within_150_mb_of_the_clean_run_under_a_flood_of_1_mb_messages(
        result: dict) -> None:
    attack = result["attack"]
    # The first wave starts once 200 MB went to the attacker's neighbour on the south
    # host (FLOOD_FIRST), and the flood goes on, as fast as the broker takes it, until
    # 1.2 GB are out (FLOOD_TOTAL) or training ended under it.
    assert FLOOD_FIRST <= attack["attacker_sent"]["flood_1mb"] <= FLOOD_TOTAL
    over = attack["memory_over_clean_mb"]
    assert set(over) == {"broker", "north", "south", "edge"}
    assert all(mb <= MEMORY_MARGIN_MB for mb in over.values()), (over, attack["peak_rss_mb"])


def test_the_broker_keeps_retained_messages_only_on_topics_the_login_may_write(
        result: dict) -> None:
    attack = result["attack"]
    assert attack["attacker_sent"]["retained_fill"] == RETAINED_FILL
    grants = attack["attacker_write_grants"]
    # Exact topics only: a wildcard would let the login retain a message on any number
    # of topics below it.
    assert not any("#" in g or "+" in g for g in grants), grants
    # At most one retained message per topic the node writes (its status record under
    # 256 KiB), next to the clean run's store: not the 400 MB a free subtree keeps.
    bound_mb = len(grants) * FLOOD_BYTES / 2**20 + result["clean"]["broker_store_mb"] + 1
    assert attack["broker_store_mb"] <= bound_mb, (attack["broker_store_mb"], bound_mb)
    assert attack["memory_over_clean_mb"]["broker"] <= MEMORY_MARGIN_MB


def test_under_the_meshs_derived_limits_a_sustained_1_mb_flood_changes_nothing(
        derived: dict) -> None:
    config = load_run_config(**MESH)
    assert derived["broker_message_bytes"] == broker_limits(config).message_size_limit
    assert derived["broker_limit_from"] == "deploy credentials"
    attack = derived["attack"]
    assert attack["edge_exit"] == 0, attack["edge_error"]
    assert attack["max_param_diff_relative"] <= 1e-5, attack
    # Every 1 MB message gets the login thrown out at its header: none reaches a host.
    assert attack["broker_oversize_disconnects"] >= 10
    assert attack["attacker_sent"].get("flood_1mb", 0) == 0
    over = attack["memory_over_clean_mb"]
    assert all(mb <= MEMORY_MARGIN_MB for mb in over.values()), (over, attack["peak_rss_mb"])
