"""The cloud-heavy baseline made as lean as the mesh for live inference
(sim/studies/cloud.py, sim/studies/sendondelta.py): a compact header, the trace of a
shipped slot, send-on-delta readings and slots that ship only some cells' readings.
Counted by hand on small grids (edge at (0, 0), one input channel).

The 3 x 3 BFS tree (tests/test_cloud_baseline.py counts it too):

    edge <- (0,0) <- (0,1) <- (0,2)
              ^----- (1,0) <- (1,1) <- (1,2)
                       ^----- (2,0) <- (2,1) <- (2,2)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshdl.config import ModelConfig
from meshdl.protocol.messages import EDGE, HEADER_BYTES, ITEM_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import topic
from meshdl.protocol.topology import Cell
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import RadioProfile, profile
from meshdl.sim.studies import cloud
from meshdl.sim.studies.sendondelta import (
    INDEX_BYTES,
    piece_sizes,
    send_on_delta,
    senders_of,
)
from meshdl.sim.timed import publish_bytes

NODE = device("cortex-m4")
EDGE_DEVICE = device("pi4")
COMPACT = 6  # a compact header's bytes, as a caller would pass it
R802 = profile("802.15.4")


def _spec(rows: int, cols: int, **kwargs) -> MeshSpec:
    """A rows x cols mesh; a grid narrower than the default 3 x 3 kernel gets a 1 x 1
    one (the readings shipped do not depend on the kernel)."""
    kernel = 3 if min(rows, cols) >= 3 else 1
    return MeshSpec(1, ModelConfig(rows=rows, cols=cols, kernel=kernel), **kwargs)


def _ship(spec: MeshSpec, variant: cloud.Variant = "aggregated", samples: int = 1,
          medium: str = "shared", radio: str = "802.15.4", **kwargs) -> cloud.Shipped:
    return cloud.ship_readings(spec, profile(radio), medium, NODE, EDGE_DEVICE, samples,
                               variant, header_bytes=kwargs.pop("header_bytes", COMPACT),
                               **kwargs)


def _frames(radio: RadioProfile, size: int) -> int:
    return len(radio.frame_sizes(size))


def _on_air(radio: RadioProfile, size: int) -> float:
    return sum(radio.frame_airtime(f) for f in radio.frame_sizes(size))


# ------------------------------------------------------------------ compact header
def test_a_compact_header_on_1x2_aggregated_is_one_message_a_link() -> None:
    # (0,1) -> (0,0): 6 + 4 bytes; (0,0) -> edge: 6 + 2 x 4.
    shipped = _ship(_spec(1, 2), "aggregated")
    assert (shipped.transmissions, shipped.bytes) == (2, 10 + 14)
    assert shipped.frames == _frames(R802, 10) + _frames(R802, 14) == 2


def test_a_compact_header_on_1x2_unaggregated_relays_each_reading() -> None:
    # (0,1)'s 10 bytes to (0,0) and relayed; (0,0)'s own 10 bytes.
    shipped = _ship(_spec(1, 2), "unaggregated")
    assert (shipped.transmissions, shipped.bytes) == (3, 3 * 10)


def test_a_compact_header_on_3x3_counted_by_hand() -> None:
    # Aggregated: 9 links, 9 headers of 6 bytes and 27 cells' worth (the subtree sizes
    # 9 + 6 + 3 + 2 + 2 + 2 + 1 + 1 + 1) of 4 readings of 4 bytes.
    aggregated = _ship(_spec(3, 3), "aggregated", samples=4)
    assert (aggregated.transmissions, aggregated.bytes) == (9, 9 * 6 + 27 * 16) == (9, 486)
    # Unaggregated: 27 hops (the depths' sum), each 6 + 16 bytes.
    unaggregated = _ship(_spec(3, 3), "unaggregated", samples=4)
    assert (unaggregated.transmissions, unaggregated.bytes) == (27, 27 * 22) == (27, 594)
    assert unaggregated.frames == 27 * _frames(R802, 22)


def test_a_compact_header_over_the_star_is_one_publish_up_and_one_down_a_cell() -> None:
    spec = _spec(3, 3)
    length = len(topic(spec.mesh_id, (0, 0), EDGE, Kind.GATHER))
    # MQTT 5 PUBLISH, QoS 0: 1 + 1 fixed header, 2 + 25 topic, 1 properties, 6 + 16.
    assert publish_bytes(length, COMPACT + 16) == 1 + 1 + 2 + 25 + 1 + 22 == 52
    shipped = _ship(spec, "unaggregated", samples=4, medium="star", radio="wifi")
    assert (shipped.transmissions, shipped.bytes) == (18, 18 * 52)


def test_the_default_header_leaves_every_figure_unchanged() -> None:
    spec = _spec(3, 3)
    default = cloud.inference_slot(spec, R802, "shared", NODE, EDGE_DEVICE, 4)
    assert cloud.inference_slot(spec, R802, "shared", NODE, EDGE_DEVICE, 4,
                                header_bytes=HEADER_BYTES) == default
    assert default["bytes"] == 864  # tests/test_cloud_baseline.py's count
    compact = cloud.inference_slot(spec, R802, "shared", NODE, EDGE_DEVICE, 4,
                                   header_bytes=COMPACT)
    assert compact["bytes"] == 486
    assert compact["compute_s"] == default["compute_s"]  # the edge computes the same


def test_a_compact_header_leaves_more_room_for_values_in_a_piece() -> None:
    # Limit 1200: after 6 bytes, 298 values a piece (48 bytes left 288). (0,2)'s 300
    # values: 298 + 2; (0,1) carries 600: 298 + 298 + 4; (0,0) 900: 4 pieces.
    assert piece_sizes(1, 300, False, COMPACT, 1200) == [6 + 4 * 298, 6 + 4 * 2]
    shipped = _ship(_spec(1, 3, max_message_bytes=1200), samples=300)
    assert shipped.transmissions == 2 + 3 + 4
    assert shipped.bytes == 9 * COMPACT + ITEM_BYTES * 300 * (1 + 2 + 3)


def test_a_header_that_leaves_no_room_for_a_value_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        _ship(_spec(1, 2, max_message_bytes=1200), header_bytes=1197)
    with pytest.raises(ValueError, match=">= 0"):
        _ship(_spec(1, 2), header_bytes=-1)


# ------------------------------------------------------------------ send-on-delta
# Values exact in float32 (quarters), so that "more than EPS" is decided by hand.
SERIES = np.array([[1.0, 4.0, 0.0],
                   [1.0, 4.75, 0.25],
                   [1.25, 4.75, 0.5],
                   [1.75, 4.25, 0.75],
                   [1.5, 4.0, 0.75]], dtype=np.float32)


def test_send_on_delta_sends_what_moved_more_than_eps_from_the_last_value_sent() -> None:
    out = send_on_delta(SERIES, 0.5)
    # Slot 1: cell 1 moved 0.75. Slot 2: cell 2 is 0.5 from its last sent (0.0), not
    # more. Slot 3: cell 0 is 0.75 from 1.0, cell 1 0.5 from 4.75 (no), cell 2 0.75
    # from 0.0 (its drift adds up against the last value sent, not the last reading).
    # Slot 4: cell 1 is 0.75 from 4.75.
    assert out.sends.tolist() == [[True, True, True],
                                  [False, True, False],
                                  [False, False, False],
                                  [True, False, True],
                                  [False, True, False]]
    assert out.held.dtype == np.float32
    assert out.held.tolist() == [[1.0, 4.0, 0.0],
                                 [1.0, 4.75, 0.0],
                                 [1.0, 4.75, 0.0],
                                 [1.75, 4.75, 0.75],
                                 [1.75, 4.0, 0.75]]


def test_eps_zero_sends_every_change_and_never_an_equal_reading() -> None:
    series = np.array([[1.0, 2.0], [1.0, 2.5], [1.0, 2.5], [3.0, 2.5]], np.float32)
    out = send_on_delta(series, 0.0)
    assert out.sends.tolist() == [[True, True], [False, True], [False, False],
                                  [True, False]]
    assert np.array_equal(out.held, series)


def test_a_cell_of_several_values_sends_them_all_when_one_moves() -> None:
    series = np.array([[[0.0, 0.0]], [[0.0, 1.0]], [[0.25, 1.0]]], np.float32)  # 1 cell
    out = send_on_delta(series, 0.5)
    assert out.sends.tolist() == [[True], [True], [False]]
    assert out.held.tolist() == [[[0.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]]]


@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 5)),
                  elements=st.floats(-100, 100, width=32)),
       st.sampled_from([0.0, 0.25, 1.0, 10.0]))
def test_the_edge_never_holds_a_value_more_than_eps_from_the_reading(
        readings: np.ndarray, eps: float) -> None:
    out = send_on_delta(readings, eps)
    error = np.abs(readings.astype(np.float64) - out.held.astype(np.float64))
    assert (error <= eps).all()
    assert out.sends[0].all()
    assert np.array_equal(out.held[out.sends], readings[out.sends])  # what is sent is held


def test_send_on_delta_refuses_a_negative_eps_and_nan_readings() -> None:
    with pytest.raises(ValueError, match="eps"):
        send_on_delta(SERIES, -0.1)
    with pytest.raises(ValueError, match="finite"):
        send_on_delta(np.array([[np.nan]], np.float32), 0.0)


def test_senders_of_a_slot_are_its_cells_in_row_major_order() -> None:
    assert senders_of(np.array([False, True, False, False, False, True]), 2, 3) == \
        frozenset({(0, 1), (1, 2)})
    with pytest.raises(ValueError, match="6 cells"):
        senders_of(np.zeros(5, bool), 2, 3)


# ------------------------------------------------------------------ some senders
def _senders_by_source(shipped: cloud.Shipped) -> dict[Cell, list[int]]:
    assert shipped.trace is not None
    sizes: dict[Cell, list[int]] = {}
    for sent in shipped.trace:
        sizes.setdefault(sent.src, []).append(sent.size)
    return sizes


def test_one_far_sender_lights_its_path_alone_with_an_index_above_its_own_subtree() -> None:
    shipped = _ship(_spec(3, 3), senders=frozenset({(2, 2)}), traced=True)
    # (2,2) is its whole subtree: 6 + 4, no index. Above it each subtree has silent
    # cells: 6 + (2 + 4), the index being 2 bytes.
    assert INDEX_BYTES == 2
    assert _senders_by_source(shipped) == {(2, 2): [10], (2, 1): [12], (2, 0): [12],
                                           (1, 0): [12], (0, 0): [12]}
    assert (shipped.transmissions, shipped.bytes) == (5, 10 + 4 * 12)


def test_a_whole_subtree_sending_needs_no_index_until_it_joins_a_silent_one() -> None:
    shipped = _ship(_spec(3, 3), senders=frozenset({(0, 1), (0, 2)}), traced=True)
    # (0,2): 6 + 4; (0,1) carries its whole subtree: 6 + 8; (0,0) two of its nine
    # cells: 6 + 2 x (2 + 4).
    assert _senders_by_source(shipped) == {(0, 2): [10], (0, 1): [14], (0, 0): [18]}
    assert shipped.bytes == 42


def test_indexed_readings_above_the_limit_are_cut_at_whole_bytes() -> None:
    spec = _spec(1, 3, max_message_bytes=1200)
    shipped = _ship(spec, samples=300, senders=frozenset({(0, 2)}), traced=True)
    # (0,2) alone is its subtree: 300 values, 298 + 2. Above, one indexed cell is a
    # stream of 2 + 1200 bytes: 1194 in the first piece, 8 in the second.
    assert _senders_by_source(shipped) == {(0, 2): [1198, 14], (0, 1): [1200, 14],
                                           (0, 0): [1200, 14]}


def test_unaggregated_and_star_senders_send_their_own_readings_alone() -> None:
    senders = frozenset({(2, 2), (0, 1)})
    relayed = _ship(_spec(3, 3), "unaggregated", senders=senders)
    assert (relayed.transmissions, relayed.bytes) == (5 + 2, 7 * 10)  # their depths
    star = _ship(_spec(3, 3), "unaggregated", medium="star", radio="wifi", senders=senders)
    assert star.transmissions == 2 * 2


def test_all_cells_named_ship_as_no_senders_named() -> None:
    spec = _spec(3, 3)
    everyone = frozenset(spec.topology.cells())
    for variant in ("aggregated", "unaggregated"):
        assert _ship(spec, variant, samples=4, senders=everyone) == \
            _ship(spec, variant, samples=4)


def test_a_slot_without_senders_is_silent_and_the_edge_still_computes() -> None:
    spec = _spec(3, 3)
    shipped = _ship(spec, senders=frozenset(), traced=True)
    assert (shipped.transmissions, shipped.bytes, shipped.trace) == (0, 0, [])
    assert shipped.makespan_s == 0.0
    slot = cloud.inference_slot(spec, R802, "shared", NODE, EDGE_DEVICE, 1,
                                header_bytes=COMPACT, senders=frozenset())
    assert slot["bytes"] == 0
    assert slot["compute_s"] > 0 and slot["makespan_s"] == slot["compute_s"]


def test_senders_outside_the_grid_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        _ship(_spec(3, 3), senders=frozenset({(3, 0)}))


# ------------------------------------------------------------------ the trace
def test_the_traces_tx_seconds_on_1x2_are_its_frames_airtimes_by_hand() -> None:
    """40 readings a cell: (0,1) sends 6 + 160 bytes, (0,0) 6 + 320, each more than one
    802.15.4 frame; each receiver acknowledges every frame."""
    shipped = _ship(_spec(1, 2), samples=40, traced=True)
    assert shipped.trace is not None
    assert [(s.src, s.receivers, s.size, s.frames) for s in shipped.trace] == [
        ((0, 1), ((0, 0),), 166, _frames(R802, 166)),
        ((0, 0), (EDGE,), 326, _frames(R802, 326))]
    assert _frames(R802, 166) == 2 and _frames(R802, 326) == 3
    ack = R802.ack_airtime
    far, near = _on_air(R802, 166), _on_air(R802, 326)
    # From the trace alone: a sender's frames, and an ACK for each frame it receives.
    by_trace: dict[Cell, float] = {}
    for sent in shipped.trace:
        by_trace[sent.src] = by_trace.get(sent.src, 0.0) + _on_air(R802, sent.size)
        (receiver,) = sent.receivers
        by_trace[receiver] = by_trace.get(receiver, 0.0) + sent.frames * ack
    expected_tx = {(0, 1): far, (0, 0): near + 2 * ack, EDGE: 3 * ack}
    assert by_trace == pytest.approx(expected_tx, rel=1e-12)
    assert dict(shipped.times.tx) == pytest.approx(expected_tx, rel=1e-12)
    assert dict(shipped.times.rx) == pytest.approx(
        {(0, 1): 2 * ack, (0, 0): far + 3 * ack, EDGE: near}, rel=1e-12)
    for sent in shipped.trace:  # on air at least its frames' airtime
        assert sent.t1 - sent.t0 >= _on_air(R802, sent.size)


def test_a_slot_is_traced_only_when_asked() -> None:
    assert _ship(_spec(1, 2)).trace is None


@pytest.mark.parametrize(("variant", "medium", "radio"), [
    ("aggregated", "shared", "802.15.4"), ("unaggregated", "shared", "ble"),
    ("unaggregated", "star", "wifi")])
def test_the_compiled_medium_ships_exactly_as_the_python_one(variant, medium,
                                                             radio) -> None:
    spec = _spec(4, 5)
    senders = frozenset({(3, 4), (1, 2), (0, 3), (2, 0)})
    for chosen in (None, senders):
        compiled = _ship(spec, variant, 4, medium, radio, senders=chosen, traced=True,
                         seed=5)
        python = _ship(spec, variant, 4, medium, radio, senders=chosen, traced=True,
                       seed=5, compiled=False)
        assert compiled == python  # figures, radio seconds and the trace, to the bit
        assert compiled.trace is not None and len(compiled.trace) == compiled.transmissions


def test_slot_record_of_a_traced_slot_is_the_inference_slot() -> None:
    spec = _spec(3, 3)
    senders = frozenset({(1, 1), (2, 2)})
    shipped = _ship(spec, samples=2, senders=senders, traced=True)
    assert cloud.slot_record(shipped, spec, EDGE_DEVICE, 2) == cloud.inference_slot(
        spec, R802, "shared", NODE, EDGE_DEVICE, 2, header_bytes=COMPACT, senders=senders)
