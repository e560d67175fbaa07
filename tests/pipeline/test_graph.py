import dataclasses
import json
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from core.history import HistorySeed, JobHistory, MetricHistory
from core.parse import RawMessage, content_digest, different_copy_reason
from core.runs import RunLifecycle
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY
from core.triage import TriageItem
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import (
    Detect,
    assert_rows,
    batch_pipeline,
    configs,
    detect,
    finished,
    raw,
    simple_run,
    started,
    streaming_pipeline,
)
from transforms.parse import DeduplicateMessages, ParseMessages, SummarizeMessages, copy_content

ALERTING = configs(cifar={"regression_test_config": {
    "metric_success_conditions": {"acc_final": {"comparison": "greater", "success_threshold": {"fixed_value": 50}}},
    "alert_after_second_test_failure": False}})
SETTINGS = GraphSettings(ALERTING, RunLifecycle(grace_seconds=60, timeout_seconds=3600))
WINDOWED_ELSEWHERE = dataclasses.replace(ALERTING, by_test={**ALERTING.by_test, **configs(other={"window_config": {
    "tags": {"loss": {"count": 4, "aggregations": ["mean"]}}}}).by_test})  # live windows, of another test


def test_parse_splits_good_messages_from_dead_letters():
    with batch_pipeline() as p:
        messages, _, dead = (p | beam.Create([
            RawMessage(json.dumps({"schema": "trainguard/v1", "id": "m1", "test": "t", "run": "r", "points": [
                {"tag": "loss", "value": 1.0, "time": T0}, {"tag": "loss", "value": float("nan"), "time": T0}]}
            ).encode(), "test"),
            RawMessage(b"{broken", "file:x.jsonl"),
            RawMessage(b"\xff\x00", "file:y.jsonl", received_at=T0),
        ]) | ParseMessages())
        assert_that(messages | beam.Map(lambda m: (m.message.id, len(m.message.points), m.payload[:1])),
                    equal_to([("m1", 1, b"{")]), label="good")
        assert_that(dead | beam.Map(lambda d: (d["source"], d["reason"].split(":")[0], d["received_at"])),
                    equal_to([("test", "invalid point [1]", None), ("file:x.jsonl", "invalid message", None),
                              ("file:y.jsonl", "invalid message", "2025-11-20T00:00:00.000000Z")]), label="dead")
        assert_that(dead | "payloads" >> beam.Map(lambda d: d["payload"]) | beam.Filter(lambda s: "\\x" in s),
                    equal_to(["\\xff\x00"]), label="raw bytes kept")


def test_dedup_passes_each_message_id_once():
    with batch_pipeline() as p:
        messages, _, _ = (p | beam.Create([raw("t", "r", "a", points=[("x", 1.0, 1, T0)])] * 3
                                          + [raw("t", "r", "b", points=[("x", 2.0, 2, T0)])]) | ParseMessages())
        summaries, _ = messages | SummarizeMessages(configs())
        once, different = summaries | DeduplicateMessages(3600)
        assert_that(once | beam.Map(lambda m: m.id), equal_to(["a", "b"]))
        assert_that(different, equal_to([]), label="no dead letters")


def test_a_bounded_replay_passes_each_message_id_once_however_far_apart_its_copies_are():
    copies = [raw("t", "r", "a", points=[("x", 1.0, 1, T0 + days * 86400)]) for days in (30, 0, 3)]
    first, *others = sorted(copy.payload for copy in copies)
    with batch_pipeline() as p:
        messages, _, _ = p | beam.Create(copies + [raw("t", "r", "b", points=[("x", 2.0, 2, T0)])]) | ParseMessages()
        summaries, _ = messages | SummarizeMessages(configs())
        once, different = summaries | DeduplicateMessages(3600, forget=False)
        assert_that(once | beam.Map(lambda m: (m.id, m.payload)),
                    equal_to([("a", first), ("b", raw("t", "r", "b", points=[("x", 2.0, 2, T0)]).payload)]))
        # Copies days apart differ (their times): the one whose bytes sort first counts, the others are dead letters.
        assert_that(different | beam.Map(lambda row: (row["reason"], row["payload"].encode())), equal_to(
            [(different_copy_reason(content_digest(first)), other) for other in others]), label="different copies")


