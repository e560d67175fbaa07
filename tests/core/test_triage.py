"""Triage (accept, dismiss, mute) as the checks apply it: pure state machines, no Beam."""

import json

import pytest

from core.config import RegressionTestConfig, SuccessCondition, TagWindowConfig, WindowCheck, WindowConfig
from core.history import MetricHistory, apply_metric_triage, check_metric, history_policy, seed_metric_history
from core.records import Alert, MetricObservation
from core.triage import AlertFacts, AlertLedger, RaisedAlert, TriageItem, alert_states
from core.vocabulary import AlertKind, AlertState
from core.window_checks import (
    RunEnded,
    WindowHistory,
    apply_window_triage,
    check_window,
    end_run,
    seed_window_history,
    window_triage_targets,
)
from core.windows import WindowResult, WindowSpec
from tests.support import T0

LOSS = SuccessCondition("less", mads_from_median=5, wait_for_n_points_of_history=5)
HEALTHY = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.00]
CONFIG = RegressionTestConfig(metric_success_conditions={"loss": LOSS}, alert_after_second_test_failure=False)
POLICY = history_policy(CONFIG, "loss")


def observation(i, value, status="success"):
    return MetricObservation("t", f"r{i}", "loss", value, i, status, T0 + 100 * i, T0 + 100 * i)


def action(kind, time, **fields):
    return TriageItem(f"{kind}-{time}", "t", kind, time, **fields)


def step_all(history, items):
    """Feeds observations and triage actions in event-time order; returns (run, alert kind or None) per run."""
    out = []
    for item in sorted(items, key=lambda i: i.order):
        if isinstance(item, TriageItem):
            apply_metric_triage(history, item, POLICY)
        else:
            _, alert = check_metric(history, item, CONFIG)
            out.append((item.run, alert.kind if alert else None))
    return out


def runs(values, first=0):
    return [observation(first + i, v) for i, v in enumerate(values)]


def test_accepting_a_change_restarts_the_baseline_at_that_run_and_later_runs_there_are_quiet():
    history = MetricHistory()
    items = runs(HEALTHY + [1.5, 1.52]) + [action("accept", T0 + 100 * 9 + 50, metric="loss", run="r8")] + runs(
        [1.49, 1.51, 1.50], first=10)
    outcome = step_all(history, items)
    assert outcome[8:] == [("r8", "metric_out_of_bounds"), ("r9", "metric_out_of_bounds"),
                           ("r10", None), ("r11", None), ("r12", None)]
    assert history.values == [1.5, 1.52, 1.49, 1.51, 1.50] and history.previous == HEALTHY


def test_after_an_accept_the_old_level_is_a_regression_again():
    history = MetricHistory()
    step_all(history, runs(HEALTHY + [1.5]) + [action("accept", T0 + 850, metric="loss", run="r8")])
    _, alert = check_metric(history, observation(9, 1.0), CONFIG)
    assert alert is None  # lower loss is never a regression for "less"...
    _, alert = check_metric(history, observation(10, 2.5), CONFIG)
    assert alert is not None and alert.kind == AlertKind.METRIC_OUT_OF_BOUNDS  # ...a further rise still is


def test_an_accept_of_a_run_not_seen_yet_applies_when_it_arrives_and_that_run_does_not_alert():
    history = MetricHistory()
    outcome = step_all(history, runs(HEALTHY) + [action("accept", T0 + 750, metric="loss", run="r8")]
                       + runs([1.5, 1.51, 1.49], first=8))
    assert outcome[8:] == [("r8", None), ("r9", None), ("r10", None)]
    assert history.pending_accept is None and history.values == [1.5, 1.51, 1.49]


def test_dismissing_an_alert_lets_its_value_into_the_history_and_ends_its_streak():
    history = MetricHistory()
    outcome = step_all(history, runs(HEALTHY + [1.2, 1.21])
                       + [action("dismiss", T0 + 950, metric="loss", run="r8", alert_id="x", alert_kind="metric_out_of_bounds")]
                       + runs([1.22], first=10))
    assert outcome[8:] == [("r8", "metric_out_of_bounds"), ("r9", "metric_out_of_bounds"), ("r10", "metric_out_of_bounds")]
    assert 1.2 in history.values and 1.21 not in history.values
    assert history.streak == [("r9", 1.21), ("r10", 1.22)]  # r8 no longer starts it: no move after 3 runs


