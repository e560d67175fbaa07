"""A bounded replay takes each bundle's messages into their runs before the shuffle (``PreAssembleRunsFn``):
one element per run crosses it instead of one per message, and the rows are the same."""

from __future__ import annotations

import json
import random

import apache_beam as beam

from core.runs import RunAccumulator, RunLifecycle
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, finished, gather, raw, started
from tests.transforms.test_containment import CONFIG, suite
from transforms.parse import ParseMessages, SummarizeMessages
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
