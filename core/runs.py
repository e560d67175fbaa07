"""The run model: one run's messages in, one ``RunResult`` out, whatever their order.

A ``RunAccumulator`` absorbs the messages of one run in any order and any
grouping and always ends in the same result (``core.aggregation``). When a
run ends in event time is set by one ``RunLifecycle``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from core.aggregation import TagAggregate, step_or_none
from core.config import TIME_TO_ACCURACY_METRIC, TOTAL_WALL_TIME_METRIC, TestConfig
from core.parse import MessageSummary
from core.vocabulary import RunStatus
from trainguard import wire

HOUR = 3600.0
DAY = 24 * HOUR


@dataclasses.dataclass(frozen=True)
class RunLifecycle:
    """When runs end, and how long the pipeline remembers them, all in event-time seconds."""
    grace_seconds: float = 60.0               # after run_finished, stragglers still count
    timeout_seconds: float = 6 * HOUR         # silence after which a run without run_finished is missing
    dedup_horizon_seconds: float = DAY        # how long a message id is remembered
    retention_seconds: float = 7 * DAY        # how long a finalized run is remembered (late messages)

    def finalization_time(self, finished_time: Optional[float], last_time: float) -> float:
        """When a run ends: after its run_finished plus grace, else after the timeout of silence."""
        if finished_time is not None:
            return finished_time + self.grace_seconds
        return last_time + self.timeout_seconds


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
        """Absorbs one message summary; returns the events it could not keep (over MAX_EVENTS).

        All or nothing: everything is computed before anything changes, so a
        summary that raises leaves the accumulator as it was.
        """
        merged = {}
        for tag, batch in summary.tags.items():
            current = self.tags.get(tag)
            merged[tag] = copy.copy(batch) if current is None else current.merged(batch)
        room = self.MAX_EVENTS - len(self.events)
        last = summary.last_time if self.last_time is None else max(self.last_time, summary.last_time)
        first = summary.first_time if self.first_time is None else min(self.first_time, summary.first_time)
        self.tags.update(merged)
        self.events.extend(summary.events[:room])
        self.first_time, self.last_time = first, last
        return list(summary.events[room:]) if room < len(summary.events) else []

    def _lifecycle(self, event_type: str,
                   pick: Callable[..., wire.Event]) -> Optional[wire.Event]:
        candidates = [e for e in self.events if e.type == event_type]
        return pick(candidates, key=_event_order) if candidates else None

    @property
    def started(self) -> Optional[wire.Event]:
        return self._lifecycle(wire.RUN_STARTED, min)

    @property
    def finished(self) -> Optional[wire.Event]:
        return self._lifecycle(wire.RUN_FINISHED, max)

    def _time_span(self) -> Tuple[float, float]:
        if self.first_time is None or self.last_time is None:
            raise ValueError(f"run {self.test}/{self.run} has no messages yet")
        return self.first_time, self.last_time

    def finalize_at(self, lifecycle: RunLifecycle) -> float:
        """Event time at which this run is finalized, given what has arrived so far."""
        finished = self.finished
        return lifecycle.finalization_time(None if finished is None else finished.time, self._time_span()[1])

    def result(self, config: TestConfig, lifecycle: RunLifecycle) -> RunResult:
        started, finished = self.started, self.finished
        first_time, last_time = self._time_span()
        start_time = started.time if started is not None else first_time
        if finished is not None:
            status = finished.data["status"]
            num_failures = finished.data.get("num_failures", 0)
            end_time = finished.time
        else:
            status, num_failures, end_time = RunStatus.MISSING.value, None, last_time
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
                metrics.append(MetricValue(TIME_TO_ACCURACY_METRIC, reach_time - start_time, step_or_none(reach_step)))
            else:
                tta_missed = True
        if started is not None and finished is not None:
            metrics.append(MetricValue(TOTAL_WALL_TIME_METRIC, finished.time - started.time, None))
        return RunResult(
            test=self.test, run=self.run, status=status, num_failures=num_failures,
            start_time=start_time, end_time=end_time,
            finalized_at=self.finalize_at(lifecycle),
            metrics=tuple(metrics), events=tuple(sorted(self.events, key=_event_order)),
            tags_seen=tuple(sorted(self.tags)), time_to_accuracy_missed=tta_missed)
