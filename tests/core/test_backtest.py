"""The backtest's core: stored records through the pipeline's checks, under other configs, against what fired."""

import dataclasses
import random

from core.backtest import (
    StoredHistory,
    StoredRun,
    accuracy_missed,
    backtest,
    collected,
    step_in_event_time_order,
)
from core.config import (
    ConfigSet,
    MetricCollectionConfig,
    RegressionTestConfig,
    SuccessCondition,
    TagWindowConfig,
    TestConfig,
    TimeToAccuracy,
    WindowCheck,
    WindowConfig,
)
from core.history import JobHistory, MetricHistory, check_job, check_metric
from core.records import Alert, MetricObservation
from core.runs import MetricValue, RunResult
from core.triage import AlertFacts, TriageItem
from core.vocabulary import AlertKind, TriageAction
from core.windows import WindowResult, WindowSpec
from tests.support import T0

DAY = 86400.0
TEST = "t"
ACC = "acc_final"
# A regression at runs 8 and 9, a failed run at 5, around a noisy level of 76.
VALUES = [76.0, 76.4, 75.8, 76.2, 76.1, 75.9, 76.3, 76.0, 71.0, 72.0, 76.2, 75.7]
STATUSES = ["success"] * 5 + ["failure"] + ["success"] * 6


def configs(k=4.0, **regression):
    condition = SuccessCondition("greater", stddevs_from_mean=k, wait_for_n_points_of_history=3)
    fields = dict(metric_success_conditions={ACC: condition}, alert_after_second_test_failure=False)
    fields.update(regression)
    return ConfigSet({TEST: TestConfig(regression_test=RegressionTestConfig(**fields))})


def stored_run(i, value, status="success", metrics=None):
    end = T0 + i * DAY + 3600
    return StoredRun(TEST, f"r{i:02}", status, 0, T0 + i * DAY, end, end + 60, (),
                     tuple(metrics if metrics is not None else [MetricValue(ACC, value, 100)]))


RUNS = [stored_run(i, v, s) for i, (v, s) in enumerate(zip(VALUES, STATUSES))]


def raised_in_order(runs, config_set):
    """What the pipeline's checks raise for these runs: each run in the order it was finalized."""
    metric, job, alerts = MetricHistory(), JobHistory(), []
    for stored in sorted(runs, key=lambda r: (r.finalized_at, r.run)):
        run = RunResult(stored.test, stored.run, stored.status, stored.num_failures, stored.start_time,
                        stored.end_time, stored.finalized_at, stored.metrics, (), (), False)
        config = config_set.for_test(TEST)
        alerts += check_job(job, run, config)
        for observation in MetricObservation.all_of(run):
            _, alert = check_metric(metric, observation, config.regression_test)
            alerts += [alert] if alert else []
    return [facts(a) for a in alerts]


def facts(alert):
    return AlertFacts(alert.alert_id, alert.kind.value, alert.test, alert.run, alert.metric, alert.created_at)


def shuffled(items, seed=7):
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def test_unchanged_configs_reproduce_the_stored_alerts_whatever_order_the_rows_come_in():
    fired = raised_in_order(RUNS, configs())
    assert {a.kind for a in fired} == {"job_failed", "metric_out_of_bounds"}
    result = backtest(StoredHistory(runs=shuffled(RUNS), alerts=shuffled(fired)), configs())
    assert result.changed == ()
    assert {(d.kind, len(d.fired), len(d.would_fire)) for d in result.diffs} == \
        {("job_failed", 1, 1), ("metric_out_of_bounds", 2, 2)}
    assert (result.runs, result.values) == (12, 12)


