"""``python -m report`` on a small hand-built store: files, figures, bounds, layout, escaping, copies.

The store is written with ``DuckDBStore`` (the pipeline's own sink), so the report reads exactly the
rows and types the pipeline writes. The bundled demo is replayed once (``demo_store``): its regressed run's
picture must draw the bound its alert stored, and say what went wrong. One test reads the same rows from the
BigQuery emulator and expects the same report data.
"""

import concurrent.futures
import datetime
import json
import math
import os
import pathlib
import re

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.patches import Rectangle
from PIL import Image

from core import locations
from core.config import load_config_dir
from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, TABLES, TRIAGE
from pipeline.main import main as pipeline_main
from pipeline.options import DEMO_INPUT
from report import write_report
from report.cli import Drawers, build_report, progress_bar, run, worker_context
from report.cli import main as report_main
from report.data import (
    HistoryPoint,
    Incident,
    MetricPanel,
    ReportSection,
    ReportSettings,
    RunPicture,
    prepare_report,
    safe_name,
    short_label,
)
from report.page import history_file, run_file
from report.plots import Figures, history_figure, run_figure, status_figure, style
from report.publish import path_name
from report.source import bigquery_source, duckdb_source
from sinks.duckdb_store import DuckDBStore
from tests.support import T0

DAY = 86400.0

TEST = "pt-small"
HOSTILE = "<script>alert('t')</script> $\\frac{1}{0}$ ../../etc/passwd & \"q\""
HOSTILE_METRIC = "acc<b>$x^2$</b>_final"
HOSTILE_TAG = "acc<b>$x^2$</b>"
LOSS = {  # run -> window means of tag "loss" at steps 0-99, 100-199, 200-299
    "r0": (1.0, 10.0, 20.0), "r1": (2.0, 12.0, 21.0), "r2": (100.0, 100.0, 100.0), "r3": (3.0, 14.0, 22.0),
    "r5": (2.5, 30.0, 21.5)}
STATUS = {"r0": "success", "r1": "success", "r2": "failure", "r3": "success", "r4": "timeout", "r5": "success",
          "r6": "missing"}
METRIC_ORDER = ["m_lower", "z_latest_out", "a_recovered", "loss_final", "m_both"]


def iso(seconds):
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def job_row(test, run, day, status):
    end = T0 + day * DAY + 1000
    return {"run_id": run, "test_name": test, "job_status": status, "num_failures": 0, "start_time": iso(end - 900),
            "timestamp": iso(end), "job_duration_sec": 900.0, "processed_at": iso(end + 60), "events": "[]"}


def metric_row(test, run, day, name, value, lower=None, upper=None, within=None):
    return {"run_id": run, "test_name": test, "metric_name": name, "metric_value": value,
            "metric_lower_bound": lower, "metric_upper_bound": upper, "within_bounds": within,
            "timestamp": iso(T0 + day * DAY + 1000), "step": 299}


def window_row(test, run, day, tag, index, start, end, mean, revision=0, kind="count"):
    t = T0 + day * DAY + index * 60
    return {"run_id": run, "test_name": test, "tag": tag, "window_kind": kind, "window_index": index,
            "revision": revision, "partial": False, "start_time": iso(t), "end_time": iso(t + 50),
            "start_step": start, "end_step": end, "n": end - start + 1, "mean": mean, "min": mean, "max": mean}


def alert_row(test, run, day, kind, metric, message, details):
    return {"alert_id": f"{test}/{run}/{kind}/{metric}", "kind": kind, "test_name": test, "run_id": run,
            "metric_name": metric, "value": 1.0, "lower_bound": None, "upper_bound": 2.0, "message": message,
            "created_at": iso(T0 + day * DAY + 1060), "details": json.dumps(details)}


