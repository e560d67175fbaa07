"""The training thread's buffer: a flat list of (tag, value, step, time) entries, bounded, taken out oldest first."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np

import trainguard as tg
from tests.support import T0
from trainguard.intake import FIELDS, Intake


def make_intake(max_points=10, points_per_message=3):
    wakes = []
    intake = Intake(max_points, 5, points_per_message, lambda: wakes.append(intake.point_count()), "test")
    return intake, wakes


def test_points_are_taken_out_oldest_first_flat_and_counted():
    intake, wakes = make_intake()
    add = intake.adder("g", group_prefix=False)
    add("loss", 0.5, 1)
    add("lr", np.float32(0.25))  # a snapshot: a float, read now
    assert wakes == []
    add("loss", 0.75, 2)
    assert wakes == [3]  # once a message's worth is in
    intake.add_point("acc", 3, 7, T0)
    assert intake.point_count() == 4 and bool(intake) and wakes == [3, 4]
    assert intake.oldest_time() is not None
    first = intake.take_points(3)
    assert first[0::FIELDS] == ["loss", "lr", "loss"] and first[1::FIELDS] == [0.5, 0.25, 0.75]
    assert first[2::FIELDS] == [1, None, 2]
    assert type(first[5]) is float and all(type(t) is float for t in first[3::FIELDS])
    assert intake.oldest_time() == T0 and intake.point_count() == 1
    assert intake.take_points(5) == ["acc", 3, 7, T0]
    assert intake.point_count() == 0 and not intake and intake.oldest_time() is None
    assert intake.take_points(1) == []


def test_all_floats_holds_until_a_value_or_a_time_that_is_not_a_float_is_logged():
    for log_one in (lambda intake: intake.adder("g", group_prefix=False)("n", 3, 1),  # an int stays an int
                    lambda intake: intake.adder("g", group_prefix=True)("s", "1.5"),
                    lambda intake: intake.add_point("t", 1.0, None, 1_790_000_000),  # an int time
                    lambda intake: intake.add_point("v", 7, None, T0),
                    lambda intake: intake.add_point("v", object(), None, T0)):
        intake, _ = make_intake(max_points=100)
        add, add_grouped = intake.adder("g", group_prefix=False), intake.adder("g", group_prefix=True)
        add("loss", 0.5, 1)
        add_grouped("lr", np.float32(0.25))  # read as a float
        add("x", True)  # so is a bool
        intake.add_point("acc", np.float64(0.5), 7, T0)
        assert intake.all_floats and all(type(x) is float for x in intake.take_points(4)[1::2])
        log_one(intake)
        assert intake.point_count() == 1 and not intake.all_floats
        add("loss", 0.5, 2)
        intake.take_points(2)
        assert not intake.all_floats  # for good


def test_a_full_buffer_drops_the_newest_and_counts_them():
    intake, _ = make_intake(max_points=10)
    add = intake.adder("g", group_prefix=True)
    for i in range(15):
        add("loss", float(i), i)
    assert intake.point_count() == 10 and intake.counts().points_dropped_buffer_full == 5
    assert intake.take_points(10)[0::FIELDS] == [("g", "loss")] * 10
    intake.add_point("x", 1.0, None, T0)
    intake.closed = True
    assert intake.counts().points_unsent_at_exit == 1
    intake.drop_all(count=True)
    assert intake.point_count() == 0 and intake.counts().points_unsent_at_exit == 1


def test_taking_a_message_keeps_the_buffers_allocation():
    # Emptied to nothing, a list gives its memory back and grows again realloc by realloc on the training thread.
    intake, _ = make_intake(max_points=100_000, points_per_message=1000)
    add = intake.adder("g", group_prefix=False)
    for _ in range(3):
        for i in range(1000):
            add("loss", 0.5, i)
        full = sys.getsizeof(intake.points)
        assert len(intake.take_points(1000)) == 1000 * FIELDS
        assert sys.getsizeof(intake.points) == full


def test_logging_leaves_no_object_for_the_garbage_collector_per_point(handlers, tmp_path):
    handler = handlers.jsonl(str(tmp_path / "m.jsonl"), test=None, run=None)  # no run yet: everything stays buffered
    add_value = tg.MetricStream("g", handler).add_value
    gc.collect()
    tracked = len(gc.get_objects())
    for i in range(20_000):
        add_value("loss", i * 0.5, i)
    assert len(gc.get_objects()) - tracked < 100  # a tuple per point would be 20,000
    assert handler.intake.point_count() == 20_000


def test_concurrent_adders_never_interleave_a_points_entries():
    intake, _ = make_intake(max_points=1_000_000, points_per_message=1000)
    add = intake.adder("g", group_prefix=False)
    taken = []
    stop = threading.Event()

    def produce(k):
        for i in range(20_000):
            add(f"t{k}", float(i), i)

    def consume():
        while not stop.is_set() or intake.point_count():
            taken.extend(intake.take_points(500))

    consumer = threading.Thread(target=consume)
    consumer.start()
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    stop.set()
    consumer.join()
    assert len(taken) == 3 * 20_000 * FIELDS
    for k in range(3):
        mine = [(taken[j + 1], taken[j + 2]) for j in range(0, len(taken), FIELDS) if taken[j] == f"t{k}"]
        assert mine == [(float(i), i) for i in range(20_000)]


def test_a_full_buffer_warns_at_first_then_at_most_once_a_minute_with_the_total(monkeypatch, caplog):
    from trainguard import intake as intake_module

    clock = [1000.0]
    monkeypatch.setattr(intake_module.time, "monotonic", lambda: clock[0])
    intake, _ = make_intake(max_points=10)
    add = intake.adder("g", group_prefix=True)
    with caplog.at_level("WARNING", logger="trainguard"):
        for i in range(15):
            add("loss", float(i), i)
        clock[0] += intake_module.OVERFLOW_WARN_INTERVAL_S - 1
        add("loss", 0.0, 15)
        clock[0] += 1
        add("loss", 0.0, 16)
        add("loss", 0.0, 17)
    warnings = [r.getMessage() for r in caplog.records if "buffer is full" in r.getMessage()]
    assert len(warnings) == 2
    assert warnings[0].endswith("(1 dropped so far)") and warnings[1].endswith("(7 dropped so far)")
