"""Every page of the dashboard on the replayed demo and on a store of hostile names: content, filters, paging,
escaping, bound parameters, stable URLs."""

from __future__ import annotations

import html
import json
import os
import re
import urllib.parse

import duckdb
import pytest

from core.schema import ALERTS, JOB_HISTORY
from dashboard import pages
from sinks.duckdb_store import DuckDBStore
from tests.dashboard.conftest import client_of, replay
from tests.report.test_report import HOSTILE, HOSTILE_METRIC, alert_row, job_row
from tests.support import REPO_ROOT

CIFAR = "pt-cifar-tpu-v3-8"


def rows(store, sql, *params):
    with duckdb.connect(str(store), read_only=True) as connection:
        return connection.execute(sql, list(params)).fetchall()


def chart_specs(page: str) -> list:
    """The JSON specs of the page's charts, as the browser script reads them."""
    return [json.loads(html.unescape(s)) if s.startswith("&") else json.loads(s) for s in
            re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S)]


def alert_links(page: str) -> list:
    return re.findall(r'href="/alerts/([^"?]+)"', page)


def test_alerts_are_listed_newest_first_with_their_state(demo_client, demo_store):
    page = demo_client.get("/alerts")
    assert page.status_code == 200
    stored = rows(demo_store, "SELECT alert_id FROM alerts ORDER BY created_at DESC, alert_id DESC")
    assert alert_links(page.text) == [r[0] for r in stored]
    assert page.text.count('class="state state-open"') == len(stored)
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_alerts_filter_by_test_kind_state_and_time(demo_client, demo_store):
    kind_rows = rows(demo_store, "SELECT alert_id FROM alerts WHERE kind = 'metric_out_of_bounds' "
                                 "ORDER BY created_at DESC, alert_id DESC")
    assert alert_links(demo_client.get("/alerts?kind=metric_out_of_bounds").text) == [r[0] for r in kind_rows]
    test_rows = rows(demo_store, "SELECT alert_id FROM alerts WHERE test_name = ? ORDER BY created_at DESC, "
                                 "alert_id DESC", CIFAR)
    assert alert_links(demo_client.get(f"/alerts?test={CIFAR}").text) == [r[0] for r in test_rows]
    assert len(alert_links(demo_client.get("/alerts?state=open").text)) == len(rows(demo_store, "SELECT 1 FROM alerts"))
    assert alert_links(demo_client.get("/alerts?state=dismissed").text) == []
    (middle,) = rows(demo_store, "SELECT epoch(created_at) FROM alerts ORDER BY created_at LIMIT 1 OFFSET 5")[0]
    newer = rows(demo_store, "SELECT alert_id FROM alerts WHERE epoch(created_at) >= ? "
                             "ORDER BY created_at DESC, alert_id DESC", middle)
    assert alert_links(demo_client.get(f"/alerts?since={middle}").text) == [r[0] for r in newer]
    older = rows(demo_store, "SELECT alert_id FROM alerts WHERE epoch(created_at) < ? "
                             "ORDER BY created_at DESC, alert_id DESC", middle)
    assert alert_links(demo_client.get(f"/alerts?until={middle}").text) == [r[0] for r in older]
    bad = demo_client.get("/alerts?since=yesterday-ish")
    assert bad.status_code == 400 and "is not a time" in html.unescape(bad.text)


def test_alerts_are_paged(tmp_path):
    store = DuckDBStore(str(tmp_path / "many.duckdb"))
    store.ensure_schema()
    store.insert(JOB_HISTORY, [job_row("t", f"r{i:03d}", i / 100, "success") for i in range(120)])
    store.insert(ALERTS, [alert_row("t", f"r{i:03d}", i / 100, "job_failed", None, "m", {}) for i in range(120)])
    store.close()
    client = client_of(f"--local_store={tmp_path / 'many.duckdb'}")
    seen = []
    for number in (1, 2, 3):
        page = client.get(f"/alerts?page={number}&test=t").text
        seen += [urllib.parse.unquote(a) for a in alert_links(page)]
        assert ('rel="next"' in page) == (number < 3)
        assert ('rel="prev"' in page) == (number > 1)
    assert seen == [f"t/r{i:03d}/job_failed/None" for i in reversed(range(120))]
    assert len(alert_links(client.get("/alerts?page=2&state=open").text)) == pages.PER_PAGE


