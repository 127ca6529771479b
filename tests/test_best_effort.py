"""Best-effort mode: parties give up on a message at its deadline and fill it in; what
the link layer could not deliver in time stays lost; training goes on (a step without
pooled features applies no update), and nothing hangs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshdl import load_run_config
from meshdl.config import DataConfig, ModelConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.edge.agent import EdgeMachine
from meshdl.errors import StepSkipped
from meshdl.model.cnn import CNN
from meshdl.nodes.agent import NodeMachine
from meshdl.protocol.deadlines import Arrivals, Margins, Policy
from meshdl.protocol.messages import EDGE, Kind, make
from meshdl.protocol.payloads import BatchOrder
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.besteffort import BestEffort
from meshdl.sim.faults.stragglers import Stragglers
from meshdl.sim.radio.device import device
from meshdl.sim.radio.linklayer import send_frames
from meshdl.sim.radio.loss import MAX_RATE, FrameLoss
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine, sim_report
from meshdl.sim.timed import TimedMesh
from meshdl.training.loop import train
from tests.test_fault_mixes import MEDIA
from tests.test_loss import Scripted

CENTRE, LEFT = (1, 1), (1, 0)
NO_MARGIN = Margins(0.0, 0.0)


def _train(loss: FrameLoss | None, best_effort: BestEffort | None):
    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8, "filters": 2},
                             train={"epochs": 2, "batch": 8, "seed": 1})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=24, test=8, seed=3))
    engine = SimEngine(training_data(config.train, data), profile("802.15.4"), "shared",
                       device("cortex-m4"), device("pi4"), loss=loss,
                       best_effort=best_effort)
    model, history = train(config, data, engine=engine)
    return model, history, engine.mesh


# -------------------------------------------------------------- deadlines
def test_deadlines_follow_arrival_times_as_rfc_6298_smooths_them() -> None:
    """S = R, V = R / 2 from the first measure; then S += (R - S) / 8 and
    V += (|R - S| - V) / 4 (V first); the deadline is S + max(G, K V)."""
    arrivals = Arrivals(2, {0: 1.0}, set(), Margins(0.1, 0.1), k=4.0)
    assert arrivals.deadline(0) == pytest.approx(1.0 + 4 * 0.5)
    arrivals.sample(0, 3.0)
    assert arrivals.deviation[0] == pytest.approx(0.5 + (2.0 - 0.5) / 4)
    assert arrivals.smoothed[0] == pytest.approx(1.0 + 2.0 / 8)
    for _ in range(200):  # steady arrivals: the deviation dies away, the margin stays
        arrivals.sample(0, 2.0)
    assert arrivals.deadline(0) == pytest.approx(2.0 + 0.1, rel=1e-6)
    assert [d.index for d in arrivals.schedule().forward] == [0]  # 1 never measured


def _node(policy: Policy, batch: int = 4) -> tuple[MeshSpec, NodeMachine]:
    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree")
    rng = np.random.default_rng(0)
    node = NodeMachine(spec, CENTRE, {Split.TRAIN: rng.normal(size=(8, 1)).astype(np.float32)})
    # Layer 1's halos due one second into the wave, the other forward messages later.
    first = {key: 1.0 if key[0] == Kind.HALO and key[1] == 1 else 100.0
             for key, expect in node.inbox.items() if not expect.train_only}
    node.set_deadlines(policy, Mode.TRAIN, batch, first, NO_MARGIN, k=0.0)
    return spec, node


def _start(spec: MeshSpec, node: NodeMachine, step: int, now: float,
           batch: int = 4) -> None:
    parent = spec.topology.parent[CENTRE]
    params = spec.params_layout.pack(CNN(spec.model).flat, np.zeros(1), np.ones(1))
    order = BatchOrder(Mode.TRAIN, Split.TRAIN, np.arange(batch)).pack()
    for kind, payload in ((Kind.PARAMS, params), (Kind.BATCH, order)):
        node.handle(make(kind, 1, step, parent, CENTRE, payload), now)


def _halos(spec: MeshSpec, node: NodeMachine, step: int, now: float, values: float | None,
           but: tuple = ()) -> None:
    """Every layer-1 halo of the wave but `but`, each value `values` (or random)."""
    rng = np.random.default_rng(step)
    for key, expect in node.inbox.items():
        kind, layer, phase, src = key
        if kind != Kind.HALO or layer != 1 or key == but:
            continue
        shape = (expect.rows, expect.channels, node.wave.batch)
        payload = np.full(shape, values, np.float32) if values is not None else \
            rng.normal(size=shape).astype(np.float32)
        node.handle(make(kind, 1, step, src, CENTRE, payload, layer, phase), now)


MISSING = (Kind.HALO, 1, 0, LEFT)  # the left neighbour's own reading


def _slot_values(node: NodeMachine, cell) -> np.ndarray:
    plan = node.plan
    return node.wave.buffers[plan.buffers[("a", 0)]][plan.slot(("a", 0), cell)]


def test_a_halo_missing_at_its_deadline_is_filled_with_zeros_under_policy_zero() -> None:
    spec, node = _node(Policy.ZERO)
    _start(spec, node, 1, now=0.0)
    _halos(spec, node, 1, 0.5, 7.0, but=MISSING)
    assert node.next_deadline() == pytest.approx(1.0)
    assert node.tick(0.9) == [] and node.stats["filled_in"] == 0  # not yet due
    node.tick(1.0)
    assert np.all(_slot_values(node, LEFT) == 0.0)
    assert node.stats["filled_in"] == 1 and node.stats["filled_in:halo"] == 1
    assert "conv1" in node.wave.finished_at  # the window was complete: conv1 ran
    node.handle(make(Kind.HALO, 1, 1, LEFT, CENTRE, np.ones((1, 1, 4), np.float32),
                     layer=1), 1.2)
    assert node.stats["late"] == 1 and np.all(_slot_values(node, LEFT) == 0.0)


def test_policy_neighbours_fills_a_cell_with_the_mean_of_its_neighbours_at_hand() -> None:
    spec, node = _node(Policy.NEIGHBOURS)
    _start(spec, node, 1, now=0.0)
    _halos(spec, node, 1, 0.5, None, but=MISSING)
    node.tick(1.0)
    near = [(0, 0), (2, 0), (1, 1)]  # (1, 0)'s 4-neighbours in this node's window
    expected = np.mean([_slot_values(node, c) for c in near], axis=0)
    assert np.allclose(_slot_values(node, LEFT), expected)
    assert not np.allclose(expected, 0.0)


def test_policy_last_fills_a_cell_with_its_level_in_the_last_wave_that_carried_it() -> None:
    spec, node = _node(Policy.LAST)
    _start(spec, node, 1, now=0.0)
    _halos(spec, node, 1, 0.5, None)  # all came: (1, 0)'s values remembered
    before = _slot_values(node, LEFT).mean(axis=1)  # per channel, over the batch
    _start(spec, node, 2, now=10.0)
    _halos(spec, node, 2, 10.5, None, but=MISSING)
    node.tick(11.0)
    filled = _slot_values(node, LEFT)
    assert np.allclose(filled, before[:, None]) and np.ptp(filled) == 0.0


def test_the_edge_skips_a_training_step_whose_gather_missed_its_deadline() -> None:
    config = ModelConfig(rows=3, cols=3, kernel=3, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree")
    labels = {Split.TRAIN: np.zeros(8, np.int64)}
    edge = EdgeMachine(spec, CNN(config), labels)
    edge.set_deadlines(Policy.ZERO, Mode.TRAIN, 4, 2.0, 1.0, NO_MARGIN, k=0.0)
    edge.start(Mode.TRAIN, Split.TRAIN, np.arange(4), now=0.0)
    assert edge.next_deadline() == pytest.approx(2.0)
    assert edge.tick(1.5) == [] and edge.result is None
    edge.tick(2.0)
    assert edge.result is not None and edge.result.skipped
    assert edge.stats["skipped_steps"] == 1
    gathered = np.ones((len(edge.gather_blocks), 2, 4), np.float32)
    edge.handle(make(Kind.GATHER, 1, edge.step, (0, 0), EDGE, gathered), 2.5)
    assert edge.stats["late"] == 1  # and it says how late such a GATHER comes


def test_a_skipped_step_applies_no_update_and_training_goes_on() -> None:
    class SkipsFirst:
        """The virtual mesh's results, except that the first wave is lost."""

        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, 0
            self.train_samples = inner.train_samples

        def loss_and_grads(self, model, indices):
            self.calls += 1
            if self.calls == 1:
                raise StepSkipped("lost")
            return self.inner.loss_and_grads(model, indices)

        def logits(self, model, split, indices):
            return self.inner.logits(model, split, indices)

        def report(self):
            return {}

        def close(self) -> None:
            self.inner.close()

    from meshdl.training.loop import CentralEngine

    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8, "filters": 2},
                             train={"epochs": 1, "batch": 8, "seed": 1, "augment": "none"})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=24, test=8, seed=3))
    full, _ = train(config, data, engine=CentralEngine(data))
    skipping, history = train(config, data, engine=SkipsFirst(CentralEngine(data)))
    assert history.epochs[0].skipped_steps == 1
    assert not np.array_equal(skipping.flat, full.flat)
    assert np.isfinite(history.epochs[0].train_loss)


