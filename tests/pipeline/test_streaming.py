"""End to end: Pub/Sub -> the streaming job on the local runner -> BigQuery (emulator) and the alerts topic.

Real clients everywhere: google-cloud-pubsub publishing to and pulling from
the in-process Pub/Sub server (with redelivery and reordering injected),
Beam's ReadFromPubSub / WriteToBigQuery / WriteToPubSub, google-cloud-bigquery
against bqemulator. The expected result is the local replay (``python -m
pipeline`` on a .jsonl file of the same payloads -> DuckDB): rows are
deterministic by design, so the two must be equal.

About time: the local runner's Pub/Sub watermark is the wall clock (not the
``ts`` attribute, as on Dataflow), so the published runs are placed a few
seconds in the future. Each job is first shown to be reading (a malformed
warm-up message is acked), then its runs are generated ``LEAD_SECONDS`` ahead,
published, and finalized as the clock passes their end + grace. The test
checks that every message was pulled before the first run could finalize;
otherwise the machine was too slow for the lead and the test says so.
"""

from __future__ import annotations

import datetime
import json
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple

import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.options.pipeline_options import PipelineOptions
from google.cloud import pubsub_v1

from core.parse import RawMessage
from core.schema import ALERTS, DEAD_LETTER, TABLES
from pipeline.main import main
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.streaming import StreamingJobConfig, UsageError, start_streaming, wait_until_interrupted
from scripts.publish_demo import publish
from sinks.alerts_file import alert_json
from sinks.bigquery import BigQueryStore, BigQueryTarget, bigquery_dialect
from sinks.duckdb_store import DUCKDB_SQL, DuckDBStore
from sinks.pubsub import alert_message
from tests.support import REPO_ROOT
from trainguard import wire
from transforms.runs import stored_run_reason
from transforms.sources import raw_from_pubsub

REPO = REPO_ROOT
# Event time of the first run's start, ahead of the wall clock when publishing: all of it is waited out. The
# job pulled a workload in at most 6 s on a 2-core machine at a load of 5 (since the streaming runner no longer
# works out DoFn specs at every bundle; 20 s before); the test fails, saying so, when it takes longer.
LEAD_SECONDS = 15.0
RUN_SPACING_SECONDS = 0.7
TIMING = ["--run_grace_seconds=1", "--run_timeout_seconds=3"]
WAIT_SECONDS = 120.0      # give up waiting for the pipeline's output after this long
BERT, JAX = "tf-bert-squad-v100", "jax-resnet50-failures-only"  # fixed thresholds; failures only


def run_payloads(test: str, run: str, start: float, accuracy: float = 75.0, throughput: float = 1200.0,
                 status: str = "success") -> List[bytes]:
    """One compact run: two messages of points (the first with run_started), then run_finished.

    ``status=None`` never finishes: the run is finalized as missing after the run timeout.
    """
    def points(step, at):
        return [wire.point_dict("Accuracy/test", accuracy * step / 10, at, step),
                wire.point_dict("throughput/examples_per_sec", throughput, at, step),
                wire.point_dict("loss", 1.0 / step, at, step)]

    payloads = [
        wire.encode_message(test, run, points(5, start + 0.1), [wire.event_dict(wire.RUN_STARTED, start)],
                            message_id=f"{run}/0"),
        wire.encode_message(test, run, points(10, start + 0.2), message_id=f"{run}/1")]
    if status is not None:
        payloads.append(wire.encode_message(test, run, events=[wire.event_dict(
            wire.RUN_FINISHED, start + 0.3, {"status": status, "num_failures": 0})], message_id=f"{run}/2"))
    return payloads


def workload(start: float, first_index: int, stories: List[Dict]) -> List[bytes]:
    """Runs of both tests, one every RUN_SPACING_SECONDS, shuffled, with some payloads published twice."""
    payloads = []
    for offset, story in enumerate(stories):
        index = first_index + offset
        at = start + offset * RUN_SPACING_SECONDS
        payloads += run_payloads(BERT, f"bert-{index:02d}", at, **story.get(BERT, {}))
        payloads += run_payloads(JAX, f"jax-{index:02d}", at + RUN_SPACING_SECONDS / 2, **story.get(JAX, {}))
    rng = random.Random(first_index)
    payloads += rng.sample(payloads, 4)  # publisher retries: same payload, new Pub/Sub message id
    rng.shuffle(payloads)
    return payloads