def test_an_alert_shows_what_moved_how_and_its_history(demo_client, demo_store):
    (alert_id, run, value, lower), = rows(demo_store, "SELECT alert_id, run_id, value, lower_bound FROM alerts "
                                                      "WHERE test_name = ? AND metric_name = 'Accuracy/test_max' "
                                                      "AND run_id LIKE '%011'", CIFAR)
    page = demo_client.get(f"/alerts/{alert_id}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "Accuracy/test_max = 70.1028 is outside bounds" in text
    assert f"{value:.6g}" in text and f"{lower:.6g}" in text
    assert "previous value" in text and "70.6901" in text and f"{CIFAR}-010" in text
    assert "stddevs_from_mean" in text and "history_size" in text
    history, *curves = chart_specs(page.text)
    history_rows = rows(demo_store, "SELECT run_id, metric_value, metric_lower_bound FROM metric_history WHERE "
                                    "test_name = ? AND metric_name = 'Accuracy/test_max' ORDER BY timestamp", CIFAR)
    assert history["runs"] == [r[0] for r in history_rows]
    assert history["value"] == [r[1] for r in history_rows]
    assert history["lower"] == [r[2] for r in history_rows]
    assert [r for r, c in zip(history["runs"], history["current"]) if c is not None] == [run]
    assert history["out"][history["runs"].index(run)] == value
    assert history["ylabel"] == "Accuracy/test_max" and history["xlabel"] == "run end (UTC)"
    assert curves and all(c["x"] == "step" for c in curves)
    assert "No triage actions yet." in page.text


def test_the_test_page_charts_checked_metrics_and_lists_runs(demo_client, demo_store):
    page = demo_client.get("/test", params={"name": CIFAR})
    assert page.status_code == 200
    checked = {r[0] for r in rows(demo_store, "SELECT DISTINCT metric_name FROM metric_history WHERE test_name = ? "
                                              "AND within_bounds IS NOT NULL", CIFAR)}
    specs = {spec["title"]: spec for spec in chart_specs(page.text)}
    assert set(specs) == checked
    assert specs["time_to_accuracy"]["ylabel"] == "time_to_accuracy (s)"  # the unit its config gives
    assert specs["Accuracy/test_max"]["ylabel"] == "Accuracy/test_max"  # none configured
    runs = rows(demo_store, "SELECT run_id FROM job_history WHERE test_name = ? ORDER BY timestamp DESC", CIFAR)
    for (run,) in runs:
        assert html.escape(urllib.parse.urlencode({"test": CIFAR, "run": run})) in page.text
    assert "status-success" in page.text
    assert demo_client.get("/test", params={"name": "no-such-test"}).status_code == 404


def test_the_run_page_shows_status_events_metrics_and_curves(demo_client, demo_store):
    run = f"{CIFAR}-011"
    page = demo_client.get("/run", params={"test": CIFAR, "run": run})
    assert page.status_code == 200
    assert "run_finished" in page.text and "out of bounds" in page.text
    metrics = rows(demo_store, "SELECT metric_name FROM metric_history WHERE test_name = ? AND run_id = ?", CIFAR, run)
    for (metric,) in metrics:
        assert metric in html.unescape(page.text)
    assert chart_specs(page.text)
    assert demo_client.get("/run", params={"test": CIFAR, "run": "nope"}).status_code == 404


def test_dead_letters_are_counted_by_reason_and_viewable(demo_client, demo_store):
    page = demo_client.get("/dead-letters")
    assert page.status_code == 200
    for reason, count in rows(demo_store, "SELECT reason, count(*) FROM dead_letter GROUP BY reason"):
        assert reason in html.unescape(page.text) and f"<td>{count}</td>" in page.text
    (letter_id, payload), *_ = rows(demo_store, "SELECT dead_letter_id, payload FROM dead_letter")
    viewer = demo_client.get(f"/dead-letters/{letter_id}")
    assert viewer.status_code == 200 and payload in html.unescape(viewer.text)
    assert demo_client.get("/dead-letters/nope").status_code == 404


def test_the_tests_page_and_the_home_redirect(demo_client):
    assert "pt-cifar-tpu-v3-8" in demo_client.get("/tests").text
    home = demo_client.get("/", follow_redirects=False)
    assert home.status_code == 302 and home.headers["location"] == "/alerts"


def test_hostile_names_render_as_text(small_client):
    for path in ["/alerts", "/tests", f"/alerts?{urllib.parse.urlencode({'test': HOSTILE})}",
                 "/test?" + urllib.parse.urlencode({"name": HOSTILE}),
                 "/run?" + urllib.parse.urlencode({"test": HOSTILE, "run": "h1<i>"})]:
        page = small_client.get(path)
        assert page.status_code == 200, path
        body = page.text
        assert "<script>alert" not in body and "<img src=x" not in body and "<b>$x^2$</b>" not in body, path
        assert "<i>" not in body, path
    page = small_client.get("/test?" + urllib.parse.urlencode({"name": HOSTILE})).text
    assert HOSTILE in html.unescape(page) and "&lt;script&gt;" in page
    spec_text = re.search(r'<script type="application/json" id="chart-1">(.*?)</script>', page, re.S)
    assert spec_text is None or "</" not in spec_text.group(1)
    alert_page = small_client.get(f"/alerts/{urllib.parse.quote(HOSTILE + '/h1<i>/metric_out_of_bounds/', safe='')}"
                                  f"{urllib.parse.quote(HOSTILE_METRIC, safe='')}")
    assert alert_page.status_code in (200, 404)  # an id with '/' is not one path segment
    assert "<img src=x onerror" not in alert_page.text


def test_names_are_bound_parameters_never_sql(demo_client):
    for hostile in ["' OR '1'='1", "x'; DROP TABLE alerts; --", "../../etc/passwd", '"quoted"']:
        assert alert_links(demo_client.get("/alerts", params={"test": hostile}).text) == []
        assert demo_client.get("/test", params={"name": hostile}).status_code == 404
        assert demo_client.get("/run", params={"test": hostile, "run": hostile}).status_code == 404
        assert demo_client.get(f"/alerts/{urllib.parse.quote(hostile, safe='')}").status_code == 404
        assert demo_client.get("/dead-letters", params={"reason": hostile}).status_code == 200
    assert len(alert_links(demo_client.get("/alerts").text)) == 11


def test_the_charting_library_is_served_by_the_dashboard(demo_client):
    page = demo_client.get("/alerts").text
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert scripts == ["/static/uPlot.iife.min.js", "/static/dashboard.js"]
    for src in scripts:
        response = demo_client.get(src)
        assert response.status_code == 200 and len(response.content) > 1000
    assert "uPlot" in demo_client.get("/static/uPlot.iife.min.js").text
    assert "http" not in "".join(re.findall(r'(?:src|href)="([^"]+)"', page))  # nothing from elsewhere


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/%2e%2e/app.py"])
def test_static_files_stay_in_their_directory(demo_client, path):
    assert demo_client.get(path).status_code == 404


def test_report_url_pattern_links_alerts_and_e_mails_to_the_dashboard(tmp_path):
    """``report_url_pattern`` set to the dashboard's run page: each alert's ``details.report_url`` (which the e-mail
    links) opens that run's page, which links the alert's own page."""
    import shutil

    from tests.dashboard.conftest import replay

    configs = tmp_path / "configs"
    shutil.copytree(os.path.join(REPO_ROOT, "configs"), configs)
    path = configs / f"{CIFAR}.json"
    config = json.loads(path.read_text())
    config["regression_test_config"]["report_url_pattern"] = "https://dash.example/run?test={test}&run={run}"
    path.write_text(json.dumps(config))
    store = tmp_path / "trainguard.duckdb"
    replay(store, tmp_path / "alerts.jsonl", f"--config_dir={configs}")
    client = client_of(f"--local_store={store}")
    linked = rows(store, "SELECT alert_id, details FROM alerts WHERE test_name = ?", CIFAR)
    assert linked
    for alert_id, details in linked:
        url = urllib.parse.urlsplit(json.loads(details)["report_url"])
        page = client.get(f"{url.path}?{url.query}")
        assert page.status_code == 200 and f"/alerts/{alert_id}" in page.text


def test_a_run_s_curves_have_the_bounds_the_report_draws(demo_client, demo_store):
    """The live window checks' bounds, replayed from the configs as the static report replays them."""
    from core.config import load_config_dir
    from report.data import ReportSettings, prepare_report
    from report.source import duckdb_source

    run = f"{CIFAR}-011"
    source = duckdb_source(str(demo_store))
    try:
        rows_read = source.jobs(), source.metrics(), source.windows(), source.alerts()
        actions = source.triage_actions()
    finally:
        source.close()
    data = prepare_report(*rows_read, ReportSettings(extra_runs=(run,)), load_config_dir(os.path.join(REPO_ROOT, "configs")),
                          actions)
    (picture,) = [p for s in data.sections for p in s.pictures if p.run == run]
    expected = {f"{c.tag} · {c.aggregation} per {c.kind} window": ([p.lower for p in c.points], [p.upper for p in c.points])
                for c in picture.curves}
    page = demo_client.get("/run", params={"test": CIFAR, "run": run}).text
    drawn = {spec["title"]: (spec["lower"], spec["upper"]) for spec in chart_specs(page)}
    assert drawn == expected
    assert any(v is not None for lower, upper in drawn.values() for v in lower + upper)


def test_only_http_logs_links_are_links(tmp_path):
    store = DuckDBStore(str(tmp_path / "links.duckdb"))
    store.ensure_schema()
    store.insert(JOB_HISTORY, [job_row("t", "r1", 0, "success")])
    store.insert(ALERTS, [
        {**alert_row("t", "r1", 0, "job_failed", None, "m", {"run_data": {"logs_link": "javascript:alert(1)"}}),
         "alert_id": "aa01"},
        {**alert_row("t", "r1", 0, "run_missing", None, "m", {"run_data": {"logs_link": "https://logs/x?a=1&b=<2>"}}),
         "alert_id": "aa02"}])
    store.close()
    client = client_of(f"--local_store={tmp_path / 'links.duckdb'}")
    hostile = client.get("/alerts/aa01").text
    assert 'href="javascript' not in hostile and "javascript:alert(1)" in hostile
    fine = client.get("/alerts/aa02").text
    assert '<a href="https://logs/x?a=1&amp;b=&lt;2&gt;" rel="noopener noreferrer">' in fine


def test_alerts_of_a_test_with_dashboard_url_link_their_page_here(tmp_path):
    """``regression_test_config.dashboard_url``: each alert's report_url, dashboard_url and last next step name
    its page on the dashboard, and that page (of the store the same replay wrote) is the alert's."""
    configs = tmp_path / "configs"
    configs.mkdir()
    for name in os.listdir(os.path.join(REPO_ROOT, "configs")):
        with open(os.path.join(REPO_ROOT, "configs", name), encoding="utf-8") as f:
            config = json.load(f)
        config.setdefault("regression_test_config", {})["dashboard_url"] = "https://trainguard.example/"
        (configs / name).write_text(json.dumps(config), encoding="utf-8")
    replay(tmp_path / "store.duckdb", tmp_path / "alerts.jsonl", f"--config_dir={configs}")
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert alerts
    client = client_of(f"--local_store={tmp_path / 'store.duckdb'}")
    for alert in alerts[:3]:
        page = f"https://trainguard.example/alerts/{alert['alert_id']}"
        details = json.loads(alert["details"])
        assert details["report_url"] == details["dashboard_url"] == page
        assert details["next_steps"][-1] == f"# or in one click on the dashboard: {page}"
        response = client.get(page.replace("https://trainguard.example", ""))
        assert response.status_code == 200 and alert["alert_id"] in response.text
