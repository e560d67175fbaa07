"""What each page shows, gathered from the bounded queries (``dashboard.queries``) into one record per page.

Functions take an open reader and the page's keys, and return a dataclass the template renders (None: no such
alert, test or run). The run's curves are the report's (``report.data.run_curves``): the same windows, drawn
against the bounds the live check's alerts stored.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from core.alert_record import AlertRecord
from core.config import ConfigSet
from core.triage import TriageItem
from core.vocabulary import AlertState
from dashboard import charts, queries
from dashboard.store import Reader
from dashboard.triage import ActionSink, AlertView, alert_views, triage_history
from report.data import run_curves, run_windows, tag_checks

PER_PAGE = 50
STATE_BATCH = 500         # alerts read at a time when filtering by triage state
STATE_SCAN_LIMIT = 20_000  # at most this many of the newest alerts are scanned for a state filter
TEST_CHART_RUNS = 200     # runs on each chart of a test page (an alert's chart shows queries.HISTORY_LIMIT)
HOW_COMPUTED = ("threshold", "comparison", "centre", "scale", "multiplier", "stddevs_from_mean", "history_size",
                "change_pct", "change_in_scales", "step", "history_segment", "window")


@dataclasses.dataclass
class AlertListing:
    views: List[AlertView]
    more: bool
    scanned_limit: bool = False  # a state filter stopped after STATE_SCAN_LIMIT alerts


@dataclasses.dataclass
class AlertDetail:
    view: AlertView
    how: List[Tuple[str, str]]
    history: Optional[Dict[str, Any]]
    curves: List[Dict[str, Any]]
    triage: List[Tuple[TriageItem, bool]]


@dataclasses.dataclass
class TestDetail:
    name: str
    charts: List[Dict[str, Any]]
    grid: List[Tuple[str, Dict[str, int]]]  # day -> status -> runs
    runs: List[queries.Job]
    more: bool


@dataclasses.dataclass
class RunDetail:
    job: queries.Job
    events: List[Dict[str, Any]]
    metrics: List[queries.Point]
    ranks: List[Tuple[str, int, float, Optional[int]]]
    curves: List[Dict[str, Any]]
    alerts: List[AlertView]


def alert_listing(reader: Reader, f: queries.AlertFilter, page: int, sink: ActionSink) -> AlertListing:
    """One page of alerts, newest first; a state filter scans the newest alerts batch by batch."""
    offset = (page - 1) * PER_PAGE
    if not f.state:
        views = alert_views(reader, queries.alerts_newest_first(reader, f, offset, PER_PAGE + 1), sink)
        return AlertListing(views[:PER_PAGE], len(views) > PER_PAGE)
    matched: List[AlertView] = []
    scanned, exhausted = 0, False
    while len(matched) <= offset + PER_PAGE and scanned < STATE_SCAN_LIMIT:
        batch = queries.alerts_newest_first(reader, f, scanned, STATE_BATCH)
        matched += [v for v in alert_views(reader, batch, sink) if v.state.value == f.state]
        scanned += STATE_BATCH
        if len(batch) < STATE_BATCH:
            exhausted = True
            break
    more = len(matched) > offset + PER_PAGE
    return AlertListing(matched[offset:offset + PER_PAGE], more, not exhausted and not more)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def triaged_runs(actions: List[Tuple[TriageItem, bool]], metric: Optional[str]) -> set:
    """Runs whose value of ``metric`` a dismiss or accept covers (marked apart on the history chart)."""
    return {a.run for a, _ in actions if a.run and a.action in ("dismiss", "accept") and a.metric == metric}


def curves_of_run(reader: Reader, test: str, run: str, job: Optional[queries.Job],
                  alerts: Callable[[], List[AlertRecord]], configs: Optional[ConfigSet] = None,
                  span: queries.Span = queries.Span()) -> List[Dict[str, Any]]:
    """The run's window curves as chart specs (none when the run has no windows), each against the bounds of its
    live check: the alert's stored bound where a window alerted; with ``configs`` (the pipeline's), elsewhere the
    bound the check had, replayed as the report does (``report.data.tag_checks``) over the test's latest
    ``queries.WINDOW_HISTORY_RUNS`` runs up to this one, with the triage actions applied. ``alerts``: the run's
    alerts (asked for only when the run has windows); ``span``: the run's ``queries.run_span``."""
    windows = queries.windows_of_run(reader, test, run, span)
    if not windows:
        return []
    jobs = {run: job.row} if job else {}
    config = configs.for_test(test) if configs is not None else None
    if config is not None and job is not None and any(t in config.windows.tags for t in {w.tag for w in windows}):
        earlier = queries.runs_of_test(reader, test, 0, queries.WINDOW_HISTORY_RUNS, until=job.row.end)
        jobs.update({j.row.run: j.row for j in earlier})
        windows = queries.windows_of_runs(reader, test, sorted(jobs),
                                          queries.run_span([job, *earlier], queries.longest_time_window(configs)))
    runs = run_windows(windows, jobs)
    position = next(i for i, r in enumerate(runs) if r.run == run)
    actions = queries.triage_actions(reader, [test]) if config is not None else []
    specs, run_alerts = [], alerts()
    for key in sorted(runs[position].windows):
        checks = tag_checks(config, key, runs, actions) if config is not None else None
        for curve in run_curves(runs, position, key, run_alerts, checks):
            unit = config.metric_collection.unit_for(curve.tag) if config is not None else None
            specs.append(charts.curve_chart(dataclasses.replace(curve, unit=unit)))
    return specs