# Stories per run index. The second job's first JAX run fails after the first job's last one succeeded:
# no alert ("alert after the second failure in a row"), which the job only knows from the BigQuery tables
# (with no history at all, a first failure alerts).
FIRST_JOB = [{}, {BERT: {"throughput": 600.0}, JAX: {"status": "failure"}}, {JAX: {"status": "timeout"}}, {}]
SECOND_JOB = [{BERT: {"accuracy": 60.0}, JAX: {"status": "failure"}},
              {BERT: {"status": None}, JAX: {"status": "failure"}}, {}, {}]


class AlertCollector:
    """Pulls the alerts topic with the real subscriber client (streaming pull), acking each message."""

    def __init__(self, subscription: str):
        self.messages: Dict[str, pubsub_v1.subscriber.message.Message] = {}
        self._lock = threading.Lock()
        self._future = pubsub_v1.SubscriberClient().subscribe(subscription, self._receive)

    def _receive(self, message) -> None:
        with self._lock:
            self.messages[message.message_id] = message  # a redelivery has the same message id
        message.ack()

    def count(self) -> int:
        with self._lock:
            return len(self.messages)

    def close(self) -> None:
        self._future.cancel()
        self._future.result(timeout=30)


class StreamingJob:
    """The streaming job (``python -m pipeline --streaming ...``) running in this process."""

    def __init__(self, pubsub_server, bigquery_emulator, dataset: str):
        self.server = pubsub_server
        self.subscription = pubsub_server.subscription_path("metrics-pipeline")
        self.result = start_streaming([
            "--streaming", f"--input_subscription={self.subscription}",
            f"--alerts_topic={pubsub_server.topic_path('alerts')}", f"--config_dir={DEFAULT_CONFIG_DIR}",
            f"--triage_topic={pubsub_server.topic_path('metrics')}",
            f"--bigquery_project={bigquery_emulator.project}", f"--bigquery_dataset={dataset}",
            f"--bigquery_endpoint={bigquery_emulator.endpoint}", *TIMING])

    def wait_until_all_pulled(self) -> None:
        """Blocks until the job has pulled and acked every message published so far."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            stats = self.server.subscription_stats(self.subscription)
            if stats.backlog == 0 and stats.outstanding == 0:
                return
            assert time.monotonic() < deadline, f"the job did not pull its input: {stats}"
            time.sleep(0.05)

    def cancel(self) -> None:
        self.result.cancel()  # joins the runner's worker thread: it pulls nothing after this


def replay(tmp_path, name: str, payloads: List[bytes]) -> DuckDBStore:
    """The local replay of ``payloads`` into a fresh DuckDB store (the expected rows)."""
    lines = tmp_path / f"{name}.jsonl"
    lines.write_bytes(b"".join(p + b"\n" for p in payloads))
    assert main([f"--input_files={lines}", f"--config_dir={DEFAULT_CONFIG_DIR}", *TIMING,
                 f"--local_store={tmp_path / name}.duckdb", f"--alerts_file={tmp_path / name}.alerts.jsonl"]) == 0
    return DuckDBStore(str(tmp_path / f"{name}.duckdb"))


def _value(value):
    return value.isoformat() if hasattr(value, "isoformat") else value


def table_rows(query, dialect) -> Dict[str, List[tuple]]:
    """Every table's rows as sorted tuples in schema column order; timestamps as ISO strings."""
    rows = {}
    for name, table in TABLES.items():
        columns = ", ".join(map(dialect.quote, table.column_names))
        rows[name] = sorted((tuple(_value(v) for v in row) for row in query(
            f"SELECT {columns} FROM {dialect.table(table)}")), key=repr)
    return rows


def wait_for_rows(bigquery: BigQueryStore, expected: DuckDBStore, alerts: AlertCollector,
                  more_dead_letters: int = 0) -> None:
    """Blocks until BigQuery holds as many rows as the replay store (and ``more_dead_letters``), and every alert
    has arrived."""
    counts = expected.counts()
    counts[DEAD_LETTER.name] += more_dead_letters
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        have = {name: bigquery.query(f"SELECT count(*) FROM `{bigquery.target.table_id(table)}`")[0][0]
                for name, table in TABLES.items()}
        if have == counts and alerts.count() == counts["alerts"]:
            return
        too_many = any(have[name] > counts[name] for name in counts) or alerts.count() > counts["alerts"]
        assert not too_many and time.monotonic() < deadline, (
            f"BigQuery has {have}, the replay {counts}; {alerts.count()} alerts on the topic")
        time.sleep(0.25)


