"""The regression checks as pure state machines, one step per finalized run.

``check_metric`` steps the history of one (test, metric); ``check_job`` steps
the run history of one test. Both are fed runs in event-time order by
``transforms.ordered``; the same state is rebuilt from the stored tables at
start-up (``seed_metric_history`` / ``seed_job_history``) so that history
continues across invocations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from core.alert_details import best_value_text, change_facts, describe, previous_facts, threshold_facts
from core.bounds import (
    MODE_RECENT,
    MODE_SHARE,
    RecentValue,
    centre_of,
    compute_bounds,
    is_improvement,
    judge,
    reference,
    stored_bounds,
    threshold_details,
)
from core.config import (
    DEFAULT_HISTORY_MAX_POINTS,
    HEAVY_TAILED,
    TIME_TO_ACCURACY_METRIC,
    RegressionTestConfig,
    SuccessCondition,
    TestConfig,
    shift_rate,
)
from core.records import Alert, MetricObservation, Refused, metric_history_row
from core.registry import plain_tuple, record
from core.runs import RANKS_MISSING, RunAccumulator, RunResult
from core.shifts import MIN_BASE, RECENT, Shift, find_shift, level_at_end
from core.stats import median
from core.triage import AlertLedger, TriageItem, unknown_run_refusal
from core.vocabulary import AlertKind, RunStatus, TriageAction


@dataclasses.dataclass(frozen=True)
class HistoryPolicy:
    """How one (test, metric)'s history is kept: its size, when its baseline moves (0: never), and which way
    is better for a one-sided check (True: higher; None: two-sided or fixed, no improvements to follow), and
    the false-alert rate at which a persistent improvement moves it too (``core.shifts``; None: only one beyond
    the improvement bound does), and the one at which a small persistent shift the worse way is reported and
    moves it (None: the metric has no shift check)."""
    max_points: int = DEFAULT_HISTORY_MAX_POINTS
    rebaseline_after: int = 0
    improves_upward: Optional[bool] = None
    improvement_rate: Optional[float] = None
    shift_rate: Optional[float] = None
    noise: str = HEAVY_TAILED  #: the tails both rates are calibrated for (the condition's ``noise``)


def history_policy(config: RegressionTestConfig, metric: str) -> HistoryPolicy:
    condition = config.condition_for(metric)
    if condition is None:
        return HistoryPolicy()
    # A fixed value is not a baseline: it never moves.
    moves = condition.fixed_value is None
    upward = None if not moves or condition.comparison.is_equal else condition.comparison.greater
    rate = shift_rate(condition) if upward is not None and condition.false_alert_rate else None
    return HistoryPolicy(condition.history_max_points, config.rebaseline_after if moves else 0, upward, rate,
                         rate if config.checks_shifts(condition) else None, condition.noise)


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a run's value did to its history (``MetricHistory.record``): the streak's runs when it moved the
    baseline out of bounds (``baseline_shifted``), or the shift it completed (``metric_shifted``); neither when
    it moved nothing, or moved it by an improvement or an accept (no alert)."""
    streak: List[Tuple[str, float]] = dataclasses.field(default_factory=list)
    shift: Optional[ShiftFound] = None


@dataclasses.dataclass(frozen=True)
class ShiftFound:
    """A small persistent shift the worse way at the end of a history (``core.shifts``), which restarted it."""
    shift: Shift
    window: List[HistoryEntry]  # the runs at the new level
    base: int  # how many counted values before them the history held


@plain_tuple
class HistoryEntry(NamedTuple):
    """One successful run in a ``MetricHistory``: its value, and whether the value counts (see there).

    Written as the plain tuple (run, value, counted) it was before it had a name (``core.registry.plain_tuple``):
    the state of running jobs holds such tuples, and ``MetricHistory`` turns them back into entries."""
    run: str
    value: float
    counted: bool


