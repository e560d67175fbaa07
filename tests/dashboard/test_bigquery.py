"""The dashboard on a BigQuery dataset (the emulator the suite uses) renders what it renders on the same rows in a
DuckDB store: the same queries, parameters bound the BigQuery way."""

from __future__ import annotations

import logging
import re
import time
import urllib.parse

import pytest

from core.alert_record import epoch_seconds
from core.schema import ALERTS, DEAD_LETTER, TABLES
from dashboard.store import bigquery_sql
from sinks.bigquery import BigQueryTarget, ensure_tables
from sinks.duckdb_store import DuckDBStore
from tests.dashboard.conftest import client_of
from tests.report.test_report import DAY, HOSTILE, alert_row, iso, small_store_rows

DATASET = "dashboard_pages"


def rows():
    tables = small_store_rows()
    tables[ALERTS] = tables[ALERTS] + [{**alert_row("pt-small", "r5", 5, "metric_out_of_bounds", "m_lower",
                                                    "m_lower = 1 is outside bounds", {"previous_value": 3.0}),
                                        "alert_id": "0123abcd"}]
    tables[DEAD_LETTER] = [{"received_at": "2025-11-20T00:00:00+00:00", "reason": "invalid message: not JSON",
                            "payload": "{oops <script>", "source": "files", "dead_letter_id": "d1"}]
    return tables


def dashboard_of(emulator, dataset):
    """A client of a dashboard on a dataset of the emulator."""
    return client_of(f"--bigquery_project={emulator.project}", f"--bigquery_dataset={dataset}",
                     f"--bigquery_endpoint={emulator.endpoint}")


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
    return dashboard_of(bigquery_emulator, DATASET), client_of(f"--local_store={path}")


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


# ---- Partition pruning: the alert list, an alert's page and a run's page bound each table's partition column ----

RECENT = "dashboard_recent"
PARTITIONED = {t.name: t.time_column for t in TABLES.values()}
# Reads that cannot know a time: the time of the alert of a URL (by its id: two narrow columns), the run of a URL
# (the rows that give the run's times), the triage actions (every one counts, and they are few).
UNBOUNDED = {("alerts", "alert_id"): {"created_at"}, ("job_history", "run_id"): None, ("triage", "test_name"): None}


def unbounded(table, compared, selected) -> bool:
    """Whether a read is one of ``UNBOUNDED`` (reading no more columns than it says)."""
    return any((table, key) in UNBOUNDED and UNBOUNDED[(table, key)] in (None, selected) for key in compared)


def recent_rows(now):
    """The small store's rows moved so that its newest day is yesterday, and 560 more alerts of its last 24 days (a
    batch of the state filter within the list's first look-back)."""
    tables = rows()
    shift = round(now - DAY - max(epoch_seconds(r["created_at"]) for r in tables[ALERTS]))
    moved = {}
    for table, table_rows in tables.items():
        times = [c.name for c in table.columns if c.type == "TIMESTAMP"]
        moved[table] = [{k: iso(epoch_seconds(v) + shift) if k in times and v is not None else v
                         for k, v in r.items()} for r in table_rows]
    moved[ALERTS] += [{**alert_row("pt-small", "r6", 0, "metric_out_of_bounds", "m_lower", f"alert {i}", {}),
                       "alert_id": f"recent-{i:03d}", "created_at": iso(now - DAY - i * 3600)} for i in range(560)]
    return moved


@pytest.fixture(scope="module")
def recent(bigquery_emulator, tmp_path_factory):
    """The same recent rows in a DuckDB store and in BigQuery tables made as the pipeline makes them (partitioned
    by day on their time column, clustered)."""
    # Whole seconds: DuckDB's epoch() and BigQuery's UNIX_MICROS / 1e6 can differ in the last bit of a time with a
    # fraction of a second (the charts' times would then differ in their 17th digit).
    now = float(int(time.time()))
    tables = recent_rows(now)
    target = BigQueryTarget(bigquery_emulator.project, RECENT, bigquery_emulator.endpoint)
    ensure_tables(target)
    client = bigquery_emulator.client()
    assert client.get_table(target.table_id(ALERTS)).time_partitioning.field == "created_at"
    path = tmp_path_factory.mktemp("dash-bq-recent") / "recent.duckdb"
    local = DuckDBStore(str(path))
    local.ensure_schema()
    for table, table_rows in tables.items():
        if table_rows:
            assert client.insert_rows_json(target.table_id(table), table_rows) == []
            local.insert(table, table_rows)
    local.close()
    return dashboard_of(bigquery_emulator, RECENT), client_of(f"--local_store={path}"), tables


