"""The alert as its readers see it: one read model for the notifier, the report and triage.

The pipeline writes an alert (``core.records.Alert.to_row``) as one JSON object:
a line of the alerts JSONL file, the data of one Pub/Sub alerts message, and a
row of the ``alerts`` table. :func:`parse_alert` reads the first two,
:func:`alert_from_row` a row read back from a store. Both give an
:class:`AlertRecord` with the same field names as the writer's ``Alert``.

What went wrong, in a few words per kind (:func:`alert_problems`), is worded here once: the e-mail
subject and the report's run titles say the same.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import posixpath
import re
import unicodedata
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from core.triage import AlertFacts, alert_state_of
from core.vocabulary import AlertState, alert_severity

_REQUIRED = ("alert_id", "kind", "test_name", "run_id")
NAME_MAX_CHARS = 60  # of a test, run or metric name inside a one-line summary


class InvalidAlert(ValueError):
    """A payload that is not an alert; readers dead-letter it with this message as the reason."""


@dataclasses.dataclass(frozen=True)
class AlertRecord:
    """One alert read back. ``kind`` stays a string: a newer pipeline may write kinds this reader does not know."""
    alert_id: str
    kind: str
    test: str
    run: str
    metric: Optional[str]
    value: Optional[float]
    lower_bound: Optional[float]
    upper_bound: Optional[float]
    message: str
    created_at: Optional[float]  # seconds since the epoch (UTC); None when the writer gave none we can read
    details: Dict[str, Any]

    @property
    def group_key(self) -> Tuple[str, str]:
        """Alerts of one run belong together (one digest, one report row group)."""
        return self.test, self.run

    @property
    def severity(self) -> int:
        """0 for the most severe kind; unknown kinds after every known one."""
        return alert_severity(self.kind)

    @property
    def history_size(self) -> Optional[int]:
        size = self.details.get("history_size")
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    @property
    def run_data(self) -> Dict[str, Any]:
        data = self.details.get("run_data")
        return data if isinstance(data, dict) else {}

    @property
    def logs_link(self) -> Optional[str]:
        return _text(self.run_data.get("logs_link"))

    @property
    def status(self) -> Optional[str]:
        status = self.details.get("status", self.run_data.get("status"))
        return status if isinstance(status, str) else None

    @property
    def unit(self) -> Optional[str]:
        """The metric's unit (``core.alert_details``), None when unknown."""
        return _text(self.details.get("unit"))

    @property
    def report_url(self) -> Optional[str]:
        """The run's page of the configured outside report (``report_url_pattern``); not checked to be http(s)."""
        return _text(self.details.get("report_url"))

    @property
    def next_steps(self) -> List[str]:
        """The ``trainguard-triage`` commands for this alert (``core.triage.triage_commands``)."""
        steps = self.details.get("next_steps")
        return [s for s in steps if isinstance(s, str) and s] if isinstance(steps, list) else []

    @property
    def window(self) -> Optional[Dict[str, Any]]:
        window = self.details.get("window")
        return window if isinstance(window, dict) else None

    @property
    def instance(self) -> Optional[str]:
        """What tells this alert apart from others of its (kind, test, run, metric): a window's kind/index."""
        window = self.window
        return f"{window.get('kind')}/{window.get('index')}" if window else None

    @property
    def state(self) -> AlertState:
        """The triage state the payload announces (``core.triage``): open unless it says otherwise."""
        return alert_state_of(self.details)

    @property
    def triage(self) -> Dict[str, Any]:
        """The ``details.triage`` marker of an alert whose state a triage action set ({} for an open one)."""
        marker = self.details.get("triage")
        return marker if isinstance(marker, dict) else {}

    def facts(self) -> AlertFacts:
        """What the triage rules read of this alert."""
        return AlertFacts(self.alert_id, self.kind, self.test, self.run, self.metric,
                          self.created_at if self.created_at is not None else float("-inf"))


def parse_alert(payload: bytes) -> AlertRecord:
    """Decode one alert payload (a JSONL line or a Pub/Sub message's data); raises :class:`InvalidAlert`."""
    try:
        row = json.loads(payload)
    except ValueError as e:  # UnicodeDecodeError is a ValueError
        raise InvalidAlert(f"not JSON: {e}") from None
    if not isinstance(row, dict):
        raise InvalidAlert(f"not a JSON object: {type(row).__name__}")
    return alert_from_row(row)