# ------------------------------------------------------------- link layer
def test_a_best_effort_frame_past_the_retry_limit_and_its_budget_is_given_up() -> None:
    radio = profile("802.15.4")  # 200 bytes: two frames; the first lost four times
    out = send_frames(radio, Scripted([True] * 4), (0, 0), ((0, 1),), 200, acked=True,
                      budget=0.0)
    assert out.missing == ((0, 1),) and out.frames == 4 and out.recoveries == 0


def test_a_frame_whose_acks_alone_were_lost_still_delivers_a_last_frame() -> None:
    radio = profile("802.15.4")  # one frame: it came each time, its ACKs did not
    out = send_frames(radio, Scripted([False, True] * 4), (0, 0), ((0, 1),), 50,
                      acked=True, budget=0.0)
    assert out.missing == () and out.frames == 4


# ------------------------------------------------------------ whole runs
def test_best_effort_without_loss_trains_exactly_as_reliable_mode() -> None:
    reliable, _, _ = _train(None, None)
    best, _, mesh = _train(None, BestEffort(Policy.NEIGHBOURS))
    assert np.array_equal(best.flat, reliable.flat)
    assert mesh.filled_in() == 0


def test_best_effort_under_loss_fills_in_counts_it_and_trains_on() -> None:
    model, history, mesh = _train(FrameLoss(0.3, None, seed=2), BestEffort(Policy.ZERO))
    faults = sim_report(mesh, Mode.TRAIN)["faults"]
    assert faults["recovery"] == "best-effort" and faults["policy"] == "zero"
    assert faults["substituted"] == mesh.filled_in() > 0
    assert faults["substituted"] == sum(faults["substituted_by_kind"].values())
    assert sum(faults["substituted_per_node"].values()) + sum(
        v for k, v in faults["substituted_by_kind"].items() if k.endswith("at the edge")) \
        == faults["substituted"]
    assert sum(w.filled_in for w in mesh.waves) == faults["substituted"]
    assert faults["messages_lost"] + faults.get("messages_expired", 0) > 0
    assert np.isfinite(model.flat).all() and len(history.epochs) == 2