def test_a_tighter_threshold_fires_more_and_the_diff_names_the_new_alerts():
    fired = raised_in_order(RUNS, configs(k=4.0))
    tighter = configs(k=0.5, rebaseline_after=0)
    result = backtest(StoredHistory(runs=RUNS, alerts=fired), tighter)
    [changed] = result.changed
    assert (changed.test, changed.kind) == (TEST, "metric_out_of_bounds")
    assert changed.only_fired == ()
    expected = {a.alert_id for a in raised_in_order(RUNS, tighter)} - {a.alert_id for a in fired}
    assert [a.run for a in changed.only_would_fire] == ["r07", "r11"] and {a.alert_id for a in changed.only_would_fire} == expected
    assert all(a.alert_id == Alert(AlertKind.METRIC_OUT_OF_BOUNDS, TEST, a.run, "", 0.0, ACC).alert_id
               for a in changed.only_would_fire)


def test_a_looser_threshold_lists_the_alerts_that_would_no_longer_fire():
    fired = raised_in_order(RUNS, configs(k=4.0))
    result = backtest(StoredHistory(runs=RUNS, alerts=fired), configs(k=100.0))
    [changed] = result.changed
    assert [a.run for a in changed.only_fired] == ["r08", "r09"] and changed.would_fire == ()


def test_a_longer_warm_up_and_failed_job_settings_change_what_fires():
    fired = raised_in_order(RUNS, configs())
    quiet = backtest(StoredHistory(runs=RUNS, alerts=fired), configs(alert_for_failed_jobs=False))
    assert [(d.kind, [a.run for a in d.only_fired]) for d in quiet.changed] == [("job_failed", ["r05"])]
    warm_up = ConfigSet({TEST: TestConfig(regression_test=RegressionTestConfig(
        {ACC: SuccessCondition("greater", stddevs_from_mean=4, wait_for_n_points_of_history=10)},
        alert_after_second_test_failure=False))})
    later = backtest(StoredHistory(runs=RUNS, alerts=fired), warm_up)
    assert [(d.kind, len(d.only_fired)) for d in later.changed] == [("metric_out_of_bounds", 2)]


def test_run_stalled_alerts_are_carried_over_and_not_re_evaluated():
    stalled = AlertFacts("s1", "run_stalled", TEST, "r03", None, T0)
    result = backtest(StoredHistory(runs=RUNS, alerts=[*raised_in_order(RUNS, configs()), stalled]), configs())
    [carried] = [d for d in result.diffs if d.kind == "run_stalled"]
    assert not carried.re_evaluated and carried.would_fire == (stalled,) and not carried.changed
    assert result.changed == ()


def test_stored_alerts_of_a_test_without_stored_runs_show_as_no_longer_firing():
    ghost = AlertFacts("g1", "job_failed", "gone", "g-01", None, T0)
    [changed] = backtest(StoredHistory(runs=RUNS, alerts=[*raised_in_order(RUNS, configs()), ghost]),
                         configs()).changed
    assert changed.test == "gone" and changed.only_fired == (ghost,)


def test_metrics_the_config_no_longer_collects_are_dropped_and_required_ones_then_missing():
    collection = MetricCollectionConfig(metric_to_aggregation_strategies={"acc": ("max",)},
                                        tags_to_ignore=frozenset({"loss"}))
    assert not collected("acc_final", collection) and collected("acc_max", collection)
    assert not collected("loss_final", collection) and collected("total_wall_time", collection)
    assert collected("unparsed-name", collection) and not collected("time_to_accuracy", collection)
    required = ConfigSet({TEST: TestConfig(metric_collection=collection,
                                           regression_test=RegressionTestConfig(required_metrics=(ACC,)))})
    result = backtest(StoredHistory(runs=RUNS[:2]), required)
    [missing] = result.changed
    assert missing.kind == "required_metric_missing" and [a.run for a in missing.would_fire] == ["r00", "r01"]
    assert result.values == 0


