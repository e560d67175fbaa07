"""The start-up seed (BigQuery through bqemulator, and DuckDB): interrupted runs, time bounds, retries, one clear line.

The seed's queries run at once, each bounded by ``--seed_timeout_seconds`` with transient errors retried; a query
that fails or never answers stops the start-up with one line naming its table.
"""

import gc
import http.client
import http.server
import json
import socket
import threading
import time
import urllib.parse

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core import encoding
from core.config import load_config_dir
from core.parse import summarize
from core.records import job_history_row
from core.runs import RunAccumulator, RunLifecycle, interrupt
from core.schema import JOB_HISTORY, TABLES
from pipeline.main import checked_argv, main
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.runners import local_batch_runner
from pipeline.streaming import StreamingJobConfig, UsageError
from report.source import SqlReportSource
from sinks.bigquery import BigQueryStore, BigQueryTarget, ReadSeedFromBigQuery, SeedPolicy, ensure_tables
from sinks.duckdb_store import DuckDBStore
from sinks.seed import SEED_TIMEOUT_SECONDS, SeedReadError, read_history_seed, read_job_rows
from sinks.stores import DUCKDB_SQL
from tests.support import T0
from tests.transforms.support import configs
from trainguard import wire

CONFIGS = load_config_dir(DEFAULT_CONFIG_DIR)


def interrupted_row(test, run, drained_at, points):
    """The job_history row a drained job writes for an open run holding ``points`` (value, time) of tag acc."""
    accumulator = RunAccumulator(test, run)
    for i, (value, at) in enumerate(points):
        accumulator.add(summarize(wire.Message(f"{run}-{i}", test, run, (("acc", value, i, at),), ()), b"",
                                  configs().for_test(test)))
    lifecycle = RunLifecycle()
    result = interrupt(accumulator.result(configs().for_test(test), lifecycle), drained_at, encoding.to_text(accumulator))
    return job_history_row(result), accumulator


def ended_row(test, run, status, at):
    return {"run_id": run, "test_name": test, "job_status": status, "num_failures": 0,
            "start_time": None, "timestamp": f"2025-11-20T0{at}:00:00.000000Z", "job_duration_sec": None,
            "processed_at": f"2025-11-20T0{at}:01:00.000000Z", "events": "[]"}


def test_interrupted_runs_come_back_as_open_runs_until_a_job_ends_them(bigquery_emulator):
    target = BigQueryTarget(bigquery_emulator.project, "interrupted", bigquery_emulator.endpoint)
    ensure_tables(target)
    open_row, open_state = interrupted_row("t", "open", T0 + 100, [(1.0, T0 + 10)])
    older, _ = interrupted_row("t", "twice", T0 + 100, [(1.0, T0 + 10)])
    newer, newer_state = interrupted_row("t", "twice", T0 + 900, [(1.0, T0 + 10), (2.0, T0 + 800)])
    ended_interrupted, _ = interrupted_row("t", "ended", T0 + 100, [(1.0, T0 + 10)])
    rows = [open_row, older, newer, ended_interrupted, ended_row("t", "ended", "success", 5),
            ended_row("t", "before", "failure", 1)]
    assert bigquery_emulator.client().insert_rows_json(target.table_id(JOB_HISTORY), rows) == []

    seed = BigQueryStore(target).read_seed(CONFIGS)
    assert {key: run.to_state() for key, run in seed.open_runs.items()} == {
        ("t", "open"): open_state.to_state(), ("t", "twice"): newer_state.to_state()}  # the latest drain's state
    assert seed.stored_runs == {("t", "ended"), ("t", "before")}  # an interrupted row is not an end
    assert seed.jobs["t"].last_status == "success"


class BlackHole:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""

    def __enter__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        return self

    def __exit__(self, *exc_info):
        self.socket.close()


def test_a_seed_query_that_never_answers_fails_within_its_bound_naming_the_table():
    with BlackHole() as hole:
        target = BigQueryTarget("test-project", "silent", hole.endpoint)
        started = time.monotonic()
        with pytest.raises(SeedReadError) as raised:
            BigQueryStore(target, timeout_seconds=1.0).read_seed(CONFIGS)
        took = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith("cannot read the history seed: the query of test-project.silent.")
    assert any(f"test-project.silent.{name} " in message for name in TABLES), message
    # our bound, or the client's retries giving up at the same bound first
    assert (message.endswith("did not answer within 1 s (--seed_timeout_seconds)")
            or "failed: RetryError: Timeout of 1.0s exceeded" in message), message
    assert "\n" not in message
    assert took < 5.0, took


def test_the_streaming_jobs_seed_step_fails_with_that_line():
    # pytest.raises(Exception): whatever the runner wraps the seed step's error in
    with BlackHole() as hole, pytest.raises(Exception) as raised, beam.Pipeline(runner=local_batch_runner()) as p:
        _ = p | ReadSeedFromBigQuery(BigQueryTarget("test-project", "silent", hole.endpoint), CONFIGS,
                                     SeedPolicy(timeout_seconds=1.0, attempts=1))
    assert "cannot read the history seed: the query of test-project.silent." in str(raised.value)


