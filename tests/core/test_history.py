import dataclasses
import random

import pytest

from core.alert_details import run_lifecycle_text
from core.config import MetricCollectionConfig, RegressionTestConfig, SuccessCondition, TestConfig, TimeToAccuracy
from core.encoding import encode
from core.history import (
    HistoryEntry,
    HistoryPolicy,
    JobHistory,
    MetricHistory,
    apply_metric_triage,
    check_job,
    check_metric,
    history_policy,
    seed_job_history,
    seed_metric_history,
)
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
    assert rows[3]["metric_upper_bound"] == pytest.approx(mean + 2 * std)  # the improvement bound
    assert alerts[:3] == [None] * 3
    alert = alerts[3]
    assert alert.kind == "metric_out_of_bounds" and alert.value == 5.0 and alert.details["history_size"] == 3
    # The condition's comparison is a str enum; the alert carries its plain text (what JSON and the encoding write).
    assert type(alert.details["comparison"]) is str and alert.details["comparison"] == "greater"
    assert encode(alert) == encode(dataclasses.replace(alert, details={**alert.details, "comparison": "greater"}))


def test_history_entries_are_named_and_bare_tuples_become_entries():
    history = MetricHistory([("r0", 1.0, True)])
    observe(history, [10.0], regression())
    assert history.entries == [HistoryEntry("r0", 1.0, True), HistoryEntry("r0", 10.0, True)]
    assert all(type(entry) is HistoryEntry for entry in history.entries) and history.entries[0] == ("r0", 1.0, True)


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
    assert seed_metric_history(reversed(stored), history_policy(config, "acc")) == stepped


LOSS_5MAD = SuccessCondition("less", mads_from_median=5, wait_for_n_points_of_history=5)
HEALTHY = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.00]


def loss_config(**overrides):
    return regression(metric_success_conditions={"acc": LOSS_5MAD}, **overrides)


def shown(alerts):
    return [a.kind if a else None for a in alerts]


def test_a_persistent_change_alerts_then_moves_the_baseline_once_then_is_quiet():
    history = MetricHistory()
    changed = [1.50, 1.52, 1.49, 1.51, 1.48, 1.50]
    rows, alerts = observe(history, HEALTHY + changed, loss_config())
    assert shown(alerts[len(HEALTHY):]) == [None, "metric_out_of_bounds", "baseline_shifted", None, None, None]
    shift = alerts[len(HEALTHY) + 2]
    assert shift.run == "r10" and shift.details["first_run"] == "r8"
    assert shift.details["runs"] == ["r8", "r9", "r10"] and shift.details["values"] == [1.50, 1.52, 1.49]
    assert shift.details["old_centre"] == pytest.approx(1.0) and shift.details["new_centre"] == 1.50
    assert "moved from 1 to 1.5" in shift.message
    assert [r["within_bounds"] for r in rows[-3:]] == [True, True, True]
    assert history.values == changed and history.previous == HEALTHY


def test_after_a_move_later_regressions_are_judged_against_the_new_level_from_the_first_run():
    history = MetricHistory()
    rows, alerts = observe(history, HEALTHY + [1.50, 1.52, 1.49] + [1.51, 2.0, 2.1], loss_config())
    # the new segment holds 3 values, fewer than the 5 to wait for: centre from them, scale from before
    assert rows[11]["within_bounds"] is True
    assert rows[11]["metric_upper_bound"] == pytest.approx(1.50 + 5 * 0.015 * 1.4826 * (1 + 3.14159 / 2 / 3) ** 0.5,
                                                           rel=1e-4)
    assert [r["within_bounds"] for r in rows[12:]] == [False, False]
    assert shown(alerts[12:]) == [None, "metric_out_of_bounds"]


@pytest.mark.parametrize("values", [
    HEALTHY + [2.0, 1.0, 2.0, 1.01, 2.0, 0.99, 2.0],   # bad runs among healthy ones
    HEALTHY + [2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0],     # streaks shorter than 3, two healthy runs between
])
def test_bad_runs_among_healthy_ones_never_move_the_baseline(values):
    """Also with one healthy run between bad ones allowed (next test): never two healthy runs in a row."""
    history = MetricHistory()
    _, alerts = observe(history, values, loss_config())
    assert "baseline_shifted" not in shown(alerts)
    assert history.previous == [] and max(history.values) < 1.1