def test_one_dismissed_false_positive_widens_the_bounds_for_the_next_run():
    without, with_dismiss = MetricHistory(), MetricHistory()
    step_all(without, runs(HEALTHY + [1.3]))
    step_all(with_dismiss, runs(HEALTHY + [1.3]) + [action("dismiss", T0 + 850, metric="loss", run="r8",
                                                           alert_id="x", alert_kind="metric_out_of_bounds")])
    assert len(with_dismiss.values) == len(without.values) + 1


def test_the_seeded_history_equals_the_stepped_one_with_actions_in_between():
    actions = [action("dismiss", T0 + 850, metric="loss", run="r8", alert_id="x", alert_kind="metric_out_of_bounds"),
               action("accept", T0 + 1250, metric="loss", run="r11")]
    stepped = MetricHistory()
    observations = runs(HEALTHY + [1.2, 1.0, 1.01, 1.6, 1.61, 1.62, 1.6])
    rows = []
    for item in sorted(observations + actions, key=lambda i: i.order):
        if isinstance(item, TriageItem):
            apply_metric_triage(stepped, item, POLICY)
        else:
            row, _ = check_metric(stepped, item, CONFIG)
            rows.append((item.finalized_at, item.run, item.value, row["within_bounds"], "success"))
    seeded = seed_metric_history(list(reversed(rows)), POLICY, actions)
    assert seeded == stepped and stepped.previous and stepped.values[0] == 1.6


# -- alert states ----------------------------------------------------------------------------------------


def facts(alert_id, run, metric, at, kind=AlertKind.METRIC_OUT_OF_BOUNDS, test="t"):
    return AlertFacts(alert_id, kind, test, run, metric, at)


def test_alert_states_follow_dismiss_accept_and_mute_in_event_time_order():
    alerts = [facts("a1", "r1", "loss", T0 + 10), facts("a2", "r2", "loss", T0 + 20),
              facts("a3", "r3", "loss", T0 + 30), facts("w3", "r3", "loss", T0 + 31, AlertKind.WINDOW_OUT_OF_BOUNDS),
              facts("f4", "r4", None, T0 + 40, AlertKind.JOB_FAILED), facts("o5", "r5", "acc", T0 + 50),
              facts("late", "r9", "loss", T0 + 90)]
    actions = [action("dismiss", T0 + 15, metric="loss", run="r1", alert_id="a1", alert_kind="metric_out_of_bounds"),
               action("accept", T0 + 35, metric="loss", run="r2"),
               action("mute", T0 + 45, until=T0 + 60)]
    states = {alert_id: state for alert_id, (state, _) in alert_states(alerts, actions).items()}
    assert states == {"a1": AlertState.DISMISSED, "a2": AlertState.ACCEPTED, "a3": AlertState.ACCEPTED,
                      "w3": AlertState.ACCEPTED, "f4": AlertState.OPEN, "o5": AlertState.MUTED, "late": AlertState.OPEN}


def test_a_mute_of_one_metric_covers_only_that_metric_and_only_until_it_ends():
    mute = action("mute", T0, metric="loss", until=T0 + 100)
    alerts = [facts("in", "r1", "loss", T0 + 50), facts("other", "r1", "acc", T0 + 50),
              facts("after", "r2", "loss", T0 + 100), facts("before", "r0", "loss", T0 - 1)]
    states = {k: s for k, (s, _) in alert_states(alerts, [mute]).items()}
    assert states == {"in": AlertState.MUTED, "other": AlertState.OPEN, "after": AlertState.OPEN,
                      "before": AlertState.OPEN}


def alert(run, metric, at, kind=AlertKind.METRIC_OUT_OF_BOUNDS):
    return Alert(kind=kind, test="t", run=run, message="m", created_at=at, metric=metric)


def raised(a):
    return RaisedAlert(a.test, a.created_at, a.to_row())


def triage_of(row):
    return json.loads(row["details"]).get("triage")


