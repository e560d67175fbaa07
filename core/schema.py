"""The output tables, defined once for every sink (DuckDB locally, BigQuery in production)."""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str  # BigQuery standard SQL type: STRING, FLOAT64, INT64, BOOL, TIMESTAMP
    required: bool = False
    description: str = ""


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    columns: Tuple[Column, ...]
    key: Tuple[str, ...]      # what makes a row unique: re-processing never duplicates it
    time_column: str          # partitioning column in BigQuery
    cluster_by: Tuple[str, ...] = ("test_name",)
    # Columns the local store indexes, so that reading one value's rows (a run's) does not scan the table: DuckDB's
    # zone maps skip little of a table written in time order. BigQuery clusters by ``cluster_by`` instead.
    looked_up_by: Tuple[str, ...] = ()

    @property
    def column_names(self) -> Tuple[str, ...]:
        return tuple(c.name for c in self.columns)


JOB_HISTORY = Table("job_history", (
    Column("run_id", "STRING", True),
    Column("test_name", "STRING", True),
    Column("job_status", "STRING", True, "success, failure, timeout or missing; interrupted: open when its job "
           "was drained, until a later job ends it (see README, What survives)"),
    Column("num_failures", "INT64"),
    Column("start_time", "TIMESTAMP"),
    Column("timestamp", "TIMESTAMP", True, "end of the run (last activity for a missing run)"),
    Column("job_duration_sec", "FLOAT64"),
    Column("processed_at", "TIMESTAMP", True, "event time at which the pipeline finalized the run"),
    Column("events", "STRING", False, "JSON list of the run's events"),
    Column("out_of_order", "BOOL", False, "true: a back-filled run, checked when it arrived, out of event-time "
           "order (see README, Back-fills); NULL in rows written before this column existed"),
), key=("test_name", "run_id"), time_column="timestamp", looked_up_by=("run_id",))

METRIC_HISTORY = Table("metric_history", (
    Column("run_id", "STRING", True),
    Column("test_name", "STRING", True),
    Column("metric_name", "STRING", True),
    Column("metric_value", "FLOAT64", True),
    Column("metric_lower_bound", "FLOAT64", False, "NULL where unbounded below or unchecked"),
    Column("metric_upper_bound", "FLOAT64", False, "NULL where unbounded above or unchecked"),
    Column("within_bounds", "BOOL", False, "NULL where not checked"),
    Column("timestamp", "TIMESTAMP", True, "end of the run"),
    Column("step", "INT64"),
    Column("out_of_order", "BOOL", False, "true: a back-filled run, checked when it arrived, out of event-time "
           "order (see README, Back-fills); NULL in rows written before this column existed"),
    Column("history_segment", "STRING", False, "the baseline that judged the value, e.g. accelerator=v5e, for a "
           "test with history_by; NULL for a test with one history per metric"),
), key=("test_name", "run_id", "metric_name"), time_column="timestamp", looked_up_by=("run_id",))

ALERTS = Table("alerts", (
    Column("alert_id", "STRING", True, "deterministic: re-processing yields the same id"),
    Column("kind", "STRING", True),
    Column("test_name", "STRING", True),
    Column("run_id", "STRING", True),
    Column("metric_name", "STRING"),
    Column("value", "FLOAT64"),
    Column("lower_bound", "FLOAT64"),
    Column("upper_bound", "FLOAT64"),
    Column("message", "STRING", True),
    Column("created_at", "TIMESTAMP", True, "event time of the check that raised it"),
    Column("details", "STRING", False, "JSON: comparison, history size, run data, ..."),
), key=("alert_id",), time_column="created_at", looked_up_by=("run_id",))

DEAD_LETTER = Table("dead_letter", (
    Column("received_at", "TIMESTAMP", False, "publish time where known"),
    Column("reason", "STRING", True),
    Column("payload", "STRING", True, "the raw payload; invalid UTF-8 as \\xNN escapes"),
    Column("source", "STRING", True),
    Column("dead_letter_id", "STRING", True, "hash of source, reason and payload"),
), key=("dead_letter_id",), time_column="received_at", cluster_by=("source",))

