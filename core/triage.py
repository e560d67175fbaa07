"""Triage: what users say about alerts and baselines, applied by the checks in event time.

A user (``trainguard-triage``, ``pipeline/triage.py``) says one of three things,
each sent as a control message of the wire contract (``trainguard.wire.Triage``)
on the same input as the metrics, so that the pipeline applies it in event-time
order among the runs and a replay of the same input reproduces it:

- ``accept`` TEST METRIC from RUN: an intended change. The metric's baseline
  restarts at RUN (the run-level history, and the step-aligned history of the
  window checks whose metric it names), and the alerts of that metric from RUN
  up to the action are *accepted*.
- ``dismiss`` ALERT: a false positive. The value the alert was about joins the
  history as if it had been within bounds, and the alert is *dismissed*.
- ``mute`` TEST [METRIC] until TIME: alerts raised from the action until then
  are recorded as *muted* and not sent; the checks go on as usual.

Where the state of an alert is shown (``trainguard-triage list``, the report,
the e-mails), it follows from the alert and the actions by :func:`alert_states`;
the pipeline announces a changed state by emitting the alert again with a
``triage`` marker in its details (:class:`AlertLedger`), which the e-mail
notifier reads.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from core.records import Alert, Refused, iso_utc
from core.registry import record
from core.vocabulary import AlertKind, AlertState, TriageAction
from trainguard import wire

# Alerts whose value comes from a metric's history: a dismiss lets the value into it, an accept covers them.
METRIC_ALERT_KINDS = frozenset((AlertKind.METRIC_OUT_OF_BOUNDS, AlertKind.BASELINE_SHIFTED, AlertKind.METRIC_SHIFTED))
FIRST_RUN_ALERT_KINDS = frozenset((AlertKind.BASELINE_SHIFTED, AlertKind.METRIC_SHIFTED))  # details name first_run
WINDOW_ALERT_KINDS = frozenset((AlertKind.WINDOW_OUT_OF_BOUNDS,))
MAX_RECENT_ALERTS = 1000  # per test: the alerts a later dismiss or accept can still re-announce
TRIAGE_PROG = "trainguard-triage"  # ``pipeline/triage.py``
# An alert id prefix a dismiss command names: unique in practice, and at least the CLI's minimum of 8.
ALERT_ID_PREFIX_CHARS = 12
MUTE_FOR = "+1d"  # what the suggested mute lasts


def _item_v1_to_v2(fields: Dict[str, Any]) -> Dict[str, Any]:
    """An accept written before ``future`` existed waited for a run the check had not seen: it keeps doing so."""
    return {**fields, "future": fields.get("action") == TriageAction.ACCEPT}


@record("TriageItem", version=2, upgrades={1: _item_v1_to_v2})
@dataclasses.dataclass(frozen=True)
class TriageItem:
    """One triage action of one test, as the pipeline's stages carry it."""
    id: str
    test: str
    action: str
    time: float
    metric: Optional[str] = None
    run: Optional[str] = None
    alert_id: Optional[str] = None
    alert_kind: Optional[str] = None
    instance: Optional[str] = None
    until: Optional[float] = None
    note: str = ""
    user: str = ""
    future: bool = False  # accept: ``run`` may be still going or to come (``--allow_future``)

    @property
    def order(self) -> Tuple[float, str, str]:
        # Before the runs and windows of the same instant ("" sorts before any run id).
        return self.time, "", self.id

    @staticmethod
    def of(message: wire.Message) -> TriageItem:
        triage = message.triage
        assert triage is not None
        return TriageItem(message.id, message.test, **triage._asdict())

    def to_row(self) -> Dict[str, Any]:
        """A ``triage`` table row."""
        return {"action_id": self.id, "action": self.action, "test_name": self.test, "metric_name": self.metric,
                "run_id": self.run, "alert_id": self.alert_id, "alert_kind": self.alert_kind,
                "alert_instance": self.instance, "until": iso_utc(self.until), "note": self.note or None,
                "author": self.user or None, "created_at": iso_utc(self.time),
                "future": self.future if self.action == TriageAction.ACCEPT else None}

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> TriageItem:
        """Back from a stored row whose times are epoch seconds. An accept's NULL ``future`` is a row older than
        the column, whose accept waited for a run the check had not seen (what ``future`` says now)."""
        future = row.get("future")
        if future is None:
            future = row["action"] == TriageAction.ACCEPT
        return TriageItem(row["action_id"], row["test_name"], row["action"], float(row["created_at"]),
                          row.get("metric_name"), row.get("run_id"), row.get("alert_id"), row.get("alert_kind"),
                          row.get("alert_instance"), None if row.get("until") is None else float(row["until"]),
                          row.get("note") or "", row.get("author") or "", bool(future))

    def marker(self, state: AlertState) -> Dict[str, Any]:
        """What an alert's details say of the action that set its state."""
        marker: Dict[str, Any] = {"state": state.value, "action_id": self.id, "at": iso_utc(self.time)}
        if self.until is not None:
            marker["until"] = iso_utc(self.until)
        if self.note:
            marker["note"] = self.note
        if self.user:
            marker["user"] = self.user
        return marker


