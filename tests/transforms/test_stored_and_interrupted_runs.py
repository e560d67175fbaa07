"""Restarts without loss or duplicates, stage by stage: messages of stored runs, runs a drain cuts short, resumed runs.

A bounded pipeline's input ends as a drain does: the watermark jumps to the end of time and every timer fires at
its own event time. ``clock`` says what the wall clock reads meanwhile.
"""

import json

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from core import encoding
from core.history import HistorySeed
from core.records import job_history_row, stable_id
from core.runs import RunLifecycle, open_run_text
from core.schema import DEAD_LETTER
from tests.support import T0
from tests.transforms.support import assert_rows, batch_pipeline, collect_outputs, configs, finished, raw, started
from transforms.parse import ParseMessages, SummarizeMessages
from transforms.runs import AssembleRuns, SkipStoredRuns, stored_run_reason

CONFIGS = configs()
LIFECYCLE = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0, clock_skew_seconds=600.0)
BEFORE_DRAIN = [raw("t", "r", "m0", points=[("acc", 10.0, 1, T0 + 10)], events=[started(T0)]),
                raw("t", "r", "m1", points=[("acc", 20.0, 2, T0 + 20), ("loss", 3.0, 2, T0 + 20)])]
AFTER_DRAIN = [raw("t", "r", "m2", points=[("acc", 30.0, 3, T0 + 900), ("loss", 1.0, 3, T0 + 900)]),
               raw("t", "r", "m3", events=[finished(T0 + 1000)])]


def drain_time():
    return T0 + 30.0  # the wall clock when the input ends: the run's timeout (T0 + 20 + 3600) is far ahead


def much_later():
    return T0 + 86400.0  # the run's timeout passed long ago: it is missing, not interrupted


def summaries(p, messages, label):
    parsed, _, _ = p | f"Create{label}" >> beam.Create(messages) | f"Parse{label}" >> ParseMessages()
    summarized, _ = parsed | f"Summarize{label}" >> SummarizeMessages(CONFIGS)
    return summarized


def assemble(messages, seed=None, interruptions=False, clock=drain_time, seed_copies=1, check=None):
    """One bounded job: ``check(runs, dead, interrupted)`` on its (finalized runs, dead letters, interrupted runs),
    in ``assert_that``; without ``check``, those lists themselves: what a later job is seeded with or compared
    to (a job of its own, as on Dataflow)."""
    with batch_pipeline() as p:
        seed_pcoll = None if seed is None else p | "Seed" >> beam.Create([seed] * seed_copies)
        runs, dead, interrupted = summaries(p, messages, "") | AssembleRuns(
            CONFIGS, LIFECYCLE, seed_pcoll, interruptions=interruptions, clock=clock)
        outputs = {"runs": runs, "dead": dead, "interrupted": interrupted}
        if check is not None:
            assert_rows(outputs, lambda found: check(found["runs"], found["dead"], found["interrupted"]))
        else:
            results = tuple(collect_outputs(pcoll, name) for name, pcoll in outputs.items())
    return None if check is not None else results


def test_a_run_open_when_its_streaming_job_is_drained_is_interrupted_not_missing():
    def check(runs, dead, interrupted):
        assert runs == [] and dead == []
        [run] = interrupted
        assert run.status == "interrupted" and run.metrics == () and run.finalized_at == drain_time()
    assemble(BEFORE_DRAIN, interruptions=True, check=check)
    # a replay (no interruptions), or a run whose own timeout has passed, ends as missing
    for kwargs in ({"interruptions": False}, {"interruptions": True, "clock": much_later}):
        def missing(runs, _, interrupted, kwargs=kwargs):
            assert [r.status for r in runs] == ["missing"] and interrupted == [], kwargs
        assemble(BEFORE_DRAIN, **kwargs, check=missing)

    # a run that finished is finalized as it always was, drain or not
    def finished_run(runs, _, interrupted):
        assert [r.status for r in runs] == ["success"] and interrupted == []
    assemble(BEFORE_DRAIN + AFTER_DRAIN, interruptions=True, check=finished_run)


