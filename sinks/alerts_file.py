"""The local alerts sink: one JSON object per line, the exact payload of the alerts topic."""

from __future__ import annotations

import json
import os
import threading
from typing import Dict, List, Optional, Set, Tuple

import apache_beam as beam

from core.triage import alert_state_of
from core.vocabulary import AlertState

_APPEND_LOCK = threading.Lock()
# The alert ids in each file and the file's (size, mtime) they were read at: re-read only when the file
# changed behind the appenders' backs (every appender in the process keeps the entry up to date).
_KNOWN_KEYS: Dict[str, Tuple[Optional[Tuple[int, int]], Set[Tuple[str, str]]]] = {}


def _version(path: str) -> Optional[Tuple[int, int]]:
    if not os.path.exists(path):
        return None
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def alert_json(row: dict) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


AlertLineKey = Tuple[str, str]  # (alert_id, triage state): an alert is written once per state it is announced in


def line_key(row: dict) -> AlertLineKey:
    details = row.get("details")
    try:
        state = alert_state_of(json.loads(details) if details else {})
    except ValueError:
        state = AlertState.OPEN
    return row["alert_id"], state.value


def read_alert_keys(path: str) -> Set[AlertLineKey]:
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {line_key(json.loads(line)) for line in f if line.strip()}


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
            cached_version, known = _KNOWN_KEYS.get(self.path, (None, None))
            if known is None or cached_version != _version(self.path):
                known = read_alert_keys(self.path)
            unique = {line_key(r): r for r in self.rows if line_key(r) not in known}
            fresh = sorted(unique.items(), key=lambda item: (item[1]["created_at"], item[0]))
            with open(self.path, "a", encoding="utf-8") as f:
                f.writelines(alert_json(r) + "\n" for _, r in fresh)
            known.update(key for key, _ in fresh)
            _KNOWN_KEYS[self.path] = (_version(self.path), known)
        self.rows = []


class AppendAlertsToFile(beam.PTransform):
    """Alert rows -> lines appended to a JSONL file, each alert_id at most once per triage state.

    The file is appended to across invocations, like the store, and alerts
    already in it (a re-run, a retried bundle) are not written again. An alert
    whose state a triage action changed is appended again with the new state
    in ``details.triage`` (``core.triage``), as the alerts topic carries it.
    """

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, rows):
        return rows | beam.ParDo(_AppendAlertsFn(self.path))
