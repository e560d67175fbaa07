"""The start-up ``HistorySeed``, read back from a store's tables: one definition for every store.

A new invocation of the pipeline (a replay, a restarted streaming job)
continues the history of earlier ones by seeding its keyed state from what
they wrote. The queries and the rows -> seed step live here, once; a store
only says how to run SQL and how its dialect spells three things (identifier
quoting, table names, seconds since the epoch). ``DuckDBStore`` and
``BigQueryStore`` both call :func:`read_history_seed`, so a DuckDB file and a
BigQuery dataset holding the same rows give the same seed.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Dict, List, Sequence

from core.config import ConfigSet
from core.history import HistorySeed, history_policy, seed_job_history, seed_metric_history
from core.records import iso_utc
from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, TRIAGE, Table
from core.triage import MAX_RECENT_ALERTS, AlertLedger, TriageItem, reaches_metric_history
from core.vocabulary import TriageAction
from core.window_checks import NUMERIC_AGGREGATIONS, seed_window_history, window_triage_targets
from core.windows import WindowResult


@dataclasses.dataclass(frozen=True)
class SqlDialect:
    """How one SQL engine spells what the seed queries need."""
    quote: Callable[[str], str]          # a column name -> a quoted identifier
    table: Callable[[Table], str]        # a table -> its (quoted, qualified) name
    epoch_seconds: Callable[[str], str]  # a TIMESTAMP expression -> FLOAT seconds since the epoch


Query = Callable[[str], Sequence[Sequence]]  # SQL -> rows (tuples in SELECT order)


def read_history_seed(configs: ConfigSet, query: Query, sql: SqlDialect) -> HistorySeed:
    """The history state that earlier invocations left behind in a store's tables."""
    actions = read_triage_actions(query, sql)
    q, epoch = sql.quote, sql.epoch_seconds
    jobs = query(f"SELECT {q('test_name')}, {epoch(q('processed_at'))}, {q('run_id')}, {q('job_status')} "
                 f"FROM {sql.table(JOB_HISTORY)}")
    runs_by_test = collections.defaultdict(list)
    for test, finalized_at, run, status in jobs:
        runs_by_test[test].append((finalized_at, run, status))
    metrics = query(
        f"SELECT m.{q('test_name')}, m.{q('metric_name')}, {epoch('j.' + q('processed_at'))}, m.{q('run_id')}, "
        f"m.{q('metric_value')}, m.{q('within_bounds')}, j.{q('job_status')} "
        f"FROM {sql.table(METRIC_HISTORY)} m JOIN {sql.table(JOB_HISTORY)} j "
        f"USING ({q('test_name')}, {q('run_id')})")
    rows_by_metric = collections.defaultdict(list)
    for test, metric, *row in metrics:
        rows_by_metric[(test, metric)].append(tuple(row))
    metric_actions = collections.defaultdict(list)
    for action in actions:
        if reaches_metric_history(action):
            metric_actions[(action.test, action.metric)].append(action)
    return HistorySeed(
        windows=_window_seed(configs, query, sql, actions),
        metrics={key: seed_metric_history(
            rows_by_metric.get(key, ()), history_policy(configs.for_test(key[0]).regression_test, key[1]),
            metric_actions.get(key, ()))
                 for key in set(rows_by_metric) | set(metric_actions)},
        jobs={test: seed_job_history(rows) for test, rows in runs_by_test.items()},
        stored_runs=frozenset((test, run) for test, _, run, _ in jobs),
        stored_actions=frozenset(action.id for action in actions),
        ledgers=_ledgers(query, sql, actions))


def read_triage_actions(query: Query, sql: SqlDialect) -> List[TriageItem]:
    """Every stored triage action, in event-time order."""
    q, epoch = sql.quote, sql.epoch_seconds
    names = ("action_id", "action", "test_name", "metric_name", "run_id", "alert_id", "alert_kind",
             "alert_instance", "note", "author")
    rows = query(f"SELECT {', '.join(q(n) for n in names)}, {epoch(q('until'))}, {epoch(q('created_at'))} "
                 f"FROM {sql.table(TRIAGE)}")
    actions = [TriageItem.from_row({**dict(zip(names, row)), "until": row[-2], "created_at": row[-1]})
               for row in rows]
    return sorted(actions, key=lambda action: action.order)


def _ledgers(query: Query, sql: SqlDialect, actions: Sequence[TriageItem]) -> Dict[str, AlertLedger]:
    """Per test, the mutes and the latest alerts a later dismiss or accept can re-announce."""
    q, epoch = sql.quote, sql.epoch_seconds
    names = [c for c in ALERTS.column_names if c != "created_at"]
    rows = query(f"SELECT {', '.join(q(n) for n in names)}, {epoch(q('created_at'))} FROM {sql.table(ALERTS)} "
                 f"QUALIFY ROW_NUMBER() OVER (PARTITION BY {q('test_name')} "
                 f"ORDER BY {q('created_at')} DESC, {q('alert_id')} DESC) <= {MAX_RECENT_ALERTS}")
    ledgers: Dict[str, AlertLedger] = collections.defaultdict(AlertLedger)
    for row in sorted(rows, key=lambda r: (r[-1], r[0])):
        alert = {**dict(zip(names, row)), "created_at": iso_utc(row[-1])}
        ledgers[alert["test_name"]].recent[alert["alert_id"]] = (row[-1], alert)
    for action in actions:
        if action.action == TriageAction.MUTE:
            ledgers[action.test].mutes.append(action)
    return dict(ledgers)


def _window_seed(configs: ConfigSet, query: Query, sql: SqlDialect, actions: Sequence[TriageItem]):
    """Step-aligned window history: the latest revision of each window of successful runs."""
    q, epoch = sql.quote, sql.epoch_seconds
    aggregations = ", ".join(f"w.{q(name)}" for name in NUMERIC_AGGREGATIONS)
    window_key = ", ".join(f"w.{q(c)}" for c in ("test_name", "run_id", "tag", "window_kind", "window_index"))
    rows = query(
        f"SELECT w.{q('test_name')}, w.{q('tag')}, w.{q('window_kind')}, {epoch('j.' + q('processed_at'))}, "
        f"w.{q('run_id')}, w.{q('window_index')}, {epoch('w.' + q('start_time'))}, {epoch('w.' + q('end_time'))}, "
        f"w.{q('start_step')}, w.{q('end_step')}, w.{q('n')}, w.{q('partial')}, {aggregations} "
        f"FROM {sql.table(METRIC_WINDOWS)} w JOIN {sql.table(JOB_HISTORY)} j "
        f"USING ({q('test_name')}, {q('run_id')}) "
        f"WHERE j.{q('job_status')} = 'success' "
        f"QUALIFY w.{q('revision')} = max(w.{q('revision')}) OVER (PARTITION BY {window_key})")
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for test, tag, kind, finalized_at, run, index, start, end, start_step, end_step, n, partial, *values in rows:
        result = WindowResult(test, run, tag, kind, index, start, end, start_step, end_step, n, partial,
                              {a: v for a, v in zip(NUMERIC_AGGREGATIONS, values) if v is not None})
        runs[(test, tag, kind)][(finalized_at, run)].append(result)
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
                [(f, r, windows) for (f, r), windows in runs[(test, tag, kind)].items()], tag_config,
                config.regression_test.rebaseline_after, window_actions.get((test, tag, kind), ()))
    return seeds
