"""Radio profiles: how long a message holds the channel and what the radio draws meanwhile.

A `RadioProfile` is what a simulated medium needs to know about one radio technology: its
bit rate and frame format (how a message is cut into frames, how long each frame is on
air), its MAC timing (acknowledgement, RX->TX turnaround, inter-frame spaces, unslotted
CSMA-CA), its power in each state, and the regulatory duty cycle. Profiles are data: the
built-in ones are in `radios.toml` beside this module, each figure with its source, and a
user's TOML file of `[[radio]]` tables adds profiles or replaces built-ins (`profiles`).

Formulas and where they come from:
- linear radios: a frame of B bytes (everything on air) lasts 8 B / bitrate.
- LoRa (Semtech AN1200.13): symbol time Ts = 2^SF / BW and a frame whose PHY payload is
  PL bytes lasts (n_preamble + 4.25) Ts
  + (8 + max(ceil((8 PL - 4 SF + 28 + 16 CRC - 20 IH) / (4 (SF - 2 DE))) (CR + 4), 0)) Ts,
  IH = 1 for an implicit header, DE = 1 with low data rate optimization (by default on
  when Ts > 16 ms, as Semtech mandates). For LoRa, "frame bytes" are that PHY payload:
  `frame_overhead_bytes` counts only our link header inside it, since the preamble, PHY
  header and CRC are in the formula.
- one message to one receiver, unicast with acknowledgements (`transmission_s`):
      T = sum over its frames f of  airtime(f) + [turnaround + airtime(ack)] + ifs(f)
  without the bracket for a broadcast or a MAC without acks (`broadcast_s`). Neither
  counts the random CSMA backoff (the simulator draws it from `backoff_unit_s`, `min_be`,
  `max_be`) nor the duty-cycle wait after a transmission of airtime T_air,
  `off_time_s` = T_air (1 / duty_cycle - 1) (ETSI EN 300 220: 99 T_air at 1 %).
- `hop_latency_s` is a modelling choice, not a published figure: the fixed time a node's
  stack takes to move a message from reception to the next transmission; each built-in
  profile says what its value stands for.

Standards and datasheets behind the built-ins (cited in each profile's `source`): IEEE
802.15.4-2006 and the TI CC2420 datasheet; the Bluetooth Core Specification 4.2+ and the
nRF52832 product specification; IEEE 802.11-2016 and a Raspberry Pi 3B power measurement;
Semtech AN1200.13, the SX1276 datasheet and ETSI EN 300 220.
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshdl.errors import UsageError, format_validation_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUILTIN_FILE = Path(__file__).with_name("radios.toml")
# Semtech mandates low data rate optimization when a symbol lasts longer than this.
LDRO_SYMBOL_S = 16e-3
# The SX127x's payload length register is 8 bits wide.
LORA_MAX_PAYLOAD_BYTES = 255
UNLIMITED = "unlimited"


def lora_bitrate_bps(spreading_factor: int, bandwidth_hz: float, coding_rate: int) -> float:
    """LoRa's nominal bit rate SF * BW / 2^SF * 4 / (4 + CR) (5468.75 at SF7/125 kHz/4/5)."""
    return spreading_factor * bandwidth_hz / 2**spreading_factor * 4 / (4 + coding_rate)


