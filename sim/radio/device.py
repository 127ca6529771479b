"""Device profiles: how long a node's computations take and what the board draws.

CPU time of one message handled = `per_message_s` + operations / `flops_per_s`, where
the operations are the exact counts of the kernels that message set off (meshdl/protocol/work.py).
We chose a documented rate over kernel times measured on this machine and scaled:
measured times would change from run to run and from machine to machine, and the
simulator promises the same trace for the same seeds. The rate is a sustained,
single-core one, since a node's kernels are small and run one at a time:

- Raspberry Pi 4 (Cortex-A72, 1.5 GHz): 812 MFLOPS, Linpack 2000 x 2000 through
  NumPy (sci-pi.org.uk/bench/linpack.html). A node's kernels are far smaller than
  Linpack's matrices, so this is an upper bound on speed: we halve it (406 MFLOPS).
- Raspberry Pi Zero 2 W (Cortex-A53, 1 GHz): about 0.33 of a Pi 4 per core, from
  sysbench single-core rates (Pi 3B+ 687 events/s vs Pi 4 1,478, leoncode.co.uk
  Raspberry Pi CPU benchmarks) scaled from 1.4 GHz to 1 GHz: 135 MFLOPS.
- Cortex-M4F microcontroller (nRF52832, 64 MHz): its single-precision FPU takes 3
  cycles for a fused multiply-add (VFMA.F32) and 2 for each load, so a convolution's
  inner loop does about one multiply-add in 6 cycles: 20 MFLOPS. CPU 3.7 mA at 3 V
  running from flash with the DC/DC regulator, 1.9 uA in System ON idle with the RTC
  (Nordic nRF52832 product specification v1.4).

`per_message_s` is the protocol's bookkeeping for one message (checks, dispatch, copies
into the wave's buffers), measured here: in a seed training wave the node machines
spend 83 ms on 7,205 messages, of which the kernels take 9 ms (timed apart), so about
10 us a message on this machine's x86 core; scaled by single-core ratios (this core
about 4 times a Pi 4, a Pi 4 about 3 times a Zero 2 W): 40 us on a Pi 4, 120 us on a
Zero 2 W. A Cortex-M4 running the protocol in C (header checks and a CRC over about 100
bytes, some 3,000 cycles at 64 MHz) is put at 50 us. These are estimates, and say so.

Power: `cpu_w` is drawn while computing, `idle_w` otherwise (the board's floor, radio
off; the radio's own draw is in its profile), `sleep_w` in its deepest sleep with an RTC
to wake it and its RAM kept, where the scheduled MAC (sim/radio/mac.py) puts it between
slots; a Raspberry Pi has no such state (Linux has no suspend with an RTC wake-up on it),
so its figure is its idle power. Raspberry Pi figures are published
measurements, indicative only (Pi 4: 2.7 W idle, 6.4 W under load, Raspberry Pi
documentation and Tom's Hardware; Zero 2 W: 0.6 W idle, about 1.5 W with one busy core,
Hackaday "The Pi Zero 2 W is the most efficient Pi").
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from meshdl.errors import UsageError


class DeviceProfile(BaseModel):
    """A node's or the edge's computer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    flops_per_s: float = Field(gt=0, description="sustained single-core rate")
    per_message_s: float = Field(ge=0, description="protocol work per message handled")
    cpu_w: float = Field(ge=0, description="power while computing")
    idle_w: float = Field(ge=0, description="power of the board otherwise (radio apart)")
    source: str
    sleep_w: float | None = Field(None, ge=0, description="its deepest sleep with a timer "
                                  "(RTC) to wake it and its memory kept, between the "
                                  "scheduled MAC's slots; None: no deeper state than idle")

    @property
    def deep_sleep_w(self) -> float:
        """What it draws asleep between scheduled slots (idle_w without a sleep state)."""
        return self.idle_w if self.sleep_w is None else self.sleep_w

    def cpu_s(self, flops: int, messages: int = 1) -> float:
        """CPU time of `messages` handled that together set off `flops` operations."""
        return messages * self.per_message_s + flops / self.flops_per_s


_DEVICES = [
    DeviceProfile(name="pi4", flops_per_s=406e6, per_message_s=40e-6, cpu_w=6.4,
                  idle_w=2.7, source="Linpack 812 MFLOPS (sci-pi.org.uk), halved for "
                  "small kernels; power: Raspberry Pi 4 published measurements "
                  "(indicative)"),
    DeviceProfile(name="pi-zero-2w", flops_per_s=135e6, per_message_s=120e-6, cpu_w=1.5,
                  idle_w=0.6, source="sysbench single-core ratio to the Pi 4 (leoncode."
                  "co.uk) at 1 GHz; power: Hackaday Pi Zero 2 W measurements (indicative)"),
    DeviceProfile(name="cortex-m4", flops_per_s=20e6, per_message_s=50e-6,
                  cpu_w=3.7e-3 * 3.0, idle_w=1.9e-6 * 3.0,
                  # Asleep with the RTC and all 64 kB of RAM kept (the cached parameters,
                  # the slot's state): the sleep current table's ION_RAMOFF_RTC (System ON,
                  # no RAM retention, wake on RTC) 1.9 uA plus what full retention adds in
                  # the same table (ION_RAMON_EVENT 1.5 - ION_RAMOFF_EVENT 1.2 = 0.3 uA).
                  sleep_w=(1.9e-6 + 0.3e-6) * 3.0,
                  source="nRF52832 product specification v1.4: 64 MHz Cortex-M4F, CPU "
                  "3.7 mA from flash (DC/DC), System ON idle 1.9 uA, at 3 V; a "
                  "multiply-add in about 6 cycles with its loads (VFMA.F32 3, VLDR 2); "
                  "asleep with RTC and full RAM retention 2.2 uA (sleep current table: "
                  "ION_RAMOFF_RTC 1.9 uA + 0.3 uA of RAM retention)"),
]


def builtin_devices() -> dict[str, DeviceProfile]:
    return {device.name: device for device in _DEVICES}


def natural_device(radio_name: str) -> str:
    """The computer a radio's nodes usually are: a Pi Zero 2 W on Wi-Fi, a Cortex-M4
    mote (nRF52, or an MCU beside a CC2420 or an SX1276) on the low-power radios."""
    return "pi-zero-2w" if radio_name == "wifi" else "cortex-m4"


def device(name: str) -> DeviceProfile:
    """A built-in device profile by name."""
    devices = builtin_devices()
    if name not in devices:
        raise UsageError(f"unknown device {name!r} (known: {', '.join(devices)})")
    return devices[name]
