import pytest

from core.config import MetricCollectionConfig, RegressionTestConfig, SuccessCondition, TestConfig, TimeToAccuracy
from core.history import JobHistory, MetricHistory, check_job, check_metric, seed_job_history, seed_metric_history
from core.records import MetricObservation
from core.runs import MetricValue, RunResult
from tests.support import T0

GREATER_2SD = SuccessCondition("greater", stddevs_from_mean=2, wait_for_n_points_of_history=2, history_max_points=4)


def regression(**overrides):
    fields = dict(metric_success_conditions={"acc": GREATER_2SD})
    fields.update(overrides)
    return RegressionTestConfig(**fields)


def observe(history, values, config, statuses=None):
    """Steps the history through one run per value; returns (rows, alerts)."""
    rows, alerts = [], []
    for i, value in enumerate(values):
        status = statuses[i] if statuses else "success"
        row, alert = check_metric(history, MetricObservation("t", f"r{i}", "acc", value, i, status, T0 + i, T0 + i),
                                  config)
        rows.append(row)
        alerts.append(alert)
    return rows, alerts


def test_bounds_need_warm_up_then_apply():
    rows, alerts = observe(MetricHistory(), [10.0, 10.4, 10.2, 5.0], regression(alert_after_second_test_failure=False))
    assert [r["within_bounds"] for r in rows] == [None, None, True, False]
    assert rows[0]["metric_lower_bound"] is None
    assert rows[2]["metric_lower_bound"] == pytest.approx(10.2 - 2 * 0.2)
    mean, std = 10.2, (0.08 / 3) ** 0.5
    assert rows[3]["metric_lower_bound"] == pytest.approx(mean - 2 * std)
    assert rows[3]["metric_upper_bound"] is None
    assert alerts[:3] == [None] * 3
    alert = alerts[3]
    assert alert.kind == "metric_out_of_bounds" and alert.value == 5.0 and alert.details["history_size"] == 3


def test_out_of_bounds_values_are_excluded_from_history_and_history_is_capped():
    history = MetricHistory()
    rows, _ = observe(history, [10.0, 10.4, 10.2, 5.0, 10.1, 10.3, 10.2], regression())
    assert [r["within_bounds"] for r in rows] == [None, None, True, False, True, True, True]
    assert history.values == [10.2, 10.1, 10.3, 10.2]  # the last 4 in-bounds values


def test_second_failure_rule_alerts_only_on_consecutive_regressions():
    history = MetricHistory()
    rows, alerts = observe(history, [10.0, 10.4, 10.2, 5.0, 10.1, 5.0, 5.0], regression())
    assert [r["within_bounds"] for r in rows] == [None, None, True, False, True, False, False]
    assert [a is not None for a in alerts] == [False, False, False, False, False, False, True]


def test_second_failure_rule_alerts_when_there_is_no_previous_value():
    config = regression(metric_success_conditions={"acc": SuccessCondition("greater", fixed_value=1.0)})
    _, alerts = observe(MetricHistory(), [0.5], config)
    assert alerts[0] is not None


def test_failed_runs_get_bounds_but_never_metric_alerts_nor_history():
    history = MetricHistory()
    rows, alerts = observe(history, [10.0, 10.4, 10.2, 1.0], regression(alert_after_second_test_failure=False),
                           ["success", "success", "success", "failure"])
    assert rows[3]["within_bounds"] is False and alerts[3] is None
    assert history.values == [10.0, 10.4, 10.2]


@pytest.mark.parametrize("overrides", [{"alert_for_oob_metrics": False}, {"metric_subset_to_alert": frozenset({"x"})}])
def test_alerting_switches(overrides):
    rows, alerts = observe(MetricHistory(), [10.0, 10.4, 10.2, 5.0],
                           regression(alert_after_second_test_failure=False, **overrides))
    assert rows[3]["within_bounds"] is False and alerts[3] is None


def test_metric_without_condition_is_recorded_unchecked():
    rows, alerts = observe(MetricHistory(), [1.0, 100.0], RegressionTestConfig())
    assert all(r["within_bounds"] is None and r["metric_lower_bound"] is None for r in rows)
    assert alerts == [None, None]


def test_seeded_history_equals_stepped_history():
    config = regression()
    stepped = MetricHistory()
    rows, _ = observe(stepped, [10.0, 10.4, 10.2, 5.0, 10.1, 10.3, 10.2, 4.0], config)
    stored = [(T0 + i, f"r{i}", r["metric_value"], r["within_bounds"], "success") for i, r in enumerate(rows)]
    assert seed_metric_history(reversed(stored), max_points=4) == stepped


def run(name, status, finalized_at, metrics=(), tta_missed=False):
    return RunResult("t", name, status, 0, T0, finalized_at - 60, finalized_at,
                     tuple(MetricValue(m, 1.0, None) for m in metrics), (), (), tta_missed)


def kinds(alerts):
    return [a.kind for a in alerts]


def test_job_alerts_after_second_failure():
    history = JobHistory()
    config = TestConfig()
    sequence = [("r0", "failure"), ("r1", "success"), ("r2", "failure"), ("r3", "timeout"), ("r4", "missing")]
    results = [kinds(check_job(history, run(name, status, T0 + i), config)) for i, (name, status) in enumerate(sequence)]
    assert results == [["job_failed"], [], [], ["job_failed"], ["run_missing"]]
    assert history.last_status == "missing"


def test_job_alerts_on_every_failure_without_the_rule():
    config = TestConfig(regression_test=RegressionTestConfig(alert_after_second_test_failure=False))
    history = JobHistory("success")
    assert kinds(check_job(history, run("r", "failure", T0), config)) == ["job_failed"]
    silent = TestConfig(regression_test=RegressionTestConfig(alert_for_failed_jobs=False))
    assert check_job(JobHistory(), run("r", "failure", T0), silent) == []


def test_required_metrics_alert_whatever_the_status():
    config = TestConfig(regression_test=RegressionTestConfig(required_metrics=("acc_final", "loss_final"),
                                                             alert_for_failed_jobs=False))
    alerts = check_job(JobHistory(), run("r", "failure", T0, ["acc_final"]), config)
    assert kinds(alerts) == ["required_metric_missing"] and alerts[0].metric == "loss_final"


def test_accuracy_never_reached_alerts_for_successful_runs():
    config = TestConfig(MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 0.9)))
    assert kinds(check_job(JobHistory(), run("r", "success", T0, tta_missed=True), config)) == ["accuracy_not_reached"]


def test_alert_ids_are_deterministic_and_distinct():
    config = TestConfig(regression_test=RegressionTestConfig(required_metrics=("a", "b")))
    first = check_job(JobHistory(), run("r", "success", T0), config)
    again = check_job(JobHistory(), run("r", "success", T0), config)
    assert [a.alert_id for a in first] == [a.alert_id for a in again]
    assert len({a.alert_id for a in first}) == 2
    row = first[0].to_row()
    assert row["created_at"] == "2025-11-20T00:00:00.000000Z" and row["test_name"] == "t"


def test_seed_job_history_takes_the_latest_run():
    assert seed_job_history([(T0 + 2, "b", "failure"), (T0 + 1, "a", "success")]).last_status == "failure"
    assert seed_job_history([]).last_status is None
