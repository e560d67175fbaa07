"""The dashboard's reads: every query bounded by a key (test, run, metric, alert id) and a LIMIT, parameters bound.

Where a page knows *when* its rows were written, its queries also bound the table's time column, the column BigQuery
partitions the table by (``core.schema``), so that BigQuery reads only those days. DuckDB runs the same SQL, but
the look-backs and the alert's first look-up only on a ``Reader.partitioned`` source (BigQuery):

- the alert list, newest first, reads the last ``LOOK_BACK_DAYS``, and the whole table only when those hold fewer
  alerts than the page needs (:func:`alerts_newest_first`);
- an alert named by its id is found by its id and time first, two narrow columns, and then read whole from its
  day (:func:`alert_by_id`);
- a run's rows (its metrics, ranks, windows and alerts) are read within :func:`run_span` of its ``job_history``
  rows: all of them are written between its start and its finalization, window ends up to the longest time window
  later (see :func:`run_span` for the margins);
- an alert's history chart reads ``HISTORY_DAYS_BEFORE`` days before its run's end and ``HISTORY_DAYS_AFTER``
  after (:func:`metric_history_around`).

Each function takes an open :class:`dashboard.store.Reader` and returns records; times are float seconds since
the epoch. Alert rows become ``core.alert_record.AlertRecord`` and job, metric and window rows the report's
records (``report.source.JobRow``/``MetricRow``, ``core.windows.WindowResult``), so the dashboard and the static
report share one read model.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from core.alert_record import AlertRecord, alert_from_row
from core.config import ConfigSet
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, RANK_METRICS, TRIAGE, Table
from core.triage import AlertFacts, TriageItem
from core.vocabulary import AlertKind, RunStatus
from core.window_checks import WINDOW_ROW_COLUMNS, window_from_row
from core.windows import WindowResult
from dashboard.store import Reader, in_list
from report.source import JobRow, MetricRow

HISTORY_LIMIT = 500      # points of a metric's history chart (the newest)
RUNS_LIMIT = 50          # runs per page of a test
METRICS_LIMIT = 60       # charts of a test page
WINDOWS_LIMIT = 50_000   # windows of the runs a run's curves are checked against
WINDOW_HISTORY_RUNS = 30  # runs up to a run whose windows replay its live checks' bounds
DEAD_LETTERS_LIMIT = 50  # payloads per page
GRID_DAYS = 30
DAY = 86400.0
LOOK_BACK_DAYS = (30, 365)  # a partitioned source's alert list: these look-backs before every day
RUN_MARGIN = DAY           # around a run's times: clock skew between the workers, a drain's re-finalization
HISTORY_DAYS_BEFORE = 90   # an alert's history chart: days before its run's end ...
HISTORY_DAYS_AFTER = 30    # ... and after it
HISTORY_AFTER_LIMIT = 100  # of the chart's HISTORY_LIMIT points, at most this many after the alert's run
RUN_LOOKUPS = 4            # runs read one by one through the local store's index (more: one condition, a scan)

_ALERT_NAMES = ("alert_id", "kind", "test_name", "run_id", "metric_name", "value", "lower_bound", "upper_bound",
                "message", "created_at", "details")


@dataclasses.dataclass(frozen=True)
class AlertFilter:
    """What the alerts page shows: every field optional (None/empty: any)."""
    state: Optional[str] = None
    test: Optional[str] = None
    kind: Optional[str] = None
    since: Optional[float] = None  # created_at >= since
    until: Optional[float] = None  # created_at < until


@dataclasses.dataclass(frozen=True)
class Job:
    """One run's ``job_history`` row, with what the run page shows."""
    row: JobRow
    num_failures: Optional[int]
    duration: Optional[float]
    events: str  # JSON


@dataclasses.dataclass(frozen=True)
class Point:
    """One value of a metric's history, with the bounds it was checked against and the step it was taken at."""
    row: MetricRow
    step: Optional[int]


@dataclasses.dataclass(frozen=True)
class Series:
    """A metric's history as columns, one entry per run, oldest first (what a chart draws: a test page draws tens of
    thousands of values, so no record per value)."""
    metric: str
    runs: Tuple[str, ...]
    times: Tuple[float, ...]
    values: Tuple[float, ...]
    lower: Tuple[Optional[float], ...]
    upper: Tuple[Optional[float], ...]
    within: Tuple[Optional[bool], ...]  # None: not checked
    steps: Tuple[Optional[int], ...]

    @property
    def checked(self) -> bool:
        return any(w is not None for w in self.within)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    dead_letter_id: str
    received_at: Optional[float]
    reason: str
    source: str
    payload: str