def alert_from_row(row: Mapping[str, Any]) -> AlertRecord:
    """An alert from its column values (``created_at`` an ISO-8601 string, a datetime or epoch seconds)."""
    for key in _REQUIRED:
        if not isinstance(row.get(key), str) or not row[key]:
            raise InvalidAlert(f"{key} must be a non-empty string, got {row.get(key)!r}")
    return AlertRecord(
        alert_id=row["alert_id"], kind=row["kind"], test=row["test_name"], run=row["run_id"],
        metric=_optional_string(row, "metric_name"), value=_optional_number(row, "value"),
        lower_bound=_optional_number(row, "lower_bound"), upper_bound=_optional_number(row, "upper_bound"),
        message=_optional_string(row, "message") or "", created_at=epoch_seconds(row.get("created_at")),
        details=decode_details(row.get("details")),
    )


def _optional_number(row: Mapping[str, Any], key: str) -> Optional[float]:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidAlert(f"{key} must be a number or null, got {value!r}")
    return float(value) if math.isfinite(value) else None


def _optional_string(row: Mapping[str, Any], key: str) -> Optional[str]:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidAlert(f"{key} must be a string or null, got {value!r}")
    return value


def _text(value: Any) -> Optional[str]:
    """A non-empty string from the free-form details, else None (details are data: never trusted to be typed)."""
    return value if isinstance(value, str) and value else None


def decode_details(raw: Any) -> Dict[str, Any]:
    """``details`` is a JSON string (an object is accepted too); text that is not JSON is kept under ``raw``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {"raw": raw}
    return raw if isinstance(raw, dict) else {}


def epoch_seconds(moment: Any) -> Optional[float]:
    """Seconds since the epoch from an ISO-8601 string (``Z`` or an offset; naive means UTC), a datetime or a number.

    Anything unreadable is None: a created_at we cannot read is no reason to drop the alert.
    """
    if isinstance(moment, bool):
        return None
    if isinstance(moment, (int, float)):
        return float(moment) if math.isfinite(moment) else None
    if isinstance(moment, str):
        text = moment.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            return None
    if isinstance(moment, datetime.datetime):
        aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.timezone.utc)
        return aware.timestamp()
    return None


# -- what went wrong, in a few words ----------------------------------------------------------------------


def one_line(text: str, limit: int) -> str:
    """``text`` without control/format characters or line breaks, whitespace collapsed, at most ``limit`` chars."""
    cleaned = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text)
    cleaned = re.sub(r" +", " ", cleaned).strip()
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1].rstrip() + "…"


def _names(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and 3 more``."""
    short = [one_line(n, NAME_MAX_CHARS) for n in names]
    if len(short) <= 2:
        return " and ".join(short)
    return f"{short[0]}, {short[1]} and {len(short) - 2} more"


def alert_problem(kind: str, alerts: Sequence[AlertRecord]) -> str:
    """What went wrong, for the alerts of one kind: "Accuracy/test_final and loss_final out of bounds"."""
    metrics = [a.metric for a in alerts if a.metric]
    if kind == "job_failed":
        statuses = sorted({a.status for a in alerts if a.status})
        return f"job failed ({', '.join(statuses)})" if statuses else "job failed"
    if kind == "run_missing":
        return "run never finished"
    if kind == "run_stalled":
        return "run stalled"
    if kind == "accuracy_not_reached":
        return "accuracy threshold not reached"
    if kind == "required_metric_missing":
        return f"missing required metric {_names(metrics)}" if metrics else "required metric missing"
    if kind == "metric_out_of_bounds":
        return f"{_names(metrics)} out of bounds"
    if kind == "window_out_of_bounds":
        return f"{_names(metrics)} window out of bounds"
    if kind == "baseline_shifted":
        return f"{_names(metrics)} moved to a new level (baseline follows)"
    if kind == "metric_shifted":
        return f"{_names(metrics)} shifted worse over the last runs"
    if kind == "config_rejected":
        files = [posixpath.basename(f) for f in (a.details.get("file") for a in alerts) if isinstance(f, str) and f]
        return f"config {_names(files)} rejected" if files else "config rejected"
    return one_line(kind, NAME_MAX_CHARS)


def by_kind(alerts: Iterable[AlertRecord]) -> Dict[str, List[AlertRecord]]:
    """Alerts grouped by kind, most severe kind first."""
    groups: Dict[str, List[AlertRecord]] = {}
    for alert in sorted(alerts, key=lambda a: (a.severity, a.kind, a.metric or "", a.alert_id)):
        groups.setdefault(alert.kind, []).append(alert)
    return groups


def alert_problems(alerts: Iterable[AlertRecord]) -> List[str]:
    """What went wrong in one run, one phrase per kind of its alerts, most severe first."""
    return [alert_problem(kind, group) for kind, group in by_kind(alerts).items()]
