"""The report's data preparation (``report/data.py``): pure functions, no matplotlib, no store."""

import dataclasses
import math
import re
import statistics
import subprocess
import sys

import pytest

from core.alert_record import AlertRecord
from core.config import (
    ConfigSet,
    RegressionTestConfig,
    SuccessCondition,
    TagWindowConfig,
    TestConfig,
    WindowCheck,
    WindowConfig,
)
from core.triage import TriageItem
from core.window_checks import WindowResult
from core.windows import WindowSpec
from report.data import (
    NO_RUN,
    OUT_OF_BOUNDS,
    RUNNING,
    ReportSettings,
    RunPicture,
    RunWindows,
    alert_spans,
    alert_tag,
    bound_lines,
    check_rule,
    metric_panels,
    prepare_report,
    run_picture,
    run_title,
    run_windows,
    runs_to_draw,
    safe_name,
    shared_limits,
    short_label,
    status_grid,
    tag_checks,
)
from report.publish import copy_name, destination, path_name
from report.source import JobRow, MetricRow, since_literal
from tests.support import REPO_ROOT, T0

DAY = 86400.0




def job(run, day, status="success", test="t"):
    return JobRow(test, run, status, T0 + day * DAY + 1000, T0 + day * DAY + 1060)


def metric(run, day, name, value, lower=None, upper=None, within=None, test="t"):
    return MetricRow(test, run, name, value, lower, upper, within, T0 + day * DAY + 1000)


def window(run, start, end, mean, index=0, tag="loss", kind="count", test="t", **values):
    return WindowResult(test, run, tag, kind, index, T0, T0 + 1, start, end, end - start + 1, False,
                        dict({"mean": mean} if mean is not None else {}, **values))


def alert(run, kind="window_out_of_bounds", metric_name="loss_mean", details=None, test="t", created=T0):
    return AlertRecord(f"{test}/{run}/{metric_name}/{kind}", kind, test, run, metric_name, 1.0, None, None, "m",
                    created, details or {})


def windows_of(run, status, order, windows):
    by_key = {}
    for w in windows:
        by_key.setdefault((w.tag, w.kind), []).append(w)
    return RunWindows(run, status, order, order, {k: tuple(v) for k, v in by_key.items()})


# --------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pt-cifar-tpu-v3-8", "../../etc/passwd", "<script>alert(1)</script>", "..",
                                  ".hidden", "a/b", "a_b", "$\\frac{1}{0}$", "名前/テスト", "-rf", "x" * 300,
                                  "CON", "a\\b:c*d?e\"f|g"])
def test_safe_names_are_plain_visible_bounded_file_names(name):
    safe = safe_name(name)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", safe) and len(safe) <= 60
    assert safe == safe_name(name)  # stable across reports


def test_safe_names_differ_when_names_differ():
    names = ["a/b", "a_b", "a b", "A/b", "a//b", "", ".", "名前", "名前2"]
    assert len({safe_name(n) for n in names}) == len(names)


def test_labels_are_printable_and_shortened():
    assert short_label("abc\x00\ndef", 20) == "abc??def"
    assert short_label("x" * 100, 10) == "x" * 9 + "…"


# --------------------------------------------------------------------------
# Metric history panels
# --------------------------------------------------------------------------


def test_bounds_are_a_band_where_both_sides_exist_and_a_line_where_one_does():
    panel, = metric_panels([metric("r0", 0, "m", 1.0, 0.5, 1.5, True), metric("r1", 1, "m", 1.0, 0.5, None, True),
                            metric("r2", 2, "m", 1.0, None, 2.0, True), metric("r3", 3, "m", 1.0)],
                           {f"r{i}": "success" for i in range(4)})
    lines = bound_lines(panel.points)
    nan = math.nan

    def same(a, b):
        return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))

    assert same(lines.band_lower, (0.5, nan, nan, nan)) and same(lines.band_upper, (1.5, nan, nan, nan))
    assert same(lines.lower_only, (nan, 0.5, nan, nan)) and same(lines.upper_only, (nan, nan, 2.0, nan))