def run_job(pubsub_server, bigquery_emulator, publisher, dataset: str, warm_up: bytes,
            first_index: int, stories: List[Dict], resent: List[bytes] = ()) -> Tuple[StreamingJob, List[bytes]]:
    """Starts a job and feeds it a workload live; returns the (running) job and every payload it was sent.

    ``resent`` payloads (of runs an earlier job stored) go out with the workload.
    """
    job = StreamingJob(pubsub_server, bigquery_emulator, dataset)
    topic = pubsub_server.topic_path("metrics")
    publisher.publish(topic, warm_up).result()  # malformed: a dead letter; no ts: event time = publish time
    job.wait_until_all_pulled()
    first_run_start = time.time() + LEAD_SECONDS
    payloads = workload(first_run_start, first_index, stories) + list(resent)
    publish(publisher, topic, payloads)
    job.wait_until_all_pulled()
    if time.time() >= first_run_start:
        pytest.fail(f"the job needed more than {LEAD_SECONDS} s to pull {len(payloads)} messages; "
                    "the local runner's wall-clock watermark made some of them late; raise LEAD_SECONDS")
    return job, [warm_up] + payloads


@pytest.mark.long
def test_streaming_job_matches_the_local_replay_and_continues_after_a_restart(
        tmp_path, pubsub_server, bigquery_emulator):
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    for name in ("metrics", "alerts"):
        publisher.create_topic(name=pubsub_server.topic_path(name))
    subscriber.create_subscription(name=pubsub_server.subscription_path("metrics-pipeline"),
                                   topic=pubsub_server.topic_path("metrics"))
    subscriber.create_subscription(name=pubsub_server.subscription_path("alerts-pager"),
                                   topic=pubsub_server.topic_path("alerts"))
    alerts = AlertCollector(pubsub_server.subscription_path("alerts-pager"))
    # At-least-once delivery, out of order: the job must not care.
    pubsub_server.configure_faults(duplicate_probability=0.2, reorder=True, seed=5)
    bigquery = BigQueryStore(BigQueryTarget(bigquery_emulator.project, "e2e", bigquery_emulator.endpoint))
    try:
        job, first = run_job(pubsub_server, bigquery_emulator, publisher, "e2e", b"warm-up 1", 0, FIRST_JOB)
        wait_for_rows(bigquery, replay(tmp_path, "first", first), alerts)
        job.cancel()
        # A new job (not an update): its history comes from the BigQuery tables.
        # Trainers retrying two old messages: runs BigQuery already has, so the new job dead-letters them
        # (a replay of all the payloads at once has them as duplicates).
        resent = first[1:3]
        job, second = run_job(pubsub_server, bigquery_emulator, publisher, "e2e", b"warm-up 2", 4, SECOND_JOB,
                              resent=resent)
        expected = replay(tmp_path, "all", first + second)
        wait_for_rows(bigquery, expected, alerts, more_dead_letters=len(set(resent)))
        job.cancel()
    finally:
        alerts.close()

    got = table_rows(bigquery.query, bigquery_dialect(bigquery.target))
    want = table_rows(expected.query, DUCKDB_SQL)
    dead_letter = want.pop(DEAD_LETTER.name), got.pop(DEAD_LETTER.name)
    # The job's alerts' triage commands point at its topic and dataset; a replay's, at no store in particular (its
    # rows do not depend on where its store lives).
    details = ALERTS.column_names.index("details")
    (got["alerts"], got_steps), (want["alerts"], want_steps) = (
        _without_next_steps(rows, details) for rows in (got["alerts"], want["alerts"]))
    assert got == want
    job_flags = (f" --topic {pubsub_server.topic_path('metrics')} --bigquery_project {bigquery.target.project}"
                 f" --bigquery_dataset {bigquery.target.dataset} --bigquery_endpoint {bigquery.target.endpoint}")
    assert got_steps and all(step.endswith(job_flags) for step in got_steps), got_steps
    assert [step[:-len(job_flags)] for step in got_steps] == want_steps
    kinds = sorted((row[1], row[3]) for row in want["alerts"])
    assert kinds == [("job_failed", "jax-02"), ("job_failed", "jax-05"),
                     ("metric_out_of_bounds", "bert-01"), ("metric_out_of_bounds", "bert-04"),
                     ("run_missing", "bert-05")]
    # Dead letters say where the payload came from: the replay file vs the subscription, with its publish time.
    columns = DEAD_LETTER.column_names
    replayed, streamed = ([dict(zip(columns, row)) for row in rows] for rows in dead_letter)
    of_stored_runs = [d for d in streamed if d["reason"].startswith("run already stored: ")]
    streamed = [d for d in streamed if d not in of_stored_runs]
    assert sorted((d["reason"], d["payload"]) for d in streamed) == sorted((d["reason"], d["payload"])
                                                                          for d in replayed)
    assert {d["payload"] for d in streamed} == {"warm-up 1", "warm-up 2"}
    assert all(d["source"] == f"pubsub:{pubsub_server.subscription_path('metrics-pipeline')}"
               and d["received_at"] is not None for d in streamed)
    # The resent messages of stored runs: dead letters with the reason and the payload, once each.
    keys = [(json.loads(payload)["test"], json.loads(payload)["run"], payload.decode()) for payload in set(resent)]
    assert sorted((d["source"], d["reason"], d["payload"]) for d in of_stored_runs) == sorted(
        (f"run:{test}/{run}", stored_run_reason(test, run), payload) for test, run, payload in keys)
    # The alerts topic carried every alert once, as the alerts file's lines, with test/run/kind attributes.
    lines = (tmp_path / "all.alerts.jsonl").read_text().splitlines()
    published = sorted(m.data.decode() for m in alerts.messages.values())
    assert sorted(_without_next_steps([(line,)], 0)[0][0] for line in published) == sorted(
        _without_next_steps([(line,)], 0)[0][0] for line in lines)
    for message in alerts.messages.values():
        alert = json.loads(message.data)
        assert dict(message.attributes) == {"test": alert["test_name"], "run": alert["run_id"], "kind": alert["kind"]}


