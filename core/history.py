"""The regression checks as pure state machines, one step per finalized run.

``check_metric`` steps the history of one (test, metric); ``check_job`` steps
the run history of one test. Both are fed runs in event-time order by
``transforms.ordered``; the same state is rebuilt from the stored tables at
start-up (``seed_metric_history`` / ``seed_job_history``) so that history
continues across invocations.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from core.bounds import centre_of, compute_bounds, judge, threshold_details
from core.config import DEFAULT_HISTORY_MAX_POINTS, TIME_TO_ACCURACY_METRIC, RegressionTestConfig, TestConfig
from core.records import Alert, MetricObservation, metric_history_row
from core.runs import RunResult
from core.vocabulary import AlertKind, RunStatus


@dataclasses.dataclass(frozen=True)
class HistoryPolicy:
    """How one (test, metric)'s history is kept: its size, and when its baseline moves (0: never)."""
    max_points: int = DEFAULT_HISTORY_MAX_POINTS
    rebaseline_after: int = 0


def history_policy(config: RegressionTestConfig, metric: str) -> HistoryPolicy:
    condition = config.condition_for(metric)
    if condition is None:
        return HistoryPolicy()
    # A fixed value is not a baseline: it never moves.
    moves = condition.fixed_value is None
    return HistoryPolicy(condition.history_max_points, config.rebaseline_after if moves else 0)


@dataclasses.dataclass
class MetricHistory:
    """History of one (test, metric) since its baseline last moved.

    ``values`` are the values of successful runs that were within bounds (or not
    checked), oldest first: an out-of-bounds value never widens the bounds that
    judge the next run. ``streak`` holds the successful runs in a row that were
    out of bounds; when it reaches the policy's ``rebaseline_after`` the metric
    has moved for good, the history restarts from those runs, and the old
    history stays in ``previous``, whose scale bridges the new one's warm-up
    (``core.bounds.compute_bounds``). One bad run among healthy ones only
    starts a streak, which the next healthy run ends.
    """
    values: List[float] = dataclasses.field(default_factory=list)
    # Whether the previous successful run's value was out of bounds; None before any.
    # Kept apart from ``values`` so that consecutive regressions are always seen.
    last_out_of_bounds: Optional[bool] = None
    streak: List[Tuple[str, float]] = dataclasses.field(default_factory=list)  # (run, value), oldest first
    previous: List[float] = dataclasses.field(default_factory=list)

    def record(self, run: str, value: float, status: str, within: Optional[bool],
               policy: HistoryPolicy) -> List[Tuple[str, float]]:
        """Adds one run's value; returns the streak's runs when this run moves the baseline, else []."""
        if status != RunStatus.SUCCESS:
            return []
        if within is not False:
            self.streak.clear()
            self.values.append(value)
            del self.values[:-policy.max_points]
            self.last_out_of_bounds = False
            return []
        self.streak.append((run, value))
        self.last_out_of_bounds = True
        if not policy.rebaseline_after or len(self.streak) < policy.rebaseline_after:
            return []
        shifted, self.streak = self.streak, []
        self.previous, self.values = self.values, [v for _, v in shifted][-policy.max_points:]
        self.last_out_of_bounds = False  # the run is at the new level: in bounds of the new baseline
        return shifted


@dataclasses.dataclass
class JobHistory:
    last_status: Optional[str] = None


