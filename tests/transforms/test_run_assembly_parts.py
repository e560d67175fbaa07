"""Run assembly's parts alone: a resumed run joined with what the job has of it (``join_resumed``), a replay's
run with one more element (``with_element``, ``whole_run``), and a bundle's run parts (``PreAssembleRunsFn``),
each out at its latest message's time."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from core import encoding
from core.run_parts import RunPart
from core.runs import RunAccumulator, RunLifecycle, RunResult
from core.schema import DEAD_LETTER
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, finished, raw, started
from tests.transforms.test_containment import CONFIG
from tests.transforms.test_pre_assembly import summaries_of
from transforms.run_assembly import join_resumed
from transforms.run_parts import PreAssembleRunsFn, whole_run, with_element

LIFECYCLE = RunLifecycle(grace_seconds=10, timeout_seconds=600)
CONFIGS = configs(cifar=CONFIG)


def accumulator_of(messages: list) -> RunAccumulator:
    """The accumulator of ``messages`` (of one run), taken one by one as ``AssembleRunFn`` takes them."""
    summaries = summaries_of(messages)
    accumulator = RunAccumulator(summaries[0].test, summaries[0].run)
    for summary in summaries:
        accumulator.add(summary)
    return accumulator


def result_of(accumulator: RunAccumulator) -> RunResult:
    return accumulator.result(CONFIGS.for_test(accumulator.test, T0), LIFECYCLE)


def part_of(messages: list) -> RunPart:
    """The run part of ``messages``, offered one by one as ``PreAssembleRunsFn`` offers a bundle's."""
    part = RunPart(RunAccumulator("cifar", "r"))
    for summary in summaries_of(messages):
        part, failed = part.offer(summary, lambda source: pytest.fail(f"read again: {source}"))
        assert failed == []
    return part


BEFORE_THE_DRAIN = [raw("cifar", "r", "m0", points=[("acc", 0.5, 1, T0 + 1)], events=[started(T0)])]
AFTER_THE_DRAIN = [raw("cifar", "r", "m1", points=[("acc", 0.9, 2, T0 + 30)], events=[finished(T0 + 40)])]


def test_a_resumed_run_joined_with_what_the_job_has_of_it_is_the_whole_run_and_neither_changes():
    stored, current = accumulator_of(BEFORE_THE_DRAIN), accumulator_of(AFTER_THE_DRAIN)
    stored_text, current_text = encoding.to_text(stored), encoding.to_text(current)
    joined = join_resumed(stored, current, LIFECYCLE)
    assert [event.type for event in joined.accumulator.events] == ["run_started", "run_finished"]
    assert joined.over_the_limit == []
    assert joined.finalize_at == T0 + 40 + LIFECYCLE.grace_seconds
    assert result_of(joined.accumulator) == result_of(accumulator_of(BEFORE_THE_DRAIN + AFTER_THE_DRAIN))
    assert (encoding.to_text(stored), encoding.to_text(current)) == (stored_text, current_text)


def test_a_resumed_run_the_job_has_nothing_of_is_a_copy_of_it_ending_at_its_own_timeout():
    stored = accumulator_of(BEFORE_THE_DRAIN)
    joined = join_resumed(stored, None, LIFECYCLE)
    assert joined.accumulator is not stored
    assert encoding.to_text(joined.accumulator) == encoding.to_text(stored)
    assert joined.finalize_at == T0 + 1 + LIFECYCLE.timeout_seconds


def test_another_runs_state_is_not_joined():
    with pytest.raises(ValueError, match="cannot merge run"):
        join_resumed(accumulator_of([raw("cifar", "other", "o0", events=[started(T0)])]),
                     accumulator_of(AFTER_THE_DRAIN), LIFECYCLE)


def test_a_replays_run_takes_its_parts_and_a_resumed_run_in_any_order_as_one_run():
    whole = result_of(accumulator_of(BEFORE_THE_DRAIN + AFTER_THE_DRAIN))
    resumed = accumulator_of(BEFORE_THE_DRAIN)
    for first_resumed in (True, False):
        held = None if first_resumed else part_of(AFTER_THE_DRAIN)
        so_far = with_element(held, resumed if first_resumed else None,
                              part_of(AFTER_THE_DRAIN) if first_resumed else resumed,
                              lambda source: pytest.fail(f"read again: {source}"), LIFECYCLE)
        assert so_far.resumed is resumed and so_far.held is not None and so_far.held.ids == ["m1"]
        assert so_far.taken_again_failures == []
        assert so_far.finalize_at == T0 + 40 + LIFECYCLE.grace_seconds
        assert result_of(whole_run(so_far.held, so_far.resumed)) == whole
    assert encoding.to_text(resumed) == encoding.to_text(accumulator_of(BEFORE_THE_DRAIN))  # (not changed)


def test_a_replays_second_part_of_a_run_is_merged_into_the_first():
    so_far = with_element(part_of(BEFORE_THE_DRAIN), None, part_of(AFTER_THE_DRAIN),
                          lambda source: pytest.fail(f"read again: {source}"), LIFECYCLE)
    assert so_far.held is not None and so_far.held.ids == ["m0", "m1"] and so_far.resumed is None
    assert so_far.finalize_at == T0 + 40 + LIFECYCLE.grace_seconds


def test_a_bundles_messages_are_one_part_per_run_out_at_its_latest_messages_time():
    messages = [raw("cifar", "r", "m0", points=[("acc", 0.5, 1, T0 + 1)], events=[started(T0)]),
                raw("cifar", "r", "m1", points=[("acc", 0.9, 2, T0 + 30)], events=[finished(T0 + 40)]),
                raw("cifar", "r", "m1", points=[("acc", 0.9, 2, T0 + 30)], events=[finished(T0 + 40)]),
                raw("cifar", "s", "n0", points=[("acc", 0.7, 1, T0 + 5)])]
    timestamped = [TimestampedValue(summary, summary.last_time) for summary in summaries_of(messages)]
    with batch_pipeline() as p:
        parts = (p | beam.Create(timestamped, reshuffle=False)  # one bundle
                 | beam.ParDo(PreAssembleRunsFn(CONFIGS)).with_outputs(DEAD_LETTER.name, main="parts"))
        assert_that(parts.parts | beam.Map(lambda keyed, at=beam.DoFn.TimestampParam: (
            keyed[0], keyed[1].ids, float(at))), equal_to([
                (("cifar", "r"), ["m0", "m1"], T0 + 40), (("cifar", "s"), ["n0"], T0 + 5)]))