def test_the_same_fault_seed_gives_the_same_best_effort_run() -> None:
    runs = [_train(FrameLoss(0.3, 3.0, seed=5), BestEffort(Policy.NEIGHBOURS))
            for _ in range(2)]
    assert np.array_equal(runs[0][0].flat, runs[1][0].flat)
    assert runs[0][2].queue.now == runs[1][2].queue.now


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 4), cols=st.integers(2, 4), medium=st.sampled_from(MEDIA),
       rate=st.floats(0.0, MAX_RATE), burst=st.one_of(st.none(), st.floats(1.0, 20.0)),
       straggling=st.floats(0.0, 1.0), slowdown=st.floats(1.0, 1000.0),
       policy=st.sampled_from(list(Policy)), seed=st.integers(0, 2**16),
       crashes=st.lists(st.tuples(st.integers(0, 15), st.floats(0.0, 30.0),
                                  st.booleans()), max_size=3))
def test_any_mix_of_faults_finishes_every_best_effort_wave(
        rows, cols, medium, rate, burst, straggling, slowdown, policy, seed, crashes):
    """Loss, bursts, stragglers, and nodes crashing at any time (for good, or back a
    little later), the edge's own included: every wave ends."""
    radio, kind = medium
    assume(burst is None or burst >= rate / (1 - rate))
    data = generate_lounge(DataConfig(rows=rows, cols=cols, train=6, test=2, seed=seed))
    kernel = 3 if max(rows, cols) >= 3 else 1
    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=2, hidden=4)
    spec = MeshSpec(1, config, (0, 0), "tree" if kind == "shared" else "broadcast")
    mesh = TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(config, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile(radio), kind, device("cortex-m4"), device("pi4"), seed=seed,
                     loss=FrameLoss(rate, burst, seed),
                     stragglers=Stragglers(fraction=straggling, slowdown=slowdown, seed=seed),
                     best_effort=BestEffort(policy))
    cells = sorted(mesh.nodes)
    for index, at, back in crashes:
        cell = cells[index % len(cells)]
        mesh.queue.at(at, mesh.kill, cell)
        if back:
            mesh.queue.at(at + 5.0, mesh.revive, cell)
    for mode in (Mode.TRAIN, Mode.INFER, Mode.TRAIN, Mode.TRAIN):
        result = mesh.run_wave(mode, Split.TRAIN, np.arange(3))  # raises if it hangs
        assert result.skipped or np.isfinite(result.logits).all()
    assert np.isfinite(mesh.queue.now)


def test_a_checkpoint_keeps_the_steps_an_epoch_skipped(tmp_path) -> None:
    from meshdl.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

    saved = Checkpoint(config={}, epochs_done=1, params=np.zeros(3, np.float32),
                       optimizer={"steps": np.zeros(1), "first_moment": np.zeros(3),
                                  "second_moment": np.zeros(3)},
                       batch_order={}, epochs=[], steps_done=4, epoch_skipped=2,
                       epoch_skipped_samples=16)
    loaded = load_checkpoint(save_checkpoint(tmp_path, saved).parent)
    assert (loaded.epoch_skipped, loaded.epoch_skipped_samples) == (2, 16)
