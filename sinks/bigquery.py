"""BigQuery: the production store, with the same tables as the local DuckDB store.

Every table comes from ``core/schema.py`` (one definition for both stores):
created if missing with its explicit schema, partitioned by day on its time
column and clustered by its ``cluster_by`` columns. Rows are written with
Beam's ``WriteToBigQuery`` (streaming inserts, the portable default, or the
Storage Write API on Dataflow); rows BigQuery rejects come back with
BigQuery's error and go to the ``dead_letter`` table, so nothing is lost.
At start-up the pipeline reads its ``HistorySeed`` back from the tables
(``ReadSeedFromBigQuery``), so a new job continues where the last one stopped:
the tables' queries at once, each bounded in time with transient errors
retried, and a failure one line naming the table (``BigQueryStore``).

``BigQueryTarget.endpoint`` points every client (ours and Beam's, through its
``test_client`` hook) at another BigQuery API endpoint, such as a local
emulator, with anonymous credentials.

The tables' schemas come from ``sinks/bigquery_schema.py``, which
``run_dataflow.sh`` runs (without Beam) to create them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import time
from typing import Any, Callable, Dict, List, Optional

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.io.gcp.bigquery import BigQueryDisposition, WriteToBigQuery
from apache_beam.io.gcp.bigquery_tools import RetryStrategy
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.pvalue import PBegin
from apache_beam.utils.timestamp import Timestamp

from core.config import ConfigSet
from core.history import HistorySeed
from core.records import dead_letter_row
from core.schema import DEAD_LETTER, TABLES, Table
from core.vocabulary import WriteMethod
from sinks import stores
from sinks.bigquery_schema import schema_json
from sinks.dataflow_job import DataflowJob, cancel_this_job
from sinks.seed import (
    SEED_ATTEMPTS,
    SEED_RETRY_WAIT_SECONDS,
    SEED_TIMEOUT_SECONDS,
    SeedReadError,
    SqlDialect,
    read_history_seed,
)
from sinks.stores import bounded_call, bounded_query
from trainguard.cli import error_line

SEED_QUERY_WORKERS = 6        # the seed's queries run at once: one thread each

_LOGGER = logging.getLogger(__name__)

WRITE_METHODS = {WriteMethod.STREAMING_INSERTS: WriteToBigQuery.Method.STREAMING_INSERTS,
                 WriteMethod.STORAGE_WRITE_API: WriteToBigQuery.Method.STORAGE_WRITE_API}


@dataclasses.dataclass(frozen=True)
class BigQueryTarget:
    """Where the tables live, and which BigQuery API endpoint serves them."""
    project: str
    dataset: str
    endpoint: Optional[str] = None  # e.g. "http://127.0.0.1:9050" for an emulator; None: Google's
    location: Optional[str] = None  # of the dataset, when it has to be created

    def table_id(self, table: Table) -> str:
        """``project.dataset.table``: the client library's and SQL's form."""
        return f"{self.project}.{self.dataset}.{table.name}"

    def table_spec(self, table: Table) -> str:
        """``project:dataset.table``: Beam's form."""
        return f"{self.project}:{self.dataset}.{table.name}"

    def client(self):
        """A ``google.cloud.bigquery.Client`` for this target (anonymous credentials with an endpoint)."""
        from google.cloud import bigquery

        if self.endpoint is None:
            return bigquery.Client(project=self.project)
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        return bigquery.Client(project=self.project, credentials=AnonymousCredentials(),
                               client_options=ClientOptions(api_endpoint=self.endpoint))

    def beam_test_client(self) -> Optional[EndpointClient]:
        """What to pass as ``WriteToBigQuery(test_client=...)``: None for Google's endpoint."""
        return None if self.endpoint is None else EndpointClient(self)


