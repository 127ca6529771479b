"""Lossy links under simulated time, reliable mode: the link layer retries, senders
recover what is still lost, and training gives exactly the lossless run's parameters,
at a cost in frames, time and energy that the figures show."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from meshdl import load_run_config
from meshdl.config import DataConfig
from meshdl.data.augment import training_data
from meshdl.data.lounge import generate_lounge
from meshdl.sim.radio.device import device
from meshdl.sim.radio.linklayer import send_frames
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.profiles import profile
from meshdl.sim.simulate import SimEngine
from meshdl.training.loop import train

A, B, C = (0, 0), (0, 1), (1, 0)


class Scripted(FrameLoss):
    """Loses exactly the frames a test lists, in the order they are drawn."""

    def __init__(self, fates: list[bool]) -> None:
        super().__init__(0.5)
        self.fates = iter(fates)

    def lost(self, src, dst) -> bool:
        return next(self.fates)


@pytest.mark.parametrize(("rate", "burst"), [(0.1, None), (0.3, None), (0.3, 4.0),
                                             (0.05, 10.0)])
def test_links_lose_the_share_of_frames_asked_in_bursts_of_the_length_asked(rate, burst):
    loss = FrameLoss(rate, burst, seed=7)
    fates = [loss.lost(A, B) for _ in range(1_000_000)]
    assert np.mean(fates) == pytest.approx(rate, rel=0.03)
    bursts = [len(list(run)) for lost, run in itertools.groupby(fates) if lost]
    assert np.mean(bursts) == pytest.approx(burst or 1 / (1 - rate), rel=0.03)


def test_a_lost_frame_costs_its_airtime_and_the_ack_wait_then_goes_again() -> None:
    """802.15.4, a 50-byte message (one frame of 67 bytes on air): lost once, its ACK lost
    once, then through: three tries, by hand."""
    radio = profile("802.15.4")
    out = send_frames(radio, Scripted([True, False, True, False, False]), A, (B,), 50,
                      acked=True)
    air, wait, lifs = 67 * 8 / 250_000, 864e-6, 640e-6
    ack = 192e-6 + 11 * 8 / 250_000
    assert out.frames == 3 and out.retries == 2 and out.lost == 2 and not out.missing
    assert out.received == pytest.approx(2 * (air + wait + lifs) + air + ack, rel=1e-12)
    assert out.hold == pytest.approx(out.received + lifs, rel=1e-12)
    assert out.tx[A] == pytest.approx(3 * air) and out.rx[B] == pytest.approx(2 * air)
    assert out.tx[B] == pytest.approx(2 * ack - 2 * 192e-6)  # two ACKs sent, one heard


def test_a_frame_past_the_retry_limit_is_taken_up_again_after_an_ack_timeout() -> None:
    """macMaxFrameRetries 3: four tries lost, one ACK timeout more, then the frame goes
    again (end-to-end recovery of that fragment) and gets through."""
    radio = profile("802.15.4")
    out = send_frames(radio, Scripted([True] * 4 + [False, False]), A, (B,), 50,
                      acked=True)
    air, wait, lifs = 67 * 8 / 250_000, 864e-6, 640e-6
    ack = 192e-6 + 11 * 8 / 250_000
    assert out.frames == 5 and out.retries == 3 and out.recoveries == 1 and not out.missing
    assert out.received == pytest.approx(4 * (air + wait + lifs) + wait + air + ack,
                                         rel=1e-12)


def test_a_broadcast_is_missed_by_whoever_lost_one_of_its_frames() -> None:
    radio = profile("802.15.4")  # 200 bytes: two frames, heard by B and C
    out = send_frames(radio, Scripted([False, True, False, False]), A, (B, C), 200,
                      acked=False)
    assert out.frames == 2 and out.missing == (C,) and out.retries == 0


def _train(loss: FrameLoss | None, radio: str = "802.15.4", medium: str = "shared",
           trace: bool = False):
    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8, "filters": 2},
                             train={"epochs": 2, "batch": 8, "seed": 1})
    data = generate_lounge(DataConfig(rows=4, cols=5, train=24, test=8, seed=3))
    engine = SimEngine(training_data(config.train, data), profile(radio), medium,
                       device("cortex-m4"), device("pi4"), loss=loss, trace=trace)
    model, _ = train(config, data, engine=engine)
    return model, engine.mesh


def _duplicates(mesh) -> int:
    return sum(host.node_stats()["duplicates"] for host in mesh.hosts.values()) + \
        mesh.edge.stats["duplicates"]


@pytest.mark.parametrize(("rate", "burst", "radio", "medium"), [
    (0.3, None, "802.15.4", "shared"), (0.3, 5.0, "802.15.4", "shared"),
    (0.3, None, "lora-sf7", "shared"),  # no ACK frames: acknowledged at no airtime
    (0.2, 3.0, "wifi", "star")])
def test_training_over_lossy_links_gives_the_lossless_parameters_at_a_cost(
        rate, burst, radio, medium):
    clean, lossless = _train(None, radio, medium)
    model, lossy = _train(FrameLoss(rate, burst, seed=2), radio, medium)
    assert np.array_equal(model.flat, clean.flat)
    assert _duplicates(lossy) == _duplicates(lossless) == 0  # every message once
    faults = lossy.medium.faults
    # Sent again by the link layer (802.15.4: 3 retries) or, where the profile has no
    # retries (LoRa, Wi-Fi here), recovered frame by frame.
    assert faults["frames_lost"] > 0
    assert faults["retransmitted" if radio == "802.15.4" else "frames_recovered"] > 0
    if medium == "shared":  # missed broadcasts resent to who missed them
        assert faults["messages_resent"] > 0
    assert lossy.medium.frames > lossless.medium.frames
    assert lossy.queue.now > lossless.queue.now  # the retries take time
    assert sum(lossy.medium.times.tx.values()) > sum(lossless.medium.times.tx.values())


def test_the_same_fault_seed_loses_the_same_frames() -> None:
    def trace(seed: int) -> list:
        _, mesh = _train(FrameLoss(0.2, None, seed=seed), trace=True)
        return [(s.src, s.t0, s.outcome) for s in mesh.trace]

    assert trace(5) == trace(5)
    assert trace(5) != trace(6)


def test_an_impossible_loss_is_a_usage_error() -> None:
    from meshdl.errors import UsageError

    for rate, burst in ((1.0, None), (0.95, None), (-0.1, None), (float("nan"), None),
                        (0.3, 0.5), (0.3, float("inf")), (0.3, float("nan")), (0.9, 1.0)):
        with pytest.raises(UsageError):
            FrameLoss(rate, burst)


def test_retries_and_recoveries_keep_the_air_physical() -> None:
    """Under 30 % loss, as without: overlapping transmissions share no listener and no
    radio does two things at once (retries are held on the channel like first tries)."""
    from meshdl.protocol.messages import EDGE
    from meshdl.protocol.spec import Mode, Split
    from tests.test_simulated_time import _mesh

    radio = profile("802.15.4")
    mesh = _mesh(4, 4, radio, "shared", loss=FrameLoss(0.3, None, seed=1))
    for mode in (Mode.INFER, Mode.TRAIN):
        mesh.run_wave(mode, Split.TRAIN, np.arange(2))
    assert mesh.medium.faults["retransmitted"] > 0
    topo = mesh.spec.topology

    def around(cell) -> set:
        return {EDGE, (0, 0)} if cell == EDGE else {cell, *topo.neighbours(cell)}

    def heard_by(s) -> set:
        return around(s.src) | (set() if s.broadcast else around(s.receivers[0]))

    def until(s) -> float:
        return s.t1 + (0.0 if s.broadcast else radio.turnaround_s + radio.ack_airtime)

    for a, b in itertools.combinations(mesh.trace, 2):
        if a.t0 < until(b) and b.t0 < until(a):
            assert not heard_by(a) & heard_by(b)