def test_failed_runs_do_not_break_or_extend_a_streak():
    history = MetricHistory()
    _, alerts = observe(history, HEALTHY + [1.5, 1.5, 9.0, 1.5], loss_config(),
                        ["success"] * (len(HEALTHY) + 2) + ["failure", "success"])
    assert shown(alerts)[-1] == "baseline_shifted" and history.values == [1.5, 1.5, 1.5]


def test_rebaseline_after_zero_never_moves_and_fixed_values_never_move():
    for config in (loss_config(rebaseline_after=0),
                   regression(metric_success_conditions={"acc": SuccessCondition("less", fixed_value=1.1)})):
        history = MetricHistory()
        _, alerts = observe(history, HEALTHY + [1.5] * 6, config)
        assert shown(alerts)[len(HEALTHY) + 1:] == ["metric_out_of_bounds"] * 5
        assert history.previous == []


def test_a_move_is_silent_when_alerts_are_off_but_the_baseline_still_moves():
    history = MetricHistory()
    _, alerts = observe(history, HEALTHY + [1.5] * 4, loss_config(alert_for_oob_metrics=False))
    assert alerts == [None] * (len(HEALTHY) + 4) and history.values == [1.5] * 4


def test_seeded_history_equals_stepped_history_across_a_move():
    config = loss_config()
    stepped = MetricHistory()
    rows, _ = observe(stepped, HEALTHY + [1.5, 1.52, 1.49, 1.51, 3.0], config)
    stored = [(T0 + i, f"r{i}", r["metric_value"], r["within_bounds"], "success") for i, r in enumerate(rows)]
    seeded = seed_metric_history(reversed(stored), history_policy(config, "acc"))
    assert seeded == stepped and seeded.previous == HEALTHY and seeded.streak == [("r12", 3.0)]


def test_history_policy_follows_the_condition():
    config = loss_config(rebaseline_after=4)
    assert history_policy(config, "acc") == HistoryPolicy(100, 4, False)
    assert history_policy(config, "other") == HistoryPolicy()
    fixed = regression(metric_success_conditions={"acc": SuccessCondition("less", fixed_value=1, history_max_points=7)})
    assert history_policy(fixed, "acc") == HistoryPolicy(7, 0)


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


def test_lifecycle_alerts_say_the_best_accuracy_the_run_reached():
    config = TestConfig(MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 0.9)),
                        RegressionTestConfig(alert_after_second_test_failure=False))
    best = dict(accuracy_best=0.734, accuracy_best_step=900)
    [missed] = check_job(JobHistory(), dataclasses.replace(run("r", "success", T0, tta_missed=True), **best), config)
    assert missed.message == "acc never reached 0.9 (best 0.734 at step 900)"
    assert missed.details["best_value"] == {"metric": "acc", "value": 0.734, "step": 900}
    [failed] = check_job(JobHistory(), dataclasses.replace(run("r", "failure", T0), **best), config)
    assert failed.kind == "job_failed" and failed.details["best_value"]["value"] == 0.734
    assert "best acc 0.734 at step 900" in run_lifecycle_text(T0 - 60, T0, (), failed.details["best_value"])
    assert "best" not in run_lifecycle_text(T0 - 60, T0, (), {"metric": "acc", "value": "<b>"})  # user JSON
    [plain] = check_job(JobHistory(), run("r", "failure", T0), TestConfig(
        regression_test=RegressionTestConfig(alert_after_second_test_failure=False)))
    assert "best_value" not in plain.details


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


def faster_is_better(rate: float):
    """A config checking "acc" one-sided, lower better (a step time), at a false-alert ``rate`` after 10 runs,
    re-baselining after 3 runs out of bounds, every out-of-bounds run an alert."""
    condition = SuccessCondition("less", false_alert_rate=rate, wait_for_n_points_of_history=10)
    return regression(metric_success_conditions={"acc": condition}, rebaseline_after=3,
                      alert_after_second_test_failure=False)


