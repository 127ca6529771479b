"""Live sensors with a head that reads the alive mask (issue 45): a node host records
each reading beside a 1, so a live slot's alert is the central model's on those maps."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import load_run_config
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import anomaly_probability, serve
from meshdl.errors import UsageError
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.serve import BackgroundNodeHost, Readings

SLOT_S = 1.0
ROWS, COLS = 3, 4


class Steady:
    """A sensor that reads the same value every slot."""

    def __init__(self, value: float) -> None:
        self.value = value

    def read(self) -> float:
        return self.value


def _alive_config():
    return load_run_config(None, model={"rows": ROWS, "cols": COLS, "hidden": 6,
                                        "pool": "global", "alive": True})


def test_live_slots_of_a_head_with_the_alive_mask_alert_as_the_central_model(
        mosquitto) -> None:
    config = _alive_config()
    assert config.model.in_channels == 2
    model = CNN(config.model, seed=5)
    model.set_normalization(21.0, 2.0)
    values = 20.0 + np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) / 4
    sensors = {(r, c): Steady(float(values[r, c])) for r in range(ROWS) for c in range(COLS)}
    address = BrokerAddress.parse(mosquitto.url)
    # As `meshdl node serve --sensor` chooses them, with these steady sensors.
    chosen = Readings.choose(config, list(sensors), None, "synthetic", SLOT_S)
    host = BackgroundNodeHost(config, list(sensors), address,
                              Readings(sensors=sensors, slot_s=SLOT_S,
                                       channels=chosen.channels))
    host.sampler.timeout_s = 10 * SLOT_S  # a busy machine may make a read slow
    with host:
        engine = MqttEngine(None, address, wave_timeout=5 * SLOT_S, max_attempts=3,
                            nodes_timeout=20)
        try:
            alerts = serve(engine, model, SLOT_S, slots=2)
        finally:
            engine.close()
    central = anomaly_probability(model.forward(values[None]))  # the mask: all alive
    assert [a.get("error") for a in alerts] == [None, None]
    for alert in alerts:
        assert alert["probability"] == pytest.approx(central, abs=1e-6)


def test_live_sensors_are_refused_for_a_model_of_two_readings_a_cell() -> None:
    config = load_run_config(None, model={"rows": ROWS, "cols": COLS, "in_channels": 2})
    with pytest.raises(UsageError, match="one reading per cell"):
        Readings.choose(config, [(0, 0)], None, "synthetic", SLOT_S)