class RadioProfile(BaseModel):
    """One radio technology's frame format, MAC timing, power and duty cycle."""

    # Strict: a TOML value of the wrong type ("133" for 133) is an error, not a guess.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              str_strip_whitespace=True)

    name: str = Field(min_length=1)
    bitrate_bps: float = Field(gt=0, description="PHY bit rate; LoRa's nominal rate is "
                               "informative (its airtime follows AN1200.13)")
    max_frame_bytes: int = Field(gt=0, description="the largest frame, all overhead "
                                 "included (for LoRa: the largest PHY payload)")
    frame_overhead_bytes: int = Field(ge=0, description="bytes of each frame that are not "
                                      "message payload (PHY + MAC header + FCS; LoRa: our "
                                      "link header only)")
    ack_frame_bytes: int = Field(0, ge=0, description="0: the MAC sends no acknowledgement")
    turnaround_s: float = Field(0.0, ge=0, description="RX->TX turnaround before an ack")
    ifs_s: float = Field(0.0, ge=0, description="inter-frame space after each frame, or "
                         "after its ack")
    sifs_s: float | None = Field(None, ge=0, description="shorter space after frames of at "
                                 "most sifs_max_frame_bytes (802.15.4 SIFS)")
    sifs_max_frame_bytes: int = Field(0, ge=0)
    ack_wait_s: float | None = Field(None, ge=0, description="how long after its frame the "
                                     "sender waits for the ack; None: turnaround + ack")
    max_frame_retries: Annotated[int, Field(ge=0)] | Literal["unlimited"] = 0
    backoff_unit_s: float = Field(0.0, ge=0, description="unslotted CSMA-CA unit backoff; "
                                  "0: no CSMA")
    min_be: int = Field(0, ge=0)
    max_be: int = Field(0, ge=0)
    max_csma_backoffs: int = Field(0, ge=0)
    cca_s: float = Field(0.0, ge=0)
    hop_latency_s: float = Field(0.0, ge=0, description="fixed per-hop stack latency "
                                 "(a modelling choice)")
    tx_w: float = Field(ge=0)
    rx_w: float = Field(ge=0)
    idle_w: float = Field(ge=0, description="radio on, listening")
    sleep_w: float = Field(ge=0)
    deep_sleep_w: float | None = Field(None, ge=0, description="its deepest sleep, from "
                                       "which the scheduled MAC wakes it once a slot; "
                                       "None: no such figure (scheduled is refused)")
    duty_cycle: float = Field(1.0, gt=0, le=1, description="1.0: unlimited")
    modulation: Literal["linear", "lora"] = "linear"
    spreading_factor: int | None = Field(None, ge=6, le=12)
    bandwidth_hz: float | None = Field(None, gt=0)
    coding_rate: int = Field(1, ge=1, le=4, description="1..4 for 4/5..4/8")
    preamble_symbols: int = Field(8, ge=0)
    explicit_header: bool = True
    crc: bool = True
    low_data_rate_optimize: bool | None = Field(None, description="None: on when a symbol "
                                                "lasts more than 16 ms")
    source: str = Field(min_length=1, description="where the figures come from")

    @model_validator(mode="before")
    @classmethod
    def _nominal_lora_bitrate(cls, data: Any) -> Any:
        # LoRa's bit rate follows from SF, BW and CR, so a profile may leave it out.
        if isinstance(data, dict) and data.get("modulation") == "lora" \
                and "bitrate_bps" not in data:
            missing = [f for f in ("spreading_factor", "bandwidth_hz") if f not in data]
            if missing:
                raise ValueError(f"modulation = 'lora' needs {' and '.join(missing)}")
            try:
                rate = lora_bitrate_bps(data["spreading_factor"], data["bandwidth_hz"],
                                        data.get("coding_rate", 1))
            except (TypeError, ValueError, ArithmeticError):
                # A field of the wrong type: its own check says so, and a stand-in rate
                # keeps "bitrate_bps: Field required" out of that message.
                rate = 1.0
            return {**data, "bitrate_bps": rate}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RadioProfile:
        if self.frame_overhead_bytes >= self.max_frame_bytes:
            raise ValueError(f"frame_overhead_bytes ({self.frame_overhead_bytes}) must be less "
                             f"than max_frame_bytes ({self.max_frame_bytes}): no room for a "
                             "payload")
        if self.max_be < self.min_be:
            raise ValueError(f"max_be ({self.max_be}) must be at least min_be ({self.min_be})")
        if self.modulation == "lora":
            self._check_lora()
        else:
            stray = [f for f in ("spreading_factor", "bandwidth_hz", "low_data_rate_optimize")
                     if getattr(self, f) is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)} only apply to modulation = 'lora'")
        if self.ack_wait_s is not None:
            if not self.ack_frame_bytes:
                raise ValueError("ack_wait_s needs acknowledgements (ack_frame_bytes > 0)")
            if self.ack_wait_s < self.turnaround_s + self.ack_airtime:
                raise ValueError(f"ack_wait_s ({self.ack_wait_s:g} s) is shorter than "
                                 "turnaround_s + the ack's airtime "
                                 f"({self.turnaround_s + self.ack_airtime:g} s)")
        return self

    def _check_lora(self) -> None:
        missing = [f for f in ("spreading_factor", "bandwidth_hz") if getattr(self, f) is None]
        if missing:
            raise ValueError(f"modulation = 'lora' needs {' and '.join(missing)}")
        if self.max_frame_bytes > LORA_MAX_PAYLOAD_BYTES:
            raise ValueError(f"max_frame_bytes ({self.max_frame_bytes}) exceeds LoRa's "
                             f"{LORA_MAX_PAYLOAD_BYTES}-byte PHY payload")
        if self.spreading_factor == 6 and self.explicit_header:
            raise ValueError("spreading_factor 6 works only with explicit_header = false")
        nominal = lora_bitrate_bps(self.spreading_factor, self.bandwidth_hz, self.coding_rate)
        if not math.isclose(self.bitrate_bps, nominal, rel_tol=1e-6):
            raise ValueError(f"bitrate_bps ({self.bitrate_bps:g}) is not LoRa's nominal "
                             f"SF*BW/2^SF*4/(4+CR) = {nominal:g}; leave it out to have it "
                             "computed")

    def __hash__(self) -> int:
        # Profiles key the link layer's caches on every lossy transmission: pydantic's
        # own hash of a frozen model hashes each field on every call. Equal profiles
        # have equal names, so this hash agrees with ==.
        return hash(self.name)

    # -- frames --------------------------------------------------------------------------

    @property
    def payload_per_frame(self) -> int:
        """Message bytes one frame carries: max_frame_bytes - frame_overhead_bytes."""
        return self.max_frame_bytes - self.frame_overhead_bytes

    def frame_sizes(self, message_bytes: int) -> list[int]:
        """Bytes of each frame a message is cut into, as `frame_airtime` takes them (all on
        air for linear radios; the PHY payload for LoRa): full frames, then one with the
        remainder; an empty message is one frame of overhead alone."""
        if message_bytes < 0:
            raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")
        full, rest = divmod(message_bytes, self.payload_per_frame)
        sizes = [self.max_frame_bytes] * full
        if rest or not sizes:
            sizes.append(self.frame_overhead_bytes + rest)
        return sizes

    @property
    def symbol_s(self) -> float:
        """LoRa symbol time 2^SF / BW (1.024 ms at SF7, 125 kHz)."""
        if self.modulation != "lora":
            raise ValueError(f"{self.name}: symbols are a LoRa notion")
        return 2**self.spreading_factor / self.bandwidth_hz

    @property
    def ldro(self) -> bool:
        """LoRa low data rate optimization in force: as set, else on when Ts > 16 ms."""
        if self.low_data_rate_optimize is not None:
            return self.low_data_rate_optimize
        return self.symbol_s > LDRO_SYMBOL_S

    def frame_airtime(self, frame_bytes: int) -> float:
        """Seconds on air of one frame of `frame_bytes` (see the module docstring)."""
        if frame_bytes < 0:
            raise ValueError(f"frame_bytes must be >= 0, got {frame_bytes}")
        if self.modulation == "linear":
            return 8 * frame_bytes / self.bitrate_bps
        sf, ts = self.spreading_factor, self.symbol_s
        de, ih = int(self.ldro), int(not self.explicit_header)
        numerator = 8 * frame_bytes - 4 * sf + 28 + 16 * int(self.crc) - 20 * ih
        blocks = -(-numerator // (4 * (sf - 2 * de)))  # integer ceiling: no float rounding
        payload_symbols = 8 + max(blocks * (self.coding_rate + 4), 0)
        return (self.preamble_symbols + 4.25) * ts + payload_symbols * ts

    @property
    def ack_airtime(self) -> float:
        """Seconds on air of the acknowledgement frame (0 without acks)."""
        return self.frame_airtime(self.ack_frame_bytes) if self.ack_frame_bytes else 0.0

    @property
    def ack_timeout_s(self) -> float:
        """After the end of a frame, how long the sender waits for its ack."""
        if self.ack_wait_s is not None:
            return self.ack_wait_s
        return self.turnaround_s + self.ack_airtime

    @property
    def retry_limit(self) -> float:
        """Retransmissions of a frame before the MAC gives up (math.inf: no limit)."""
        return math.inf if self.max_frame_retries == UNLIMITED else self.max_frame_retries

    def ifs_after(self, frame_bytes: int) -> float:
        """The inter-frame space after a frame (SIFS after a short one, if defined)."""
        if self.sifs_s is not None and frame_bytes <= self.sifs_max_frame_bytes:
            return self.sifs_s
        return self.ifs_s

    def frame_time_s(self, frame_bytes: int, acked: bool = True) -> float:
        """Channel time of one frame: airtime + [turnaround + ack airtime] + its IFS."""
        ack = self.turnaround_s + self.ack_airtime if acked and self.ack_frame_bytes else 0.0
        return self.frame_airtime(frame_bytes) + ack + self.ifs_after(frame_bytes)

    def transmission_s(self, message_bytes: int) -> float:
        """Channel time of a unicast message with acks: the sum over its frames of
        airtime + turnaround + ack airtime + IFS; no CSMA backoff, no duty-cycle wait."""
        return sum(self.frame_time_s(f) for f in self.frame_sizes(message_bytes))

    def broadcast_s(self, message_bytes: int) -> float:
        """Channel time of a broadcast message: the sum over its frames of airtime + IFS."""
        return sum(self.frame_time_s(f, acked=False) for f in self.frame_sizes(message_bytes))

    def off_time_s(self, airtime_s: float) -> float:
        """Duty-cycle wait after `airtime_s` on air: airtime * (1 / duty_cycle - 1)."""
        if airtime_s < 0:
            raise ValueError(f"airtime_s must be >= 0, got {airtime_s}")
        return airtime_s * (1 / self.duty_cycle - 1)


# -- profiles from TOML ------------------------------------------------------------------

def load_profiles(path: Path | str) -> dict[str, RadioProfile]:
    """The profiles of a TOML file of `[[radio]]` tables (one table per profile, its
    `name` inside), by name; a bad file is a UsageError naming the file and the field."""
    path = Path(path)
    with path.open("rb") as handle:
        try:
            data = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"radio"})
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}: profiles go in [[radio]] tables")
    tables = data.get("radio", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{path}: 'radio' must be an array of tables: write [[radio]] "
                         "before each profile")
    found: dict[str, RadioProfile] = {}
    for number, table in enumerate(tables, start=1):
        label = f"[[radio]] #{number}"
        if isinstance(table.get("name"), str):
            label += f" ({table['name']})"
        try:
            radio = RadioProfile.model_validate(table)
        except ValidationError as exc:
            raise UsageError(f"{path}: {label}: {format_validation_error(exc)}") from None
        if radio.name in found:
            raise UsageError(f"{path}: {label}: a second profile named {radio.name!r}")
        found[radio.name] = radio
    return found


@cache
def _builtins() -> dict[str, RadioProfile]:
    return load_profiles(BUILTIN_FILE)


def builtin_profiles() -> dict[str, RadioProfile]:
    """The built-in profiles (sim/radio/radios.toml) by name."""
    return dict(_builtins())


def profiles(extra: Path | str | None = None) -> dict[str, RadioProfile]:
    """Built-in profiles plus those of a user file; a user profile named like a built-in
    replaces it (in the built-in's place)."""
    merged = builtin_profiles()
    if extra is not None:
        merged.update(load_profiles(extra))
    return merged


def profile(name: str, extra: Path | str | None = None) -> RadioProfile:
    """The profile called `name`, or a UsageError listing the known names."""
    known = profiles(extra)
    try:
        return known[name]
    except KeyError:
        raise UsageError(f"unknown radio profile {name!r}; known: "
                         f"{', '.join(known)}") from None
