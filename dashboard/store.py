"""Where the dashboard's rows come from: a DuckDB store opened read-only per request, or a BigQuery dataset.

A :class:`Reader` runs one SQL text with *bound* parameters (``$name`` in the text, a dict of values): no value a
user typed is ever spliced into SQL. The dialect (``sinks.seed.SqlDialect``) spells table names, identifiers and
epoch seconds, as the report's and the triage tool's queries do.

The DuckDB file is opened read-only for one request and closed at its end, so a replay that writes the store
waits at most that long for DuckDB's file lock (``sinks.duckdb_store.connect_waiting`` waits 30 s); while a
replay holds the lock, a request waits ``BUSY_PATIENCE_SECONDS`` and then answers 503.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from sinks.seed import SqlDialect
from sinks.stores import DUCKDB_SQL, TOOL_TIMEOUT_SECONDS, bigquery_client, bigquery_dialect

BUSY_PATIENCE_SECONDS = 2.0
_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

Rows = List[tuple]
Run = Callable[[str, Mapping[str, Any]], Rows]  # (SQL with $name parameters, values) -> rows


class StoreBusy(RuntimeError):
    """A replay holds the DuckDB file's write lock: try again in a moment."""


@dataclasses.dataclass
class Reader:
    """One open store for one request: ``query(sql, params)`` in ``dialect``."""
    run: Run
    dialect: SqlDialect
    from_epoch: Callable[[str], str]  # a parameter of epoch seconds -> a TIMESTAMP expression

    def query(self, sql: str, params: Optional[Mapping[str, Any]] = None) -> Rows:
        return self.run(sql, params or {})


class DuckDBSource:
    """A local store file; :meth:`reader` opens it read-only for the length of a ``with`` block."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no store at {path!r}: run the pipeline first, or name it with --local_store "
                                    "(or --bigquery_dataset)")
        self.path = path
        self.label = path
        self.local_store: Optional[str] = path

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        import duckdb

        deadline = time.monotonic() + BUSY_PATIENCE_SECONDS
        while True:
            try:
                connection = duckdb.connect(self.path, read_only=True)
                break
            except duckdb.IOException as e:
                if "lock" not in str(e).lower():
                    raise
                if time.monotonic() >= deadline:
                    raise StoreBusy(f"{self.path} is being written (a replay holds it); try again shortly") from None
                time.sleep(0.05)
        try:
            connection.execute("SET TimeZone = 'UTC'")

            def run(sql: str, params: Mapping[str, Any]) -> Rows:
                return connection.execute(sql, dict(params)).fetchall() if params else connection.execute(
                    sql).fetchall()

            yield Reader(run, DUCKDB_SQL, lambda p: f"to_timestamp({p})")
        finally:
            connection.close()


def _bigquery_parameter(name: str, value: Any):
    from google.cloud import bigquery

    if isinstance(value, bool):
        return bigquery.ScalarQueryParameter(name, "BOOL", value)
    if isinstance(value, int):
        return bigquery.ScalarQueryParameter(name, "INT64", value)
    if isinstance(value, float):
        return bigquery.ScalarQueryParameter(name, "FLOAT64", value)
    if isinstance(value, datetime.datetime):
        return bigquery.ScalarQueryParameter(name, "TIMESTAMP", value)
    if isinstance(value, (list, tuple)):
        return bigquery.ArrayQueryParameter(name, "STRING", [str(v) for v in value])
    return bigquery.ScalarQueryParameter(name, "STRING", value)


def bigquery_sql(sql: str) -> str:
    """The dashboard's ``$name`` parameters in BigQuery's spelling, ``@name``."""
    return _PARAMETER.sub(r"@\1", sql)


class BigQuerySource:
    """The trainguard tables of a BigQuery dataset, one client for the process; each query bounded in time."""

    def __init__(self, project: Optional[str], dataset: str, endpoint: Optional[str] = None,
                 timeout_seconds: Optional[float] = TOOL_TIMEOUT_SECONDS):
        self._client = bigquery_client(project, endpoint)
        self._dialect = bigquery_dialect(self._client.project, dataset)
        self._timeout = timeout_seconds
        self.label = f"BigQuery {self._client.project}.{dataset}"
        self.local_store: Optional[str] = None

    def _run(self, sql: str, params: Mapping[str, Any]) -> Rows:
        from google.cloud import bigquery

        config = bigquery.QueryJobConfig(query_parameters=[_bigquery_parameter(k, v) for k, v in params.items()])
        job = self._client.query(bigquery_sql(sql), job_config=config, timeout=self._timeout)
        return [tuple(row.values()) for row in job.result(timeout=self._timeout)]

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        yield Reader(self._run, self._dialect, lambda p: f"TIMESTAMP_MICROS(CAST({p} * 1000000 AS INT64))")


def in_list(prefix: str, values: Sequence[Any]) -> Tuple[str, Dict[str, Any]]:
    """``($p0, $p1, ...)`` and its parameters, for an ``IN`` of a few values (never empty: a NULL that matches none)."""
    if not values:
        return "(NULL)", {}
    names = {f"{prefix}{i}": v for i, v in enumerate(values)}
    return "(" + ", ".join(f"${n}" for n in names) + ")", names
