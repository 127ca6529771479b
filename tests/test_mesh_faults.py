"""Bad input never crashes a node or the edge and never changes the result of a step:
duplicated, delayed, reordered, corrupted, truncated, stale and forged messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshdl import CNN, ModelConfig
from meshdl.errors import UsageError
from meshdl.nodes.agent import NodeMachine
from meshdl.protocol.messages import EDGE, Kind, encode, make
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import topic
from meshdl.sim.faults.chaos import Chaos
from tests.test_mesh import _assert_lockstep, _dataset

CONFIG = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_chaotic_delivery_gives_the_clean_result(optimizer: str) -> None:
    chaos = Chaos(seed=4, duplicate=0.3, corrupt=0.2, truncate=0.2, stale=0.2, delay=0.3,
                  max_delay=4, shuffle=True)
    engine = _assert_lockstep(CONFIG, (4, 2), batch=4, steps=3, optimizer=optimizer,
                              chaos=chaos)
    stats = engine.mesh.node_stats()
    assert stats["duplicates"] > 0
    assert stats["stale"] > 0
    assert sum(v for k, v in stats.items() if k.startswith("rejected:codec")) > 0
    assert engine.mesh.edge.stats["accepted"] > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), p=st.floats(0.0, 0.6))
def test_any_mix_of_injected_copies_gives_the_clean_result(seed: int, p: float) -> None:
    chaos = Chaos(seed=seed, duplicate=p, corrupt=p, truncate=p, stale=p, delay=p,
                  shuffle=seed % 2 == 0)
    _assert_lockstep(CONFIG, (0, 0), batch=3, steps=2, optimizer="sgd", seed=seed, chaos=chaos)


@st.composite
def forged(draw):
    """A well-encoded message with arbitrary header fields, or plain garbage bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=120))
    cells = st.tuples(st.integers(-1, 6), st.integers(-1, 7))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    payload = draw(st.sampled_from([np.float32, np.int32]))
    values = np.ones(shape, payload) * draw(st.integers(-3, 3))
    return encode(make(draw(st.sampled_from(list(Kind))), draw(st.sampled_from([1, 2])),
                       draw(st.integers(0, 4)), draw(cells), draw(cells), values,
                       layer=draw(st.integers(0, 3)), phase=draw(st.integers(0, 2))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=st.lists(st.tuples(forged(), st.integers(0, 29), st.sampled_from(list(Kind))),
                     min_size=1, max_size=25))
def test_forged_and_garbage_messages_are_rejected_without_effect(junk) -> None:
    data = _dataset(CONFIG, 4, seed=1)
    results = []
    for inject in (False, True):
        from meshdl.sim.mesh import MeshEngine

        model = CNN(CONFIG, seed=2)
        model.set_normalization(20.0, 3.0)
        engine = MeshEngine(data)
        mesh = engine.mesh_for(model)
        mesh.send(mesh.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4)))
        if inject:  # garbage lands among the first wave's real messages
            cells = list(mesh.nodes)
            for payload, target, kind in junk:
                dst = cells[target % len(cells)]
                src = mesh.spec.topology.neighbours(dst)[0]
                mesh.inject(topic(1, src, dst, kind), payload)
        while mesh.edge.result is None:
            assert not mesh.broker.idle, "the wave stalled"
            mesh.deliver_round()
        results.append((mesh.edge.result.loss, mesh.edge.result.grads.copy()))
    assert results[1][0] == results[0][0]
    np.testing.assert_array_equal(results[1][1], results[0][1])


def _node(cell=(1, 1)) -> tuple[NodeMachine, MeshSpec]:
    spec = MeshSpec(1, CONFIG)
    readings = {Split.TRAIN: np.zeros((4, 1), np.float32)}
    return NodeMachine(spec, cell, readings), spec


