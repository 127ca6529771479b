"""Radio profiles (sim/radio/profiles.py): airtime and channel time against the published formulas,
fragmentation, duty cycle, TOML profiles and `meshdl radio list`."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from meshdl.errors import UsageError
from meshdl.protocol.messages import Kind
from meshdl.sim.radio.clock import EventQueue
from meshdl.sim.radio.media import BROKER, MqttStar, SharedRadio, Transmission
from meshdl.sim.radio.profiles import (
    RadioProfile,
    builtin_profiles,
    load_profiles,
    profile,
    profiles,
)
from tests.helpers import assert_one_line_error

BUILTINS = ("802.15.4", "ble", "wifi", "lora-sf7")
REQUIRED_KEYS = {"name", "bitrate_bps", "max_frame_bytes", "frame_overhead_bytes", "tx_w",
                 "rx_w", "idle_w", "sleep_w", "duty_cycle", "source"}

# A user profile: an 802.15.4 radio with another transceiver's currents.
USER_TOML = """
[[radio]]
name = "802.15.4"
bitrate_bps = 250000
max_frame_bytes = 133
frame_overhead_bytes = 17
tx_w = 0.0243
rx_w = 0.0216
idle_w = 0.0216
sleep_w = 1e-6
source = "a test's figures"

[[radio]]
name = "lora-sf9"
modulation = "lora"
spreading_factor = 9
bandwidth_hz = 125000
max_frame_bytes = 255
frame_overhead_bytes = 4
tx_w = 0.0957
rx_w = 0.03795
idle_w = 0.03795
sleep_w = 0.66e-6
duty_cycle = 0.01
source = "a test's figures"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "radios.toml"
    path.write_text(text)
    return path


# -- airtime and channel time ----------------------------------------------------------

def test_a_full_802_15_4_frame_of_133_bytes_lasts_4_256_ms() -> None:
    radio = profile("802.15.4")
    assert radio.payload_per_frame == 116
    assert radio.frame_airtime(radio.max_frame_bytes) == pytest.approx(4.256e-3, rel=1e-12)
    assert radio.ack_airtime == pytest.approx(11 * 8 / 250e3, rel=1e-12)  # 352 us


def test_an_802_15_4_transmission_is_airtime_turnaround_ack_and_lifs_for_every_frame() -> None:
    radio = profile("802.15.4")
    byte_s, turnaround, ack, lifs = 8 / 250e3, 192e-6, 11 * 8 / 250e3, 640e-6
    per_frame = turnaround + ack + lifs
    # 100 B: one frame of 17 + 100 bytes.
    assert radio.transmission_s(100) == pytest.approx(117 * byte_s + per_frame, rel=1e-12)
    # 200 B: a full frame (116 B of payload) and one of 17 + 84 bytes.
    assert radio.transmission_s(200) == pytest.approx(
        133 * byte_s + per_frame + 101 * byte_s + per_frame, rel=1e-12)
    # 1000 B: 8 full frames (928 B) and one of 17 + 72 bytes.
    assert radio.transmission_s(1000) == pytest.approx(
        8 * (133 * byte_s + per_frame) + 89 * byte_s + per_frame, rel=1e-12)
    assert radio.transmission_s(1000) == pytest.approx(47.552e-3, rel=1e-12)


def test_a_broadcast_has_no_acknowledgements() -> None:
    radio = profile("802.15.4")
    assert radio.broadcast_s(200) == pytest.approx((133 + 101) * 8 / 250e3 + 2 * 640e-6,
                                                   rel=1e-12)


def test_a_short_802_15_4_frame_is_followed_by_sifs_not_lifs() -> None:
    radio = profile("802.15.4")
    # An empty message: 17 bytes on air, an 11-byte MPDU <= aMaxSIFSFrameSize (18).
    assert radio.transmission_s(0) == pytest.approx(
        17 * 8 / 250e3 + 192e-6 + 11 * 8 / 250e3 + 192e-6, rel=1e-12)
    assert radio.ifs_after(24) == 192e-6 and radio.ifs_after(25) == 640e-6