def seeded_from(rows, config) -> MetricHistory:
    """The history the seed rebuilds from ``observe``'s rows as stored, the bounds in their columns."""
    stored = [(T0 + i, f"r{i}", r["metric_value"], r["within_bounds"], "success", r["metric_lower_bound"],
               r["metric_upper_bound"]) for i, r in enumerate(rows)]
    return seed_metric_history(reversed(stored), history_policy(config, "acc"))


def test_an_improvement_that_stays_moves_the_baseline_without_an_alert():
    """Step time 20% faster for good: after rebaseline_after runs beyond the improvement bound the history
    restarts there, so a slowdown back towards the old level is caught, and the seed rebuilds the same state
    from the stored rows (the improvement bound sits in the free column of a one-sided check)."""
    config = faster_is_better(0.002)
    rng = random.Random(3)
    values = [10 + rng.gauss(0, 0.1) for _ in range(30)] + [8 + rng.gauss(0, 0.08) for _ in range(6)] + [9.0]
    history = MetricHistory()
    rows, alerts = observe(history, values, config)
    assert alerts[:-1] == [None] * (len(values) - 1)  # an improvement is no alert
    assert history.previous[:2] == values[:2] and len(history.values) == 6
    assert rows[-2]["within_bounds"] is True and rows[-2]["metric_upper_bound"] < 9.0
    assert alerts[-1].kind == "metric_out_of_bounds"  # 9.0: slower than the new level, faster than the old
    assert seeded_from(rows, config) == history


def test_one_run_back_at_the_old_level_ends_an_improvement_streak():
    condition = SuccessCondition("greater", false_alert_rate=0.002)
    config = regression(metric_success_conditions={"acc": condition}, rebaseline_after=3)
    rng = random.Random(4)
    values = [70 + rng.gauss(0, 0.3) for _ in range(30)] + [75.0, 75.1, 70.0, 75.2, 74.9]
    history = MetricHistory()
    observe(history, values, config)
    assert len(history.values) == len(values) and history.improving == 2


def test_a_change_with_one_run_back_at_the_old_level_still_moves_after_rebaseline_after_runs_out():
    """Loss x2 for good, one run of which fell back within the old bounds: the baseline moves at the third run
    out of bounds (3 alerts, as without the run back), not after a new streak of 3 (5 alerts)."""
    history = MetricHistory()
    _, alerts = observe(history, HEALTHY + [2.0, 1.0, 2.01, 1.99], loss_config(alert_after_second_test_failure=False))
    assert shown(alerts[len(HEALTHY):]) == ["metric_out_of_bounds", None, "metric_out_of_bounds", "baseline_shifted"]
    shifted = alerts[-1]
    assert shifted.details["runs"] == [f"r{len(HEALTHY)}", f"r{len(HEALTHY) + 2}", f"r{len(HEALTHY) + 3}"]
    # the new level starts after the run back at the old level, which joins the old level
    assert history.values == [2.01, 1.99] and history.previous == HEALTHY + [1.0]


# -- history_by: a baseline per machine type ---------------------------------------------------------------


def test_an_improvement_inside_the_improvement_bound_still_moves_the_baseline():
    """A step time 5σ faster for good sits well inside the mirror of a cutoff calibrated for heavy tails; the
    persistent-shift statistic, turned the improving way, restarts the history at its first run (no alert), so
    the history does not hold two levels (whose spread would widen the cutoff several-fold) and a slowdown to
    10σ above the new level, still inside the old bounds, is caught. The seed rebuilds the same state."""
    config = faster_is_better(0.001)
    rng = random.Random(11)
    old = [3.0 + rng.gauss(0, 0.06) for _ in range(30)]
    new = [2.7 + rng.gauss(0, 0.06) for _ in range(8)]
    history = MetricHistory()
    rows, alerts = observe(history, old + new + [3.3], config)
    assert alerts[:-1] == [None] * (len(old) + len(new))
    assert all(row["within_bounds"] for row in rows[len(old):-1])  # never beyond the improvement bound
    assert rows[len(old)]["metric_upper_bound"] > 3.3  # the old bounds let 3.3 through
    assert history.previous == old and [entry.value for entry in history.entries[:len(new)]] == new
    assert alerts[-1].kind == "metric_out_of_bounds"
    assert seeded_from(rows, config) == history


