import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.stats import percentile
from core.windows import (
    AGGREGATIONS,
    COUNT,
    COUNT_OR_TIME,
    TIME,
    TagWindows,
    WindowPoint,
    WindowSpec,
    window_aggregates,
)
from tests.support import T0


def points(n, start=T0, every=1.0, step_every=10):
    return [(start + i * every, i * step_every, float(i)) for i in range(n)]


def feed(windows, pts, watermark=None):
    emitted = []
    for p in pts:
        emitted += windows.add(WindowPoint(*p))
    emitted += windows.settle(math.inf if watermark is None else watermark)
    return emitted


def summary(ws):
    return [(w.kind, w.index, len(w.points), w.revision, w.partial) for w in ws]


def test_count_windows_take_n_points_in_step_order_whatever_the_arrival_order():
    pts = points(25)
    shuffled = pts[:]
    random.Random(3).shuffle(shuffled)
    windows = TagWindows(WindowSpec(count=10))
    emitted = feed(windows, shuffled, watermark=T0 + 100)
    assert summary(emitted) == [(COUNT, 0, 10, 0, False), (COUNT, 1, 10, 0, False)]
    assert [p[1] for p in emitted[1].points] == list(range(100, 200, 10))
    assert (emitted[1].start_step, emitted[1].end_step) == (100, 190)
    assert summary(windows.close()) == [(COUNT, 2, 5, 0, True)]


def test_points_wait_for_the_watermark_before_they_are_placed():
    windows = TagWindows(WindowSpec(count=2))
    assert windows.add(WindowPoint(T0 + 5, 50, 1.0)) == []
    assert windows.settle(T0 + 4) == [] and windows.next_due() == T0 + 5
    windows.add(WindowPoint(T0 + 1, 10, 2.0))  # earlier step arrives later: still first
    (window,) = windows.settle(T0 + 5)
    assert [p[1] for p in window.points] == [10, 50]


def test_fixed_time_windows_close_when_the_watermark_passes_their_end():
    windows = TagWindows(WindowSpec(time_seconds=10))
    start = math.floor(T0 / 10) * 10
    for p in points(25, start=start):
        windows.add(WindowPoint(*p))
    assert summary(windows.settle(start + 19.5)) == [(TIME, start // 10, 10, 0, False)]
    assert windows.next_due() == start + 20
    closed = windows.settle(start + 20)
    assert summary(closed) == [(TIME, start // 10 + 1, 10, 0, False)]
    assert (closed[0].start_time, closed[0].end_time) == (start + 10, start + 20)
    assert summary(windows.close()) == [(TIME, start // 10 + 2, 5, 0, True)]


def test_sliding_time_windows_overlap():
    windows = TagWindows(WindowSpec(time_seconds=10, period_seconds=5))
    start = math.floor(T0 / 10) * 10
    emitted = feed(windows, points(20, start=start), watermark=start + 20)
    counts = {w.index: len(w.points) for w in emitted}
    k = int(start // 5)
    assert counts == {k - 1: 5, k: 10, k + 1: 10, k + 2: 10}


def test_count_or_time_closes_on_whichever_comes_first():
    windows = TagWindows(WindowSpec(count=5, time_seconds=3))
    pts = points(3, every=1.0) + [(T0 + 10 + i * 0.1, 100 + i, 1.0) for i in range(7)]
    emitted = feed(windows, pts)
    assert [len(w.points) for w in emitted] == [3, 5]  # time closed the first, count the second
    assert [len(w.points) for w in windows.close()] == [2]
    assert emitted[0].kind == COUNT_OR_TIME


def test_late_point_within_lateness_updates_its_window_with_a_new_revision():
    windows = TagWindows(WindowSpec(count=3))
    feed(windows, points(7), watermark=T0 + 10)  # windows 0 and 1 emitted, one point open
    (updated,) = windows.add(WindowPoint(T0 + 3.5, 35, 100.0))
    assert (updated.index, updated.revision, len(updated.points)) == (1, 1, 4)
    assert updated.points[1][1] == 35  # in step order
    assert windows.add(WindowPoint(T0 + 20, 200, 1.0)) == []  # after the open window's start: a normal point


def test_late_point_in_a_time_window():
    windows = TagWindows(WindowSpec(time_seconds=10))
    start = math.floor(T0 / 10) * 10
    (window,) = feed(windows, points(10, start=start), watermark=start + 10)
    (updated,) = windows.add(WindowPoint(start + 2.5, 7, 50.0))
    assert updated is window and updated.revision == 1 and len(updated.points) == 11


def test_expired_windows_can_no_longer_be_updated():
    windows = TagWindows(WindowSpec(count=3))
    feed(windows, points(6), watermark=T0 + 10)
    windows.expire(before=T0 + 100)
    assert windows.emitted == {} and windows.add(WindowPoint(T0 + 1.5, 15, 1.0)) == []


def test_aggregates_match_numpy():
    pts = [(T0 + i, i, v) for i, v in enumerate([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])]
    values = np.array([p[2] for p in pts])
    agg = window_aggregates([WindowPoint(*p) for p in pts], AGGREGATIONS)
    assert agg["last"] == 6.0 and agg["min"] == 1.0 and agg["max"] == 9.0 and agg["sum"] == 31.0
    assert agg["mean"] == pytest.approx(values.mean()) and agg["stddev"] == pytest.approx(values.std())
    for q in (50, 90, 99):
        assert agg[f"p{q}"] == pytest.approx(np.percentile(values, q))
    hist = json.loads(agg["histogram"])
    assert sum(hist["counts"]) == 8 and hist["edges"][0] == 1.0 and hist["edges"][-1] == pytest.approx(9.0)
    np_counts, _ = np.histogram(values, bins=10, range=(1.0, 9.0))
    assert hist["counts"] == list(np_counts)


def test_single_value_window():
    agg = window_aggregates([WindowPoint(T0, 1, 2.5)], AGGREGATIONS)
    assert agg["stddev"] == 0.0 and agg["p99"] == 2.5 and json.loads(agg["histogram"])["counts"][0] == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1, max_size=80,
                unique_by=lambda x: x[0]),
       st.randoms(use_true_random=False),
       st.sampled_from([WindowSpec(count=7), WindowSpec(time_seconds=20), WindowSpec(time_seconds=20, period_seconds=5),
                        WindowSpec(count=5, time_seconds=30)]))
def test_windows_do_not_depend_on_arrival_order(raw, rng, spec):
    pts = [(T0 + step * 0.5, step, value) for step, value in raw]
    shuffled = pts[:]
    rng.shuffle(shuffled)

    def run(order):
        windows = TagWindows(spec)
        emitted = feed(windows, order, watermark=T0 + 100) + windows.close()
        return [(w.index, w.points, w.partial, w.start_time, w.end_time) for w in emitted]

    assert run(shuffled) == run(pts)


def test_percentile_interpolates():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0], 90) == 1.0