def alert_detail(reader: Reader, alert_id: str, sink: ActionSink,
                 configs: Optional[ConfigSet] = None) -> Optional[AlertDetail]:
    alert = queries.alert_by_id(reader, alert_id)
    if alert is None:
        return None
    stored = queries.triage_actions(reader, [alert.test])
    view = alert_views(reader, [alert], sink, stored)[0]
    how = [(k, _text(alert.details[k])) for k in HOW_COMPUTED if k in alert.details]
    actions = triage_history(reader, alert, sink, stored)
    jobs = queries.job_rows(reader, alert.test, alert.run)
    span = queries.run_span(jobs, queries.longest_time_window(configs))
    history = None
    at = jobs[0].row.end if jobs else alert.created_at
    if alert.metric and at is not None:
        series = queries.metric_history_around(reader, alert.test, alert.metric, at)
        if series:
            history = charts.history_chart(series, alert.unit, alert.run, triaged_runs(actions, alert.metric))
    curves = curves_of_run(reader, alert.test, alert.run, jobs[0] if jobs else None,
                           lambda: queries.alerts_of_runs(reader, alert.test, [alert.run], span=span), configs, span)
    return AlertDetail(view, how, history, curves, actions)


def status_grid(runs: List[queries.Job]) -> List[Tuple[str, Dict[str, int]]]:
    """Runs per day and status, the newest day first."""
    import time

    days: Dict[str, Dict[str, int]] = {}
    for job in runs:
        day = time.strftime("%Y-%m-%d", time.gmtime(job.row.end))
        days.setdefault(day, {})
        days[day][job.row.status] = days[day].get(job.row.status, 0) + 1
    return sorted(days.items(), reverse=True)


def test_detail(reader: Reader, name: str, page: int, configs: Optional[ConfigSet] = None) -> Optional[TestDetail]:
    """A chart per checked metric over the test's latest runs (units from ``configs``), the status grid of its
    last 30 days, its runs."""
    latest = queries.runs_of_test(reader, name, 0, TEST_CHART_RUNS)
    if not latest:
        return None
    recent = [j for j in latest if j.row.end >= latest[0].row.end - queries.GRID_DAYS * 86400]
    by_metric = queries.metrics_since(reader, name, latest[-1].row.end)
    actions = [(a, False) for a in queries.triage_actions(reader, [name])]
    units = configs.for_test(name).metric_collection.unit_for if configs is not None else (lambda metric: None)
    specs = [charts.history_chart(series, unit=units(metric), triaged=triaged_runs(actions, metric))
             for metric, series in sorted(by_metric.items()) if series.checked][:queries.METRICS_LIMIT]
    offset = (page - 1) * queries.RUNS_LIMIT
    runs = (latest[offset:offset + queries.RUNS_LIMIT + 1] if offset + queries.RUNS_LIMIT < TEST_CHART_RUNS
            else queries.runs_of_test(reader, name, offset, queries.RUNS_LIMIT + 1))  # the first pages: read already
    return TestDetail(name, specs, status_grid(recent), runs[:queries.RUNS_LIMIT], len(runs) > queries.RUNS_LIMIT)


def run_detail(reader: Reader, test: str, run: str, sink: ActionSink,
               configs: Optional[ConfigSet] = None) -> Optional[RunDetail]:
    jobs = queries.job_rows(reader, test, run)
    if not jobs:
        return None
    job, span = jobs[0], queries.run_span(jobs, queries.longest_time_window(configs))
    try:
        events = json.loads(job.events)
    except ValueError:
        events = []
    alerts = queries.alerts_of_runs(reader, test, [run], span=span)
    return RunDetail(job, events if isinstance(events, list) else [], queries.metrics_of_run(reader, test, run, span),
                     queries.ranks_of_run(reader, test, run, span),
                     curves_of_run(reader, test, run, job, lambda: alerts, configs, span), alert_views(reader, alerts, sink))


def state_names() -> List[str]:
    return [s.value for s in AlertState]