def test_copies_of_a_triage_action_with_different_fields_count_once_and_the_others_say_so():
    mute = TriageItem("m", "cifar", "mute", T0, until=T0 + 3600, user="ana")
    longer = dataclasses.replace(mute, until=T0 + 7200)
    taken, other = sorted([mute, longer], key=copy_content)
    dead = (different_copy_reason(content_digest(copy_content(taken))), copy_content(other).decode(), "triage:cifar")
    with batch_pipeline() as p:  # a replay: the copy whose fields sort first, in any order
        once, different = (p | beam.Create([longer, mute, longer]) | beam.Map(lambda a: TimestampedValue(a, a.time))
                           | DeduplicateMessages(3600, forget=False))
        assert_that(once, equal_to([taken]))
        assert_that(different | beam.Map(lambda row: (row["reason"], row["payload"], row["source"])),
                    equal_to([dead]), label="dead letter")
    stream = TestStream().advance_watermark_to(at(T0)).add_elements([other]).add_elements([taken, other])
    with streaming_pipeline() as p:  # a stream: the copy delivered first
        once, different = p | stream.advance_watermark_to_infinity() | DeduplicateMessages(3600)
        assert_that(once, equal_to([other]))
        assert_that(different | beam.Map(lambda row: row["reason"]),
                    equal_to([different_copy_reason(content_digest(copy_content(other)))]), label="dead letter")


def history_input():
    messages = []
    for day, accuracy in enumerate([70, 72, 40, 71, 30, 31]):
        messages += simple_run("cifar", f"run-{day}", T0 + day * 86400, accuracy,
                               status="failure" if day == 3 else "success")
    return messages + messages[:4] + [RawMessage(b"junk", "file:z")]


def collect(outputs, prefix=""):
    return {name: pcoll | f"{prefix}Json_{name}" >> beam.Map(lambda r: json.dumps(r, sort_keys=True))
            for name, pcoll in outputs.items()}


def check_history(found):
    results = {k: [json.loads(r) for r in v] for k, v in found.items()}
    jobs = sorted(results[JOB_HISTORY.name], key=lambda r: r["run_id"])
    assert [j["job_status"] for j in jobs] == ["success", "success", "success", "failure", "success", "success"]
    metrics = sorted(results[METRIC_HISTORY.name], key=lambda r: (r["run_id"], r["metric_name"]))
    acc = [m for m in metrics if m["metric_name"] == "acc_final"]
    assert [m["within_bounds"] for m in acc] == [True, True, False, True, False, False]
    assert sorted((a["kind"], a["run_id"]) for a in results[ALERTS.name]) == [
        ("job_failed", "run-3"), ("metric_out_of_bounds", "run-2"), ("metric_out_of_bounds", "run-4"),
        ("metric_out_of_bounds", "run-5")]
    assert [d["reason"][:15] for d in results[DEAD_LETTER.name]] == ["invalid message"]


def test_history_checks_in_end_time_order():
    with batch_pipeline() as p:
        assert_rows(collect(detect(p | beam.Create(history_input()), SETTINGS)), check_history)


@pytest.mark.parametrize("seed", [1, 2])
def test_outputs_do_not_depend_on_input_order(seed):
    shuffled = history_input()
    random.Random(seed).shuffle(shuffled)

    def check(found):
        names = {name.split(".", 1)[1] for name in found}
        for name in names:
            assert sorted(found[f"shuffled.{name}"]) == sorted(found[f"in order.{name}"]), name
    with batch_pipeline() as p:
        tables = {}
        for side, messages in (("in order", history_input()), ("shuffled", shuffled)):
            outputs = p | f"Create {side}" >> beam.Create(messages) | f"Detect {side}" >> Detect(SETTINGS)
            tables.update({f"{side}.{name}": pcoll for name, pcoll in collect(outputs, f"{side} ").items()})
        assert_rows(tables, check)


SEED = HistorySeed(metrics={("cifar", "acc_final"): MetricHistory([("old-run", 70.0, True)], last_out_of_bounds=False)},
                   jobs={"cifar": JobHistory("failure")},
                   stored_runs=frozenset({("cifar", "old-run")}))


@pytest.mark.parametrize("knows_the_seed", [False, True])
def test_seeded_history_continues_across_invocations(knows_the_seed):
    """Also where the graph is built knowing which of the seed's fields hold anything (a replay's): it joins those."""
    stdd = configs(cifar={"regression_test_config": {"metric_success_conditions": {"acc_final": {
        "comparison": "greater", "success_threshold": {"stddevs_from_mean": 1}}}}})
    settings = GraphSettings(stdd, seed_holds=SEED.held() if knows_the_seed else None)
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(simple_run("cifar", "old-run", T0, 10.0)
                                         + simple_run("cifar", "new", T0 + 86400, 69.0, status="failure")),
                         settings, SEED)
        assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: r["run_id"]), equal_to(["new"]), label="skip stored")
        assert_that(outputs[METRIC_HISTORY.name] | beam.Map(lambda r: (r["metric_name"], r["metric_lower_bound"],
                                                                   r["within_bounds"])),
                    equal_to([("acc_final", 70.0, False), ("total_wall_time", None, None)]), label="bounds from seed")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: a["kind"]), equal_to(["job_failed"]), label="2nd failure")