@record("MetricHistory")
@dataclasses.dataclass
class MetricHistory:
    """History of one (test, metric) since its baseline last moved.

    ``entries`` are the successful runs since then, oldest first, as
    ``HistoryEntry`` (run, value, counted): a value counts when it was within bounds, not checked, dismissed as
    a false positive or accepted as a new level; ``values`` are the counted ones,
    so an out-of-bounds value never widens the bounds that judge the next run.
    The uncounted runs at the end are the ``streak``: successful runs in a row out
    of bounds. When it reaches the policy's ``rebaseline_after`` the metric has
    moved for good, the history restarts from those runs, and the old values stay
    in ``previous``, whose scale bridges the new one's warm-up
    (``core.bounds.compute_bounds``). One bad run among healthy ones only starts
    a streak, which the next healthy run ends (one healthy run between two
    bad ones does not: see ``streak``). An improvement that stays moves the
    baseline the same way, without an alert: ``improving`` counts the successful
    runs in a row beyond a one-sided check's improvement bound
    (``core.bounds.is_improvement``), and at ``rebaseline_after`` the history
    restarts from them, so a faster step time is not judged against a history
    holding both levels, unless a tenth of the history was already there
    (two machine types, say: a mode, not a new level). Entries older than the oldest of the last
    ``max_points`` counted values are forgotten.

    Triage (``core.triage``) acts on the entries: ``accept`` restarts the history
    at a run (``pending_accept`` when that run has not been seen yet), ``dismiss``
    makes a run's value count.

    A test with ``history_by`` keeps one such history per segment of its runs
    (``history_segment``, e.g. ``accelerator=v5e``) in ``segments``: each
    machine type is judged against its own runs, and a switch between types is
    no change (:meth:`judging`). Triage finds a run in whichever segment holds it.
    """
    entries: List[HistoryEntry] = dataclasses.field(default_factory=list)
    # Whether the previous successful run's value was out of bounds; None before any.
    last_out_of_bounds: Optional[bool] = None
    previous: List[float] = dataclasses.field(default_factory=list)
    pending_accept: Optional[str] = None
    improving: int = 0  # successful runs in a row, at the end, beyond the improvement bound
    segments: Dict[str, MetricHistory] = dataclasses.field(default_factory=dict)  # history_by: one per segment

    def __post_init__(self) -> None:
        # Decoded state holds the entries as the plain tuples they are written as (HistoryEntry's doc).
        self.entries = list(map(HistoryEntry._make, self.entries))

    @property
    def values(self) -> List[float]:
        return [entry.value for entry in self.entries if entry.counted]

    @property
    def streak(self) -> List[Tuple[str, float]]:
        """The successful runs at the end whose values did not count (out of bounds), in a row but for at most
        one run in bounds between two of them (see ``_streak_bounds``), as (run, value)."""
        return [(entry.run, entry.value) for entry in self.entries[self._streak_bounds()[0]:] if not entry.counted]

    def _streak_bounds(self) -> Tuple[int, int]:
        """(start, restart): where the streak starts, and where a new level that it completes starts.

        The streak is the uncounted entries at the end, where one counted entry between two uncounted ones does
        not end it: a change that stays, one run of which happened to fall back within the old bounds, moves
        the baseline after ``rebaseline_after`` runs out of bounds, not after a new streak (that cost an
        accepted change extra alerts). A counted entry at the end ends it, as does a second counted one. The
        new level starts after the counted entry, if any: the runs before it may be a one-off fault that the
        change happened to follow, and the run in bounds is at the old level."""
        start = restart = len(self.entries)
        gap = False
        for index in range(len(self.entries) - 1, -1, -1):
            if not self.entries[index].counted:
                start = index
                restart = index if not gap else restart
            elif gap or start == len(self.entries):
                break
            else:
                gap = True
        return start, restart

    def record(self, run: str, value: float, status: str, within: Optional[bool],
               policy: HistoryPolicy, improved: bool = False) -> Recorded:
        """Adds one run's value; says whether it moved the baseline, and how (``Recorded``)."""
        if status != RunStatus.SUCCESS:
            return Recorded()
        if self.pending_accept == run:
            self.pending_accept = None
            self.entries.append(HistoryEntry(run, value, False))
            self._restart(len(self.entries) - 1)
            return Recorded()
        counted = within is not False
        self.entries.append(HistoryEntry(run, value, counted))
        self.last_out_of_bounds = not counted
        self.improving = self.improving + 1 if counted and improved else 0
        if (self.improving and policy.rebaseline_after and self.improving >= policy.rebaseline_after
                and not self._holds_level(self.improving, bool(policy.improves_upward))):
            self._restart(len(self.entries) - self.improving)
            self._forget(policy.max_points)
            return Recorded()
        if counted and self._improved_for_good(policy):
            return Recorded()
        if not counted:
            streak = self.streak
            if not policy.rebaseline_after or len(streak) < policy.rebaseline_after:
                return Recorded()
            self._restart(self._streak_bounds()[1])
            self._forget(policy.max_points)
            return Recorded(streak=streak)
        self._forget(policy.max_points)
        return Recorded(shift=self._shifted_worse(policy) if within is True else None)

    def _shifted_worse(self, policy: HistoryPolicy) -> Optional[ShiftFound]:
        """Restarts the history at a small persistent shift the worse way that its counted values end in
        (``core.shifts.find_shift`` at the policy's ``shift_rate``), as ``rebaseline_after`` runs out of bounds
        do: the shift is reported once (``metric_shifted``), and the runs after it are judged against the new
        level. Left in the history, the old level kept the median between the two for as long as its values
        stayed, and the same shift was reported again when the next few runs leaned the worse way."""
        if policy.shift_rate is None or policy.improves_upward is None:
            return None
        counted = [entry for entry in self.entries if entry.counted]
        shift = find_shift([entry.value for entry in counted], -1 if policy.improves_upward else 1,
                           policy.shift_rate, policy.noise)
        if shift is None:
            return None
        window = counted[-shift.runs:]
        start = self._find(window[0].run)
        assert start is not None  # a counted entry of this history
        self._restart(start)
        return ShiftFound(shift, window, len(counted) - RECENT)

    def _improved_for_good(self, policy: HistoryPolicy) -> bool:
        """Restarts the history at a persistent improvement that stayed inside the improvement bound (a cutoff
        calibrated for heavy tails lies many scales out, and a step time 20% faster can sit inside its mirror):
        the last ``rebaseline_after`` or more counted values all better than the median before them, by the
        shift statistic of ``core.shifts`` at the check's rate, turned the other way. Left in the history, such
        a level makes it two-level for as long as the old values stay, its scale several times the noise's
        and its cutoff blind to a regression back to the old level; a second mode the history already
        holds (``_holds_level``) is no new level."""
        if policy.improvement_rate is None or not policy.rebaseline_after or policy.improves_upward is None:
            return False
        counted = [index for index, entry in enumerate(self.entries) if entry.counted]
        values = [self.entries[i].value for i in counted]
        # A young level (too few values of its own for the statistic's base) is compared with the level before it
        # too: an improvement within a level's first runs otherwise joined it, made it two-level, and stayed.
        bridged = len(values) < MIN_BASE + RECENT and bool(self.previous)
        shift = level_at_end((self.previous if bridged else []) + values, 1 if policy.improves_upward else -1,
                             policy.improvement_rate, policy.noise)
        if shift is None or shift.runs < policy.rebaseline_after or shift.runs > len(counted):
            return False
        window = counted[-shift.runs:]
        # The statistic caps each value, so its best window may open with a run of the old level's noise that
        # merely leans the better way; the new level starts at the first run nearer to it than to the old one.
        level = median([self.entries[i].value for i in window[-policy.rebaseline_after:]])
        first = next((i for i in window
                      if abs(self.entries[i].value - level) < abs(self.entries[i].value - shift.centre)),
                     window[-policy.rebaseline_after])
        first = self._level_start(first, level, shift.centre)
        if bridged and not self._old_level_before(first, level, shift.centre):
            return False  # the young level is the better one itself (it restarted at that improvement)
        if self._holds_level(len(self.entries) - first, policy.improves_upward):
            return False
        self._restart(first)
        self._forget(policy.max_points)
        return True

    def _old_level_before(self, first: int, level: float, old: float) -> bool:
        """Whether the counted entries before ``first`` lie, as a whole (their median), nearer the ``old`` level
        than the new ``level``: a young level with runs of its own before the improvement, not one that started
        at it (whose first runs, one of them low by chance, would otherwise make a second restart)."""
        before = [entry.value for entry in self.entries[:first] if entry.counted]
        return bool(before) and abs(median(before) - old) < abs(median(before) - level)

    def _level_start(self, first: int, level: float, old: float) -> int:
        """Where the new level that the entry ``first`` is at began: the earliest of the counted entries in a row
        up to it that lie nearer ``level`` than ``old`` (uncounted ones among them skipped). The level may have
        begun before the statistic's window: the statistic needs ``core.shifts.MIN_BASE`` values before it, so
        a level reached within a history's first runs (a change during a new machine type's warm-up) has runs of
        its own in that base. Counted as the history's earlier reach of the level, they would make it a mode
        of a two-mode history (``_holds_level``), and the old level would stay in the history, its cutoff
        measured from the old level's median, for as long as the old values stayed."""
        start = first
        for i in range(first - 1, -1, -1):
            entry = self.entries[i]
            if not entry.counted:
                continue
            if abs(entry.value - level) >= abs(entry.value - old):
                break
            start = i
        return start

    def _holds_level(self, count: int, upward: bool) -> bool:
        """Whether the counted values before the last ``count`` entries, with the level before this one, already
        reach the least improved of them, MODE_SHARE of them or more: the improvement is a mode of a two-mode
        history (runs that land on a faster machine type) or a return to the level before, not a new level to
        move to (the values count either way)."""
        streak = [entry.value for entry in self.entries[-count:]]
        edge = min(streak) if upward else max(streak)
        before = self.previous + [entry.value for entry in self.entries[:-count] if entry.counted]
        reached = sum(value >= edge if upward else value <= edge for value in before)
        return bool(before) and reached >= MODE_SHARE * len(before)

    def judging(self, segment: str, run: str, status: str) -> MetricHistory:
        """The history that judges ``run`` of ``segment`` (``history_segment``; "": this one). A successful run
        of a segment not seen before starts its history; a pending accept of the run moves there with it."""
        if not segment:
            return self
        if status != RunStatus.SUCCESS:  # bounds for its row; it joins no history
            return self.segments.get(segment) or MetricHistory()
        history = self.segments.setdefault(segment, MetricHistory())
        if self.pending_accept == run:
            history.pending_accept, self.pending_accept = run, None
        return history

    def accept(self, run: str, policy: HistoryPolicy, future: bool = False) -> bool:
        """An intended change from ``run`` on: the history (of the segment) holding it restarts there, or, for a
        ``future`` run (still going or to come), once that run is seen. Other segments keep their baselines: a
        change that reaches them too moves them after ``rebaseline_after`` runs, or by an accept of one of their
        runs. False, and nothing changes, for a run the history does not hold that is not ``future``."""
        found = self._holding(run)
        if found is None:
            if future:
                self.pending_accept = run
            return future
        history, at = found
        history._restart(at)
        history._forget(policy.max_points)
        return True

    @property
    def runs_held(self) -> int:
        """How many runs' values the history (with its segments) holds: what an accept can name."""
        return sum(len(history.entries) for history in (self, *self.segments.values()))

    def dismiss(self, run: str, policy: HistoryPolicy) -> None:
        """The out-of-bounds value of ``run`` was a false positive: it counts as history from now on."""
        found = self._holding(run)
        if found is None:
            return
        history, at = found
        entry = history.entries[at]
        if entry.counted:
            return
        history.entries[at] = entry._replace(counted=True)
        if at == len(history.entries) - 1:
            history.last_out_of_bounds = False
        history._forget(policy.max_points)

    def _holding(self, run: str) -> Optional[Tuple[MetricHistory, int]]:
        """The history (this one or a segment's) whose entries hold ``run``, and where."""
        for history in (self, *self.segments.values()):
            at = history._find(run)
            if at is not None:
                return history, at
        return None

    def _find(self, run: str) -> Optional[int]:
        return next((i for i, entry in enumerate(self.entries) if entry.run == run), None)

    def _restart(self, start: int) -> None:
        """A new level from entry ``start`` on; what counted before it bridges its warm-up."""
        before = [entry.value for entry in self.entries[:start] if entry.counted]
        if before:
            self.previous = before
        self.entries = [entry._replace(counted=True) for entry in self.entries[start:]]
        self.last_out_of_bounds = False  # the latest run is at the new level: in bounds of the new baseline
        self.improving = 0

    def _forget(self, max_points: int) -> None:
        counted = [i for i, entry in enumerate(self.entries) if entry.counted]
        if len(counted) > max_points:
            del self.entries[:counted[-max_points]]


