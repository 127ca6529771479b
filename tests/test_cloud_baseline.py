"""The cloud-heavy baseline (sim/studies/cloud.py): every node's readings shipped to the edge,
which computes the whole network. Its figures are counted by hand on small grids (edge
at (0, 0), one input channel): the messages, their bytes and frames up the BFS tree
(aggregated or relayed hop by hop) or through the MQTT broker, pieces within the mesh's
message limit, who spends the most time on air, and the edge's compute time; and the
simulated times obey the radio's physics."""

from __future__ import annotations

import math

import pytest

from meshdl.config import ModelConfig
from meshdl.model.cnn import CNN
from meshdl.protocol.messages import EDGE, HEADER_BYTES, ITEM_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import name_of, topic
from meshdl.protocol.topology import Cell, Topology
from meshdl.protocol.work import central_work, optimizer_work
from meshdl.sim.radio.device import device
from meshdl.sim.radio.media import Medium
from meshdl.sim.radio.profiles import RadioProfile, profile
from meshdl.sim.studies import cloud
from meshdl.sim.timed import publish_bytes

NODE = device("cortex-m4")
EDGE_DEVICE = device("pi4")
BATCH = 4
GRIDS = [(3, 3), (4, 5)]


def _spec(rows: int, cols: int, **kwargs) -> MeshSpec:
    return MeshSpec(1, ModelConfig(rows=rows, cols=cols), **kwargs)


def _subtree_sizes(topo: Topology) -> dict[Cell, int]:
    """Each cell and its descendants in the BFS tree, counted from `children`."""
    sizes: dict[Cell, int] = {}

    def count(cell: Cell) -> int:
        if cell not in sizes:
            sizes[cell] = 1 + sum(count(child) for child in topo.children[cell])
        return sizes[cell]

    for cell in topo.cells():
        count(cell)
    return sizes


def _path_to_edge(topo: Topology, cell: Cell) -> list[Cell]:
    """The senders from `cell` up to edge_at, in order."""
    path = [cell]
    while topo.parent[path[-1]] != EDGE:
        path.append(topo.parent[path[-1]])
    return path


def _on_air(radio: RadioProfile, size: int) -> float:
    """Seconds on air of a message's frames."""
    return sum(radio.frame_airtime(f) for f in radio.frame_sizes(size))


def _frames(radio: RadioProfile, size: int) -> int:
    return len(radio.frame_sizes(size))


def _ship(spec: MeshSpec, variant: cloud.Variant = "aggregated", medium: str = "shared",
          radio: str = "802.15.4", samples: int = BATCH, seed: int = 0) -> cloud.Shipped:
    return cloud.ship_readings(spec, profile(radio), medium, NODE, EDGE_DEVICE, samples,
                               variant, seed)


# ------------------------------------------------------------------ hand counts
def test_the_3x3_tree_counted_by_hand() -> None:
    """The tree the other tests count over: edge_at (0, 0) carries all 9 cells, and the
    subtree sizes add up to the depths (each cell is counted once per hop it is away)."""
    topo = _spec(3, 3).topology
    sizes = _subtree_sizes(topo)
    assert sizes[(0, 0)] == 9
    assert sorted(sizes.values()) == [1, 1, 1, 2, 2, 2, 3, 6, 9]
    assert sum(sizes.values()) == sum(topo.depth[c] for c in topo.cells()) == 27
    assert max(topo.depth[c] for c in topo.cells()) == 5


@pytest.mark.parametrize(("rows", "cols"), GRIDS)
def test_aggregated_readings_cross_each_tree_link_once_carrying_their_subtree(
        rows: int, cols: int) -> None:
    spec = _spec(rows, cols)
    radio = profile("802.15.4")
    sizes = _subtree_sizes(spec.topology)
    messages = [HEADER_BYTES + ITEM_BYTES * sizes[cell] * BATCH for cell in sizes]
    shipped = _ship(spec, "aggregated")
    assert shipped.transmissions == rows * cols  # one per tree link
    assert shipped.bytes == sum(messages)
    assert shipped.frames == sum(_frames(radio, size) for size in messages)


