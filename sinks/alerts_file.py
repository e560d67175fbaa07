"""The local alerts sink: one JSON object per line, the exact payload of the alerts topic."""

from __future__ import annotations

import json
import os
from typing import List, Set, Tuple

from core.triage import alert_state_of
from core.vocabulary import AlertState


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


def append_alerts(path: str, rows: List[dict]) -> int:
    """Appends the alert rows not yet in the file (by alert id and triage state), oldest first; returns how many.

    The file is appended to across invocations, like the store, and alerts
    already in it (a re-run) are not written again. An alert whose state a
    triage action changed is appended again with the new state in
    ``details.triage`` (``core.triage``), as the alerts topic carries it.
    Only the replay's launching process calls this (``sinks.staging``).
    """
    known = read_alert_keys(path)
    fresh = {line_key(r): r for r in rows if line_key(r) not in known}
    ordered = sorted(fresh.items(), key=lambda item: (item[1]["created_at"], item[0]))
    if ordered:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(alert_json(r) + "\n" for _, r in ordered)
    return len(ordered)
