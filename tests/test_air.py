"""The compiled event heap and contention (sim/radio/air.py) run the same events in the same
order as the Python `EventQueue` and `Medium`: the same trace, receipts, clock, event
count and figures, on every medium, however little room its regions start with."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.config import DataConfig, ModelConfig
from meshdl.data.lounge import generate_lounge
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN
from meshdl.protocol.messages import Kind
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.clock import EventQueue
from meshdl.sim.radio.device import device
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.media import SharedRadio, Transmission
from meshdl.sim.radio.profiles import profile
from meshdl.sim.timed import TimedMesh


def _mesh(radio: str, medium: str, compiled: bool, seed: int = 0,
          loss: FrameLoss | None = None) -> TimedMesh:
    data = generate_lounge(DataConfig(rows=4, cols=5, train=16, test=4, seed=1))
    config = ModelConfig(rows=4, cols=5, kernel=3, filters=2, hidden=8)
    spec = MeshSpec(1, config, (0, 0), "tree" if medium == "shared" else "broadcast")
    return TimedMesh(spec, {Split.TRAIN: data.X_train, Split.TEST: data.X_test},
                     CNN(config, seed=0), {Split.TRAIN: data.y_train, Split.TEST: data.y_test},
                     profile(radio), medium, device("cortex-m4"), device("pi4"), seed=seed,
                     trace=True, loss=loss, compiled=compiled)


def _run(mesh: TimedMesh) -> dict:
    """Three training waves and an inference wave, and everything they leave."""
    for _ in range(3):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(2))
    usage = {mode: (u.seconds, u.tx, u.rx, u.by_kind, u.transmissions, u.cpu)
             for mode, u in mesh.usage.items()}
    return {"trace": mesh.trace, "receipts": mesh.receipts, "now": mesh.queue.now,
            "events": mesh.queue.events, "usage": usage, "frames": mesh.medium.frames,
            "params": mesh.edge.model.flat.tobytes()}


# 802.15.4 draws backoffs (on the radio mesh, and on the star, where a busy sender takes
# its turn); the others have no backoff unit; LoRa waits out its duty cycle.
@pytest.mark.parametrize(("radio", "medium"), [("802.15.4", "shared"), ("802.15.4", "star"),
                                               ("ble", "shared"), ("wifi", "star"),
                                               ("lora-sf7", "shared")])
def test_the_compiled_medium_gives_the_python_mediums_run_event_for_event(radio, medium):
    python, compiled = _mesh(radio, medium, False), _mesh(radio, medium, True)
    assert type(python.queue) is EventQueue and type(compiled.queue) is AirQueue
    expected, got = _run(python), _run(compiled)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == expected[key], key  # floats to the bit, dicts in their order


def test_regions_that_start_with_no_room_grow_without_changing_the_run(monkeypatch):
    expected = _run(_mesh("802.15.4", "shared", True))
    monkeypatch.setattr("meshdl.sim.timed.AirQueue",
                        lambda: AirQueue(room=1, draws=2))
    cramped = _mesh("802.15.4", "shared", True)
    assert cramped.queue._layout.capacity(0) < 4  # it really starts cramped
    assert _run(cramped) == expected


def test_the_seed_still_decides_the_trace() -> None:
    def trace(seed: int) -> list:
        return _run(_mesh("802.15.4", "shared", True, seed=seed))["trace"]

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_what_only_the_python_medium_does_is_refused_on_the_compiled_one() -> None:
    mesh = _mesh("802.15.4", "shared", True)
    with pytest.raises(UsageError, match="Python medium"):
        mesh.medium.pair_backoffs()
    with pytest.raises(UsageError, match="Python medium"):
        mesh.medium.rng = random.Random(1)
    mesh.medium.down.add((1, 1))
    with pytest.raises(UsageError, match="Python medium"):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
    with pytest.raises(UsageError, match="Python medium"):
        mesh.kill((1, 1))
    with pytest.raises(UsageError, match="Python medium"):
        mesh.medium.loss = FrameLoss(rate=0.1, seed=1)
    lossy = _mesh("802.15.4", "shared", True, loss=FrameLoss(rate=0.1, seed=1))
    assert type(lossy.queue) is EventQueue  # lossy links stay in Python


# ------------------------------------------------------------------ a medium alone
def _line(queue: EventQueue) -> SharedRadio:
    """Three radios in a line, a - b - c: a and c each hear only b."""
    return SharedRadio({"a": ["b"], "b": ["a", "c"], "c": ["b"]}, profile("802.15.4"),
                       queue, 7, lambda party, what: None, trace=[])


def _send_three(medium: SharedRadio) -> None:
    for src, dst in (("a", "b"), ("c", "b"), ("b", "a")):
        medium.send(Transmission(src, (dst,), Kind.HALO, 1, 300, [(dst, src)]), 0.0)


def test_run_until_stops_right_after_the_event_that_made_it_true_a_cca_too() -> None:
    runs = []
    for queue in (EventQueue(), AirQueue()):
        medium = _line(queue)
        _send_three(medium)
        assert queue.run_until(lambda m=medium: len(m.trace) >= 1, 100)
        runs.append((queue.now, queue.events, list(medium.trace)))
        assert queue.run(100) and not queue
        runs.append((queue.now, queue.events, list(medium.trace),
                     dict(medium.times.tx), medium.transmissions))
    assert runs[2:] == runs[:2] and runs[0][1] < 4


def test_a_transmission_ready_before_now_is_refused() -> None:
    queue = AirQueue()
    medium = _line(queue)
    queue.advance_to(5.0)
    with pytest.raises(ValueError, match="before now"):
        medium.send(Transmission("a", ("b",), Kind.HALO, 1, 30, [("b", None)]), 1.0)


# ------------------------------------------------------------------ the clock alone
Schedule = list[tuple[float, list[float]]]  # each event: its time, its children's delays


def _order(queue: EventQueue, schedule: Schedule, through: float, limit: int
           ) -> tuple[list, bool, float, int, bool]:
    """Run `schedule` on `queue`: up to `through`, then to the end within `limit`."""
    seen: list[tuple[float, int]] = []

    def event(item: tuple[int, list[float]]) -> None:
        number, children = item
        seen.append((queue.now, number))
        for k, delay in enumerate(children):
            queue.at(queue.now + delay, event, (1000 * (number + 1) + k, []))

    for number, (time, children) in enumerate(schedule):
        queue.at(time, event, (number, children))
    queue.run_through(through)
    halfway = len(seen)
    finished = queue.run(limit)
    return seen, finished, queue.now, queue.events, halfway > 0 or not schedule


times = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.5, 3.0])  # ties on purpose
schedules = st.lists(st.tuples(times, st.lists(st.sampled_from([0.0, 0.25, 1.0]),
                                               max_size=3)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(schedule=schedules, through=times, limit=st.integers(0, 40))
def test_an_air_queue_runs_python_events_in_the_event_queues_order(schedule, through,
                                                                   limit):
    expected = _order(EventQueue(), schedule, through, limit)
    assert _order(AirQueue(room=1), schedule, through, limit) == expected


def test_an_air_queue_refuses_the_past_as_the_event_queue_does() -> None:
    queue = AirQueue()
    queue.at(1.0, lambda _: None)
    queue.run(10)
    with pytest.raises(ValueError, match="before now"):
        queue.at(0.5, lambda _: None)
    queue.at(2.0, lambda _: None)
    with pytest.raises(ValueError, match="events pending"):
        queue.advance_to(3.0)
    assert queue.run_until(lambda: queue.now >= 2.0, 10) and queue.now == 2.0
    queue.advance_to(3.0)
    assert queue.now == 3.0 and not queue