def test_panels_whose_latest_value_is_out_of_bounds_come_first():
    rows = [
        metric("r0", 0, "a_recovered", 9.0, None, 1.0, False), metric("r1", 1, "a_recovered", 0.5, None, 1.0, True),
        metric("r0", 0, "m_both", 1.0, 0.0, 2.0, True), metric("r1", 1, "m_both", 1.0, 0.0, 2.0, True),
        metric("r1", 1, "z_latest_out", 5.0, None, 1.0, False), metric("r0", 0, "z_latest_out", 0.5),
        metric("r1", 1, "b_latest_out", 0.0, 1.0, None, False),
        metric("r0", 0, "c_unchecked", 3.0),
    ]
    panels = metric_panels(rows, {"r0": "success", "r1": "success"})
    assert [p.metric for p in panels] == ["b_latest_out", "z_latest_out", "a_recovered", "c_unchecked", "m_both"]
    assert [p.run for p in panels[1].points] == ["r0", "r1"]  # in run-end order whatever the row order
    assert panels[0].latest_out_of_bounds and not panels[2].latest_out_of_bounds


def test_panels_carry_units_and_triaged_values_and_the_figure_draws_both():
    from core.config import parse_test_config
    from report.data import ReportSettings, section_for_test
    from report.plots import TRIAGED, history_figure

    config = parse_test_config({"metric_collection_config": {"metric_units": {"acc": "%"}}}, "t.json")
    rows = [metric("r0", 0, "acc", 75.0, 74.0, 76.0, True), metric("r1", 1, "acc", 70.0, 74.0, 76.0, False),
            metric("r0", 0, "other", 1.0), metric("r1", 1, "other", 1.0)]
    dismissed = TriageItem("a1", "t", "dismiss", T0 + 2 * DAY, metric="acc", run="r1")
    section = section_for_test("t", [job("r0", 0), job("r1", 1)], rows, [], [], ReportSettings(), config,
                               [dismissed])
    acc, other = sorted(section.panels, key=lambda p: p.metric)
    assert (acc.unit, other.unit) == ("%", None)
    assert [p.triage for p in acc.points] == [None, "dismiss"] and not acc.latest_out_of_bounds
    figure = history_figure(section)
    labels = {ax.get_title(loc="left"): (ax.get_ylabel(), ax.get_xlabel()) for ax in figure.axes}
    assert labels["acc"][0] == "value (%)" and labels["other"][0] == "value (no unit in metric_units)"
    assert sorted(x for _, x in labels.values()) == ["", "run end (UTC)"]  # the lowest panel shows the dates
    acc_axes, = [ax for ax in figure.axes if ax.get_title(loc="left") == "acc"]
    markers = {(line.get_marker(), line.get_markeredgecolor()) for line in acc_axes.lines}
    assert ("s", TRIAGED) in markers and not any(marker == "X" for marker, _ in markers)  # not drawn as an alert


def test_points_carry_the_status_of_their_run():
    panel, = metric_panels([metric("r0", 0, "m", 1.0), metric("r1", 1, "m", 1.0), metric("r9", 9, "m", 1.0)],
                           {"r0": "success", "r1": "failure"})
    assert [p.status for p in panel.points] == ["success", "failure", RUNNING]


# --------------------------------------------------------------------------
# The bounds of the live window checks
# --------------------------------------------------------------------------


def check(k=3.0, history_runs=2, aggregation="mean", history="step_aligned", comparison="greater", wait=2,
          **condition):
    return WindowCheck(aggregation, SuccessCondition(comparison, **(condition or {"stddevs_from_mean": k}),
                                                     wait_for_n_points_of_history=wait),
                       history=history, history_runs=history_runs)


def config_with(*checks, tag="loss", spec=WindowSpec(count=100, aggregations=("mean", "p90")), rebaseline_after=3):
    return TestConfig(regression_test=RegressionTestConfig(rebaseline_after=rebaseline_after),
                      windows=WindowConfig({tag: TagWindowConfig(spec, tuple(checks))}))