def test_node_counts_each_kind_of_bad_message() -> None:
    node, spec = _node()
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0  # std
    cases = {
        "not_a_neighbour": make(Kind.HALO, 1, 1, (3, 3), (1, 1), np.zeros((1, 1, 2))),
        "not_for_me": make(Kind.HALO, 1, 1, (1, 0), (2, 2), np.zeros((1, 1, 2))),
        "other_mesh": make(Kind.HALO, 9, 1, (1, 0), (1, 1), np.zeros((1, 1, 2))),
        "not_from_parent": make(Kind.PARAMS, 1, 1, (1, 2), (1, 1), params),
    }
    for reason, message in cases.items():
        assert node.handle(message) == []
        assert node.stats[f"rejected:{reason}"] == 1, reason
    parent = spec.topology.parent[(1, 1)]
    node.handle(make(Kind.PARAMS, 1, 1, parent, (1, 1), params))
    node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), np.array([0, 0, 0, 7], np.int32)))
    assert node.stats["rejected:bad_batch"] == 1  # sample 7 does not exist
    out = node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), np.array([0, 0, 0, 1], np.int32)))
    assert out, "a valid batch starts the wave"
    assert node.handle(make(Kind.HALO, 1, 1, (1, 0), (1, 1), np.zeros((5, 1, 2)),
                            layer=1)) == []
    assert node.stats["rejected:bad_shape"] == 1
    assert node.handle(make(Kind.REDUCE, 1, 1, (1, 0), (1, 1), np.zeros(3))) == []
    assert node.stats["rejected:bad_reduce"] == 1
    assert node.handle(make(Kind.PARAMS, 1, 1, parent, (1, 1), params)) == []
    assert node.stats["duplicates"] == 1


def test_edge_ignores_messages_not_from_its_cell() -> None:
    spec = MeshSpec(1, CONFIG)
    from meshdl.edge.agent import EdgeMachine

    edge = EdgeMachine(spec, CNN(CONFIG), {Split.TRAIN: np.zeros(4, np.int64)})
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4))
    assert edge.handle(make(Kind.GATHER, 1, 1, (1, 1), EDGE, np.zeros((3, 2, 4)))) == []
    assert edge.handle(make(Kind.GATHER, 1, 1, (0, 0), EDGE, np.zeros((3, 2, 4)))) == []
    assert edge.stats["rejected:not_for_me"] == 1
    assert edge.stats["rejected:bad_shape"] == 1


def test_a_flood_of_far_future_messages_from_a_neighbour_does_not_stall_later_waves() -> None:
    data = _dataset(CONFIG, 8, seed=1)
    from meshdl.sim.mesh import MeshEngine

    model = CNN(CONFIG, seed=2)
    model.set_normalization(20.0, 3.0)
    engine = MeshEngine(data)
    mesh = engine.mesh_for(model)
    junk = encode(make(Kind.HALO, 1, 0xFFFFFFF0, (1, 3), (1, 4), np.zeros((1, 1, 4)),
                       layer=1))
    for _ in range(300):  # more than a node keeps for one neighbour
        mesh.inject(topic(1, (1, 3), (1, 4), Kind.HALO), junk)
    mesh.deliver_round()
    for step in range(3):
        loss, _, _ = engine.loss_and_grads(model, np.arange(4 * (step % 2), 4 * (step % 2) + 4))
        assert np.isfinite(loss)
    node = mesh.nodes[(1, 4)]
    assert node.stats["dropped:early_overflow"] > 0
    assert sum(len(q) for q in node.early.values()) <= 64 * len(node.neighbours)


def _one_wave_inbox(cell) -> tuple[MeshSpec, dict, list]:
    """The readings of `cell` and every message it received in one clean training wave."""
    from meshdl.sim.mesh import MeshEngine

    data = _dataset(CONFIG, 4, seed=3)
    model = CNN(CONFIG, seed=4)
    model.set_normalization(20.0, 3.0)
    mesh = MeshEngine(data).mesh_for(model)
    received = []
    node = mesh.nodes[cell]
    handle = node.handle

    def tap(message, now=0.0):
        received.append(message)
        return handle(message, now)

    node.handle = tap
    mesh.send(mesh.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4)))
    while mesh.edge.result is None:
        mesh.deliver_round()
    return mesh.spec, dict(node.readings), received