@record("JobHistory")
@dataclasses.dataclass
class JobHistory:
    last_status: Optional[str] = None


def segment_details(segment: str) -> Dict[str, Any]:
    """The details an alert of a test with ``history_by`` adds: the segment whose history judged it."""
    return {"history_segment": segment} if segment else {}


def out_of_order(flag: bool) -> Dict[str, Any]:
    """The details an alert of a back-filled run adds (``RunResult.out_of_order``): it was checked when it
    arrived, against the history as it stood then, not in its event-time place."""
    return {"out_of_order": True} if flag else {}


def history_segment(run_data: Mapping[str, Any], history_by: Sequence[str]) -> str:
    """Which baseline a run's values join: "" (the metric's one history) without ``history_by``, else
    ``key=value`` for each of its keys, in the config's order, from the run's data ("key=" where the run's data
    does not say)."""
    def text(value: Any) -> str:
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return ", ".join(f"{key}={text(run_data.get(key))}" for key in history_by)


def check_metric(whole: MetricHistory, observation: MetricObservation,
                 config: RegressionTestConfig) -> Tuple[Dict[str, Any], Optional[Alert]]:
    """Bounds one metric value against its history (its segment's, with ``history_by``); returns its row and
    any alert.

    The alert is ``metric_out_of_bounds``, or ``baseline_shifted`` for the run
    that completes a streak of ``rebaseline_after`` out-of-bounds runs, or, for a
    value within bounds, ``metric_shifted`` when the last few runs show a small
    persistent shift (``core.shifts``). Its details say how the bounds were
    computed, the change and the previous successful value
    (``core.alert_details``).
    """
    segment = history_segment(observation.run_data, config.history_by_for(observation.metric))
    history = whole.judging(segment, observation.run, observation.status)
    metric = observation.metric
    condition = config.condition_for(metric)
    values, previous = history.values, list(history.previous)
    recent = [RecentValue(entry.value, entry.counted) for entry in history.entries[-MODE_RECENT:]]
    bounds = compute_bounds(condition, values, previous, recent) if condition else None
    within = None if bounds is None or condition is None else judge(observation.value, bounds, condition)
    earlier_runs = len(values)
    previous_out_of_bounds = history.last_out_of_bounds
    earlier = history.entries[-1:]  # the previous successful run, counted or not
    accepted = history.pending_accept == observation.run  # the user accepted this run's level beforehand
    policy = history_policy(config, metric)
    stored = stored_bounds(bounds)
    recorded = history.record(observation.run, observation.value, observation.status, within, policy,
                              is_improvement(observation.value, stored, policy.improves_upward))
    row = metric_history_row(observation, *stored, within, segment)
    if (bounds is None or condition is None or observation.status != RunStatus.SUCCESS
            or accepted or not config.alert_for_oob_metrics or not config.may_alert_on(metric)):
        return row, None
    if within is True:
        found = recorded.shift
        return row, None if found is None else _shift_alert(found, observation, condition, segment)
    if within is not False:
        return row, None
    facts = threshold_facts(condition, bounds, values, previous)
    details = {"comparison": condition.comparison.value, "history_size": earlier_runs,
               **threshold_details(condition, bounds), **facts,
               **change_facts(observation.value, reference(bounds, condition), facts["scale"]),
               **previous_facts([entry.value for entry in earlier], [entry.run for entry in earlier]),
               "step": observation.step, "run_data": observation.run_data, **segment_details(segment),
               **out_of_order(observation.out_of_order)}
    shifted = recorded.streak
    if shifted:
        new_centre = centre_of(condition, history.values)
        alert = Alert(
            kind=AlertKind.BASELINE_SHIFTED, test=observation.test, run=observation.run, metric=metric,
            value=observation.value, lower_bound=bounds.lower, upper_bound=bounds.upper,
            created_at=observation.finalized_at, message="",
            details={**details, "first_run": shifted[0][0], "runs": [run for run, _ in shifted],
                     "values": [value for _, value in shifted], "old_centre": bounds.centre,
                     "new_centre": new_centre, "rebaseline_after": config.rebaseline_after})
        return row, dataclasses.replace(alert, message=describe(alert))
    if config.alert_after_second_test_failure and previous_out_of_bounds is False:
        return row, None
    alert = Alert(
        kind=AlertKind.METRIC_OUT_OF_BOUNDS, test=observation.test, run=observation.run, metric=metric,
        value=observation.value, lower_bound=bounds.lower, upper_bound=bounds.upper,
        created_at=observation.finalized_at, message="", details=details)
    return row, dataclasses.replace(alert, message=describe(alert))


