"""The run model: one run's messages in, one ``RunResult`` out, whatever their order.

A ``RunAccumulator`` absorbs the messages of one run in any order and any
grouping and always ends in the same result (``core.aggregation``). When a
run ends in event time is set by one ``RunLifecycle``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from core.aggregation import TagAggregate, step_or_none
from core.config import TIME_TO_ACCURACY_METRIC, TOTAL_WALL_TIME_METRIC, MetricCollectionConfig, TestConfig
from core.parse import MessageSummary
from core.stats import mean_and_pstdev
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


class RankedEvent(NamedTuple):
    """A lifecycle or other event of a run, with the rank of the worker that sent it (None: not said)."""
    type: str
    time: float
    data: Dict[str, Any]
    rank: Optional[int] = None


RANKS_MISSING = "ranks_missing"  # an event the pipeline adds: ranks that never sent run_finished
# How bad a rank's end is, worst last: the run's status is its worst rank's.
_STATUS_SEVERITY = {RunStatus.SUCCESS.value: 0, RunStatus.TIMEOUT.value: 1, RunStatus.FAILURE.value: 2}


def effective_rank(rank: Optional[int]) -> int:
    """A message that does not say its rank speaks for rank 0 (a single process is rank 0)."""
    return 0 if rank is None else rank


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one finalized run amounts to (across all its ranks, for a distributed run)."""
    test: str
    run: str
    status: str  # success, failure, timeout or missing
    num_failures: Optional[int]
    start_time: Optional[float]
    end_time: float
    finalized_at: float  # event time of finalization; orders runs downstream
    metrics: Tuple[MetricValue, ...]
    events: Tuple[RankedEvent, ...]
    tags_seen: Tuple[str, ...]
    time_to_accuracy_missed: bool  # the accuracy tag never reached its threshold
    rank_metrics: Tuple[Tuple[int, MetricValue], ...] = ()  # per-rank values of a run with several ranks

    @property
    def order(self) -> Tuple[float, str]:
        """Runs of a test are checked in the order they were finalized (ties: run id)."""
        return self.finalized_at, self.run

    @property
    def duration(self) -> Optional[float]:
        return None if self.start_time is None else self.end_time - self.start_time

    @property
    def run_data(self) -> Dict[str, Any]:
        """The data of the run's lifecycle events (e.g. a logs link), later events winning; the status is the
        run's own (for a distributed run, its worst rank's)."""
        merged: Dict[str, Any] = {}
        for event in self.events:
            if event.type in (wire.RUN_STARTED, wire.RUN_FINISHED):
                merged.update(event.data)
        if "status" in merged:
            merged["status"] = self.status
        return merged

    def events_json(self) -> str:
        return json.dumps([_event_json(e) for e in self.events], sort_keys=True, separators=(",", ":"))


def _event_json(event: RankedEvent) -> Dict[str, Any]:
    row: Dict[str, Any] = {"type": event.type, "time": event.time, "data": event.data}
    if event.rank is not None:
        row["rank"] = event.rank
    return row


def _event_order(event: RankedEvent) -> Tuple[float, str, int, str]:
    return event.time, event.type, effective_rank(event.rank), json.dumps(event.data, sort_keys=True)


