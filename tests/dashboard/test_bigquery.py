"""The dashboard on a BigQuery dataset (the emulator the suite uses) renders what it renders on the same rows in a
DuckDB store: the same queries, parameters bound the BigQuery way."""

from __future__ import annotations

import re
import urllib.parse

import pytest

from core.schema import ALERTS, DEAD_LETTER, TABLES
from dashboard.store import bigquery_sql
from sinks.duckdb_store import DuckDBStore
from tests.dashboard.conftest import client_of
from tests.report.test_report import HOSTILE, alert_row, small_store_rows

DATASET = "dashboard_pages"


def rows():
    tables = small_store_rows()
    tables[ALERTS] = tables[ALERTS] + [{**alert_row("pt-small", "r5", 5, "metric_out_of_bounds", "m_lower",
                                                    "m_lower = 1 is outside bounds", {"previous_value": 3.0}),
                                        "alert_id": "0123abcd"}]
    tables[DEAD_LETTER] = [{"received_at": "2025-11-20T00:00:00+00:00", "reason": "invalid message: not JSON",
                            "payload": "{oops <script>", "source": "files", "dead_letter_id": "d1"}]
    return tables


@pytest.fixture(scope="module")
def stores(bigquery_emulator, tmp_path_factory):
    from google.cloud import bigquery

    client = bigquery_emulator.client()
    client.create_dataset(DATASET, exists_ok=True)
    path = tmp_path_factory.mktemp("dash-bq") / "same.duckdb"
    local = DuckDBStore(str(path))
    local.ensure_schema()
    tables = rows()
    for table in TABLES.values():
        table_rows = tables.get(table, [])
        schema = [bigquery.SchemaField(c.name, c.type, mode="REQUIRED" if c.required else "NULLABLE")
                  for c in table.columns]
        client.create_table(bigquery.Table(f"{client.project}.{DATASET}.{table.name}", schema=schema))
        if table_rows:
            assert client.insert_rows_json(f"{client.project}.{DATASET}.{table.name}", table_rows) == []
            local.insert(table, table_rows)
    local.close()
    return (client_of(f"--bigquery_project={client.project}", f"--bigquery_dataset={DATASET}",
                      f"--bigquery_endpoint={bigquery_emulator.endpoint}"),
            client_of(f"--local_store={path}"))


def comparable(page: str) -> str:
    """A page without what differs by source: its label, and the triage form (without --topic, a dashboard on
    BigQuery has nowhere to send actions: it says it is read-only instead)."""
    page = re.sub(r'<span class="source">.*?</span>', "", page, flags=re.S)
    page = re.sub(r'<form method="post".*?</form>', "", page, flags=re.S)
    page = page.replace('<p class="note">Read-only: this dashboard has no triage file or topic to write to.</p>', "")
    return re.sub(r"\s+", " ", page)


PATHS = ["/alerts", "/alerts?state=dismissed", "/alerts?state=open", "/alerts?kind=job_failed",
         "/alerts?" + urllib.parse.urlencode({"test": HOSTILE}), "/alerts?since=2025-11-23", "/alerts/0123abcd",
         "/tests", "/test?name=pt-small", "/test?" + urllib.parse.urlencode({"name": HOSTILE}),
         "/run?test=pt-small&run=r5", "/run?test=pt-small&run=r2", "/dead-letters", "/dead-letters/d1",
         "/test?name=" + urllib.parse.quote("' OR '1'='1")]


@pytest.mark.parametrize("path", PATHS)
def test_bigquery_pages_are_the_duckdb_pages(stores, path):
    bigquery, duckdb = stores
    from_bigquery, from_duckdb = bigquery.get(path), duckdb.get(path)
    assert from_bigquery.status_code == from_duckdb.status_code == (404 if "OR" in path else 200)
    assert comparable(from_bigquery.text) == comparable(from_duckdb.text)


def test_parameters_are_spelled_the_bigquery_way():
    assert bigquery_sql("WHERE `test_name` = $test AND `run_id` IN ($run0, $run1)") == (
        "WHERE `test_name` = @test AND `run_id` IN (@run0, @run1)")
