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
import time
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


REQUEST_TIMEOUT_SECONDS = 60.0  # one HTTP request to BigQuery; a request that times out is retried
TOOL_TIMEOUT_SECONDS = 60.0  # the tools' bound on each BigQuery call, retries included (--bigquery_timeout_seconds)


def bounded_query(client: Any, sql: str, timeout_seconds: Optional[float]) -> List[tuple]:
    """The rows of ``sql`` on a BigQuery client within ``timeout_seconds``, retries included (None: the
    client's defaults, which wait as long as it takes). Transient errors (rate limits, 5xx, a connection
    refused or reset, a request without an answer after ``REQUEST_TIMEOUT_SECONDS``) are retried with backoff
    within it, as the client's ``DEFAULT_RETRY`` decides; past it the client's ``RetryError`` (or
    ``DeadlineExceeded``) says the endpoint did not answer; anything else fails at once."""
    if timeout_seconds is None:
        return [tuple(row.values()) for row in client.query(sql).result()]
    from google.cloud.bigquery.retry import DEFAULT_JOB_RETRY, DEFAULT_RETRY

    deadline = time.monotonic() + timeout_seconds
    # job_retry=None here: the client would otherwise wrap the job's creation in a retry of its own, with
    # a deadline of its own (minutes). A job that fails for a transient reason is re-run by result() below.
    job = client.query(sql, retry=DEFAULT_RETRY.with_timeout(timeout_seconds),
                       timeout=min(REQUEST_TIMEOUT_SECONDS, timeout_seconds), job_retry=None)
    remaining = max(0.001, deadline - time.monotonic())
    rows = job.result(retry=DEFAULT_RETRY.with_timeout(remaining), timeout=remaining,
                      job_retry=DEFAULT_JOB_RETRY.with_timeout(remaining))
    return [tuple(row.values()) for row in rows]


def bounded_call(timeout_seconds: float) -> dict:
    """The ``retry`` and ``timeout`` arguments that bound one BigQuery API call (not a query) to
    ``timeout_seconds``, retries included."""
    from google.cloud.bigquery.retry import DEFAULT_RETRY

    return {"retry": DEFAULT_RETRY.with_timeout(timeout_seconds),
            "timeout": min(REQUEST_TIMEOUT_SECONDS, timeout_seconds)}


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


def open_bigquery(project: Optional[str], dataset: str, endpoint: Optional[str] = None,
                  timeout_seconds: Optional[float] = TOOL_TIMEOUT_SECONDS) -> StoreReader:
    """The trainguard tables of a BigQuery dataset (``project`` None: the client's default project), each
    query bounded by ``timeout_seconds`` (:func:`bounded_query`)."""
    client = bigquery_client(project, endpoint)

    def query(sql: str) -> List[tuple]:
        return bounded_query(client, sql, timeout_seconds)

    return StoreReader(query, bigquery_dialect(client.project, dataset), client.close,
                       f"{client.project}.{dataset}")


OPTION_ENVIRONMENT = {  # option -> the environment variable that gives its default, in every tool that has it
    "local_store": "TRAINGUARD_LOCAL_STORE",
    "bigquery_project": "TRAINGUARD_BIGQUERY_PROJECT",
    "bigquery_dataset": "TRAINGUARD_BIGQUERY_DATASET",
    "topic": "TRAINGUARD_TOPIC",  # trainguard-triage's
}


def from_environment(option: str, default: Optional[str] = None) -> Optional[str]:
    """An option's default: its ``TRAINGUARD_*`` environment variable (:data:`OPTION_ENVIRONMENT`) when set and not
    empty, else ``default``. A flag on the command line wins over both."""
    return os.environ.get(OPTION_ENVIRONMENT[option]) or default


def environment_note(option: str) -> str:
    """The help text's mention of the variable that gives an option's default: `` [TRAINGUARD_...]``."""
    return f" [{OPTION_ENVIRONMENT[option]}]"


def add_store_options(group: Any) -> None:
    """The command-line options that name a store, one spelling for every tool (an argparse parser or group);
    their defaults come from the environment (:func:`from_environment`)."""
    group.add_argument("--local_store", default=from_environment("local_store", locations.LOCAL_STORE),
                       help="DuckDB store the replay wrote" + environment_note("local_store"))
    group.add_argument("--bigquery_project", default=from_environment("bigquery_project"),
                       help="project of --bigquery_dataset (none: the client's default project)"
                            + environment_note("bigquery_project"))
    group.add_argument("--bigquery_dataset", default=from_environment("bigquery_dataset"),
                       help="read this BigQuery dataset instead" + environment_note("bigquery_dataset"))
    group.add_argument("--bigquery_endpoint", default=None,
                       help="another BigQuery API endpoint, e.g. an emulator (anonymous credentials)")
    group.add_argument("--bigquery_timeout_seconds", type=float, default=TOOL_TIMEOUT_SECONDS,
                       help="bound on each BigQuery query, retries included: an endpoint that refuses or does "
                            "not answer fails after this long")


def open_store(args: argparse.Namespace) -> StoreReader:
    """The store the options of :func:`add_store_options` name; FileNotFoundError with a line for the user."""
    if args.bigquery_dataset:
        return open_bigquery(args.bigquery_project, args.bigquery_dataset, args.bigquery_endpoint,
                             args.bigquery_timeout_seconds)
    try:
        return open_duckdb(args.local_store)
    except FileNotFoundError:
        raise FileNotFoundError(f"no store at {args.local_store!r}: run the pipeline first, or name it with "
                                "--local_store (or --bigquery_dataset)") from None
