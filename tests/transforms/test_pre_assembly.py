"""A bounded replay takes each bundle's messages into their runs before the shuffle (``PreAssembleRunsFn``):
one element per run crosses it instead of one per message, and the rows are the same."""

from __future__ import annotations

import dataclasses
import json
import random

import apache_beam as beam
import pytest
from apache_beam.transforms.window import TimestampedValue

from core.parse import FileSpan, content_digest, different_copy_reason, summarize
from core.records import dead_letter_row
from core.runs import RunAccumulator, RunLifecycle
from core.schema import DEAD_LETTER
from tests.support import T0
from tests.transforms.support import assert_rows, batch_pipeline, configs, finished, raw, started
from tests.transforms.test_containment import CONFIG, suite
from trainguard import wire
from transforms.parse import ParseMessages, SummarizeMessages
from transforms.run_parts import AssembleRunPartsFn, GroupedRunAssembly, PreAssembleRunsFn
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


def assemble(p, side: str, messages: list, bounded: bool) -> dict:
    """The runs (their repr) and dead letters (JSON) of the replay's run assembly of ``messages``, as ``side``."""
    parsed, _, _ = p | f"Create_{side}" >> beam.Create(messages) | f"Parse_{side}" >> ParseMessages()
    summaries, _ = parsed | f"Summarize_{side}" >> SummarizeMessages(configs(cifar=CONFIG))
    runs, dead, _ = summaries | f"Assemble_{side}" >> AssembleRuns(
        configs(cifar=CONFIG), RunLifecycle(grace_seconds=10), bounded=bounded)
    return {f"{side}.runs": runs | f"Repr_{side}" >> beam.Map(repr),
            f"{side}.dead": dead | f"Json_{side}" >> beam.Map(json.dumps, sort_keys=True)}


def check_sides(tables: dict, check) -> None:
    """``assert_that`` on the sides of one pipeline: ``check(side=(sorted runs, sorted dead letters), ...)``."""
    sides = sorted({name.split(".")[0] for name in tables})
    assert_rows(tables, lambda found: check(**{side: (sorted(found[f"{side}.runs"]), sorted(found[f"{side}.dead"]))
                                               for side in sides}), label="sides")


def test_runs_assembled_before_the_shuffle_give_the_same_results_and_dead_letters():
    messages = suite() + chatty_run()
    random.Random(7).shuffle(messages)

    def check(before, after):
        (before_runs, before_dead), (runs, dead) = before, after
        assert runs == before_runs and len(runs) == 6
        assert dead == before_dead and len(dead) > 0
        assert {json.loads(row)["reason"] for row in dead} == {
            f"too many events in run (limit {RunAccumulator.MAX_EVENTS})"}
    with batch_pipeline() as p:
        check_sides({**assemble(p, "before", messages, bounded=False), **assemble(p, "after", messages, bounded=True)},
                    check)


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
            for out in fn.process(summary):
                dead_letters.append(out.value)
        parts += [windowed.value for windowed in fn.finish_bundle()]
    return parts, dead_letters


def assemble_parts(p, parts: list, side: str = "parts") -> dict:
    """The runs (their repr) and dead letters (JSON) ``AssembleRunPartsFn`` makes of ``parts``, as ``side``."""
    outputs = (p | f"Create_{side}" >> beam.Create(parts, reshuffle=False)
               | f"Timestamp_{side}" >> beam.Map(lambda keyed: TimestampedValue(keyed, keyed[1].accumulator.last_time))
               | f"Assemble_{side}" >> GroupedRunAssembly(AssembleRunPartsFn(configs(cifar=CONFIG), RunLifecycle(
                   grace_seconds=10))))
    return {f"{side}.runs": outputs.runs | f"Repr_{side}" >> beam.Map(repr),
            f"{side}.dead": outputs[DEAD_LETTER.name] | f"Json_{side}" >> beam.Map(json.dumps, sort_keys=True)}


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
    filed = written_to(tmp_path / "replay.jsonl", messages)
    summaries = summaries_of(filed)
    # Three bundles that overlap: every message is in one or two of them, and one bundle has a message twice.
    third = len(summaries) // 3
    bundles = [summaries[:2 * third], summaries[third:] + summaries[third:third + 2], summaries[:third:2]]
    parts, early_dead = pre_assembled(bundles)
    assert len(parts) > 6 and any(len(part.ids) < len(part.accumulator.events) + 100 for _, part in parts)
    assert early_dead == []

    def check(once, parts):
        (once_runs, once_dead), (runs, dead) = once, parts
        assert runs == once_runs and len(runs) == 6
        # Events over a run's limit are found when the run ends: dead letters once, the same ones.
        assert dead == once_dead
        assert {json.loads(row)["reason"] for row in dead} == {
            f"too many events in run (limit {RunAccumulator.MAX_EVENTS})"}
    with batch_pipeline() as p:
        check_sides({**assemble(p, "once", messages, bounded=False), **assemble_parts(p, parts)}, check)


def test_a_repeated_message_whose_file_changed_is_a_dead_letter_not_a_crash(tmp_path):
    messages = [m for m in suite() if "run-0" in m.payload.decode()]
    filed = written_to(tmp_path / "replay.jsonl", messages)
    summaries = summaries_of(filed)
    parts, _ = pre_assembled([summaries[:2], summaries[1:]])  # summaries[1] is in both
    (tmp_path / "replay.jsonl").write_bytes(b"")

    def check(parts):
        runs, dead = parts
        assert len(runs) == 1
        rows = [json.loads(row) for row in dead]
        assert rows and all(row["reason"].startswith("error in assemble run: InvalidMessage") for row in rows), rows
        assert all("could not be read again" in row["payload"] for row in rows)
    with batch_pipeline() as p:
        check_sides(assemble_parts(p, parts), check)


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
    expected_messages = [m for m in messages + others if winners[json.loads(m.payload)["id"]] == m.payload]
    copies_dead = []
    for copy in messages + others:
        body = json.loads(copy.payload)
        if copy.payload != winners[body["id"]]:
            copies_dead.append(json.dumps(dead_letter_row(
                different_copy_reason(content_digest(winners[body["id"]])), copy.payload,
                f"run:{body['test']}/{body['run']}", wire.parse_message(copy.payload)[0].event_time), sort_keys=True))
    everything = messages + others + rng.sample(messages + others, 8)  # and some copies delivered twice
    rng.shuffle(everything)
    summaries = summaries_of(written_to(tmp_path / "replay.jsonl", everything))
    cuts = sorted(rng.sample(range(1, len(summaries)), 3))
    bundles = [summaries[i:j] for i, j in zip([0, *cuts], [*cuts, len(summaries)])]
    parts, early_dead = pre_assembled(bundles)
    assert early_dead == []

    def check(expected, parts):
        (expected_runs, expected_dead), (runs, dead) = expected, parts
        assert runs == expected_runs
        # the copies, and events over the limit
        assert dead == sorted(expected_dead + copies_dead) and len(dead) > len(others)
    with batch_pipeline() as p:
        check_sides({**assemble(p, "expected", expected_messages, bounded=False), **assemble_parts(p, parts)}, check)