@dataclasses.dataclass(frozen=True)
class Span:
    """A range of a table's time (partition) column, epoch seconds, both ends included; None: open."""
    lo: Optional[float] = None
    hi: Optional[float] = None

    def sql(self, reader: Reader, column: str, params: Dict[str, Any], name: str = "span") -> str:
        """`` AND column >= lo AND column <= hi`` (the ends that are set), their values put in ``params``."""
        q, where = reader.dialect.quote, ""
        for end, op, value in (("lo", ">=", self.lo), ("hi", "<=", self.hi)):
            if value is not None:
                where += f" AND {q(column)} {op} {reader.from_epoch(f'${name}_{end}')}"
                params[f"{name}_{end}"] = float(value)
        return where


def _q(reader: Reader, *names: str) -> str:
    return ", ".join(reader.dialect.quote(n) for n in names)


def _of_runs(reader: Reader, table: Table, runs: Sequence[str], params: Dict[str, Any]) -> Tuple[str, str]:
    """What a read of a few runs' rows of ``table`` reads from, and its condition on the run (its values put in
    ``params``): ``FROM {source} WHERE {condition} AND ...``.

    The local store indexes ``run_id`` (``Reader.runs_indexed``), but DuckDB uses the index only for a condition
    on that column alone: so there each of up to ``RUN_LOOKUPS`` runs is read on its own (``OFFSET 0`` keeps the
    optimizer from adding the query's other conditions to it, which would make it a scan), and the query's
    conditions apply to those rows. Elsewhere, and for more runs: one ``IN`` beside the other conditions."""
    q = reader.dialect.quote
    runs_in, names = in_list("run", list(runs))
    params.update(names)
    if reader.runs_indexed and "run_id" in table.looked_up_by and 0 < len(names) <= RUN_LOOKUPS:
        each = " UNION ALL ".join(f"(SELECT * FROM {reader.dialect.table(table)} WHERE {q('run_id')} = ${n} OFFSET 0)"
                                  for n in names)
        return f"({each}) AS {q(table.name)}", "TRUE"
    return reader.dialect.table(table), f"{q('run_id')} IN {runs_in}"


def _alert_select(reader: Reader, source: Optional[str] = None) -> str:
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    return (f"SELECT {_q(reader, *_ALERT_NAMES[:9])}, {epoch(q('created_at'))}, {q('details')} "
            f"FROM {source or reader.dialect.table(ALERTS)}")


def _alerts(rows: Sequence[tuple]) -> List[AlertRecord]:
    """Alerts from rows, each id once (BigQuery has no keys: a row written twice is there twice)."""
    seen, alerts = set(), []
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            alerts.append(alert_from_row(dict(zip(_ALERT_NAMES, row))))
    return alerts


def alert_conditions(reader: Reader, f: AlertFilter) -> Tuple[str, Dict[str, Any]]:
    """The WHERE clause of the filter's SQL part (all but the state, which follows from the triage actions)."""
    q = reader.dialect.quote
    where: List[str] = ["TRUE"]
    params: Dict[str, Any] = {}
    if f.test:
        where.append(f"{q('test_name')} = $test")
        params["test"] = f.test
    if f.kind:
        where.append(f"{q('kind')} = $kind")
        params["kind"] = f.kind
    if f.since is not None:
        where.append(f"{q('created_at')} >= {reader.from_epoch('$since')}")
        params["since"] = float(f.since)
    if f.until is not None:
        where.append(f"{q('created_at')} < {reader.from_epoch('$until')}")
        params["until"] = float(f.until)
    return " AND ".join(where), params