def step_names(settings: GraphSettings) -> set:
    p = beam.Pipeline()
    detect(p | beam.Create(simple_run("cifar", "r", T0, 70.0)), settings, SEED)
    return {t.unique_name for t in p.to_runner_api().components.transforms.values()}


def test_a_replay_joins_only_the_seed_fields_that_hold_anything_and_flattens_no_interrupted_runs():
    """A Flatten is a copy of every element on a batch runner: a replay has none with the seed's states (its grouped
    checks look their keys up in an index of their field, ``SeedIndex``), none with the interrupted runs, which only
    a streaming job's drain makes, and reads no index of an empty seed field. Nor does it ask each message whether
    its run is stored when the store holds no run (a side input makes Beam invoke a step several µs a message
    slower)."""
    assert SEED.held() == {"metrics", "jobs", "stored_runs"}
    checks = ("CheckMetrics", "CheckRuns", "LiveWindows/Checks", "Triage")
    streamed = {f"{check}/WithSeeds/ItemsAndSeeds" for check in checks}
    indexes = {f"{check}/SeedIndex" for check in checks}
    others = {"AssembleRuns/MessagesAndOpenRuns", "SkipStoredRuns/NotStored"}
    interrupted = {"EndedAndInterrupted", "LiveWindows/EndedOrInterrupted"}
    everything = {f"DetectRegressions/{name}" for name in streamed | indexes | others | interrupted}
    assert step_names(GraphSettings(WINDOWED_ELSEWHERE, streaming=True)) & everything == {
        f"DetectRegressions/{name}" for name in streamed | others | interrupted}
    assert step_names(GraphSettings(WINDOWED_ELSEWHERE)) & everything == {
        f"DetectRegressions/{name}" for name in indexes | others}  # a seed not known: every field may hold something
    assert step_names(GraphSettings(WINDOWED_ELSEWHERE, seed_holds=SEED.held())) & everything == {
        "DetectRegressions/CheckMetrics/SeedIndex", "DetectRegressions/CheckRuns/SeedIndex",
        "DetectRegressions/SkipStoredRuns/NotStored"}
    assert step_names(GraphSettings(WINDOWED_ELSEWHERE, seed_holds=HistorySeed().held())) & everything == set()


def test_a_replay_whose_configs_have_no_live_windows_leaves_them_out_and_gives_the_same_rows():
    """Their ~8 stages would start and find nothing: a replay's configs are all known when its graph is built."""
    assert not ALERTING.any_live_windows() and WINDOWED_ELSEWHERE.any_live_windows()
    assert not any(name.startswith("DetectRegressions/LiveWindows") for name in step_names(GraphSettings(ALERTING)))
    assert "DetectRegressions/LiveWindows" in step_names(GraphSettings(ALERTING, streaming=True))
    assert "DetectRegressions/LiveWindows" in step_names(GraphSettings(WINDOWED_ELSEWHERE))

    def same(found):
        names = {name.split(".", 1)[1] for name in found}
        assert len(names) == 8
        for name in names:
            assert sorted(found[f"without.{name}"]) == sorted(found[f"with.{name}"]), name
        assert len(found["without.job_history"]) == 6 and found["without.metric_windows"] == []
    with batch_pipeline() as p:
        tables = {}
        for side, config in (("without", ALERTING), ("with", WINDOWED_ELSEWHERE)):
            outputs = (p | f"Create {side}" >> beam.Create(history_input())
                       | f"Detect {side}" >> Detect(dataclasses.replace(SETTINGS, configs=config)))
            tables.update({f"{side}.{name}": pcoll for name, pcoll in collect(outputs, f"{side} ").items()})
        assert_rows(tables, same)


def at(time):
    return Timestamp.of(time)