def story(values, statuses=None):
    """One run per value, a day apart, each with one count window at steps 0-99 (mean, p90 = mean + 1)."""
    statuses = statuses or ["success"] * len(values)
    return [RunWindows(f"r{i}", status, T0 + i * DAY + 60, T0 + i * DAY + 60, {("loss", "count"): (
        dataclasses.replace(window(f"r{i}", 0, 99, v, p90=v + 1), start_time=T0 + i * DAY, end_time=T0 + i * DAY + 50),
    )}) for i, (v, status) in enumerate(zip(values, statuses))]


def drawn(runs, position, config, alerts=(), actions=()):
    key = ("loss", "count")
    picture = run_picture("t", runs, position, list(alerts), {key: tag_checks(config, key, runs, actions)})
    return picture.curves


def test_bounds_are_the_check_s_own_k_over_its_own_runs_not_a_mean_2_std_of_the_last_10():
    runs = story([1.0, 2.0, 4.0, 100.0, 6.0, 5.0], ["success", "success", "success", "failure", "success", "success"])
    curve, = drawn(runs, 5, config_with(check(k=3.0, history_runs=2)))
    point, = curve.points
    history = [4.0, 6.0]  # the last 2 successful runs, r2 and r4: r3 failed, r0 and r1 are beyond history_runs
    mean, std = statistics.fmean(history), statistics.pstdev(history)
    assert point.bound.lower == pytest.approx(mean - 3 * std) and point.bound.upper is None  # greater: one side
    assert point.bound.centre == pytest.approx(mean) and not point.bound.stored and not point.out_of_bounds
    assert curve.check.condition.stddevs_from_mean == 3.0 and curve.aggregation == "mean"


def test_an_earlier_regressed_run_does_not_widen_the_bounds_of_the_next():
    runs = story([10.0, 11.0, 12.0, 1.0, 1.5])  # r3 regressed, r4 stays at the new level
    regressed, = drawn(runs, 3, config_with(check(k=3.0, history_runs=3)))
    after, = drawn(runs, 4, config_with(check(k=3.0, history_runs=3)))
    assert regressed.points[0].out_of_bounds and after.points[0].out_of_bounds  # no alert needed to be marked
    assert after.points[0].bound == regressed.points[0].bound  # r3's window is left out: r0..r2 again
    mean, std = statistics.fmean([10.0, 11.0, 12.0]), statistics.pstdev([10.0, 11.0, 12.0])
    assert after.points[0].bound.lower == pytest.approx(mean - 3 * std)


def test_a_dismissed_window_counts_again_as_the_check_counts_it():
    runs = story([10.0, 11.0, 12.0, 1.0, 1.5])
    dismiss = TriageItem("d", "t", "dismiss", T0 + 3.5 * DAY, metric="loss_mean", run="r3",
                         alert_kind="window_out_of_bounds", instance="count/0")
    after, = drawn(runs, 4, config_with(check(k=3.0, history_runs=3)), actions=[dismiss])
    history = [11.0, 12.0, 1.0]
    assert after.points[0].bound.lower == pytest.approx(statistics.fmean(history) - 3 * statistics.pstdev(history))


def test_each_check_of_a_tag_gets_its_curve_in_its_aggregation_with_its_bounds():
    runs = story([10.0, 11.0, 12.0, 13.0])
    p90 = check(aggregation="p90", comparison="less", history_runs=5, fixed_value=20.0, wait=0)
    mean_curve, p90_curve = drawn(runs, 3, config_with(check(k=1.0, history_runs=5), p90))
    assert (mean_curve.aggregation, p90_curve.aggregation) == ("mean", "p90")
    assert p90_curve.points[0].value == 14.0 and (p90_curve.points[0].lower, p90_curve.points[0].upper) == (None, 20.0)
    assert mean_curve.points[0].lower == pytest.approx(11.0 - statistics.pstdev([10.0, 11.0, 12.0]))


