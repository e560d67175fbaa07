"""Fixtures for the trainer-side tests."""

from __future__ import annotations

import pytest

from tests.trainguard.support import Handlers, SilentServer
from trainguard.metrics import api


@pytest.fixture(autouse=True)
def fresh_metrics_config():
    """Every test starts with nothing configured and no warnings remembered."""
    api.reset_for_tests()
    yield
    api.reset_for_tests()


@pytest.fixture
def handlers():
    """Creates wire handlers and closes them after the test."""
    made = Handlers()
    yield made
    made.close_all()


@pytest.fixture
def silent_server(monkeypatch):
    """A Pub/Sub endpoint that accepts connections and never answers; clients created in the test use it."""
    from tests.servers.fixtures import no_grpc_proxy_for_local_hosts

    server = SilentServer()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.host)
    monkeypatch.setenv("no_grpc_proxy", no_grpc_proxy_for_local_hosts())
    yield server
    server.close()