def _shift_alert(found: ShiftFound, observation: MetricObservation, condition: SuccessCondition,
                 segment: str) -> Alert:
    """``metric_shifted``: the history, this run's value included, ended in a persistent shift (``found``)."""
    shift, window = found.shift, found.window
    mean = math.fsum(entry.value for entry in window) / shift.runs
    alert = Alert(
        kind=AlertKind.METRIC_SHIFTED, test=observation.test, run=observation.run, metric=observation.metric,
        value=observation.value, created_at=observation.finalized_at, message="",
        details={"comparison": condition.comparison.value, "history_size": found.base,
                 "threshold": "false_alert_rate", "false_alert_rate": shift_rate(condition),
                 "first_run": window[0].run, "runs": [entry.run for entry in window],
                 "values": [entry.value for entry in window], "old_centre": shift.centre, "shifted_mean": mean,
                 "scale": shift.scale, "size_in_scales": shift.size_in_scales, "statistic": shift.statistic,
                 "shift_threshold": shift.threshold, **change_facts(mean, shift.centre, shift.scale),
                 "step": observation.step, "run_data": observation.run_data,
                 **segment_details(segment),
                 **out_of_order(observation.out_of_order)})
    return dataclasses.replace(alert, message=describe(alert))


def run_facts(run: RunResult, accuracy_tag: Optional[str] = None) -> Dict[str, Any]:
    """What a run alert says of how the run went: when it started, when it was last heard from (a missing run's
    end is its last message), the best value the accuracy tag of ``time_to_accuracy`` (``accuracy_tag``)
    reached and at which step, and for a distributed run the ranks that never sent ``run_finished``."""
    facts: Dict[str, Any] = {"last_heard_at": run.end_time}
    if run.start_time is not None:
        facts["started_at"] = run.start_time
    if accuracy_tag is not None and run.accuracy_best is not None:
        facts["best_value"] = {"metric": accuracy_tag, "value": run.accuracy_best, "step": run.accuracy_best_step}
    missing = sorted({rank for event in run.events if event.type == RANKS_MISSING
                      for rank in event.data.get("ranks", ()) if isinstance(rank, int)})
    if missing:
        facts["ranks_missing"] = missing
    return facts