def reaches_metric_history(item: TriageItem) -> bool:
    """Whether the action changes a run-level metric history (keyed by test and metric)."""
    if item.metric is None:
        return False
    return item.action == TriageAction.ACCEPT or (
        item.action == TriageAction.DISMISS and item.alert_kind in METRIC_ALERT_KINDS)


def unknown_run_refusal(item: TriageItem, runs_held: int) -> Refused:
    """Why a check refuses an accept whose run its history does not hold (``runs_held``: the runs it does)."""
    hint = "a run still going or to come needs the accept's future flag (trainguard-triage accept --allow_future)"
    if not runs_held:
        return Refused(f"accept of {item.metric!r} of test {item.test!r}: no successful run of the test has reported "
                       f"it (a misspelled test or metric? {hint})")
    return Refused(f"accept of {item.metric!r} of test {item.test!r} from run {item.run!r}: not among the {runs_held} "
                   f"runs of its history (those since its last re-baseline; {hint})")


def window_metric(tag: str, aggregation: str) -> str:
    """The metric name of a window check's alerts: the tag and the aggregation."""
    return f"{tag}_{aggregation}"


def window_kind_of(instance: Optional[str]) -> Optional[str]:
    """The window kind of a window alert's instance ("count/4" -> "count")."""
    return instance.split("/", 1)[0] if instance else None


def window_index_of(instance: Optional[str]) -> Optional[int]:
    """The window index of a window alert's instance ("count/4" -> 4)."""
    try:
        return int(instance.split("/", 1)[1]) if instance else None
    except (IndexError, ValueError):
        return None


def triage_commands(alert: Alert, destination: Sequence[Tuple[str, str]] = ()) -> List[str]:
    """The ``trainguard-triage`` commands for one alert, ready to paste: dismiss it (a false positive),
    accept its level (an intended change; metric and window alerts, from the first run at the new level),
    mute its metric for a day.

    ``destination``: the (option, value) pairs that point the tool where the alert came from (the streaming
    job's ``--topic``, ``--bigquery_project`` and ``--bigquery_dataset``; a replay's ``--local_store``), added
    to every command, so that a command pasted from an e-mail acts on the job that raised the alert.
    Arguments are shell-quoted; a test or metric name that starts with ``-`` goes after ``--`` and an option
    value that does is written ``--option=value``, so that every command parses as written.
    """
    where = list(destination)
    commands = [_command("dismiss", [alert.alert_id[:ALERT_ID_PREFIX_CHARS]], where)]
    if alert.metric is not None and alert.kind in METRIC_ALERT_KINDS | WINDOW_ALERT_KINDS:
        first_run = alert.details.get("first_run") if alert.kind in FIRST_RUN_ALERT_KINDS else None
        from_run = first_run if isinstance(first_run, str) and first_run else alert.run
        commands.append(_command("accept", [alert.test, alert.metric], [("--from_run", from_run), *where]))
    mute_options = [("--metric", alert.metric)] if alert.metric is not None else []
    commands.append(_command("mute", [alert.test], mute_options + [("--until", MUTE_FOR), *where]))
    return commands


def _command(verb: str, positionals: Sequence[str], options: Sequence[Tuple[str, str]]) -> str:
    words = [shlex.quote(f"{name}={value}") if value.startswith("-") else f"{name} {shlex.quote(value)}"
             for name, value in options]
    arguments = [shlex.quote(p) for p in positionals]
    if any(p.startswith("-") for p in positionals):
        return " ".join([TRIAGE_PROG, verb, *words, "--", *arguments])
    return " ".join([TRIAGE_PROG, verb, *arguments, *words])


# -- alert states ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlertFacts:
    """What the triage rules read of an alert."""
    alert_id: str
    kind: str
    test: str
    run: str
    metric: Optional[str]
    created_at: float


def mute_covers(mute: TriageItem, alert: AlertFacts) -> bool:
    """A mute covers the test's alerts (of its metric, if it names one) raised from its time until ``until``."""
    return (mute.test == alert.test and mute.until is not None and mute.time <= alert.created_at < mute.until
            and (mute.metric is None or mute.metric == alert.metric))


def accept_covers(accept: TriageItem, alert: AlertFacts, run_start: Optional[float]) -> bool:
    """An accept covers the metric's history alerts from its run's first alert up to the action.

    ``run_start`` is the time of the earliest alert of ``accept.run`` (None: that run raised none, so the
    accept covers only alerts of that run itself, of which there are none)."""
    return (run_start is not None and accept.test == alert.test and accept.metric == alert.metric
            and alert.kind in METRIC_ALERT_KINDS | WINDOW_ALERT_KINDS
            and run_start <= alert.created_at <= accept.time)


def _run_start(alerts: Iterable[AlertFacts], test: str, run: Optional[str]) -> Optional[float]:
    times = [a.created_at for a in alerts if a.test == test and a.run == run]
    return min(times) if times else None