def test_an_improvement_during_the_warm_up_moves_the_baseline_once_the_statistic_can_tell():
    """Step time 20% faster (10σ) for good from the ninth run, while the history still warms up (a new machine
    type, say): its first new-level runs fall in the shift statistic's base, since the statistic needs 10 values
    before its last 5. They are the new level's own start, not an earlier reach of it: the history restarts at
    the first of them as soon as the statistic can be asked (the 15th value). It used to take them for a mode of
    a two-mode history and keep the old level, the cutoff 45σ above the new level at the 16th run and 21σ at the
    24th, where a run back at the old level passed; now 17σ at the 16th (a young level's cutoff for heavy
    tails), and the run back at the old level is caught."""
    config = faster_is_better(0.0005)
    rng = random.Random(5)
    old = [3.75 + rng.gauss(0, 0.075) for _ in range(8)]
    new = [3.0 + rng.gauss(0, 0.06) for _ in range(16)]
    history = MetricHistory()
    rows, alerts = observe(history, old + new + [3.75], config)
    assert alerts[:-1] == [None] * (len(old) + len(new))
    assert [entry.value for entry in history.entries[:len(new)]] == new and history.previous == old
    upper = [row["metric_upper_bound"] for row in rows]
    assert all(u > 5.5 for u in upper[10:15])  # before the statistic can tell: the old level's cutoff
    assert all(u < 4.1 for u in upper[15:])  # from the restart on: the new level's
    assert alerts[-1].kind == "metric_out_of_bounds"
    assert seeded_from(rows, config) == history


@pytest.mark.parametrize("seed", range(10))
def test_an_improvement_in_a_restarted_levels_first_runs_moves_the_baseline(seed):
    """A level restarted a few runs ago (an accept here; a reported shift or a streak out of bounds alike) has
    too few values of its own for the shift statistic's base, and a step time 20% faster (10σ) from its sixth
    run fell inside a mirror that closed in as its runs joined: in 2 of these 10 seeds the history kept both
    levels, the old one a second mode, its cutoff 22-24σ above the new level for good, and a run back at the old
    level passed (the detection benchmark's step time x0.8 five runs after a metric_shifted: 20-25σ for twenty
    runs). The level before the restart now bridges the statistic's base: in every seed the history restarts at
    the first faster run by the fourth, its cutoff within 12σ of the new level from the eighth faster run on,
    and the run back at the old level is caught."""
    config = faster_is_better(0.002)
    rng = random.Random(seed)
    old = [3.0 + rng.gauss(0, 0.06) for _ in range(30)]
    new = [2.4 + rng.gauss(0, 0.048) for _ in range(16)]
    history = MetricHistory()
    observe(history, old, config)
    assert history.accept("r25", history_policy(config, "acc"))  # the level restarts: 5 values of its own
    rows, alerts = [], []
    for i, value in enumerate(new + [3.0], start=30):
        row, alert = check_metric(history, MetricObservation("t", f"r{i}", "acc", value, i, "success", T0 + i,
                                                             T0 + i), config)
        rows.append(row)
        alerts.append(alert)
    assert alerts[:-1] == [None] * len(new) and alerts[-1].kind == "metric_out_of_bounds"
    assert history.entries[0].run == "r30"  # the first faster run
    assert all(row["metric_upper_bound"] < 2.4 + 12 * 0.048 for row in rows[7:-1])


@pytest.mark.parametrize("seed", range(10))
def test_a_level_that_restarted_at_an_improvement_does_not_restart_again_at_a_slow_run_among_its_first(seed):
    """Step time 20% faster for good (10σ), its second run 7σ slower than the new level (past halfway back):
    the history restarts once, at the first faster run. Borrowing the level before it for the statistic's base
    (above) must not take the young level's runs before the slow one for an old level inside it."""
    config = faster_is_better(0.002)
    rng = random.Random(seed)
    old = [3.0 + rng.gauss(0, 0.06) for _ in range(40)]
    new = [2.4 + rng.gauss(0, 0.048) for _ in range(12)]
    new[1] = 2.4 + 7 * 0.048
    history = MetricHistory()
    rows, alerts = observe(history, old + new, config)
    assert alerts == [None] * len(rows)
    assert history.entries[0].run == f"r{len(old)}" and history.previous[-1] == old[-1]


