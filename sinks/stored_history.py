"""The stored history the backtest re-evaluates (``core.backtest``), read back from a store's tables.

The same queries as the start-up seed (``sinks.seed``: one row per key, one SQL
for DuckDB and BigQuery, spelled by the store's ``SqlDialect``), plus the
run details and the alerts that fired. Nothing here imports Apache Beam.
"""

from __future__ import annotations

import collections
import json
from typing import Dict, List, Tuple

from core.backtest import StoredHistory, StoredRun
from core.runs import MetricValue, RankedEvent
from core.triage import AlertFacts
from sinks.seed import (
    Query,
    SqlDialect,
    read_alert_rows,
    read_job_rows,
    read_latest_windows,
    read_metric_rows,
    read_triage_actions,
)


def read_stored_alerts(query: Query, sql: SqlDialect) -> List[AlertFacts]:
    """Every stored alert, once."""
    return [AlertFacts(r["alert_id"], r["kind"], r["test_name"], r["run_id"], r["metric_name"], r["created_at"])
            for r in read_alert_rows(query, sql)]


def _events(text: object) -> Tuple[RankedEvent, ...]:
    """The run's events from ``job_history.events`` (JSON, ``RunResult.events_json``); what cannot be read is
    left out."""
    try:
        raw = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        return ()
    return tuple(RankedEvent(e["type"], e["time"], e.get("data") or {}, e.get("rank")) for e in raw
                 if isinstance(e, dict) and isinstance(e.get("type"), str) and isinstance(e.get("time"), (int, float)))


def read_stored_history(query: Query, sql: SqlDialect) -> StoredHistory:
    """Runs with their metric values, every window (latest revision), the alerts and the triage actions."""
    metrics: Dict[Tuple[str, str], List[MetricValue]] = collections.defaultdict(list)
    for m in read_metric_rows(query, sql):
        metrics[(m.test, m.run)].append(MetricValue(m.metric, m.value, m.step))
    runs = [StoredRun(job.test, job.run, job.status, job.num_failures, job.start_time,
                      job.end_time if job.end_time is not None else job.finalized_at, job.finalized_at,
                      _events(job.events), tuple(sorted(metrics.get((job.test, job.run), ()), key=lambda v: v.name)))
            for job in read_job_rows(query, sql, with_details=True)]
    return StoredHistory(runs=runs, windows=[window for _, _, window in read_latest_windows(query, sql, False)],
                         alerts=read_stored_alerts(query, sql), actions=read_triage_actions(query, sql))
