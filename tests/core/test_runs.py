import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import MetricCollectionConfig, TestConfig, TimeToAccuracy
from core.parse import summarize
from core.runs import RankedEvent, RunAccumulator, RunLifecycle
from core.stats import exact_batch_units, exact_mean, exact_units
from core.vocabulary import RunStatus
from tests.support import T0
from trainguard import wire

ALL = TestConfig(MetricCollectionConfig(default_aggregation_strategies=("final", "min", "max", "average")))


def msg(points=(), events=(), mid="m"):
    return wire.Message(mid, "t", "r", tuple(points), tuple(wire.Event(*e) for e in events))


def started(t=T0):
    return ("run_started", t, {"logs_link": "http://logs/1"})


def finished(t, status="success", failures=0):
    return ("run_finished", t, {"status": status, "num_failures": failures})


def result(messages, config=ALL, grace=60.0, timeout=3600.0):
    accumulator = RunAccumulator("t", "r")
    for m in messages:
        accumulator.add(summarize(m, b"", config))
    return accumulator.result(config, RunLifecycle(grace_seconds=grace, timeout_seconds=timeout))


def metrics(run):
    return {m.name: (m.value, m.step) for m in run.metrics}


def test_strategies_final_min_max_average_with_steps():
    run = result([msg([("acc", 1.0, 1, T0 + 1), ("acc", 3.0, 2, T0 + 2), ("acc", 2.0, 3, T0 + 3)],
                      [started(), finished(T0 + 10)])])
    assert metrics(run) == {"acc_final": (2.0, 3), "acc_min": (1.0, 1), "acc_max": (3.0, 2),
                            "acc_average": (2.0, None), "total_wall_time": (10.0, None)}
    assert run.status == "success" and run.num_failures == 0
    assert run.start_time == T0 and run.end_time == T0 + 10 and run.duration == 10
    assert run.finalized_at == T0 + 10 + 60
    assert run.run_data == {"logs_link": "http://logs/1", "status": "success", "num_failures": 0}


def test_final_is_latest_time_then_highest_step():
    run = result([msg([("a", 1.0, 5, T0 + 2), ("a", 2.0, 7, T0 + 2), ("a", 3.0, 9, T0 + 1)])])
    assert metrics(run)["a_final"] == (2.0, 7)


def test_min_and_max_ties_pick_the_earliest_point():
    run = result([msg([("a", 1.0, 5, T0 + 2), ("a", 1.0, 3, T0 + 1), ("a", 1.0, 4, T0 + 1)])])
    assert metrics(run)["a_min"] == (1.0, 3) and metrics(run)["a_max"] == (1.0, 3)


def test_average_is_exact():
    values = [1e16, 1.0, -1e16, 1.0] * 10
    run = result([msg([("a", v, i, T0 + i) for i, v in enumerate(values)])])
    assert metrics(run)["a_average"][0] == 0.5  # a naive running sum gives 0.0


def test_exact_batch_sum_matches_exact_rational_sum():
    from fractions import Fraction
    for values in ([0.1] * 10, [1e308, 1e308, -1e308], [1e-300, 1e300, -1e300, 3.0], [5e-324, 5e-324], [0.0, -0.0]):
        exact, before = sum(map(Fraction, values)), list(values)
        assert Fraction(exact_batch_units(values), 2 ** 1074) == exact
        assert values == before  # its passes work on a copy


def test_exact_units_round_trip():
    for value in [0.0, 1.0, -2.5, 5e-324, 1.7976931348623157e308, 0.1]:
        assert exact_mean(exact_units(value), 1) == value


def test_ignored_tags_and_strategy_overrides():
    config = TestConfig(MetricCollectionConfig(metric_to_aggregation_strategies={"loss": ("min",)},
                                               tags_to_ignore=frozenset({"noise"})))
    run = result([msg([("loss", 2.0, 1, T0 + 1), ("loss", 1.0, 2, T0 + 2), ("noise", 9.0, 1, T0 + 1),
                       ("acc", 5.0, 2, T0 + 2)])], config)
    assert metrics(run) == {"loss_min": (1.0, 2), "acc_final": (5.0, 2)}
    assert run.tags_seen == ("acc", "loss")


def test_time_to_accuracy_from_run_start():
    config = TestConfig(MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 0.9)))
    run = result([msg([("acc", 0.5, 1, T0 + 10), ("acc", 0.95, 2, T0 + 30), ("acc", 0.91, 3, T0 + 20)],
                      [started(T0)])], config)
    assert metrics(run)["time_to_accuracy"] == (20.0, 3)
    assert not run.time_to_accuracy_missed


def test_time_to_accuracy_never_reached_gives_no_value():
    config = TestConfig(MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 0.99)))
    run = result([msg([("acc", 0.5, 1, T0 + 10)], [started(T0), finished(T0 + 20)])], config)
    assert "time_to_accuracy" not in metrics(run) and run.time_to_accuracy_missed


def test_a_run_keeps_the_best_accuracy_it_reached_and_its_step():
    """What a lifecycle alert says of a run that failed or never reached its accuracy: the accuracy tag's
    highest value, the earliest step of it, whatever the order of the points."""
    config = TestConfig(MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 0.99)))
    points = [("acc", 0.5, 1, T0 + 10), ("acc", 0.81, 3, T0 + 30), ("acc", 0.7, 4, T0 + 40), ("acc", 0.81, 5, T0 + 50)]
    for ordered in (points, points[::-1]):
        run = result([msg(ordered, [started(T0)])], config)
        assert (run.accuracy_best, run.accuracy_best_step) == (0.81, 3)
    assert result([msg(points, [started(T0)])], TestConfig()).accuracy_best is None  # no accuracy tag configured