class EndpointClient:
    """Beam's ``test_client`` for a BigQuery endpoint of our choosing (e.g. an emulator).

    ``WriteToBigQuery`` calls ``insert_rows_json`` on its ``test_client``
    instead of on a client of its own. The DoFn holding it is pickled to the
    workers, and a live client is not picklable, so this wrapper pickles as
    its ``BigQueryTarget`` and builds the real client on first use.
    """

    def __init__(self, target: BigQueryTarget):
        self._target = target
        self._client = None

    def __getstate__(self):
        return {"_target": self._target, "_client": None}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._client is None:
            self._client = self._target.client()
        return getattr(self._client, name)


# --------------------------------------------------------------------------
# Schemas and table creation
# --------------------------------------------------------------------------


def ensure_tables(target: BigQueryTarget, tables=tuple(TABLES.values()),
                  timeout_seconds: float = SEED_TIMEOUT_SECONDS) -> List[str]:
    """Creates the dataset and every missing table; returns the ids of the tables it created.

    Tables get their explicit schema, daily partitioning on the time column
    and clustering; an existing table only gets the nullable columns it lacks.
    Each API call is bounded by ``timeout_seconds``, retries included (the client's own default retries a
    refused connection for 10 minutes).
    """
    from google.api_core.exceptions import Conflict
    from google.cloud import bigquery

    client = target.client()
    dataset = bigquery.Dataset(f"{target.project}.{target.dataset}")
    if target.location:
        dataset.location = target.location
    bound = bounded_call(timeout_seconds)
    client.create_dataset(dataset, exists_ok=True, **bound)
    created = []
    for table in tables:
        resource = bigquery.Table(target.table_id(table),
                                  schema=[bigquery.SchemaField.from_api_repr(f) for f in schema_json(table)])
        resource.time_partitioning = bigquery.TimePartitioning(
            type_=bigquery.TimePartitioningType.DAY, field=table.time_column)
        resource.clustering_fields = list(table.cluster_by)
        resource.description = f"trainguard {table.name}; key: {', '.join(table.key)}"
        try:
            client.create_table(resource, **bound)
            created.append(resource.table_id)
        except Conflict:
            _add_missing_columns(client, target.table_id(table), resource.schema, bound)
    return created


def _add_missing_columns(client, table_id: str, schema, bound: dict) -> None:
    """Appends the NULLABLE columns a table created by an older version lacks (BigQuery allows that change in
    place; its old rows read NULL there)."""
    existing = client.get_table(table_id, **bound)
    names = {field.name for field in existing.schema}
    missing = [field for field in schema if field.name not in names and field.mode == "NULLABLE"]
    if missing:
        existing.schema = list(existing.schema) + missing
        client.update_table(existing, ["schema"], **bound)


# --------------------------------------------------------------------------
# Start-up seed
# --------------------------------------------------------------------------


def bigquery_dialect(target: BigQueryTarget) -> SqlDialect:
    return stores.bigquery_dialect(target.project, target.dataset)


class BigQueryStore:
    """Queries on the trainguard tables of one BigQuery dataset.

    Each query is bounded by ``timeout_seconds`` (None: the client's defaults, which wait as long as it takes):
    transient errors (rate limits, 5xx, a connection reset, a request without an answer after
    ``sinks.stores.REQUEST_TIMEOUT_SECONDS``) are retried with exponential backoff within it, as the BigQuery client's own
    ``DEFAULT_RETRY`` decides; anything else (a query BigQuery refuses, a table that does not exist) fails at once.
    """

    def __init__(self, target: BigQueryTarget, timeout_seconds: Optional[float] = SEED_TIMEOUT_SECONDS):
        self.target = target
        self.timeout_seconds = timeout_seconds
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.target.client()
        return self._client

    def query(self, sql: str) -> List[tuple]:
        return bounded_query(self.client, sql, self.timeout_seconds)

    def read_seed(self, configs: ConfigSet, stored_since: Optional[float] = None) -> HistorySeed:
        """The history state that earlier jobs left behind (the same seed as ``DuckDBStore.read_seed``): the
        tables' queries at once, each within ``timeout_seconds``; ``sinks.seed.SeedReadError`` names the table
        whose query failed or did not answer in time, and why. ``stored_since``: see ``read_history_seed``."""
        self.client  # noqa: B018 - made once, before the queries' threads share it
        return read_history_seed(configs, self.query, bigquery_dialect(self.target), workers=SEED_QUERY_WORKERS,
                                 timeout_seconds=self.timeout_seconds, stored_since=stored_since)


