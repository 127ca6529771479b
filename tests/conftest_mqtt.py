"""Fixtures that start a real Mosquitto broker (tests/mosquitto.py) and stop it after.

    def test_x(mosquitto):                      # an anonymous broker, started
        aiomqtt.Client(mosquitto.host, mosquitto.port)

    def test_y(mosquitto_factory, tmp_path):    # any number, with passwords and an ACL
        broker = mosquitto_factory(password_file=..., acl_file=...)
        broker.restart()

Every broker a test started is stopped when the test ends, also when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mosquitto import Mosquitto, mosquitto_binary

MosquittoFactory = Callable[..., Mosquitto]


@pytest.fixture
def mosquitto_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoFactory]:
    """Start brokers: `factory(password_file=None, acl_file=None, allow_anonymous=None,
    extra=(), port=None) -> Mosquitto` (running); all are stopped at teardown."""
    started: list[Mosquitto] = []

    def start(**options: Any) -> Mosquitto:
        mosquitto_binary()  # skips the test when Mosquitto is not installed
        workdir: Path = tmp_path_factory.mktemp("mosquitto")
        broker = Mosquitto(workdir, **options)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def mosquitto(mosquitto_factory: MosquittoFactory) -> Mosquitto:
    """An anonymous broker on a free loopback port."""
    return mosquitto_factory()
