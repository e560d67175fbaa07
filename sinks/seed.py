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
from typing import Callable, Sequence

from core.config import ConfigSet
from core.history import HistorySeed, history_policy, seed_job_history, seed_metric_history
from core.schema import JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS, Table
from core.window_checks import NUMERIC_AGGREGATIONS, seed_window_history
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
    return HistorySeed(
        windows=_window_seed(configs, query, sql),
        metrics={key: seed_metric_history(
            rows, history_policy(configs.for_test(key[0]).regression_test, key[1]))
                 for key, rows in rows_by_metric.items()},
        jobs={test: seed_job_history(rows) for test, rows in runs_by_test.items()},
        stored_runs=frozenset((test, run) for test, _, run, _ in jobs))


def _window_seed(configs: ConfigSet, query: Query, sql: SqlDialect):
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
    seeds = {}
    for (test, tag, kind), by_run in runs.items():
        config = configs.for_test(test)
        tag_config = config.windows.tags.get(tag)
        if tag_config is not None and tag_config.spec.kind == kind:
            seeds[(test, tag, kind)] = seed_window_history(
                [(f, r, windows) for (f, r), windows in by_run.items()], tag_config,
                config.regression_test.rebaseline_after)
    return seeds
