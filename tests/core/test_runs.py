import dataclasses
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import MetricCollectionConfig, TestConfig, TimeToAccuracy
from core.encoding import decode, encode
from core.parse import FileSpan, summarize
from core.registry import REGISTRY
from core.runs import RunAccumulator, RunLifecycle, RunPart
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
        exact = sum(map(Fraction, values))
        assert Fraction(exact_batch_units(values), 2 ** 1074) == exact


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


def test_run_without_finish_is_missing_and_ends_at_last_activity():
    run = result([msg([("a", 1.0, 1, T0 + 5)], [started(T0)])], timeout=100.0)
    assert run.status == RunStatus.MISSING and run.num_failures is None
    assert run.end_time == T0 + 5 and run.finalized_at == T0 + 105
    assert "total_wall_time" not in metrics(run)


def test_failed_run_keeps_status_and_failures():
    run = result([msg(events=[started(), finished(T0 + 5, "failure", 3)])])
    assert run.status == "failure" and run.num_failures == 3


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


def test_a_part_without_some_messages_is_the_part_of_the_others_keeping_no_more_events_than_it_did(monkeypatch):
    monkeypatch.setattr(RunAccumulator, "MAX_EVENTS", 4)
    messages = [msg([("loss", 3.0, 0, T0)], [started()], mid="a"),
                msg([("loss", 1.0, 1, T0 + 1)], [("note", T0 + 1, {}), ("note", T0 + 2, {})], mid="b"),
                msg([("loss", 2.0, 2, T0 + 2)], [("note", T0 + 3, {}), ("note", T0 + 4, {})], mid="c")]
    payloads = {m.id: json.dumps(m.id).encode() for m in messages}  # a source: any bytes summary_of knows
    by_payload = {payloads[m.id]: summarize(m, payloads[m.id], ALL) for m in messages}
    part = RunPart(RunAccumulator("t", "r"))
    overflow = [event for m in messages for event in part.take(by_payload[payloads[m.id]])]
    assert [e.time for e in overflow] == [T0 + 4] and list(part.sources())[-1] == ("c", payloads["c"], 1)

    rest, failed = part.without({"b"}, by_payload.__getitem__)
    expected = RunPart(RunAccumulator("t", "r"))
    expected.take(by_payload[payloads["a"]])
    expected.take(dataclasses.replace(by_payload[payloads["c"]], events=by_payload[payloads["c"]].events[:1]))
    assert failed == [] and rest.ids == ["a", "c"]
    assert rest.accumulator.to_state() == expected.accumulator.to_state()
    assert [e.time for e in rest.accumulator.events] == [T0, T0 + 3]  # c's second event was a dead letter already

    unreadable, failed = part.without({"a"}, lambda source: by_payload[source] if source != payloads["b"] else 1 / 0)
    assert unreadable.ids == ["c"] and [(s, type(e)) for s, e in failed] == [(payloads["b"],
                                                                                          ZeroDivisionError)]


def test_a_part_keeps_where_to_read_each_message_again_packed_and_in_order():
    part = RunPart(RunAccumulator("t", "r"))
    taken = [("a", FileSpan("/logs/a.jsonl", 0, 120), None), ("b", b"{\"id\": \"b\"}", 3),
             ("c", FileSpan("/logs/b.jsonl", 7, 9), 0), ("d", FileSpan("/logs/a.jsonl", 121, 2 ** 40), None)]
    for message_id, source, kept in taken:
        part.note_taken(message_id, source, kept)
    assert list(part.sources()) == taken and part.ids == ["a", "b", "c", "d"]
    assert part.files == ["/logs/a.jsonl", "/logs/b.jsonl"]  # each path once
    assert part.has("c") and not part.has("e")
    decoded = decode(encode(part))
    assert list(decoded.sources()) == taken and decoded.has("d")


def test_a_version_1_part_is_read_as_version_2():
    """RunPart's version 1 kept {id: (source, events kept)}; its bytes read as the packed columns."""
    accumulator = RunAccumulator("t", "r")
    v1 = {"accumulator": accumulator, "messages": {"a": (FileSpan("/logs/a.jsonl", 5, 6), None), "b": (b"x", 2)}}
    upgraded = RunPart.from_state(REGISTRY.by_class[RunPart].upgrades[1](v1))
    assert upgraded.accumulator is accumulator
    assert list(upgraded.sources()) == [("a", FileSpan("/logs/a.jsonl", 5, 6), None), ("b", b"x", 2)]