def test_aggregated_bytes_of_the_3x3_grid_are_864() -> None:
    # 9 headers of 48 bytes, and 27 cells' worth of 4 readings of 4 bytes (27 = the sum
    # of the subtree sizes 9 + 6 + 3 + 2 + 2 + 2 + 1 + 1 + 1).
    assert _ship(_spec(3, 3), "aggregated").bytes == 9 * 48 + 27 * 4 * 4 == 864


@pytest.mark.parametrize(("rows", "cols"), GRIDS)
def test_unaggregated_readings_are_relayed_hop_by_hop(rows: int, cols: int) -> None:
    spec = _spec(rows, cols)
    topo = spec.topology
    hops = sum(topo.depth[cell] for cell in topo.cells())  # edge_at is 1 hop away
    assert hops == {(3, 3): 27, (4, 5): 90}[rows, cols]
    shipped = _ship(spec, "unaggregated")
    assert shipped.transmissions == hops
    assert shipped.bytes == hops * (HEADER_BYTES + ITEM_BYTES * BATCH)
    assert shipped.frames == hops * _frames(profile("802.15.4"), HEADER_BYTES + 4 * BATCH)


@pytest.mark.parametrize(("rows", "cols"), GRIDS)
@pytest.mark.parametrize("variant", ["aggregated", "unaggregated"])
def test_star_readings_go_up_to_the_broker_and_down_to_the_edge(
        rows: int, cols: int, variant: cloud.Variant) -> None:
    """Through the broker there is no tree: each node publishes its own readings, the
    broker passes them on; both variants are the same two hops per cell."""
    spec = _spec(rows, cols)
    topic_length = len(topic(spec.mesh_id, (0, 0), EDGE, Kind.GATHER))
    assert topic_length == len("meshdl/1/r0c0/edge/gather") == 25
    publish = publish_bytes(topic_length, HEADER_BYTES + ITEM_BYTES * BATCH)
    # MQTT 5 PUBLISH, QoS 0: fixed header 1 + remaining length 1, topic 2 + 25,
    # properties' length 1, then the 64-byte message.
    assert publish == 1 + 1 + 2 + 25 + 1 + 64 == 94
    cells = rows * cols
    shipped = _ship(spec, variant, medium="star", radio="wifi")
    assert shipped.transmissions == 2 * cells
    assert shipped.bytes == 2 * cells * publish
    assert shipped.frames == 2 * cells * _frames(profile("wifi"), publish)


# ------------------------------------------------------------------ message limit
@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """Every piece that reaches the edge, and every transmission's size."""
    at_edge: list[cloud.Piece] = []
    sizes: list[int] = []
    arrive, send = cloud._Shipping._arrive, Medium.send

    def recording_arrive(self, party, piece):
        if party == EDGE:
            at_edge.append(piece)
        arrive(self, party, piece)

    def recording_send(self, tx, ready=None):
        sizes.append(tx.size)
        send(self, tx, ready)

    monkeypatch.setattr(cloud._Shipping, "_arrive", recording_arrive)
    monkeypatch.setattr(Medium, "send", recording_send)
    return at_edge, sizes


LIMIT = 1200  # bytes: a PARAMS message of the default model (1176) still fits
SAMPLES = 300  # 300 values a cell: more than one message holds