@pytest.mark.parametrize("seed", range(20))
def test_a_two_mode_history_never_restarts_at_its_better_mode(seed):
    """Runs landing at random on two machine types 25% apart (no ``history_by``): three fast runs in a row are
    the history's other mode, not an improvement to move to."""
    config = faster_is_better(0.001)
    rng = random.Random(seed)
    values = [(3.75 if rng.random() < 0.5 else 3.0) * (1 + rng.gauss(0, 0.02)) for _ in range(60)]
    history = MetricHistory()
    observe(history, values, config)
    assert history.previous == []


def observe_on(history, runs, config):
    """Steps the history through (value, accelerator) runs, the accelerator in the run's data (None: not
    said); returns (rows, alerts)."""
    rows, alerts = [], []
    for i, (value, accelerator) in enumerate(runs):
        data = {} if accelerator is None else {"accelerator": accelerator, "logs": f"https://logs/{i}"}
        row, alert = check_metric(history, MetricObservation("t", f"r{i}", "acc", value, i, "success", T0 + i,
                                                             T0 + i, data), config)
        rows.append(row)
        alerts.append(alert)
    return rows, alerts


def two_types(count, seed, slow=1.25, fault_at=None):
    """Step times (noise 0.1) of runs that land at random on a fast (10) or a slow (12.5) machine type; the run
    at ``fault_at`` is on the fast type and x1.2 slower, 20 sigma of the noise but inside the slow type's
    level."""
    rng = random.Random(seed)
    runs = []
    for i in range(count):
        accelerator = "v5e" if i == fault_at else rng.choice(["v4", "v5e"])
        level = 10.0 * (slow if accelerator == "v4" else 1.0) * (1.2 if i == fault_at else 1.0)
        runs.append((level + rng.gauss(0, 0.1), accelerator))
    return runs


STEP_TIME = SuccessCondition("less", false_alert_rate=0.002, wait_for_n_points_of_history=5)


def step_time_config(**overrides):
    return regression(metric_success_conditions={"acc": STEP_TIME}, rebaseline_after=3,
                      alert_after_second_test_failure=False, **overrides)


def test_history_by_judges_each_machine_type_against_its_own_runs():
    """Runs alternating at random between two machine types: with history_by each type has its own baseline,
    so a x1.2 slowdown on the fast type, inside the slow type's level, is caught, and no switch
    between types alerts; the rows and the alert say which segment judged them."""
    runs = two_types(60, seed=5, fault_at=45)
    history = MetricHistory()
    rows, alerts = observe_on(history, runs, step_time_config(history_by=("accelerator",)))
    raised = [(i, a.kind) for i, a in enumerate(alerts) if a]
    assert raised == [(45, "metric_out_of_bounds")], raised
    alert = alerts[45]
    assert alert.details["history_segment"] == f"accelerator={runs[45][1]}"
    assert f"earlier runs with accelerator={runs[45][1]}" in alert.message
    assert {row["history_segment"] for row in rows} == {"accelerator=v4", "accelerator=v5e"}
    assert history.entries == [] and set(history.segments) == {"accelerator=v4", "accelerator=v5e"}
    fast = [value for value, accelerator in runs if accelerator == "v5e"]
    assert history.segments["accelerator=v5e"].values == [v for i, v in enumerate(fast) if v != runs[45][0]][-50:]


def test_without_history_by_the_same_fault_is_not_caught_but_the_switches_settle():
    """The same runs with one history per metric: the fast type's x1.2 slowdown is within the two-mode
    history's bounds (what history_by is for). The switches between types alert in the first runs at most,
    while the warm-up has seen one type only; then the history holds both modes (``core.bounds``: a second
    mode widens the cutoff, an improvement that is a mode moves no baseline, a shift to a mode is none)."""
    runs = two_types(60, seed=5, fault_at=45)
    rows, alerts = observe_on(MetricHistory(), runs, step_time_config())
    assert alerts[45] is None and all(row["history_segment"] is None for row in rows)
    raised = []
    for seed in range(1, 21):
        _, alerts = observe_on(MetricHistory(), two_types(60, seed=seed), step_time_config())
        raised += [(seed, i, alert.kind) for i, alert in enumerate(alerts) if alert]
    assert [alert for alert in raised if alert[1] >= 30] == [] and len(raised) <= 18, raised