def stored_open_run(interrupted_run):
    """What the next job's seed holds of an interrupted run: its state, read back from its job_history row."""
    events = json.loads(job_history_row(interrupted_run)["events"])
    return encoding.from_text(open_run_text(events))


def test_the_next_job_resumes_the_run_and_ends_it_as_if_no_drain_had_happened():
    [whole] = assemble(BEFORE_DRAIN + AFTER_DRAIN)[0]
    [cut] = assemble(BEFORE_DRAIN, interruptions=True)[2]
    seed = HistorySeed(open_runs={("t", "r"): stored_open_run(cut)})
    assert {m.name for m in whole.metrics} >= {"acc_final", "loss_final"} and whole.start_time == T0

    def check(runs, dead, interrupted):
        assert dead == [] and interrupted == []
        assert runs == [whole]
    assemble(AFTER_DRAIN, seed=seed, interruptions=True, clock=much_later, check=check)


def test_a_run_resumed_twice_from_the_same_stored_state_takes_it_once():
    """Whether Dataflow runs the seed step again on an update is not documented: if it does, the same stored
    state reaches the run again, and must not be counted twice."""
    [whole] = assemble(BEFORE_DRAIN + AFTER_DRAIN)[0]
    [cut] = assemble(BEFORE_DRAIN, interruptions=True)[2]
    seed = HistorySeed(open_runs={("t", "r"): stored_open_run(cut)})

    def check(runs, dead, interrupted):
        assert dead == [] and interrupted == []
        assert runs == [whole]
    assemble(AFTER_DRAIN, seed=seed, interruptions=True, clock=much_later, seed_copies=2, check=check)


def test_a_resumed_run_that_never_hears_again_ends_as_missing_at_its_own_timeout():
    [cut] = assemble(BEFORE_DRAIN, interruptions=True)[2]
    seed = HistorySeed(open_runs={("t", "r"): stored_open_run(cut)})

    def missing(runs, _, __):
        [run] = runs
        assert run.status == "missing" and run.finalized_at == T0 + 20 + 3600
    assemble([], seed=seed, interruptions=True, clock=much_later, check=missing)
    # drained again before its timeout: interrupted again, with the same state
    state = stored_open_run(cut).to_state()

    def interrupted_again(_, __, interrupted):
        [again] = interrupted
        assert stored_open_run(again).to_state() == state
    assemble([], seed=seed, interruptions=True, clock=drain_time, check=interrupted_again)


def test_messages_of_stored_runs_are_dead_letters_in_a_streaming_job_and_only_counted_in_a_replay():
    seed = HistorySeed(stored_runs=frozenset({("t", "r")}))
    messages = BEFORE_DRAIN + [raw("t", "other", "o1", points=[("acc", 1.0, 1, T0)])]
    for streaming in (True, False):
        with batch_pipeline() as p:
            new, dead = summaries(p, messages + BEFORE_DRAIN[:1], "") | SkipStoredRuns(
                beam.pvalue.AsSingleton(p | "Seed" >> beam.Create([seed])), dead_letter=streaming)
            assert_that(new | beam.Map(lambda m: (m.run, m.id)), equal_to([("other", "o1")]), label="new")
            assert_that(dead, check_stored_dead_letters if streaming else equal_to([]), label="dead")


def check_stored_dead_letters(kept):
    payloads = {m.payload.decode() for m in BEFORE_DRAIN}
    assert {d["payload"] for d in kept} == payloads and len(kept) == 3  # m0 came twice
    assert {d["reason"] for d in kept} == {stored_run_reason("t", "r")}
    assert "run already stored: t/r was finalized by an earlier job" in kept[0]["reason"]
    assert {d["source"] for d in kept} == {"run:t/r"}
    # the same message twice is the same row: the table's key makes it one
    assert len({d[DEAD_LETTER.key[0]] for d in kept}) == 2
    assert {d["dead_letter_id"] for d in kept} == {stable_id("run:t/r", stored_run_reason("t", "r"), p)
                                                   for p in payloads}
