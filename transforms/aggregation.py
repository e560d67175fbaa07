"""Per-run aggregation of metric points: pure Python, no Beam.

A ``RunAccumulator`` absorbs the messages of one run in any order and any
grouping and always ends in the same result: every operation is commutative
and ties are broken on content (time, then step, then value), and the sum
behind ``average`` is exact (an integer in units of the smallest double), so
that replaying the same messages in another order yields the same bits.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Tuple

from pipeline.config import TIME_TO_ACCURACY_METRIC, TOTAL_WALL_TIME_METRIC, TestConfig
from trainguard import wire

# Every finite double is an integer multiple of 2**-1074.
_SUM_SHIFT = 1074
NO_STEP = -1  # orders below any real step

STATUS_MISSING = "missing"


def exact_units(value: float) -> int:
    """``value`` as an exact integer number of 2**-1074 units."""
    numerator, denominator = value.as_integer_ratio()
    return numerator << (_SUM_SHIFT + 1 - denominator.bit_length())


def exact_batch_units(values: List[float]) -> int:
    """The exact sum of ``values`` in 2**-1074 units, with C-speed ``math.fsum`` passes.

    ``fsum`` is correctly rounded, so ``values - s`` summed again gives the exact
    remainder's rounding, and so on: a few passes split the exact sum into a
    handful of doubles, each converted exactly. Falls back to one conversion
    per value when an intermediate sum overflows.
    """
    parts: List[float] = []
    try:
        for _ in range(64):
            part = math.fsum(values + [-p for p in parts])
            if part == 0.0:
                return sum(map(exact_units, parts))
            parts.append(part)
    except OverflowError:
        pass
    return sum(map(exact_units, values))


def exact_mean(units: int, count: int) -> float:
    """The correctly rounded mean of values whose exact sum is ``units``."""
    return units / (count << _SUM_SHIFT)


@dataclasses.dataclass
class TagAggregate:
    """Running aggregates of one tag; each extreme is kept with its (time, step)."""
    count: int
    units: int
    min: Tuple[float, float, int]    # (value, time, step): smallest value, then earliest
    max: Tuple[float, float, int]    # (value, -time, -step): largest value, then earliest
    final: Tuple[float, int, float]  # (time, step, value): latest time, then highest step
    first_reach: Optional[Tuple[float, int]] = None  # (time, step) of first value >= accuracy threshold

    @staticmethod
    def of_batch(values: List[float], times: List[float], steps: List[int]) -> "TagAggregate":
        """Aggregates of one batch of points of a tag (all lists the same length)."""
        low = min(values)
        high = max(values)
        earliest_high = min((t, s) for v, t, s in zip(values, times, steps) if v == high)
        return TagAggregate(
            count=len(values), units=exact_batch_units(values),
            min=min((v, t, s) for v, t, s in zip(values, times, steps) if v == low),
            max=(high, -earliest_high[0], -earliest_high[1]),
            final=max(zip(times, steps, values)))

    def merge(self, other: "TagAggregate") -> None:
        self.count += other.count
        self.units += other.units
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.final = max(self.final, other.final)
        if other.first_reach is not None:
            self.reach(*other.first_reach)

    def reach(self, time: float, step: int) -> None:
        if self.first_reach is None or (time, step) < self.first_reach:
            self.first_reach = (time, step)

    def value_of(self, strategy: str) -> Tuple[float, Optional[int]]:
        """(value, step) for one aggregation strategy."""
        if strategy == "final":
            return self.final[2], _step(self.final[1])
        if strategy == "min":
            return self.min[0], _step(self.min[2])
        if strategy == "max":
            return self.max[0], _step(-self.max[2])
        if strategy == "average":
            return exact_mean(self.units, self.count), None
        raise ValueError(f"unknown aggregation strategy {strategy!r}")


def _step(step: int) -> Optional[int]:
    return None if step == NO_STEP else step


@dataclasses.dataclass(frozen=True)
class MetricValue:
    name: str
    value: float
    step: Optional[int]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one finalized run amounts to."""
    test: str
    run: str
    status: str  # success, failure, timeout or missing
    num_failures: Optional[int]
    start_time: Optional[float]
    end_time: float
    finalized_at: float  # event time of finalization; orders runs downstream
    metrics: Tuple[MetricValue, ...]
    events: Tuple[wire.Event, ...]
    tags_seen: Tuple[str, ...]
    time_to_accuracy_missed: bool  # the accuracy tag never reached its threshold

    @property
    def order(self) -> Tuple[float, str]:
        """Runs of a test are checked in the order they were finalized (ties: run id)."""
        return self.finalized_at, self.run

    @property
    def duration(self) -> Optional[float]:
        return None if self.start_time is None else self.end_time - self.start_time

    @property
    def run_data(self) -> Dict[str, Any]:
        """The data of the run's lifecycle events (e.g. a logs link), later events winning."""
        merged: Dict[str, Any] = {}
        for event in self.events:
            if event.type in (wire.RUN_STARTED, wire.RUN_FINISHED):
                merged.update(event.data)
        return merged

    def events_json(self) -> str:
        return json.dumps([{"type": e.type, "time": e.time, "data": e.data} for e in self.events],
                          sort_keys=True, separators=(",", ":"))


def _event_order(event: wire.Event) -> Tuple[float, str, str]:
    return event.time, event.type, json.dumps(event.data, sort_keys=True)