def test_history_by_segment_names_follow_the_configured_keys():
    from core.history import history_segment
    data = {"accelerator": "v5e", "zone": "us-c1", "chips": 8, "status": "success"}
    assert history_segment(data, ()) == ""
    assert history_segment(data, ("zone", "accelerator")) == "zone=us-c1, accelerator=v5e"
    assert history_segment(data, ("chips", "topology")) == "chips=8, topology="


def test_triage_reaches_the_segment_holding_the_run_and_a_pending_accept_moves_with_its_run():
    """An accept of a run on one machine type restarts that type's history only; an accept of a run not seen
    yet waits for it, on whichever type it lands; a dismiss finds its run's segment."""
    config = step_time_config(history_by=("accelerator",))
    runs = two_types(30, seed=8)
    history = MetricHistory()
    observe_on(history, runs, config)
    v4, v5e = history.segments["accelerator=v4"], history.segments["accelerator=v5e"]
    before = list(v5e.entries)
    accepted = next(i for i in range(20, 30) if runs[i][1] == "v4")
    history.accept(f"r{accepted}", history_policy(config, "acc"))
    assert v4.entries[0].run == f"r{accepted}" and v5e.entries == before and history.pending_accept is None
    assert not history.accept("r30", history_policy(config, "acc")) and history.pending_accept is None
    assert history.accept("r30", history_policy(config, "acc"), future=True)
    assert history.pending_accept == "r30"
    _, alerts = check_metric(history, MetricObservation("t", "r30", "acc", 20.0, 30, "success", T0 + 30, T0 + 30,
                                                        {"accelerator": "v5e"}), config)
    assert alerts is None and history.pending_accept is None
    assert v5e.entries == [("r30", 20.0, True)] and v5e.previous
    _, alert = check_metric(history, MetricObservation("t", "r31", "acc", 99.0, 31, "success", T0 + 31, T0 + 31,
                                                       {"accelerator": "v4"}), config)
    assert alert.kind == "metric_out_of_bounds" and v4.entries[-1] == ("r31", 99.0, False)
    history.dismiss("r31", history_policy(config, "acc"))
    assert v4.entries[-1] == ("r31", 99.0, True)


def test_a_failed_run_of_a_new_machine_type_starts_no_history():
    config = step_time_config(history_by=("accelerator",))
    history = MetricHistory()
    row, _ = check_metric(history, MetricObservation("t", "r0", "acc", 1.0, 0, "failure", T0, T0,
                                                     {"accelerator": "v6"}), config)
    assert history.segments == {} and row["history_segment"] == "accelerator=v6"


def test_seeded_history_with_segments_equals_stepped_history():
    """The seed puts each stored row back in the segment its row names, triage interleaved in event time."""
    from core.triage import TriageItem
    config = step_time_config(history_by=("accelerator",))
    runs = two_types(40, seed=11, fault_at=30)
    stepped = MetricHistory()
    rows, _ = observe_on(stepped, runs, config)
    accept = TriageItem.from_row({"action_id": "a1", "action": "accept", "test_name": "t", "metric_name": "acc",
                                  "run_id": "r35", "alert_id": None, "alert_kind": None, "alert_instance": None,
                                  "note": None, "author": "me", "until": None, "created_at": T0 + 35.5})
    apply_metric_triage(stepped, accept, history_policy(config, "acc"))
    stored = [(T0 + i, f"r{i}", r["metric_value"], r["within_bounds"], "success", r["metric_lower_bound"],
               r["metric_upper_bound"], r["history_segment"]) for i, r in enumerate(rows)]
    assert seed_metric_history(reversed(stored), history_policy(config, "acc"), [accept]) == stepped


def test_a_metric_condition_without_history_by_keeps_one_history_in_a_test_with_it():
    condition = SuccessCondition("less", false_alert_rate=0.002, wait_for_n_points_of_history=5, history_by=())
    config = regression(metric_success_conditions={"acc": condition}, history_by=("accelerator",))
    history = MetricHistory()
    rows, _ = observe_on(history, two_types(10, seed=1), config)
    assert {row["history_segment"] for row in rows} == {None} and not history.segments and len(history.entries) == 10