def test_a_message_above_the_limit_is_cut_into_pieces_and_every_reading_arrives(
        arrivals) -> None:
    at_edge, sizes = arrivals
    spec = _spec(3, 3, max_message_bytes=LIMIT)
    per_message = (LIMIT - HEADER_BYTES) // ITEM_BYTES
    assert per_message == 288
    subtree = _subtree_sizes(spec.topology)
    shipped = _ship(spec, "aggregated", samples=SAMPLES)
    # e.g. edge_at carries 9 x 300 = 2700 values: 10 pieces (9 of 288, one of 108).
    pieces = {cell: math.ceil(n * SAMPLES / per_message) for cell, n in subtree.items()}
    assert pieces[(0, 0)] == 10
    assert shipped.transmissions == sum(pieces.values()) == 36
    assert shipped.bytes == HEADER_BYTES * 36 + ITEM_BYTES * SAMPLES * 27
    assert max(sizes) == LIMIT == HEADER_BYTES + ITEM_BYTES * per_message
    assert len(sizes) == 36
    # The edge got edge_at's 10 pieces: every value of every cell.
    assert len(at_edge) == 10
    assert sum(p.size - HEADER_BYTES for p in at_edge) == ITEM_BYTES * 9 * SAMPLES
    assert [p.cells for p in at_edge] == [0] * 9 + [9]  # the last piece completes them


def test_an_unaggregated_reading_above_the_limit_is_relayed_in_pieces(arrivals) -> None:
    at_edge, sizes = arrivals
    spec = _spec(3, 3, max_message_bytes=LIMIT)
    shipped = _ship(spec, "unaggregated", samples=SAMPLES)
    # Each cell's 300 values: pieces of 288 and 12 values, each relayed hop by hop.
    assert shipped.transmissions == 2 * 27
    assert shipped.bytes == 27 * (2 * HEADER_BYTES + ITEM_BYTES * SAMPLES)
    assert max(sizes) <= LIMIT
    assert len(at_edge) == 2 * 9
    assert sum(p.size - HEADER_BYTES for p in at_edge) == ITEM_BYTES * 9 * SAMPLES
    assert sum(p.cells for p in at_edge) == 9


def test_star_pieces_stay_within_the_limit_and_every_reading_arrives(arrivals) -> None:
    at_edge, _ = arrivals
    spec = _spec(3, 3, max_message_bytes=LIMIT)
    shipped = _ship(spec, "unaggregated", medium="star", radio="wifi", samples=SAMPLES)
    assert shipped.transmissions == 2 * 2 * 9  # two pieces a cell, two hops each
    assert all(p.size <= LIMIT for p in at_edge)
    assert sum(p.size - HEADER_BYTES for p in at_edge) == ITEM_BYTES * 9 * SAMPLES
    assert sum(p.cells for p in at_edge) == 9


# ------------------------------------------------------------------ airtime
@pytest.mark.parametrize(("rows", "cols"), GRIDS)
def test_the_cell_next_to_the_edge_has_the_most_airtime_when_readings_are_aggregated(
        rows: int, cols: int) -> None:
    spec = _spec(rows, cols)
    radio = profile("802.15.4")
    topo = spec.topology
    subtree = _subtree_sizes(topo)
    airtime = _ship(spec, "aggregated").energy_j["airtime_s"]
    per_node = airtime["per_node"]
    assert airtime["max_node_cell"] == name_of(spec.edge_at) == "r0c0"
    assert all(per_node["r0c0"] >= seconds for seconds in per_node.values())
    assert airtime["max_node"] == per_node["r0c0"]

    def held(cell: Cell) -> float:
        """A unicast of cell's subtree: its frames, and an ACK after each."""
        size = HEADER_BYTES + ITEM_BYTES * subtree[cell] * BATCH
        return _on_air(radio, size) + _frames(radio, size) * radio.ack_airtime

    # By hand: a cell sends its own message and hears each child's (ACKs included).
    for cell in topo.cells():
        expected = held(cell) + sum(held(child) for child in topo.children[cell])
        assert per_node[name_of(cell)] == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize(("variant", "medium", "radio"), [
    ("aggregated", "shared", "802.15.4"), ("unaggregated", "shared", "802.15.4"),
    ("unaggregated", "star", "wifi"), ("aggregated", "shared", "ble")])
def test_the_same_seed_gives_the_same_figures(variant, medium, radio) -> None:
    spec = _spec(4, 5)
    first = _ship(spec, variant, medium, radio, seed=7)
    assert _ship(spec, variant, medium, radio, seed=7) == first
    slot = cloud.inference_slot(spec, profile(radio), medium, NODE, EDGE_DEVICE, BATCH,
                                variant, seed=7)
    assert cloud.inference_slot(spec, profile(radio), medium, NODE, EDGE_DEVICE, BATCH,
                                variant, seed=7) == slot


