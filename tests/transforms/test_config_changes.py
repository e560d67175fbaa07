"""Config changes while runs are open: tags that gain or lose windows, checks that come or go, tests that vanish.

A config change reaches runs that are open, so each element uses the config
version valid at its event time: ``ConfigVersions`` baked into the graph, or
the same versions as files of a config directory, ``<test>@<UTC time>.json``,
which a streaming job follows while it runs (``LiveConfigs``) and a replay reads
at start-up, with the same rows. Between invocations (two replays) the history
seed meets the new config.
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from core.config import TestConfig, parse_test_config
from core.config_versions import BEGINNING, ConfigVersions, dated_name
from core.runs import RunLifecycle
from core.schema import DEAD_LETTER, JOB_HISTORY, METRIC_WINDOWS
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import batch_pipeline, detect, finished, raw, started, streaming_pipeline
from transforms.config_versions import LiveConfigs, read_config_dir

CHECK = {"aggregation": "mean", "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3}}}
CIFAR_BEFORE = {"window_config": {"tags": {"loss": {"count": 2, "aggregations": ["mean"], "checks": [CHECK]}}}}
OTHER_BEFORE = {"window_config": {"tags": {"loss": {"count": 2, "aggregations": ["mean"]}}}}
CIFAR_AFTER = {"window_config": {"tags": {"acc": {"count": 2, "aggregations": ["mean", "max"], "checks": [CHECK]}}}}
CHANGE_AT = T0 + 100
TIMELINE = ConfigVersions({  # "other" loses its config at the change: the built-in default from then on
    "cifar": ((BEGINNING, parse_test_config(CIFAR_BEFORE, "cifar.json")),
              (CHANGE_AT, parse_test_config(CIFAR_AFTER, "cifar@change.json"))),
    "other": ((BEGINNING, parse_test_config(OTHER_BEFORE, "other.json")), (CHANGE_AT, TestConfig()))})
LIFECYCLE = RunLifecycle(grace_seconds=10, timeout_seconds=600)


def at(seconds):
    return Timestamp.of(seconds)


def open_run_messages(test):
    """A run open across the change: loss windowed before it, acc windowed after it."""
    return [raw(test, "r1", f"{test}/start", events=[started(T0)]),
            raw(test, "r1", f"{test}/loss-a", points=[("loss", 1.0, 0, T0 + 1), ("loss", 2.0, 10, T0 + 2)]),
            raw(test, "r1", f"{test}/loss-b", points=[("loss", 3.0, 20, T0 + 3)]),
            raw(test, "r1", f"{test}/after", points=[("loss", 4.0, 30, T0 + 101), ("acc", 50.0, 30, T0 + 101),
                                                      ("acc", 60.0, 40, T0 + 102), ("acc", 70.0, 50, T0 + 103)]),
            raw(test, "r1", f"{test}/end", events=[finished(T0 + 104)])]


def window_key(row):
    return row["test_name"], row["tag"], row["window_index"], row["partial"], row["n"], row["mean"]


EXPECTED_WINDOWS = [
    ("cifar", "loss", 0, False, 2, 1.5),
    ("cifar", "loss", 1, True, 1, 3.0),    # flushed when the change removed loss's windows
    ("cifar", "acc", 0, False, 2, 55.0),   # acc windowed from its first point after the change
    ("cifar", "acc", 1, True, 1, 70.0),
    ("other", "loss", 0, False, 2, 1.5),   # the test lost its config: its open windows are flushed too
    ("other", "loss", 1, True, 1, 3.0),
]


def dated_config_dir(tmp_path) -> str:
    """The timeline above as a config directory: each test's first version undated, the change dated."""
    directory = tmp_path / "configs"
    directory.mkdir()
    for name, config in [("cifar.json", CIFAR_BEFORE), ("other.json", OTHER_BEFORE),
                         (dated_name("cifar", CHANGE_AT), CIFAR_AFTER), (dated_name("other", CHANGE_AT), {})]:
        (directory / name).write_text(json.dumps(config))
    return str(directory)


