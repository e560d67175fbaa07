"""A seed that cannot be read stops the launch, or the job, with one line; it never holds the job silently.

Every step of the streaming job waits for the start-up seed, and Dataflow retries a failed streaming step for
ever. So the launch tries the seed's queries first (a dry run of each and a read of one row of each table,
``sinks.bigquery.check_seed``), and in the job the seed step tries a bounded number of times and then cancels
its own Dataflow job through the Dataflow API (the real client, against a local server standing in for it).
"""

from __future__ import annotations

import http.server
import json
import threading

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from google.cloud import bigquery
from google.cloud.dataflow_v1beta3 import JobState

from core.config import load_config_dir
from core.schema import JOB_HISTORY
from pipeline.main import main
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.runners import local_batch_runner
from sinks.bigquery import BigQueryStore, BigQueryTarget, ReadSeedFromBigQuery, SeedPolicy, check_seed, ensure_tables
from sinks.dataflow_job import JOB_ID_VARIABLE, DataflowJob
from sinks.seed import SeedReadError
from tests.sinks.test_seed_reads import BlackHole, FlakyProxy, ended_row

CONFIGS = load_config_dir(DEFAULT_CONFIG_DIR)


class _DataflowApi(http.server.ThreadingHTTPServer):
    """The Dataflow API's job update (``PUT .../jobs/<id>``), recording each request's path and body."""

    def __init__(self):
        self.requests = []
        super().__init__(("127.0.0.1", 0), _DataflowHandler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info):
        self.shutdown()
        self.server_close()


class _DataflowHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_PUT(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append((self.path.split("?")[0], body))
        reply = json.dumps({"id": self.path.split("?")[0].rsplit("/", 1)[-1],
                            "currentState": "JOB_STATE_RUNNING", "requestedState": body.get("requestedState")})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())


def test_the_launch_check_passes_on_readable_tables_and_names_the_table_it_cannot_query(bigquery_emulator):
    target = BigQueryTarget(bigquery_emulator.project, "checked", bigquery_emulator.endpoint)
    ensure_tables(target)
    assert check_seed(target, CONFIGS, 30.0) >= 0
    client = bigquery_emulator.client()
    client.create_dataset("no_tables", exists_ok=True)
    with pytest.raises(SeedReadError) as raised:
        check_seed(BigQueryTarget(bigquery_emulator.project, "no_tables", bigquery_emulator.endpoint), CONFIGS, 30.0)
    message = str(raised.value)
    assert message.startswith(f"cannot read the history seed: the dry run of the query of {bigquery_emulator.project}"
                              ".no_tables."), message
    assert "\n" not in message


def test_a_launch_against_a_table_the_seed_cannot_query_stops_with_one_line_before_the_job_starts(
        bigquery_emulator, capsys):
    dataset = "broken_job_history"
    target = BigQueryTarget(bigquery_emulator.project, dataset, bigquery_emulator.endpoint)
    client = bigquery_emulator.client()
    client.create_dataset(dataset, exists_ok=True)
    # processed_at as a STRING: an old hand-made table; the launch adds missing columns, it cannot change a type
    client.create_table(bigquery.Table(target.table_id(JOB_HISTORY), schema=[
        bigquery.SchemaField(name, "STRING") for name in ("run_id", "test_name", "job_status", "processed_at")]))
    code = main(["--streaming", f"--input_subscription=projects/{bigquery_emulator.project}/subscriptions/s",
                 f"--bigquery_project={bigquery_emulator.project}", f"--bigquery_dataset={dataset}",
                 f"--bigquery_endpoint={bigquery_emulator.endpoint}", "--seed_timeout_seconds=30"])
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainguard: error: cannot read the history seed: the dry run of "
                                                   f"the query of {target.table_id(JOB_HISTORY)}"), err


