"""Triage (accept, dismiss, mute) as the checks apply it: pure state machines, no Beam."""

import copy
import json
import os
import re

import pytest

from core import encoding
from core.config import RegressionTestConfig, SuccessCondition, TagWindowConfig, WindowCheck, WindowConfig
from core.history import MetricHistory, apply_metric_triage, check_metric, history_policy, seed_metric_history
from core.records import Alert, MetricObservation, Refused
from core.triage import MAX_RECENT_ALERTS, AlertFacts, AlertLedger, RaisedAlert, TriageItem, alert_states
from core.vocabulary import AlertKind, AlertState
from core.window_checks import (
    RunEnded,
    WindowHistory,
    apply_window_triage,
    check_window,
    end_run,
    reaches_run_level_history,
    seed_window_history,
    window_triage_targets,
)
from core.windows import WindowResult, WindowSpec
from tests.support import REPO_ROOT, T0

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
    outcome = step_all(history, runs(HEALTHY) + [action("accept", T0 + 750, metric="loss", run="r8", future=True)]
                       + runs([1.5, 1.51, 1.49], first=8))
    assert outcome[8:] == [("r8", None), ("r9", None), ("r10", None)]
    assert history.pending_accept is None and history.values == [1.5, 1.51, 1.49]


@pytest.mark.parametrize("named, reason", [
    ("r8", "accept of 'loss' of test 't' from run 'r8': not among the 8 runs of its history (those since its last "
           "re-baseline; a run still going or to come needs the accept's future flag (trainguard-triage accept "
           "--allow_future))"),
    ("r-typo", "not among the 8 runs of its history"),
])
def test_an_accept_of_a_run_the_history_does_not_hold_is_refused_and_changes_nothing(named, reason):
    """Without the future flag, a run the history does not hold (still to come, mistyped, or older than what it
    keeps) is refused: it would otherwise wait for ever as a pending accept."""
    history = MetricHistory()
    step_all(history, runs(HEALTHY))
    before = copy.deepcopy(history)
    with pytest.raises(Refused, match=re.escape(reason)):
        apply_metric_triage(history, action("accept", T0 + 750, metric="loss", run=named), POLICY)
    assert history == before and history.pending_accept is None


def test_an_accept_of_a_metric_the_test_never_reported_is_refused():
    with pytest.raises(Refused, match="no successful run of the test has reported it"):
        apply_metric_triage(MetricHistory(), action("accept", T0, metric="loss_typo", run="r1"), POLICY)


def test_a_stored_accept_the_job_refused_changes_nothing_when_seeded():
    """The seed steps the stored actions as the job did: a refused one (still in the triage table) is skipped."""
    observations = runs(HEALTHY)
    refused = action("accept", T0 + 750, metric="loss", run="r-typo")
    stepped = MetricHistory()
    step_all(stepped, observations)
    seeded = seed_metric_history([(o.finalized_at, o.run, o.value, True, o.status) for o in observations], POLICY,
                                 [refused])
    assert seeded == stepped


def test_a_dismiss_of_an_alert_the_test_never_raised_is_refused_until_the_ledger_is_full():
    ledger = AlertLedger()
    dismiss = action("dismiss", T0, metric="loss", run="r1", alert_id="no-such-alert",
                     alert_kind="metric_out_of_bounds")
    with pytest.raises(Refused, match="test 't' has raised no such alert"):
        ledger.apply(dismiss)
    for index in range(MAX_RECENT_ALERTS):
        ledger.recent[f"a{index}"] = (T0, {"alert_id": f"a{index}"})
    assert ledger.apply(dismiss) == []  # older than what the ledger keeps, or not: the triage table records it


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


def test_a_window_accept_of_a_run_not_ended_waits_only_when_it_says_the_run_is_to_come():
    state = WindowHistory()
    for i in range(4):
        finished(state, i, [1.0, 0.5, 0.3])
    [refused] = window_triage_targets(action("accept", T0 + 450, metric="loss_mean", run="r4"), WINDOWS)
    with pytest.raises(Refused, match="from run 'r4': not among the 4 runs of its history"):
        apply_window_triage(state, refused)
    assert state.pending_accepts == {}
    [future] = window_triage_targets(action("accept", T0 + 450, metric="loss_mean", run="r4", future=True), WINDOWS)
    apply_window_triage(state, future)
    assert state.pending_accepts == {"mean": "r4"}
    finished(state, 4, [2.0, 1.0, 0.6])
    assert state.rebased_from == {"mean": "r4"} and finished(state, 5, [2.0, 1.0, 0.6]) == []


def test_an_accept_of_a_window_metric_reaches_the_window_checks_only():
    window_accept = action("accept", T0, metric="loss_mean", run="r1")
    run_level_accept = action("accept", T0, metric="loss", run="r1")
    assert not reaches_run_level_history(window_accept, WINDOWS)
    assert reaches_run_level_history(run_level_accept, WINDOWS)


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


@pytest.mark.parametrize("future", [False, True])
def test_a_stored_action_reads_back_as_it_was_said_future_flag_included(future):
    """The seed applies the stored accept as the job did: waiting for its run only if it said the run is to come."""
    item = action("accept", T0, metric="loss", run="r9", note="new level", user="ana", future=future)
    row = {**item.to_row(), "created_at": item.time, "until": None}
    assert TriageItem.from_row(row) == item
    seeded = seed_metric_history([(o.finalized_at, o.run, o.value, True, o.status) for o in runs(HEALTHY)], POLICY,
                                 [TriageItem.from_row(row)])
    assert seeded.pending_accept == ("r9" if future else None)


def test_an_accept_stored_before_the_future_flag_waits_for_its_run_as_it_did():
    """A triage row older than the ``future`` column (NULL) and state bytes of TriageItem's first version: their
    accepts waited for a run the check had not seen, so they still do (an update or a re-seed changes nothing)."""
    row = {**action("accept", T0, metric="loss", run="r9").to_row(), "created_at": T0, "until": None, "future": None}
    assert TriageItem.from_row(row).future is True
    mute = {**action("mute", T0, until=T0 + 1).to_row(), "created_at": T0, "until": T0 + 1, "future": None}
    assert TriageItem.from_row(mute).future is False
    assert action("accept", T0, metric="loss", run="r9").to_row()["future"] is False
    for version in ("state_v1", "state_v2"):
        with open(os.path.join(REPO_ROOT, "tests", "fixtures", version, "triage_item.bin"), "rb") as f:
            old = encoding.decode(f.read())
        assert old.action == "accept" and old.future is True
