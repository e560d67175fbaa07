"""The local alerts sink: one JSON object per line, the exact payload of the alerts topic.

The file is derived from the store. Each commit of a replay records in the store's ``alert_lines`` table, in
the same transaction as the rows, every line the file must hold (an alert as raised, and again each time a
triage action gives it a new state); :func:`complete_alerts_file` then appends the recorded lines the file
lacks, by alert id and state, in one canonical order. So a kill at any instant loses no line for good: the
next run completes the file, and the file it leaves is the one a clean run leaves. A torn last line (a kill in
the middle of a write) is cut off first: the store holds the line whole. Readers that tail the file (the
e-mail notifier) take only complete lines, so cutting a torn tail never hands them half a line.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, List, Optional, Set, Tuple

from core.triage import alert_state_of
from core.vocabulary import AlertState
from sinks.crash_points import crash_point


def alert_json(row: dict) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


AlertLineKey = Tuple[str, str]  # (alert_id, triage state): an alert is written once per state it is announced in


class AlertsFileDamaged(ValueError):
    """A line of the alerts file other than the last is not an alert: the file was edited, not torn."""


def line_key(row: dict) -> AlertLineKey:
    details = row.get("details")
    try:
        state = alert_state_of(json.loads(details) if details else {})
    except ValueError:
        state = AlertState.OPEN
    return row["alert_id"], state.value


def read_alert_keys(path: str) -> Set[AlertLineKey]:
    """The (alert id, state) of every line of the file; :class:`AlertsFileDamaged` names a line that is not an
    alert."""
    if not os.path.exists(path):
        return set()
    keys = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                keys.add(line_key(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise AlertsFileDamaged(f"line {number} of the alerts file {path} is not an alert: "
                                        "move the file away (the store holds every alert) or mend the line") from None
    return keys


def cut_torn_tail(path: str) -> Optional[str]:
    """Cuts off a last line that has no newline (a write the process did not finish); says what it cut, or None."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return None
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return None
            keep = end_of_last_line(f, size)
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    except FileNotFoundError:
        return None
    return (f"the alerts file {path} ended in a torn line ({size - keep} bytes, from an interrupted run): "
            "cut off; the store's copy of it is appended again")


def end_of_last_line(f, size: int, block: int = 1 << 16) -> int:
    """The offset just after the file's last newline (0 without one)."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def append_lines(path: str, lines: List[str]) -> None:
    """Appends whole lines and syncs them to disk. (Written in two halves with a crash point between, so
    that the kill tests can tear a line.)"""
    if not lines:
        return
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    with open(path, "ab") as f:
        half = len(data) // 2
        f.write(data[:half])
        f.flush()
        crash_point("alerts_file.write")
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())


def complete_alerts_file(path: str, recorded: Iterable[Tuple[str, str, str]]) -> int:
    """Appends to ``path`` each recorded ``(alert_id, state, line)`` (in the order given) whose key the file
    lacks; returns how many it appended."""
    known = read_alert_keys(path)
    missing = [line for alert_id, state, line in recorded if (alert_id, state) not in known]
    append_lines(path, missing)
    return len(missing)