def alert_states(alerts: Sequence[AlertFacts], actions: Iterable[TriageItem],
                 raised_muted: Iterable[str] = ()) -> Dict[str, Tuple[AlertState, Optional[TriageItem]]]:
    """The state of each alert after the actions, and the action that set it (None: open, or muted at raise).

    ``raised_muted`` are the ids of the alerts the pipeline recorded as muted when it raised them (their
    details say so); the state of the others follows from the actions, applied in event-time order.
    A dismiss or accept overrides a mute; a later action overrides an earlier one.
    """
    muted = set(raised_muted)
    states: Dict[str, Tuple[AlertState, Optional[TriageItem]]] = {
        a.alert_id: (AlertState.MUTED if a.alert_id in muted else AlertState.OPEN, None) for a in alerts}
    by_id = {a.alert_id: a for a in alerts}
    for action in sorted(actions, key=lambda item: item.order):
        if action.action == TriageAction.DISMISS and action.alert_id in by_id:
            states[action.alert_id] = (AlertState.DISMISSED, action)
        elif action.action == TriageAction.ACCEPT:
            start = _run_start(alerts, action.test, action.run)
            for alert in alerts:
                if accept_covers(action, alert, start):
                    states[alert.alert_id] = (AlertState.ACCEPTED, action)
        elif action.action == TriageAction.MUTE:
            for alert in alerts:
                if mute_covers(action, alert) and states[alert.alert_id][0] is AlertState.OPEN:
                    states[alert.alert_id] = (AlertState.MUTED, action)
    return states


# -- the pipeline's per-test ledger ---------------------------------------------------------------------


def row_facts(row: Mapping[str, Any], created_at: float) -> AlertFacts:
    return AlertFacts(row["alert_id"], row["kind"], row["test_name"], row["run_id"], row.get("metric_name"),
                      created_at)


def with_marker(row: Mapping[str, Any], marker: Dict[str, Any]) -> Dict[str, Any]:
    """The alert row with ``details.triage`` set to ``marker``."""
    details = json.loads(row["details"]) if row.get("details") else {}
    details["triage"] = marker
    return {**row, "details": json.dumps(details, sort_keys=True, default=str)}


@record("RaisedAlert")
@dataclasses.dataclass(frozen=True)
class RaisedAlert:
    """An alert row on its way to the triage stage, with its event time (rows carry ISO text)."""
    test: str
    created_at: float
    row: Dict[str, Any]

    @property
    def order(self) -> Tuple[float, str, str]:
        return self.created_at, self.row["run_id"], self.row["alert_id"]


@record("AlertLedger")
@dataclasses.dataclass
class AlertLedger:
    """One test's triage state: the mutes that may still cover an alert, and its recent alerts.

    ``recent`` maps alert ids to (event time, row as raised), oldest first, at most
    ``MAX_RECENT_ALERTS``: what a later dismiss or accept can re-announce.
    """
    mutes: List[TriageItem] = dataclasses.field(default_factory=list)
    recent: Dict[str, Tuple[float, Dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def raise_alert(self, alert: RaisedAlert) -> Dict[str, Any]:
        """The row to write for a newly raised alert: marked muted if a mute covers it."""
        facts = row_facts(alert.row, alert.created_at)
        self.mutes = [m for m in self.mutes if m.until is not None and m.until > alert.created_at]
        covering = [m for m in self.mutes if mute_covers(m, facts)]
        row = with_marker(alert.row, covering[-1].marker(AlertState.MUTED)) if covering else alert.row
        self.recent[facts.alert_id] = (alert.created_at, alert.row)
        while len(self.recent) > MAX_RECENT_ALERTS:
            del self.recent[next(iter(self.recent))]
        return row

    def apply(self, action: TriageItem) -> List[Dict[str, Any]]:
        """Takes one action; returns the recent alerts whose state it changes, marked with the new state.
        ``Refused``: a dismiss of an alert the test has not raised."""
        if action.action == TriageAction.MUTE:
            self.mutes.append(action)
            return []
        if action.action == TriageAction.DISMISS:
            hit = self.recent.get(action.alert_id or "")
            if hit is None and len(self.recent) < MAX_RECENT_ALERTS:
                # The ledger holds every alert of the test (its seed reads the latest MAX_RECENT_ALERTS); a full
                # one cannot tell an older alert, whose state the triage table still records, from a wrong id.
                raise Refused(f"dismiss of alert {action.alert_id!r}: test {action.test!r} has raised no such alert "
                              f"(it has raised {len(self.recent)})")
            return [with_marker(hit[1], action.marker(AlertState.DISMISSED))] if hit else []
        facts = [row_facts(row, at) for at, row in self.recent.values()]
        start = _run_start(facts, action.test, action.run)
        return [with_marker(self.recent[f.alert_id][1], action.marker(AlertState.ACCEPTED))
                for f in facts if accept_covers(action, f, start)]


def alert_state_of(details: Mapping[str, Any]) -> AlertState:
    """The state an alert payload's details announce (open when they say nothing)."""
    marker = details.get("triage")
    state = marker.get("state") if isinstance(marker, dict) else None
    try:
        return AlertState(state) if isinstance(state, str) else AlertState.OPEN
    except ValueError:
        return AlertState.OPEN
