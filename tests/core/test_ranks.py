"""Distributed runs: the status, times and metrics of a run whose workers report as ranks."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import MetricCollectionConfig, TestConfig, parse_test_config
from core.parse import summarize
from core.runs import RANKS_MISSING, RunAccumulator, RunLifecycle
from tests.support import T0
from trainguard import wire

LIFECYCLE = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0)
FINAL = TestConfig(MetricCollectionConfig(default_aggregation_strategies=("final",)))


def message(rank, points=(), events=(), world_size=4, mid=None):
    return wire.Message(mid or f"m{rank}-{len(points)}-{len(events)}", "t", "r", tuple(points),
                        tuple(wire.Event(*e) for e in events), None, rank, world_size)


def rank_run(rank, loss, status="success", start=T0, end=T0 + 100, world_size=4, restart_count=0):
    events = [("run_started", start + rank, {"host": f"host-{rank}"})]
    if restart_count:
        events.append(("elastic_restart", start + rank, {"restart_count": restart_count}))
    messages = [message(rank, [("loss", loss, 10, start + 50)], world_size=world_size),
                message(rank, events=events, world_size=world_size, mid=f"start-{rank}")]
    if status is not None:
        messages.append(message(rank, events=[("run_finished", end + rank, {
            "status": status, "num_failures": restart_count})], world_size=world_size, mid=f"end-{rank}"))
    return messages


def accumulate(messages, config=FINAL):
    accumulator = RunAccumulator("t", "r")
    for m in messages:
        accumulator.add(summarize(m, b"", config))
    return accumulator


def result(messages, config=FINAL):
    return accumulate(messages, config).result(config, LIFECYCLE)


def four_ranks(failing=None, unfinished=None, **kwargs):
    messages = []
    for rank, loss in enumerate([1.0, 2.0, 3.0, 4.0]):
        status = "failure" if rank == failing else None if rank == unfinished else "success"
        messages += rank_run(rank, loss, status, **kwargs)
    return messages


def test_a_crashed_rank_fails_the_run_even_when_another_rank_finished_last():
    run = result(four_ranks(failing=2))
    assert run.status == "failure"
    assert {m.name: m.value for m in run.metrics}["loss_final"] == 1.0  # rank 0's, not the last logger's


def test_the_run_ends_at_the_first_failure_plus_grace_and_not_before_every_rank_finished():
    assert accumulate(four_ranks(failing=2)).finalize_at(LIFECYCLE) == T0 + 100 + 2 + 60
    healthy = accumulate(four_ranks())
    assert healthy.finalize_at(LIFECYCLE) == T0 + 100 + 3 + 60  # the last rank's run_finished
    waiting = accumulate(four_ranks(unfinished=3))
    assert waiting.finalize_at(LIFECYCLE) == T0 + 100 + 2 + 3600  # still waiting for rank 3: the timeout


def test_a_rank_that_never_finishes_makes_the_run_missing_and_says_which():
    run = result(four_ranks(unfinished=1))
    assert run.status == "missing"
    assert [e.data for e in run.events if e.type == RANKS_MISSING] == [{"ranks": [1]}]


def test_a_rank_never_heard_from_counts_as_missing_when_the_world_size_says_so():
    run = result([m for m in four_ranks() if m.rank != 3])
    assert run.status == "missing"
    assert [e.data for e in run.events if e.type == RANKS_MISSING] == [{"ranks": [3]}]


def test_start_is_the_first_start_end_the_last_end_and_restarts_are_failures():
    run = result(four_ranks(restart_count=2))
    assert run.start_time == T0 and run.end_time == T0 + 103
    assert run.num_failures == 2 and run.status == "success"


def test_events_keep_their_rank():
    run = result(four_ranks())
    assert sorted(e.data["host"] for e in run.events if e.type == "run_started") == [f"host-{r}" for r in range(4)]
    assert '"rank":2' in run.events_json()


@pytest.mark.parametrize("reduction, expected", [("rank0", 1.0), ("mean", 2.5), ("min", 1.0), ("max", 4.0)])
def test_a_tag_is_reduced_across_ranks_as_configured(reduction, expected):
    config = parse_test_config({"metric_collection_config": {"tag_to_rank_reduction": {"loss": reduction}}}, "t")
    run = result(four_ranks(), config)
    assert {m.name: m.value for m in run.metrics}["loss_final"] == expected
    assert sorted((rank, m.value) for rank, m in run.rank_metrics) == [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0)]


def test_rank0_falls_back_to_the_lowest_rank_that_logged_the_tag():
    messages = [m for m in four_ranks() if not (m.rank == 0 and m.points)]
    assert {m.name: m.value for m in result(messages).metrics}["loss_final"] == 2.0


def test_a_single_process_without_ranks_is_unchanged():
    plain = [wire.Message("a", "t", "r", (("loss", 1.0, 10, T0 + 5),), (wire.Event("run_started", T0, {}),)),
             wire.Message("b", "t", "r", (), (wire.Event("run_finished", T0 + 9, {"status": "success"}),))]
    run = result(plain)
    assert run.status == "success" and run.rank_metrics == () and '"rank"' not in run.events_json()
    assert accumulate(plain).finalize_at(LIFECYCLE) == T0 + 9 + 60


def test_without_a_world_size_every_rank_heard_from_must_finish():
    messages = [m for rank in (0, 1) for m in rank_run(rank, 1.0, "success" if rank == 0 else None, world_size=None)]
    assert result(messages).status == "missing"


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32), st.sampled_from([None, 0, 2]), st.sampled_from([None, 1, 3]))
def test_the_result_does_not_depend_on_message_order(seed, failing, unfinished):
    messages = four_ranks(failing=failing, unfinished=unfinished if unfinished != failing else None,
                          restart_count=1)
    shuffled = list(messages)
    random.Random(seed).shuffle(shuffled)
    assert result(shuffled) == result(messages)