def assert_windows_on_a_stream(configs):
    """The open runs of both tests, on a TestStream across the change, give ``EXPECTED_WINDOWS``."""
    stream = TestStream().advance_watermark_to(at(T0))
    for message in open_run_messages("cifar")[:3] + open_run_messages("other")[:3]:
        stream = stream.add_elements([message])
    stream = (stream.advance_watermark_to(at(T0 + 50))
              .add_elements(open_run_messages("cifar")[3:] + open_run_messages("other")[3:])
              .advance_watermark_to(at(T0 + 200))
              .advance_watermark_to(at(T0 + 1000))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, GraphSettings(configs, LIFECYCLE, streaming=True))
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Map(window_key), equal_to(EXPECTED_WINDOWS), label="windows")
        assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")
        assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: (r["test_name"], r["job_status"])),
                    equal_to([("cifar", "success"), ("other", "success")]), label="jobs")


def test_a_config_change_reaches_open_runs_on_a_stream():
    assert_windows_on_a_stream(TIMELINE)


def test_a_dated_config_file_reaches_open_runs_on_a_stream_that_follows_the_directory(tmp_path):
    assert_windows_on_a_stream(LiveConfigs(read_config_dir(dated_config_dir(tmp_path))))


def test_a_replay_of_the_same_files_gives_the_same_windows(tmp_path):
    from pipeline.replay import run as replay
    from sinks.duckdb_store import DuckDBStore

    data = tmp_path / "runs.jsonl"
    data.write_bytes(b"".join(m.payload + b"\n" for m in open_run_messages("cifar") + open_run_messages("other")))
    store = tmp_path / "store.duckdb"
    summary = replay([f"--input_files={data}", f"--config_dir={dated_config_dir(tmp_path)}", f"--local_store={store}",
                      f"--alerts_file={tmp_path / 'alerts.jsonl'}", "--run_grace_seconds=10",
                      "--run_timeout_seconds=600", "--triage_file="])
    assert summary.rows_added["dead_letter"] == 0
    rows = DuckDBStore(str(store)).query(
        "SELECT test_name, tag, window_index, partial, n, mean FROM metric_windows ORDER BY ALL")
    assert sorted(rows) == sorted(EXPECTED_WINDOWS)


def test_a_config_change_reaches_open_runs_in_a_replay_the_same_way():
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(open_run_messages("cifar") + open_run_messages("other")),
                         GraphSettings(TIMELINE, LIFECYCLE))
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Map(window_key), equal_to(EXPECTED_WINDOWS), label="windows")
        assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")


def test_two_replays_across_a_config_change_account_for_every_input(tmp_path):
    """The first replay stores window history under the old config; the second seeds from it under the new one,
    in which loss changed its window kind and acc gained windows."""
    from pipeline.replay import run as replay
    from sinks.duckdb_store import DuckDBStore

    windows_before = {"loss": {"count": 2, "aggregations": ["mean"], "checks": [CHECK]}}
    windows_after = {"acc": {"count": 2, "aggregations": ["mean", "max"], "checks": [CHECK]},
                     "loss": {"time_seconds": 60, "aggregations": ["mean"], "checks": [CHECK]}}
    store, alerts = tmp_path / "store.duckdb", tmp_path / "alerts.jsonl"
    for day, tags in enumerate((windows_before, windows_after)):
        config_dir = tmp_path / f"configs{day}"
        config_dir.mkdir()
        (config_dir / "cifar.json").write_text(json.dumps({"window_config": {"tags": tags}}))
        start = T0 + day * 1000
        messages = [raw("cifar", f"r{day}", f"r{day}/start", events=[started(start)]),
                    raw("cifar", f"r{day}", f"r{day}/points", points=[
                        (tag, float(i), i * 10, start + 1 + i) for tag in ("loss", "acc") for i in range(4)]),
                    raw("cifar", f"r{day}", f"r{day}/end", events=[finished(start + 10)])]
        data = tmp_path / f"day{day}.jsonl"
        data.write_bytes(b"".join(m.payload + b"\n" for m in messages))
        summary = replay([f"--input_files={data}", f"--config_dir={config_dir}", f"--local_store={store}",
                          f"--alerts_file={alerts}"])
        assert summary.rows_added["job_history"] == 1 and summary.rows_added["dead_letter"] == 0
    rows = DuckDBStore(str(store)).query(
        "SELECT run_id, tag, window_kind, count(*) FROM metric_windows GROUP BY ALL ORDER BY ALL")
    assert rows == [("r0", "loss", "count", 2), ("r1", "acc", "count", 2), ("r1", "loss", "time", 1)]
