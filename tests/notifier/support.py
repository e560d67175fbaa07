"""Shared helpers of the e-mail notifier tests (no tests here).

Alerts are built with the pipeline's own ``Alert`` record and serialized by the
pipeline's own sinks, so the notifier is tested on the exact payload the alerts
file and the alerts topic carry.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, List

from core.records import Alert
from notifier.config import config_from_mapping
from notifier.sources import Delivery
from sinks.alerts_file import alert_json

WAIT_SECONDS = 10.0
"""Generous upper bound for anything that happens on other threads (never asserted on)."""

START = 1795255200.0  # 2026-11-21T10:00:00Z: a fixed wall-clock start for FakeClock
API_KEY = "SG.test-key-0123456789.abcdefghijklmnopqrstuvwxyz"


@dataclasses.dataclass
class FakeClock:
    """The notifier's injectable clock: time moves only when the test says so."""
    now_value: float = START

    def now(self) -> float:
        return self.now_value

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now_value += seconds


def alert(kind: str = "metric_out_of_bounds", test: str = "pt-cifar", run: str = "run-1",
          metric: str = "Accuracy/test_final", value: float = 70.5, lower: float = 74.0, upper=None,
          history_size: int = 10, logs_link: str = "https://logs.example/cifar/1", **details) -> Alert:
    """A metric alert by default; ``details`` adds to (or with None removes) its details."""
    run_data = {"status": "success", "num_failures": 0}
    if logs_link is not None:
        run_data["logs_link"] = logs_link
    merged = {"comparison": "greater", "history_size": history_size, "run_data": run_data,
              "stddevs_from_mean": 4.0, **details}
    merged = {k: v for k, v in merged.items() if v is not None}
    has_metric = kind not in ("job_failed", "run_missing", "run_stalled", "accuracy_not_reached")
    message = f"{metric} = {value} is outside bounds" if has_metric else f"run {run}: {kind}"
    return Alert(kind=kind, test=test, run=run, message=message,
                 created_at=START - 3600, metric=metric if has_metric else None,
                 value=value if has_metric else None, lower_bound=lower if has_metric else None,
                 upper_bound=upper if has_metric else None, details=merged)


def payload(item: Alert) -> bytes:
    """The alerts file line / Pub/Sub data of an alert."""
    return alert_json(item.to_row()).encode("utf-8")


def run_alerts(test: str, run: str, metrics: Iterable[str]) -> List[Alert]:
    return [alert(test=test, run=run, metric=m) for m in metrics]


@dataclasses.dataclass
class Settled:
    """What happened to the deliveries made by :func:`delivery` (for tests without Pub/Sub)."""
    acked: List[bytes] = dataclasses.field(default_factory=list)
    nacked: List[bytes] = dataclasses.field(default_factory=list)

    def delivery(self, data: bytes) -> Delivery:
        return Delivery(data, {}, lambda: self.acked.append(data), lambda: self.nacked.append(data), "test")


def config(**overrides):
    """A valid notifier config; keyword arguments replace top-level keys."""
    values = {"sender": "trainguard <alerts@example.com>", "recipients": ["oncall@example.com"],
              "group_wait_seconds": 60, "daily_budget": 100, "summary_wait_seconds": 600,
              "retry": {"initial_seconds": 2, "multiplier": 2, "max_seconds": 60, "jitter": 0}}
    values.update(overrides)
    return config_from_mapping(values)


def wait_until(condition: Callable[[], bool], step: Callable[[], object] = lambda: None,
               timeout: float = WAIT_SECONDS) -> None:
    """Call ``step`` until ``condition()`` holds; fail after ``timeout`` real seconds."""
    give_up_at = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up_at, "condition not reached"
        step()
        time.sleep(0.01)
