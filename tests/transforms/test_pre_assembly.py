"""A bounded replay takes each bundle's messages into their runs before the shuffle (``PreAssembleRunsFn``):
one element per run crosses it instead of one per message, and the rows are the same."""

from __future__ import annotations

import dataclasses
import json
import random

import apache_beam as beam
import pytest
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from core.parse import FileSpan, content_digest, different_copy_reason, summarize
from core.records import dead_letter_row
from core.runs import RunAccumulator, RunLifecycle
from core.schema import DEAD_LETTER
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, finished, gather, raw, started
from tests.transforms.test_containment import CONFIG, suite
from trainguard import wire
from transforms.parse import ParseMessages, SummarizeMessages
from transforms.run_parts import AssembleRunPartsFn, PreAssembleRunsFn
from transforms.runs import AssembleRuns


def chatty_run() -> list:
    """A run with more events than a run keeps: the ones over the limit are dead letters."""
    events_per_message = 100
    count = RunAccumulator.MAX_EVENTS // events_per_message + 2
    messages = [raw("cifar", "chatty", f"chatty/{i}", points=[("loss", 1.0 / (i + 1), i, T0 + i)],
                    events=[("note", T0 + i + j / 1000, {"j": j}) for j in range(events_per_message)])
                for i in range(count)]
    return [raw("cifar", "chatty", "chatty/start", events=[started(T0 - 1)]), *messages,
            raw("cifar", "chatty", "chatty/end", events=[finished(T0 + count + 1)])]


def assemble(messages: list, bounded: bool):
    with batch_pipeline() as p:
        parsed, _, _ = p | beam.Create(messages) | ParseMessages()
        summaries, _ = parsed | SummarizeMessages(configs(cifar=CONFIG))
        runs, dead, _ = summaries | AssembleRuns(configs(cifar=CONFIG), RunLifecycle(grace_seconds=10),
                                                 bounded=bounded)
        results = gather(runs | beam.Map(repr), "runs")
        dead_letters = gather(dead | beam.Map(json.dumps, sort_keys=True), "dead")
    return sorted(results), sorted(dead_letters)


def test_runs_assembled_before_the_shuffle_give_the_same_results_and_dead_letters():
    messages = suite() + chatty_run()
    random.Random(7).shuffle(messages)
    before_runs, before_dead = assemble(messages, bounded=False)
    runs, dead = assemble(messages, bounded=True)
    assert runs == before_runs and len(runs) == 6
    assert dead == before_dead and len(dead) > 0
    assert {json.loads(row)["reason"] for row in dead} == {
        f"too many events in run (limit {RunAccumulator.MAX_EVENTS})"}


def summaries_of(messages: list) -> list:
    """The MessageSummary of each raw message, as the replay's parse and summarize steps make them."""
    config_set = configs(cifar=CONFIG)
    result = []
    for message in messages:
        parsed, _ = wire.parse_message(message.payload)
        result.append(summarize(parsed, message.payload, config_set.for_test(parsed.test, parsed.event_time),
                                message.span))
    return result


def pre_assembled(bundles: list) -> tuple:
    """The keyed parts and dead-letter rows ``PreAssembleRunsFn`` makes of each bundle of summaries."""
    fn = PreAssembleRunsFn(configs(cifar=CONFIG))
    parts, dead_letters = [], []
    for bundle in bundles:
        fn.start_bundle()
        for summary in bundle:
            for out in fn.process(summary, Timestamp.of(summary.last_time), GlobalWindow()):
                dead_letters.append(out.value)
        parts += [windowed.value for windowed in fn.finish_bundle()]
    return parts, dead_letters


def assemble_parts(parts: list) -> tuple:
    with batch_pipeline() as p:
        outputs = (p | beam.Create(parts, reshuffle=False)
                   | beam.Map(lambda keyed: TimestampedValue(keyed, keyed[1].accumulator.last_time))
                   | beam.ParDo(AssembleRunPartsFn(configs(cifar=CONFIG), RunLifecycle(grace_seconds=10))).with_outputs(
                       DEAD_LETTER.name, main="runs"))
        results = gather(outputs.runs | beam.Map(repr), "runs")
        dead_letters = gather(outputs[DEAD_LETTER.name] | beam.Map(json.dumps, sort_keys=True), "dead")
    return sorted(results), sorted(dead_letters)


