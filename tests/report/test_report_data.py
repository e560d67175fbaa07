"""The report's data preparation (``report/data.py``): pure functions, no matplotlib, no store."""

import math
import re
import statistics
import subprocess
import sys

import pytest

from core.alert_record import AlertRecord
from core.window_checks import WindowResult
from report.data import (
    NO_RUN,
    OUT_OF_BOUNDS,
    RUNNING,
    ReportSettings,
    RunWindows,
    alert_spans,
    alert_tag,
    bound_lines,
    earlier_successful,
    metric_panels,
    prepare_report,
    run_windows,
    runs_to_draw,
    safe_name,
    shared_limits,
    short_label,
    status_grid,
    step_aligned_band,
)
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


def test_points_carry_the_status_of_their_run():
    panel, = metric_panels([metric("r0", 0, "m", 1.0), metric("r1", 1, "m", 1.0), metric("r9", 9, "m", 1.0)],
                           {"r0": "success", "r1": "failure"})
    assert [p.status for p in panel.points] == ["success", "failure", RUNNING]


# --------------------------------------------------------------------------
# The step-aligned band
# --------------------------------------------------------------------------


def test_band_is_mean_plus_minus_k_population_stddev_of_the_same_steps_in_earlier_runs():
    earlier = [("r0", [window("r0", 0, 99, 1.0), window("r0", 100, 199, 10.0, index=1)]),
               ("r1", [window("r1", 0, 99, 2.0), window("r1", 100, 199, 20.0, index=1)]),
               ("r2", [window("r2", 0, 99, 3.0), window("r2", 100, 199, 30.0, index=1)])]
    band = step_aligned_band(window("r3", 100, 199, 0.0, index=1), earlier, "mean", k=2.0)
    std = statistics.pstdev([10.0, 20.0, 30.0])
    assert band.runs == 3 and band.mean == pytest.approx(20.0)
    assert (band.lower, band.upper) == (pytest.approx(20.0 - 2 * std), pytest.approx(20.0 + 2 * std))
    k3 = step_aligned_band(window("r3", 100, 199, 0.0, index=1), earlier, "mean", k=3.0)
    assert k3.upper - k3.mean == pytest.approx(3 * std)


def test_band_takes_the_earlier_window_overlapping_the_most_steps():
    earlier = [("r0", [window("r0", 0, 99, 1.0), window("r0", 100, 199, 5.0, index=1)]),
               ("r1", [window("r1", 0, 149, 3.0), window("r1", 150, 299, 7.0, index=1)])]
    band = step_aligned_band(window("r2", 0, 150, 0.0, kind="time"), earlier, "mean", k=1.0)
    assert band.mean == pytest.approx(2.0)  # [0, 99] from r0 (99 steps vs 50), [0, 149] from r1


def test_no_band_from_fewer_than_two_runs_or_without_the_aggregation():
    one = [("r0", [window("r0", 0, 99, 1.0)])]
    assert step_aligned_band(window("r1", 0, 99, 0.0), one, "mean", 2.0) is None
    no_mean = [("r0", [window("r0", 0, 99, None, p50=1.0)]), ("r1", [window("r1", 0, 99, None, p50=3.0)])]
    assert step_aligned_band(window("r2", 0, 99, 0.0), no_mean, "mean", 2.0) is None
    assert step_aligned_band(window("r2", 0, 99, 0.0), no_mean, "p50", 2.0).mean == 2.0


def test_band_history_is_the_last_successful_runs_before_the_run():
    runs = [windows_of(f"r{i}", status, i, [window(f"r{i}", 0, 99, float(i))])
            for i, status in enumerate(["success", "failure", "success", "success", "success", RUNNING])]
    key = ("loss", "count")
    assert [r for r, _ in earlier_successful(runs, 4, key, band_runs=0)] == ["r0", "r2", "r3"]
    assert [r for r, _ in earlier_successful(runs, 5, key, band_runs=2)] == ["r3", "r4"]
    assert earlier_successful(runs, 0, key, band_runs=2) == []


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


def test_shared_limits_cover_the_bands_too():
    runs = [windows_of(f"r{i}", "success", i, [window(f"r{i}", 0, 99, v)]) for i, v in enumerate([0.0, 10.0, 5.0])]
    from report.data import run_picture
    picture, = shared_limits([run_picture("t", runs, 2, [], ReportSettings(band_stddevs=3.0))])
    curve, = picture.curves
    assert curve.points[0].band.upper == pytest.approx(5.0 + 3 * 5.0)
    assert curve.limits[1] > 20.0 and curve.limits[0] < -10.0


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