@dataclasses.dataclass
class MessageSummary:
    """One validated message reduced to what its run needs: per-tag partial aggregates.

    Summaries, not points, cross the pipeline's shuffles; the raw payload rides
    along so that a message arriving after its run was finalized can still be
    dead-lettered intact.
    """
    id: str
    test: str
    run: str
    tags: Dict[str, TagAggregate]
    events: Tuple[wire.Event, ...]
    first_time: float
    last_time: float
    payload: bytes
    window_points: Tuple[wire.Point, ...] = ()  # points of tags with live windows configured


def finalization_time(finished_time: Optional[float], last_time: float, grace: float, run_timeout: float) -> float:
    """When a run ends in event time: after its run_finished plus grace, else after run_timeout of silence."""
    return finished_time + grace if finished_time is not None else last_time + run_timeout


def summarize(message: wire.Message, payload: bytes, config: TestConfig) -> MessageSummary:
    collection = config.metric_collection
    ignored = collection.tags_to_ignore
    by_tag: Dict[str, Tuple[List[float], List[float], List[int]]] = {}
    for tag, value, step, time in message.points:
        columns = by_tag.get(tag)
        if columns is None:
            if tag in ignored:
                continue
            by_tag[tag] = columns = ([], [], [])
        columns[0].append(value)
        columns[1].append(time)
        columns[2].append(NO_STEP if step is None else step)
    tags = {}
    tta = collection.time_to_accuracy
    for tag, (values, times, steps) in by_tag.items():
        aggregate = tags[tag] = TagAggregate.of_batch(values, times, steps)
        if tta is not None and tag == tta.accuracy_tag:
            reached = [(t, s) for v, t, s in zip(values, times, steps) if v >= tta.accuracy_threshold]
            if reached:
                aggregate.first_reach = min(reached)
    times = [p[3] for p in message.points] + [e.time for e in message.events]
    windowed = config.windows.tags
    window_points = tuple(p for p in message.points if p[0] in windowed) if windowed else ()
    return MessageSummary(message.id, message.test, message.run, tags, message.events,
                          min(times), max(times), payload, window_points)


class RunAccumulator:
    """Everything the pipeline keeps of an open run, independent of arrival order."""

    MAX_EVENTS = 1000

    def __init__(self, test: str, run: str):
        self.test = test
        self.run = run
        self.tags: Dict[str, TagAggregate] = {}
        self.events: List[wire.Event] = []
        self.first_time: Optional[float] = None
        self.last_time: Optional[float] = None

    def add(self, summary: MessageSummary) -> List[wire.Event]:
        """Absorbs one message summary; returns the events it could not keep (over MAX_EVENTS)."""
        for tag, batch in summary.tags.items():
            aggregate = self.tags.get(tag)
            if aggregate is None:
                self.tags[tag] = copy.copy(batch)
            else:
                aggregate.merge(batch)
        room = self.MAX_EVENTS - len(self.events)
        self.events.extend(summary.events[:room])
        self._extend_time_span(summary.last_time, summary.first_time)
        return list(summary.events[room:]) if room < len(summary.events) else []

    def _extend_time_span(self, latest: float, earliest: float) -> None:
        self.last_time = latest if self.last_time is None else max(self.last_time, latest)
        self.first_time = earliest if self.first_time is None else min(self.first_time, earliest)

    def _lifecycle(self, event_type: str, pick) -> Optional[wire.Event]:
        candidates = [e for e in self.events if e.type == event_type]
        return pick(candidates, key=_event_order) if candidates else None

    @property
    def started(self) -> Optional[wire.Event]:
        return self._lifecycle(wire.RUN_STARTED, min)

    @property
    def finished(self) -> Optional[wire.Event]:
        return self._lifecycle(wire.RUN_FINISHED, max)

    def finalize_at(self, grace: float, run_timeout: float) -> float:
        """Event time at which this run is finalized, given what has arrived so far."""
        finished = self.finished
        return finalization_time(None if finished is None else finished.time, self.last_time, grace, run_timeout)

    def result(self, config: TestConfig, grace: float, run_timeout: float) -> RunResult:
        started, finished = self.started, self.finished
        start_time = started.time if started is not None else self.first_time
        if finished is not None:
            status = finished.data["status"]
            num_failures = finished.data.get("num_failures", 0)
            end_time = finished.time
        else:
            status, num_failures, end_time = STATUS_MISSING, None, self.last_time
        collection = config.metric_collection
        metrics = []
        for tag in sorted(self.tags):
            aggregate = self.tags[tag]
            for strategy in collection.strategies_for(tag):
                value, step = aggregate.value_of(strategy)
                metrics.append(MetricValue(f"{tag}_{strategy}", value, step))
        tta_missed = False
        if collection.time_to_accuracy is not None:
            accuracy = self.tags.get(collection.time_to_accuracy.accuracy_tag)
            if accuracy is not None and accuracy.first_reach is not None:
                reach_time, reach_step = accuracy.first_reach
                metrics.append(MetricValue(TIME_TO_ACCURACY_METRIC, reach_time - start_time, _step(reach_step)))
            else:
                tta_missed = True
        if started is not None and finished is not None:
            metrics.append(MetricValue(TOTAL_WALL_TIME_METRIC, finished.time - started.time, None))
        return RunResult(
            test=self.test, run=self.run, status=status, num_failures=num_failures,
            start_time=start_time, end_time=end_time,
            finalized_at=self.finalize_at(grace, run_timeout),
            metrics=tuple(metrics), events=tuple(sorted(self.events, key=_event_order)),
            tags_seen=tuple(sorted(self.tags)), time_to_accuracy_missed=tta_missed)
