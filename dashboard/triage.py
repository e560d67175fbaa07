"""Triage from the dashboard: the alerts' states, what is pending, and the actions a form sends.

The state of an alert follows from the triage actions the pipeline has applied (the store's ``triage`` table),
by ``core.triage.alert_states``, exactly as ``trainguard-triage list`` and the report compute it. An action the
dashboard wrote that the pipeline has not applied yet (still in the local triage file; or published to the topic
by this process) is *pending*: the page shows the state it will set beside the applied one.

Actions are written by ``pipeline.triage.deliver``, the code ``trainguard-triage`` sends with: the same control
message, to the store's triage file locally or to the pipeline's input topic in production.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from core.alert_record import AlertRecord
from core.triage import TriageItem, alert_states
from core.vocabulary import AlertState, TriageAction
from dashboard import queries
from dashboard.store import Reader, file_version
from pipeline.triage import deliver, dismiss_message, read_file_actions
from trainguard import wire

MUTE_CHOICES = {"1h": 3600.0, "1d": 86400.0, "3d": 3 * 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0}


@dataclasses.dataclass(frozen=True)
class AlertView:
    """An alert with its applied state, the action that set it, and a pending action's state if any."""
    alert: AlertRecord
    state: AlertState
    action: Optional[TriageItem]
    pending_state: Optional[AlertState] = None
    pending_action: Optional[TriageItem] = None


class ActionSink:
    """Where the dashboard's actions go: the local triage file (``path``) or the input topic (``topic``).

    Remembers what it published (a topic cannot be read back) until the store shows it applied."""

    def __init__(self, path: Optional[str] = None, topic: Optional[str] = None, timeout: float = 30.0):
        self.path, self.topic, self.timeout = path, topic, timeout
        self._sent: List[TriageItem] = []
        self._published = 0  # actions this process published: the version of ``_sent``
        self._lock = threading.Lock()

    @property
    def writable(self) -> bool:
        return bool(self.path or self.topic)

    def send(self, test: str, triage: wire.Triage) -> str:
        message_id = wire.new_message_id()
        where = deliver(test, triage, topic=self.topic, timeout=self.timeout, path=None if self.topic else self.path,
                        message_id=message_id)
        if self.topic:
            with self._lock:
                self._sent.append(TriageItem(message_id, test, **triage._asdict()))
                self._published += 1
        return where

    def version(self) -> Optional[tuple]:
        """What the pending actions depend on beside the store: the triage file's ``file_version`` locally, the
        count of actions published by this process with a topic (None: do not cache)."""
        if self.topic:
            with self._lock:
                return ("published", self._published)
        return file_version(self.path) if self.path else ()

    def unapplied(self, stored_ids: set) -> List[TriageItem]:
        """The actions written that the store does not hold yet."""
        if self.topic:
            with self._lock:
                self._sent = [a for a in self._sent if a.id not in stored_ids]
                return list(self._sent)
        return [a for a in read_file_actions(self.path or "") if a.id not in stored_ids]


def alert_views(reader: Reader, alerts: Sequence[AlertRecord], sink: ActionSink,
                stored: Optional[List[TriageItem]] = None) -> List[AlertView]:
    """The alerts with their applied and pending states (reads the triage actions of their tests only, unless
    given as ``stored``)."""
    if not alerts:
        return []
    tests = sorted({a.test for a in alerts})
    stored = queries.triage_actions(reader, tests) if stored is None else stored
    pending = [a for a in sink.unapplied({a.id for a in stored}) if a.test in tests]
    facts = {a.alert_id: a.facts() for a in alerts}
    for fact in queries.accepted_run_facts(reader, stored + pending):
        facts.setdefault(fact.alert_id, fact)
    muted = [a.alert_id for a in alerts if a.state is AlertState.MUTED]
    applied = alert_states(list(facts.values()), stored, raised_muted=muted)
    after = alert_states(list(facts.values()), stored + pending, raised_muted=muted) if pending else applied
    views = []
    for alert in alerts:
        state, action = applied[alert.alert_id]
        later, later_action = after[alert.alert_id]
        changed = later_action is not None and later_action is not action and later_action in pending
        views.append(AlertView(alert, state, action, later if changed else None, later_action if changed else None))
    return views


def triage_history(reader: Reader, alert: AlertRecord, sink: ActionSink,
                   stored: Optional[List[TriageItem]] = None) -> List[Tuple[TriageItem, bool]]:
    """The actions of the alert's test that name its metric (or every metric), or the alert, oldest first, each
    with whether it is still pending (``stored``: the test's stored actions, if read already)."""
    stored = queries.triage_actions(reader, [alert.test]) if stored is None else stored
    pending = [a for a in sink.unapplied({a.id for a in stored}) if a.test == alert.test]

    def about(a: TriageItem) -> bool:
        return a.alert_id == alert.alert_id or a.metric is None or a.metric == alert.metric

    return [(a, False) for a in stored if about(a)] + [(a, True) for a in pending if about(a)]


def form_action(alert: AlertRecord, action: str, note: str, user: str, mute_for: str = "1d",
                now: Optional[float] = None) -> wire.Triage:
    """The control message of one triage form on an alert's page; ValueError for an unknown action or duration."""
    now = time.time() if now is None else now
    note = note.strip()[:2000]
    if action == TriageAction.DISMISS.value:
        return dismiss_message(alert, now, note, user)
    if action == TriageAction.ACCEPT.value:
        if alert.metric is None:
            raise ValueError("only an alert on a metric can be accepted")
        return wire.Triage(TriageAction.ACCEPT.value, now, metric=alert.metric, run=alert.run, note=note, user=user)
    if action == TriageAction.MUTE.value:
        if mute_for not in MUTE_CHOICES:
            raise ValueError(f"mute for: one of {', '.join(MUTE_CHOICES)}")
        return wire.Triage(TriageAction.MUTE.value, now, metric=alert.metric, until=now + MUTE_CHOICES[mute_for],
                           note=note, user=user)
    raise ValueError(f"unknown action {action!r}")


def state_counts(views: Sequence[AlertView]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for v in views:
        counts[v.state.value] = counts.get(v.state.value, 0) + 1
    return counts