def check_metric(history: MetricHistory, observation: MetricObservation,
                 config: RegressionTestConfig) -> Tuple[Dict[str, Any], Optional[Alert]]:
    """Bounds one metric value against its history; returns its row and any alert.

    The alert is ``metric_out_of_bounds``, or ``baseline_shifted`` for the run
    that completes a streak of ``rebaseline_after`` out-of-bounds runs.
    """
    metric = observation.metric
    condition = config.condition_for(metric)
    bounds = compute_bounds(condition, history.values, history.previous) if condition else None
    within = None if bounds is None or condition is None else judge(observation.value, bounds, condition)
    earlier_runs = len(history.values)
    previous_out_of_bounds = history.last_out_of_bounds
    shifted = history.record(observation.run, observation.value, observation.status, within,
                             history_policy(config, metric))
    row = metric_history_row(observation, bounds.lower if bounds else None,
                             bounds.upper if bounds else None, within)
    if (within is not False or bounds is None or condition is None or observation.status != RunStatus.SUCCESS
            or not config.alert_for_oob_metrics or not config.may_alert_on(metric)):
        return row, None
    details = {"comparison": condition.comparison, "history_size": earlier_runs,
               **threshold_details(condition, bounds), "step": observation.step, "run_data": observation.run_data}
    if shifted:
        new_centre = centre_of(condition, history.values)
        return row, Alert(
            kind=AlertKind.BASELINE_SHIFTED, test=observation.test, run=observation.run, metric=metric,
            value=observation.value, lower_bound=bounds.lower, upper_bound=bounds.upper,
            created_at=observation.finalized_at,
            message=(f"{metric} moved from {_fmt(bounds.centre)} to {_fmt(new_centre)} in {len(shifted)} runs in a "
                     f"row from run {shifted[0][0]}; its baseline now follows the new level"),
            details={**details, "first_run": shifted[0][0], "runs": [run for run, _ in shifted],
                     "values": [value for _, value in shifted], "old_centre": bounds.centre,
                     "new_centre": new_centre, "rebaseline_after": config.rebaseline_after})
    if config.alert_after_second_test_failure and previous_out_of_bounds is False:
        return row, None
    return row, Alert(
        kind=AlertKind.METRIC_OUT_OF_BOUNDS, test=observation.test, run=observation.run, metric=metric,
        value=observation.value, lower_bound=bounds.lower, upper_bound=bounds.upper,
        created_at=observation.finalized_at,
        message=(f"{metric} = {observation.value:.6g} is outside bounds "
                 f"({_fmt(bounds.lower)}, {_fmt(bounds.upper)}) from {earlier_runs} earlier runs"),
        details=details)


def _fmt(value: Optional[float]) -> str:
    return "-inf/+inf" if value is None else f"{value:.6g}"


def check_job(history: JobHistory, run: RunResult, config: TestConfig) -> List[Alert]:
    """Run-level alerts: failed or missing job, missing required metrics, accuracy never reached."""
    regression = config.regression_test
    alerts = []
    run_details = {"status": run.status, "run_data": run.run_data}

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
    tta = config.metric_collection.time_to_accuracy
    if tta is not None and run.time_to_accuracy_missed and run.status == RunStatus.SUCCESS:
        alerts.append(run_alert(AlertKind.ACCURACY_NOT_REACHED,
                                f"{tta.accuracy_tag} never reached {tta.accuracy_threshold:g}", TIME_TO_ACCURACY_METRIC))
    return alerts


def seed_metric_history(rows: Iterable[Tuple[float, str, float, Optional[bool], str]],
                        policy: HistoryPolicy) -> MetricHistory:
    """Rebuilds one metric's history from stored (finalized_at, run, value, within, status) rows."""
    history = MetricHistory()
    for _, run, value, within, status in sorted(rows, key=lambda r: (r[0], r[1])):
        history.record(run, value, status, within, policy)
    return history


def seed_job_history(rows: Iterable[Tuple[float, str, str]]) -> JobHistory:
    """Rebuilds one test's run history from stored (finalized_at, run, status) rows."""
    ordered = sorted(rows)
    return JobHistory(ordered[-1][2] if ordered else None)


@dataclasses.dataclass
class HistorySeed:
    """What the pipeline knows at start-up from earlier invocations (the store)."""
    metrics: Dict[Tuple[str, str], MetricHistory] = dataclasses.field(default_factory=dict)
    jobs: Dict[str, JobHistory] = dataclasses.field(default_factory=dict)
    stored_runs: FrozenSet[Tuple[str, str]] = frozenset()
    windows: Dict[Tuple[str, str, str], Any] = dataclasses.field(default_factory=dict)  # WindowHistory