class RunAccumulator:
    """Everything the pipeline keeps of an open run, independent of arrival order.

    A distributed run's workers each send their own messages with their
    ``rank`` (``trainguard.wire``): tags are aggregated per rank and reduced
    across ranks at the end (``MetricCollectionConfig.rank_reduction_for``); the
    run ends when every rank below ``world_size`` (or, when no message says the
    world size, every rank seen) has sent ``run_finished``, or at the first rank
    that ends in failure or timeout, and its status is the worst of its ranks'.
    A message without a rank counts as rank 0's, so a single process behaves as
    it always did.
    """

    MAX_EVENTS = 1000

    def __init__(self, test: str, run: str):
        self.test = test
        self.run = run
        self.ranks: Dict[int, Dict[str, TagAggregate]] = {}
        self.events: List[RankedEvent] = []
        self.first_time: Optional[float] = None
        self.last_time: Optional[float] = None
        self.world_size: Optional[int] = None

    @property
    def tags(self) -> List[str]:
        return sorted({tag for tags in self.ranks.values() for tag in tags})

    def add(self, summary: MessageSummary) -> List[wire.Event]:
        """Absorbs one message summary; returns the events it could not keep (over MAX_EVENTS).

        All or nothing: everything is computed before anything changes, so a
        summary that raises leaves the accumulator as it was.
        """
        rank = effective_rank(summary.rank)
        tags = self.ranks.get(rank, {})
        merged = {}
        for tag, batch in summary.tags.items():
            current = tags.get(tag)
            merged[tag] = copy.copy(batch) if current is None else current.merged(batch)
        room = self.MAX_EVENTS - len(self.events)
        last = summary.last_time if self.last_time is None else max(self.last_time, summary.last_time)
        first = summary.first_time if self.first_time is None else min(self.first_time, summary.first_time)
        world_size = max(filter(None, (self.world_size, summary.world_size)), default=None)
        if merged or rank not in self.ranks:
            self.ranks[rank] = {**tags, **merged}
        self.events.extend(RankedEvent(*event, summary.rank) for event in summary.events[:room])
        self.first_time, self.last_time, self.world_size = first, last, world_size
        return list(summary.events[room:]) if room < len(summary.events) else []

    def _lifecycle(self, event_type: str, pick: Callable[..., RankedEvent]) -> Dict[int, RankedEvent]:
        """Per rank, its first (``min``) or last (``max``) event of a type."""
        by_rank: Dict[int, List[RankedEvent]] = {}
        for event in self.events:
            if event.type == event_type:
                by_rank.setdefault(effective_rank(event.rank), []).append(event)
        return {rank: pick(events, key=_event_order) for rank, events in by_rank.items()}

    def expected_ranks(self) -> List[int]:
        """The ranks that must finish: below the world size, or every rank heard from when none says it."""
        if self.world_size is not None:
            return list(range(self.world_size))
        heard = set(self.ranks) | {effective_rank(e.rank) for e in self.events}
        return sorted(heard or {0})

    def _ends(self) -> Tuple[Dict[int, RankedEvent], List[RankedEvent]]:
        """(each rank's last run_finished, those that did not succeed, earliest first)."""
        finished = self._lifecycle(wire.RUN_FINISHED, max)
        failed = sorted((e for e in finished.values() if e.data["status"] != RunStatus.SUCCESS),
                        key=_event_order)
        return finished, failed

    def _time_span(self) -> Tuple[float, float]:
        if self.first_time is None or self.last_time is None:
            raise ValueError(f"run {self.test}/{self.run} has no messages yet")
        return self.first_time, self.last_time

    def finalize_at(self, lifecycle: RunLifecycle) -> float:
        """Event time at which this run is finalized, given what has arrived so far."""
        finished, failed = self._ends()
        if failed:
            end: Optional[float] = failed[0].time
        elif finished and all(rank in finished for rank in self.expected_ranks()):
            end = max(e.time for e in finished.values())
        else:
            end = None
        return lifecycle.finalization_time(end, self._time_span()[1])

    def result(self, config: TestConfig, lifecycle: RunLifecycle) -> RunResult:
        first_time, last_time = self._time_span()
        starts = self._lifecycle(wire.RUN_STARTED, min)
        finished, failed = self._ends()
        missing_ranks = [rank for rank in self.expected_ranks() if rank not in finished]
        start_time = min(e.time for e in starts.values()) if starts else first_time
        if failed:
            status = max(failed, key=lambda e: _STATUS_SEVERITY[e.data["status"]]).data["status"]
        elif not missing_ranks:
            status = RunStatus.SUCCESS.value
        else:
            status = RunStatus.MISSING.value
        end_time = max(e.time for e in finished.values()) if finished and status != RunStatus.MISSING \
            else last_time
        # Restarts are the job's (torchelastic restarts every worker): each rank reports the same count.
        restarts = [count for count in (e.data.get("restart_count") for e in self.events
                                        if e.type == wire.ELASTIC_RESTART)
                    if isinstance(count, int) and not isinstance(count, bool) and count >= 0]
        reported = [e.data.get("num_failures", 0) for e in finished.values()] if status != RunStatus.MISSING else []
        num_failures = max(reported + restarts) if reported or restarts else None
        events = list(self.events)
        if missing_ranks and len(self.expected_ranks()) > 1:
            events.append(RankedEvent(RANKS_MISSING, last_time, {"ranks": missing_ranks}))
        collection = config.metric_collection
        metrics, rank_metrics = self._metrics(collection)
        tta_missed = False
        if collection.time_to_accuracy is not None:
            accuracy = self._lead_rank_tags(collection.time_to_accuracy.accuracy_tag)
            if accuracy is not None and accuracy.first_reach is not None:
                reach_time, reach_step = accuracy.first_reach
                metrics.append(MetricValue(TIME_TO_ACCURACY_METRIC, reach_time - start_time, step_or_none(reach_step)))
            else:
                tta_missed = True
        if starts and finished and not missing_ranks:
            metrics.append(MetricValue(TOTAL_WALL_TIME_METRIC, end_time - start_time, None))
        return RunResult(
            test=self.test, run=self.run, status=status, num_failures=num_failures,
            start_time=start_time, end_time=end_time,
            finalized_at=self.finalize_at(lifecycle),
            metrics=tuple(metrics), events=tuple(sorted(events, key=_event_order)),
            tags_seen=tuple(self.tags), time_to_accuracy_missed=tta_missed, rank_metrics=tuple(rank_metrics))

    def _lead_rank_tags(self, tag: str) -> Optional[TagAggregate]:
        """The tag's aggregate of rank 0, or of the lowest rank that has it."""
        ranks = sorted(rank for rank, tags in self.ranks.items() if tag in tags)
        return self.ranks[ranks[0]][tag] if ranks else None

    def _metrics(self, collection: MetricCollectionConfig) -> Tuple[List[MetricValue],
                                                                   List[Tuple[int, MetricValue]]]:
        """The run's metrics (each tag's values reduced across ranks) and, with several ranks, each rank's."""
        metrics: List[MetricValue] = []
        per_rank: List[Tuple[int, MetricValue]] = []
        several = len(self.ranks) > 1
        for tag in self.tags:
            ranks = sorted(rank for rank, tags in self.ranks.items() if tag in tags)
            for strategy in collection.strategies_for(tag):
                name = f"{tag}_{strategy}"
                values = [(rank, *self.ranks[rank][tag].value_of(strategy)) for rank in ranks]
                metrics.append(reduce_across_ranks(name, values, collection.rank_reduction_for(tag)))
                if several:
                    per_rank += [(rank, MetricValue(name, value, step)) for rank, value, step in values]
        return metrics, per_rank


def reduce_across_ranks(name: str, values: Sequence[Tuple[int, float, Optional[int]]], reduction: str) -> MetricValue:
    """One metric from its (rank, value, step) per rank, ranks ascending: rank 0's (or the lowest rank's),
    or the mean, min or max across ranks (min and max with the step of the rank that has it; the mean with
    the lowest rank's step). Order-independent: ties go to the lower rank."""
    lowest_rank, lowest_value, lowest_step = values[0]
    if reduction == "rank0":
        return MetricValue(name, lowest_value, lowest_step)
    if reduction == "mean":
        return MetricValue(name, mean_and_pstdev([v for _, v, _ in values])[0], lowest_step)
    sign = 1.0 if reduction == "min" else -1.0
    _, value, step = min(values, key=lambda item: (sign * item[1], item[0]))
    return MetricValue(name, value, step)
