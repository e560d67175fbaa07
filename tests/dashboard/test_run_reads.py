"""A run's rows are read through the local store's index on ``run_id``, and give the rows a plain read gives.

A store written in time order (as the pipeline writes it) has a test's rows in every block of a table, so without
the index a run page scans the whole of ``metric_history`` (on the benchmark's store of 2 million values: 11 ms a
read instead of 2).
"""

from __future__ import annotations

import dataclasses

import duckdb

from core.schema import LOCAL_TABLES
from dashboard import queries
from dashboard.store import DuckDBSource, Reader
from sinks.duckdb_store import DuckDBStore
from tests.report.test_report import job_row


def indexes(path) -> set:
    with duckdb.connect(str(path), read_only=True) as connection:
        return {(t, i) for t, i in connection.execute("SELECT table_name, index_name FROM duckdb_indexes()").fetchall()}


def test_the_store_indexes_run_ids_and_an_older_store_gets_the_index(tmp_path):
    path = tmp_path / "store.duckdb"
    store = DuckDBStore(str(path))
    store.ensure_schema()
    store.close()
    wanted = {(t.name, f"{t.name}_by_{c}") for t in LOCAL_TABLES.values() for c in t.looked_up_by}
    assert {"job_history", "metric_history", "alerts", "rank_metrics"} == {t for t, _ in wanted}
    assert indexes(path) == wanted
    with duckdb.connect(str(path)) as connection:  # a store written before the index
        for _, index in wanted:
            connection.execute(f'DROP INDEX "{index}"')
    assert indexes(path) == set()
    store = DuckDBStore(str(path))
    store.ensure_schema()
    store.ensure_schema()
    row = job_row("t", "r1", 0, "success")
    assert store.insert(LOCAL_TABLES["job_history"], [row, {**row, "run_id": "r2"}]) == 2
    assert store.insert(LOCAL_TABLES["job_history"], [{**row, "job_status": "failure"}]) == 0  # its key is taken
    store.close()
    assert indexes(path) == wanted


def recording(reader: Reader, log: list) -> Reader:
    def run(sql, params):
        log.append((sql, dict(params)))
        return reader.run(sql, params)
    return dataclasses.replace(reader, run=run)


def test_a_run_s_rows_are_read_through_the_index_and_equal_a_plain_read(demo_store):
    with duckdb.connect(str(demo_store), read_only=True) as connection:
        (test, run), *_ = connection.execute(
            "SELECT test_name, run_id FROM alerts GROUP BY ALL ORDER BY COUNT(*) DESC, 1, 2").fetchall()
        runs = [r for (r,) in connection.execute("SELECT run_id FROM job_history WHERE test_name = ? "
                                                 "ORDER BY timestamp DESC LIMIT 3", [test]).fetchall()]
    source = DuckDBSource(str(demo_store))

    def reads(reader: Reader) -> list:
        jobs = queries.job_rows(reader, test, run)
        span = queries.run_span(jobs, None)
        return [jobs, queries.metrics_of_run(reader, test, run, span), queries.ranks_of_run(reader, test, run, span),
                queries.alerts_of_runs(reader, test, [run], span=span), queries.alerts_of_runs(reader, test, runs)]

    log: list = []
    with source.reader() as reader:
        assert reader.runs_indexed
        indexed = reads(recording(reader, log))
        plain = reads(dataclasses.replace(reader, runs_indexed=False))
        assert indexed == plain
        assert indexed[0] and indexed[1] and indexed[3]
        plans = [reader.query("EXPLAIN ANALYZE " + sql, params)[0][1] for sql, params in log]
    source.connection.close()
    assert len(plans) == 5 and indexed[2] == []  # the demo has no distributed run: no rank_metrics row to scan
    for plan, (sql, _), rows in zip(plans, log, indexed):
        assert plan.count("Index Scan") == (sql.count("OFFSET 0") if rows else 0), sql
    assert [sql.count("OFFSET 0") for sql, _ in log] == [1, 1, 1, 1, len(runs)]