def check_job(history: JobHistory, run: RunResult, config: TestConfig) -> List[Alert]:
    """Run-level alerts: failed or missing job, missing required metrics, accuracy never reached."""
    if run.status == RunStatus.INTERRUPTED:  # not an end: a drain cut it short, the next job resumes it
        return []
    regression = config.regression_test
    alerts = []
    tta = config.metric_collection.time_to_accuracy
    run_details = {"status": run.status, "run_data": run.run_data,
                   **run_facts(run, tta.accuracy_tag if tta is not None else None), **out_of_order(run.out_of_order)}

    def run_alert(kind: AlertKind, message: str, metric: Optional[str] = None) -> Alert:
        return Alert(kind=kind, test=run.test, run=run.run, created_at=run.finalized_at, metric=metric,
                     details=run_details, message=message)

    if run.status != RunStatus.SUCCESS and regression.alert_for_failed_jobs:
        previous_failed = history.last_status is None or history.last_status != RunStatus.SUCCESS
        if not regression.alert_after_second_test_failure or previous_failed:
            if run.status == RunStatus.MISSING:
                alerts.append(run_alert(AlertKind.RUN_MISSING, f"run {run.run} never reported run_finished"))
            else:
                alerts.append(run_alert(AlertKind.JOB_FAILED, f"run {run.run} finished with status {run.status}"))
    history.last_status = run.status
    present = {m.name for m in run.metrics}
    for metric in regression.required_metrics:
        if metric not in present:
            alerts.append(run_alert(AlertKind.REQUIRED_METRIC_MISSING, f"required metric {metric} is missing",
                                    metric))
    if tta is not None and run.time_to_accuracy_missed and run.status == RunStatus.SUCCESS:
        best = "" if run.accuracy_best is None else f" (best {best_value_text(run.accuracy_best, run.accuracy_best_step)})"
        alerts.append(run_alert(AlertKind.ACCURACY_NOT_REACHED,
                                f"{tta.accuracy_tag} never reached {tta.accuracy_threshold:g}{best}",
                                TIME_TO_ACCURACY_METRIC))
    return alerts


