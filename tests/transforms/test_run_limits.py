"""A run over its events limit (``RunAccumulator.MAX_EVENTS`` besides run_started and run_finished) through the
whole graph: it keeps its lifecycle events and ends on its own run_finished with its own status, and the same
events over the limit are dead letters, once, in a replay in any order and in a stream."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Callable, Dict, List

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from core.parse import RawMessage
from core.runs import RunAccumulator, RunLifecycle
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import (
    Detect,
    assert_rows,
    batch_pipeline,
    collect_outputs,
    configs,
    detect,
    drained,
    finished,
    raw,
    started,
    streaming_pipeline,
)

FAILURES = configs(chatty={"regression_test_config": {"alert_after_second_test_failure": False}})
SETTINGS = GraphSettings(FAILURES, RunLifecycle(grace_seconds=60, timeout_seconds=3600))
TABLES = (JOB_HISTORY.name, ALERTS.name, DEAD_LETTER.name)
NOTES = RunAccumulator.MAX_EVENTS + 150
END = T0 + 100


def chatty_run() -> List[RawMessage]:
    """run_started, NOTES notes at distinct times (a few pairs at one time, told apart by their data), 100 per
    message, and run_finished in the message with the last notes."""
    notes = [("note", T0 + 1 + (i - i % 2) / 100, {"i": i}) for i in range(NOTES)]
    messages = [raw("chatty", "r", "start", events=[started(T0)])]
    messages += [raw("chatty", "r", f"notes/{i}", points=[("loss", 1.0, i, T0 + 1)], events=notes[i:i + 100])
                 for i in range(0, NOTES - 50, 100)]
    messages.append(raw("chatty", "r", "end", events=notes[NOTES - 50:] + [finished(END, "failure")]))
    return messages


def rows(outputs, side: str = "") -> Dict[str, beam.PCollection]:
    return {f"{side}{name}": outputs[name] | f"Json_{side}{name}" >> beam.Map(json.dumps, sort_keys=True)
            for name in TABLES}


def sides(found: Dict[str, List[str]], names) -> Dict[str, Dict[str, List[str]]]:
    return {side: {name: sorted(found[f"{side}.{name}"]) for name in TABLES} for side in names}


def replayed(check: Callable[..., None], **orders: List[RawMessage]) -> None:
    """One bounded pipeline with a graph per order of the messages; ``check(order={table: sorted JSON rows})`` in
    ``assert_that``."""
    with batch_pipeline() as p:
        tables = {}
        for side, messages in orders.items():
            tables.update(rows(p | f"Create_{side}" >> beam.Create(messages) | f"Detect_{side}" >> Detect(SETTINGS),
                               f"{side}."))
        assert_rows(tables, lambda found: check(**sides(found, tuple(orders))), label="tables")


def replayed_rows(messages) -> Dict[str, List[str]]:
    """The replay's rows, as the expected side of the comparison with a stream (a pipeline of its own)."""
    with batch_pipeline() as p:
        collected = {name: collect_outputs(pcoll, name) for name, pcoll in rows(detect(p | beam.Create(messages),
                                                                                          SETTINGS)).items()}
    return {name: sorted(found) for name, found in collected.items()}


def streamed(messages, check: Callable[[Dict[str, List[str]]], None]) -> None:
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for first in range(0, len(messages), 3):
        stream = stream.add_elements(messages[first:first + 3])
    with streaming_pipeline() as p:
        tables = rows(detect(p | drained(stream, END + 86400), dataclasses.replace(SETTINGS, streaming=True)))
        assert_rows(tables, lambda found: check({name: sorted(found) for name, found in found.items()}),
                    label="tables")


def check(found: Dict[str, List[str]]) -> None:
    (job,) = [json.loads(row) for row in found[JOB_HISTORY.name]]
    assert (job["job_status"], job["timestamp"], job["num_failures"]) == ("failure", "2025-11-20T00:01:40.000000Z", 0)
    events = json.loads(job["events"])
    assert [e["type"] for e in events if e["type"] != "note"] == ["run_started", "run_finished"]
    assert [e["data"]["i"] for e in events if e["type"] == "note"] == list(range(RunAccumulator.MAX_EVENTS))
    assert [json.loads(row)["kind"] for row in found[ALERTS.name]] == ["job_failed"]  # not run_missing
    dead = [json.loads(row) for row in found[DEAD_LETTER.name]]
    assert {row["reason"] for row in dead} == {f"too many events in run (limit {RunAccumulator.MAX_EVENTS})"}
    assert sorted(json.loads(row["payload"])["data"]["i"] for row in dead) == list(
        range(RunAccumulator.MAX_EVENTS, NOTES))


def test_a_run_over_its_events_limit_ends_on_its_own_run_finished_in_any_order():
    """Before: the events after the first MAX_EVENTS to arrive were dead letters, run_finished among them when it
    came last, and the run became missing with a run_missing alert."""
    messages = chatty_run()
    shuffled = []
    for seed in range(2):
        random.Random(seed).shuffle(messages)
        shuffled.append(list(messages))

    def check_all(in_order, first, second):
        check(in_order)
        assert first == in_order
        assert second == in_order
    replayed(check_all, in_order=chatty_run(), first=shuffled[0], second=shuffled[1])


def test_a_stream_keeps_and_leaves_out_the_same_events_as_a_replay():
    messages = chatty_run()
    random.Random(5).shuffle(messages)
    expected = replayed_rows(messages)

    def check_all(found):
        check(found)
        assert found == expected
    streamed(messages, check_all)
