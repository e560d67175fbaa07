"""Where the dashboard's rows come from: a DuckDB store opened read-only per request, or a BigQuery dataset.

A :class:`Reader` runs one SQL text with *bound* parameters (``$name`` in the text, a dict of values): no value a
user typed is ever spliced into SQL. The dialect (``sinks.seed.SqlDialect``) spells table names, identifiers and
epoch seconds, as the report's and the triage tool's queries do.

The DuckDB file is opened read-only, shared by concurrent requests and closed within about a second
(:class:`SharedConnection`), so a replay that writes the store gets DuckDB's file lock within its patience
(``sinks.duckdb_store.connect_waiting`` waits 30 s); while a replay holds the lock, a request waits
``BUSY_PATIENCE_SECONDS`` and then answers 503.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

from sinks.seed import SqlDialect
from sinks.store_lock import lock_path
from sinks.stores import DUCKDB_SQL, TOOL_TIMEOUT_SECONDS, bigquery_client, bigquery_dialect

BUSY_PATIENCE_SECONDS = 2.0
SETTLE_SECONDS = 2.0  # a file changed this recently is not cached from (its times may not show a change yet)
BIGQUERY_CACHE_SECONDS = 5.0  # how long a page's rows read from BigQuery are shown again (BigQuery has no version)
CACHE_ENTRIES = 128  # pages' data kept (a test page's is the largest: about 1 MB)
logger = logging.getLogger(__name__)
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
    # Whether a query pays for every partition (day) of a table it reads (BigQuery): then the reads that cannot
    # name a time bound first find one (``dashboard.queries``); DuckDB reads the same rows as cheaply without.
    partitioned: bool = False
    # Whether the tables index their ``looked_up_by`` columns (``core.schema``: the local store), so that a read of
    # one run's rows need not scan a table (``dashboard.queries``).
    runs_indexed: bool = False

    def query(self, sql: str, params: Optional[Mapping[str, Any]] = None) -> Rows:
        return self.run(sql, params or {})


def writer_running(store: str) -> bool:
    """Whether a process holds the store's write lock (``sinks.store_lock``: a replay is running), read from
    ``/proc/locks`` without taking the lock (taking it, even shared, would make a starting replay stop);
    True when that cannot be told."""
    try:
        status = os.stat(lock_path(store))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            locks = f.read()
    except OSError:
        return True
    key = f" {os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino} "
    return any(key in line for line in locks.splitlines() if "FLOCK" in line)


class WriterWatch:
    """:func:`writer_running`, asked at most every ``every`` seconds."""

    def __init__(self, store: str, every: float = 0.1):
        self.store, self.every = store, every
        self._checked, self._running = -math.inf, False

    def running(self, now: float) -> bool:
        if now - self._checked >= self.every:
            self._running, self._checked = writer_running(self.store), now
        return self._running


class SharedConnection:
    """One read-only DuckDB connection shared by concurrent requests (a cursor each), so that a request does not
    pay for opening the file (20-80 ms), and a writer is never kept out for long.

    It is closed once no request has used it for ``linger`` seconds. While a replay runs (it holds the store's
    write lock, ``sinks.store_lock``, for its whole invocation: :func:`writer_running`) it is also closed once it
    has been open ``hold`` seconds, when its last request ends, and then stays closed ``gap`` seconds, longer than
    a writer's retry interval (``sinks.duckdb_store.connect_waiting`` tries every 0.1 s), so the replay gets the
    file when it wants it. While a writer has the file, opening waits up to ``BUSY_PATIENCE_SECONDS``, then
    :class:`StoreBusy`.
    """

    def __init__(self, path: str, hold: float = 1.0, gap: float = 0.25, linger: float = 1.0):
        self.path, self.hold, self.gap, self.linger = path, hold, gap, linger
        self._writer = WriterWatch(path)
        self._ready = threading.Condition()
        self._connection: Any = None
        self._users = 0
        self._opened = 0.0
        self._last_used = 0.0
        self._closed_at = -math.inf
        self._timer: Optional[threading.Timer] = None

    def _expired(self, now: float) -> bool:
        return now - self._opened >= self.hold and self._writer.running(now)

    def _open(self) -> Any:
        import duckdb

        from sinks.duckdb_store import connect_waiting

        try:
            connection = connect_waiting(self.path, read_only=True, patience=BUSY_PATIENCE_SECONDS)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower():
                raise
            raise StoreBusy(f"{self.path} is being written (a replay holds it); try again shortly") from None
        connection.execute("SET TimeZone = 'UTC'")
        # A request runs one query at a time, and requests run side by side: a second thread per query would cost
        # more CPU (a run page 12 ms of CPU instead of 9) for little time saved.
        connection.execute("SET threads = 1")
        return connection

    def _close(self) -> None:
        """With the condition held and no user: closes the connection and starts the gap."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
            self._closed_at = time.monotonic()
            self._ready.notify_all()

    def acquire(self) -> Any:
        """A cursor of the shared connection (opened if needed); give it back with :meth:`release`."""
        with self._ready:
            while True:
                now = time.monotonic()
                if self._connection is not None and not self._expired(now):
                    self._users += 1
                    return self._connection.cursor()
                if self._connection is not None:  # expired: closed now if unused, else by its last user
                    if self._users == 0:
                        self._close()
                    else:
                        self._ready.wait(0.05)
                    continue
                if now - self._closed_at < self.gap:
                    self._ready.wait(self.gap - (now - self._closed_at))
                    continue
                self._connection = self._open()
                self._opened = time.monotonic()
                self._users += 1
                return self._connection.cursor()

    def release(self, cursor: Any) -> None:
        cursor.close()
        with self._ready:
            self._users -= 1
            self._last_used = time.monotonic()
            if self._users == 0:
                if self._expired(self._last_used):
                    self._close()
                elif self._timer is None:
                    self._timer = threading.Timer(self.linger, self._idle_check)
                    self._timer.daemon = True
                    self._timer.start()

    def _idle_check(self) -> None:
        with self._ready:
            self._timer = None
            if self._connection is None or self._users:
                return
            idle = time.monotonic() - self._last_used
            if idle >= self.linger or self._expired(time.monotonic()):
                self._close()
            else:
                self._timer = threading.Timer(self.linger - idle, self._idle_check)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        with self._ready:
            if self._users == 0:
                self._close()


