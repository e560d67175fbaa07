"""Records passed between the pipeline's stages and the rows they become.

Rows are JSON-ready dicts with the column names of the output tables
(``sinks/schema.py``): timestamps are ISO-8601 UTC strings, which BigQuery,
DuckDB and the alerts JSONL file all accept as they are.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
from typing import Any, Dict, List, Optional, Tuple

from core.registry import record
from core.runs import RunResult
from core.vocabulary import AlertKind
from core.windows import WindowResult


def iso_utc(seconds: Optional[float]) -> Optional[str]:
    return None if seconds is None else _iso_utc(seconds)


@functools.lru_cache(maxsize=4096)  # a run's rows repeat its times: its end is each metric row's timestamp
def _iso_utc(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stable_id(*parts: Optional[str]) -> str:
    """A short deterministic id: the same parts always give the same id."""
    joined = "\x1f".join("" if p is None else p for p in parts)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]


@record("MetricObservation")
@dataclasses.dataclass(frozen=True)
class MetricObservation:
    """One aggregated metric of one finalized run, on its way to the history check."""
    test: str
    run: str
    metric: str
    value: float
    step: Optional[int]
    status: str
    end_time: float
    finalized_at: float
    run_data: Dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the run's logs link
    out_of_order: bool = False  # of a back-filled run (``RunResult.out_of_order``)

    @property
    def order(self) -> Tuple[float, str]:
        return self.finalized_at, self.run

    @staticmethod
    def all_of(run: RunResult) -> List[MetricObservation]:
        run_data = run.run_data
        return [MetricObservation(run.test, run.run, m.name, m.value, m.step, run.status,
                                  run.end_time, run.finalized_at, run_data, run.out_of_order) for m in run.metrics]


@record("Alert")
@dataclasses.dataclass(frozen=True)
class Alert:
    kind: AlertKind
    test: str
    run: str
    message: str
    created_at: float
    metric: Optional[str] = None
    value: Optional[float] = None
    lower_bound: Optional[float] = None
    upper_bound: Optional[float] = None
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)
    instance: Optional[str] = None  # tells apart alerts of one (kind, test, run, metric), e.g. a window

    @property
    def alert_id(self) -> str:
        parts = (self.kind, self.test, self.run, self.metric)
        return stable_id(*parts) if self.instance is None else stable_id(*parts, self.instance)

    def to_row(self) -> Dict[str, Any]:
        return {
            "alert_id": self.alert_id, "kind": AlertKind(self.kind).value, "test_name": self.test, "run_id": self.run,
            "metric_name": self.metric, "value": self.value,
            "lower_bound": self.lower_bound, "upper_bound": self.upper_bound,
            "message": self.message, "created_at": iso_utc(self.created_at),
            "details": json.dumps(self.details, sort_keys=True, default=str),
        }


def job_history_row(run: RunResult) -> Dict[str, Any]:
    return {
        "run_id": run.run, "test_name": run.test, "job_status": run.status,
        "num_failures": run.num_failures, "start_time": iso_utc(run.start_time),
        "timestamp": iso_utc(run.end_time), "job_duration_sec": run.duration,
        "processed_at": iso_utc(run.finalized_at), "events": run.events_json(), "out_of_order": run.out_of_order,
    }


def rank_metric_rows(run: RunResult) -> List[Dict[str, Any]]:
    """``rank_metrics`` rows: each rank's value of each metric of a run with several ranks (none otherwise)."""
    return [{"run_id": run.run, "test_name": run.test, "metric_name": metric.name, "rank": rank,
             "metric_value": metric.value, "step": metric.step, "timestamp": iso_utc(run.end_time)}
            for rank, metric in run.rank_metrics]


def metric_history_row(observation: MetricObservation, lower: Optional[float], upper: Optional[float],
                       within: Optional[bool], segment: str = "") -> Dict[str, Any]:
    return {
        "run_id": observation.run, "test_name": observation.test, "metric_name": observation.metric,
        "metric_value": observation.value, "metric_lower_bound": lower, "metric_upper_bound": upper,
        "within_bounds": within, "timestamp": iso_utc(observation.end_time), "step": observation.step,
        "out_of_order": observation.out_of_order, "history_segment": segment or None,
    }


def dead_letter_row(reason: str, payload: Any, source: str, received_at: Optional[float]) -> Dict[str, Any]:
    """A dead-letter row; a bytes payload keeps every byte (invalid UTF-8 as \\xNN escapes)."""
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", errors="backslashreplace")
    return {"received_at": iso_utc(received_at), "reason": reason, "payload": payload, "source": source,
            "dead_letter_id": stable_id(source, reason, payload)}


def window_row(result: WindowResult, revision: int) -> Dict[str, Any]:
    """A ``metric_windows`` row: one revision of one emitted window."""
    row = {"run_id": result.run, "test_name": result.test, "tag": result.tag, "window_kind": result.kind,
           "window_index": result.index, "revision": revision, "partial": result.partial,
           "start_time": iso_utc(result.start_time), "end_time": iso_utc(result.end_time),
           "start_step": result.start_step, "end_step": result.end_step, "n": result.n,
           "history_segment": result.segment or None}
    row.update(result.values)
    return row


MAX_REASON_CHARS = 1000  # an exception's message can be long (a repr of the input); the payload keeps the rest


class Refused(ValueError):
    """An item a stage takes no action on by rule (a triage action naming what its state does not hold), not by
    failure: raised by a step, it makes the item a dead letter whose reason is the message, the state unchanged."""


def failure_reason(stage: str, error: BaseException) -> str:
    """The dead-letter reason for an item a stage could not handle: the stage, the exception's type and message
    (for a :class:`Refused` item, the stage and the message)."""
    if isinstance(error, Refused):
        text = f"{stage} refused: {error}"
    else:
        text = f"error in {stage}: {type(error).__name__}: {error}"
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def record_payload(record: object) -> str:
    """A record (a dataclass, a named tuple, ...) as JSON, for a dead letter; its repr if JSON cannot hold it."""
    try:
        value = dataclasses.asdict(record) if dataclasses.is_dataclass(record) and not isinstance(record, type) \
            else record
        return json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        return repr(record)