def alerts_newest_first(reader: Reader, f: AlertFilter, offset: int, limit: int,
                        now: Optional[float] = None) -> List[AlertRecord]:
    """At most ``limit`` alerts matching the filter's SQL part, newest first, after skipping ``offset``.

    On a partitioned source, read from the first of ``LOOK_BACK_DAYS`` before ``now`` (a filter's own ``since``
    when later), then from the wider ones, and from every day only when those hold fewer than ``offset + limit``
    alerts: the alerts from a day on are the newest ones, so when a look-back holds the page, the page is the same
    as the whole table's."""
    q = reader.dialect.quote
    now = time.time() if now is None else now
    for days in (*(LOOK_BACK_DAYS if reader.partitioned else ()), math.inf):
        start = now - days * DAY
        last = f.since is not None and f.since >= start or days == math.inf
        if not last and f.until is not None and f.until <= start:
            continue  # nothing of the filter's range is that recent
        where, params = alert_conditions(reader, f if last else dataclasses.replace(f, since=start))
        rows = reader.query(f"{_alert_select(reader)} WHERE {where} ORDER BY {q('created_at')} DESC, "
                            f"{q('alert_id')} DESC LIMIT {int(limit)} OFFSET {int(offset)}", params)
        if last or len(rows) >= limit:
            return _alerts(rows)
    raise AssertionError("unreachable: the last look-back is every day")


