"""Pytest fixtures for the in-process test servers.

Import the fixtures into a ``conftest.py`` to use them::

    from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.servers.bigquery import BigQueryEmulator
from tests.servers.pubsub import DEFAULT_PROJECT, PubSubServer

_LOCAL_HOSTS = ("127.0.0.1", "localhost")


def no_grpc_proxy_for_local_hosts() -> str:
    """``no_grpc_proxy`` value exempting local hosts, keeping existing exemptions.

    gRPC honours ``http(s)_proxy``; without this, a proxy configured on the
    machine would swallow connections to the in-process server.
    """
    current = os.environ.get("no_grpc_proxy") or os.environ.get("no_proxy") or ""  # noqa: SIM112 - gRPC reads lower case
    entries = [entry for entry in current.split(",") if entry]
    return ",".join(entries + [host for host in _LOCAL_HOSTS if host not in entries])


@pytest.fixture
def pubsub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubServer]:
    """A started :class:`PubSubServer` that Pub/Sub clients created in the test use.

    Sets ``PUBSUB_EMULATOR_HOST`` (read when a client is constructed) and
    ``PUBSUB_PROJECT_ID``; the server is stopped after the test.
    """
    with PubSubServer(project=DEFAULT_PROJECT) as server:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.host)
        monkeypatch.setenv("PUBSUB_PROJECT_ID", server.project)
        monkeypatch.setenv("no_grpc_proxy", no_grpc_proxy_for_local_hosts())
        yield server


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """A started :class:`BigQueryEmulator` (bqemulator in a child process), shared by the session.

    Starting one takes ~2 s, so tests share it and isolate themselves by using
    datasets of their own. The emulator's logs go to ``bqemulator.log`` in a
    session temp directory.
    """
    log_path = tmp_path_factory.mktemp("bqemulator") / "bqemulator.log"
    with open(log_path, "w") as log, BigQueryEmulator(project=DEFAULT_PROJECT, log=log) as emulator:
        yield emulator