def small_store_rows():
    """Two tests: ``pt-small`` (a story per run) and a test whose every name is hostile."""
    day = {run_id: i for i, run_id in enumerate(STATUS)}
    jobs = [job_row(TEST, run_id, day[run_id], status) for run_id, status in STATUS.items()]
    jobs += [job_row(HOSTILE, "h0", 0, "success"), job_row(HOSTILE, "h1<i>", 1, "success")]
    metrics = []
    for run_id, d in day.items():
        latest = run_id == "r6"
        metrics += [metric_row(TEST, run_id, d, "m_both", 5.0 + d, 0.0, 20.0, True),
                    metric_row(TEST, run_id, d, "m_lower", 1.0 if latest else 3.0, 2.0, None, not latest),
                    metric_row(TEST, run_id, d, "z_latest_out", 9.0 if latest else 0.5, None, 1.0, not latest),
                    metric_row(TEST, run_id, d, "a_recovered", 0.5 if latest else 9.0, None, 1.0, latest),
                    metric_row(TEST, run_id, d, "loss_final", LOSS.get(run_id, (0, 0, 5.0))[2])]
    metrics += [metric_row(HOSTILE, "h0", 0, HOSTILE_METRIC, 1.0),
                metric_row(HOSTILE, "h1<i>", 1, HOSTILE_METRIC, 2.0)]
    windows = [window_row(TEST, run_id, day[run_id], "loss", i, 100 * i, 100 * i + 99, mean,
                          revision=1 if (run_id, i) == ("r5", 0) else 0)
               for run_id, means in LOSS.items() for i, mean in enumerate(means)]
    # A late point re-wrote r5's first window: the report must read the highest revision (2.5, not 99).
    windows.append(window_row(TEST, "r5", day["r5"], "loss", 0, 0, 99, 99.0, revision=0))
    windows += [window_row(HOSTILE, run_id, d, HOSTILE_TAG, 0, 0, 99, float(d + 1))
                for d, run_id in enumerate(["h0", "h1<i>"])]
    alerts = [
        alert_row(TEST, "r5", 5, "window_out_of_bounds", "loss_mean", "loss_mean in count window 1 (steps 100-199)",
                  {"window": {"start_step": 100, "end_step": 199, "kind": "count", "index": 1}}),
        alert_row(TEST, "r2", 2, "job_failed", None, "run r2 finished with status failure", {"status": "failure"}),
        alert_row(HOSTILE, "h1<i>", 1, "metric_out_of_bounds", HOSTILE_METRIC, "<img src=x onerror=alert(1)>",
                  {"run_data": {"logs_link": "javascript:alert(1)"}}),
        alert_row(HOSTILE, "h0", 0, "metric_out_of_bounds", HOSTILE_METRIC, "fine",
                  {"run_data": {"logs_link": "https://logs.example/h0?a=1&b=<2>"}}),
    ]
    # The hostile test's first alert was dismissed as a false positive, with a hostile note.
    triage = [{"action_id": "t1", "action": "dismiss", "test_name": HOSTILE, "metric_name": HOSTILE_METRIC,
               "run_id": "h0", "alert_id": alerts[3]["alert_id"], "alert_kind": "metric_out_of_bounds",
               "alert_instance": None, "until": None, "note": "<script>x</script>", "author": "me",
               "created_at": iso(T0 + 3 * DAY)}]
    return {JOB_HISTORY: jobs, METRIC_HISTORY: metrics, METRIC_WINDOWS: windows, ALERTS: alerts, TRIAGE: triage}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("store") / "small.duckdb")
    store = DuckDBStore(path)
    store.ensure_schema()
    for table, rows in small_store_rows().items():
        assert store.insert(table, rows) == len(rows)
    store.close()
    return path


@pytest.fixture(scope="module")
def data(store):
    source = duckdb_source(store)
    try:
        rows = source.jobs(), source.metrics(), source.windows(), source.alerts()
    finally:
        source.close()
    return prepare_report(*rows, ReportSettings())


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    return out, run([f"--local_store={store}", f"--out={out}", "--no_progress"])


def section(data, test):
    return next(s for s in data.sections if s.test == test)


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def test_report_writes_the_pngs_and_an_index_linking_them(report):
    out, result = report
    assert result.index == str(out / "index.html")
    expected = {"status.png", history_file(TEST), history_file(HOSTILE)}
    expected |= {run_file(TEST, r) for r in ("r5", "r3", "r2", "r1", "r0")}  # 5 latest runs with windows
    expected |= {run_file(HOSTILE, r) for r in ("h0", "h1<i>")}
    assert set(result.figures) == expected
    written = {os.path.relpath(os.path.join(d, f), out).replace(os.sep, "/") for d, _, fs in os.walk(out) for f in fs}
    assert written == expected | {"index.html"}
    html = (out / "index.html").read_text()
    for relative in expected:
        assert f'src="{relative}"' in html
        with Image.open(out / relative) as image:
            assert image.format == "PNG" and image.width >= 500 and image.height >= 150