def _without_next_steps(rows: List[tuple], column: int) -> Tuple[List[tuple], List[str]]:
    """``rows`` with ``next_steps`` taken out of the JSON in ``column`` (an alerts row's details, or a whole alert
    line), and the commands taken out, in row order."""
    kept, steps = [], []
    for row in rows:
        text = json.loads(row[column])
        inner = text if "next_steps" in text else json.loads(text.get("details") or "{}")
        steps += inner.pop("next_steps", [])
        if inner is not text:
            text["details"] = json.dumps(inner, sort_keys=True)
        kept.append((*row[:column], json.dumps(text, sort_keys=True), *row[column + 1:]))
    return sorted(kept, key=repr), steps


SUBSCRIPTION = "--input_subscription=projects/test-project/subscriptions/s"


@pytest.mark.parametrize("argv, problem", [
    (["--streaming"], "exactly one of --input_subscription and --input_topic"),
    ([SUBSCRIPTION], "reading Pub/Sub needs --streaming"),
    (["--streaming", SUBSCRIPTION], "--bigquery_dataset is required"),
    (["--streaming", SUBSCRIPTION, "--bigquery_dataset=d"], "--bigquery_project (or --project) is required"),
    (["--streaming", SUBSCRIPTION, "--bigquery_dataset=d", "--project=p", "--write_method=storage_write_api"],
     "DataflowRunner only"),
    (["--streaming", SUBSCRIPTION, "--bigquery_dataset=d", "--project=p", "--pubsub_id_attribute=id"],
     "only supported by DataflowRunner"),
    (["--streaming", "--input_subscription=projects/P/subscriptions/s", "--bigquery_dataset=d", "--project=p"],
     "--input_subscription=projects/P/subscriptions/s: Invalid PubSub project name: 'P'"),
    (["--streaming", SUBSCRIPTION, "--alerts_topic=topics/alerts", "--bigquery_dataset=d", "--project=p"],
     "--alerts_topic=topics/alerts: "),
])
def test_streaming_options_are_checked_before_anything_starts(argv, problem, capsys):
    assert main(argv) == 2
    assert problem in capsys.readouterr().err


def test_an_alert_is_published_as_its_alerts_file_line_with_attributes():
    row = {"alert_id": "a1", "kind": "job_failed", "test_name": "t", "run_id": "r", "metric_name": None,
           "value": None, "lower_bound": None, "upper_bound": None, "message": "m",
           "created_at": "2025-11-20T01:01:00.000000Z", "details": "{}"}
    message = alert_message(row)
    assert message.data == alert_json(row).encode() and json.loads(message.data) == row
    assert message.attributes == {"test": "t", "run": "r", "kind": "job_failed"}


def test_a_pubsub_message_becomes_a_raw_message_received_at_its_publish_time():
    published = datetime.datetime(2025, 11, 21, 4, 40, tzinfo=datetime.timezone.utc)
    raw = raw_from_pubsub(PubsubMessage(b"{}", {"ts": "1"}, "id-1", published), "pubsub:s")
    assert raw == RawMessage(b"{}", "pubsub:s", published.timestamp())
    assert raw_from_pubsub(PubsubMessage(b"x", {}), "pubsub:s").received_at is None