def check_seed(target: BigQueryTarget, configs: ConfigSet, timeout_seconds: float = SEED_TIMEOUT_SECONDS) -> int:
    """Tries the start-up seed before a job is launched, so that a seed the job could not read stops the launch
    instead of the job: a dry run of each of its queries (BigQuery parses and plans it and checks the tables and
    the caller's right to query them; nothing is read or billed), then a read of one row of each table they
    read (the right to read the data), each call within ``timeout_seconds``. Returns the bytes the seed's
    queries will scan (the dry runs' estimate). Raises ``SeedReadError`` naming the table and the cause.

    The launcher's credentials are not the workers': a worker service account without the rights still fails
    in the job, where the seed step stops it (``ReadSeedFromBigQuery``)."""
    from google.cloud import bigquery

    sql = bigquery_dialect(target)
    queries: List[str] = []

    def record(text: str) -> List[Any]:
        queries.append(text)
        return []

    read_history_seed(configs, record, sql)  # the queries, recorded, not run
    client = target.client()
    bound = bounded_call(timeout_seconds)
    scanned = 0
    for text in queries:
        try:
            job = client.query(text, job_config=bigquery.QueryJobConfig(dry_run=True, use_query_cache=False),
                               job_retry=None, **bound)
        except Exception as error:  # re-raised as one line naming the tables
            named = " and ".join(target.table_id(table) for table in _tables_read(text, sql))
            raise SeedReadError(f"cannot read the history seed: the dry run of the query of {named} failed: "
                                f"{type(error).__name__}: {error_line(error)}") from error
        scanned += job.total_bytes_processed or 0
    for table in TABLES.values():
        if any(table in _tables_read(text, sql) for text in queries):
            try:
                list(client.list_rows(target.table_id(table), max_results=1, **bound))
            except Exception as error:  # re-raised as one line naming the table
                raise SeedReadError(f"cannot read the history seed: reading a row of {target.table_id(table)} "
                                    f"failed: {type(error).__name__}: {error_line(error)}") from error
    return scanned


def _tables_read(query: str, sql: SqlDialect) -> List[Table]:
    """The tables a seed query names."""
    return [table for table in TABLES.values() if sql.table(table) in query]


@dataclasses.dataclass(frozen=True)
class SeedPolicy:
    """How the streaming job's seed step reads the tables: each query's bound, how many times it tries the whole
    seed and how long it waits between tries, which stored runs its index keeps, and which job it cancels when
    it cannot read the seed at all."""
    timeout_seconds: Optional[float] = SEED_TIMEOUT_SECONDS
    attempts: int = SEED_ATTEMPTS
    retry_wait_seconds: float = SEED_RETRY_WAIT_SECONDS
    # retention plus run timeout: the index keeps runs that ended within it of the wall clock (None: every run)
    stored_horizon_seconds: Optional[float] = None
    job: Optional[DataflowJob] = None