def test_panels_are_recorded_in_order(report):
    _, result = report
    assert result.figures[history_file(TEST)] == METRIC_ORDER
    assert result.figures[run_file(TEST, "r5")] == ["loss"]
    assert result.figures[run_file(HOSTILE, "h0")] == [HOSTILE_TAG]


def test_every_file_name_is_safe_and_inside_the_output(report):
    out, result = report
    for relative in result.figures:
        assert re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?", relative), relative
        assert os.path.realpath(out / relative).startswith(os.path.realpath(out) + os.sep)
    assert not os.path.exists(out.parent / "etc")


# --------------------------------------------------------------------------
# Figures (inspected, not just written)
# --------------------------------------------------------------------------


def test_history_figure_has_one_panel_per_metric_latest_out_of_bounds_first(data):
    s = section(data, TEST)
    with style():
        figure = history_figure(s)
    assert [ax.get_title(loc="left") for ax in figure.axes] == METRIC_ORDER
    assert [ax.get_title(loc="right") for ax in figure.axes] == ["latest value out of bounds"] * 2 + [""] * 3
    both = figure.axes[METRIC_ORDER.index("m_both")]
    band, = [c for c in both.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.0) and ys.max() == pytest.approx(20.0)
    lower_only = figure.axes[METRIC_ORDER.index("m_lower")]
    assert [line.get_linestyle() for line in lower_only.lines].count("--") == 1  # one-sided: a dashed line
    # Failed, timed-out and missing runs are marked in every panel.
    for ax in figure.axes:
        assert sum(len(c.get_segments()) for c in ax.collections if isinstance(c, LineCollection)) == 3


def test_run_figure_of_a_tag_without_a_window_check_draws_no_band_and_says_so(data):
    picture = next(p for p in section(data, TEST).pictures if p.run == "r5")
    with style():
        figure = run_figure(picture)
    ax, = figure.axes
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no invented mean ± 2σ band
    # pt-small has no config of its own: only the bound its alert stored is drawn, and the panel says so.
    assert ax.get_title(loc="right").splitlines() == ["mean of count windows, 1 out of bounds",
                                                      "no window check in the configs: bounds of its alerts only"]
    upper, = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert [(x, y) for x, y in zip(upper.get_xdata(), upper.get_ydata()) if not math.isnan(y)] == [(149.5, 2.0)]
    value_line, = [line for line in ax.lines if line.get_marker() == "o"]
    assert list(value_line.get_ydata()) == [2.5, 30.0, 21.5]  # the highest revision of window 0
    cross, = [line for line in ax.lines if line.get_marker() == "X"]
    assert list(zip(cross.get_xdata(), cross.get_ydata())) == [(149.5, 30.0)]  # the window its alert fired for
    span, = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert (span.get_x(), span.get_x() + span.get_width()) == (100, 199)
    assert ax.get_title(loc="left") == "loss"
    assert figure.get_suptitle() == (f"{TEST} / run r5 \u2014 success, 1 alert, 1 window out of bounds:\n"
                                     "loss_mean window out of bounds")


def test_the_same_tag_has_the_same_y_scale_in_every_run_of_a_test(data):
    limits = set()
    figures = Figures()
    with style():
        for picture in section(data, TEST).pictures:
            limits.add(figures.figure("run", picture).axes[0].get_ylim())
    assert len(limits) == 1
    lo, hi = limits.pop()
    assert lo < 1.0 and hi > 100.0  # r2's failed run is drawn, on the same scale


def ydata(line):
    return [None if math.isnan(y) else y for y in line.get_ydata()]


def test_a_reused_layout_draws_exactly_what_a_fresh_one_does(data):
    pictures = section(data, TEST).pictures
    figures = Figures()
    with style():
        for picture in pictures:  # r5 then the others reuse r5's layout
            reused = figures.figure("run", picture)
            fresh = run_figure(picture)
            for a, b in zip(reused.axes, fresh.axes):
                assert [type(x).__name__ for x in a.get_children()] == [type(x).__name__ for x in b.get_children()]
                assert a.get_xlim() == b.get_xlim() and a.get_ylim() == b.get_ylim()
                assert [ydata(line) for line in a.lines] == [ydata(line) for line in b.lines]
            assert reused.get_suptitle() == fresh.get_suptitle()
            assert [ax.get_position().bounds for ax in reused.axes] == [ax.get_position().bounds for ax in fresh.axes]


