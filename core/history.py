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

from core.bounds import compute_bounds, is_within
from core.config import DEFAULT_HISTORY_MAX_POINTS, TIME_TO_ACCURACY_METRIC, RegressionTestConfig, TestConfig
from core.records import Alert, MetricObservation, metric_history_row
from core.runs import RunResult
from core.vocabulary import AlertKind, RunStatus


@dataclasses.dataclass
class MetricHistory:
    """History of one (test, metric): in-bounds values of successful runs, oldest first."""
    values: List[float] = dataclasses.field(default_factory=list)
    # Whether the previous successful run's value was out of bounds; None before any.
    # Kept apart from ``values`` so that consecutive regressions are always seen.
    last_out_of_bounds: Optional[bool] = None

    def record(self, value: float, status: str, within: Optional[bool], max_points: int) -> None:
        if status != RunStatus.SUCCESS:
            return
        if within is not False:
            self.values.append(value)
            del self.values[:-max_points]
        self.last_out_of_bounds = within is False


@dataclasses.dataclass
class JobHistory:
    last_status: Optional[str] = None


def history_max_points(config: RegressionTestConfig, metric: str) -> int:
    condition = config.condition_for(metric)
    return condition.history_max_points if condition else DEFAULT_HISTORY_MAX_POINTS


def check_metric(history: MetricHistory, observation: MetricObservation,
                 config: RegressionTestConfig) -> Tuple[Dict[str, Any], Optional[Alert]]:
    """Bounds one metric value against its history; returns its row and any alert."""
    metric = observation.metric
    condition = config.condition_for(metric)
    bounds = compute_bounds(condition, history.values) if condition else None
    within = None if bounds is None or condition is None else is_within(
        observation.value, bounds, condition.comparison)
    alert = None
    if (within is False and bounds is not None and condition is not None and observation.status == RunStatus.SUCCESS and config.alert_for_oob_metrics
            and config.may_alert_on(metric)
            and (not config.alert_after_second_test_failure or history.last_out_of_bounds is not False)):
        alert = Alert(
            kind=AlertKind.METRIC_OUT_OF_BOUNDS, test=observation.test, run=observation.run, metric=metric,
            value=observation.value, lower_bound=bounds.lower, upper_bound=bounds.upper,
            created_at=observation.finalized_at,
            message=(f"{metric} = {observation.value:.6g} is outside bounds "
                     f"({_fmt(bounds.lower)}, {_fmt(bounds.upper)}) from {len(history.values)} earlier runs"),
            details={"comparison": condition.comparison, "history_size": len(history.values),
                     "fixed_value": condition.fixed_value, "stddevs_from_mean": condition.stddevs_from_mean,
                     "step": observation.step, "run_data": observation.run_data})
    row = metric_history_row(observation, bounds.lower if bounds else None,
                             bounds.upper if bounds else None, within)
    history.record(observation.value, observation.status, within, history_max_points(config, metric))
    return row, alert


def _fmt(bound: Optional[float]) -> str:
    return "-inf/+inf" if bound is None else f"{bound:.6g}"


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
                        max_points: int) -> MetricHistory:
    """Rebuilds one metric's history from stored (finalized_at, run, value, within, status) rows."""
    history = MetricHistory()
    for _, _, value, within, status in sorted(rows, key=lambda r: (r[0], r[1])):
        history.record(value, status, within, max_points)
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