def _sent(node: NodeMachine, messages) -> list[tuple]:
    """What a node sends for `messages` in that order: (kind, layer, phase, dst, values),
    sorted (a send's sequence number depends on the order, its content must not). Each
    payload is read as it is sent and then dropped, as a receiver takes it."""
    sent = []
    for message in messages:
        sent += [(int(m.header.kind), m.header.layer, m.header.phase, m.header.dst,
                  m.payload.tobytes()) for m in node.handle(message)]
    return sorted(sent, key=lambda s: s[:4])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell=st.sampled_from([(0, 0), (0, 1), (1, 1), (2, 2), (4, 5)]), order=st.randoms())
def test_a_node_computes_the_same_whatever_order_its_messages_arrive_in(cell, order) -> None:
    # Any message may come first: a tree parent's SCATTER before the leader has pooled
    # once crashed the node host. No kernel runs before every input it reads exists.
    spec, readings, inbox = _one_wave_inbox(cell)
    own = {split: x.T for split, x in readings.items()}  # back to (samples, channels)
    shuffled = list(inbox)
    order.shuffle(shuffled)
    in_order = _sent(NodeMachine(spec, cell, own), inbox)
    assert in_order, "the wave made the node send"
    assert _sent(NodeMachine(spec, cell, own), shuffled) == in_order


def test_gradients_before_the_forward_pass_is_over_wait_and_overwrite_nothing_sent() -> None:
    """Gradients share memory with the forward values they follow (nodes/memory.py):
    in order they are written over them; come first, they wait, and since the node's
    last forward send still views that memory then, the wave gives them their own."""
    spec, readings, inbox = _one_wave_inbox((0, 1))  # pools a block, relays two
    own = {split: x.T for split, x in readings.items()}
    control = [m for m in inbox if m.header.kind in (Kind.PARAMS, Kind.BATCH)]
    gradients = (Kind.SCATTER, Kind.ROUTE, Kind.GRAD_HALO, Kind.REDUCE)
    backward = [m for m in inbox if m.header.kind in gradients]
    forward = [m for m in inbox if m not in control and m not in backward]
    assert backward and forward
    honest = NodeMachine(spec, (0, 1), own)
    in_order = _sent(honest, inbox)
    assert honest.stats["gradients_unshared"] == 0
    node = NodeMachine(spec, (0, 1), own)
    assert _sent(node, control + backward + forward) == in_order
    assert node.stats["gradients_unshared"] == 1


def _wave_gradients(spec: MeshSpec, data, chaos: Chaos | None) -> np.ndarray:
    from meshdl.sim.mesh import VirtualMesh, by_split

    model = CNN(spec.model, seed=2)
    model.set_normalization(20.0, 3.0)
    readings, labels = by_split(data)
    mesh = VirtualMesh(spec, readings, model, labels, chaos=chaos)
    mesh.send(mesh.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(3)))
    for _ in range(2000):
        if mesh.edge.result is not None:
            return mesh.edge.result.grads.copy()
        mesh.deliver_round()
    raise AssertionError("the wave did not finish")


@pytest.mark.parametrize("chaos_seed", range(48, 60))  # 52 and 54 once went wrong
def test_an_exact_wave_around_dead_cells_is_the_same_under_reordering(chaos_seed) -> None:
    """Cells no routed gradient reaches compute their dz from zeros right after their
    conv: under the memory plan that waits for the node's forward sends (once seen to
    overwrite a halo still in flight). Three conv layers, messages shuffled, delayed and
    duplicated: the same gradients as in order."""
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=6, conv_layers=3)
    dead = frozenset({(1, 5), (2, 3), (3, 0), (3, 2), (4, 1)})
    spec = MeshSpec(1, config, (0, 0)).replanned((0, 0), dead)
    data = _dataset(config, 3, seed=1)
    chaos = Chaos(seed=chaos_seed, shuffle=True, delay=0.6, max_delay=8, duplicate=0.2)
    np.testing.assert_array_equal(_wave_gradients(spec, data, chaos),
                                  _wave_gradients(spec, data, None))


