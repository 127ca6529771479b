"""`meshdl bench hostile`'s flags (issue 43, item 3): which flood the stolen login sends,
at what rate, under which broker limit, for how long at most, with or without the clean
run. The bench itself runs in tests/test_hostile.py; here it is replaced by a recorder."""

from __future__ import annotations

import json

import pytest

import meshdl.bench.hostile as hostile
from meshdl.bench.hostile import BURST, Flood
from meshdl.config import load_run_config
from meshdl.mqtt.sizes import broker_limits
from tests.helpers import assert_one_line_error


@pytest.fixture
def calls(monkeypatch) -> list[dict]:
    seen: list[dict] = []

    def bench(config, data, **options):
        seen.append(options)
        run = {"wall_s": 1.0, "edge_exit": 0, "node_hosts_alive_at_end": {}, "peak_rss_mb": {},
               "max_param_diff": 0.0, "attacker_sent": {}, "flood_mb_per_s": 0.0,
               "broker_oversize_disconnects": 0, "restarted_waves": 0}
        return {"broker_message_bytes": options["broker_message_bytes"] or 1,
                "broker_limit_from": "test", "flood": str(options["flood"]), "attack": run,
                **({} if options["attack"] == (True,) else {"clean": run})}

    monkeypatch.setattr(hostile, "bench_hostile", bench)
    return seen


def test_bench_hostile_defaults_to_the_burst_under_the_derived_limit(cli, calls) -> None:
    code, _, err = cli("bench", "hostile")
    assert code == 0, err
    (options,) = calls
    assert options["flood"] == BURST and options["broker_message_bytes"] is None
    assert options["attack"] == (False, True) and options["run_limit_s"] == 900.0


def test_bench_hostile_takes_the_flood_its_rate_the_limit_and_a_bound(cli, calls) -> None:
    code, stdout, err = cli("bench", "hostile", "--flood", "sustained", "--mb-per-s", "50",
                            "--broker-message-bytes", "8192", "--run-limit", "400",
                            "--attack-only", "--json")
    assert code == 0, err
    (options,) = calls
    assert options["flood"] == Flood(total=None, mb_per_s=50.0)
    assert (options["broker_message_bytes"], options["run_limit_s"], options["attack"]) == \
        (8192, 400.0, (True,))
    assert "clean" not in json.loads(stdout)


def test_the_small_flood_sends_messages_of_the_brokers_limit(cli, calls) -> None:
    assert cli("bench", "hostile", "--flood", "small")[0] == 0
    assert cli("bench", "hostile", "--flood", "small", "--broker-message-bytes", "8192")[0] == 0
    derived = broker_limits(load_run_config(None, train={"epochs": 2})).message_size_limit
    assert [c["flood"] for c in calls] == [Flood(total=None, mb_per_s=None,
                                                 message_bytes=size)
                                           for size in (derived, 8192)]


def test_a_rate_for_the_burst_is_a_usage_error(cli, calls) -> None:
    code, _, err = cli("bench", "hostile", "--mb-per-s", "10")
    assert_one_line_error(code, err, 2, "--mb-per-s", "--flood sustained")
    assert calls == []