def test_a_window_that_alerted_draws_the_bound_stored_with_its_alert():
    runs = story([10.0, 11.0, 12.0, 1.0])
    details = {"window": {"kind": "count", "index": 0, "start_step": 0, "end_step": 99}, "history": "step_aligned",
               "centre": 11.5}
    stored = AlertRecord("a", "window_out_of_bounds", "t", "r3", "loss_mean", 1.0, 9.25, None, "m", T0, details)
    curve, = drawn(runs, 3, config_with(check(k=3.0, history_runs=3)), alerts=[stored])
    point, = curve.points
    assert (point.lower, point.upper, point.bound.centre) == (9.25, None, 11.5)  # not the replayed 11 - 3*0.816
    assert point.bound.stored and point.out_of_bounds and curve.alert_spans == ((0, 99),)


def test_a_tag_without_a_window_check_draws_no_bounds_and_says_so():
    runs = story([10.0, 11.0, 12.0, 1.0])
    trailing_only_elsewhere = config_with(check(), tag="other")
    curve, = drawn(runs, 3, trailing_only_elsewhere)
    assert curve.check is None and all(p.bound is None for p in curve.points)
    jobs = [job(f"r{i}", i) for i in range(3)]
    windows = [window(f"r{i}", 0, 99, float(i)) for i in range(3)] + [window("r2", 0, 99, 1.0, tag="gpu")]
    section, = prepare_report(jobs, [], windows, [], ReportSettings(),
                              ConfigSet({"t": config_with(check(), tag="gpu")})).sections
    assert section.unchecked_tags == ("loss",)


def test_a_check_on_the_other_window_kind_is_not_the_tag_s_check():
    runs = story([10.0, 11.0, 12.0])
    curve, = drawn(runs, 2, config_with(check(), spec=WindowSpec(time_seconds=60.0)))
    assert curve.check is None


def test_check_rules_in_a_few_words():
    assert check_rule(check(k=4.0, history_runs=5)) == \
        "check > mean \u2212 4\u00b7stddev of the same steps in the last 5 successful runs"
    robust = WindowCheck("p90", SuccessCondition("less_or_equal", mads_from_median=5.0), history="trailing",
                         trailing_windows=10)
    assert check_rule(robust) == "check \u2264 median + 5\u00b7robust scale of the previous 10 windows of the run"
    assert check_rule(check(history_runs=1, fixed_value=70.0, comparison="greater_or_equal")) == \
        "check \u2265 70 of the same steps in the last 1 successful run"
    assert "rate 0.001" in check_rule(check(false_alert_rate=0.001))


def test_a_run_title_says_what_its_alerts_say_went_wrong():
    alerts = [alert("r", "metric_out_of_bounds", "Accuracy/test_final"), alert("r", "metric_out_of_bounds", "b"),
              alert("r", "metric_out_of_bounds", "c"), alert("r", details={})]
    picture, = prepare_report([job("r", 0)], [], [window("r", 0, 99, 1.0)], alerts, ReportSettings()).sections[0] \
        .pictures
    assert run_title(picture) == ("t / run r \u2014 success, 4 alerts:\n"
                                  "Accuracy/test_final, b and 1 more out of bounds; loss_mean window out of bounds")
    quiet = RunPicture("t", "r", "success", T0, ())
    assert run_title(quiet) == "t / run r \u2014 success"
    long = RunPicture("t" * 80, "r", "failure", T0, (), ("x" * 300,), 1)
    first, second = run_title(long).split("\n")
    assert first == "t" * 35 + "\u2026 / run r \u2014 failure, 1 alert:" and len(second) == 110 and second[-1] == "\u2026"


# --------------------------------------------------------------------------
# Copies next to the model artifacts: the plain ids
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("pt-cifar-tpu-v3-8-011", "pt-cifar-tpu-v3-8-011"), ("run 7 (retry)", "run 7 (retry)"),
    ("名前", "名前"), ("team/model", "team%2Fmodel"), ("../../etc", "..%2F..%2Fetc"), ("..", "%2E%2E"),
    (".", "%2E"), ("a\\b", "a%5Cb"), ("50%", "50%25"), ("a\nb", "a%0Ab"), (".hidden", ".hidden")])