METRIC_WINDOWS = Table("metric_windows", (
    Column("run_id", "STRING", True),
    Column("test_name", "STRING", True),
    Column("tag", "STRING", True),
    Column("window_kind", "STRING", True, "count, time or count_or_time"),
    Column("window_index", "INT64", True, "count kinds: 0, 1, ... per run; time: start // period"),
    Column("revision", "INT64", True, "0, then +1 each time a late point updates the window; use the highest"),
    Column("partial", "BOOL", True, "closed by the end of the run before it was full"),
    Column("start_time", "TIMESTAMP", True),
    Column("end_time", "TIMESTAMP", True),
    Column("start_step", "INT64"),
    Column("end_step", "INT64"),
    Column("n", "INT64", True, "points in the window"),
    Column("last", "FLOAT64"),
    Column("mean", "FLOAT64"),
    Column("min", "FLOAT64"),
    Column("max", "FLOAT64"),
    Column("sum", "FLOAT64"),
    Column("stddev", "FLOAT64", False, "population standard deviation"),
    Column("p50", "FLOAT64", False, "exact percentiles, linear interpolation"),
    Column("p90", "FLOAT64"),
    Column("p99", "FLOAT64"),
    Column("histogram", "STRING", False, 'JSON {"edges": [11 floats], "counts": [10 ints]}'),
    Column("history_segment", "STRING", False, "the history its checks compared it with, e.g. accelerator=v5e, "
           "for a tag whose window checks have history_by; NULL for a tag with one history"),
), key=("test_name", "run_id", "tag", "window_kind", "window_index", "revision"), time_column="end_time")

TRIAGE = Table("triage", (
    Column("action_id", "STRING", True, "the control message's id"),
    Column("action", "STRING", True, "accept, dismiss or mute"),
    Column("test_name", "STRING", True),
    Column("metric_name", "STRING", False, "accept: the metric; dismiss: the alert's; mute: NULL for every metric"),
    Column("run_id", "STRING", False, "accept: the first run at the new level; dismiss: the alert's run"),
    Column("alert_id", "STRING", False, "dismiss: the alert"),
    Column("alert_kind", "STRING", False, "dismiss: the alert's kind"),
    Column("alert_instance", "STRING", False, "dismiss: the alert's instance (a window's kind/index)"),
    Column("until", "TIMESTAMP", False, "mute: the end of the quiet period"),
    Column("note", "STRING", False),
    Column("author", "STRING", False, "who said it"),
    Column("created_at", "TIMESTAMP", True, "event time of the action"),
    Column("future", "BOOL", False, "accept: TRUE when its run may be still going or to come (--allow_future); "
           "NULL: an accept stored before the column, which waited for its run"),
), key=("action_id",), time_column="created_at")

RANK_METRICS = Table("rank_metrics", (
    Column("run_id", "STRING", True),
    Column("test_name", "STRING", True),
    Column("metric_name", "STRING", True),
    Column("rank", "INT64", True, "the worker of a distributed run"),
    Column("metric_value", "FLOAT64", True, "this rank's value, before the reduction across ranks"),
    Column("step", "INT64"),
    Column("timestamp", "TIMESTAMP", True, "end of the run"),
), key=("test_name", "run_id", "metric_name", "rank"), time_column="timestamp", looked_up_by=("run_id",))

# Not a table: alerts announced again with a new triage state (``core.triage``), for the alerts file and topic.
ALERT_UPDATES = "alert_updates"

TABLES: Dict[str, Table] = {t.name: t for t in (JOB_HISTORY, METRIC_HISTORY, ALERTS, DEAD_LETTER, METRIC_WINDOWS,
                                                 TRIAGE, RANK_METRICS)}

# The local store's record of what its alerts file must hold (``sinks.alerts_file``): committed with the rows in
# one transaction, so that the file can always be completed from the store. Not a BigQuery table: there the
# alerts go to a topic.
ALERT_LINES = Table("alert_lines", (
    Column("alert_id", "STRING", True),
    Column("state", "STRING", True, "the triage state the line announces the alert in"),
    Column("section", "INT64", True, "0: raised; 1: announced again with a new triage state"),
    Column("created_at", "STRING", True, "the alert's created_at as written in the line"),
    Column("line", "STRING", True, "the line, without its newline"),
), key=("alert_id", "state"), time_column="created_at", cluster_by=("alert_id",))
# The local store's record of the files replayed into it (``sinks.replayed_files``): how many of a file's bytes
# were read, their digest, and under which configs, lifecycle and version, committed with the replay's last rows.
# A rerun does not read those bytes again while they are unchanged. Not a BigQuery table: a streaming job reads
# a subscription.
REPLAYED_FILES = Table("replayed_files", (
    Column("path", "STRING", True, "the file's real absolute path (a dead letter's source names it)"),
    Column("identity", "STRING", True, "digest of what decides a line's fate: configs, lifecycle options, version"),
    Column("bytes", "INT64", True, "the file's first bytes that were read, up to the end of a line"),
    Column("sha256", "STRING", True, "their digest"),
), key=("path", "identity", "bytes", "sha256"), time_column="", cluster_by=("path",))
LOCAL_TABLES: Dict[str, Table] = {**TABLES, ALERT_LINES.name: ALERT_LINES, REPLAYED_FILES.name: REPLAYED_FILES}