def test_an_honest_wave_writes_its_gradients_over_the_forward_values() -> None:
    from meshdl.sim.mesh import MeshEngine

    model = CNN(CONFIG, seed=4)
    model.set_normalization(20.0, 3.0)
    mesh = MeshEngine(_dataset(CONFIG, 4, seed=3)).mesh_for(model)
    mesh.send(mesh.edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4)))
    while mesh.edge.result is None:
        mesh.deliver_round()
    assert sum(node.stats["gradients_unshared"] for node in mesh.nodes.values()) == 0
    relay = mesh.nodes[(0, 1)]
    assert relay.wave.buffers[relay.plan.buffers[("dpooled",)]] is \
        relay.wave.buffers[relay.plan.buffers[("pooled",)]]


def test_a_scatter_before_pooling_waits_for_the_pooled_block() -> None:
    spec, readings, inbox = _one_wave_inbox((0, 0))
    node = NodeMachine(spec, (0, 0), {split: x.T for split, x in readings.items()})
    control = [m for m in inbox if m.header.kind in (Kind.PARAMS, Kind.BATCH)]
    scatter = [m for m in inbox if m.header.kind == Kind.SCATTER]
    assert scatter and control
    for message in control + scatter:
        node.handle(message)  # the wave has begun; the pooled features do not exist yet
    assert node.stats["accepted"] == len(control) + len(scatter)
    assert not [t for t in node.wave.ready if node.plan.tasks[t][0] == "route"]


def test_rejection_counters_stay_a_closed_set_under_varied_garbage() -> None:
    # Once 300,000 messages of distinct bad shapes made 300,003 counters: one per text.
    from meshdl.errors import CodecReason
    from meshdl.sim.mesh import MeshEngine

    model = CNN(CONFIG, seed=2)
    model.set_normalization(20.0, 3.0)
    mesh = MeshEngine(_dataset(CONFIG, 4, seed=1), wire=True).mesh_for(model)
    name = topic(1, (1, 3), (1, 4), Kind.HALO)
    halo = encode(make(Kind.HALO, 1, 7, (1, 3), (1, 4), np.zeros((1, 1, 4)), layer=1))
    for k in range(1, 200):
        mesh.inject(name, halo + bytes(4 * k))  # a payload too long by k values
        mesh.inject(name, encode(make(Kind.HALO, 1 + k, 7, (1, 3), (1, 4),
                                      np.zeros((1, 1, k)), layer=1)))  # other meshes
    mesh.deliver_round()
    keys = [k for k in mesh.hosts[(1, 4)].node_stats() if k.startswith("rejected:codec:")]
    assert sorted(keys) == ["rejected:codec:other_mesh", "rejected:codec:payload_size"]
    assert {k.split(":")[-1] for k in keys} <= {r.value for r in CodecReason}