def conjuncts(condition):
    import sqlglot.expressions as exp

    if isinstance(condition, exp.Paren):
        return conjuncts(condition.this)
    if isinstance(condition, exp.And):
        return conjuncts(condition.left) + conjuncts(condition.right)
    return [condition]


def partition_bounds(sql):
    """(table, the partition column's bounds ">=" / "<=" / "=" the WHERE clause ANDs in, columns compared, columns
    selected) per SELECT of a table in ``sql``."""
    import sqlglot
    import sqlglot.expressions as exp

    found = []
    for select in sqlglot.parse_one(sql, read="bigquery").find_all(exp.Select):
        source = select.args.get("from_") or select.args.get("from")  # its name in sqlglot 30 / older
        table = source.find(exp.Table) if source is not None else None
        selected = {c.name for e in select.expressions for c in e.find_all(exp.Column)}
        if table is None or select.args.get("where") is None:
            found.append((table.name if table else None, set(), set(), selected))
            continue
        column, ops, compared = PARTITIONED.get(table.name), set(), set()
        for c in conjuncts(select.args["where"].this):
            if isinstance(c, (exp.GTE, exp.LTE, exp.EQ, exp.In)) and isinstance(c.this, exp.Column):
                compared.add(c.this.name)
                if c.this.name == column:
                    ops.add({exp.GTE: ">=", exp.LTE: "<=", exp.EQ: "="}[type(c)])
        found.append((table.name, ops, compared, selected))
    return found


def recent_paths():
    return ["/alerts", "/alerts?page=2", "/alerts?" + urllib.parse.urlencode({"test": "pt-small"}),
            "/alerts?state=open", "/alerts/0123abcd",
            "/alerts/recent-003", "/run?test=pt-small&run=r5", "/run?test=pt-small&run=r2"]


def test_on_recent_rows_the_pages_are_the_same_and_bound_every_partition_column(recent, caplog):
    """Each query of the alert list, an alert's page and a run's page that can know a time bounds the partition
    column of its table (BigQuery then reads only those days), and the pages are the same as DuckDB's."""
    bigquery, duckdb, _ = recent
    for path in recent_paths():
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="dashboard.store"):
            from_bigquery = bigquery.get(path)
        assert from_bigquery.status_code == 200, path
        assert comparable(from_bigquery.text) == comparable(duckdb.get(path).text), path
        queries = [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.getMessage().startswith("BigQuery")]
        assert queries, path
        listing = path == "/alerts" or path.startswith("/alerts?")
        for sql in queries:
            for table, ops, compared, selected in partition_bounds(sql):
                if unbounded(table, compared, selected):
                    continue
                # the list: a look-back (from a day on, open at the end); an alert's or a run's rows: a closed span
                assert ops >= ({">="} if listing else {">=", "<="}), (path, sql)


def test_the_alert_list_reads_one_look_back_when_it_holds_the_page(recent, bigquery_emulator, caplog):
    # A dashboard of its own: another would show the list it read in the last 5 s (BIGQUERY_CACHE_SECONDS) again.
    bigquery = dashboard_of(bigquery_emulator, RECENT)
    with caplog.at_level(logging.DEBUG, logger="dashboard.store"):
        assert "/alerts/recent-000" in bigquery.get("/alerts").text
    (listing,) = [r.getMessage() for r in caplog.records if "ORDER BY `created_at` DESC" in r.getMessage()]
    assert "`created_at` >= TIMESTAMP_MICROS" in listing


def test_an_old_page_reads_wider_look_backs_and_misses_nothing(stores):
    """The small store's alerts are over a year old: the look-backs hold none of them, and the list still shows
    every one (read from every day)."""
    bigquery, duckdb = stores
    listed = bigquery.get("/alerts").text
    assert listed.count('<a href="/alerts/') == duckdb.get("/alerts").text.count('<a href="/alerts/') == len(
        rows()[ALERTS])
