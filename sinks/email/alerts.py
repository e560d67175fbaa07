"""The alert payload (``Alert.to_row`` in ``transforms/records.py``), as the notifier reads it.

The same JSON object is one line of the alerts JSONL file and the data of one
Pub/Sub alerts message. ``details`` is a JSON *string* inside it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, Optional

KINDS = ("job_failed", "run_missing", "run_stalled", "required_metric_missing", "accuracy_not_reached",
         "metric_out_of_bounds", "window_out_of_bounds")
"""Known kinds, in the order a digest lists them (most severe first); unknown kinds come last."""

_REQUIRED = ("alert_id", "kind", "test_name", "run_id")


class InvalidAlert(ValueError):
    """A payload that is not an alert; it is dead-lettered with this message as the reason."""


@dataclasses.dataclass(frozen=True)
class AlertRecord:
    """One alert: the payload's fields, with ``details`` decoded and the raw payload kept."""
    alert_id: str
    kind: str
    test: str
    run: str
    metric: Optional[str]
    value: Optional[float]
    lower_bound: Optional[float]
    upper_bound: Optional[float]
    message: str
    created_at: str
    details: Dict[str, Any]
    payload: bytes  # the bytes received, for the dead-letter sink

    @property
    def group_key(self):
        """Alerts of one run go into one digest."""
        return self.test, self.run

    @property
    def severity(self) -> int:
        return KINDS.index(self.kind) if self.kind in KINDS else len(KINDS)

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
        link = self.run_data.get("logs_link")
        return link if isinstance(link, str) and link else None

    @property
    def status(self) -> Optional[str]:
        status = self.details.get("status", self.run_data.get("status"))
        return status if isinstance(status, str) else None

    @property
    def window(self) -> Optional[Dict[str, Any]]:
        window = self.details.get("window")
        return window if isinstance(window, dict) else None


def _optional_number(row: Dict[str, Any], key: str) -> Optional[float]:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidAlert(f"{key} must be a number or null, got {value!r}")
    return float(value) if math.isfinite(value) else None


def _optional_string(row: Dict[str, Any], key: str) -> Optional[str]:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidAlert(f"{key} must be a string or null, got {value!r}")
    return value


def _details(raw: Any) -> Dict[str, Any]:
    """``details`` is a JSON string; an object is accepted too; anything unreadable becomes ``{}``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {"raw": raw}
    return raw if isinstance(raw, dict) else {}


def parse_alert(payload: bytes) -> AlertRecord:
    """Decode one alert payload; raises :class:`InvalidAlert` when it is not one."""
    try:
        row = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidAlert(f"not JSON: {e}") from None
    if not isinstance(row, dict):
        raise InvalidAlert(f"not a JSON object: {type(row).__name__}")
    for key in _REQUIRED:
        if not isinstance(row.get(key), str) or not row[key]:
            raise InvalidAlert(f"{key} must be a non-empty string, got {row.get(key)!r}")
    return AlertRecord(
        alert_id=row["alert_id"], kind=row["kind"], test=row["test_name"], run=row["run_id"],
        metric=_optional_string(row, "metric_name"), value=_optional_number(row, "value"),
        lower_bound=_optional_number(row, "lower_bound"), upper_bound=_optional_number(row, "upper_bound"),
        message=_optional_string(row, "message") or "", created_at=_optional_string(row, "created_at") or "",
        details=_details(row.get("details")), payload=bytes(payload),
    )