def test_waves_are_planned_so_that_every_message_fits_the_size_limit() -> None:
    from meshdl.limits import MAX_MESSAGE_BYTES
    from meshdl.protocol.messages import HEADER_BYTES, wire_size
    from meshdl.sim.mesh import MeshEngine

    seed = MeshSpec(1, ModelConfig())  # 17 x 25, pool 2: 9 x 13 blocks of 5 filters
    assert seed.values_per_sample == 9 * 13 * 5  # the GATHER into the edge
    assert seed.max_batch == (MAX_MESSAGE_BYTES - HEADER_BYTES) // 4 // 585 == 448
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=6)
    # Every message as an object to size: through the node machines.
    engine = MeshEngine(_dataset(config, 50, seed=1), max_message_bytes=1024, compiled=False)
    model = CNN(config, seed=2)
    model.set_normalization(20.0, 3.0)
    spec = engine.spec_for(model)
    assert spec.max_batch == (1024 - HEADER_BYTES) // 4 // (3 * 3 * 2) == 13
    mesh = engine.mesh_for(model)
    sizes, send = [], mesh.send
    mesh.send = lambda messages: (sizes.extend(map(wire_size, messages)), send(messages))
    np.testing.assert_allclose(engine.logits(model, "train", np.arange(50)),
                               model.forward(engine.data.X_train), rtol=1e-4, atol=1e-5)
    assert max(sizes) <= 1024 and engine.report()["waves"] == 4  # 13 + 13 + 13 + 11
    with pytest.raises(UsageError, match="at most 13 samples fit"):
        engine.loss_and_grads(model, np.arange(14))  # a step is one wave: refused


def test_a_batch_beyond_what_a_wave_can_carry_is_refused_before_any_allocation() -> None:
    node, spec = _node()
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0
    parent = spec.topology.parent[(1, 1)]
    node.handle(make(Kind.PARAMS, 1, 1, parent, (1, 1), params))
    huge = np.zeros(2 + spec.max_batch + 1, np.int32)  # mode TRAIN, split TRAIN, indices 0
    assert node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), huge)) == []
    assert node.stats["rejected:bad_batch"] == 1 and node.wave.mode is None


def test_early_messages_are_kept_only_in_a_plausible_shape_and_within_a_byte_budget() -> None:
    # Once 64 future-wave messages of 8 MB per sender were kept (a host: 95 -> 721 MB).
    # Where plans change, a shape this plan does not expect is kept too: the PARAMS of
    # its wave may bring another plan (dead cells planned around); replayed then.
    node, spec = _node()
    src = (1, 0)
    right = next(k for k in node.inbox if k[0] == Kind.HALO and k[3] == src)
    expect = node.inbox[right]
    wrong = make(Kind.HALO, 1, 9, src, (1, 1), np.zeros((expect.rows + 1, 1, 2)), layer=1)
    assert node.handle(wrong) == [] and node.stats["rejected:bad_shape"] == 1
    node.plans_change = True
    assert node.handle(wrong) == [] and node.stats["buffered_unplanned"] == 1
    far = make(Kind.HALO, 1, 9, (3, 3), (1, 1), np.zeros((1, 1, 2)), layer=1)
    assert node.handle(far) == [] and node.stats["rejected:not_a_neighbour"] == 1
    big = np.zeros((expect.rows, expect.channels, spec.max_batch), np.float32)
    for step in range(9, 9 + 40):  # far-future waves, each message as big as can be
        node.handle(make(Kind.HALO, 1, step, src, (1, 1), big, layer=right[1],
                         phase=right[2]))
    held = sum(m.payload.nbytes for m in node.early[src])
    assert held <= node.plan.early_bytes[src]
    assert node.stats["dropped:early_overflow"] > 0


def _mesh_and_reference(steps: int, compiled: bool = True):
    """A virtual mesh and the central engine on the same data and model copies."""
    from meshdl.sim.mesh import MeshEngine
    from meshdl.training.loop import CentralEngine

    data = _dataset(CONFIG, 4 * steps, seed=6)
    mesh_model, central = CNN(CONFIG, seed=7), CNN(CONFIG, seed=7)
    for model in (mesh_model, central):
        model.set_normalization(20.0, 3.0)
    engine = MeshEngine(data, compiled=compiled)
    return engine, engine.mesh_for(mesh_model), mesh_model, CentralEngine(data), central


