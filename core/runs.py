"""The run model: one run's messages in, one ``RunResult`` out, whatever their order.

A ``RunAccumulator`` absorbs the messages of one run in any order and any
grouping and always ends in the same result (``core.aggregation``). When a
run ends in event time is set by one ``RunLifecycle``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from core.aggregation import TagAggregate, step_or_none
from core.config import TIME_TO_ACCURACY_METRIC, TOTAL_WALL_TIME_METRIC, MetricCollectionConfig, TestConfig
from core.parse import MessageSummary
from core.registry import record
from core.stats import mean_and_pstdev
from core.vocabulary import RunStatus
from trainguard import wire

HOUR = 3600.0
DAY = 24 * HOUR
# Streaming timers of the event-time-ordered stages and of the windows fire at most once per this many seconds
# of event time (``RunLifecycle.timer_bucket_seconds``).
TIMER_BUCKET_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class RunLifecycle:
    """When runs end, and how long the pipeline remembers them, all in event-time seconds.

    ``timer_bucket_seconds`` (streaming only; 0: each item's own time): the watermark timers of the
    event-time-ordered stages (``transforms.ordered``) and the windows' settle timer (``transforms.windows``)
    are set at due times rounded up to a multiple of it. A timer set at each item's own event time fires once
    per distinct time (200 points at distinct times and one watermark advance: 201 firings), and on Dataflow
    every firing is a work item that reads, decodes, encodes and commits the key's whole state. Rounded up,
    one firing takes every item due in its bucket, in order. The results are the same: an item is still taken
    only once the watermark has passed it, a key's items still in order; they only come later, by less than a
    bucket of watermark. (Windows are where the watermark itself shows: a point that arrives behind it is
    placed at once, so whether its window was already emitted, a revision, can differ; and a watermark jump
    past a run's last windows and its end no longer fires the end between two of their settle firings, which
    closed windows that had ended as partial.) 10 s because Dataflow's Pub/Sub watermark trails real time by
    about that much anyway, a window alert 10 s later is nothing next to a training run's hours, and a run's
    points, seconds apart, then cost one firing per 10 s per key instead of one each. Bounded replays take
    everything in one firing regardless.
    """
    grace_seconds: float = 60.0               # after run_finished, stragglers still count
    timeout_seconds: float = 6 * HOUR         # silence after which a run without run_finished is missing
    dedup_horizon_seconds: float = DAY        # how long a message id is remembered
    retention_seconds: float = 7 * DAY        # how long a finalized run is remembered (late messages)
    timer_bucket_seconds: float = TIMER_BUCKET_SECONDS  # streaming timers: due times rounded up to these
    # How far event time may run ahead of the wall clock (senders' clocks) before a run ending there is taken
    # for one its streaming job's drain cut short (``interrupted``): see :meth:`interrupted`.
    clock_skew_seconds: float = 10 * 60.0
    # Back-fills (streaming only; see :meth:`backfilled`): a run whose first message is this far behind the wall
    # clock (None: never; the streaming job's option defaults to BACKFILL_LAG_SECONDS), and the silence by the
    # wall clock after which such a run ends.
    backfill_lag_seconds: Optional[float] = None
    backfill_quiet_seconds: float = 10 * 60.0

    @property
    def stored_run_horizon_seconds(self) -> float:
        """How long after its end a run a streaming job stored may still be sent a message it must recognise:
        its tombstone's retention, with the run timeout as a margin (``sinks.seed.recent_stored_runs``)."""
        return self.retention_seconds + self.timeout_seconds

    def finalization_time(self, finished_time: Optional[float], last_time: float) -> float:
        """When a run ends: after its run_finished plus grace, else after the timeout of silence."""
        if finished_time is not None:
            return finished_time + self.grace_seconds
        return last_time + self.timeout_seconds

    def interrupted(self, finalized_at: float, now: float) -> bool:
        """Whether a streaming job's run that would end as ``missing`` at event time ``finalized_at``, with the
        wall clock at ``now``, was ended by the job's drain rather than by its own timeout.

        A live job's watermark follows the wall clock, so its timers fire at event times that have passed. A
        drain moves the watermark to the end of time and fires every timer at once, each at its own event time:
        a run ending further ahead of the wall clock than senders' clocks can be is one the drain cut short.
        (A replay's input ends the same way, but it reads history: it does not ask.)
        """
        return finalized_at > now + self.clock_skew_seconds

    def stall_fired_by_drain(self, detected_at: float, now: float, stall_seconds: float) -> bool:
        """Whether a streaming job's stall found at event time ``detected_at`` (the silence's start plus
        ``stall_seconds``), with the wall clock at ``now``, is one the job's drain fired rather than a silence.

        As for ``interrupted``: a live job's stall timer fires once the watermark, which senders' clocks may
        put a little ahead of the wall clock, has passed the silence; a drain fires it at once. A silence
        ending further ahead of the wall clock than the skew allows, or than half the stall (so that a stall
        shorter than the skew is told apart from a drain too), has not happened yet: the drain fired it. A run
        already silent for more than half its stall when the job drains is reported as stalled.
        """
        return detected_at > now + min(self.clock_skew_seconds, stall_seconds / 2)

    def backfill_interrupted(self, quiet_until: float, now: float) -> bool:
        """Whether a back-fill whose quiet period ends at wall-clock time ``quiet_until`` (its timer's time),
        ended with the wall clock at ``now`` without its ``run_finished``, was cut short by the job's drain.

        Its timer fires once the watermark, which follows the wall clock, passes ``quiet_until``; a drain fires
        it at once. As for a stall (:meth:`stall_fired_by_drain`): quiet until further ahead than the clock
        skew or half the quiet period, it was not quiet yet."""
        return quiet_until > now + min(self.clock_skew_seconds, self.backfill_quiet_seconds / 2)

    def backfilled(self, first_message_time: float, now: float) -> bool:
        """Whether a streaming job's run whose first message has event time ``first_message_time``, with the wall
        clock at ``now``, is a back-fill (old logs sent now) rather than a live run.

        A live run's messages arrive seconds after their event time; the job's watermark trails the wall clock
        by about that much. A run whose messages are older than the watermark would have its end timer (its
        ``run_finished`` plus grace, or its last point plus the timeout) behind the watermark: it would fire at
        once, after the first bundle, and end the run as ``missing``. Such a run ends by the wall clock
        instead, ``backfill_quiet_seconds`` after its latest message, and is checked out of event-time order:
        its rows and alerts say so (``RunResult.out_of_order``).
        """
        return self.backfill_lag_seconds is not None and first_message_time < now - self.backfill_lag_seconds


BACKFILL_LAG_SECONDS = 15 * 60.0
"""The streaming job's ``--backfill_lag_seconds``: far more than Pub/Sub's watermark lag (about 10 s) and a
publisher's retries, far less than the run timeout a late first message would otherwise run into."""


@record("MetricValue")
@dataclasses.dataclass(frozen=True)
class MetricValue:
    name: str
    value: float
    step: Optional[int]


@record("RankedEvent")
class RankedEvent(NamedTuple):
    """A lifecycle or other event of a run, with the rank of the worker that sent it (None: not said)."""
    type: str
    time: float
    data: Dict[str, Any]
    rank: Optional[int] = None


RANKS_MISSING = "ranks_missing"  # an event the pipeline adds: ranks that never sent run_finished
# An event the pipeline adds to an ``interrupted`` run: when its job was drained, and (data ``OPEN_RUN``) the
# run's open state as ``core.encoding`` text, which the next job resumes (``sinks.seed.read_open_runs``).
RUN_INTERRUPTED = "run_interrupted"
OPEN_RUN = "open_run"
# How bad a rank's end is, worst last: the run's status is its worst rank's.
_STATUS_SEVERITY = {RunStatus.SUCCESS.value: 0, RunStatus.TIMEOUT.value: 1, RunStatus.FAILURE.value: 2}


def effective_rank(rank: Optional[int]) -> int:
    """A message that does not say its rank speaks for rank 0 (a single process is rank 0)."""
    return 0 if rank is None else rank


@record("RunResult")
@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one finalized run amounts to (across all its ranks, for a distributed run)."""
    test: str
    run: str
    status: str  # success, failure, timeout or missing (or interrupted: ``interrupt``)
    num_failures: Optional[int]
    start_time: Optional[float]
    end_time: float
    finalized_at: float  # event time of finalization; orders runs downstream
    metrics: Tuple[MetricValue, ...]
    events: Tuple[RankedEvent, ...]
    tags_seen: Tuple[str, ...]
    time_to_accuracy_missed: bool  # the accuracy tag never reached its threshold
    rank_metrics: Tuple[Tuple[int, MetricValue], ...] = ()  # per-rank values of a run with several ranks
    # A back-fill (``RunLifecycle.backfilled``): ended by the wall clock, checked when it arrived, after runs
    # that ended later in event time; a replay of the same input checks it in its event-time place instead.
    out_of_order: bool = False
    # The best value the accuracy tag of ``time_to_accuracy`` reached, and at which step (lifecycle alerts say it).
    accuracy_best: Optional[float] = None
    accuracy_best_step: Optional[int] = None

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


def _event_order(event: RankedEvent) -> Tuple[float, str, int, str, bool]:
    """Events in time, then by type, rank and data: only equal events tie (an event without a rank and the same
    one of rank 0 are told apart last)."""
    data = "{}" if event.data == {} else json.dumps(event.data, sort_keys=True)  # (most events have none)
    return event.time, event.type, effective_rank(event.rank), data, event.rank is not None


LIFECYCLE_EVENTS = frozenset((wire.RUN_STARTED, wire.RUN_FINISHED))  # always kept (``RunAccumulator.MAX_EVENTS``)


def kept_events(events: Sequence[RankedEvent], limit: int) -> Tuple[List[RankedEvent], List[RankedEvent]]:
    """(the events a run keeps of ``events``, the others): every ``run_started`` and ``run_finished``, and of
    the other events the first ``limit`` in event order (time, then type, rank and data: equal keys are equal
    events). The same events whatever the order they came in or how they were grouped: the first ``limit`` of
    a run's first ``limit`` and another message's are the first ``limit`` of both."""
    lifecycle = [event for event in events if event.type in LIFECYCLE_EVENTS]
    others = sorted((event for event in events if event.type not in LIFECYCLE_EVENTS), key=_event_order)
    return lifecycle + others[:limit], others[limit:]


def event_json(event: RankedEvent) -> str:
    """An event as a dead letter's payload (its rank only when it says one)."""
    return json.dumps(_event_json(event), sort_keys=True)


@record("RunAccumulator")
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

    # Events other than run_started and run_finished a run keeps (a message carries at most 100); the rest are
    # dead letters. Lifecycle events are always kept: a run's status and end are made of them.
    MAX_EVENTS = 1000

    def __init__(self, test: str, run: str):
        self.test = test
        self.run = run
        self.ranks: Dict[int, Dict[str, TagAggregate]] = {}
        self.events: List[RankedEvent] = []
        self.first_time: Optional[float] = None
        self.last_time: Optional[float] = None
        self.world_size: Optional[int] = None
        self._others: Optional[Tuple[int, int]] = None  # (len(events), how many are not lifecycle events)

    def to_state(self) -> Dict[str, Any]:
        """What the run's state keeps (``core.encoding``: a file format, fields by name)."""
        return {"test": self.test, "run": self.run, "ranks": self.ranks, "events": self.events,
                "first_time": self.first_time, "last_time": self.last_time, "world_size": self.world_size}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> RunAccumulator:
        accumulator = cls(state["test"], state["run"])
        accumulator.ranks = state.get("ranks", {})
        accumulator.events = state.get("events", [])
        accumulator.first_time = state.get("first_time")
        accumulator.last_time = state.get("last_time")
        accumulator.world_size = state.get("world_size")
        return accumulator

    @property
    def tags(self) -> List[str]:
        return sorted({tag for tags in self.ranks.values() for tag in tags})

    def add(self, summary: MessageSummary) -> List[RankedEvent]:
        """Absorbs one message summary; returns the events the run no longer keeps (``MAX_EVENTS``): the
        message's own, or events the run kept so far that sort after them.

        All or nothing: everything is computed before anything changes, so a
        summary that raises leaves the accumulator as it was.
        """
        rank = effective_rank(summary.rank)
        tags = self.ranks.get(rank, {})
        merged = {}
        for tag, batch in summary.tags.items():
            current = tags.get(tag)
            merged[tag] = batch.copied() if current is None else current.merged(batch)
        new = [RankedEvent(*event, summary.rank) for event in summary.events]
        kept, over, others = self._within_limit(new)
        last = summary.last_time if self.last_time is None else max(self.last_time, summary.last_time)
        first = summary.first_time if self.first_time is None else min(self.first_time, summary.first_time)
        world_size = max(filter(None, (self.world_size, summary.world_size)), default=None)
        if merged or rank not in self.ranks:
            self.ranks[rank] = {**tags, **merged}
        self._keep(kept, new, others)
        self.first_time, self.last_time, self.world_size = first, last, world_size
        return over

    def absorb(self, other: RunAccumulator) -> List[RankedEvent]:
        """Merges another accumulator of the same run into this one (a run a drained job left open, resumed);
        returns the events the run no longer keeps (``MAX_EVENTS``), of either. Whichever of the two held
        which messages, the result is the same."""
        if (other.test, other.run) != (self.test, self.run):
            raise ValueError(f"cannot merge run {other.test}/{other.run} into {self.test}/{self.run}")
        for rank, tags in other.ranks.items():
            mine = self.ranks.setdefault(rank, {})
            for tag, aggregate in tags.items():
                mine[tag] = aggregate.copied() if tag not in mine else mine[tag].merged(aggregate)
        new = list(other.events)
        kept, over, others = self._within_limit(new)
        self._keep(kept, new, others)
        firsts = [t for t in (self.first_time, other.first_time) if t is not None]
        lasts = [t for t in (self.last_time, other.last_time) if t is not None]
        self.first_time = min(firsts) if firsts else None
        self.last_time = max(lasts) if lasts else None
        self.world_size = max(filter(None, (self.world_size, other.world_size)), default=None)
        return over

    def _within_limit(self, new: List[RankedEvent]) -> Tuple[Optional[List[RankedEvent]], List[RankedEvent], int]:
        """With ``new`` events added, changing nothing: (the events the run keeps, None if that is all of them
        and ``new`` only needs appending; those it does not keep; how many events it keeps besides lifecycle
        events). Every lifecycle event is kept, and of the others the first ``MAX_EVENTS`` in event order
        (``kept_events``)."""
        others = self._other_events() + sum(1 for event in new if event.type not in LIFECYCLE_EVENTS)
        if others <= self.MAX_EVENTS:
            return None, [], others
        kept, over = kept_events(self.events + new, self.MAX_EVENTS)
        return kept, over, self.MAX_EVENTS

    def _keep(self, kept: Optional[List[RankedEvent]], new: List[RankedEvent], others: int) -> None:
        if kept is None:
            self.events.extend(new)
        else:
            self.events = kept
        self._others = (len(self.events), others)

    def _other_events(self) -> int:
        """How many events the run keeps besides lifecycle events (counted once, then kept up to date: a run of
        thousands of ranks keeps thousands of lifecycle events, which each message would count again)."""
        counted = self._others
        if counted is None or counted[0] != len(self.events):
            counted = self._others = (len(self.events), sum(
                1 for event in self.events if event.type not in LIFECYCLE_EVENTS))
        return counted[1]

    def at_event_limit(self) -> bool:
        """Whether the run keeps as many events other than its lifecycle's as it may: events may have been
        left out."""
        return self._other_events() >= self.MAX_EVENTS

    def _lifecycle(self, event_type: str, pick: Callable[..., RankedEvent]) -> Dict[int, RankedEvent]:
        """Per rank, its first (``min``) or last (``max``) event of a type."""
        by_rank: Dict[int, List[RankedEvent]] = {}
        for event in self.events:
            if event.type == event_type:
                by_rank.setdefault(effective_rank(event.rank), []).append(event)
        # (a rank's only event needs no order: its key, which dumps the event's data, is most of the cost)
        return {rank: events[0] if len(events) == 1 else pick(events, key=_event_order)
                for rank, events in by_rank.items()}

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
        best: Tuple[Optional[float], Optional[int]] = (None, None)
        if collection.time_to_accuracy is not None:
            accuracy = self._lead_rank_tags(collection.time_to_accuracy.accuracy_tag)
            if accuracy is not None:
                best = (accuracy.max[0], step_or_none(-accuracy.max[3]))
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
            tags_seen=tuple(self.tags), time_to_accuracy_missed=tta_missed, rank_metrics=tuple(rank_metrics),
            accuracy_best=best[0], accuracy_best_step=best[1])

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


