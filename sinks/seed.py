"""The start-up ``HistorySeed``, read back from a store's tables: one definition for every store.

A new invocation of the pipeline (a replay, a restarted streaming job)
continues the history of earlier ones by seeding its keyed state from what
they wrote. The queries and the rows -> seed step live here, once; a store
only says how to run SQL and how its dialect spells three things (identifier
quoting, table names, seconds since the epoch). ``DuckDBStore`` and
``BigQueryStore`` both call :func:`read_history_seed`, so a DuckDB file and a
BigQuery dataset holding the same rows give the same seed. The row readers
(:func:`read_job_rows`, :func:`read_metric_rows`, :func:`read_latest_windows`)
are shared with the backtest (``sinks/stored_history.py``), and read one row
per key (:func:`one_per_key`): BigQuery keeps a row inserted twice twice.
A run a drained streaming job stored as ``interrupted`` is not a stored run
here: its open state comes back in ``HistorySeed.open_runs``
(:func:`read_open_runs`) until a job ends it. The queries are independent and
may run at once, each within a time bound (:func:`read_history_seed`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import json
import logging
import time
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    FrozenSet,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    cast,
)

from core import encoding
from core.config import ConfigSet
from core.history import HistorySeed, history_policy, seed_job_history, seed_metric_history
from core.records import iso_utc
from core.registry import EncodingError
from core.runs import RunAccumulator, open_run_text
from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, TRIAGE, Table
from core.seed_scope import KeyScope, Names, SeedScope, seed_scope
from core.triage import MAX_RECENT_ALERTS, AlertLedger, TriageItem
from core.vocabulary import RunStatus, TriageAction
from core.window_checks import (
    WINDOW_ROW_COLUMNS,
    reaches_run_level_history,
    seed_window_history,
    window_from_row,
    window_triage_targets,
)
from core.windows import WindowResult
from trainguard.cli import error_line


def standard_string(text: str) -> str:
    """``text`` as a standard SQL string literal (a quote doubled; DuckDB's form)."""
    return "'" + text.replace("'", "''") + "'"


def backslash_string(text: str) -> str:
    """``text`` as a BigQuery string literal (backslash escapes; no raw line breaks)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


@dataclasses.dataclass(frozen=True)
class SqlDialect:
    """How one SQL engine spells what the seed queries need."""
    quote: Callable[[str], str]          # a column name -> a quoted identifier
    table: Callable[[Table], str]        # a table -> its (quoted, qualified) name
    epoch_seconds: Callable[[str], str]  # a TIMESTAMP expression -> FLOAT seconds since the epoch
    string: Callable[[str], str] = standard_string  # a text -> a string literal


Query = Callable[[str], Sequence[Sequence]]  # SQL -> rows (tuples in SELECT order)


_LOGGER = logging.getLogger(__name__)
SEED_TIMEOUT_SECONDS = 300.0  # the streaming job's bound on each query of its seed, retries included
SEED_ATTEMPTS = 3  # how many times the streaming job's seed step reads the seed before it stops the job
SEED_RETRY_WAIT_SECONDS = 60.0  # its wait after a failed attempt, doubled after each


class SeedReadError(RuntimeError):
    """A query of the start-up seed failed, or did not answer in time; the message names its table and the cause."""


def _query_failed(name: str, error: BaseException) -> SeedReadError:
    return SeedReadError(f"cannot read the history seed: the query of {name} failed: "
                         f"{type(error).__name__}: {error_line(error)}")


def _read_all(reads: Sequence[Tuple[str, Callable[[], Any]]], workers: int, timeout_seconds: Optional[float]
              ) -> List[Any]:
    """Each read's result, in order; the reads run at once on ``workers`` threads (1: one after the other, here),
    each bounded by ``timeout_seconds`` from the start (None: unbounded). The first read to fail, or the first
    one still running at the bound, raises ``SeedReadError`` naming it."""
    if workers <= 1 and timeout_seconds is None:
        results = []
        for name, read in reads:
            try:
                results.append(read())
            except Exception as error:  # re-raised as one line naming the table
                raise _query_failed(name, error) from error
        return results
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="trainguard-seed")
    try:
        futures = [(name, pool.submit(read)) for name, read in reads]
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        pending = {future for _, future in futures}
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = concurrent.futures.wait(pending, timeout=remaining,
                                                    return_when=concurrent.futures.FIRST_EXCEPTION)
            for name, future in futures:
                failure = future.exception() if future in done else None
                if failure is not None:
                    raise _query_failed(name, failure) from failure
            if pending and deadline is not None and time.monotonic() >= deadline:
                name = next(name for name, future in futures if future in pending)
                raise SeedReadError(f"cannot read the history seed: the query of {name} did not answer within "
                                    f"{timeout_seconds:g} s (--seed_timeout_seconds)")
        return [future.result() for _, future in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a read still hanging ends with its own request timeout


MAX_NAMED_TESTS = 10_000  # more tests than this are not named in a query: its text stays far below BigQuery's 1 MB


def test_in(sql: SqlDialect, tests: Collection[str]) -> str:
    """A condition true for the rows of ``tests`` (their ``test_name``)."""
    return f"{sql.quote('test_name')} IN ({', '.join(map(sql.string, sorted(tests))) or 'NULL'})"


def tests_only(sql: SqlDialect, tests: Collection[str]) -> SqlDialect:
    """``sql`` whose every table holds only the rows of ``tests`` (each seed table has a ``test_name``)."""
    condition = test_in(sql, tests)
    return dataclasses.replace(sql, table=lambda table: f"(SELECT * FROM {sql.table(table)} WHERE {condition})")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused, and then as it was: a seed is up to millions of objects that live on,
    with no cycles among them, and the collector's passes over them while they were made took 40% of reading the
    seed of 200,000 tests (14.5 → 8.6 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_history_seed(configs: ConfigSet, query: Query, sql: SqlDialect, workers: int = 1,
                      timeout_seconds: Optional[float] = None, scoped: bool = True,
                      stored_since: Optional[float] = None, tests: Optional[Collection[str]] = None) -> HistorySeed:
    """The history state that earlier invocations left behind in a store's tables.

    ``stored_since`` (the streaming job's): ``stored_runs`` keeps only the runs that ended at or after it, and
    every back-fill (:func:`recent_stored_runs`); None (a replay, which reads history): every stored run.

    ``scoped``: the metric and window queries read only the keys ``configs``' checks compare and only as many of
    each key's latest runs as rebuild its history (``core.seed_scope``); without it, every stored row (what the
    seed read before, kept for ``bench/bench_seed.py``'s comparison; both give the same checks).

    The tables' queries do not depend on each other: with ``workers`` > 1 they run at once (a BigQuery dataset
    answers each in its own time). ``timeout_seconds`` bounds each of them, counted from the start (with fewer
    workers than queries, that bounds them all together); a query that fails or does not answer in time raises
    ``SeedReadError`` naming its table, with the cause.

    ``tests`` (a replay's: the tests its input names): only theirs, and those of the runs a drain left open (all
    of these, as the whole seed has them), which is the whole seed's ``of_tests`` of them but for
    ``stored_actions``, which then holds the ids of their actions only.
    """
    with collector_paused():
        return _read_history_seed(configs, query, sql, workers, timeout_seconds, scoped, stored_since, tests)


def _read_history_seed(configs: ConfigSet, query: Query, sql: SqlDialect, workers: int,
                       timeout_seconds: Optional[float], scoped: bool, stored_since: Optional[float],
                       tests: Optional[Collection[str]]) -> HistorySeed:
    scope = seed_scope(configs) if scoped else SeedScope(None, None)
    rows_of, read_open = sql, functools.partial(read_open_runs, query, sql)
    if tests is not None:
        every_open_run = read_open()
        rows_of = tests_only(sql, {*tests, *(test for test, _ in every_open_run)})
        read_open = functools.partial(dict, every_open_run)
    actions, jobs, metric_rows, windows, alerts, open_runs = _read_all([
        (_name(sql, TRIAGE), lambda: read_triage_actions(query, rows_of)),
        (_name(sql, JOB_HISTORY), lambda: read_job_rows(query, rows_of)),
        (_name(sql, METRIC_HISTORY), lambda: _unless_empty(scope.metrics, lambda: read_metric_rows(
            query, rows_of, scope.metrics))),
        (_name(sql, METRIC_WINDOWS), lambda: _unless_empty(scope.windows, lambda: read_latest_windows(
            query, rows_of, successful_only=True, scope=scope.windows))),
        (_name(sql, ALERTS), lambda: read_alert_rows(query, rows_of, MAX_RECENT_ALERTS)),
        (f"{_name(sql, JOB_HISTORY)} (interrupted runs)", read_open),
    ], workers, timeout_seconds)
    ended = frozenset((job.test, job.run) for job in jobs)
    runs_by_test = collections.defaultdict(list)
    for job in jobs:
        runs_by_test[job.test].append((job.finalized_at, job.run, job.status))
    rows_by_metric = collections.defaultdict(list)
    for m in metric_rows:
        rows_by_metric[(m.test, m.metric)].append((m.finalized_at, m.run, m.value, m.within, m.status,
                                                   m.lower, m.upper, m.segment))
    metric_actions = collections.defaultdict(list)
    for action in actions:
        key = (action.test, action.metric)
        # A scoped read left a run out only when an action on it no longer changes the history (core.seed_scope);
        # an accept of a run still to come (not ended) waits for it.
        if reaches_run_level_history(action, configs.for_test(action.test).windows) and (
                scope.metrics is None or (action.future and (action.test, action.run) not in ended)
                or any(row[1] == action.run for row in rows_by_metric.get(key, ()))):
            metric_actions[key].append(action)
    return HistorySeed(
        windows=_window_seed(configs, windows, actions),
        metrics={key: seed_metric_history(
            rows_by_metric.get(key, ()), history_policy(configs.for_test(key[0]).regression_test, key[1]),
            metric_actions.get(key, ()))
                 for key in set(rows_by_metric) | set(metric_actions)},
        jobs={test: seed_job_history(rows) for test, rows in runs_by_test.items()},
        stored_runs=ended if stored_since is None else recent_stored_runs(jobs, stored_since),
        stored_actions=frozenset(action.id for action in actions),
        ledgers=_ledgers(alerts, actions),
        open_runs={key: run for key, run in open_runs.items() if key not in ended})


def recent_stored_runs(jobs: Sequence[JobRow], since: float) -> FrozenSet[Tuple[str, str]]:
    """The stored runs a streaming job must still recognise: those that ended at or after ``since``, and every
    back-fill.

    The index of stored runs is a side input held whole by every worker, so it must not grow with the years.
    A job forgets a run of its own ``--finalized_run_retention_seconds`` after it ended (its tombstone expires:
    a message of it then starts a new run of that id); the index does the same for runs of earlier jobs, with
    the run timeout as a margin, so its size follows the runs of the last week, not all runs ever stored. A
    back-fill's row has its old event time in ``processed_at`` and does not say when it was stored, so
    back-fills are all kept: a shipper that resends an old log whole is told the run is stored, however long
    ago that was.
    """
    return frozenset((job.test, job.run) for job in jobs if job.finalized_at >= since or job.out_of_order)


def _unless_empty(scope: Optional[KeyScope], read: Callable[[], List[Any]]) -> List[Any]:
    """``read()``, or nothing when ``scope`` names no key (no query: the store is not asked)."""
    return [] if scope is not None and scope.empty else read()


def _name(sql: SqlDialect, table: Table) -> str:
    """A table as its store names it (``project.dataset.table`` for BigQuery), for messages."""
    return sql.table(table).strip('`"')


def read_triage_actions(query: Query, sql: SqlDialect) -> List[TriageItem]:
    """Every stored triage action, in event-time order."""
    q, epoch = sql.quote, sql.epoch_seconds
    names = ("action_id", "action", "test_name", "metric_name", "run_id", "alert_id", "alert_kind",
             "alert_instance", "note", "author", "future")
    rows = query(f"SELECT {', '.join(q(n) for n in names)}, {epoch(q('until'))}, {epoch(q('created_at'))} "
                 f"FROM {sql.table(TRIAGE)}")
    actions = [TriageItem.from_row({**dict(zip(names, row)), "until": row[-2], "created_at": row[-1]})
               for row in rows]
    return sorted(actions, key=lambda action: action.order)


class JobRow(NamedTuple):
    """One ``job_history`` row; the columns after ``out_of_order`` only ``with_details``."""
    test: str
    run: str
    status: str
    finalized_at: float  # processed_at, epoch seconds
    out_of_order: Optional[bool] = None  # a back-fill (NULL in rows older than the column: not one)
    num_failures: Optional[int] = None
    start_time: Optional[float] = None
    end_time: Optional[float] = None
    events: Optional[str] = None  # JSON


class MetricRow(NamedTuple):
    """One ``metric_history`` row joined to its run's ``job_history`` row."""
    test: str
    metric: str
    run: str
    finalized_at: float
    value: float
    within: Optional[bool]
    status: str
    step: Optional[int]
    lower: Optional[float] = None
    upper: Optional[float] = None
    segment: Optional[str] = None  # history_segment


def one_per_key(sql: SqlDialect, table: Table, columns: Sequence[str], latest: Optional[str] = None,
                where: str = "TRUE") -> str:
    """A subquery of ``columns`` of ``table`` with one row per key: BigQuery has no keys, so a row written twice
    (an at-least-once insert) is there twice. With ``latest``, the key is the table's key without that column
    and the row with its highest value is kept (the latest revision of a window). ``where`` filters the rows
    first."""
    q = sql.quote
    key = ", ".join(q(column) for column in table.key if column != latest)
    order = f" ORDER BY {q(latest)} DESC" if latest else ""
    # WHERE: BigQuery wants a WHERE, GROUP BY or HAVING beside a QUALIFY.
    return (f"(SELECT {', '.join(q(column) for column in columns)} FROM {sql.table(table)} WHERE {where} "
            f"QUALIFY ROW_NUMBER() OVER (PARTITION BY {key}{order}) = 1)")


def ended_runs(sql: SqlDialect, columns: Sequence[str]) -> str:
    """``job_history`` as a subquery of one row per run that ended. A run a drain interrupted has a row with
    status ``interrupted`` (its open state, for the next job) until the run ends and gets its own row with the
    same key: those rows are not the run's end, and are left out."""
    return one_per_key(sql, JOB_HISTORY, columns,
                       where=f"{sql.quote('job_status')} != '{RunStatus.INTERRUPTED.value}'")


def read_job_rows(query: Query, sql: SqlDialect, with_details: bool = False) -> List[JobRow]:
    """Every stored run that ended, once (not one a drain interrupted and no job ended since)."""
    q, epoch = sql.quote, sql.epoch_seconds
    columns = ["test_name", "run_id", "job_status", "processed_at", "out_of_order"]
    selected = f"{q('test_name')}, {q('run_id')}, {q('job_status')}, {epoch(q('processed_at'))}, {q('out_of_order')}"
    if with_details:
        columns += ["num_failures", "start_time", "timestamp", "events"]
        selected += (f", {q('num_failures')}, {epoch(q('start_time'))}, {epoch(q('timestamp'))}, {q('events')}")
    return [JobRow(*row) for row in query(f"SELECT {selected} FROM {ended_runs(sql, columns)} j")]


def read_open_runs(query: Query, sql: SqlDialect) -> Dict[Tuple[str, str], RunAccumulator]:
    """(test, run) -> the open state of each run a drain interrupted (its latest ``interrupted`` row), whether or
    not a later job ended it since (:func:`read_history_seed` leaves those out). A state that cannot be read back
    (code too old for it, a damaged row) is logged and left out: the run then starts afresh with its next message."""
    q = sql.quote
    rows = query(
        f"SELECT {q('test_name')}, {q('run_id')}, {q('events')} FROM {sql.table(JOB_HISTORY)} "
        f"WHERE {q('job_status')} = '{RunStatus.INTERRUPTED.value}' QUALIFY ROW_NUMBER() OVER "
        f"(PARTITION BY {q('test_name')}, {q('run_id')} ORDER BY {q('processed_at')} DESC) = 1")
    open_runs: Dict[Tuple[str, str], RunAccumulator] = {}
    for test, run, events in rows:
        try:
            text = open_run_text(json.loads(events or "[]"))
            state = None if text is None else encoding.from_text(text)
            if not isinstance(state, RunAccumulator) or (state.test, state.run) != (test, run):
                raise ValueError("no open state of this run in its events")
        except (ValueError, TypeError, EncodingError) as error:
            _LOGGER.warning("interrupted run %s/%s cannot be resumed (%s); its next message starts it afresh",
                            test, run, error)
            continue
        open_runs[(test, run)] = state
    return open_runs



def scope_condition(sql: SqlDialect, scope: KeyScope, test_column: str, name_column: str) -> str:
    """A condition on ``test_column`` and ``name_column`` true for the rows of the keys ``scope`` needs."""
    q, string = sql.quote, sql.string
    test, name = q(test_column), q(name_column)

    def texts(values) -> str:
        return ", ".join(string(value) for value in sorted(values))

    def name_in(names: Names) -> str:
        return "TRUE" if names is None else f"{name} IN ({texts(names)})"

    conditions = []
    every_name = [t for t, names in scope.by_test.items() if names is None]
    if every_name:
        conditions.append(f"{test} IN ({texts(every_name)})")
    conditions += [f"({test} = {string(t)} AND {name_in(names)})"
                   for t, names in sorted(scope.by_test.items()) if names]
    if scope.default != frozenset():
        others = f"{test} NOT IN ({texts(scope.by_test)})" if scope.by_test else "TRUE"
        conditions.append(f"({others} AND {name_in(scope.default)})")
    return " OR ".join(conditions) or "FALSE"


def _window_order(sql: SqlDialect, partition: Sequence[str], run: str) -> str:
    """An OVER clause: per key, its rows from the newest run (ended runs joined as ``j``)."""
    return (f"OVER (PARTITION BY {', '.join(partition)} "
            f"ORDER BY j.{sql.quote('processed_at')} DESC, {run} DESC")


def read_metric_rows(query: Query, sql: SqlDialect, scope: Optional[KeyScope] = None) -> List[MetricRow]:
    """Every stored metric value of a stored run, once, with its run's finalization time and status.

    With ``scope`` (the seed's): only the values of successful runs of the (test, metric) keys it names, each
    key's newest rows down to its ``scope.depth``-th newest value that counted (``core.seed_scope``): the rest
    cannot change a history the checks compare with.
    """
    q, epoch = sql.quote, sql.epoch_seconds
    metrics = one_per_key(sql, METRIC_HISTORY, ("test_name", "run_id", "metric_name", "metric_value",
                                                "within_bounds", "step", "metric_lower_bound", "metric_upper_bound",
                                                "history_segment"),
                          where="TRUE" if scope is None else f"({scope_condition(sql, scope, 'test_name', 'metric_name')})")
    jobs = ended_runs(sql, ("test_name", "run_id", "job_status", "processed_at"))
    limit = ""
    if scope is not None:
        newer = _window_order(sql, [f"m.{q('test_name')}", f"m.{q('metric_name')}", f"m.{q('history_segment')}"],
                              f"m.{q('run_id')}")
        limit = (f" AND j.{q('job_status')} = '{RunStatus.SUCCESS.value}' QUALIFY COALESCE(SUM(CASE WHEN "
                 f"m.{q('within_bounds')} IS NOT FALSE THEN 1 ELSE 0 END) {newer} "
                 f"ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < {int(scope.depth)}")
    rows = query(
        f"SELECT m.{q('test_name')}, m.{q('metric_name')}, m.{q('run_id')}, {epoch('j.' + q('processed_at'))}, "
        f"m.{q('metric_value')}, m.{q('within_bounds')}, j.{q('job_status')}, m.{q('step')}, "
        f"m.{q('metric_lower_bound')}, m.{q('metric_upper_bound')}, m.{q('history_segment')} "
        f"FROM {metrics} m JOIN {jobs} j USING ({q('test_name')}, {q('run_id')}) WHERE TRUE{limit}")
    return [MetricRow(*row) for row in rows]


def read_latest_windows(query: Query, sql: SqlDialect, successful_only: bool = True,
                        scope: Optional[KeyScope] = None) -> List[Tuple[Optional[float], Optional[str], WindowResult]]:
    """(finalized_at, status, window) for the latest revision of each stored window.

    ``successful_only``: the windows of runs that finished ``success``; else every
    window, with None for the time and status of a run not finalized yet.
    With ``scope`` (the seed's, with ``successful_only``): only the windows of the (test, tag) keys it names,
    of each key's latest ``scope.depth`` successful runs (of each machine type, with ``history_by``).
    """
    q, epoch = sql.quote, sql.epoch_seconds
    windows = one_per_key(sql, METRIC_WINDOWS, ("test_name", "run_id", "tag", "window_kind", "window_index",
                                                "revision", "start_time", "end_time", *WINDOW_ROW_COLUMNS),
                          latest="revision",
                          where="TRUE" if scope is None else f"({scope_condition(sql, scope, 'test_name', 'tag')})")
    jobs = ended_runs(sql, ("test_name", "run_id", "job_status", "processed_at"))
    rest = ", ".join(f"w.{q(name)}" for name in WINDOW_ROW_COLUMNS)
    newest_runs = _window_order(sql, [f"w.{q(column)}" for column in ("test_name", "tag", "window_kind",
                                                                       "history_segment")], f"w.{q('run_id')}")
    rows = query(
        f"SELECT w.{q('test_name')}, w.{q('tag')}, w.{q('window_kind')}, {epoch('j.' + q('processed_at'))}, "
        f"j.{q('job_status')}, w.{q('run_id')}, w.{q('window_index')}, {epoch('w.' + q('start_time'))}, "
        f"{epoch('w.' + q('end_time'))}, {rest} FROM {windows} w {'' if successful_only else 'LEFT '}JOIN {jobs} j "
        f"USING ({q('test_name')}, {q('run_id')})"
        + (f" WHERE j.{q('job_status')} = '{RunStatus.SUCCESS.value}'" if successful_only else "")
        + ("" if scope is None else f" QUALIFY DENSE_RANK() {newest_runs}) <= {int(scope.depth)}"))
    return [(finalized_at, status, window_from_row((test, run, tag, kind, index, start, end, *rest)))
            for test, tag, kind, finalized_at, status, run, index, start, end, *rest in rows]


def read_alert_rows(query: Query, sql: SqlDialect, latest_per_test: Optional[int] = None) -> List[Dict[str, Any]]:
    """Every stored alert once (or each test's latest ``latest_per_test``), as column dicts with ``created_at``
    in seconds since the epoch."""
    q, epoch = sql.quote, sql.epoch_seconds
    names = [c for c in ALERTS.column_names if c != "created_at"]
    latest = "" if latest_per_test is None else (
        f" WHERE TRUE QUALIFY ROW_NUMBER() OVER (PARTITION BY {q('test_name')} "
        f"ORDER BY {q('created_at')} DESC, {q('alert_id')} DESC) <= {int(latest_per_test)}")
    rows = query(f"SELECT {', '.join(q(n) for n in names)}, {epoch(q('created_at'))} "
                 f"FROM {one_per_key(sql, ALERTS, ALERTS.column_names)} a{latest}")
    return [{**dict(zip(names, row)), "created_at": row[-1]} for row in rows]


def _ledgers(alerts: Sequence[Dict[str, Any]], actions: Sequence[TriageItem]) -> Dict[str, AlertLedger]:
    """Per test, the mutes and the latest alerts (``read_alert_rows(..., MAX_RECENT_ALERTS)``) a later dismiss or
    accept can re-announce."""
    ledgers: Dict[str, AlertLedger] = collections.defaultdict(AlertLedger)
    for row in sorted(alerts, key=lambda r: (r["created_at"], r["alert_id"])):
        ledgers[row["test_name"]].recent[row["alert_id"]] = (row["created_at"],
                                                             {**row, "created_at": iso_utc(row["created_at"])})
    for action in actions:
        if action.action == TriageAction.MUTE:
            ledgers[action.test].mutes.append(action)
    return dict(ledgers)


def _window_seed(configs: ConfigSet, windows: Sequence[Tuple[Optional[float], Optional[str], WindowResult]],
                 actions: Sequence[TriageItem]):
    """Step-aligned window history: the latest revision of each window of successful runs
    (``read_latest_windows(..., successful_only=True)``)."""
    runs: Dict[Tuple[str, str, str], Dict[Tuple[Optional[float], str], List[WindowResult]]] = (  # successful: ended
        collections.defaultdict(lambda: collections.defaultdict(list)))
    for finalized_at, _, result in windows:
        runs[(result.test, result.tag, result.kind)][(finalized_at, result.run)].append(result)
    window_actions = collections.defaultdict(list)
    for action in actions:
        for target in window_triage_targets(action, configs.for_test(action.test).windows):
            window_actions[(action.test, target.tag, target.kind)].append(target)
    seeds = {}
    for (test, tag, kind) in set(runs) | set(window_actions):
        config = configs.for_test(test)
        tag_config = config.windows.tags.get(tag)
        if tag_config is not None and tag_config.spec.kind == kind:
            seeds[(test, tag, kind)] = seed_window_history(
                [(cast(float, f), r, windows) for (f, r), windows in runs[(test, tag, kind)].items()], tag_config,
                config.regression_test.rebaseline_after, window_actions.get((test, tag, kind), ()))
    return seeds