def test_status_grid_figure(data):
    with style():
        figure = status_figure(data.grid)
    ax, = figure.axes
    image, = ax.images
    assert image.get_array().shape == (2, 7)
    assert [t.get_text() for t in ax.get_yticklabels()] == [short_label(HOSTILE, 40), TEST]


# --------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------


def test_hostile_names_are_escaped_in_html(report):
    out, _ = report
    html = (out / "index.html").read_text()
    assert "<script>" not in html and "<img src=x" not in html and "<b>" not in html and "<i>" not in html
    assert ("&lt;script&gt;alert(&#x27;t&#x27;)&lt;/script&gt; $\\frac{1}{0}$ ../../etc/passwd &amp; "
            "&quot;q&quot;") in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "acc&lt;b&gt;$x^2$&lt;/b&gt;_final" in html
    assert "javascript:" not in html  # a logs link that is not http(s) is not a link
    assert 'href="https://logs.example/h0?a=1&amp;b=&lt;2&gt;"' in html


def test_html_lists_alerts_latest_first_and_links_runs_to_their_pictures(report):
    out, _ = report
    html = (out / "index.html").read_text()
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([a-z_]+)</td>", html)
    assert [kind for _, kind in rows] == ["window_out_of_bounds", "job_failed", "metric_out_of_bounds",
                                          "metric_out_of_bounds"]
    anchor = f"r-{safe_name(TEST)}-{safe_name('r5')}"
    assert f'href="#{anchor}"' in html and f'id="{anchor}"' in html


def test_html_says_which_metrics_have_no_per_run_curve(report):
    out, _ = report
    html = (out / "index.html").read_text()
    assert "Per-run curves for the tags with live windows: loss." in html
    assert "No per-run curve (their tags have no live windows): a_recovered, m_both, m_lower, z_latest_out." \
        in html
    assert "No window check in the configs, so no bounds (but those stored with their alerts, if any): loss." \
        in html  # pt-small has no config of its own


# --------------------------------------------------------------------------
# Command line, copies, progress
# --------------------------------------------------------------------------


def test_copy_to_puts_each_run_picture_next_to_its_artifacts_under_the_plain_ids(store, tmp_path):
    artifacts = tmp_path / "models"
    result = run([f"--local_store={store}", f"--out={tmp_path / 'out'}", f"--test={TEST}", "--runs_per_test=1",
                  "--run=r0", f"--copy-to={artifacts}/{{test}}/{{run}}/trainguard"])
    copies = sorted(os.path.relpath(p, artifacts) for p in result.copies)
    assert copies == [os.path.join(TEST, "r0", "trainguard", "r0.png"), os.path.join(TEST, "r5", "trainguard", "r5.png")]
    for path in result.copies:
        with Image.open(path) as image:
            assert image.format == "PNG"
    flat = tmp_path / "flat"
    plain = run([f"--local_store={store}", f"--out={tmp_path / 'out2'}", f"--test={HOSTILE}", f"--copy_to={flat}"])
    expected = {os.path.join(path_name(HOSTILE), path_name(r), path_name(r) + ".png") for r in ("h0", "h1<i>")}
    assert {os.path.relpath(p, flat) for p in plain.copies} == expected
    assert path_name(HOSTILE) == HOSTILE.replace("\\", "%5C").replace("/", "%2F")  # the rest stays as it is
    for path in plain.copies:  # "../../etc/passwd" in the test name stays inside PATH
        assert os.path.realpath(path).startswith(os.path.realpath(flat) + os.sep) and os.path.isfile(path)


def test_drawing_in_worker_processes_gives_the_same_figures(store, report, tmp_path):
    _, serial = report
    parallel = run([f"--local_store={store}", f"--out={tmp_path}", "--jobs=2", "--no_progress"])
    assert parallel.figures == serial.figures


