"""The words every part of trainguard shares, defined once: alert kinds, run statuses, write methods.

Each is a ``str`` enum, so a member equals its plain string (``AlertKind.JOB_FAILED
== "job_failed"``), JSON-encodes as it, and reads back from a stored row with
``AlertKind(row["kind"])``. Rows and payloads carry the plain ``.value``.
"""

from __future__ import annotations

import enum
import sys

from core.registry import record
from trainguard import wire

if sys.version_info >= (3, 11):
    from enum import StrEnum as StrEnum  # re-exported: core.config uses it too
else:  # pragma: no cover - Python < 3.11
    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` of Python 3.11: ``str()`` and ``format()`` give the value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


@record("RunStatus")
class RunStatus(StrEnum):
    """How a run ended: the three statuses a trainer sends in ``run_finished``, ``missing``, and ``interrupted``."""
    SUCCESS = wire.STATUS_SUCCESS
    FAILURE = wire.STATUS_FAILURE
    TIMEOUT = wire.STATUS_TIMEOUT
    MISSING = "missing"  # never sent run_finished: finalized after the run timeout
    # Still open when its streaming job was drained (not ended by its own timeout): stored with its open state,
    # which the next job resumes (``core.runs.interrupt``). Raises no alert and joins no history.
    INTERRUPTED = "interrupted"


@record("AlertKind")
class AlertKind(StrEnum):
    """Every kind of alert, most severe first (the order a digest lists them in)."""
    JOB_FAILED = "job_failed"
    RUN_MISSING = "run_missing"
    RUN_STALLED = "run_stalled"
    REQUIRED_METRIC_MISSING = "required_metric_missing"
    ACCURACY_NOT_REACHED = "accuracy_not_reached"
    METRIC_OUT_OF_BOUNDS = "metric_out_of_bounds"
    WINDOW_OUT_OF_BOUNDS = "window_out_of_bounds"
    RANK_STRAGGLER = "rank_straggler"  # one worker of a distributed run is out of line with the others
    BASELINE_SHIFTED = "baseline_shifted"  # a metric moved for good and its history restarted from the new level
    METRIC_SHIFTED = "metric_shifted"  # a metric's last few runs all a little worse, none out of bounds (core.shifts)
    CONFIG_REJECTED = "config_rejected"  # a running job read a config file it cannot use (core.config_versions)

    @property
    def severity(self) -> int:
        """0 for the most severe kind."""
        return list(AlertKind).index(self)


def alert_severity(kind: str) -> int:
    """The severity rank of a kind read from a payload; unknown kinds sort after every known one."""
    try:
        return AlertKind(kind).severity
    except ValueError:
        return len(AlertKind)


@record("TriageAction")
class TriageAction(StrEnum):
    """What a user can say about alerts and baselines (``trainguard-triage``; ``core.triage``)."""
    ACCEPT = wire.TRIAGE_ACCEPT    # an intended change: the metric's baseline restarts from a run
    DISMISS = wire.TRIAGE_DISMISS  # a false positive: the value joins the history as normal
    MUTE = wire.TRIAGE_MUTE        # quiet for a while: alerts are recorded as muted, not sent


@record("AlertState")
class AlertState(StrEnum):
    """Where an alert stands after triage."""
    OPEN = "open"
    MUTED = "muted"          # raised while a mute covered it: recorded, not sent
    DISMISSED = "dismissed"  # a false positive
    ACCEPTED = "accepted"    # part of an intended change

    @property
    def notifies(self) -> bool:
        """Whether an alert in this state is e-mailed."""
        return self is AlertState.OPEN


class WriteMethod(StrEnum):
    """How rows reach BigQuery."""
    STREAMING_INSERTS = "streaming_inserts"  # portable: every runner
    STORAGE_WRITE_API = "storage_write_api"  # a cross-language transform: Dataflow only
