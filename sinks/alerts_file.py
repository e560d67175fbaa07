"""The local alerts sink: one JSON object per line, the exact payload of the alerts topic."""

from __future__ import annotations

import json
import os
import threading
from typing import Dict, List, Optional, Set, Tuple

import apache_beam as beam

_APPEND_LOCK = threading.Lock()
# The alert ids in each file and the file's (size, mtime) they were read at: re-read only when the file
# changed behind the appenders' backs (every appender in the process keeps the entry up to date).
_KNOWN_IDS: Dict[str, Tuple[Optional[Tuple[int, int]], Set[str]]] = {}


def _version(path: str) -> Optional[Tuple[int, int]]:
    if not os.path.exists(path):
        return None
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def alert_json(row: dict) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def read_alert_ids(path: str) -> Set[str]:
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {json.loads(line)["alert_id"] for line in f if line.strip()}


class _AppendAlertsFn(beam.DoFn):
    def __init__(self, path: str):
        self.path = path
        self.rows: List[dict] = []

    def start_bundle(self):
        self.rows = []

    def process(self, row: dict):
        self.rows.append(row)

    def finish_bundle(self):
        if not self.rows:
            return
        with _APPEND_LOCK:
            cached_version, known = _KNOWN_IDS.get(self.path, (None, None))
            if known is None or cached_version != _version(self.path):
                known = read_alert_ids(self.path)
            unique = {r["alert_id"]: r for r in self.rows if r["alert_id"] not in known}
            fresh = sorted(unique.values(), key=lambda r: (r["created_at"], r["alert_id"]))
            with open(self.path, "a", encoding="utf-8") as f:
                f.writelines(alert_json(r) + "\n" for r in fresh)
            known.update(r["alert_id"] for r in fresh)
            _KNOWN_IDS[self.path] = (_version(self.path), known)
        self.rows = []


class AppendAlertsToFile(beam.PTransform):
    """Alert rows -> lines appended to a JSONL file, each alert_id at most once.

    The file is appended to across invocations, like the store, and alerts
    already in it (a re-run, a retried bundle) are not written again.
    """

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, rows):
        return rows | beam.ParDo(_AppendAlertsFn(self.path))