def _assert_wave_equals_central(engine, mesh_model, reference, central, step: int) -> None:
    idx = np.arange(4 * step, 4 * step + 4)
    loss, _, grads = engine.loss_and_grads(mesh_model, idx)
    loss_c, _, grads_c = reference.loss_and_grads(central, idx)
    assert loss == pytest.approx(loss_c, rel=1e-5)
    np.testing.assert_allclose(grads, grads_c, rtol=1e-4, atol=1e-6)


def test_wave_numbers_wrap_from_the_top_of_the_u32_to_zero() -> None:
    engine, mesh, model, reference, central = _mesh_and_reference(4)
    mesh.edge.step = 0xFFFFFFFD  # the waves are numbered ...FE, ...FF, 0, 1
    for step in range(4):
        _assert_wave_equals_central(engine, model, reference, central, step)
    assert mesh.edge.step == 1


def test_a_restarted_edge_takes_the_mesh_back_below_its_predecessors_steps() -> None:
    from meshdl.edge.agent import EdgeMachine

    # The nodes' own counts say they followed the new session: the node machines.
    engine, mesh, model, reference, central = _mesh_and_reference(2, compiled=False)
    mesh.edge.step = 10_000_000  # a predecessor that ran fast
    _assert_wave_equals_central(engine, model, reference, central, 0)
    old = mesh.edge
    mesh.edge = EdgeMachine(old.spec, model, old.labels, first_step=5, session=old.session + 1)
    _assert_wave_equals_central(engine, model, reference, central, 1)
    assert sum(node.stats["resynchronised"] for node in mesh.nodes.values()) == len(mesh.nodes)


def test_a_forged_far_ahead_wave_number_reads_as_old_and_stops_nothing() -> None:
    engine, mesh, model, reference, central = _mesh_and_reference(2)
    _assert_wave_equals_central(engine, model, reference, central, 0)
    spec = mesh.spec
    params = np.zeros(spec.params_size, np.float32)
    params[-1] = 1.0
    for cell in mesh.nodes:  # PARAMS numbered 0xFFFFFFFF, in this very session
        forged = make(Kind.PARAMS, 1, 0xFFFFFFFF, spec.topology.parent[cell], cell, params,
                      session=mesh.edge.session)
        mesh.inject(topic(1, forged.header.src, cell, Kind.PARAMS), encode(forged))
    _assert_wave_equals_central(engine, model, reference, central, 1)


@pytest.mark.parametrize(("tail", "why"), [
    ([-1, -1], "a cell twice"), ([-3, -2], "decreasing"), ([-10_000], "outside the grid"),
    ([-2, 1], "an index after a failout cell"), ([], "no sample")])
def test_a_batch_with_malformed_failout_cells_is_refused(tail: list[int], why: str) -> None:
    node, spec = _node()
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0
    parent = spec.topology.parent[(1, 1)]
    node.handle(make(Kind.PARAMS, 1, 1, parent, (1, 1), params))
    head = [0, 0] if why == "no sample" else [0, 0, 1]
    batch = np.array(head + tail + ([-1] if why == "no sample" else []), np.int32)
    assert node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), batch)) == [], why
    assert node.stats["rejected:bad_batch"] == 1 and node.wave.mode is None, why


def test_failout_cells_in_an_inference_batch_are_refused_and_in_a_training_one_taken() -> None:
    node, spec = _node()
    params = np.zeros(spec.conv_size + 2, np.float32)
    params[-1] = 1.0
    parent = spec.topology.parent[(1, 1)]
    own = -(1 * spec.model.cols + 1) - 1  # this cell, (1, 1)
    node.handle(make(Kind.PARAMS, 1, 1, parent, (1, 1), params))
    infer = np.array([1, 0, 1, own], np.int32)
    assert node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), infer)) == []
    assert node.stats["rejected:bad_batch"] == 1
    train = np.array([0, 0, 1, -1, own], np.int32)
    assert node.handle(make(Kind.BATCH, 1, 1, parent, (1, 1), train))
    assert node.wave.failed_out