def test_another_seed_moves_the_times_but_never_the_traffic() -> None:
    spec = _spec(3, 3)
    runs = [_ship(spec, "aggregated", seed=seed) for seed in range(4)]
    traffic = {(r.bytes, r.frames, r.transmissions) for r in runs}
    assert traffic == {(864, 11, 9)}
    assert len({r.makespan_s for r in runs}) > 1  # the CSMA backoffs differ


# ------------------------------------------------------------------ compute at the edge
def test_training_run_computes_every_step_at_the_edge() -> None:
    spec = _spec(3, 3)
    model = spec.model
    radio = profile("802.15.4")
    samples, steps, batch = 64, 5, 16
    # Parameters by hand: conv 9x1x5 + 5 and 9x5x5 + 5; fc1 20 x 200 + 200 (2 x 2 pooled
    # blocks of 5 filters); fc2 200 x 2 + 2.
    parameters = CNN(model).flat.size
    assert parameters == (45 + 5) + (225 + 5) + (20 * 200 + 200) + (200 * 2 + 2) == 4882
    # One training sample by hand, what the mesh's nodes and edge compute: forward convs
    # 9 cells x (2*9*1*5 + 10 + 2*9*5*5 + 10) and pooling 9 x 5; the weight gradients
    # 9 x (2*9*1*5 + 5 + 2*9*5*5 + 5); the input gradient of layer 2 only 9 x (2*9*5*5 + 5);
    # routing and ReLU's mask 2 x 9 x 5; the head forward 2 (20*200 + 200*2) + 200 + 2 +
    # 200, its loss 4*2 and backward 2 * forward + 200.
    forward = 9 * (100 + 460) + 45
    weights, inputs, routing = 9 * (95 + 455), 9 * 455, 90
    head = 2 * (20 * 200 + 200 * 2) + 402
    assert central_work(model, training=True).at(1) == \
        forward + weights + inputs + routing + head + 8 + 2 * head + 200 == 42034
    per_step = central_work(model, training=True).at(batch) + optimizer_work(parameters).at(0)
    assert per_step == 42034 * batch + 12 * parameters

    run = cloud.training_run(spec, radio, "shared", NODE, EDGE_DEVICE, samples, steps, batch)
    assert run["compute_s"] == pytest.approx(EDGE_DEVICE.cpu_s(per_step * steps, 0),
                                             rel=1e-12)
    assert run["compute_s"] == pytest.approx(per_step * steps / 406e6, rel=1e-12)
    # The raw training set is shipped once, then the edge computes.
    shipped = _ship(spec, "aggregated", samples=samples)
    assert run["ship_s"] == shipped.makespan_s
    assert run["makespan_s"] == pytest.approx(shipped.makespan_s + run["compute_s"])
    assert (run["bytes"], run["frames"], run["transmissions"]) == \
        (shipped.bytes, shipped.frames, shipped.transmissions)
    # While the edge computes, it draws its CPU power and its radio listens; the 9
    # nodes idle and listen (always-on), as the mesh's nodes do between their messages.
    compute = run["compute_s"]
    assert run["energy_j"]["edge"] == pytest.approx(
        shipped.energy_j["edge"] + compute * (EDGE_DEVICE.cpu_w + radio.idle_w))
    assert run["energy_j"]["total"] == pytest.approx(
        shipped.energy_j["total"] + compute * (EDGE_DEVICE.cpu_w + radio.idle_w)
        + compute * 9 * (NODE.idle_w + radio.idle_w))