def test_the_ledger_marks_muted_alerts_and_re_announces_dismissed_and_accepted_ones():
    ledger = AlertLedger()
    assert triage_of(ledger.raise_alert(raised(alert("r1", "loss", T0 + 10)))) is None
    assert ledger.apply(action("mute", T0 + 20, until=T0 + 40, note="maintenance")) == []
    muted = ledger.raise_alert(raised(alert("r2", "loss", T0 + 30)))
    assert triage_of(muted)["state"] == "muted" and triage_of(muted)["note"] == "maintenance"
    assert triage_of(ledger.raise_alert(raised(alert("r3", "loss", T0 + 40)))) is None  # the mute has ended
    first = alert("r1", "loss", T0 + 10)
    updates = ledger.apply(action("dismiss", T0 + 50, alert_id=first.alert_id, run="r1", metric="loss",
                                  alert_kind="metric_out_of_bounds"))
    assert [(u["alert_id"], triage_of(u)["state"]) for u in updates] == [(first.alert_id, "dismissed")]
    updates = ledger.apply(action("accept", T0 + 60, metric="loss", run="r2"))
    assert [(u["run_id"], triage_of(u)["state"]) for u in updates] == [("r2", "accepted"), ("r3", "accepted")]


# -- window checks -------------------------------------------------------------------------------------


TOLERANT = SuccessCondition("less", stddevs_from_mean=3, wait_for_n_points_of_history=2, min_effect_rel=0.1)
TAG = TagWindowConfig(WindowSpec(count=100), (WindowCheck("mean", TOLERANT, history_runs=4),))
WINDOWS = WindowConfig({"loss": TAG})


def window(run, index, mean, start):
    return WindowResult("t", run, "loss", "count", index, start + index, start + index + 1, index * 100,
                        index * 100 + 99, 100, False, {"mean": mean})


def finished(state, i, means):
    start = T0 + 100 * i
    alerts = [a for j, m in enumerate(means) for a in check_window(state, window(f"r{i}", j, m, start), TAG)]
    end_run(state, RunEnded("t", f"r{i}", "success", start + 99, "loss", "count"), TAG, 3)
    return alerts


def test_window_triage_reaches_the_checks_whose_metric_it_names():
    accept = action("accept", T0, metric="loss_mean", run="r1")
    assert [(t.tag, t.kind, t.aggregation) for t in window_triage_targets(accept, WINDOWS)] == [
        ("loss", "count", "mean")]
    assert window_triage_targets(action("accept", T0, metric="loss_final", run="r1"), WINDOWS) == []
    dismiss = action("dismiss", T0, metric="loss_mean", run="r1", alert_id="x",
                     alert_kind="window_out_of_bounds", instance="time/3")
    assert window_triage_targets(dismiss, WINDOWS) == []  # another window kind


def test_an_accepted_window_level_is_the_history_from_then_on():
    state = WindowHistory()
    for i in range(4):
        finished(state, i, [1.0, 0.5, 0.3])
    assert len(finished(state, 4, [2.0, 1.0, 0.6])) == 1
    [target] = window_triage_targets(action("accept", T0 + 499, metric="loss_mean", run="r4"), WINDOWS)
    apply_window_triage(state, target)
    assert state.rebased_from == {"mean": "r4"} and state.finished_runs[-1].excluded == {}
    assert finished(state, 5, [2.0, 1.0, 0.6]) == []


def test_a_dismissed_window_joins_the_history_and_seeding_reproduces_it():
    live = WindowHistory()
    stored = []
    for i, means in enumerate([[1.0, 0.5, 0.3]] * 4 + [[1.0, 0.9, 0.3]]):
        finished(live, i, means)
        stored.append((T0 + 100 * i + 99, f"r{i}", [window(f"r{i}", j, m, T0 + 100 * i) for j, m in enumerate(means)]))
    assert live.finished_runs[-1].excluded == {"mean": frozenset({1})}
    targets = window_triage_targets(action("dismiss", T0 + 500, metric="loss_mean", run="r4", alert_id="x",
                                           alert_kind="window_out_of_bounds", instance="count/1"), WINDOWS)
    for target in targets:
        apply_window_triage(live, target)
    assert live.finished_runs[-1].excluded == {"mean": frozenset()} and live.streaks["mean"] == []
    seeded = seed_window_history(stored, TAG, 3, targets)
    assert seeded.finished_runs == live.finished_runs and seeded.streaks == live.streaks


@pytest.mark.parametrize("fields", [dict(), dict(run="nowhere")])
def test_actions_naming_no_known_run_change_nothing_now(fields):
    history = MetricHistory()
    step_all(history, runs(HEALTHY))
    before = list(history.values)
    apply_metric_triage(history, action("dismiss", T0 + 900, metric="loss", alert_id="x",
                                        alert_kind="metric_out_of_bounds", **fields), POLICY)
    assert history.values == before
