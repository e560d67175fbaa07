"""``python -m report`` on a small hand-built store: files, figures, band values, escaping, copies.

The store is written with ``DuckDBStore`` (the pipeline's own sink), so the report reads exactly the
rows and types the pipeline writes. One test replays the bundled demo and calls ``write_report``; one
reads the same rows from the BigQuery emulator and expects the same report data.
"""

import datetime
import json
import os
import pathlib
import re
import statistics

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.patches import Rectangle
from PIL import Image

from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, TABLES, TRIAGE
from pipeline.main import main as pipeline_main
from pipeline.options import DEMO_INPUT
from report import write_report
from report.cli import main as report_main
from report.cli import progress_bar, run
from report.data import ReportSettings, prepare_report, safe_name, short_label
from report.page import history_file, run_file
from report.plots import Figures, history_figure, run_figure, status_figure, style
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


def test_run_figure_draws_the_step_aligned_band_of_earlier_successful_runs(data):
    picture = next(p for p in section(data, TEST).pictures if p.run == "r5")
    with style():
        figure = run_figure(picture, 2.0)
    ax, = figure.axes
    band, = [c for c in ax.collections if isinstance(c, PolyCollection)]
    vertices = {(round(x, 6), round(y, 6)) for x, y in band.get_paths()[0].vertices}
    for i, step in enumerate((49.5, 149.5, 249.5)):
        history = [LOSS[r][i] for r in ("r0", "r1", "r3")]  # r2 failed: not in the band
        mean, std = statistics.fmean(history), statistics.pstdev(history)
        assert (step, round(mean - 2 * std, 6)) in vertices and (step, round(mean + 2 * std, 6)) in vertices
    value_line = ax.lines[-1]
    assert list(value_line.get_ydata()) == [2.5, 30.0, 21.5]  # the highest revision of window 0
    span, = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert (span.get_x(), span.get_x() + span.get_width()) == (100, 199)
    assert ax.get_title(loc="left") == "loss"


def test_the_same_tag_has_the_same_y_scale_in_every_run_of_a_test(data):
    limits = set()
    figures = Figures()
    with style():
        for picture in section(data, TEST).pictures:
            limits.add(figures.figure("run", picture, 2.0).axes[0].get_ylim())
    assert len(limits) == 1
    lo, hi = limits.pop()
    assert lo < 1.0 and hi > 100.0  # r2's failed run is drawn, on the same scale


def test_a_reused_layout_draws_exactly_what_a_fresh_one_does(data):
    pictures = section(data, TEST).pictures
    figures = Figures()
    with style():
        for picture in pictures:  # r5 then the others reuse r5's layout
            reused = figures.figure("run", picture, 2.0)
            fresh = run_figure(picture, 2.0)
            for a, b in zip(reused.axes, fresh.axes):
                assert [type(x).__name__ for x in a.get_children()] == [type(x).__name__ for x in b.get_children()]
                assert a.get_xlim() == b.get_xlim() and a.get_ylim() == b.get_ylim()
                assert [list(line.get_ydata()) for line in a.lines] == [list(line.get_ydata()) for line in b.lines]
            assert reused.get_suptitle() == fresh.get_suptitle()


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


# --------------------------------------------------------------------------
# Command line, copies, progress
# --------------------------------------------------------------------------


def test_copy_to_puts_each_run_picture_next_to_its_artifacts(store, tmp_path):
    artifacts = tmp_path / "models"
    result = run([f"--local_store={store}", f"--out={tmp_path / 'out'}", f"--test={TEST}", "--runs_per_test=1",
                  "--run=r0", f"--copy-to={artifacts}/{{test}}/{{run}}/trainguard"])
    copies = sorted(os.path.relpath(p, artifacts) for p in result.copies)
    assert copies == sorted(os.path.join(safe_name(TEST), safe_name(r), "trainguard",
                                         os.path.basename(run_file(TEST, r))) for r in ("r5", "r0"))
    for path in result.copies:
        with Image.open(path) as image:
            assert image.format == "PNG"
    plain = run([f"--local_store={store}", f"--out={tmp_path / 'out2'}", f"--test={HOSTILE}",
                 f"--copy_to={tmp_path / 'flat'}"])
    assert sorted(os.path.dirname(os.path.relpath(p, tmp_path / "flat")) for p in plain.copies) == \
        sorted(os.path.join(safe_name(HOSTILE), safe_name(r)) for r in ("h0", "h1<i>"))


def test_drawing_in_worker_processes_gives_the_same_figures(store, report, tmp_path):
    _, serial = report
    parallel = run([f"--local_store={store}", f"--out={tmp_path}", "--jobs=2", "--no_progress"])
    assert parallel.figures == serial.figures


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


def test_write_report_on_the_demo_store(tmp_path):
    store = str(tmp_path / "demo.duckdb")
    assert pipeline_main([f"--input_files={DEMO_INPUT}", f"--local_store={store}",
                          f"--alerts_file={tmp_path / 'alerts.jsonl'}"]) == 0
    index = write_report(store, str(tmp_path / "report"))
    assert index == str(tmp_path / "report" / "index.html")
    html = pathlib.Path(index).read_text()
    cifar = "pt-cifar-tpu-v3-8"
    for run_id in ("pt-cifar-tpu-v3-8-010", "pt-cifar-tpu-v3-8-011"):
        assert os.path.exists(tmp_path / "report" / run_file(cifar, run_id))
    assert "window_out_of_bounds" in html and "run_missing" in html
    assert html.count("This test has no live windows") == 3  # every demo test but cifar


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