def interrupt(result: RunResult, at: float, open_run: str) -> RunResult:
    """The ``interrupted`` result of a run a drain cut short (``RunLifecycle.interrupted``).

    ``at`` is when, by the wall clock (the run's end in event time is still to come), and ``open_run`` the run's
    accumulator as ``core.encoding`` text, kept in a ``RUN_INTERRUPTED`` event so that the next job resumes the
    run where it stopped. No metrics: an open run's values are not final, and a run's are written once, when it ends.
    """
    marker = RankedEvent(RUN_INTERRUPTED, at, {OPEN_RUN: open_run})
    return dataclasses.replace(result, status=RunStatus.INTERRUPTED.value, num_failures=None, finalized_at=at,
                               metrics=(), rank_metrics=(), time_to_accuracy_missed=False,
                               events=tuple(sorted(result.events + (marker,), key=_event_order)))


def open_run_text(events: Sequence[Any]) -> Optional[str]:
    """The open state in an ``interrupted`` run's stored events (``job_history.events``, parsed); None if none."""
    for event in events:
        if not isinstance(event, dict) or event.get("type") != RUN_INTERRUPTED:
            continue
        data = event.get("data")
        text = data.get(OPEN_RUN) if isinstance(data, dict) else None
        if isinstance(text, str):
            return text
    return None


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
