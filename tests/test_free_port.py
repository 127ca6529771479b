"""Ports for the suite's brokers: below the kernel's ephemeral range, where an outgoing
connection (a bridge, a client) never takes its local port before the broker meant to
listen there starts, and never the same one twice in a process."""

from __future__ import annotations

import itertools
import socket

from meshdl.mqtt import localbroker
from meshdl.mqtt.localbroker import HOST, LISTEN_PORTS_FROM, ephemeral_range, free_port
from tests.mosquitto import worker_ports


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)
    below = min(low, localbroker.LISTEN_PORTS_BELOW or low)  # a parallel worker's slice
    if below - LISTEN_PORTS_FROM >= 1000:
        assert all(LISTEN_PORTS_FROM <= port < below for port in ports)
    for port in ports[:5]:  # free: a listener can bind each
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, port))


def test_parallel_test_workers_hand_out_ports_of_disjoint_slices(monkeypatch) -> None:
    slices = [worker_ports(i, 3, 20_000, 32_768) for i in range(3)]
    assert slices[0][0] == 20_000 and slices[-1][1] <= 32_768
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(slices))  # no port in two
    assert worker_ports(3, 3, 20_000, 32_768) == slices[0]  # gw3 replaces a crashed gw0
    monkeypatch.setattr(localbroker, "LISTEN_PORTS_FROM", slices[1][0])
    monkeypatch.setattr(localbroker, "LISTEN_PORTS_BELOW", slices[1][1])
    assert all(slices[1][0] <= free_port() < slices[1][1] for _ in range(50))