def test_a_ble_frame_is_acknowledged_by_the_peers_empty_pdu_after_t_ifs() -> None:
    radio = profile("ble")
    assert radio.frame_airtime(radio.max_frame_bytes) == pytest.approx(2.088e-3, rel=1e-12)
    assert radio.ack_airtime == pytest.approx(80e-6, rel=1e-12)
    assert radio.transmission_s(247) == pytest.approx(2088e-6 + 150e-6 + 80e-6 + 150e-6,
                                                      rel=1e-12)
    assert math.isinf(radio.retry_limit)


@pytest.mark.parametrize(("payload", "ms"), [(20, 56.6), (51, 102.7), (127, 210.2),
                                             (222, 348.4)])
def test_lora_sf7_airtime_equals_semtech_an1200_13(payload: int, ms: float) -> None:
    radio = profile("lora-sf7")
    assert radio.symbol_s == pytest.approx(1.024e-3, rel=1e-12)
    # Here the PL of the formula is the whole PHY payload.
    assert round(radio.frame_airtime(payload) * 1e3, 1) == ms


def test_lora_airtime_by_hand_for_20_bytes() -> None:
    radio = profile("lora-sf7")
    # ceil((8*20 - 4*7 + 28 + 16) / (4*7)) = 7 blocks of 5 symbols, + 8; preamble 8 + 4.25.
    assert radio.frame_airtime(20) == pytest.approx((8 + 4.25 + 8 + 7 * 5) * 1.024e-3,
                                                    rel=1e-12)


def test_lora_turns_low_data_rate_optimization_on_when_a_symbol_exceeds_16_ms() -> None:
    base = profile("lora-sf7").model_dump()
    sf11 = RadioProfile(**{**base, "name": "sf11", "spreading_factor": 11,
                           "bitrate_bps": 11 * 125e3 / 2**11 * 4 / 5})
    sf10 = RadioProfile(**{**base, "name": "sf10", "spreading_factor": 10,
                           "bitrate_bps": 10 * 125e3 / 2**10 * 4 / 5})
    assert sf11.symbol_s > 16e-3 and sf11.ldro
    assert sf10.symbol_s < 16e-3 and not sf10.ldro
    # SF11, 20 B, DE = 1: ceil((160 - 44 + 28 + 16) / (4 * 9)) = 5 blocks of 5 symbols.
    assert sf11.frame_airtime(20) == pytest.approx((12.25 + 8 + 25) * 2**11 / 125e3,
                                                   rel=1e-12)
    forced_off = RadioProfile(**{**sf11.model_dump(), "low_data_rate_optimize": False})
    assert forced_off.frame_airtime(20) < sf11.frame_airtime(20)


def test_the_lora_duty_cycle_wait_is_99_times_the_airtime() -> None:
    radio = profile("lora-sf7")
    airtime = radio.frame_airtime(51)
    assert radio.off_time_s(airtime) == pytest.approx(99 * airtime, rel=1e-12)
    assert profile("802.15.4").off_time_s(airtime) == 0.0


def test_the_lora_bit_rate_is_computed_when_left_out_and_checked_when_given(
        tmp_path: Path) -> None:
    radio = load_profiles(_write(tmp_path, USER_TOML))["lora-sf9"]
    assert radio.bitrate_bps == pytest.approx(9 * 125e3 / 2**9 * 4 / 5)
    assert profile("lora-sf7").bitrate_bps == 5468.75
    with pytest.raises(ValueError, match="bitrate_bps"):
        RadioProfile(**{**profile("lora-sf7").model_dump(), "bitrate_bps": 5000.0})


# -- fragmentation -----------------------------------------------------------------------

def test_a_message_is_cut_into_full_frames_and_a_last_one_with_the_remainder() -> None:
    radio = profile("802.15.4")
    assert radio.frame_sizes(0) == [17]
    assert radio.frame_sizes(1) == [18]
    assert radio.frame_sizes(116) == [133]
    assert radio.frame_sizes(117) == [133, 18]
    assert radio.frame_sizes(232) == [133, 133]
    assert radio.frame_sizes(1000) == [133] * 8 + [89]
    for size in (0, 1, 115, 116, 117, 999, 5000):
        frames = radio.frame_sizes(size)
        assert sum(frames) - 17 * len(frames) == size
        assert all(17 <= f <= 133 for f in frames)


