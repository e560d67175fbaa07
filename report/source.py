"""Where the report's rows come from: a DuckDB store or a BigQuery dataset, through the same SQL.

The report needs a read per table (:class:`ReportSource`). They are
written once (:class:`SqlReportSource`) in the SQL that DuckDB and BigQuery
both accept; a source only says how to run a query and how its dialect spells
table names, identifiers and seconds since the epoch (``sinks.seed.SqlDialect``,
the start-up seed's abstraction). Times come back as float seconds since the
epoch, so rows from both engines compare equal.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Callable, List, Optional, Protocol, Sequence

from core.alert_record import AlertRecord, alert_from_row
from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS
from core.triage import TriageItem, alert_states
from core.vocabulary import AlertState, RunStatus
from core.window_checks import WINDOW_ROW_COLUMNS, window_from_row
from core.windows import WindowResult
from sinks.seed import SqlDialect, read_triage_actions
from sinks.stores import TOOL_TIMEOUT_SECONDS, bigquery_client, bigquery_dialect, bounded_query

# What the curve of a tag without a window check is drawn from, in order of preference (a checked tag: its aggregation).
CURVE_AGGREGATIONS = ("mean", "p50", "last")

Query = Callable[[str], Sequence[Sequence]]  # SQL -> rows (tuples in SELECT order)


@dataclasses.dataclass(frozen=True)
class JobRow:
    """One run of ``job_history``; times in seconds since the epoch."""
    test: str
    run: str
    status: str
    end: float        # end of the run (last activity for a missing run)
    finalized: float  # processed_at: orders the history (ties by run id)
    start: Optional[float] = None  # its run_started (or first message): how long it ran, in lifecycle alerts


@dataclasses.dataclass(frozen=True)
class MetricRow:
    """One value of ``metric_history`` with the bounds it was checked against."""
    test: str
    run: str
    metric: str
    value: float
    lower: Optional[float]
    upper: Optional[float]
    within: Optional[bool]  # None: not checked
    time: float             # run end


class ReportSource(Protocol):
    """The reads a report needs, one per table (a source may leave out old rows: ``since``)."""

    def jobs(self) -> List[JobRow]: ...

    def metrics(self) -> List[MetricRow]: ...

    def windows(self) -> List[WindowResult]: ...

    def alerts(self) -> List[AlertRecord]: ...

    def triage_actions(self) -> List[TriageItem]: ...

    def close(self) -> None: ...


def with_triage_states(alerts: Sequence[AlertRecord], actions: Sequence[TriageItem]) -> List[AlertRecord]:
    """The alerts with ``details.triage`` saying the state the triage actions left them in (``core.triage``)."""
    states = alert_states([a.facts() for a in alerts], actions,
                          raised_muted=[a.alert_id for a in alerts if a.state is AlertState.MUTED])
    marked = []
    for alert in alerts:
        state, action = states[alert.alert_id]
        if action is not None:
            alert = dataclasses.replace(alert, details={**alert.details, "triage": action.marker(state)})
        marked.append(alert)
    return marked


def since_literal(since: Optional[str]) -> Optional[str]:
    """A validated ``TIMESTAMP 'YYYY-MM-DD'`` literal (both engines read it as UTC midnight)."""
    if since is None:
        return None
    try:
        day = datetime.date.fromisoformat(since)
    except ValueError:
        raise ValueError(f"since: expected a date YYYY-MM-DD, got {since!r}") from None
    return f"TIMESTAMP '{day.isoformat()}'"


class SqlReportSource:
    """The reads, in SQL that DuckDB and BigQuery both run."""

    def __init__(self, query: Query, dialect: SqlDialect, since: Optional[str] = None,
                 close: Callable[[], None] = lambda: None):
        self._query = query
        self._sql = dialect
        self._since = since_literal(since)
        self._close = close

    def _where(self, time_column: str) -> str:
        """Always a WHERE clause: BigQuery accepts QUALIFY only after one."""
        if self._since is None:
            return "WHERE TRUE"
        return f"WHERE {self._sql.quote(time_column)} >= {self._since}"

    def jobs(self) -> List[JobRow]:
        q, epoch = self._sql.quote, self._sql.epoch_seconds
        # A run a drain interrupted is still running: its ``interrupted`` row (until it ends) is not its end.
        rows = self._query(
            f"SELECT {q('test_name')}, {q('run_id')}, {q('job_status')}, {epoch(q('timestamp'))}, "
            f"{epoch(q('processed_at'))}, {epoch(q('start_time'))} FROM {self._sql.table(JOB_HISTORY)} {self._where('timestamp')} "
            f"AND {q('job_status')} != '{RunStatus.INTERRUPTED.value}'")
        return [JobRow(*row) for row in rows]

    def metrics(self) -> List[MetricRow]:
        q, epoch = self._sql.quote, self._sql.epoch_seconds
        columns = ", ".join(q(c) for c in ("test_name", "run_id", "metric_name", "metric_value",
                                            "metric_lower_bound", "metric_upper_bound", "within_bounds"))
        rows = self._query(f"SELECT {columns}, {epoch(q('timestamp'))} FROM {self._sql.table(METRIC_HISTORY)} "
                           f"{self._where('timestamp')}")
        return [MetricRow(*row) for row in rows]

    def windows(self) -> List[WindowResult]:
        """The highest revision of every window, with every numeric aggregation (a window check may be on any)."""
        q, epoch = self._sql.quote, self._sql.epoch_seconds
        key = ", ".join(q(c) for c in ("test_name", "run_id", "tag", "window_kind", "window_index"))
        values = ", ".join(q(c) for c in WINDOW_ROW_COLUMNS)
        rows = self._query(
            f"SELECT {key}, {epoch(q('start_time'))}, {epoch(q('end_time'))}, "
            f"{values} FROM {self._sql.table(METRIC_WINDOWS)} {self._where('end_time')} "
            f"QUALIFY {q('revision')} = max({q('revision')}) OVER (PARTITION BY {key})")
        return [window_from_row(row) for row in rows]

    def alerts(self) -> List[AlertRecord]:
        q, epoch = self._sql.quote, self._sql.epoch_seconds
        columns = ", ".join(q(c) for c in ("alert_id", "kind", "test_name", "run_id", "metric_name", "value",
                                            "lower_bound", "upper_bound", "message"))
        rows = self._query(f"SELECT {columns}, {epoch(q('created_at'))}, {q('details')} "
                           f"FROM {self._sql.table(ALERTS)} {self._where('created_at')}")
        names = ("alert_id", "kind", "test_name", "run_id", "metric_name", "value", "lower_bound", "upper_bound",
                 "message", "created_at", "details")
        alerts = [alert_from_row(dict(zip(names, row))) for row in rows]
        return with_triage_states(alerts, self.triage_actions())

    def triage_actions(self) -> List[TriageItem]:
        """Every stored triage action, in event-time order ([] for a store written before triage existed)."""
        try:
            return read_triage_actions(self._query, self._sql)
        except Exception:  # noqa: BLE001 - a store written before triage existed has no triage table
            return []

    def close(self) -> None:
        self._close()


def duckdb_source(path: str, since: Optional[str] = None) -> SqlReportSource:
    """The local store (``sinks.duckdb_store.DuckDBStore``); the file must exist."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no DuckDB store at {path!r}")
    from sinks.duckdb_store import DuckDBStore
    from sinks.stores import DUCKDB_SQL

    store = DuckDBStore(path)
    return SqlReportSource(store.query, DUCKDB_SQL, since, close=store.close)


def bigquery_source(project: Optional[str], dataset: str, endpoint: Optional[str] = None,
                    since: Optional[str] = None, timeout_seconds: Optional[float] = TOOL_TIMEOUT_SECONDS
                    ) -> SqlReportSource:
    """The trainguard tables of a BigQuery dataset (``project`` None: the client's default project), each query
    bounded by ``timeout_seconds``, retries included."""
    client = bigquery_client(project, endpoint)

    def query(sql: str) -> List[tuple]:
        return bounded_query(client, sql, timeout_seconds)

    return SqlReportSource(query, bigquery_dialect(client.project, dataset), since, close=client.close)
