"""Delta halos in live inference: at epsilon 0 the same logits as whole halos, fewer
bytes when readings change slowly; malformed payloads refused; under best effort a delta
that comes after its deadline still moves what the receiver holds."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.data.datasets import Dataset
from meshdl.nodes.agent import NodeMachine
from meshdl.nodes.delta import REFRESH, DeltaReceiver, DeltaSender
from meshdl.nodes.plan import InboxKey
from meshdl.protocol.deadlines import Margins, Policy
from meshdl.protocol.messages import Kind, make
from meshdl.protocol.payloads import BatchOrder
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import MeshEngine

CONFIG = ModelConfig(rows=5, cols=6, kernel=3, filters=3, hidden=8)


def _slowly_changing(slots: int = 20, seed: int = 0) -> Dataset:
    """Maps where, slot to slot, only a few cells move (a warm spot drifting)."""
    rng = np.random.default_rng(seed)
    maps = np.repeat(rng.normal(21.0, 1.0, (1, CONFIG.rows, CONFIG.cols)), slots, axis=0)
    for t in range(1, slots):
        maps[t] = maps[t - 1]
        r, c = rng.integers(0, CONFIG.rows), rng.integers(0, CONFIG.cols)
        maps[t, r, c] += rng.normal(0.0, 2.0)
    maps = maps.astype(np.float32)
    y = np.zeros(slots, np.int64)
    return Dataset(maps, y, maps, y, {})


def _slots(delta: float | None) -> tuple[np.ndarray, int]:
    data = _slowly_changing()
    model = CNN(CONFIG, seed=1)
    model.set_normalization(21.0, 1.0)
    engine = MeshEngine(data, wire=True, delta=delta)
    logits = np.concatenate([engine.logits(model, "test", np.array([t])) for t in range(20)])
    halo = sum(c["bytes"] for name, c in engine.report()["classes"].items()
               if name.startswith("halo"))
    return logits, halo


def test_delta_halos_at_epsilon_zero_compute_exactly_what_whole_halos_do():
    full, full_bytes = _slots(None)
    delta, delta_bytes = _slots(0.0)
    assert np.array_equal(full, delta)
    assert delta_bytes < full_bytes  # one cell moves a slot: most strips go empty


def test_a_larger_epsilon_sends_fewer_halo_bytes():
    _, exact = _slots(0.0)
    _, loose = _slots(0.5)
    assert loose < exact


def test_the_sender_sends_whole_strips_first_and_every_refresh():
    sender, receiver = DeltaSender(0.0), DeltaReceiver()
    values = np.ones((8, 2, 1), np.float32)
    for wave in range(2 * REFRESH + 1):
        payload = sender.encode("k", values)
        assert (payload[0] == 0) == (wave % REFRESH == 0)  # full, else delta
        assert np.array_equal(receiver.decode("k", payload, values.shape), values)
        values = values.copy()
        values[wave % 8] += 1.0


@pytest.mark.parametrize("case", ["bad mode", "padding", "count", "index order",
                                  "no base", "nan", "short"])
def test_a_malformed_delta_payload_is_refused_and_changes_nothing(case):
    sender, receiver = DeltaSender(0.0), DeltaReceiver()
    first = np.zeros((8, 1, 1), np.float32)
    receiver.decode("k", sender.encode("k", first), first.shape)
    second = first.copy()
    second[[1, 3]] = 5.0
    payload = sender.encode("k", second).copy()
    if case == "bad mode":
        payload[0] = 7
    elif case == "padding":
        payload[2] = 1
    elif case == "count":
        payload[4] = 12
    elif case == "index order":
        payload[8:12] = [3, 0, 1, 0]
    elif case == "no base":
        receiver = DeltaReceiver()
    elif case == "nan":
        payload[-4:] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    else:
        payload = payload[:-1]
    assert receiver.decode("k", payload, first.shape) is None
    if case != "no base":
        assert np.array_equal(receiver.held["k"], first)


def test_a_strip_that_moved_everywhere_goes_whole():
    sender = DeltaSender(0.0)
    values = np.zeros((6, 1, 1), np.float32)
    sender.encode("k", values)
    payload = sender.encode("k", values + 1.0)
    assert payload[0] == 0 and payload.size == 8 + 4 * 6


def _int8_slots(delta: float | None) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """20 slots of slowly changing maps through int8-static halos, one wave a slot:
    the mesh's logits, the central int8 emulation's, and the halo bytes by layer."""
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=16, hidden=8, pool="global",
                         alive=True)
    raw = _slowly_changing()
    model = CNN(config, seed=1)
    model.set_normalization(21.0, 1.0)
    X = model.with_alive(raw.X_test[:, None])
    data = Dataset(X, raw.y_test, X, raw.y_test, {})
    model.calibrate(X)
    engine = MeshEngine(data, wire=True, delta=delta, activations="int8-static")
    logits = np.concatenate([engine.logits(model, "test", np.array([t])) for t in range(20)])
    halo = {name: c["bytes"] for name, c in engine.report()["classes"].items()
            if name.startswith("halo")}
    central = np.concatenate([model.forward(X[t:t + 1], quantized=True) for t in range(20)])
    return logits, central, halo


def test_int8_static_delta_halos_carry_codes_and_compute_the_central_int8_emulation(
        monkeypatch):
    """Before, a delta HALO carried float32 whatever the mesh's activations (as
    `FLOAT32_ROWS` below): exact too, but in 4 bytes a value where a code takes 1 or 2."""
    from meshdl.nodes import agent
    from meshdl.nodes.delta import FLOAT32_ROWS

    whole, central, whole_bytes = _int8_slots(None)
    delta, _, delta_bytes = _int8_slots(0.0)
    assert np.array_equal(whole, central)
    assert np.array_equal(delta, central)  # to the bit, every slot
    # One cell moves a slot: conv2's strips (16 bytes of codes, the recipe's 16 filters)
    # mostly go as an 8-byte head; conv1's one-cell strips (4 bytes of codes) cost more
    # with it.
    assert delta_bytes["halo/conv2"] < whole_bytes["halo/conv2"]
    monkeypatch.setattr(agent.NodeMachine, "_delta_rows", lambda *_: FLOAT32_ROWS)
    as_float, _, float_bytes = _int8_slots(0.0)
    assert np.array_equal(as_float, central)
    for name, size in delta_bytes.items():
        assert size < float_bytes[name], (name, size, float_bytes[name])


def test_a_coded_delta_row_no_node_makes_is_refused():
    from meshdl.nodes.delta import CodedRows
    from meshdl.protocol.activations import StaticCodes

    scales = np.array([0.01, 0.02], np.float32)
    readings = CodedRows(StaticCodes(1), scales, Kind.HALO, 1)  # conv1's input: int16
    sender, receiver = DeltaSender(0.0), DeltaReceiver()
    values = np.arange(8, dtype=np.float32).reshape(4, 2, 1) * scales[0]
    full = sender.encode("k", values, readings)
    assert full.size == 8 + 2 * values.size  # head, then two bytes a value
    assert np.array_equal(receiver.decode("k", full, values.shape, readings), values)
    moved = values.copy()
    moved[2] += scales[0]
    delta = sender.encode("k", moved, readings)
    assert delta[0] == 1 and delta.size == 8 + 4 + 2 * 2  # head, one index, one row
    never = np.array([-32768], "<i2").view(np.uint8)  # the one int16 no node makes
    for payload, start in ((full, 8), (delta, 12)):
        forged = payload.copy()
        forged[start:start + 2] = never
        fresh = DeltaReceiver()
        fresh.decode("k", full, values.shape, readings)
        assert fresh.decode("k", forged, values.shape, readings) is None
    # Sizes: a byte short, or read as float32 rows.
    assert receiver.decode("k", delta[:-1], values.shape, readings) is None
    assert receiver.decode("k", full, values.shape) is None


def test_a_new_scale_starts_from_a_whole_strip():
    """After a model update a layer's scale changes: a delta of rows held in the old
    one's codes would decode to other values, so the sender sends the strip whole and
    the receiver takes no delta onto the old rows."""
    from meshdl.nodes.delta import CodedRows
    from meshdl.protocol.activations import StaticCodes

    old = CodedRows(StaticCodes(1), np.array([0.01, 0.02], np.float32), Kind.HALO, 2)
    new = CodedRows(StaticCodes(1), np.array([0.01, 0.04], np.float32), Kind.HALO, 2)
    sender, receiver = DeltaSender(0.0), DeltaReceiver()
    values = np.full((4, 2, 1), 0.08, np.float32)  # 4 codes of 0.02, 2 of 0.04
    receiver.decode("k", sender.encode("k", values, old), values.shape, old)
    again = sender.encode("k", values, new)
    assert again[0] == 0  # whole, though no value moved
    assert np.array_equal(receiver.decode("k", again, values.shape, new), values)
    stale = DeltaSender(0.0)
    stale.encode("k", values, new)
    empty_delta = stale.encode("k", values, new)
    assert empty_delta[0] == 1
    fresh = DeltaReceiver()
    fresh.decode("k", sender.encode("j", values, old), values.shape, old)
    assert fresh.decode("j", empty_delta, values.shape, new) is None  # held in the old


# ------------------------------------------------ best effort: a delta that comes late
UP = (0, 1)  # its phase-1 halo to the centre carries three rows: a delta can carry one


def _best_effort_node() -> tuple[MeshSpec, NodeMachine]:
    """The centre of a 3 x 3 mesh with delta halos, giving up on layer 1's halos one
    second into an inference wave."""
    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree", delta=0.0)
    readings = np.random.default_rng(0).normal(size=(8, 1)).astype(np.float32)
    node = NodeMachine(spec, (1, 1), {Split.TEST: readings})
    first = {key: 1.0 if key[0] == Kind.HALO and key[1] == 1 else 100.0
             for key, expect in node.inbox.items() if not expect.train_only}
    node.set_deadlines(Policy.LAST, Mode.INFER, 4, first, Margins(0.0, 0.0), k=0.0)
    return spec, node


Strips = dict[InboxKey, np.ndarray]


def _infer_wave(spec: MeshSpec, node: NodeMachine, senders: dict[InboxKey, DeltaSender],
                step: int, strips: Strips, late: tuple[InboxKey, ...] = (),
                broken_first: bool = False) -> None:
    """Wave `step` (at 10 s a step): PARAMS, BATCH, then every layer-1 halo as its
    sender's delta of `strips[key]`, but the `late` ones, given after the deadline
    (`broken_first`: each after a copy cut short)."""
    now = 10.0 * step
    parent = node.spec.topology.parent[node.cell]
    params = spec.params_layout.pack(CNN(spec.model).flat, np.zeros(1), np.ones(1))
    order = BatchOrder(Mode.INFER, Split.TEST, np.arange(4)).pack()
    for kind, payload in ((Kind.PARAMS, params), (Kind.BATCH, order)):
        node.handle(make(kind, 1, step, parent, node.cell, payload), now)
    held_back = []
    for key, values in strips.items():
        payload = senders.setdefault(key, DeltaSender(0.0)).encode(key, values)
        if key in late:
            held_back.append((key, payload))
        else:
            node.handle(make(Kind.HALO, 1, step, key.src, node.cell, payload, key.layer,
                             key.phase), now + 0.5)
    node.tick(now + 1.0)  # the held-back ones are filled in
    for key, payload in held_back:
        for copy in ([payload[:-4]] if broken_first else []) + [payload]:
            node.handle(make(Kind.HALO, 1, step, key.src, node.cell, copy, key.layer,
                             key.phase), now + 1.2)


def _up_strip_of_wave_3(late: bool, broken_first: bool = False
                        ) -> tuple[NodeMachine, np.ndarray, np.ndarray]:
    """UP's strip moves a row in wave 2 (its delta given in time or `late`) and another
    in wave 3, whose delta carries that row alone: the centre's stats, the values it
    computes wave 3 on for UP's strip, and UP's values."""
    spec, node = _best_effort_node()
    keys = [key for key in node.inbox if key.kind == Kind.HALO and key.layer == 1]
    up = next(key for key in keys if key.src == UP)
    rng = np.random.default_rng(3)
    strips = {key: rng.normal(size=(node.inbox[key].rows, 1, 4)).astype(np.float32)
              for key in keys}
    senders: dict[InboxKey, DeltaSender] = {}
    _infer_wave(spec, node, senders, 1, strips)
    strips[up] = strips[up].copy()
    strips[up][0] += 5.0
    _infer_wave(spec, node, senders, 2, strips, (up,) if late else (), broken_first)
    strips[up] = strips[up].copy()
    strips[up][2] -= 5.0
    _infer_wave(spec, node, senders, 3, strips)
    expect = node.inbox[up]
    computed_on = node.wave.buffers[expect.buffer][expect.slots]
    return node, computed_on.reshape(strips[up].shape), strips[up]


@pytest.mark.parametrize("late", [False, True], ids=["in time", "late"])
def test_a_delta_halo_that_came_late_still_moves_what_the_receiver_holds(late) -> None:
    """A node that got its neighbour's delta after the deadline (filled in for that
    wave) computes the next wave on the values one that got it in time does: the
    sender's next delta is against what it sent, late or not."""
    node, computed_on, sent = _up_strip_of_wave_3(late)
    np.testing.assert_array_equal(computed_on, sent)
    assert node.stats["late"] == (1 if late else 0)
    assert node.stats["rejected:bad_delta"] == 0


def test_a_late_delta_cut_short_is_refused_and_its_good_copy_still_taken() -> None:
    node, computed_on, sent = _up_strip_of_wave_3(late=True, broken_first=True)
    np.testing.assert_array_equal(computed_on, sent)
    assert node.stats["rejected:bad_delta"] == 1
    assert node.stats["late"] == 1 and node.stats["duplicates"] == 0