def test_run_without_finish_is_missing_and_ends_at_last_activity():
    run = result([msg([("a", 1.0, 1, T0 + 5)], [started(T0)])], timeout=100.0)
    assert run.status == RunStatus.MISSING and run.num_failures is None
    assert run.end_time == T0 + 5 and run.finalized_at == T0 + 105
    assert "total_wall_time" not in metrics(run)


def test_failed_run_keeps_status_and_failures():
    run = result([msg(events=[started(), finished(T0 + 5, "failure", 3)])])
    assert run.status == "failure" and run.num_failures == 3


def test_a_run_over_its_events_limit_keeps_its_lifecycle_events_and_ends_on_its_own_run_finished():
    """Before: the events after the first MAX_EVENTS to arrive were dropped, run_finished among them, and the run
    ended as missing at its timeout."""
    notes = [("note", T0 + 1 + i / 100, {"i": i}) for i in range(RunAccumulator.MAX_EVENTS + 250)]
    messages = ([msg(events=notes[i:i + 100], mid=f"notes/{i}") for i in range(0, len(notes), 100)]
                + [msg(events=[started(), finished(T0 + 100, "failure", 2)], mid="lifecycle")])
    accumulator, over = RunAccumulator("t", "r"), []
    for m in messages:
        over += accumulator.add(summarize(m, b"", ALL))
    run = accumulator.result(ALL, RunLifecycle(grace_seconds=60, timeout_seconds=3600))
    assert (run.status, run.num_failures, run.end_time, run.finalized_at) == ("failure", 2, T0 + 100, T0 + 160)
    assert [(e.type, e.time) for e in run.events if e.type != "note"] == [("run_started", T0),
                                                                         ("run_finished", T0 + 100)]
    # The first MAX_EVENTS other events in time are kept, whatever came when; the rest are returned once.
    assert [e.data["i"] for e in run.events if e.type == "note"] == list(range(RunAccumulator.MAX_EVENTS))
    assert sorted(e.data["i"] for e in over) == list(range(RunAccumulator.MAX_EVENTS, len(notes)))
    assert accumulator.at_event_limit()


class FewEvents(RunAccumulator):
    MAX_EVENTS = 4


def event_key(event: RankedEvent):
    return event.time, event.type, event.rank if event.rank is not None else 0, json.dumps(event.data, sort_keys=True)


events = st.tuples(st.sampled_from(["note", "epoch", "run_started", "run_finished"]),
                   st.sampled_from([T0, T0 + 1, T0 + 2]),  # ties in time: then type, rank and data decide
                   st.fixed_dictionaries({"status": st.just("success"), "k": st.integers(0, 2)}))


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=30), st.randoms(use_true_random=False), st.integers(1, 6), st.integers(0, 30))
def test_the_events_a_run_keeps_and_leaves_out_do_not_depend_on_order_batching_or_merging(items, rng, batch, cut):
    def accumulate(messages):
        accumulator, over = FewEvents("t", "r"), []
        for m in messages:
            over += accumulator.add(summarize(m, b"", ALL))
        return accumulator, over

    reference, reference_over = accumulate([msg(events=items[i:i + 1], mid=str(i)) for i in range(len(items))])
    shuffled = list(items)
    rng.shuffle(shuffled)
    messages = [msg(events=shuffled[i:i + batch], mid=str(i)) for i in range(0, len(shuffled), batch)]
    whole, over = accumulate(messages)
    # Two accumulators of the run merged (a resumed run): the same again.
    first, first_over = accumulate(messages[:cut])
    second, second_over = accumulate(messages[cut:])
    merged_over = first_over + second_over + first.absorb(second)
    for kept, left_out in ((whole, over), (first, merged_over)):
        assert sorted(map(event_key, kept.events)) == sorted(map(event_key, reference.events))
        assert sorted(map(event_key, left_out)) == sorted(map(event_key, reference_over))
    assert sum(1 for e in reference.events if e.type not in ("run_started", "run_finished")) == min(
        4, sum(1 for e in items if e[0] not in ("run_started", "run_finished")))
    assert sorted(map(event_key, reference.events + reference_over)) == sorted(
        event_key(RankedEvent(*e)) for e in items)


def test_events_are_kept_sorted_and_bounded():
    accumulator = RunAccumulator("t", "r")
    overflow = []
    for i in range(RunAccumulator.MAX_EVENTS + 5):
        overflow += accumulator.add(summarize(msg(events=[("tick", T0 + 1000 - i, {"i": i})]), b"", ALL))
    assert len(overflow) == 5
    events = accumulator.result(ALL, RunLifecycle(0, 0)).events
    assert [e.time for e in events] == sorted(e.time for e in events)


point = st.tuples(st.sampled_from(["a", "b/c"]), st.floats(-1e6, 1e6, allow_nan=False),
                  st.one_of(st.none(), st.integers(0, 50)), st.floats(T0, T0 + 100).map(lambda t: round(t, 1)))


@settings(max_examples=200, deadline=None)
@given(st.lists(point, min_size=1, max_size=60), st.randoms(use_true_random=False), st.integers(1, 10))
def test_result_is_identical_for_any_order_and_batching(points, rng, batch):
    events = [started(T0), finished(T0 + 200)]
    reference = result([msg(points, events)])
    items = [("p", p) for p in points] + [("e", e) for e in events]
    rng.shuffle(items)
    messages = []
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        messages.append(msg([x for k, x in chunk if k == "p"], [x for k, x in chunk if k == "e"], mid=str(i)))
    shuffled = result(messages)
    assert shuffled == reference
    for m in shuffled.metrics:  # bit-identical, not merely close
        assert math.copysign(1, m.value) == math.copysign(1, dict((x.name, x.value) for x in reference.metrics)[m.name])
