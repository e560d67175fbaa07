"""The BigQuery store against bqemulator: tables, writes with rejected rows, and the start-up seed."""

import datetime
import json
import pickle

import apache_beam as beam
from apache_beam.coders import RowCoder
from apache_beam.io.gcp import bigquery_tools
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.typehints.schemas import schema_from_element_type
from apache_beam.utils.timestamp import Timestamp

from core.config import load_config_dir
from core.records import dead_letter_row
from core.schema import DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY, TABLES
from pipeline.main import main
from pipeline.options import DEFAULT_CONFIG_DIR, DEMO_INPUT
from pipeline.runners import local_batch_runner
from sinks.bigquery import (
    BigQueryStore,
    BigQueryTarget,
    EndpointClient,
    WriteToBigQueryTables,
    ensure_tables,
    rejected_row_to_dead_letter,
    storage_write_row,
)
from sinks.bigquery_schema import schema_json
from sinks.duckdb_store import DuckDBStore

# The API may answer with the legacy names of standard SQL types.
_LEGACY_TYPES = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}

JOB = {"run_id": "r1", "test_name": "t", "job_status": "success", "num_failures": 0,
       "start_time": "2025-11-20T00:00:00.000000Z", "timestamp": "2025-11-20T01:00:00.000000Z",
       "job_duration_sec": 3600.0, "processed_at": "2025-11-20T01:01:00.000000Z", "events": "[]"}


def target(emulator, dataset):
    return BigQueryTarget(emulator.project, dataset, emulator.endpoint)


def test_tables_are_created_once_from_the_shared_schema(bigquery_emulator):
    tables = target(bigquery_emulator, "created")
    assert sorted(ensure_tables(tables)) == sorted(TABLES)
    assert ensure_tables(tables) == []  # idempotent: existing tables are left alone
    client = bigquery_emulator.client()
    for table in TABLES.values():
        got = client.get_table(tables.table_id(table))
        assert [(f.name, _LEGACY_TYPES.get(f.field_type, f.field_type), f.mode) for f in got.schema] == \
            [(f["name"], f["type"], f["mode"]) for f in schema_json(table)]
        assert (got.time_partitioning.type_, got.time_partitioning.field) == ("DAY", table.time_column)
        assert got.clustering_fields == list(table.cluster_by)


def test_rows_bigquery_rejects_go_to_dead_letter_with_its_error(bigquery_emulator):
    tables = target(bigquery_emulator, "rejects")
    ensure_tables(tables)
    bad = dict(JOB, run_id="r2", timestamp="the day before yesterday")
    graph_dead_letter = dead_letter_row("invalid message: not JSON", b"{oops", "test", None)
    with beam.Pipeline(runner=local_batch_runner()) as p:
        outputs = {JOB_HISTORY.name: p | "Jobs" >> beam.Create([JOB, bad]),
                   DEAD_LETTER.name: p | "DeadLetters" >> beam.Create([graph_dead_letter])}
        outputs | WriteToBigQueryTables(tables)

    store = BigQueryStore(tables)
    assert store.query(f"SELECT run_id FROM `{tables.table_id(JOB_HISTORY)}`") == [("r1",)]
    dead = {row[0]: row[1:] for row in store.query(
        f"SELECT source, reason, payload, received_at FROM `{tables.table_id(DEAD_LETTER)}`")}
    assert dead["test"] == ("invalid message: not JSON", "{oops", None)
    reason, payload, received_at = dead["bigquery:job_history"]
    assert reason.startswith("rejected by BigQuery (job_history): invalid")
    assert json.loads(payload) == bad and received_at is None


def test_seed_from_bigquery_is_the_seed_from_duckdb(tmp_path, bigquery_emulator):
    store_path = tmp_path / "demo.duckdb"
    assert main([f"--input_files={DEMO_INPUT}", f"--local_store={store_path}",
                 f"--alerts_file={tmp_path / 'alerts.jsonl'}"]) == 0
    duckdb_store = DuckDBStore(str(store_path))
    tables = target(bigquery_emulator, "seeded")
    ensure_tables(tables)
    client = bigquery_emulator.client()
    for table in TABLES.values():
        rows = [dict(zip(table.column_names, (v.isoformat() if isinstance(v, datetime.datetime) else v
                                              for v in row)))
                for row in duckdb_store.query(f'SELECT {", ".join(table.column_names)} FROM "{table.name}"')]
        if rows:
            assert client.insert_rows_json(tables.table_id(table), rows) == []

    configs = load_config_dir(DEFAULT_CONFIG_DIR)
    expected = duckdb_store.read_seed(configs)
    assert expected.metrics and expected.jobs and expected.stored_runs and expected.windows
    assert BigQueryStore(tables).read_seed(configs) == expected


def test_rows_for_the_storage_write_api_carry_timestamps():
    row = storage_write_row(dict(JOB, start_time=None, timestamp="not a time"), JOB_HISTORY)
    assert row["processed_at"] == Timestamp.from_rfc3339("2025-11-20T01:01:00.000000Z")
    assert row["start_time"] is None and row["timestamp"] == "not a time" and row["run_id"] == "r1"


def test_rows_for_the_storage_write_api_encode_as_the_beam_rows_it_sends():
    """What WriteToBigQuery(method=STORAGE_WRITE_API) does to each row before the Java transform."""
    metric = {"run_id": "r1", "test_name": "t", "metric_name": "acc_final", "metric_value": 0.5,
              "metric_lower_bound": None, "metric_upper_bound": 0.9, "within_bounds": True,
              "timestamp": "2025-11-20T01:00:00.000000Z", "step": None}
    for table, row in ((JOB_HISTORY, JOB), (METRIC_HISTORY, metric)):
        schema = bigquery_tools.get_bq_tableschema({"fields": schema_json(table)})
        row_type = RowTypeConstraint.from_fields(bigquery_tools.get_beam_typehints_from_tableschema(schema))
        coder = RowCoder(schema_from_element_type(row_type))
        beam_row = bigquery_tools.beam_row_from_dict(storage_write_row(row, table), schema)
        assert coder.decode(coder.encode(beam_row))._asdict() == beam_row._asdict()


def test_rejections_of_both_write_methods_become_dead_letters():
    streaming = rejected_row_to_dead_letter(
        ("p:d.job_history", JOB, [{"reason": "invalid", "location": "timestamp", "message": "bad"}]), JOB_HISTORY)
    assert streaming["reason"] == "rejected by BigQuery (job_history): invalid at timestamp: bad"
    assert json.loads(streaming["payload"]) == JOB and streaming["source"] == "bigquery:job_history"
    storage = rejected_row_to_dead_letter(
        {"failed_row": storage_write_row(JOB, JOB_HISTORY), "error_message": "row too large"}, JOB_HISTORY)
    assert storage["reason"] == "rejected by BigQuery (job_history): row too large"
    assert json.loads(storage["payload"])["processed_at"].startswith("2025-11-20T01:01:00")


def test_endpoint_client_pickles_without_its_connection():
    client = EndpointClient(BigQueryTarget("test-project", "d", "http://127.0.0.1:1"))
    assert client.project == "test-project"  # builds the real client on first use
    clone = pickle.loads(pickle.dumps(client))
    assert clone.project == "test-project"
    assert BigQueryTarget("p", "d").beam_test_client() is None  # Google's endpoint: Beam's own client