def test_workers_started_ahead_draw_the_same_figures_and_a_dead_pool_leaves_them_to_this_process(
        store, report, tmp_path, caplog):
    _, serial = report
    with Drawers(2) as drawers:
        ahead = build_report(duckdb_source(store), str(tmp_path / "ahead"), ReportSettings(), store,
                             load_config_dir(locations.CONFIG_DIR), drawers=drawers)
        assert ahead.figures == serial.figures
        for process in drawers._pool._processes.values():
            process.kill()
        process.join()
        fallback = build_report(duckdb_source(store), str(tmp_path / "fallback"), ReportSettings(), store,
                                load_config_dir(locations.CONFIG_DIR), drawers=drawers)
    assert fallback.figures == serial.figures
    assert "the drawing processes failed" in caplog.text


def test_a_drawing_worker_starts_with_the_drawing_code_imported_by_its_fork_server():
    """Each worker would otherwise import matplotlib itself (half a second of CPU apiece)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=worker_context()) as pool:
        # eval: a builtin, so the task itself imports nothing in the worker
        imported = pool.submit(eval, "sorted(m for m in __import__('sys').modules if m.startswith("
                                     "('matplotlib.figure', 'report.plots', 'apache_beam')))").result(timeout=60)
    assert imported == ["matplotlib.figure", "report.plots"]


def test_missing_store_is_an_error_not_a_new_file(tmp_path, capsys):
    assert report_main([f"--local_store={tmp_path / 'nope.duckdb'}", f"--out={tmp_path / 'out'}"]) == 2
    assert "no DuckDB store" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "nope.duckdb")


def test_progress_bar_on_request(capsys):
    bar = progress_bar(3, enabled=True)
    bar.update(3)
    bar.close()
    assert "3/3" in capsys.readouterr().err
    quiet = progress_bar(1000, enabled=False)
    quiet.update(1000)
    quiet.close()
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------
# The demo, and BigQuery
# --------------------------------------------------------------------------


CIFAR = "pt-cifar-tpu-v3-8"
REGRESSED, LEVEL_CONTINUES = "pt-cifar-tpu-v3-8-010", "pt-cifar-tpu-v3-8-011"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """The bundled demo replayed into a store (no report): cifar regresses in run 010 and stays there in 011."""
    directory = tmp_path_factory.mktemp("demo")
    store = str(directory / "demo.duckdb")
    assert pipeline_main([f"--input_files={DEMO_INPUT}", f"--local_store={store}", "--report_dir=",
                          f"--alerts_file={directory / 'alerts.jsonl'}"]) == 0
    return store


def demo_data(store, with_alerts=True):
    source = duckdb_source(store)
    try:
        jobs, metrics, windows, alerts = source.jobs(), source.metrics(), source.windows(), source.alerts()
        actions = source.triage_actions()
    finally:
        source.close()
    return prepare_report(jobs, metrics, windows, alerts if with_alerts else [], ReportSettings(),
                          load_config_dir(locations.CONFIG_DIR), actions), alerts


def demo_picture(data, run_id):
    return next(p for s in data.sections if s.test == CIFAR for p in s.pictures if p.run == run_id)


def test_write_report_on_the_demo_store(demo_store, tmp_path):
    index = write_report(demo_store, str(tmp_path / "report"))
    assert index == str(tmp_path / "report" / "index.html")
    html = pathlib.Path(index).read_text()
    for run_id in (REGRESSED, LEVEL_CONTINUES):
        assert os.path.exists(tmp_path / "report" / run_file(CIFAR, run_id))
    assert "window_out_of_bounds" in html and "run_missing" in html
    assert html.count("This test has no live windows") == 3  # every demo test but cifar
    assert "so no bounds (but those stored with their alerts, if any): throughput/examples_per_sec." in html


def test_the_regressed_run_draws_the_bound_its_alert_stored(demo_store):
    data, alerts = demo_data(demo_store)
    alert, = [a for a in alerts if a.kind == "window_out_of_bounds"]
    assert (alert.run, alert.metric) == (REGRESSED, "Accuracy/test_mean")
    picture = demo_picture(data, REGRESSED)
    curve = next(c for c in picture.curves if c.tag == "Accuracy/test")
    fired = next(p for p in curve.points if p.index == alert.window["index"])
    assert (fired.lower, fired.upper) == (alert.lower_bound, alert.upper_bound)
    assert fired.bound.centre == alert.details["centre"] and fired.bound.stored and fired.out_of_bounds
    assert curve.check.condition.stddevs_from_mean == alert.details["multiplier"] == 4.0  # the check's k, not 2
    # Drawn: the dashed bound line passes through the stored bound at the window, marked by a diamond.
    with style():
        figure = run_figure(picture)
    ax = figure.axes[picture.curves.index(curve)]
    dashed, = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert dict(zip(dashed.get_xdata(), dashed.get_ydata()))[fired.step] == alert.lower_bound
    diamond, = [line for line in ax.lines if line.get_marker() == "D"]
    assert list(zip(diamond.get_xdata(), diamond.get_ydata())) == [(fired.step, alert.lower_bound)]
    crosses, = [line for line in ax.lines if line.get_marker() == "X"]
    assert len(crosses.get_xdata()) == curve.out_of_bounds == 6


def test_the_replayed_check_gives_the_bound_the_live_check_used(demo_store):
    """Without the alerts, the bounds come from replaying the check over the stored windows: the same."""
    data, alerts = demo_data(demo_store, with_alerts=False)
    alert, = [a for a in alerts if a.kind == "window_out_of_bounds"]
    curve = next(c for c in demo_picture(data, REGRESSED).curves if c.tag == "Accuracy/test")
    fired = next(p for p in curve.points if p.index == alert.window["index"])
    assert not fired.bound.stored and fired.out_of_bounds
    assert fired.lower == pytest.approx(alert.lower_bound, rel=1e-12)
    assert fired.bound.centre == pytest.approx(alert.details["centre"], rel=1e-12)


def test_the_run_after_a_regression_is_judged_without_it(demo_store):
    """011 stays at 010's level: its bounds leave 010's windows out (as the live check did), so all its
    windows are out of bounds, where a band over the last runs including 010 made it look healthy."""
    data, _ = demo_data(demo_store)
    regressed, after = (next(c for c in demo_picture(data, r).curves if c.tag == "Accuracy/test")
                        for r in (REGRESSED, LEVEL_CONTINUES))
    assert [p.lower for p in after.points] == [p.lower for p in regressed.points]
    assert after.out_of_bounds == len(after.points) == 6 and not after.alert_spans  # no alert: the level continues


def test_the_titles_say_what_was_wrong(demo_store):
    data, _ = demo_data(demo_store)
    picture = demo_picture(data, REGRESSED)
    with style():
        title = run_figure(picture).get_suptitle()
    first, second = title.split("\n")
    assert first == f"{CIFAR} / run {REGRESSED} \u2014 success, 4 alerts, 6 windows out of bounds:"
    assert second == ("Accuracy/test_final, Accuracy/test_max and 1 more out of bounds; "
                      "Accuracy/test_mean window out of bounds")
    healthy = demo_picture(data, "pt-cifar-tpu-v3-8-009")
    assert healthy.alert_count == 0 and not healthy.problems
    throughput = next(c for c in healthy.curves if c.tag == "throughput/examples_per_sec")
    assert throughput.check is None and all(p.bound is None for p in throughput.points)


# --------------------------------------------------------------------------
# Layout: the title, the legend and the panels never overlap
# --------------------------------------------------------------------------


def history_section(count):
    """A test with ``count`` metrics whose legend has every entry (bands, lines, crosses, bad runs)."""
    panels = tuple(MetricPanel(f"metric_{i:02d}_{'x' * 30}", (
        HistoryPoint("r0", T0, 1.0, 0.0, 2.0, True, "success"),
        HistoryPoint("r1", T0 + DAY, 3.0, 0.0, None, False, "failure"),
        HistoryPoint("r2", T0 + 2 * DAY, 1.5, None, 2.0, True, "success"))) for i in range(count))
    return ReportSection("a-test-" + "y" * 60, panels, (Incident("r1", T0 + DAY, "failure"),
                                                        Incident("r3", T0 + 3 * DAY, "timeout"),
                                                        Incident("r4", T0 + 4 * DAY, "missing")), (), (), ())


def assert_no_overlaps(figure):
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    page = figure.bbox
    title = figure._suptitle.get_window_extent(renderer)
    legend, = figure.legends
    legend_box = legend.get_window_extent(renderer)
    assert not title.overlaps(legend_box), (title, legend_box)
    for box in (title, legend_box):
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    for ax in figure.axes:  # the panels and their titles stay below the header
        panel = ax.get_tightbbox(renderer)
        assert not panel.overlaps(title) and not panel.overlaps(legend_box), (ax.get_title(loc="left"), panel)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 13, 20])
def test_the_history_title_and_legend_never_overlap(count):
    with style():
        figure = history_figure(history_section(count))
        assert len(figure.axes) == count
        assert_no_overlaps(figure)


@pytest.mark.parametrize("run_id", [REGRESSED, "pt-cifar-tpu-v3-8-009"])
def test_the_run_title_legend_and_panels_never_overlap(demo_store, run_id):
    data, _ = demo_data(demo_store)
    picture = demo_picture(data, run_id)
    long = RunPicture("t" * 200, "r" * 200, "success", T0, picture.curves, ("a" * 40 + " out of bounds",) * 9, 9)
    with style():
        for drawn in (picture, long):
            assert_no_overlaps(run_figure(drawn))


def test_bigquery_source_reads_what_the_duckdb_source_reads(store, bigquery_emulator):
    from google.cloud import bigquery

    client = bigquery_emulator.client()
    dataset = "report_source"
    client.create_dataset(dataset, exists_ok=True)
    for table, rows in small_store_rows().items():
        schema = [bigquery.SchemaField(c.name, c.type, mode="REQUIRED" if c.required else "NULLABLE")
                  for c in table.columns]
        client.create_table(bigquery.Table(f"{client.project}.{dataset}.{table.name}", schema=schema))
        assert client.insert_rows_json(f"{client.project}.{dataset}.{table.name}", rows) == []
    assert set(small_store_rows()) == set(TABLES.values()) - {TABLES["dead_letter"], TABLES["rank_metrics"]}

    def read(source):
        try:
            return [sorted(rows, key=repr) for rows in (source.jobs(), source.metrics(), source.windows(),
                                                         source.alerts())]
        finally:
            source.close()

    bigquery_rows = read(bigquery_source(client.project, dataset, bigquery_emulator.endpoint))
    assert bigquery_rows == read(duckdb_source(store))
    assert [a.state.value for a in bigquery_rows[3] if a.test == HOSTILE] == ["dismissed", "open"]
    since = read(bigquery_source(client.project, dataset, bigquery_emulator.endpoint, since="2025-11-25"))
    assert since == read(duckdb_source(store, since="2025-11-25")) and 0 < len(since[0]) < len(bigquery_rows[0])


def test_the_alert_list_shows_each_alert_s_triage_state_and_note_escaped():
    from core.alert_record import AlertRecord
    from core.triage import TriageItem
    from report.page import alert_row
    from report.source import with_triage_states

    def record(alert_id, run, at):
        return AlertRecord(alert_id, "metric_out_of_bounds", TEST, run, "loss_final", 2.0, None, 1.5, "m", at, {})

    alerts = [record("a1", "r1", T0 + 10), record("a2", "r2", T0 + 20)]
    dismiss = TriageItem("d1", TEST, "dismiss", T0 + 30, metric="loss_final", run="r1", alert_id="a1",
                         alert_kind="metric_out_of_bounds", note="<b>flaky</b> host")
    marked = with_triage_states(alerts, [dismiss])
    assert [a.state.value for a in marked] == ["dismissed", "open"]
    html = alert_row(marked[0], set())
    assert "<td>dismissed<br><span class=\"note\">&lt;b&gt;flaky&lt;/b&gt; host</span></td>" in html


def test_a_test_filter_that_matches_nothing_is_an_error_naming_the_nearest(store, tmp_path, capsys):
    assert report_main([f"--local_store={store}", f"--out_dir={tmp_path / 'r'}", "--test=does-not-exist"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--test=does-not-exist matches no test" in err and "known tests:" in err
    assert report_main([f"--local_store={store}", f"--out_dir={tmp_path / 'r'}", "--test=pt-smal"]) == 2
    assert "did you mean 'pt-small'?" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_output_directory_is_out_dir_and_out_still_works(store, tmp_path):
    assert run([f"--local_store={store}", f"--out_dir={tmp_path / 'a'}", "--jobs=1"]).index == str(
        tmp_path / "a" / "index.html")
    assert run([f"--local-store={store}", f"--out={tmp_path / 'b'}", "--jobs=1"]).index == str(
        tmp_path / "b" / "index.html")


def test_an_unknown_report_option_exits_2_naming_the_nearest(capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main(["--runs_per_tset=3"])
    assert exit_info.value.code == 2
    assert "unknown option --runs_per_tset (did you mean --runs_per_test?)" in capsys.readouterr().err