def test_streaming_run_is_finalized_by_the_watermark_with_stragglers_and_late_data():
    settings = GraphSettings(ALERTING, RunLifecycle(grace_seconds=60, timeout_seconds=600), streaming=True)
    stream = (TestStream()
              .advance_watermark_to(at(T0))
              .add_elements([raw("cifar", "r1", "e", events=[started(T0), finished(T0 + 100)])])
              .add_elements([raw("cifar", "r1", "p1", points=[("acc", 80.0, 1, T0 + 50)])])
              .advance_watermark_to(at(T0 + 120))
              # a straggler within the grace period, and a duplicate
              .add_elements([raw("cifar", "r1", "p2", points=[("acc", 40.0, 2, T0 + 110)]),
                             raw("cifar", "r1", "p1", points=[("acc", 80.0, 1, T0 + 50)])])
              .advance_watermark_to(at(T0 + 200))
              # after finalization: dead-lettered as late, not lost
              .add_elements([raw("cifar", "r1", "p3", points=[("acc", 99.0, 3, T0 + 150)])])
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, settings)
        assert_that(outputs[METRIC_HISTORY.name] | beam.Map(lambda r: (r["metric_name"], r["metric_value"], r["step"])),
                    equal_to([("acc_final", 40.0, 2), ("total_wall_time", 100.0, None)]), label="rows")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["kind"], a["value"])),
                    equal_to([("metric_out_of_bounds", 40.0)]), label="alerts")
        assert_that(outputs[DEAD_LETTER.name] | beam.Map(lambda d: (d["reason"], json.loads(d["payload"])["id"])),
                    equal_to([("late: run already finalized", "p3")]), label="late")


def test_streaming_run_without_finish_becomes_missing_after_timeout():
    quiet = configs(cifar={"regression_test_config": {"alert_after_second_test_failure": False}})
    stream = (TestStream()
              .advance_watermark_to(at(T0))
              .add_elements([raw("cifar", "r1", "a", points=[("acc", 1.0, 1, T0 + 10)], events=[started(T0)])])
              .advance_watermark_to(at(T0 + 500))
              .add_elements([raw("cifar", "r1", "b", points=[("acc", 2.0, 2, T0 + 400)])])
              .advance_watermark_to(at(T0 + 900))  # 400 + 600 not yet reached: still open
              .add_elements([raw("cifar", "r1", "c", points=[("acc", 3.0, 3, T0 + 800)])])
              .advance_watermark_to(at(T0 + 1500))  # 800 + 600 passed: missing
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, GraphSettings(quiet, RunLifecycle(60, 600), streaming=True))
        assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: (r["job_status"], r["timestamp"], r["processed_at"])),
                    equal_to([("missing", "2025-11-20T00:13:20.000000Z", "2025-11-20T00:23:20.000000Z")]),
                    label="missing")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: a["kind"]), equal_to(["run_missing"]), label="alert")
        assert_that(outputs[METRIC_HISTORY.name] | beam.Map(lambda r: r["metric_value"]), equal_to([3.0]), label="final")


def test_streaming_history_follows_end_time_not_arrival():
    fixed = configs(cifar={"regression_test_config": {"metric_success_conditions": {"acc_final": {
        "comparison": "greater", "success_threshold": {"stddevs_from_mean": 1}, "wait_for_n_points_of_history": 1}},
        "alert_after_second_test_failure": False}})
    late_run, early_run = simple_run("cifar", "r2", T0 + 100, 10.0), simple_run("cifar", "r1", T0, 90.0)
    stream = (TestStream()
              .advance_watermark_to(at(T0))
              .add_elements(late_run)   # the later run's messages arrive first
              .add_elements(early_run)
              .advance_watermark_to(at(T0 + 1000))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, GraphSettings(fixed, RunLifecycle(60, 600), streaming=True))
        assert_that(outputs[METRIC_HISTORY.name] | beam.Filter(lambda r: r["metric_name"] == "acc_final")
                    | beam.Map(lambda r: (r["run_id"], r["within_bounds"])),
                    equal_to([("r1", None), ("r2", False)]), label="r1 is r2's history")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: a["run_id"]), equal_to(["r2"]), label="alert")


def test_write_to_bigquery_false_keeps_history_out_but_still_alerts():
    unrecorded = configs(cifar={"metric_collection_config": {"write_to_bigquery": "false"},
                                "regression_test_config": {"alert_after_second_test_failure": False}})
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(simple_run("cifar", "r1", T0, 1.0, status="failure")
                                         + simple_run("other", "r1", T0, 1.0)), GraphSettings(unrecorded))
        assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: r["test_name"]), equal_to(["other"]), label="jobs")
        assert_that(outputs[METRIC_HISTORY.name] | beam.Map(lambda r: r["test_name"]), equal_to(["other", "other"]),
                    label="metrics")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["test_name"], a["kind"])),
                    equal_to([("cifar", "job_failed")]), label="alerts")