def test_lora_frames_count_our_link_header_inside_the_phy_payload() -> None:
    radio = profile("lora-sf7")
    assert radio.frame_sizes(20) == [24]  # 4 bytes of link header + 20
    assert radio.frame_sizes(300) == [255, 53]


# -- profiles from TOML ------------------------------------------------------------------

def test_the_builtin_profiles_are_the_four_radios_each_with_a_source() -> None:
    radios = builtin_profiles()
    assert tuple(radios) == BUILTINS
    assert all(r.source for r in radios.values())
    for radio in radios.values():  # what --json prints can be read back
        assert RadioProfile(**radio.model_dump()) == radio


def test_a_user_profile_loads_and_replaces_the_builtin_of_its_name(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_TOML)
    loaded = load_profiles(path)
    assert set(loaded) == {"802.15.4", "lora-sf9"}
    merged = profiles(path)
    assert tuple(merged) == (*BUILTINS, "lora-sf9")
    assert merged["802.15.4"].tx_w == 0.0243
    assert merged["802.15.4"].ack_frame_bytes == 0  # the user's profile, not a blend
    assert profile("802.15.4", path).tx_w == 0.0243
    assert builtin_profiles()["802.15.4"].tx_w == 0.0522  # the built-ins are untouched


def test_an_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown radio profile 'zigbee'; known: 802\.15\.4, ble"):
        profile("zigbee")


