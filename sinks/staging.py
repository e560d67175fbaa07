"""The replay's local sinks in two halves: workers stage rows in files, the launching process loads them.

An embedded DuckDB file takes one writing process at a time, and the alerts file is appended to. A runner may run
the graph's steps in other processes (FnApiRunner with ``--direct_running_mode=multi_processing``, Beam's
DirectRunner picking a runner, a Dataflow-like worker pool), so no step writes the store itself: each bundle's
rows go to a JSONL shard of their own under a staging directory (written whole, then renamed into place), and
once the pipeline is done the process that launched it loads every shard into the store (``INSERT OR IGNORE`` on
each table's key), all tables and the record of the alerts file's lines in one transaction
(:func:`commit_staged`), and then completes the alerts file from that record (``sinks.alerts_file``). A retried
bundle writes its rows again, and the keys drop the copies. Rows are loaded in a canonical order, so which copy
of a key wins never depends on bundles.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import uuid
from typing import Any, Dict, List, Sequence, Set, Tuple

import apache_beam as beam
import orjson
from apache_beam import PCollection

from core.schema import ALERT_LINES, ALERT_UPDATES, ALERTS, TABLES, Table
from sinks.alerts_file import alert_json, line_key
from sinks.crash_points import crash_point
from sinks.duckdb_store import DuckDBStore

LOAD_CHUNK_ROWS = 50_000  # rows per INSERT when loading: bounds the Arrow staging table's memory


def canonical(row: dict) -> str:
    """A row's text in the shards: its JSON with sorted keys, as ``json.dumps(row, sort_keys=True,
    separators=(",", ":"))`` writes it (the shards' order and which copy of a key wins follow this text).
    orjson writes the same text at a seventh of the CPU (0.6 µs a row against 4.6) for a flat row of ASCII text
    (not DEL, which json escapes), 64-bit ints and finite floats not below 1e-4 in size (json writes ``1e-05``,
    orjson ``0.00001``; both write ``1e+16``); any other row is written by ``json``."""
    try:
        text = orjson.dumps(row, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # (orjson.JSONEncodeError): an int beyond 64 bits, a type orjson does not write
        return _json_canonical(row)
    if text.isascii() and b"\x7f" not in text and all(map(_written_alike, row.values())):
        return text.decode("ascii")
    return _json_canonical(row)


def _json_canonical(row: dict) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def _written_alike(value: Any) -> bool:
    """Whether orjson and json write a row's value alike (given the text is ASCII without DEL)."""
    if isinstance(value, float):
        return value == 0 or 1e-4 <= abs(value) < math.inf  # (NaN compares False: json writes NaN, orjson null)
    return not isinstance(value, (dict, list, tuple))


def _row_of(line: str) -> dict:
    """A shard line's row, as ``json.loads`` reads it: orjson reads the same values at a quarter of the CPU. It
    refuses NaN and reads an int of more than 64 bits as a float, so ``json`` reads a line it refuses or with a
    run of 19 digits or more."""
    if _LONG_DIGITS.search(line) is None:
        try:
            return orjson.loads(line)  # type: ignore[no-any-return]
        except orjson.JSONDecodeError:
            pass
    return json.loads(line)  # type: ignore[no-any-return]


_LONG_DIGITS = re.compile(r"[0-9]{19}")


class StageRows(beam.PTransform[PCollection[Dict[str, Any]], None]):
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


def staged_rows(directory: str, name: str) -> List[dict]:
    """Every complete shard's rows of ``name`` under a staging directory, distinct, in canonical order."""
    lines: Set[str] = set()
    for path in glob.glob(os.path.join(directory, name, "*.jsonl")):
        with open(path, encoding="utf-8") as f:
            lines.update(line.rstrip("\n") for line in f if line.strip())
    return [_row_of(line) for line in sorted(lines)]


def alert_line_records(raised: List[dict], updates: List[dict]) -> List[List[dict]]:
    """The ``alert_lines`` rows of the staged alerts: as raised (section 0), then announced again with a triage
    state (section 1); within each, one row per alert id and state, the last staged copy winning."""
    sections = []
    for section, rows in enumerate((raised, updates)):
        by_key = {line_key(row): row for row in rows}
        sections.append([{"alert_id": alert_id, "state": state, "section": section, "created_at": row["created_at"],
                          "line": alert_json(row)} for (alert_id, state), row in by_key.items()])
    return sections


def commit_staged(directory: str, store: DuckDBStore, also: Sequence[Tuple[Table, List[dict]]] = ()) -> Dict[str, int]:
    """Loads the staged rows of every table, the record of the lines the alerts file must hold, and the rows of
    ``also`` (the store's own tables: ``sinks.replayed_files``) into the store in one transaction; returns the
    rows inserted per output table. A kill before the commit leaves the store as it was; after it, everything is
    there (``sinks.crash_points`` names the instants in between)."""
    inserted = {}
    raised: List[dict] = []
    crash_point("commit.begin")
    with store.transaction() as transaction:
        for name, table in TABLES.items():
            rows = staged_rows(directory, name)
            if name == ALERTS.name:
                raised = rows  # read once: the alerts table and the alerts file's record
            inserted[name] = sum(store.insert(table, rows[i:i + LOAD_CHUNK_ROWS], transaction)
                                 for i in range(0, len(rows), LOAD_CHUNK_ROWS))
            crash_point(f"commit.{name}")
        records = alert_line_records(raised, staged_rows(directory, ALERT_UPDATES))
        for section in records:  # the raised lines first: an update never shadows them
            store.insert(ALERT_LINES, section, transaction)
        for table, rows in also:
            store.insert(table, rows, transaction)
        crash_point("commit.alert_lines")
    crash_point("commit.done")
    return inserted


def recorded_alert_lines(store: DuckDBStore) -> List[tuple]:
    """Every line the alerts file must hold, as ``(alert_id, state, line)`` in the file's order: the alerts as
    raised, oldest first, then the ones announced again with a triage state."""
    return store.query('SELECT alert_id, state, line FROM alert_lines ORDER BY section, created_at, alert_id, state')
