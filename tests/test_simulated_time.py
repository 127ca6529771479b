"""Simulated time: the clock changes when things happen, never what is computed; the
trace obeys the physics of its medium; energy is the trace's state times times power;
and a small wave's duration is what a hand calculation says."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig, ModelConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.model.cnn import CNN
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import MeshEngine
from meshdl.sim.radio.device import DeviceProfile, device
from meshdl.sim.radio.energy import state_energy
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.media import BROKER
from meshdl.sim.radio.profiles import RadioProfile, profile
from meshdl.sim.radio.trace import Sent
from meshdl.sim.simulate import SimEngine
from meshdl.sim.timed import TimedMesh
from meshdl.training.loop import train

FREE_CPU = DeviceProfile(name="free", flops_per_s=1e30, per_message_s=0.0, cpu_w=0.0,
                         idle_w=0.0, source="a test: computing takes no time")


def _mesh(rows: int, cols: int, radio: RadioProfile, medium: str, kernel: int = 3,
          filters: int = 2, node: DeviceProfile | None = None, seed: int = 0,
          loss: FrameLoss | None = None) -> TimedMesh:
    data = generate_lounge(DataConfig(rows=rows, cols=cols, train=16, test=4, seed=1))
    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=filters, hidden=8)
    spec = MeshSpec(1, config, (0, 0), "tree" if medium == "shared" else "broadcast")
    return TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(config, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     radio, medium, node or device("pi-zero-2w"), device("pi4"), seed=seed,
                     trace=True, loss=loss)


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize(("radio", "medium", "pool", "failout"),
                         [("802.15.4", "shared", 2, 0.0), ("wifi", "star", 2, 0.0),
                          ("ble", "shared", 2, 0.0), ("802.15.4", "shared", "global", 0.2),
                          ("wifi", "star", "global", 0.0)])
def test_training_under_simulated_time_gives_the_virtual_mesh_parameters(radio, medium, pool,
                                                                         failout):
    config = load_run_config(model={"rows": 5, "cols": 6, "hidden": 16, "filters": 3,
                                    "pool": pool},
                             train={"epochs": 2, "batch": 16, "seed": 4, "failout": failout})
    data = generate_lounge(DataConfig(rows=5, cols=6, train=48, test=16, seed=2))
    view = training_data(config.train, data, config.model)
    virtual, _ = train(config, data, engine=MeshEngine(view))
    engine = SimEngine(view, profile(radio), medium, device("pi-zero-2w"), device("pi4"),
                       params_via="tree")
    timed, history = train(config, data, engine=engine)
    assert np.array_equal(timed.flat, virtual.flat)
    assert engine.mesh is not None and engine.mesh.queue.now > 0
    assert history.comm["total_bytes"] > 0


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    def trace(seed: int) -> list[Sent]:
        mesh = _mesh(4, 4, profile("802.15.4"), "shared", seed=seed)
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
        return mesh.trace

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)  # the backoffs differ


# ------------------------------------------------------------------ physics
def _receivers_busy(trace: list[Sent]) -> dict:
    """Per party, the intervals in which its radio transmits or receives."""
    busy = defaultdict(list)
    for s in trace:
        busy[s.src].append((s.t0, s.t1, "tx"))
        for receiver in s.receivers:
            busy[receiver].append((s.t0, s.t1, "rx"))
    return busy


MEDIA = [(3, 3, "802.15.4", "shared", 3), (4, 5, "ble", "shared", 2),
         (4, 4, "lora-sf7", "shared", 3), (3, 4, "wifi", "star", 3),
         (1, 6, "802.15.4", "shared", 1)]  # a line: two unicasts at its ends may overlap


@pytest.mark.parametrize(("rows", "cols", "radio", "medium", "kernel"), MEDIA)
def test_the_trace_obeys_the_physics_of_its_medium(rows, cols, radio, medium, kernel):
    mesh = _mesh(rows, cols, profile(radio), medium, kernel)
    for mode in (Mode.INFER, Mode.TRAIN):
        mesh.run_wave(mode, Split.TRAIN, np.arange(2))
    trace, r = mesh.trace, mesh.radio
    assert len(trace) > 20
    # Half-duplex, one frame at a time: a radio never does two things at once.
    for intervals in _receivers_busy(trace).values():
        intervals.sort()
        for (_, end, _), (start, _, _) in itertools.pairwise(intervals):
            assert start >= end - 1e-12
    # The medium: on the star nothing overlaps; on the radio, overlapping transmissions
    # are heard by different nodes: the sender's neighbourhood, and for an acknowledged
    # unicast the receiver's too (its ACKs), worked out here from the grid alone.
    topo = mesh.spec.topology

    def heard_by(s: Sent) -> set:
        around = {s.src, *topo.neighbours(s.src)} if s.src != EDGE else {EDGE, (0, 0)}
        if not s.broadcast and r.ack_frame_bytes:
            dst = s.receivers[0]
            around |= {dst, *topo.neighbours(dst)} if dst != EDGE else {EDGE, (0, 0)}
        return around

    def until(s: Sent) -> float:  # the last bit, or the end of the last frame's ACK
        acked = not s.broadcast and r.ack_frame_bytes
        return s.t1 + (r.turnaround_s + r.ack_airtime if acked else 0.0)

    for a, b in itertools.combinations(trace, 2):
        if a.t0 < until(b) and b.t0 < until(a):
            assert medium == "shared"
            assert not heard_by(a) & heard_by(b)
    # Each transmission lasts what its frames do: every frame's slot but the last
    # one's ACK and space, from the profile's own formulas.
    for s in trace:
        frames = r.frame_sizes(s.size)
        acked = not s.broadcast
        expected = sum(r.frame_time_s(f, acked) for f in frames[:-1]) + \
            r.frame_airtime(frames[-1])
        assert s.t1 - s.t0 == pytest.approx(expected, rel=1e-9)
        assert s.frames == len(frames)
    # Every receipt follows its send, by at least the hop latency.
    for at, party, header in mesh.receipts:
        sender = BROKER if medium == "star" and party != BROKER else header.src
        sends = [s for s in trace if s.src == sender and party in s.receivers
                 and s.kind == header.kind and s.layer == header.layer]
        assert any(s.t1 + r.hop_latency_s <= at + 1e-12 for s in sends)


@pytest.mark.parametrize(("rows", "cols", "radio", "medium", "kernel"), MEDIA)
def test_each_nodes_energy_is_its_state_times_from_the_trace_times_power(
        rows, cols, radio, medium, kernel):
    mesh = _mesh(rows, cols, profile(radio), medium, kernel)
    for mode in (Mode.TRAIN, Mode.TRAIN):
        mesh.run_wave(mode, Split.TRAIN, np.arange(3))
    r = mesh.radio
    tx, rx = defaultdict(float), defaultdict(float)
    for s in mesh.trace:
        frames = r.frame_sizes(s.size)
        air = sum(r.frame_airtime(f) for f in frames)
        tx[s.src] += air
        for receiver in s.receivers:
            rx[receiver] += air
        if not s.broadcast and r.ack_frame_bytes:  # the receiver acknowledges each frame
            tx[s.receivers[0]] += r.ack_airtime * len(frames)
            rx[s.src] += r.ack_airtime * len(frames)
    usage = mesh.usage[Mode.TRAIN]
    assert usage.seconds == pytest.approx(mesh.waves[-1].end)
    for party in [*mesh.hosts, EDGE]:
        computer = mesh.edge_device if party == EDGE else mesh.device
        parts = state_energy(r, computer, usage.tx.get(party, 0.0), usage.rx.get(party, 0.0),
                             usage.cpu.get(party, 0.0), usage.seconds)
        assert parts["tx"] == pytest.approx(tx[party] * r.tx_w, rel=1e-9, abs=1e-15)
        assert parts["rx"] == pytest.approx(rx[party] * r.rx_w, rel=1e-9, abs=1e-15)
        listen = usage.seconds - tx[party] - rx[party]
        assert parts["listen"] == pytest.approx(listen * r.idle_w, rel=1e-9)
        cpu = mesh.cpus[party].seconds
        assert parts["cpu"] == pytest.approx(cpu * computer.cpu_w, rel=1e-9, abs=1e-15)
        assert parts["total"] == pytest.approx(
            parts["tx"] + parts["rx"] + parts["listen"] + parts["cpu"]
            + (usage.seconds - cpu) * computer.idle_w, rel=1e-12)
        assert cpu > 0
        quiet = usage.seconds - tx[party] - rx[party]
        assert parts["ideal_mac"] == pytest.approx(
            parts["total"] - parts["listen"] + quiet * r.sleep_w, rel=1e-12)


def test_a_nodes_cpu_time_is_its_kernels_operations_at_the_device_rate() -> None:
    slow = DeviceProfile(name="slow", flops_per_s=1e6, per_message_s=1e-3, cpu_w=1.0,
                         idle_w=0.0, source="a test")
    mesh = _mesh(3, 3, profile("802.15.4"), "shared", node=slow)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(2))
    for cell, host in mesh.hosts.items():
        handled = sum(1 for _, party, _ in mesh.receipts if party == cell)
        expected = slow.cpu_s(host.nodes[cell].flops, handled)
        assert mesh.cpus[cell].seconds == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------ hand calculation
def test_a_3x3_inference_wave_takes_what_a_hand_calculation_says() -> None:
    """3 x 3 cells, k 3, one filter, batch 1, IEEE 802.15.4, the edge at r0c0, computing
    free, no random backoff, and a fixed latency of L = 1 s per hop (long beside a
    frame, so that waiting for the channel, which a hand calculation cannot follow,
    stays far below 1 %).

    The wave's critical chain, hop by hop:
    - PARAMS and BATCH down the tree to the far corner r2c2, at depth 5
      (edge -> r0c0 -> ... -> r2c2): 5 hops; each sender sends PARAMS (136 B: 2
      frames) then BATCH (60 B: 1 frame);
    - r2c2's reading to the centre r1c1 in the two-phase halo (r2c2 -> r2c1 or r1c2 ->
      r1c1): 2 hops, then r1c1's conv1 output back to r2c2: 2 hops (HALO of 52 to
      60 B: 1 frame each);
    - r2c2 leads its own pooling block: GATHER of its block up the tree to the edge:
      5 hops (52 to 64 B: 1 frame each).
    14 hops: 14 L, plus the frames on air along the chain.
    """
    radio = profile("802.15.4").model_copy(update={"backoff_unit_s": 0.0, "cca_s": 0.0,
                                                   "hop_latency_s": 1.0})
    mesh = _mesh(3, 3, radio, "shared", kernel=3, filters=1, node=FREE_CPU)
    mesh.edge_device = FREE_CPU
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(1))

    frame = 133  # a full 802.15.4 frame on air: 127 B PSDU + 6 B PHY header
    bit = 1 / 250_000
    full_slot = 8 * frame * bit + 192e-6 + 11 * 8 * bit + 640e-6  # frame, turnaround, ACK, LIFS
    params = full_slot + 8 * (17 + 136 - 116) * bit + 192e-6 + 88 * bit + 640e-6  # 2 frames
    batch_last_bit = 8 * (17 + 60) * bit  # BATCH's one frame, on air
    small = 8 * (17 + 56) * bit  # a HALO or GATHER frame of about 56 B, on air
    hand = 14 * 1.0 + 5 * (params + batch_last_bit) + 4 * small + 5 * small
    assert mesh.waves[-1].end == pytest.approx(hand, rel=0.01)
    assert mesh.waves[-1].end > hand  # the rest is waiting for the channel


def test_one_hop_and_back_takes_exactly_its_frames_acks_spaces_and_latencies() -> None:
    """A 1 x 1 mesh (k 1, one filter, batch 1) on 802.15.4, computing free, no random
    backoff, a 2 ms hop latency: nothing contends, so the inference wave is, exactly,
    PARAMS and then BATCH from the edge to r0c0 (each: CCA 128 us, turnaround 192 us, its
    frames with their ACKs and spaces, delivered after the last ACK), 2 ms, then r0c0's
    GATHER back (the same), 2 ms."""
    radio = profile("802.15.4").model_copy(update={"backoff_unit_s": 0.0,
                                                   "hop_latency_s": 2e-3})
    mesh = _mesh(1, 1, radio, "shared", kernel=1, filters=1, node=FREE_CPU)
    mesh.edge_device = FREE_CPU
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(1))
    sizes = {s.kind: s.size for s in mesh.trace}
    assert [s.kind for s in mesh.trace] == [Kind.PARAMS, Kind.BATCH, Kind.GATHER]
    bit, access, ack = 1 / 250_000, 128e-6 + 192e-6, 192e-6 + 11 * 8 / 250_000

    def frames(size: int) -> list[int]:  # bytes on air of each frame: 17 + up to 116
        return [17 + min(116, size - i) for i in range(0, max(size, 1), 116)]

    def space(frame: int) -> float:  # SIFS after a frame of at most 24 B, else LIFS
        return 192e-6 if frame <= 24 else 640e-6

    def received(size: int) -> float:  # from the CCA to the end of the last ACK
        f = frames(size)
        return access + sum(8 * n * bit + ack + space(n) for n in f[:-1]) + \
            8 * f[-1] * bit + ack

    def held(size: int) -> float:  # the radio is free again after the last space
        return received(size) + space(frames(size)[-1])

    params, batch, gather = sizes[Kind.PARAMS], sizes[Kind.BATCH], sizes[Kind.GATHER]
    hand = held(params) + received(batch) + 2e-3 + received(gather) + 2e-3
    assert mesh.waves[-1].end == pytest.approx(hand, rel=1e-12)


def test_each_modes_usage_holds_its_own_waves_transmissions_and_they_add_up() -> None:
    """Training and evaluation waves interleaved: each mode's account holds exactly the
    transmissions of its own waves (found from the trace by time), and the accounts add
    up to the medium's totals."""
    mesh = _mesh(3, 4, profile("802.15.4"), "shared")
    for mode in (Mode.INFER, Mode.TRAIN, Mode.INFER, Mode.TRAIN):
        mesh.run_wave(mode, Split.TRAIN, np.arange(2))
    for mode in (Mode.INFER, Mode.TRAIN):
        windows = [(w.start, w.end) for w in mesh.waves if w.mode == mode]
        mine = [s for s in mesh.trace if any(a <= s.t0 < b for a, b in windows)]
        usage = mesh.usage[mode]
        assert usage.waves == 2 and usage.transmissions == len(mine)
        assert sum(f.bytes for f in usage.by_kind.values()) == sum(s.size for s in mine)
        assert usage.seconds == pytest.approx(sum(b - a for a, b in windows))
    accounts = [mesh.usage[m] for m in (Mode.INFER, Mode.TRAIN)]
    assert sum(u.transmissions for u in accounts) == mesh.medium.transmissions
    for party, seconds in mesh.medium.times.tx.items():
        assert sum(u.tx.get(party, 0.0) for u in accounts) == pytest.approx(seconds)
    by_kind = mesh.medium.by_kind
    for key, figures in by_kind.items():
        assert sum(u.by_kind.get(key, (0, 0))[0] for u in accounts) == figures.bytes