def apply_metric_triage(history: MetricHistory, item: TriageItem, policy: HistoryPolicy) -> None:
    """Applies an accept or a dismiss of one (test, metric) to its history (``core.triage``)."""
    if item.run is None:
        return
    if item.action == TriageAction.ACCEPT:
        if not history.accept(item.run, policy, item.future):
            raise unknown_run_refusal(item, history.runs_held)
    elif item.action == TriageAction.DISMISS:
        history.dismiss(item.run, policy)


def seed_metric_history(rows: Iterable[Tuple[Any, ...]],
                        policy: HistoryPolicy, actions: Iterable[TriageItem] = ()) -> MetricHistory:
    """Rebuilds one metric's history from stored (finalized_at, run, value, within, status[, lower, upper[,
    segment]]) rows and the stored triage actions of that metric, in the event-time order the pipeline applied
    them; a row's segment (``history_segment``) says which history it joined."""
    history = MetricHistory()
    items: List[Tuple[Tuple[Any, ...], Any]] = [((r[0], r[1]), r) for r in rows]
    items += [(action.order, action) for action in actions]
    for _, item in sorted(items, key=lambda pair: pair[0]):
        if isinstance(item, TriageItem):
            with contextlib.suppress(Refused):  # the job refused it too: it changed nothing
                apply_metric_triage(history, item, policy)
        else:
            _, run, value, within, status, *stored = item
            lower, upper, segment = (*stored, None, None, None)[:3]
            improved = is_improvement(value, (lower, upper), policy.improves_upward)
            history.judging(segment or "", run, status).record(run, value, status, within, policy, improved)
    return history


