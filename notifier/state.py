"""The notifier's persisted state: one small SQLite file.

* ``sent``: ids of alerts carried by an accepted e-mail, so a redelivered alert
  (Pub/Sub redelivery, a duplicate publish, a re-read file) is not mailed again.
  Bounded: ids older than ``max_age_seconds`` and all but the ``max_ids`` most
  recently seen are forgotten (a duplicate refreshes its id: LRU).
* ``budget``: units used per UTC day (SendGrid counts every recipient).
* ``offsets``: how far the tailed alerts file has been handled, per path.

Every write commits at once; SQLite's journal makes each one atomic, so a
crash never leaves a half-written state.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
from typing import Iterable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sent (alert_id TEXT PRIMARY KEY, sent_at REAL NOT NULL, seen_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sent_by_seen ON sent (seen_at);
CREATE TABLE IF NOT EXISTS budget (day TEXT PRIMARY KEY, used INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (path TEXT PRIMARY KEY, offset INTEGER NOT NULL);
"""
_BUDGET_DAYS_KEPT = 7


def utc_day(seconds: float) -> str:
    """``YYYY-MM-DD`` of a unix time, in UTC: the budget's day."""
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%d")


def next_utc_midnight(seconds: float) -> float:
    day = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).date()
    midnight = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(),
                                         tzinfo=datetime.timezone.utc)
    return midnight.timestamp()


class NotifierState:
    """Sent alert ids, daily budget use and file offsets in the SQLite file ``path``."""

    def __init__(self, path: str, max_ids: int = 100_000, max_age_seconds: float = 30 * 86400.0):
        if path != ":memory:" and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.max_ids = max_ids
        self.max_age_seconds = max_age_seconds
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> NotifierState:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- sent ids ---------------------------------------------------------

    def was_sent(self, alert_id: str, now: float) -> bool:
        """Whether ``alert_id`` went out already; a hit refreshes the id (it is still being redelivered)."""
        with self._db:
            cursor = self._db.execute("UPDATE sent SET seen_at = ? WHERE alert_id = ?", (now, alert_id))
        return cursor.rowcount > 0

    def mark_sent(self, alert_ids: Iterable[str], now: float) -> None:
        """Remember ``alert_ids`` as sent at ``now`` and apply the bounds."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT INTO sent VALUES (?, ?, ?) ON CONFLICT(alert_id) DO UPDATE SET seen_at = excluded.seen_at",
                [(alert_id, now, now) for alert_id in alert_ids])
            self._db.execute("DELETE FROM sent WHERE seen_at < ?", (now - self.max_age_seconds,))
            self._db.execute("DELETE FROM sent WHERE alert_id NOT IN "
                             "(SELECT alert_id FROM sent ORDER BY seen_at DESC, rowid DESC LIMIT ?)", (self.max_ids,))

    def sent_count(self) -> int:
        return self._db.execute("SELECT count(*) FROM sent").fetchone()[0]

    # -- daily budget ---------------------------------------------------

    def budget_used(self, now: float) -> int:
        row = self._db.execute("SELECT used FROM budget WHERE day = ?", (utc_day(now),)).fetchone()
        return row[0] if row else 0

    def use_budget(self, units: int, now: float) -> None:
        day = utc_day(now)
        oldest_kept = utc_day(now - _BUDGET_DAYS_KEPT * 86400.0)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO budget VALUES (?, ?) ON CONFLICT(day) DO UPDATE SET used = used + ?",
                             (day, units, units))
            self._db.execute("DELETE FROM budget WHERE day < ?", (oldest_kept,))

    # -- file offsets ---------------------------------------------------

    def file_offset(self, path: str) -> int:
        row = self._db.execute("SELECT offset FROM offsets WHERE path = ?", (os.path.abspath(path),)).fetchone()
        return row[0] if row else 0

    def set_file_offset(self, path: str, offset: int) -> None:
        with self._db:
            self._db.execute("INSERT INTO offsets VALUES (?, ?) ON CONFLICT(path) DO UPDATE SET offset = excluded.offset",
                             (os.path.abspath(path), offset))
