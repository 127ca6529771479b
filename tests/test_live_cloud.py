"""The cloud-heavy baseline ships a node's readings, not the alive mask a model may take
as one more input channel: the edge knows whose readings came, so a cloud that shipped
the mask would be a crippled baseline (twice the bytes of one reading a cell)."""

from __future__ import annotations

from meshdl import ModelConfig
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies.cloud import ship_readings


def _shipped_bytes(alive: bool) -> int:
    config = ModelConfig(rows=4, cols=5, filters=3, hidden=4, pool="global", alive=alive)
    spec = MeshSpec(1, config, header="compact")
    return ship_readings(spec, profile("802.15.4"), "shared", device("cortex-m4"),
                         device("pi4"), 1, header_bytes=6).bytes


def test_the_cloud_ships_the_readings_and_not_the_alive_mask() -> None:
    assert ModelConfig(rows=4, cols=5, alive=True).in_channels == 2
    assert _shipped_bytes(alive=True) == _shipped_bytes(alive=False)