def test_copies_are_named_by_the_plain_ids_escaping_only_what_a_path_cannot_hold(name, expected):
    assert path_name(name) == expected
    assert destination("gs://models/{test}/{run}/trainguard", name, "r1") == f"gs://models/{expected}/r1/trainguard"
    assert copy_name(name) == expected + ".png"


def test_copy_names_differ_when_ids_differ_and_stay_short():
    names = ["a/b", "a%2Fb", "a_b", "a\\b", "..", "%2E%2E", "x" * 300, "x" * 301]
    assert len({path_name(n) for n in names}) == len(names)
    assert all(len(path_name(n).encode()) <= 200 and "/" not in path_name(n) for n in names)


def test_runs_without_a_job_row_are_running_and_latest():
    jobs = {"r0": job("r0", 0), "r1": job("r1", 1, "failure")}
    runs = run_windows([window("live", 0, 99, 1.0), window("r1", 0, 99, 1.0), window("r0", 0, 99, 1.0)], jobs)
    assert [(r.run, r.status) for r in runs] == [("r0", "success"), ("r1", "failure"), ("live", RUNNING)]
    settings = ReportSettings(runs_per_test=2, extra_runs=("r0",))
    assert [runs[i].run for i in runs_to_draw(runs, settings)] == ["live", "r1", "r0"]
    assert [runs[i].run for i in runs_to_draw(runs, ReportSettings(runs_per_test=0))] == ["live", "r1", "r0"]


def test_alert_windows_map_to_the_longest_matching_tag_and_their_kind():
    assert alert_tag("a/b_mean", ["a", "a/b"]) == "a/b"
    assert alert_tag("a_b_p90", ["a", "a_b"]) == "a_b"
    assert alert_tag("loss_final", ["loss"]) is None  # not a window aggregation
    assert alert_tag(None, ["loss"]) is None
    alerts = [alert("r", details={"window": {"start_step": 100, "end_step": 199, "kind": "count"}}),
              alert("r", details={"window": {"start_step": 300, "end_step": 399, "kind": "time"}}),
              alert("r", details={"window": {"start_step": 500, "end_step": 599, "kind": "count"}},
                    metric_name="loss_p90"),
              alert("r", kind="metric_out_of_bounds", details={"window": {"start_step": 0, "end_step": 9}}),
              alert("r", details={"window": "not a dict"}), alert("r", details={"window": {"start_step": None}})]
    assert alert_spans(alerts, ("loss", "count"), ["loss"]) == ((100, 199), (500, 599))
    assert alert_spans(alerts, ("loss", "time"), ["loss"]) == ((300, 399),)


def test_since_is_a_validated_date_literal():
    assert since_literal("2025-11-20") == "TIMESTAMP '2025-11-20'" and since_literal(None) is None
    with pytest.raises(ValueError):
        since_literal("2025-11-20'; DROP TABLE alerts; --")


# --------------------------------------------------------------------------
# A whole test: curves, shared y-scale, notes
# --------------------------------------------------------------------------


def test_pictures_share_one_y_range_per_tag_and_put_alerting_tags_first():
    jobs = [job(f"r{i}", i) for i in range(4)]
    windows = [w for i in range(4) for w in (window(f"r{i}", 0, 99, 1.0 + i), window(f"r{i}", 100, 199, 2.0 + i, 1),
                                             window(f"r{i}", 0, 99, 100.0 * (i + 1), tag="a_throughput"))]
    alerts = [alert("r3", details={"window": {"start_step": 100, "end_step": 199, "kind": "count"}})]
    data = prepare_report(jobs, [metric("r0", 0, "loss_final", 1.0), metric("r0", 0, "wall", 1.0)], windows,
                          alerts, ReportSettings(runs_per_test=3))
    section, = data.sections
    assert [p.run for p in section.pictures] == ["r3", "r2", "r1"]
    latest = section.pictures[0]
    assert [c.tag for c in latest.curves] == ["loss", "a_throughput"]  # the alerting tag first
    assert latest.curves[0].alert_spans == ((100, 199),)
    assert [c.tag for c in section.pictures[1].curves] == ["a_throughput", "loss"]
    limits = {c.limits for p in section.pictures for c in p.curves if c.tag == "loss"}
    assert len(limits) == 1
    lo, hi = limits.pop()
    assert lo < 1.0 + 1 and hi > 2.0 + 3  # covers every picture's values (r1..r3)
    assert section.windowed_tags == ("a_throughput", "loss") and section.curveless_metrics == ("wall",)