def test_a_seed_that_never_answers_cancels_its_dataflow_job_after_its_attempts(monkeypatch, caplog):
    monkeypatch.setenv(JOB_ID_VARIABLE, "2026-11-26_04_00_00-123")
    with _DataflowApi() as api, BlackHole() as hole:
        policy = SeedPolicy(timeout_seconds=1.0, attempts=2, retry_wait_seconds=0.25,
                            job=DataflowJob("my-project", "us-central1", api.endpoint))
        with pytest.raises(Exception) as raised, beam.Pipeline(runner=local_batch_runner()) as pipeline:
            _ = pipeline | ReadSeedFromBigQuery(BigQueryTarget("test-project", "silent", hole.endpoint), CONFIGS,
                                                policy)
        requests = list(api.requests)
    logged = [record.getMessage() for record in caplog.records if record.name.startswith("sinks.")]
    assert any(line.endswith("(attempt 1 of 2; trying again in 0.25 s)") for line in logged), logged
    assert any(line.endswith("cancelling Dataflow job 2026-11-26_04_00_00-123") for line in logged), logged
    message = str(raised.value)
    assert "cannot read the history seed: the query of test-project.silent." in message
    assert "(attempt 2 of 2); Dataflow job 2026-11-26_04_00_00-123 cancelled" in message
    assert requests == [("/v1b3/projects/my-project/locations/us-central1/jobs/2026-11-26_04_00_00-123",
                         {"requestedState": JobState.JOB_STATE_CANCELLED.value})]  # REST: enums as numbers


def test_off_dataflow_the_seed_step_fails_with_the_reason_and_cancels_nothing(monkeypatch):
    monkeypatch.delenv(JOB_ID_VARIABLE, raising=False)
    with _DataflowApi() as api, BlackHole() as hole:
        policy = SeedPolicy(timeout_seconds=1.0, attempts=1, job=DataflowJob("p", "r", api.endpoint))
        with pytest.raises(Exception) as raised, beam.Pipeline(runner=local_batch_runner()) as pipeline:
            _ = pipeline | ReadSeedFromBigQuery(BigQueryTarget("test-project", "silent", hole.endpoint), CONFIGS,
                                                policy)
        assert api.requests == []
    assert "(attempt 1 of 1)" in str(raised.value) and "cancelled" not in str(raised.value)


def test_a_failed_attempt_is_tried_again_and_gives_the_same_seed(bigquery_emulator, monkeypatch):
    monkeypatch.setenv(JOB_ID_VARIABLE, "job-1")
    target = BigQueryTarget(bigquery_emulator.project, "tried_again", bigquery_emulator.endpoint)
    ensure_tables(target)
    rows = [ended_row("t", "a", "success", 1), ended_row("t", "b", "failure", 2)]
    assert bigquery_emulator.client().insert_rows_json(target.table_id(JOB_HISTORY), rows) == []
    direct = BigQueryStore(target).read_seed(CONFIGS)
    proxy = FlakyProxy(bigquery_emulator.endpoint, failures=1, status=400)  # not retried by the client
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with _DataflowApi() as api:
            policy = SeedPolicy(timeout_seconds=60.0, attempts=2, retry_wait_seconds=0.0,
                                job=DataflowJob("p", "r", api.endpoint))
            with beam.Pipeline(runner=local_batch_runner()) as pipeline:
                seeds = pipeline | ReadSeedFromBigQuery(
                    BigQueryTarget(target.project, target.dataset, proxy.endpoint), CONFIGS, policy)
                assert_that(seeds | beam.Map(lambda seed: seed == direct), equal_to([True]))
            assert api.requests == []
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert proxy.failed == 1


def test_the_job_to_cancel_comes_from_the_launch_options():
    assert DataflowJob.from_options(PipelineOptions(["--project=p", "--region=europe-west1"])) == DataflowJob(
        "p", "europe-west1", "https://dataflow.googleapis.com")
    assert DataflowJob.from_options(PipelineOptions([])) is None
