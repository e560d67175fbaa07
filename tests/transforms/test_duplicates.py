"""Copies of a message id through the whole graph: the same bytes count once, silently; different bytes are never
silent: one copy counts (a replay: the one whose bytes sort first, whatever the order; a stream: the first one
delivered) and each other one is a dead letter naming it (README, "Wire contract v1")."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Callable, Dict, List, Optional

import apache_beam as beam
import pytest
from apache_beam.coders import BooleanCoder
from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Duration, Timestamp

from bench.bench_ordered import CodedBag, CodedCell, Timer
from core.config import TestConfig
from core.parse import RawMessage, content_digest, different_copy_reason, summarize
from core.records import dead_letter_row
from core.schema import DEAD_LETTER, JOB_HISTORY
from tests.support import T0
from tests.transforms.support import (
    assert_rows,
    collect_outputs,
    detect,
    drained,
    finished,
    raw,
    started,
    streaming_pipeline,
)
from tests.transforms.test_containment import SETTINGS, TABLES, replay, run_messages, suite
from trainguard import wire
from transforms.coders import RecordCoder
from transforms.parse import DUPLICATE_OF_UNKNOWN, FirstPerKeyFn

RUN = "run-4"
START = T0 + 4 * 3600  # run-4 of the suite: losses 2.0, 2.5, 3.0, 3.5 at START + 1..4, finished at START + 5


def copies_of_a_point() -> List[RawMessage]:
    """Two copies of one message id of run-4: a loss point of 1.0, and the same point with 9.0."""
    return [raw("cifar", RUN, f"{RUN}/extra", points=[("loss", value, 45, START + 4.5)]) for value in (1.0, 9.0)]


def copy_dead_letter(taken: RawMessage, other: RawMessage) -> dict:
    return dead_letter_row(different_copy_reason(content_digest(taken.payload)), other.payload, f"run:cifar/{RUN}",
                           wire.parse_message(other.payload)[0].event_time)


def by_payload(messages: List[RawMessage]) -> List[RawMessage]:
    return sorted(messages, key=lambda m: m.payload)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_replay_counts_the_copy_whose_bytes_sort_first_and_dead_letters_the_other(seed):
    """Before: one copy was dropped with no dead letter, and which one depended on the order."""
    taken, other = by_payload(copies_of_a_point())
    messages = suite() + copies_of_a_point() + [other, taken]  # each copy delivered twice, too
    random.Random(seed).shuffle(messages)
    dead_letter = json.loads(json.dumps(copy_dead_letter(taken, other), sort_keys=True))

    def check(outputs, expected):
        for name in TABLES:  # the rows of the copy taken alone (its windows too), plus one dead letter for the other
            extra = [dead_letter] if name == DEAD_LETTER.name else []
            assert outputs[name] == sorted(expected[name] + extra, key=lambda r: json.dumps(r, sort_keys=True)), name
    replay(check, outputs=messages, expected=suite() + [taken])


def test_copies_splitting_a_run_between_points_and_its_end_are_never_silent():
    """One copy carries the points, the other the run_finished event (same id): before, the run became missing
    with no trace of why. The copy taken is the same in every order, the other is a dead letter."""
    points = raw("cifar", RUN, f"{RUN}/end", points=[("loss", 4.0, 50, START + 5)])
    end = next(m for m in run_messages(RUN, START, [2.0, 2.5, 3.0, 3.5]) if m.payload.count(b"run_finished"))
    taken, other = by_payload([points, end])
    orders = []
    for seed in range(2):
        messages = [m for m in suite() if m.payload != end.payload] + [points, end]
        random.Random(seed).shuffle(messages)
        orders.append(messages)
    expected_dead = [(different_copy_reason(content_digest(taken.payload)), other.payload.decode())]
    expected_status = "success" if taken is end else "missing"

    def check(first, second):
        assert first == second
        dead = [row for row in first[DEAD_LETTER.name] if row["reason"].startswith("duplicate id")]
        assert [(row["reason"], row["payload"]) for row in dead] == expected_dead
        status = {row["run_id"]: row["job_status"] for row in first[JOB_HISTORY.name]}[RUN]
        assert status == expected_status
    replay(check, first=orders[0], second=orders[1])


STREAMING = dataclasses.replace(SETTINGS, streaming=True)


def stream_rows(deliveries: List[List[RawMessage]], base: Optional[List[RawMessage]] = None,
                check: Optional[Callable[[Dict[str, List[dict]]], None]] = None) -> Dict[str, List[dict]]:
    """The streaming graph's rows of the suite's runs (or ``base``), with ``deliveries`` (batches of messages)
    delivered after them, before the watermark passes run-4's end: ``check(rows)`` in ``assert_that``, or without
    ``check`` the rows themselves, as the expected side of a comparison with another stream (two TestStreams are
    two pipelines)."""
    stream = TestStream().advance_watermark_to(Timestamp.of(T0)).add_elements(suite() if base is None else base)
    for batch in deliveries:
        stream = stream.add_elements(batch)
    stream = drained(stream.advance_watermark_to(Timestamp.of(START + 2)), START + 86400)
    with streaming_pipeline() as p:
        outputs = detect(p | stream, STREAMING)
        tables = {name: outputs[name] | f"Json_{name}" >> beam.Map(json.dumps, sort_keys=True) for name in TABLES}
        if check is not None:
            assert_rows(tables, lambda found: check(as_rows(found)), label="tables")
        else:
            collected = {name: collect_outputs(pcoll, name) for name, pcoll in tables.items()}
    return None if check is not None else as_rows(collected)


def as_rows(found: Dict[str, List[str]]) -> Dict[str, List[dict]]:
    return {name: [json.loads(row) for row in sorted(rows)] for name, rows in found.items()}


def test_a_stream_counts_the_copy_delivered_first_and_dead_letters_a_later_different_one():
    one, nine = copies_of_a_point()
    for first, later in ((one, nine), (nine, one)):
        expected = stream_rows([[first]])
        dead_letter = json.loads(json.dumps(copy_dead_letter(first, later), sort_keys=True))

        def check(outputs, expected=expected, dead_letter=dead_letter):
            # Each delivery of the later copy is a dead letter, the same row (one dead_letter_id: one row in a table).
            outputs[DEAD_LETTER.name] = list({row["dead_letter_id"]: row for row in outputs[DEAD_LETTER.name]}.values())
            for name in TABLES:
                extra = [dead_letter] if name == DEAD_LETTER.name else []
                assert outputs[name] == sorted(expected[name] + extra,
                                               key=lambda r: json.dumps(r, sort_keys=True)), name
        stream_rows([[first], [first, later], [later, first]], check=check)  # redeliveries of both


def test_a_stream_says_so_of_a_later_copy_whose_end_was_in_the_copy_it_dropped():
    """The points copy came first: the run has no run_finished and ends as missing, and the copy that had it is a
    dead letter (never silent)."""
    points = raw("cifar", RUN, f"{RUN}/end", points=[("loss", 4.0, 50, START + 5)])
    end = raw("cifar", RUN, f"{RUN}/end", events=[finished(START + 5)])

    def check(outputs):
        assert {row["run_id"]: row["job_status"] for row in outputs[JOB_HISTORY.name]}[RUN] == "missing"
        assert [(row["reason"], row["payload"]) for row in outputs[DEAD_LETTER.name]] == [
            (different_copy_reason(content_digest(points.payload)), end.payload.decode())]
    stream_rows([[points], [end]], [m for m in suite() if m.payload != end.payload], check=check)


def test_a_run_started_message_copied_with_different_bytes_counts_once_in_a_replay():
    start = raw("cifar", RUN, f"{RUN}/start", events=[started(START)])
    other_start = raw("cifar", RUN, f"{RUN}/start", events=[started(START - 1)])
    messages = [m for m in suite() if m.payload != start.payload] + [start, other_start]
    taken, other = by_payload([start, other_start])

    def check(outputs):
        job = {row["run_id"]: row for row in outputs[JOB_HISTORY.name]}[RUN]
        assert [e["time"] for e in json.loads(job["events"]) if e["type"] == "run_started"] == [
            wire.parse_message(taken.payload)[0].event_time]
        assert [row["payload"] for row in outputs[DEAD_LETTER.name]] == [other.payload.decode()]
    replay(check, outputs=messages)


def summary(message: RawMessage):
    parsed, _ = wire.parse_message(message.payload)
    return summarize(parsed, message.payload, TestConfig())


def test_the_streaming_step_keeps_the_digest_of_the_copy_it_took_and_says_when_it_has_none():
    """``seen`` without ``taken_digest`` is an id a job took before it was updated to keep digests."""
    one, nine = map(summary, copies_of_a_point())
    fn = FirstPerKeyFn(Duration(seconds=86400))
    seen, digest, forget = CodedBag(BooleanCoder()), CodedCell(RecordCoder()), Timer()

    def deliver(copy):
        return [(out.tag, out.value["reason"]) if isinstance(out, beam.pvalue.TaggedOutput) else out
                for out in fn.process((copy.id, copy), Timestamp.of(START), seen, digest, forget)]

    assert deliver(one) == [(one.id, one)] and digest.read() == content_digest(one.payload)
    assert forget.at == Timestamp.of(START + 86400)
    assert deliver(one) == [] and deliver(nine) == [(DEAD_LETTER.name, different_copy_reason(digest.read()))]
    fn.on_forget(seen, digest)
    assert deliver(nine) == [(nine.id, nine)]  # after the horizon: a new message
    seen.data, digest.data = [], None
    seen.add(True)  # what the job before the update left
    assert deliver(one) == [(DEAD_LETTER.name, DUPLICATE_OF_UNKNOWN)] == deliver(nine)