def seed_job_history(rows: Iterable[Tuple[float, str, str]]) -> JobHistory:
    """Rebuilds one test's run history from stored (finalized_at, run, status) rows."""
    ordered = sorted(rows)
    return JobHistory(ordered[-1][2] if ordered else None)


@record("HistorySeed")
@dataclasses.dataclass
class HistorySeed:
    """What the pipeline knows at start-up from earlier invocations (the store)."""
    metrics: Dict[Tuple[str, str], MetricHistory] = dataclasses.field(default_factory=dict)
    jobs: Dict[str, JobHistory] = dataclasses.field(default_factory=dict)
    stored_runs: FrozenSet[Tuple[str, str]] = frozenset()
    windows: Dict[Tuple[str, str, str], Any] = dataclasses.field(default_factory=dict)  # WindowHistory
    stored_actions: FrozenSet[str] = frozenset()  # ids of the triage actions already applied
    ledgers: Dict[str, AlertLedger] = dataclasses.field(default_factory=dict)  # per test: mutes, recent alerts
    # (test, run) -> the open state of a run a drained job stored as ``interrupted``: the job resumes it
    open_runs: Dict[Tuple[str, str], RunAccumulator] = dataclasses.field(default_factory=dict)

    def index(self) -> StoredIndex:
        """The ids of what the store holds, without the histories (see ``StoredIndex``)."""
        return StoredIndex(self.stored_runs, self.stored_actions)

    def held(self) -> FrozenSet[str]:
        """The names of its per-key fields (``KEYED_FIELDS``) and of ``stored_runs`` that hold anything: the
        stages a graph built with this seed in hand joins it to, or asks (``pipeline.graph.GraphSettings.seed_holds``)."""
        return frozenset(name for name in (*KEYED_FIELDS, "stored_runs") if getattr(self, name))

    def of_tests(self, wanted: Callable[[str], bool]) -> HistorySeed:
        """The part of the seed that concerns the tests ``wanted`` says yes to (every key starts with its test;
        triage action ids are kept whole: they name no test)."""
        def first(key: Any) -> str:
            return key if isinstance(key, str) else key[0]

        def keep(by_key: Dict[Any, Any]) -> Dict[Any, Any]:
            return {key: value for key, value in by_key.items() if wanted(first(key))}
        return dataclasses.replace(
            self, metrics=keep(self.metrics), jobs=keep(self.jobs), windows=keep(self.windows),
            ledgers=keep(self.ledgers), open_runs=keep(self.open_runs),
            stored_runs=frozenset(key for key in self.stored_runs if wanted(key[0])))


KEYED_FIELDS = ("metrics", "jobs", "windows", "ledgers", "open_runs")
"""The fields of ``HistorySeed`` that reach their keys as elements, each joined by the stage that reads it."""


@record("StoredIndex")
@dataclasses.dataclass(frozen=True)
class StoredIndex:
    """The runs and triage actions the store already holds, by id: the one part of the seed that every worker
    needs whole (a side input, to skip input an earlier invocation stored). The histories are not in it: they
    reach their keys as ``SeededState`` elements, so the broadcast does not grow with them."""
    stored_runs: FrozenSet[Tuple[str, str]] = frozenset()
    stored_actions: FrozenSet[str] = frozenset()


@record("SeededState")
@dataclasses.dataclass
class SeededState:
    """One key's state from the start-up seed (a ``MetricHistory``, a ``JobHistory``, a window history, an
    ``AlertLedger``), delivered as an element of that key: the ordered stage (``transforms.ordered``) makes it
    the key's state before the key's first item."""
    state: Any