def test_a_table_bigquery_does_not_have_fails_at_once_with_its_error(bigquery_emulator):
    client = bigquery_emulator.client()
    client.create_dataset("no_tables", exists_ok=True)
    started = time.monotonic()
    with pytest.raises(SeedReadError) as raised:
        BigQueryStore(BigQueryTarget(bigquery_emulator.project, "no_tables", bigquery_emulator.endpoint),
                      timeout_seconds=60.0).read_seed(CONFIGS)
    assert time.monotonic() - started < 30.0  # not retried until the bound: retrying cannot mend it
    assert str(raised.value).startswith(f"cannot read the history seed: the query of {bigquery_emulator.project}"
                                        ".no_tables.")
    assert " failed: " in str(raised.value)


class FlakyProxy(http.server.ThreadingHTTPServer):
    """Forwards requests to ``upstream``, but answers the first ``failures`` with ``status`` (503 Service
    Unavailable, which the client retries; 400 Bad Request, which it does not)."""

    def __init__(self, upstream: str, failures: int, status: int = 503):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.failures = failures
        self.status = status
        self.failed = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _forward(self):
        server = self.server
        with server.lock:
            fail = server.failed < server.failures
            server.failed += fail
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if fail:
            reason = "backendError" if server.status >= 500 else "invalidQuery"
            reply = json.dumps({"error": {"code": server.status, "message": "try again",
                                          "errors": [{"reason": reason}]}}).encode()
            self.send_response(server.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            return
        connection = http.client.HTTPConnection(server.upstream.hostname, server.upstream.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        connection.request(self.command, self.path, body=body or None, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        connection.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815 - http.server's names


def test_transient_errors_are_retried_and_the_seed_is_the_same(bigquery_emulator):
    target = BigQueryTarget(bigquery_emulator.project, "flaky", bigquery_emulator.endpoint)
    ensure_tables(target)
    rows = [ended_row("t", "a", "success", 1), ended_row("t", "b", "failure", 2)]
    assert bigquery_emulator.client().insert_rows_json(target.table_id(JOB_HISTORY), rows) == []
    direct = BigQueryStore(target).read_seed(CONFIGS)
    proxy = FlakyProxy(bigquery_emulator.endpoint, failures=3)
    serving = threading.Thread(target=proxy.serve_forever, daemon=True)
    serving.start()
    try:
        through = BigQueryStore(BigQueryTarget(target.project, target.dataset, proxy.endpoint),
                                timeout_seconds=60.0).read_seed(CONFIGS)
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert proxy.failed == 3
    assert through == direct and direct.stored_runs == {("t", "a"), ("t", "b")}


def test_the_seed_timeout_option_is_checked_and_has_a_default(capsys):
    base = ["--streaming", "--input_subscription=projects/test-project/subscriptions/s", "--bigquery_dataset=d",
            "--project=test-project"]
    assert StreamingJobConfig.from_options(PipelineOptions(base)).seed_timeout_seconds == SEED_TIMEOUT_SECONDS
    dashed = checked_argv(base + ["--seed-timeout-seconds=7.5"])
    assert StreamingJobConfig.from_options(PipelineOptions(dashed)).seed_timeout_seconds == 7.5
    with pytest.raises(UsageError, match="--seed_timeout_seconds=0: must be more than 0"):
        StreamingJobConfig.from_options(PipelineOptions(base + ["--seed_timeout_seconds=0"]))
    assert main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--seed_timeout_seconds SEED_TIMEOUT_SECONDS" in help_text
    assert f"(default: {SEED_TIMEOUT_SECONDS:g})" in help_text or f"(default: {SEED_TIMEOUT_SECONDS})" in help_text


def test_every_reader_of_a_store_leaves_an_interrupted_row_out_of_the_runs_that_ended(tmp_path):
    store = DuckDBStore(str(tmp_path / "store.duckdb"))
    store.ensure_schema()
    row, state = interrupted_row("t", "open", T0 + 100, [(1.0, T0 + 10)])
    store.insert(JOB_HISTORY, [row, ended_row("t", "done", "success", 1)])
    assert [job.run for job in read_job_rows(store.query, DUCKDB_SQL)] == ["done"]
    assert [job.run for job in SqlReportSource(store.query, DUCKDB_SQL).jobs()] == ["done"]  # "open": still running
    seed = store.read_seed(CONFIGS)
    assert seed.stored_runs == {("t", "done")} and list(seed.open_runs) == [("t", "open")]
    assert seed.open_runs[("t", "open")].to_state() == state.to_state()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_seed_is_read_with_the_collector_paused_and_left_as_it_was(tmp_path, enabled):
    """A seed is many objects that live on and no cycles: the collector's passes over them while they are made
    cost 40% of the read. It is paused while its rows are queried and built, and then as it was, a failed read
    too."""
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    store.ensure_schema()
    store.insert(JOB_HISTORY, [ended_row("t", "r1", "success", 5)])
    seen = []

    def query(sql, *args, **kwargs):
        seen.append(gc.isenabled())
        return store.query(sql, *args, **kwargs)

    def failing(sql, *args, **kwargs):
        raise RuntimeError("gone")

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert read_history_seed(CONFIGS, query, DUCKDB_SQL).jobs.keys() == {"t"}
        assert seen and not any(seen)
        assert gc.isenabled() is enabled
        with pytest.raises(SeedReadError):
            read_history_seed(CONFIGS, failing, DUCKDB_SQL)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