def test_accuracy_reached_is_read_from_the_stored_aggregates_of_the_accuracy_tag():
    collection = MetricCollectionConfig(time_to_accuracy=TimeToAccuracy("acc", 75.0))

    def missed(*metrics):
        return accuracy_missed([MetricValue(name, value, None) for name, value in metrics], collection)

    assert not missed(("acc_final", 76.0))                          # an aggregate at the threshold: reached
    assert missed(("acc_final", 70.0), ("acc_max", 74.0))           # the maximum below it: never reached
    assert not missed(("acc_final", 70.0), ("time_to_accuracy", 9))  # reached under the stored config
    assert missed(("acc_final", 70.0))                              # no evidence it was reached
    assert missed()                                                 # the tag never reported
    assert not accuracy_missed([], MetricCollectionConfig())        # no time_to_accuracy configured
    tta = ConfigSet({TEST: TestConfig(metric_collection=collection)})
    [changed] = backtest(StoredHistory(runs=[stored_run(0, 76.0), stored_run(1, 74.0)]), tta).changed
    assert changed.kind == "accuracy_not_reached" and [a.run for a in changed.would_fire] == ["r01"]


WINDOW_CHECK = WindowCheck("mean", SuccessCondition("greater", stddevs_from_mean=3, wait_for_n_points_of_history=3))


def window_configs(check=WINDOW_CHECK, kind_count=10):
    tag = TagWindowConfig(WindowSpec(count=kind_count, aggregations=("mean",)), (check,))
    return ConfigSet({TEST: TestConfig(windows=WindowConfig(tags={"acc": tag}))})


def windows_of(i, means):
    start = T0 + i * DAY
    return [WindowResult(TEST, f"r{i:02}", "acc", "count", w, start + 100 * w, start + 100 * w + 99, 10 * w,
                         10 * w + 9, 10, False, {"mean": mean}) for w, mean in enumerate(means)]


def test_windows_are_checked_against_the_same_steps_of_earlier_runs_in_event_time_order():
    windows = [w for i in range(6) for w in windows_of(i, [50 + 0.1 * i, 60 - 0.1 * i, 70 + 0.05 * i])]
    windows += windows_of(6, [50.1, 40.0, 70.1])
    history = StoredHistory(runs=[stored_run(i, 76.0) for i in range(7)], windows=shuffled(windows))
    result = backtest(history, window_configs())
    [changed] = result.changed
    assert changed.kind == "window_out_of_bounds"
    assert [(a.run, a.metric) for a in changed.only_would_fire] == [("r06", "acc_mean")]
    assert (result.windows, result.skipped_windows) == (21, 0)
    # windows of another kind than the config's are not checked
    other = window_configs(check=dataclasses.replace(WINDOW_CHECK))
    other = ConfigSet({TEST: dataclasses.replace(other.by_test[TEST], windows=WindowConfig(tags={"acc": TagWindowConfig(
        WindowSpec(time_seconds=60.0, aggregations=("mean",)), (WINDOW_CHECK,))}))})
    assert backtest(history, other).skipped_windows == 21


def test_an_accept_stored_in_triage_moves_the_baseline_at_its_event_time():
    low = [stored_run(i, 76.0 + 0.2 * (i % 3)) for i in range(6)] + [stored_run(i, 60.0 + 0.2 * (i % 3))
                                                                     for i in range(6, 12)]
    config = configs(rebaseline_after=0)
    without = backtest(StoredHistory(runs=low), config)
    assert [len(d.would_fire) for d in without.diffs] == [6]
    accept = TriageItem("a1", TEST, TriageAction.ACCEPT.value, low[6].finalized_at + 1, metric=ACC, run="r06")
    with_accept = backtest(StoredHistory(runs=low, actions=[accept]), config)
    assert [[a.run for a in d.would_fire] for d in with_accept.diffs] == [["r06"]]


@dataclasses.dataclass(frozen=True)
class Item:
    time: float
    name: str

    @property
    def order(self):
        return self.time, self.name


def test_a_key_steps_its_items_and_the_extra_ordered_items_in_event_time_order():
    seen = []

    def step(state, item):
        seen.append(item.name)
        if item.name == "boom":
            raise ValueError("bad item")
        return []

    errors = []
    items = [Item(3.0, "c"), Item(1.0, "a"), Item(2.0, "boom")]
    step_in_event_time_order(None, step, items, extra_items=[Item(2.0, ""), Item(4.0, "d")], errors=errors)
    assert seen == ["a", "", "boom", "c", "d"]
    assert len(errors) == 1 and "ValueError: bad item" in errors[0]
