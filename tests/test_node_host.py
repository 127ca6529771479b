"""Node hosts route by topic and hand messages between their own cells over in process:
the wave's result is the virtual mesh's, and only traffic between hosts or with the edge
would cross a broker. Driven without any broker: a dict of subscriptions stands in."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.edge.agent import EdgeMachine
from meshdl.nodes.host import NodeHost, dataset_readings
from meshdl.protocol.messages import EDGE, Kind, Message, make
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import topic, topic_matches
from meshdl.sim.mesh import MeshEngine

CONFIG = ModelConfig(rows=5, cols=6, hidden=8)
BATCH = 6


def _data() -> Dataset:
    rng = np.random.default_rng(3)
    X = rng.normal(20.0, 3.0, (BATCH, CONFIG.rows, CONFIG.cols)).astype(np.float32)
    y = rng.integers(0, 2, BATCH)
    return Dataset(X, y, X, y, {})


def _model() -> CNN:
    model = CNN(CONFIG, seed=2)
    model.set_normalization(20.0, 3.0)
    return model


def _wave_through_hosts(hosts: list[NodeHost], data: Dataset
                        ) -> tuple[EdgeMachine, Counter[str]]:
    """One training wave: the edge and the hosts exchange messages by topic, as a broker
    would deliver them; returns the edge and the count of what crossed, by kind."""
    spec = hosts[0].spec
    edge = EdgeMachine(spec, _model(), {Split.TRAIN: data.y_train})
    subscribed = [(host, host.subscriptions()) for host in hosts]
    crossed: Counter[str] = Counter()
    pending: list[Message] = edge.start(Mode.TRAIN, Split.TRAIN, np.arange(BATCH))
    while pending and edge.result is None:
        message = pending.pop(0)
        h = message.header
        name = topic(spec.mesh_id, h.src, h.dst, h.kind)
        crossed[h.kind.name.lower()] += 1
        if h.dst == EDGE:
            pending += edge.handle(message)
            continue
        for host, filters in subscribed:
            if any(topic_matches(f, name) for f in filters):
                pending += host.handle(name, message)
    return edge, crossed


def _hosts(spec: MeshSpec, data: Dataset, parts: list[list[tuple[int, int]]],
           local: bool = True) -> list[NodeHost]:
    return [NodeHost(spec, cells, lambda cell: dataset_readings(data, cell),
                     local_delivery=local) for cells in parts]


def _reference(data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    engine = MeshEngine(data, params_via="broadcast")
    try:
        _, logits, grads = engine.loss_and_grads(_model(), np.arange(BATCH))
        return logits.copy(), grads.copy()
    finally:
        engine.close()


SPEC = MeshSpec(1, CONFIG, (0, 0), "broadcast")
ALL_CELLS = list(SPEC.topology.cells())


def test_one_host_of_every_cell_sends_only_the_edges_traffic_over_the_broker() -> None:
    data = _data()
    [host] = _hosts(SPEC, data, [ALL_CELLS])
    edge, crossed = _wave_through_hosts([host], data)
    logits, grads = _reference(data)
    np.testing.assert_array_equal(edge.result.logits, logits)
    np.testing.assert_array_equal(edge.result.grads, grads)
    # The edge's two broadcasts, the gather and the reduce up, the scatter down.
    assert crossed == Counter(params=1, batch=1, gather=1, scatter=1, reduce=1)
    assert host.stats["delivered_locally"] > 100
    assert all(f.startswith("meshdl/1/edge/") for f in host.subscriptions())


@pytest.mark.parametrize("local", [True, False])
def test_hosts_splitting_the_grid_give_the_virtual_meshs_result(local: bool) -> None:
    data = _data()
    top = [c for c in ALL_CELLS if c[0] < 2]
    bottom = [c for c in ALL_CELLS if c[0] >= 2]
    hosts = _hosts(SPEC, data, [top, bottom], local)
    edge, crossed = _wave_through_hosts(hosts, data)
    logits, grads = _reference(data)
    np.testing.assert_allclose(edge.result.logits, logits, rtol=1e-6)
    np.testing.assert_allclose(edge.result.grads, grads, rtol=1e-5, atol=1e-8)
    local_count = sum(host.stats["delivered_locally"] for host in hosts)
    across = 2 * CONFIG.conv_layers * CONFIG.cols  # conv halos over the rows 1 | 2 cut
    if local:
        assert local_count > 0 and crossed["halo"] == across
        for host in hosts:  # a host never hears its own cells' talk through the broker
            own = {f"r{r}c{c}" for r, c in host.nodes}
            assert not any(f.split("/")[2] in own for f in host.subscriptions())
    else:
        assert local_count == 0 and crossed["halo"] > across


def test_a_cell_that_raises_is_isolated_and_reported_while_the_host_serves_the_others(
        ) -> None:
    spec = MeshSpec(1, CONFIG, (0, 0), "broadcast")
    data = _data()
    cells = list(spec.topology.cells())
    host = NodeHost(spec, cells, lambda cell: dataset_readings(data, cell))
    broken = host.nodes[(2, 3)]

    def bug(message: Message, now: float = 0.0) -> list[Message]:
        raise IndexError("a bug some message reached")

    broken.handle = bug
    edge, _ = _wave_through_hosts([host], data)  # must not raise
    assert edge.result is None  # the wave cannot finish without that cell ...
    assert set(host.failed) == {(2, 3)} and "IndexError" in host.failed[(2, 3)]
    stats = host.node_stats()
    assert stats["failed_cells"] == 1 and stats["rejected:cell_failed"] > 0
    assert stats["accepted"] > 0  # ... but every other cell took its messages


def test_a_cell_that_raises_on_a_message_from_the_radio_is_isolated_as_well() -> None:
    """`take` (simulated time: the radio knows the receiver) isolates a cell as
    `handle` does: the message that made it raise and every later one are refused."""
    spec = MeshSpec(1, CONFIG, (0, 0), "broadcast")
    data = _data()
    host = NodeHost(spec, [(2, 3), (2, 4)], lambda cell: dataset_readings(data, cell))

    def bug(message: Message, now: float = 0.0) -> list[Message]:
        raise IndexError("a bug some message reached")

    host.nodes[(2, 3)].handle = bug
    params = make(Kind.PARAMS, 1, 0, EDGE, (2, 3), np.zeros(3, np.float32))
    assert host.take(params, 0.0) == [] and host.take(params, 1.0) == []
    assert set(host.failed) == {(2, 3)} and "IndexError" in host.failed[(2, 3)]
    assert host.stats["failed_cells"] == 1 and host.stats["rejected:cell_failed"] == 1
