"""What a live slot's alert says when it has no result (issue 43, item 10b): a slot
whose node had no valid reading names that cell and its sensor's error, not the broker's
message size."""

from __future__ import annotations

from meshdl.config import load_run_config
from meshdl.edge.remote import MqttEngine
from meshdl.edge.serve import serve
from meshdl.model.cnn import CNN
from meshdl.mqtt.session import BrokerAddress
from meshdl.mqtt.status import parse_status
from meshdl.nodes.sensors import SensorError, SyntheticSensor
from meshdl.nodes.serve import BackgroundNodeHost, Readings

SLOT_S = 1.0


class DeadSensor:
    def read(self) -> float:
        raise SensorError("no answer on the 1-wire bus")


def test_a_slot_without_a_valid_reading_names_the_cell_and_its_error(mosquitto) -> None:
    config = load_run_config(None, model={"rows": 3, "cols": 4, "hidden": 6})
    model = CNN(config.model, seed=3)
    model.set_normalization(21.0, 2.0)
    sensors = {(r, c): SyntheticSensor((r, c), seed=1) for r in range(3) for c in range(4)}
    sensors[(1, 2)] = DeadSensor()
    address = BrokerAddress.parse(mosquitto.url)
    host = BackgroundNodeHost(config, list(sensors), address,
                              Readings(sensors=sensors, slot_s=SLOT_S))
    host.sampler.timeout_s = 10 * SLOT_S  # a busy machine may make a read slow
    with host:
        # A slot's wave gets a whole slot: the host's record comes long before.
        engine = MqttEngine(None, address, wave_timeout=SLOT_S, max_attempts=1,
                            nodes_timeout=20)
        try:
            alerts = serve(engine, model, SLOT_S, slots=2)
        finally:
            engine.close()
    for alert in alerts:
        assert "probability" not in alert
        assert alert["error"] == (
            f"slot {alert['slot']}: no valid reading of r1c2 (node host host-local: r1c2: "
            "no answer on the 1-wire bus (after 3 attempt(s))): a slot is computed only on "
            "every cell's reading")


def test_a_status_record_says_which_cells_were_not_read() -> None:
    record = parse_status(b'{"role": "node-host", "state": "online", "mesh": 1, '
                          b'"unread": ["r1c2"], "unread_slot": 7, "unread_error": "r1c2: x"}')
    assert record is not None and record.unread == ["r1c2"] and record.unread_slot == 7
    for bad in (b'"unread": ["edge"]', b'"unread": ["r1c2", "r1c2"]',
                b'"unread_error": "' + b"x" * 201 + b'"'):
        assert parse_status(b'{"role": "node-host", "state": "online", "mesh": 1, ' + bad +
                            b'}') is None, bad