class _ReadSeedFn(beam.DoFn):
    def __init__(self, target: BigQueryTarget, configs: ConfigSet, policy: SeedPolicy,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        self.target = target
        self.configs = configs
        self.policy = policy
        self.clock = clock
        self.sleep = sleep

    def process(self, unused_impulse):
        policy = self.policy
        store = BigQueryStore(self.target, policy.timeout_seconds)
        for attempt in range(1, policy.attempts + 1):
            since = None if policy.stored_horizon_seconds is None else self.clock() - policy.stored_horizon_seconds
            try:
                yield store.read_seed(self.configs, stored_since=since)
                return
            except Exception as error:  # noqa: BLE001 - whatever stops the seed: retried, then the job stops
                failure = error if isinstance(error, SeedReadError) else SeedReadError(
                    f"cannot read the history seed: {type(error).__name__}: {error_line(error)}")
            if attempt < policy.attempts:
                wait = policy.retry_wait_seconds * 2 ** (attempt - 1)
                _LOGGER.warning("%s (attempt %d of %d; trying again in %g s)", failure, attempt, policy.attempts,
                                wait)
                self.sleep(wait)
        reason = f"{failure} (attempt {policy.attempts} of {policy.attempts})"
        job_id = cancel_this_job(policy.job, reason)
        raise SeedReadError(reason if job_id is None else f"{reason}; Dataflow job {job_id} cancelled: every "
                            "step waits for the seed, so the job could not run without it") from failure


class ReadSeedFromBigQuery(beam.PTransform[PBegin, PCollection[HistorySeed]]):
    """PBegin -> a one-element PCollection: the ``HistorySeed`` in the BigQuery tables.

    A bounded read at start-up, done by a worker rather than by the launcher,
    so that the seed (which grows with the history) is not embedded in the job
    graph. The graph takes it as a singleton side input.

    Every step of the job waits for it (its watermark hold is the start of
    time), and Dataflow retries a failed streaming step for ever: a seed that
    cannot be read would hold the job silently. So the step tries
    ``policy.attempts`` times, each query bounded by ``policy.timeout_seconds``,
    waiting ``policy.retry_wait_seconds`` (doubling) between tries, and then
    cancels its Dataflow job (``policy.job``) and fails with the reason. On
    another runner it fails with the reason, which stops a local run.
    """

    def __init__(self, target: BigQueryTarget, configs: ConfigSet, policy: SeedPolicy = SeedPolicy(),
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        super().__init__()
        self.target = target
        self.configs = configs
        self.policy = policy
        self.clock = clock
        self.sleep = sleep

    def expand(self, pbegin):
        return (pbegin
                | "Start" >> beam.Impulse()  # not beam.Create: its inner steps are named after a lambda in Beam
                # typed, so that the side input is encoded by the project's coder (transforms.coders), not pickled
                | "ReadTables" >> beam.ParDo(_ReadSeedFn(self.target, self.configs, self.policy, self.clock,
                                                         self.sleep)).with_output_types(HistorySeed))


# --------------------------------------------------------------------------
# Writing rows
# --------------------------------------------------------------------------


def storage_write_row(row: Dict[str, Any], table: Table) -> Dict[str, Any]:
    """A row for the Storage Write API: TIMESTAMP columns as Beam ``Timestamp``s, not ISO strings.

    (Streaming inserts take the rows as they are: BigQuery parses the strings.)
    Unparseable timestamps are left as they are, for BigQuery to reject.
    """
    converted = dict(row)
    for column in table.columns:
        value = converted.get(column.name)
        if column.type == "TIMESTAMP" and isinstance(value, str):
            with contextlib.suppress(ValueError):  # not a timestamp: BigQuery rejects the row, with its reason
                converted[column.name] = Timestamp.from_rfc3339(value)
    return converted


def _jsonable(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return value.to_rfc3339()
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


def rejected_row_to_dead_letter(rejected: Any, table: Table) -> Dict[str, Any]:
    """A row BigQuery refused -> a dead-letter row with BigQuery's error and the row as JSON.

    Streaming inserts report ``(destination, row, [errors])``; the Storage
    Write API ``{"failed_row": row, "error_message": message}``.
    """
    if isinstance(rejected, dict):
        row, error = rejected["failed_row"], rejected["error_message"]
    else:
        _, row, errors = rejected
        error = "; ".join(
            f"{e.get('reason', 'error')}{' at ' + e['location'] if e.get('location') else ''}: {e.get('message', '')}"
            for e in errors) if isinstance(errors, list) else str(errors)
    payload = json.dumps(row, sort_keys=True, default=_jsonable)
    return dead_letter_row(f"rejected by BigQuery ({table.name}): {error}", payload, f"bigquery:{table.name}", None)


class WriteTableToBigQuery(beam.PTransform[PCollection[Dict[str, Any]], PCollection[Dict[str, Any]]]):
    """Row dicts of one table -> that BigQuery table; returns the rows BigQuery rejected, as dead-letter rows.

    The table must exist (``ensure_tables``). Transient errors are retried;
    rows BigQuery calls invalid are not, and come back with its error.
    """

    def __init__(self, target: BigQueryTarget, table: Table, method: str = WriteMethod.STREAMING_INSERTS,
                 storage_write_triggering_seconds: float = 5.0):
        super().__init__()
        if method not in WRITE_METHODS:
            raise ValueError(f"unknown BigQuery write method {method!r}; one of {sorted(WRITE_METHODS)}")
        self.target = target
        self.table = table
        self.method = method
        self.storage_write_triggering_seconds = storage_write_triggering_seconds

    def expand(self, rows):
        table = self.table
        options = {}
        if self.method == WriteMethod.STORAGE_WRITE_API:
            rows = rows | "TimestampsForStorageWrite" >> beam.Map(storage_write_row, table)
            if rows.pipeline.options.view_as(StandardOptions).streaming:
                options = {"triggering_frequency": self.storage_write_triggering_seconds, "with_auto_sharding": True}
        result = rows | "Write" >> WriteToBigQuery(
            self.target.table_spec(table), schema={"fields": schema_json(table)},
            create_disposition=BigQueryDisposition.CREATE_NEVER,
            write_disposition=BigQueryDisposition.WRITE_APPEND,
            method=WRITE_METHODS[self.method],
            insert_retry_strategy=RetryStrategy.RETRY_ON_TRANSIENT_ERROR,
            test_client=self.target.beam_test_client(), **options)
        return result.failed_rows_with_errors | "Rejected" >> beam.Map(rejected_row_to_dead_letter, table)


class _LogLostRowFn(beam.DoFn):
    """Rows the dead_letter table itself rejected: nowhere left to write them but the log."""

    def __init__(self):
        self.lost = beam.metrics.Metrics.counter("trainguard", "dead_letters_rejected_by_bigquery")

    def process(self, row):
        self.lost.inc()
        _LOGGER.error("BigQuery rejected a dead-letter row; it is only in this log: %s",
                      json.dumps(row, sort_keys=True))


class WriteToBigQueryTables(beam.PTransform[Dict[str, PCollection[Dict[str, Any]]], PCollection[Dict[str, Any]]]):
    """The graph's outputs ({table name: row dicts}) -> the BigQuery tables of the same names.

    Rows BigQuery rejects from any table become dead-letter rows (with
    BigQuery's error and the row) and are written to ``dead_letter`` along
    with the graph's own dead letters. Should ``dead_letter`` reject one,
    it is logged as an error.
    """

    def __init__(self, target: BigQueryTarget, method: str = WriteMethod.STREAMING_INSERTS):
        super().__init__()
        self.target = target
        self.method = method

    def expand(self, outputs: Dict[str, beam.PCollection]):
        rejected = [rows | f"Write_{name}" >> WriteTableToBigQuery(self.target, TABLES[name], self.method)
                    for name, rows in outputs.items() if name in TABLES and name != DEAD_LETTER.name]
        dead_letters = ([outputs[DEAD_LETTER.name]] if DEAD_LETTER.name in outputs else []) + rejected
        unwritable = (dead_letters | "AllDeadLetters" >> beam.Flatten()
                      | f"Write_{DEAD_LETTER.name}" >> WriteTableToBigQuery(self.target, DEAD_LETTER, self.method))
        return unwritable | "LogUnwritable" >> beam.ParDo(_LogLostRowFn())