def alert_by_id(reader: Reader, alert_id: str) -> Optional[AlertRecord]:
    """The alert of an id; on a partitioned source its time is looked up first (the id's and the time's columns of
    every day), then the alert read whole from within a second of that time (its day)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"id": alert_id}
    where = f"{q('alert_id')} = $id"
    if reader.partitioned:
        found = reader.query(f"SELECT {reader.dialect.epoch_seconds(q('created_at'))} FROM "
                             f"{reader.dialect.table(ALERTS)} WHERE {where} LIMIT 1", params)
        if not found:
            return None
        if found[0][0] is not None:
            where += Span(found[0][0] - 1, found[0][0] + 1).sql(reader, "created_at", params)
    rows = reader.query(f"{_alert_select(reader)} WHERE {where} LIMIT 1", params)
    return _alerts(rows)[0] if rows else None


def alerts_of_runs(reader: Reader, test: str, runs: Sequence[str], limit: int = 1000,
                   span: Span = Span()) -> List[AlertRecord]:
    """The alerts of a few runs of one test (a run's page; the start of an accepted run), raised within ``span``
    (the runs' :func:`run_span`)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test}
    source, of_runs = _of_runs(reader, ALERTS, runs, params)
    within = span.sql(reader, "created_at", params)
    rows = reader.query(f"{_alert_select(reader, source)} WHERE {q('test_name')} = $test AND {of_runs}"
                        f"{within} ORDER BY {q('created_at')}, {q('alert_id')} LIMIT {int(limit)}", params)
    return _alerts(rows)


def alert_kinds(chosen: Optional[str] = None) -> List[str]:
    """The kinds the alert list filters by: every kind the pipeline raises (and one chosen that it no longer does)."""
    kinds = [k.value for k in AlertKind]
    return kinds + [chosen] if chosen and chosen not in kinds else kinds


def triage_actions(reader: Reader, tests: Sequence[str]) -> List[TriageItem]:
    """The stored triage actions of a few tests, in event-time order (the table holds people's actions: few)."""
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    names = ("action_id", "action", "test_name", "metric_name", "run_id", "alert_id", "alert_kind", "alert_instance",
             "note", "author")
    tests_in, params = in_list("test", sorted(set(tests)))
    try:
        rows = reader.query(f"SELECT {_q(reader, *names)}, {epoch(q('until'))}, {epoch(q('created_at'))} "
                            f"FROM {reader.dialect.table(TRIAGE)} WHERE {q('test_name')} IN {tests_in} "
                            f"ORDER BY {q('created_at')} LIMIT 10000", params)
    except Exception:  # noqa: BLE001 - a store written before triage existed has no triage table
        return []
    actions = {}
    for row in rows:
        item = TriageItem.from_row({**dict(zip(names, row)), "until": row[-2], "created_at": row[-1]})
        actions[item.id] = item
    return sorted(actions.values(), key=lambda a: a.order)


def accepted_run_facts(reader: Reader, actions: Sequence[TriageItem]) -> List[AlertFacts]:
    """The alerts of the runs accept actions name: where each accept starts covering (``core.triage``)."""
    facts = []
    by_test: Dict[str, List[str]] = {}
    for a in actions:
        if a.action == "accept" and a.run:
            by_test.setdefault(a.test, []).append(a.run)
    for test, runs in by_test.items():
        facts += [a.facts() for a in alerts_of_runs(reader, test, sorted(set(runs))[:50])]
    return facts


def tests(reader: Reader, limit: int = 500) -> List[Tuple[str, int, float]]:
    """(test, runs, last run end) of every test, the most recently active first."""
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    return [tuple(r) for r in reader.query(
        f"SELECT {q('test_name')}, COUNT(*), {epoch('MAX(' + q('timestamp') + ')')} "
        f"FROM {reader.dialect.table(JOB_HISTORY)} GROUP BY {q('test_name')} ORDER BY 3 DESC LIMIT {int(limit)}")]


def _job_select(reader: Reader, source: Optional[str] = None) -> str:
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    return (f"SELECT {_q(reader, 'test_name', 'run_id', 'job_status')}, {epoch(q('timestamp'))}, "
            f"{epoch(q('processed_at'))}, {epoch(q('start_time'))}, {_q(reader, 'num_failures', 'job_duration_sec')}, "
            f"{q('events')} FROM {source or reader.dialect.table(JOB_HISTORY)}")


def _first_per(rows: Sequence[tuple], key: Callable[[tuple], Any]) -> List[tuple]:
    """The first row of each key, in order (a run's newest row: a re-run writes another)."""
    first: Dict[Any, tuple] = {}
    for row in rows:
        first.setdefault(key(row), row)
    return list(first.values())


def _jobs(rows: Sequence[tuple]) -> List[Job]:
    return [Job(JobRow(*row[:6]), row[6], row[7], row[8] or "[]") for row in _first_per(rows, lambda r: r[1])]


def runs_of_test(reader: Reader, test: str, offset: int = 0, limit: int = RUNS_LIMIT,
                 since: Optional[float] = None, until: Optional[float] = None) -> List[Job]:
    """A test's ended runs, newest first (only those that ended from ``since`` on, and up to ``until``)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test}
    when = ""
    if since is not None:
        when = f" AND {q('timestamp')} >= {reader.from_epoch('$since')}"
        params["since"] = float(since)
    if until is not None:
        when += f" AND {q('timestamp')} <= {reader.from_epoch('$until')}"
        params["until"] = float(until)
    return _jobs(reader.query(
        f"{_job_select(reader)} WHERE {q('test_name')} = $test AND {q('job_status')} != "
        f"'{RunStatus.INTERRUPTED.value}'{when} ORDER BY {q('timestamp')} DESC, {q('run_id')} DESC "
        f"LIMIT {int(limit)} OFFSET {int(offset)}", params))


def job_rows(reader: Reader, test: str, run: str) -> List[Job]:
    """Every ``job_history`` row of a run, the newest first (a run interrupted by a drain, or re-run, has several)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test}
    source, of_run = _of_runs(reader, JOB_HISTORY, [run], params)
    rows = reader.query(f"{_job_select(reader, source)} WHERE {q('test_name')} = $test AND {of_run} "
                        f"ORDER BY {q('processed_at')} DESC LIMIT 20", params)
    return [Job(JobRow(*row[:6]), row[6], row[7], row[8] or "[]") for row in rows]


def job(reader: Reader, test: str, run: str) -> Optional[Job]:
    jobs = job_rows(reader, test, run)
    return jobs[0] if jobs else None


def longest_time_window(configs: Optional[ConfigSet]) -> Optional[float]:
    """The longest time window (seconds) of the configs, 0 without one; None when the configs are not known."""
    if configs is None:
        return None
    tags = [t for c in (configs.default, *configs.by_test.values()) for t in c.windows.tags.values()]
    return max([t.spec.time_seconds or 0.0 for t in tags], default=0.0)


def run_span(jobs: Sequence[Job], longest_window: Optional[float]) -> Span:
    """When the rows of these runs were written, for the time (partition) column of each table:

    - ``metric_history`` and ``rank_metrics``: the run's end (``job_history.timestamp``);
    - ``alerts``: from the run's start (a live window check, a stall) to its finalization (``processed_at``: the
      run-level checks), a window's alert at the window's end;
    - ``metric_windows``: a window's end, after the run's start, and at most the longest time window after the
      run's last point (a time window ends at its bound; the others at their last point).

    So from the earliest start (or end) to the latest finalization plus ``longest_window``, each widened by
    ``RUN_MARGIN`` (clock skew between a run's workers). With ``longest_window`` None (no configs: window lengths
    unknown) the span is open at its end.
    """
    if not jobs:
        return Span()
    lo = min(j.row.start if j.row.start is not None else j.row.end for j in jobs) - RUN_MARGIN
    if longest_window is None:
        return Span(lo)
    return Span(lo, max(max(j.row.end, j.row.finalized) for j in jobs) + longest_window + RUN_MARGIN)


def _metric_select(reader: Reader, source: Optional[str] = None) -> str:
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    return (f"SELECT {_q(reader, 'test_name', 'run_id', 'metric_name', 'metric_value', 'metric_lower_bound')}, "
            f"{_q(reader, 'metric_upper_bound', 'within_bounds')}, {epoch(q('timestamp'))}, {q('step')} "
            f"FROM {source or reader.dialect.table(METRIC_HISTORY)}")


def _points(rows: Sequence[tuple]) -> List[Point]:
    return [Point(MetricRow(*row[:8]), row[8]) for row in _first_per(rows, lambda r: (r[1], r[2]))]


def _series(rows: Sequence[tuple]) -> Dict[str, Series]:
    """``_metric_select`` rows, oldest first, as a :class:`Series` per metric (each run's first row)."""
    by_metric: Dict[str, List[tuple]] = {}
    for row in _first_per(rows, lambda r: (r[1], r[2])):
        by_metric.setdefault(row[2], []).append(row)
    series = {}
    for metric, metric_rows in by_metric.items():
        _, runs, _, values, lower, upper, within, times, steps = zip(*metric_rows)
        series[metric] = Series(metric, runs, times, values, lower, upper, within, steps)
    return series


def metric_history_around(reader: Reader, test: str, metric: str, at: float) -> Optional[Series]:
    """One metric of a test around a run that ended at ``at``, oldest first: the newest
    ``HISTORY_LIMIT - HISTORY_AFTER_LIMIT`` values of the ``HISTORY_DAYS_BEFORE`` days up to ``at`` (that run's
    included) and the oldest ``HISTORY_AFTER_LIMIT`` of the ``HISTORY_DAYS_AFTER`` days after. Each value carries
    the bounds it was checked against, so the chart shows the alert's bounds whatever history the check had."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test, "metric": metric}
    where = f"{_metric_select(reader)} WHERE {q('test_name')} = $test AND {q('metric_name')} = $metric"
    before = Span(at - HISTORY_DAYS_BEFORE * DAY, at).sql(reader, "timestamp", params, "before")
    after = Span(at, at + HISTORY_DAYS_AFTER * DAY).sql(reader, "timestamp", params, "after")
    rows = reader.query(
        f"({where}{before} ORDER BY {q('timestamp')} DESC, {q('run_id')} DESC "
        f"LIMIT {HISTORY_LIMIT - HISTORY_AFTER_LIMIT}) UNION ALL "
        f"({where}{after} AND {q('timestamp')} > {reader.from_epoch('$at')} "
        f"ORDER BY {q('timestamp')}, {q('run_id')} LIMIT {HISTORY_AFTER_LIMIT})", {**params, "at": float(at)})
    newest_first = _first_per(sorted(rows, key=lambda r: (r[7], r[1]), reverse=True), lambda r: r[1])
    return _series(newest_first[::-1]).get(metric)


def metrics_of_test(reader: Reader, test: str, limit: int = METRICS_LIMIT) -> List[str]:
    """The test's metric names, checked ones first, read from its latest runs only."""
    q = reader.dialect.quote
    rows = reader.query(
        f"SELECT {q('metric_name')}, MAX(CASE WHEN {q('within_bounds')} IS NULL THEN 0 ELSE 1 END) "
        f"FROM (SELECT {_q(reader, 'metric_name', 'within_bounds')} FROM {reader.dialect.table(METRIC_HISTORY)} "
        f"WHERE {q('test_name')} = $test ORDER BY {q('timestamp')} DESC LIMIT 5000) latest "
        f"GROUP BY {q('metric_name')} ORDER BY 2 DESC, 1 LIMIT {int(limit)}", {"test": test})
    return [r[0] for r in rows]


def metrics_of_run(reader: Reader, test: str, run: str, span: Span = Span()) -> List[Point]:
    """The run's metric values (written within ``span``, its :func:`run_span`)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test}
    source, of_run = _of_runs(reader, METRIC_HISTORY, [run], params)
    within = span.sql(reader, "timestamp", params)
    return _points(reader.query(f"{_metric_select(reader, source)} WHERE {q('test_name')} = $test AND {of_run}"
                                f"{within} ORDER BY {q('metric_name')} LIMIT 2000", params))


def ranks_of_run(reader: Reader, test: str, run: str,
                 span: Span = Span()) -> List[Tuple[str, int, float, Optional[int]]]:
    """(metric, rank, value, step) of a distributed run's workers (written within ``span``)."""
    q = reader.dialect.quote
    params: Dict[str, Any] = {"test": test}
    source, of_run = _of_runs(reader, RANK_METRICS, [run], params)
    within = span.sql(reader, "timestamp", params)
    return [tuple(r) for r in reader.query(
        f"SELECT {_q(reader, 'metric_name', 'rank', 'metric_value', 'step')} FROM {source} "
        f"WHERE {q('test_name')} = $test AND {of_run}{within} ORDER BY 1, 2 LIMIT 5000", params)]


def windows_of_run(reader: Reader, test: str, run: str, span: Span = Span()) -> List[WindowResult]:
    """The run's windows, each at its highest revision."""
    return windows_of_runs(reader, test, [run], span)


def windows_of_runs(reader: Reader, test: str, runs: Sequence[str], span: Span = Span()) -> List[WindowResult]:
    """The windows of a few runs of a test, each at its highest revision (windows that end within ``span``: the
    runs' :func:`run_span`)."""
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    runs_in, params = in_list("run", list(runs))
    params["test"] = test
    within = span.sql(reader, "end_time", params)
    key = ("run_id", "tag", "window_kind", "window_index")
    rows = reader.query(
        f"SELECT {_q(reader, 'test_name', *key)}, {epoch(q('start_time'))}, {epoch(q('end_time'))}, "
        f"{_q(reader, *WINDOW_ROW_COLUMNS)}, {q('revision')} "
        f"FROM {reader.dialect.table(METRIC_WINDOWS)} WHERE {q('test_name')} = $test AND {q('run_id')} IN {runs_in}"
        f"{within} ORDER BY {_q(reader, *key)}, {q('revision')} DESC LIMIT {WINDOWS_LIMIT}", params)
    latest: Dict[tuple, WindowResult] = {}
    for row in rows:
        if tuple(row[1:5]) not in latest:
            latest[tuple(row[1:5])] = window_from_row(row[:-1])  # the revision last
    return list(latest.values())


def dead_letter_counts(reader: Reader) -> List[Tuple[str, str, int, Optional[float]]]:
    """(reason, source, count, latest) per reason, the most frequent first."""
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    return [tuple(r) for r in reader.query(
        f"SELECT {_q(reader, 'reason', 'source')}, COUNT(*), {epoch('MAX(' + q('received_at') + ')')} "
        f"FROM {reader.dialect.table(DEAD_LETTER)} GROUP BY 1, 2 ORDER BY 3 DESC, 1 LIMIT 200")]


def dead_letters(reader: Reader, reason: Optional[str], offset: int = 0,
                 limit: int = DEAD_LETTERS_LIMIT) -> List[DeadLetter]:
    """Dead letters (of one reason), newest first; payloads cut to 4,000 characters here (the viewer reads one)."""
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    where, params = ("TRUE", {}) if not reason else (f"{q('reason')} = $reason", {"reason": reason})
    rows = reader.query(
        f"SELECT {q('dead_letter_id')}, {epoch(q('received_at'))}, {_q(reader, 'reason', 'source')}, "
        f"SUBSTR({q('payload')}, 1, 4000) FROM {reader.dialect.table(DEAD_LETTER)} WHERE {where} "
        f"ORDER BY {q('received_at')} DESC, 1 LIMIT {int(limit)} OFFSET {int(offset)}", params)
    return [DeadLetter(*r) for r in rows]


def dead_letter(reader: Reader, dead_letter_id: str) -> Optional[DeadLetter]:
    q, epoch = reader.dialect.quote, reader.dialect.epoch_seconds
    rows = reader.query(
        f"SELECT {q('dead_letter_id')}, {epoch(q('received_at'))}, {_q(reader, 'reason', 'source', 'payload')} "
        f"FROM {reader.dialect.table(DEAD_LETTER)} WHERE {q('dead_letter_id')} = $id LIMIT 1", {"id": dead_letter_id})
    return DeadLetter(*rows[0]) if rows else None


def metrics_since(reader: Reader, test: str, since: float, limit: int = 50_000) -> Dict[str, Series]:
    """Every metric value of a test's runs that ended from ``since`` on (its latest runs: one scan for a test page)."""
    q = reader.dialect.quote
    rows = reader.query(f"{_metric_select(reader)} WHERE {q('test_name')} = $test AND "
                        f"{q('timestamp')} >= {reader.from_epoch('$since')} "
                        f"ORDER BY {q('timestamp')}, {q('run_id')} LIMIT {int(limit)}", {"test": test, "since": since})
    return _series(rows)
