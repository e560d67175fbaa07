"""Reading a store without Beam: a DuckDB file or a BigQuery dataset, behind one query function.

The tools that read what the pipeline wrote (``trainguard-triage``, the backtest,
the report) and the pipeline's start-up seed share the queries of
``sinks.seed``; this module only opens a store and says how its SQL dialect
spells names and times. Nothing here imports Apache Beam, so the tools start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Callable, List, Optional

from core import locations
from sinks.seed import Query, SqlDialect, backslash_string

DUCKDB_SQL = SqlDialect(quote=lambda name: f'"{name}"', table=lambda table: f'"{table.name}"',
                        epoch_seconds=lambda expression: f"epoch({expression})")


def bigquery_dialect(project: str, dataset: str) -> SqlDialect:
    """Standard SQL on ``project.dataset``."""
    return SqlDialect(quote=lambda name: f"`{name}`",
                      table=lambda table: f"`{project}.{dataset}.{table.name}`",
                      epoch_seconds=lambda expression: f"UNIX_MICROS({expression}) / 1000000",
                      string=backslash_string)


def bigquery_client(project: Optional[str], endpoint: Optional[str] = None):
    """A ``google.cloud.bigquery.Client``; with ``endpoint`` (an emulator) anonymous credentials."""
    from google.cloud import bigquery

    if endpoint is None:
        return bigquery.Client(project=project)
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return bigquery.Client(project=project, credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=endpoint))


@dataclasses.dataclass
class StoreReader:
    """One open store: run SQL in its dialect, then close it."""
    query: Query
    dialect: SqlDialect
    close: Callable[[], None]
    name: str  # for messages: the file, or project.dataset


def open_duckdb(path: str) -> StoreReader:
    """The local store, read-only; the file must exist."""
    import duckdb

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no DuckDB store at {path!r}")
    connection = duckdb.connect(path, read_only=True)

    def query(sql: str) -> List[tuple]:
        return connection.execute(sql).fetchall()

    return StoreReader(query, DUCKDB_SQL, connection.close, path)


def open_bigquery(project: Optional[str], dataset: str, endpoint: Optional[str] = None) -> StoreReader:
    """The trainguard tables of a BigQuery dataset (``project`` None: the client's default project)."""
    client = bigquery_client(project, endpoint)

    def query(sql: str) -> List[tuple]:
        return [tuple(row.values()) for row in client.query(sql).result()]

    return StoreReader(query, bigquery_dialect(client.project, dataset), client.close,
                       f"{client.project}.{dataset}")


def add_store_options(group: Any) -> None:
    """The command-line options that name a store, one spelling for every tool (an argparse parser or group)."""
    group.add_argument("--local_store", default=locations.LOCAL_STORE, help="DuckDB store the replay wrote")
    group.add_argument("--bigquery_project", default=None,
                       help="project of --bigquery_dataset (none: the client's default project)")
    group.add_argument("--bigquery_dataset", default=None, help="read this BigQuery dataset instead")
    group.add_argument("--bigquery_endpoint", default=None,
                       help="another BigQuery API endpoint, e.g. an emulator (anonymous credentials)")


def open_store(args: argparse.Namespace) -> StoreReader:
    """The store the options of :func:`add_store_options` name; FileNotFoundError with a line for the user."""
    if args.bigquery_dataset:
        return open_bigquery(args.bigquery_project, args.bigquery_dataset, args.bigquery_endpoint)
    try:
        return open_duckdb(args.local_store)
    except FileNotFoundError:
        raise FileNotFoundError(f"no store at {args.local_store!r}: run the pipeline first, or name it with "
                                "--local_store (or --bigquery_dataset)") from None
