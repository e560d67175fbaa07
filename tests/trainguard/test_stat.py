"""Stat: client-side aggregation over count and time windows."""

from __future__ import annotations

import datetime
import enum
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainguard as tg
from trainguard.metrics.api import MetricData, MetricHandler, MetricStream
from trainguard.stat import Window, percentile

ALL = ["mean", "min", "max", "sum", "count", "stddev", "p0", "p50", "p90", "p99.9", "p100"]


class Recorder(MetricHandler):
    def __init__(self):
        self.data = []

    def emit(self, metric_data: MetricData):
        self.data.append(metric_data)

    def windows(self, name):
        """Closed windows as dicts {aggregation: value}, in order."""
        out, current = [], {}
        for d in self.data:
            agg = d.name[len(name) + 1:]
            if agg in current:
                out.append(current)
                current = {}
            current[agg] = d.value
        if current:
            out.append(current)
        return out


class Clock:
    def __init__(self, now=1_790_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def expected(values):
    a = np.array(values, dtype=float)
    result = {"mean": a.mean(), "min": a.min(), "max": a.max(), "sum": a.sum(), "count": len(a),
              "stddev": a.std()}
    for q in ("0", "50", "90", "99.9", "100"):
        result[f"p{q}"] = np.percentile(a, float(q))
    return result


def assert_window(got, values):
    want = expected(values)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-6), key


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=0, max_size=120),
       st.integers(min_value=1, max_value=25))
def test_count_windows_match_numpy(values, size):
    recorder = Recorder()
    stat = tg.Stat("m", ALL, window=size, stream=MetricStream("g", recorder))
    for v in values:
        stat.add(v)
    full = len(values) // size
    windows = recorder.windows("m")
    assert len(windows) == full
    for index, got in enumerate(windows):
        assert_window(got, values[index * size:(index + 1) * size])
    stat.flush()
    rest = values[full * size:]
    windows = recorder.windows("m")
    assert len(windows) == full + (1 if rest else 0)
    if rest:
        assert_window(windows[-1], rest)
        assert stat.last["count"] == len(rest)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=5), st.floats(min_value=-100, max_value=100)),
                min_size=1, max_size=80),
       st.floats(min_value=0.5, max_value=10))
def test_time_windows_close_on_the_first_sample_past_the_window(samples, seconds):
    recorder = Recorder()
    clock = Clock()
    window = datetime.timedelta(seconds=seconds)
    seconds = window.total_seconds()  # timedelta keeps microseconds
    stat = tg.Stat("t", ["mean", "count"], window=window,
                   stream=MetricStream("g", recorder), clock=clock)
    groups, current, start, stamps, last_time = [], [], None, [], None
    for gap, value in samples:
        clock.now += gap
        if start is not None and clock.now - start >= seconds:
            groups.append(current)
            stamps.append(last_time)
            current, start = [], None
        if start is None:
            start = clock.now
        current.append(value)
        last_time = clock.now
        stat.add(value)
    windows = recorder.windows("t")
    assert [w["count"] for w in windows] == [len(g) for g in groups]
    for window, group in zip(windows, groups):
        assert window["mean"] == pytest.approx(sum(group) / len(group), abs=1e-9)
    times = sorted({d.timestamp for d in recorder.data})
    assert times == sorted(set(stamps))  # a window is stamped with its last sample's time
    stat.flush()
    assert recorder.windows("t")[-1]["count"] == len(current)


def test_count_or_time_whichever_comes_first():
    recorder, clock = Recorder(), Clock()
    stat = tg.Stat("w", ["sum"], window=Window(count=3, seconds=10), stream=MetricStream("g", recorder),
                   clock=clock)
    for gap in (0, 1, 1, 1, 20, 1):  # 3 samples close by count; then a 20 s gap closes by time
        clock.now += gap
        stat.add(1.0)
    assert [w["count"] for w in recorder.windows("w")] == [3, 1]
    stat.flush()
    assert [w["count"] for w in recorder.windows("w")] == [3, 1, 2]


def test_windows_report_the_last_step_and_count_nonfinite_separately():
    recorder = Recorder()
    stat = tg.Stat("loss", ["max"], window=4, stream=MetricStream("g", recorder))
    for step, value in enumerate([1.0, float("nan"), 2.0, float("inf"), 3.0, 4.0]):
        stat.add(value, step=step)
    stat.add("not a number")
    stat.add(None)
    [window] = recorder.windows("loss")
    assert window == {"max": 4.0, "count": 4, "nonfinite": 2}
    assert {d.step for d in recorder.data} == {5}
    assert stat.invalid == 2


def test_large_windows_sample_percentiles_but_keep_exact_moments():
    random.seed(1234)
    recorder = Recorder()
    values = [float(i) for i in range(20_000)]
    random.shuffle(values)
    stat = tg.Stat("big", ["mean", "min", "max", "sum", "stddev", "p50"], window=20_000, max_samples=500,
                   stream=MetricStream("g", recorder))
    for v in values:
        stat.add(v)
    [window] = recorder.windows("big")
    a = np.array(values)
    assert window["count"] == 20_000
    for key, want in (("mean", a.mean()), ("min", 0.0), ("max", 19_999.0), ("sum", a.sum()), ("stddev", a.std())):
        assert window[key] == pytest.approx(want, rel=1e-9), key
    assert 8_000 < window["p50"] < 12_000  # from a 500-value uniform sample


def test_stat_publishes_through_the_group_handler_configured_at_close():
    recorder = Recorder()
    stat = tg.Stat("lat", ["p50"], window=2, group="serving")
    tg.configure(recorder, "serving")
    stat.add(1.0, step=1)
    stat.add(3.0, step=2)
    assert [(d.group_name, d.name, d.value, d.step) for d in recorder.data] == [
        ("serving", "lat.p50", 2.0, 2), ("serving", "lat.count", 2, 2)]


def test_aggregation_specs():
    class Aggregation(enum.Enum):  # shaped like torch.monitor.Aggregation
        MEAN = 1
        MAX = 2

    stat = tg.Stat("x", [Aggregation.MEAN, "MAX", "p99.5", "mean"], window=1)
    assert stat.aggregations == ("mean", "max", "p99.5")
    for bad in (["median"], ["p101"], ["p-1"], [3]):
        with pytest.raises((ValueError, TypeError)):
            tg.Stat("x", bad, window=1)
    for bad_window in (0, -1, 2.5, Window, "10", True):
        with pytest.raises((ValueError, TypeError)):
            tg.Stat("x", ["mean"], window=bad_window)
    with pytest.raises(ValueError):
        Window()


def test_percentile_matches_numpy_linear():
    data = sorted([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    for q in (0, 12.5, 33.3, 50, 99, 100):
        assert percentile(data, q) == pytest.approx(np.percentile(data, q))
    assert percentile([7.0], 99) == 7.0
    assert not math.isnan(percentile([1.0, 2.0], 50))