class DuckDBSource:
    """A local store file, read through a :class:`SharedConnection`; :meth:`reader` lends a cursor for the length
    of a ``with`` block (one request)."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no store at {path!r}: run the pipeline first, or name it with --local_store "
                                    "(or --bigquery_dataset)")
        self.path = path
        self.label = path
        self.local_store: Optional[str] = path
        self.connection = SharedConnection(path)

    def version(self) -> Optional[tuple]:
        """The store file's and its write-ahead log's :func:`file_version` (None: do not cache)."""
        return file_version(self.path, self.path + ".wal")

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        cursor = self.connection.acquire()
        try:
            def run(sql: str, params: Mapping[str, Any]) -> Rows:
                return cursor.execute(sql, dict(params)).fetchall() if params else cursor.execute(sql).fetchall()

            yield Reader(run, DUCKDB_SQL, lambda p: f"to_timestamp({p})", runs_indexed=True)
        finally:
            self.connection.release(cursor)


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
        logger.debug("BigQuery query: %s", bigquery_sql(sql))
        job = self._client.query(bigquery_sql(sql), job_config=config, timeout=self._timeout)
        return [tuple(row.values()) for row in job.result(timeout=self._timeout)]

    def version(self) -> Optional[tuple]:
        """BigQuery tells no version of a dataset: a page's rows are kept ``BIGQUERY_CACHE_SECONDS``."""
        return ("bigquery", math.floor(time.monotonic() / BIGQUERY_CACHE_SECONDS))

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        yield Reader(self._run, self._dialect, lambda p: f"TIMESTAMP_MICROS(CAST({p} * 1000000 AS INT64))",
                     partitioned=True)


def file_version(*paths: str) -> Optional[tuple]:
    """What changes whenever one of the files is written, replaced, created or deleted: (mtime, ctime, size, inode)
    of each (None for a missing one). None while one changed within ``SETTLE_SECONDS``: a file system's clock
    ticks coarsely, so a write in the same tick as an earlier look may not change the times yet."""
    now = time.time_ns()
    version: List[Optional[Tuple[int, int, int, int]]] = []
    for path in paths:
        try:
            status = os.stat(path)
        except FileNotFoundError:
            version.append(None)
            continue
        if now - max(status.st_mtime_ns, status.st_ctime_ns) < SETTLE_SECONDS * 1e9:
            return None
        version.append((status.st_mtime_ns, status.st_ctime_ns, status.st_size, status.st_ino))
    return tuple(version)


T = TypeVar("T")


class PageCache:
    """The data of pages, each under a key that names the page *and the versions of what it was read from* (the
    source's and the triage sink's), the least recently used dropped beyond ``entries``. Concurrent requests for
    one missing key read it once."""

    def __init__(self, entries: int = CACHE_ENTRIES):
        self.entries = entries
        self.hits = self.misses = 0
        self._values: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._reading: Dict[Hashable, threading.Lock] = {}

    def _kept(self, key: Hashable) -> Tuple[bool, Any]:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                self.hits += 1
                return True, self._values[key]
            return False, None

    def get(self, key: Hashable, read: Callable[[], T]) -> T:
        found, value = self._kept(key)
        if found:
            return value
        with self._lock:
            gate = self._reading.setdefault(key, threading.Lock())
        with gate:
            found, value = self._kept(key)
            if found:
                return value
            try:
                value = read()
            finally:
                with self._lock:
                    self._reading.pop(key, None)
            with self._lock:
                self.misses += 1
                self._values[key] = value
                while len(self._values) > self.entries:
                    self._values.popitem(last=False)
        return value


def in_list(prefix: str, values: Sequence[Any]) -> Tuple[str, Dict[str, Any]]:
    """``($p0, $p1, ...)`` and its parameters, for an ``IN`` of a few values (never empty: a NULL that matches none)."""
    if not values:
        return "(NULL)", {}
    names = {f"{prefix}{i}": v for i, v in enumerate(values)}
    return "(" + ", ".join(f"${n}" for n in names) + ")", names