def test_python_m_pipeline_runs_the_streaming_job_until_interrupted(pubsub_server, bigquery_emulator):
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.create_topic(name=pubsub_server.topic_path("metrics")).name
    alerts_topic = publisher.create_topic(name=pubsub_server.topic_path("alerts")).name
    subscription = subscriber.create_subscription(name=pubsub_server.subscription_path("pipeline"), topic=topic).name
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--streaming", f"--input_subscription={subscription}",
         f"--alerts_topic={alerts_topic}", f"--bigquery_project={bigquery_emulator.project}",
         "--bigquery_dataset=cli", f"--bigquery_endpoint={bigquery_emulator.endpoint}", "--run_grace_seconds=0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().startswith("trainguard: the history seed's queries and tables answer (")
        assert "streaming job running" in process.stdout.readline()
        start = time.time()  # the local runner's watermark is the wall clock: a run that just ended
        publish(publisher, topic, run_payloads(JAX, "jax-cli", start - 1, status="failure"))
        alert, = pubsub_server.wait_for_published(alerts_topic, 1, timeout=WAIT_SECONDS)
        assert json.loads(alert.data)["run_id"] == "jax-cli" and alert.attributes["kind"] == "job_failed"
        bigquery = BigQueryStore(BigQueryTarget(bigquery_emulator.project, "cli", bigquery_emulator.endpoint))
        deadline = time.monotonic() + WAIT_SECONDS
        while not (jobs := bigquery.query("SELECT run_id, job_status FROM `test-project.cli.job_history`")):
            assert time.monotonic() < deadline, "no job_history row in BigQuery"
            time.sleep(0.25)
        assert jobs == [("jax-cli", "failure")]
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: the job is cancelled and the command exits
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    # at the start, what the configs check that no stored run has reported (an empty dataset: every test)
    assert "trainguard: warning: pt-cifar-tpu-v3-8: no stored run of this test (a misspelled file name?)" in stderr


class InterruptedJob:
    """A local runner's ``PipelineResult`` whose wait ends in ``ending`` (a function that raises)."""

    def __init__(self, ending):
        self.ending, self.cancelled = ending, False

    def wait_until_finish(self):
        self.ending()

    def cancel(self):
        self.cancelled = True


def ctrl_c():
    raise KeyboardInterrupt


def ctrl_c_inside_a_lock():
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise RuntimeError("release unlocked lock")  # noqa: B904 - implicitly chained, as CPython raises it


def a_step_failed():
    raise RuntimeError("a step failed")


@pytest.mark.parametrize("ending", [ctrl_c, ctrl_c_inside_a_lock])
def test_ctrl_c_cancels_the_local_job_wherever_it_lands(ending):
    job = InterruptedJob(ending)
    wait_until_interrupted(job)
    assert job.cancelled


def test_another_runtime_error_of_the_local_job_is_raised():
    job = InterruptedJob(a_step_failed)
    with pytest.raises(RuntimeError, match="a step failed"):
        wait_until_interrupted(job)
    assert not job.cancelled


def test_help_lists_the_streaming_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--input_subscription", "--input_topic", "--bigquery_dataset", "--bigquery_endpoint",
                   "--write_method", "--alerts_topic", "--pubsub_id_attribute", "--input_files"):
        assert option in out, option


def test_the_jobs_alerts_point_triage_at_its_topic_and_dataset():
    base = ["--streaming", SUBSCRIPTION, "--bigquery_dataset=d", "--project=my-project"]
    job = StreamingJobConfig.from_options(PipelineOptions(base))
    assert job.triage_destination == (("--bigquery_project", "my-project"), ("--bigquery_dataset", "d"))
    job = StreamingJobConfig.from_options(PipelineOptions(base + ["--triage_topic=projects/my-project/topics/m"]))
    assert job.triage_destination[0] == ("--topic", "projects/my-project/topics/m")
    read_from_topic = ["--streaming", "--input_topic=projects/my-project/topics/m", "--bigquery_dataset=d",
                       "--project=my-project"]
    assert StreamingJobConfig.from_options(PipelineOptions(read_from_topic)).triage_destination[0] == (
        "--topic", "projects/my-project/topics/m")  # a job that reads a topic takes triage actions from it
    with pytest.raises(UsageError, match="--triage_topic=metrics: "):
        StreamingJobConfig.from_options(PipelineOptions(base + ["--triage_topic=metrics"]))
