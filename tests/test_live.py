"""Live inference over MQTT: nodes sample sensors each slot, the edge publishes an alert
per slot; a node without a valid reading makes an error alert, never a made-up number."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl.config import load_run_config
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import anomaly_probability, serve
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress
from meshdl.nodes.sensors import SensorError, SyntheticSensor
from meshdl.nodes.serve import BackgroundNodeHost, Readings
from tests.helpers import retained_alert

SLOT_S = 1.0


class DeadSensor:
    def read(self) -> float:
        raise SensorError("no answer on the 1-wire bus")


def _config():
    return load_run_config(None, model={"rows": 3, "cols": 4, "hidden": 6})


def _serve_slots(broker, sensors, slots: int, wave_timeout: float,
                 max_attempts: int) -> tuple[list[dict], dict]:
    """Alerts of `slots` slots, and the retained one a late subscriber gets."""
    config = _config()
    model = CNN(config.model, seed=3)
    model.set_normalization(21.0, 2.0)
    address = BrokerAddress.parse(broker.url)
    cells = list(sensors)
    node_host = BackgroundNodeHost(config, cells, address,
                                   Readings(sensors=sensors, slot_s=SLOT_S))
    # A busy machine may make a read slow; a dead sensor is not that.
    node_host.sampler.timeout_s = 10 * SLOT_S
    with node_host:
        engine = MqttEngine(None, address, wave_timeout=wave_timeout,
                            max_attempts=max_attempts, nodes_timeout=20)
        try:
            alerts = serve(engine, model, SLOT_S, slots)
        finally:
            engine.close()
    return alerts, retained_alert(broker.host, broker.port)


def test_each_slot_gets_a_retained_alert_with_a_probability(mosquitto) -> None:
    sensors = {(r, c): SyntheticSensor((r, c), seed=1) for r in range(3) for c in range(4)}
    # Nodes sampling late (a busy machine) refuse the wave: it is restarted, not lost.
    alerts, retained = _serve_slots(mosquitto, sensors, slots=3, wave_timeout=5 * SLOT_S,
                                    max_attempts=3)
    assert len(alerts) == 3
    for alert in alerts:
        assert set(alert) == {"timestamp", "slot", "probability", "label"}
        assert 0.0 <= alert["probability"] <= 1.0
        assert alert["label"] == int(alert["probability"] >= 0.5)
    assert [a["slot"] for a in alerts] == sorted({a["slot"] for a in alerts})
    assert retained == alerts[-1]  # a late subscriber sees the last one


def test_a_dead_sensor_gives_an_error_alert_not_a_guess(mosquitto) -> None:
    sensors = {(r, c): SyntheticSensor((r, c), seed=1) for r in range(3) for c in range(4)}
    sensors[(1, 2)] = DeadSensor()
    # However long the wave is given, the slot has no value of cell (1, 2).
    alerts, _ = _serve_slots(mosquitto, sensors, slots=1, wave_timeout=SLOT_S / 2,
                             max_attempts=1)
    assert "error" in alerts[0] and "probability" not in alerts[0]


def test_an_edge_without_node_hosts_alerts_each_slot_and_keeps_serving(mosquitto) -> None:
    """Node hosts late after a power cut: the edge does not exit (under systemd that would
    be a restart loop); each slot's alert says it got no result."""
    config = _config()
    model = CNN(config.model, seed=3)
    model.set_normalization(21.0, 2.0)
    engine = MqttEngine(None, BrokerAddress.parse(mosquitto.url), wave_timeout=SLOT_S / 2,
                        max_attempts=1, nodes_timeout=0.5, connect_timeout_s=None)
    try:
        alerts = serve(engine, model, SLOT_S, slots=2)
    finally:
        engine.close()
    assert len(alerts) == 2
    assert all("error" in a and "probability" not in a for a in alerts)


def test_anomaly_probability_is_the_softmax_of_class_one() -> None:
    assert anomaly_probability(np.array([[0.0, 0.0]])) == pytest.approx(0.5)
    assert anomaly_probability(np.array([[1000.0, 0.0]])) == pytest.approx(0.0)
