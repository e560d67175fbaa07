"""The local store: an embedded DuckDB file with the same tables as BigQuery.

Rows are inserted with ``INSERT OR IGNORE`` on each table's key, so re-running
the pipeline on the same input never duplicates a row. At start-up the store
is read back into a ``HistorySeed`` so a new invocation continues the history.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Collection, Dict, Iterable, Iterator, List, Optional

import duckdb
import pyarrow as pa

from core.config import ConfigSet
from core.history import HistorySeed
from core.schema import JOB_HISTORY, LOCAL_TABLES, TABLES, Table
from sinks.seed import read_history_seed
from sinks.stores import DUCKDB_SQL

_DUCKDB_TYPES = {"STRING": "VARCHAR", "FLOAT64": "DOUBLE", "INT64": "BIGINT", "BOOL": "BOOLEAN",
                 "TIMESTAMP": "TIMESTAMPTZ"}
# How rows are staged in Arrow before the insert casts them (timestamps arrive as ISO strings).
_ARROW_TYPES = {"STRING": pa.string(), "FLOAT64": pa.float64(), "INT64": pa.int64(), "BOOL": pa.bool_(),
                "TIMESTAMP": pa.string()}
# DuckDB serializes writers within a process only per connection; one lock per file keeps threads of one
# process from conflicting on primary keys (only the replay's launching process writes: sinks/staging.py).
_WRITE_LOCKS: Dict[str, threading.Lock] = collections.defaultdict(threading.Lock)
# A reader of the store (the report, trainguard-triage list) holds DuckDB's file lock while it reads, which
# takes well under a second: a writer waits that long for it rather than failing.
LOCKED_BY_READER_SECONDS = 30.0


def connect_waiting(path: str, read_only: bool = False,
                    patience: float = LOCKED_BY_READER_SECONDS) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, waiting up to ``patience`` seconds while another process holds the file's lock."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower() or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


class DuckDBStore:
    """One DuckDB file. Opening a connection costs ~20 ms, so a store keeps one until ``close()``."""

    def __init__(self, path: str):
        self.path = path
        self._connection: Optional[duckdb.DuckDBPyConnection] = None

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A cursor on the store's connection; closing the cursor keeps the connection."""
        if self._connection is None:
            self._connection = connect_waiting(self.path)
        cursor = self._connection.cursor()
        cursor.execute("SET TimeZone = 'UTC'")
        return cursor

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor in one transaction: committed if the block ends normally, else rolled back (and a killed
        process's transaction is never seen: DuckDB replays only committed ones from its write-ahead log)."""
        with _WRITE_LOCKS[self.path], self.connect() as connection:
            connection.execute("BEGIN TRANSACTION")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def ensure_schema(self) -> None:
        with self.connect() as connection:
            for table in LOCAL_TABLES.values():
                columns = ", ".join(
                    f'"{c.name}" {_DUCKDB_TYPES[c.type]}{" NOT NULL" if c.required else ""}' for c in table.columns)
                key = ", ".join(f'"{k}"' for k in table.key)
                connection.execute(f'CREATE TABLE IF NOT EXISTS "{table.name}" ({columns}, PRIMARY KEY ({key}))')
                for column in table.columns:  # a store older than a column: its rows have NULL there
                    if not column.required:
                        connection.execute(f'ALTER TABLE "{table.name}" ADD COLUMN IF NOT EXISTS "{column.name}" '
                                           f'{_DUCKDB_TYPES[column.type]}')
                for name in table.looked_up_by:  # a store older than the index gets it here, once
                    connection.execute(f'CREATE INDEX IF NOT EXISTS "{table.name}_by_{name}" ON "{table.name}" '
                                       f'("{name}")')

    def insert(self, table: Table, rows: List[dict],
               transaction: Optional[duckdb.DuckDBPyConnection] = None) -> int:
        """Inserts rows whose key is new, in ``transaction`` (a cursor of :meth:`transaction`) or on their own;
        returns how many were inserted."""
        if not rows:
            return 0
        if transaction is None:
            with self.transaction() as connection:
                return self.insert(table, rows, connection)
        staged = pa.table({c.name: pa.array([row.get(c.name) for row in rows], type=_ARROW_TYPES[c.type])
                           for c in table.columns})
        casts = ", ".join(f'CAST("{c.name}" AS {_DUCKDB_TYPES[c.type]})' for c in table.columns)
        transaction.register("staged_rows", staged)  # a failed insert aborts the transaction, cursor and all
        before = self._count(transaction, table)
        transaction.execute(f'INSERT OR IGNORE INTO "{table.name}" SELECT {casts} FROM staged_rows')
        inserted = self._count(transaction, table) - before
        transaction.unregister("staged_rows")
        return inserted

    @staticmethod
    def _count(connection, table: Table) -> int:
        return connection.execute(f'SELECT count(*) FROM "{table.name}"').fetchall()[0][0]

    def counts(self) -> Dict[str, int]:
        with self.connect() as connection:
            return {name: self._count(connection, table) for name, table in TABLES.items()}

    def query(self, sql: str, parameters: Iterable = ()) -> list:
        with self.connect() as connection:
            return connection.execute(sql, list(parameters)).fetchall()

    def read_seed(self, configs: ConfigSet, tests: Optional[Collection[str]] = None) -> HistorySeed:
        """The history state that earlier invocations left behind (``sinks/seed.py``); of ``tests`` only, when
        named (and of the runs a drain left open)."""
        return read_history_seed(configs, self.query, DUCKDB_SQL, tests=tests)

    def stored_tests(self) -> int:
        """How many tests have a stored run."""
        return self.query(f'SELECT count(DISTINCT "test_name") FROM "{JOB_HISTORY.name}"')[0][0]