def written_to(path, messages: list) -> list:
    """The messages as a replay file's lines, each with the span it lies at (its summary keeps no payload)."""
    spans, offset = [], 0
    with open(path, "wb") as f:
        for message in messages:
            f.write(message.payload + b"\n")
            spans.append(FileSpan(str(path), offset, len(message.payload)))
            offset += len(message.payload) + 1
    return [dataclasses.replace(message, span=span) for message, span in zip(messages, spans)]


def test_a_message_in_two_bundles_counts_once(tmp_path):
    messages = suite() + chatty_run()
    random.Random(3).shuffle(messages)
    once_runs, once_dead = assemble(messages, bounded=False)
    filed = written_to(tmp_path / "replay.jsonl", messages)
    summaries = summaries_of(filed)
    # Three bundles that overlap: every message is in one or two of them, and one bundle has a message twice.
    third = len(summaries) // 3
    bundles = [summaries[:2 * third], summaries[third:] + summaries[third:third + 2], summaries[:third:2]]
    parts, early_dead = pre_assembled(bundles)
    assert len(parts) > 6 and any(len(part.ids) < len(part.accumulator.events) + 100 for _, part in parts)
    runs, dead = assemble_parts(parts)
    assert runs == once_runs and len(runs) == 6
    # Events over a run's limit are found when the run ends: dead letters once, the same ones.
    assert early_dead == [] and dead == once_dead
    assert {json.loads(row)["reason"] for row in dead} == {f"too many events in run (limit {RunAccumulator.MAX_EVENTS})"}


def test_a_repeated_message_whose_file_changed_is_a_dead_letter_not_a_crash(tmp_path):
    messages = [m for m in suite() if "run-0" in m.payload.decode()]
    filed = written_to(tmp_path / "replay.jsonl", messages)
    summaries = summaries_of(filed)
    parts, _ = pre_assembled([summaries[:2], summaries[1:]])  # summaries[1] is in both
    (tmp_path / "replay.jsonl").write_bytes(b"")
    runs, dead = assemble_parts(parts)
    assert len(runs) == 1
    rows = [json.loads(row) for row in dead]
    assert rows and all(row["reason"].startswith("error in assemble run: InvalidMessage") for row in rows), rows
    assert all("could not be read again" in row["payload"] for row in rows)


def other_copy(message):
    """A copy of a message with the same id and other bytes: a point's value, or an event's data, changed."""
    body = json.loads(message.payload)
    if body.get("points"):
        body["points"][0]["value"] += 0.5
    else:
        body["events"][0]["data"]["copy"] = 1
    return dataclasses.replace(message, payload=json.dumps(body, separators=(",", ":")).encode())


@pytest.mark.parametrize("seed", range(3))
def test_which_copy_of_a_message_counts_does_not_depend_on_bundles_or_order(tmp_path, seed):
    rng = random.Random(seed)
    messages = suite() + chatty_run()
    others = [other_copy(m) for m in rng.sample(messages, 6)]
    winners = {}
    for message in messages + others:
        mid = json.loads(message.payload)["id"]
        winners[mid] = min(winners.get(mid, message.payload), message.payload)
    expected_runs, expected_dead = assemble([m for m in messages + others if winners[json.loads(m.payload)["id"]]
                                             == m.payload], bounded=False)
    for copy in messages + others:
        body = json.loads(copy.payload)
        if copy.payload != winners[body["id"]]:
            expected_dead.append(json.dumps(dead_letter_row(
                different_copy_reason(content_digest(winners[body["id"]])), copy.payload,
                f"run:{body['test']}/{body['run']}", wire.parse_message(copy.payload)[0].event_time), sort_keys=True))
    everything = messages + others + rng.sample(messages + others, 8)  # and some copies delivered twice
    rng.shuffle(everything)
    summaries = summaries_of(written_to(tmp_path / "replay.jsonl", everything))
    cuts = sorted(rng.sample(range(1, len(summaries)), 3))
    bundles = [summaries[i:j] for i, j in zip([0, *cuts], [*cuts, len(summaries)])]
    parts, early_dead = pre_assembled(bundles)
    runs, dead = assemble_parts(parts)
    assert early_dead == [] and runs == expected_runs
    assert dead == sorted(expected_dead) and len(dead) > len(others)  # the copies, and events over the limit
