"""The replay's local sinks in two halves: workers stage rows in files, the launching process loads them.

An embedded DuckDB file takes one writing process at a time, and the alerts file is appended to. A runner may run
the graph's steps in other processes (FnApiRunner with ``--direct_running_mode=multi_processing``, Beam's
DirectRunner picking a runner, a Dataflow-like worker pool), so no step writes the store itself: each bundle's
rows go to a JSONL shard of their own under a staging directory (written whole, then renamed into place), and
once the pipeline is done the process that launched it loads every shard into the store (``INSERT OR IGNORE`` on
each table's key) and appends the new alerts to the alerts file. A retried bundle writes its rows again, and the
keys drop the copies. Rows are loaded in a canonical order, so which copy of a key wins never depends on bundles.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from typing import Dict, List, Sequence, Union

import apache_beam as beam

from core.schema import ALERT_UPDATES, ALERTS, TABLES
from sinks.alerts_file import append_alerts
from sinks.duckdb_store import DuckDBStore

LOAD_CHUNK_ROWS = 50_000  # rows per INSERT when loading: bounds the Arrow staging table's memory


def canonical(row: dict) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


class StageRows(beam.PTransform):
    """Row dicts -> JSONL shards under ``directory/<name>/``, one per bundle, visible only once complete."""

    def __init__(self, directory: str, name: str):
        super().__init__()
        self.directory = os.path.join(directory, name)

    def expand(self, rows):
        return rows | "WriteShards" >> beam.ParDo(_WriteShardFn(self.directory))


class _WriteShardFn(beam.DoFn):
    def __init__(self, directory: str):
        self.directory = directory
        self.rows: List[str] = []

    def start_bundle(self):
        self.rows = []

    def process(self, row: dict):
        self.rows.append(canonical(row))

    def finish_bundle(self):
        if not self.rows:
            return
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, uuid.uuid4().hex)
        with open(path + ".partial", "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in self.rows)
        os.replace(path + ".partial", path + ".jsonl")
        self.rows = []


def staged_rows(directories: Union[str, Sequence[str]], name: str) -> List[dict]:
    """Every complete shard's rows of ``name`` under one staging directory or several, distinct, in canonical
    order."""
    lines = set()
    for directory in [directories] if isinstance(directories, str) else directories:
        for path in glob.glob(os.path.join(directory, name, "*.jsonl")):
            with open(path, encoding="utf-8") as f:
                lines.update(line.rstrip("\n") for line in f if line.strip())
    return [json.loads(line) for line in sorted(lines)]


def load_staged_tables(directory: str, store_path: str) -> Dict[str, int]:
    """Loads the staged rows of every table into the store; returns the rows inserted per table."""
    store = DuckDBStore(store_path)
    try:
        inserted = {}
        for name, table in TABLES.items():
            rows = staged_rows(directory, name)
            inserted[name] = sum(store.insert(table, rows[i:i + LOAD_CHUNK_ROWS])
                                 for i in range(0, len(rows), LOAD_CHUNK_ROWS))
    finally:
        store.close()
    return inserted


def append_staged_alerts(directories: Union[str, Sequence[str]], alerts_file: str) -> None:
    """Appends the staged alerts to the alerts file: as raised first, then the ones announced again with a
    triage state (a line per alert and state), each in canonical order across all ``directories``."""
    for name in (ALERTS.name, ALERT_UPDATES):
        append_alerts(alerts_file, staged_rows(directories, name))