def test_shared_limits_cover_the_bounds_too():
    runs = story([0.0, 10.0, 5.0])
    key = ("loss", "count")
    config = config_with(check(k=3.0, comparison="less"))  # r1 is not judged (warm-up): both count for r2
    picture, = shared_limits([run_picture("t", runs, 2, [], {key: tag_checks(config, key, runs)})])
    curve, = picture.curves
    assert curve.points[0].upper == pytest.approx(5.0 + 3 * 5.0)
    assert curve.limits[1] > 20.0 and curve.limits[0] < 5.0  # the bound and the value


def test_windows_without_steps_give_no_curve_and_a_note():
    jobs = [job("r0", 0)]
    no_steps = WindowResult("t", "r0", "loss", "time", 7, T0, T0 + 60, None, None, 3, False, {"mean": 1.0})
    only_max = window("r0", 0, 99, None, tag="gpu", max=3.0)
    section, = prepare_report(jobs, [], [no_steps, only_max], [], ReportSettings()).sections
    assert section.pictures[0].curves == ()
    assert len(section.notes) == 2 and "gpu (count windows)" in section.notes[0]


# --------------------------------------------------------------------------
# Status grid and alert list
# --------------------------------------------------------------------------


def test_status_grid_shows_the_latest_run_of_each_day():
    jobs = [job("a0", 0, test="a"), job("a1-early", 1, "failure", test="a"),
            JobRow("a", "a1-late", "success", T0 + DAY + 5000, T0 + DAY + 5060), job("a3", 3, "timeout", test="a"),
            job("b2", 2, "missing", test="b"), job("b3", 3, test="b")]
    grid = status_grid(jobs, {("b", "b3")}, days=30)
    assert grid.tests == ("a", "b") and len(grid.days) == 4  # from the first day with a run
    assert grid.states == (("success", "success", NO_RUN, "timeout"), (NO_RUN, NO_RUN, "missing", OUT_OF_BOUNDS))
    assert grid.runs[0][1] == "a1-late"
    assert status_grid(jobs, set(), days=2).states == ((NO_RUN, "timeout"), ("missing", "success"))
    assert status_grid([], set(), days=5).days == ()


def test_out_of_bounds_cells_come_from_metrics_and_window_alerts_of_successful_runs():
    jobs = [job("r0", 0), job("r1", 1), job("r2", 2, "failure"), job("r3", 3)]
    metrics = [metric("r0", 0, "m", 1.0, 2.0, None, False), metric("r2", 2, "m", 1.0, 2.0, None, False)]
    data = prepare_report(jobs, metrics, [], [alert("r1")], ReportSettings())
    assert data.grid.states == ((OUT_OF_BOUNDS, OUT_OF_BOUNDS, "failure", "success"),)


def test_alert_list_is_latest_first_and_limited():
    alerts = [alert(f"r{i}", kind="job_failed", created=T0 + i) for i in range(5)]
    data = prepare_report([], [], [], alerts, ReportSettings(max_alerts=3))
    assert [a.run for a in data.alerts] == ["r4", "r3", "r2"] and data.alerts_left_out == 2


def test_only_the_selected_tests():
    jobs = [job("a0", 0, test="a"), job("b0", 0, test="b")]
    data = prepare_report(jobs, [], [], [alert("b0", test="b")], ReportSettings(tests=("a",)))
    assert [s.test for s in data.sections] == ["a"] and data.alerts == () and data.grid.tests == ("a",)


def test_data_preparation_does_not_import_matplotlib():
    code = "import sys, report.data, report.page; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