def test_an_inference_slot_computes_the_whole_network_once_at_the_edge() -> None:
    spec = _spec(3, 3)
    slot = cloud.inference_slot(spec, profile("802.15.4"), "shared", NODE, EDGE_DEVICE,
                                BATCH)
    # 9 cells' convolutions and pooling, then the head forward: 5085 + 9202 a sample.
    assert central_work(spec.model, training=False).at(BATCH) == (5085 + 9202) * BATCH
    assert slot["compute_s"] == pytest.approx(EDGE_DEVICE.cpu_s((5085 + 9202) * BATCH, 0))
    assert slot["ship_s"] == _ship(spec, "aggregated").makespan_s
    assert slot["bytes"] == 864


def test_times_scales_a_slots_figures_by_the_number_of_slots() -> None:
    slot = cloud.inference_slot(_spec(3, 3), profile("802.15.4"), "shared", NODE,
                                EDGE_DEVICE, BATCH)
    three = cloud.times(slot, 3)
    assert three["slots"] == 3
    for key in ("makespan_s", "ship_s", "compute_s", "edge_compute_j", "bytes", "frames",
                "transmissions"):
        assert three[key] == pytest.approx(3 * slot[key]), key
    for key in ("total", "nodes", "edge", "max_node"):
        assert three["energy_j"][key] == pytest.approx(3 * slot["energy_j"][key]), key
    assert three["energy_j"]["max_node_cell"] == slot["energy_j"]["max_node_cell"]


def test_times_scales_the_ideal_mac_energy_and_the_airtime_too() -> None:
    slot = cloud.inference_slot(_spec(3, 3), profile("802.15.4"), "shared", NODE,
                                EDGE_DEVICE, BATCH)
    three = cloud.times(slot, 3)
    energy, one = three["energy_j"], slot["energy_j"]
    assert energy["ideal_mac"]["total"] == pytest.approx(3 * one["ideal_mac"]["total"])
    assert energy["ideal_mac"]["max_node"] == pytest.approx(3 * one["ideal_mac"]["max_node"])
    assert energy["by_state"]["tx"] == pytest.approx(3 * one["by_state"]["tx"])
    assert energy["airtime_s"]["max_node"] == pytest.approx(3 * one["airtime_s"]["max_node"])


def test_the_edges_compute_energy_counts_under_the_ideal_mac_too() -> None:
    spec = _spec(3, 3)
    run = cloud.training_run(spec, profile("802.15.4"), "shared", NODE, EDGE_DEVICE, 64, 5,
                             16)
    shipped = _ship(spec, "aggregated", samples=64)
    radio, compute = profile("802.15.4"), run["compute_s"]
    # Under the ideal MAC every radio sleeps while the edge computes.
    assert run["energy_j"]["ideal_mac"]["total"] == pytest.approx(
        shipped.energy_j["ideal_mac"]["total"] + compute * (EDGE_DEVICE.cpu_w + radio.sleep_w)
        + compute * 9 * (NODE.idle_w + radio.sleep_w))


# ------------------------------------------------------------------ physics
@pytest.mark.parametrize(("rows", "cols", "samples"), [(3, 3, 4), (4, 5, 4), (4, 5, 40)])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_makespan_is_at_least_the_deepest_paths_time_on_air(rows, cols, samples,
                                                                  seed) -> None:
    spec = _spec(rows, cols)
    radio = profile("802.15.4")
    topo = spec.topology
    subtree = _subtree_sizes(topo)
    deepest = max(topo.cells(), key=topo.depth.__getitem__)
    path = _path_to_edge(topo, deepest)
    assert len(path) == rows + cols - 1  # the far corner's hops
    sizes = [HEADER_BYTES + ITEM_BYTES * subtree[cell] * samples for cell in path]
    makespan = _ship(spec, "aggregated", samples=samples, seed=seed).makespan_s
    # Each hop waits for the one before: at least its frames' airtime.
    assert makespan >= sum(_on_air(radio, size) for size in sizes)
    # Tighter: each sender's CPU takes the message, a CCA, the frames with their ACKs
    # and spaces, the hop latency; then the edge's CPU takes the last.
    floor = sum(NODE.per_message_s + radio.cca_s + radio.transmission_s(size) +
                radio.hop_latency_s for size in sizes) + EDGE_DEVICE.per_message_s
    assert makespan >= floor - 1e-12