@pytest.mark.parametrize(("change", "field"), [
    (lambda t: t.replace("tx_w = 0.0243\n", ""), "tx_w"),  # missing field
    (lambda t: t.replace("sleep_w = 1e-6", "sleep_w = -1e-6"), "sleep_w"),  # negative power
    (lambda t: t.replace("tx_w = 0.0243", "tx_w = 0.0243\ntx_dbm = 0"), "tx_dbm"),  # unknown
    (lambda t: t.replace("duty_cycle = 0.01", "duty_cycle = 0"), "duty_cycle"),
    (lambda t: t.replace("frame_overhead_bytes = 17", "frame_overhead_bytes = 133"),
     "frame_overhead_bytes"),
    (lambda t: t.replace("bitrate_bps = 250000", "bitrate_bps = 0"), "bitrate_bps"),
    (lambda t: t.replace("max_frame_bytes = 133", 'max_frame_bytes = "133"'),
     "max_frame_bytes"),  # a string is not a number, even one that reads as one
    (lambda t: t.replace("spreading_factor = 9\n", ""), "spreading_factor"),  # LoRa needs it
])
def test_a_bad_profile_file_is_a_one_line_usage_error_naming_the_file_and_field(
        tmp_path: Path, change, field: str) -> None:
    path = _write(tmp_path, change(USER_TOML))
    with pytest.raises(UsageError) as caught:
        load_profiles(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message and field in message


@pytest.mark.parametrize(("text", "needle"), [
    ("[radio.x]\nname = 'x'\n", "[[radio]]"),
    ("[[radios]]\nname = 'x'\n", "radios"),
    ("[[radio]\n", "not valid TOML"),
    (USER_TOML + "[[radio]]" + USER_TOML.split("[[radio]]")[2], "second profile"),
])
def test_a_file_not_of_radio_tables_is_a_usage_error(tmp_path: Path, text: str,
                                                     needle: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_profiles(_write(tmp_path, text))
    assert needle in str(caught.value) and "\n" not in str(caught.value)


# -- the CLI -----------------------------------------------------------------------------

def test_radio_list_json_gives_every_builtin_with_the_required_keys(cli) -> None:
    code, out, err = cli("radio", "list", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert isinstance(listed, list)
    assert [p["name"] for p in listed] == list(BUILTINS)
    for entry in listed:
        assert set(entry) >= REQUIRED_KEYS, entry["name"]


def test_radio_list_json_with_a_file_shows_the_users_profiles(cli, tmp_path: Path) -> None:
    code, out, err = cli("radio", "list", "--file", _write(tmp_path, USER_TOML), "--json")
    assert code == 0, err
    listed = {p["name"]: p for p in json.loads(out)}
    assert set(listed) == {*BUILTINS, "lora-sf9"}
    assert listed["802.15.4"]["tx_w"] == 0.0243


def test_radio_list_prints_a_table_and_the_sources(cli) -> None:
    code, out, err = cli("radio", "list")
    assert code == 0, err
    for name in BUILTINS:
        assert name in out
    assert "4.256" in out  # a full 802.15.4 frame, in ms
    assert "AN1200.13" in out and "SWRS041" in out


def test_radio_list_with_a_bad_file_is_a_one_line_error(cli, tmp_path: Path) -> None:
    path = _write(tmp_path, USER_TOML.replace("sleep_w = 1e-6", "sleep_w = -1e-6"))
    code, _, err = cli("radio", "list", "--file", path)
    assert_one_line_error(code, err, 2, "sleep_w")


# ------------------------------------------------------------ channel access
def _line_medium(radio, seed: int = 0):
    """Three radios in a line, a - b - c: a and c each hear only b."""
    queue, got = EventQueue(), []
    neighbours = {"a": ["b"], "b": ["a", "c"], "c": ["b"]}
    medium = SharedRadio(neighbours, radio, queue, seed, lambda party, what: got.append(
        (queue.now, party, what)), trace=[])
    return medium, queue, got


def _tx(src, dst, size, what):
    return Transmission(src, (dst,), Kind.HALO, 1, size, [(dst, what)], broadcast=True)


class _Fixed:
    """A generator of backoffs that always draws the middle of the window."""

    def random(self) -> float:
        return 0.5


def test_a_deferred_sender_reserves_nothing_a_newcomer_that_finds_the_channel_free_goes():
    """CSMA: b senses a on air (b is in a's neighbourhood) and backs off past its end;
    c, which comes during that backoff and finds b's neighbourhood free, takes the
    channel first, and b, sensing again, defers to c."""
    radio = profile("802.15.4").model_copy(update={"backoff_unit_s": 1e-3, "cca_s": 0.0,
                                                   "hop_latency_s": 0.0, "min_be": 2,
                                                   "max_be": 2})  # every backoff 2 ms
    medium, queue, _ = _line_medium(radio)
    medium.rng = _Fixed()
    medium.send(_tx("a", "b", 2000, "a's"), ready=0.0)
    queue.run(1)  # a's CCA at 2 ms: on air
    medium.send(_tx("b", "a", 100, "b's"), ready=0.01)
    queue.run(1)  # b's CCA at 12 ms: a is on air, b waits for its end plus 2 ms
    assert [s.src for s in medium.trace] == ["a"]
    a_end = medium.trace[0].t0 + medium.airtime(2000, acked=False).channel
    medium.send(_tx("c", "b", 100, "c's"), ready=a_end - 1e-3)  # c's CCA at a's end + 1 ms
    queue.run(1000)
    a, c, b = medium.trace
    assert (a.src, c.src, b.src) == ("a", "c", "b")
    assert c.t0 == pytest.approx(a_end + 1e-3)
    assert b.t0 == pytest.approx(c.t0 + medium.airtime(100, acked=False).channel + 2e-3)


def test_on_the_star_a_busy_sender_takes_its_turn_first_come_first_served() -> None:
    queue = EventQueue()
    medium = MqttStar(["n1", "n2", "n3"], profile("wifi"), queue, 0, lambda *_: None,
                      trace=[])
    for node in ("n1", "n2", "n3"):
        medium.send(_tx(node, BROKER, 500, node), ready=0.0)
    assert queue.run(1000) and len(medium.trace) == 3
    assert [s.src for s in medium.trace] == ["n1", "n2", "n3"]  # in the order they came
    hold = medium.airtime(500, acked=False).channel  # its frames and spaces
    for first, second in itertools.pairwise(medium.trace):
        assert second.t0 >= first.t0 + hold  # one at a time on the one channel
    assert queue.events == 6  # each: one CCA and one arrival, however busy the channel
