"""Stores for the dashboard tests, and a client of the app on each (Starlette's TestClient: the real app in-process).

``demo_store``: the bundled demo replayed by the pipeline. ``small_store``: the report tests' hand-built store,
whose second test has every name hostile (``tests.report.test_report.small_store_rows``).
"""

from __future__ import annotations

import shutil
import warnings

import pytest

from dashboard.app import create_app
from dashboard.cli import parser, settings_from
from pipeline.main import main as pipeline_main
from pipeline.options import DEMO_INPUT
from sinks.duckdb_store import DuckDBStore
from tests.report.test_report import small_store_rows

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def replay(store, alerts, *clients_or_options) -> None:
    """The demo input into ``store``, as ``python -m pipeline`` replays it (applying the store's triage file).

    The replay runs in this process, where DuckDB refuses a read-write connection beside an open read-only one
    (another process, as a real replay is, waits for the file instead): the apps of the test clients given let
    go of it first. Strings given are more options of the pipeline."""
    options = [o for o in clients_or_options if isinstance(o, str)]  # more options of the pipeline
    for client in clients_or_options:
        if not isinstance(client, str):
            client.app.state.settings.source.connection.close()
    assert pipeline_main([f"--input_files={DEMO_INPUT}", f"--local_store={store}", "--report_dir=",
                          f"--alerts_file={alerts}", *options]) == 0


@pytest.fixture(scope="session")
def demo_replayed(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-demo")
    replay(root / "trainguard.duckdb", root / "alerts.jsonl")
    return root


@pytest.fixture
def demo_store(demo_replayed, tmp_path):
    """A fresh copy of the replayed demo store (a test may triage and replay it)."""
    shutil.copy(demo_replayed / "trainguard.duckdb", tmp_path / "trainguard.duckdb")
    shutil.copy(demo_replayed / "alerts.jsonl", tmp_path / "alerts.jsonl")
    return tmp_path / "trainguard.duckdb"


@pytest.fixture(scope="session")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash-small") / "small.duckdb"
    store = DuckDBStore(str(path))
    store.ensure_schema()
    for table, rows in small_store_rows().items():
        assert store.insert(table, rows) == len(rows)
    store.close()
    return path


def client_of(*argv: str, base_url: str = "http://testserver") -> TestClient:
    return TestClient(create_app(settings_from(parser().parse_args(list(argv)))), base_url=base_url)


@pytest.fixture
def demo_client(demo_store):
    return client_of(f"--local_store={demo_store}", "--user=tester")


@pytest.fixture(scope="session")
def small_client(small_store):
    return client_of(f"--local_store={small_store}")
