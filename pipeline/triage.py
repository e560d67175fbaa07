"""``trainguard-triage`` (``python -m pipeline.triage``): tell trainguard what an alert means.

    trainguard-triage accept TEST METRIC --from_run RUN [--note TEXT]   an intended change: re-baseline from RUN
    trainguard-triage dismiss ALERT_ID [--note TEXT]                    a false positive: the value joins the history
    trainguard-triage mute TEST [--metric M] --until TIME [--note TEXT] quiet: alerts recorded as muted, not sent
    trainguard-triage list [--test T] [--state open]                    alerts and their state

Each action is a control message of the wire contract (``trainguard.wire.Triage``).
Locally it is appended to the store's triage file (``trainguard.triage.jsonl``
beside ``trainguard.duckdb``; ``--triage_file``), which the next replay into that
store reads with its input; with ``--topic`` it is published to the pipeline's
input topic, and the streaming job applies it. Either way the pipeline applies
it at its event time (``--at``, default now) among the runs, records it in the
``triage`` table, and a replay of the same input reproduces it (``core.triage``).

``dismiss`` and ``list`` read the alerts from the store (``--local_store``, or
``--bigquery_project``/``--bigquery_dataset``); an alert id may be given by a
unique prefix of 8 or more characters.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from core.alert_record import AlertRecord, alert_from_row
from core.locations import triage_file_for
from core.records import iso_utc
from core.schema import JOB_HISTORY, METRIC_HISTORY, Table
from core.triage import TriageItem, alert_states
from core.vocabulary import AlertState, TriageAction
from sinks.seed import read_alert_rows, read_triage_actions
from sinks.stores import StoreReader, add_store_options, environment_note, from_environment, open_store
from trainguard import wire
from trainguard.cli import DASHES_NOTE, StrictArgumentParser, cloud_failure, nearest_name

PROG = "trainguard-triage"
MIN_ID_PREFIX = 8
_DURATION = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class TriageError(Exception):
    """What went wrong, in one line for the user."""


class UnknownName(TriageError):
    """A test, metric or run the store has never seen: a typo until shown otherwise (exit 2)."""


def parse_time(text: str, now: float) -> float:
    """Epoch seconds from ISO-8601 (a date is midnight UTC; no zone means UTC), epoch seconds, or +N[smhd]."""
    duration = _DURATION.match(text)
    if duration:
        return now + float(duration.group(1)) * _UNIT_SECONDS[duration.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use ISO-8601 (2026-11-30, 2026-11-30T09:00:00Z), epoch seconds or +3d") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


# -- reading the store -----------------------------------------------------------------------------


def open_store_or_fail(args: argparse.Namespace) -> StoreReader:
    try:
        return open_store(args)
    except FileNotFoundError as e:
        raise TriageError(str(e)) from None


def check_names(args: argparse.Namespace, test: str, metric: Optional[str] = None, run: Optional[str] = None) -> None:
    """Refuses (``UnknownName``) a test, metric or run the store the options name has never seen, naming the
    nearest it has; a run not finished yet passes with ``--allow_future``. Actions for the streaming job
    (``--topic``) are checked against the dataset it writes, which must then be named."""
    refuse_a_local_file_for_bigquery(args)
    if args.unchecked:
        return
    if args.topic and not args.bigquery_dataset:
        raise TriageError("with --topic, name the dataset the streaming job writes (--bigquery_project, "
                          "--bigquery_dataset) so that the test, metric and run can be checked against it "
                          "(or --unchecked)")
    store = open_store_or_fail(args)
    try:
        q, string = store.dialect.quote, store.dialect.string

        def values(column: str, table: Table, where: str = "TRUE") -> List[str]:
            rows = store.query(f"SELECT DISTINCT {q(column)} FROM {store.dialect.table(table)} WHERE {where}")
            return [row[0] for row in rows if row[0] is not None]
        of_test = f"{q('test_name')} = {string(test)}"
        _known("test", test, values("test_name", JOB_HISTORY), store.name)
        if metric is not None:
            _known(f"metric of {test}", metric, values("metric_name", METRIC_HISTORY, of_test), store.name)
        stored_run = f"SELECT 1 FROM {store.dialect.table(JOB_HISTORY)} WHERE {of_test} AND {q('run_id')} = "
        if run is not None and not args.allow_future and not store.query(f"{stored_run}{string(run)} LIMIT 1"):
            _known(f"run of {test}", run, values("run_id", JOB_HISTORY, of_test), store.name,
                   " (a run still going: --allow_future)")
    finally:
        store.close()


def _known(what: str, name: str, known: Sequence[str], store: str, hint: str = "") -> None:
    if name in known:
        return
    nearest = nearest_name(name, known)
    guess = f"; did you mean {nearest!r}?" if nearest else ""
    raise UnknownName(f"no {what} {name!r} in {store}{guess}{hint}")


def read_alerts(store: StoreReader) -> List[AlertRecord]:
    alerts = [alert_from_row(row) for row in read_alert_rows(store.query, store.dialect)]
    return sorted(alerts, key=lambda a: (a.created_at or 0.0, a.alert_id))


def read_file_actions(path: str) -> List[TriageItem]:
    """The actions in the local triage file (the replay applies them; they may not be in the store yet)."""
    if not path or not os.path.isfile(path):
        return []
    actions = []
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                message, _ = wire.parse_message(line)
                actions.append(TriageItem.of(message))
    return actions


def find_alert(alerts: Sequence[AlertRecord], wanted: str) -> AlertRecord:
    matches = [a for a in alerts if a.alert_id == wanted]
    if not matches and len(wanted) >= MIN_ID_PREFIX:
        matches = [a for a in alerts if a.alert_id.startswith(wanted)]
    if not matches:
        hint = "" if len(wanted) >= MIN_ID_PREFIX else f" (give at least {MIN_ID_PREFIX} characters)"
        raise TriageError(f"no alert {wanted!r} in the store{hint}")
    if len(matches) > 1:
        raise TriageError(f"alert id prefix {wanted!r} is ambiguous: {', '.join(a.alert_id for a in matches)}")
    return matches[0]


# -- sending actions -----------------------------------------------------------------------------------


def send(test: str, triage: wire.Triage, args: argparse.Namespace) -> str:
    """Publishes the action to --topic, or appends it to --triage_file; returns where it went."""
    if not args.topic:
        refuse_a_local_file_for_bigquery(args)
    where = deliver(test, triage, topic=args.topic, timeout=args.timeout,
                    path=None if args.topic else triage_file(args))
    return where if args.topic else f"{where}; the next replay into {args.local_store} applies it"


def deliver(test: str, triage: wire.Triage, topic: Optional[str] = None, timeout: float = 30.0,
            path: Optional[str] = None, message_id: Optional[str] = None) -> str:
    """Writes one action as a control message: published to ``topic`` (the pipeline's input), else appended to the
    local triage file ``path``; returns where it went. What ``trainguard-triage`` and the dashboard both send
    (``message_id``: the message's id, default a new one)."""
    message_id = message_id or wire.new_message_id()
    payload = wire.encode_triage(test, triage, message_id)
    wire.parse_message(payload)  # what we send must be what the pipeline accepts
    if topic:
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exceptions
        from google.cloud import pubsub_v1

        attributes = wire.message_attributes(test, triage.run or "", int(triage.time * 1000), message_id)
        try:
            future = pubsub_v1.PublisherClient().publish(topic, payload, **attributes)
            future.result(timeout=timeout)
        except auth_exceptions.DefaultCredentialsError:
            raise TriageError("no Google Cloud credentials: run 'gcloud auth application-default login' or set "
                              "GOOGLE_APPLICATION_CREDENTIALS (or PUBSUB_EMULATOR_HOST for an emulator)") from None
        except (gexc.GoogleAPICallError, TimeoutError) as e:
            raise TriageError(f"could not publish to {topic}: {type(e).__name__}: {e}") from None
        return f"published to {topic} (message {message_id})"
    if not path:
        raise TriageError("no triage file and no topic to send the action to")
    with open(path, "ab") as f:
        f.write(payload + b"\n")
    return f"appended to {path}"


def dismiss_message(alert: AlertRecord, at: float, note: str = "", user: str = "") -> wire.Triage:
    """The ``dismiss`` action of one alert."""
    return wire.Triage(TriageAction.DISMISS.value, at, metric=alert.metric, run=alert.run, alert_id=alert.alert_id,
                       alert_kind=alert.kind, instance=alert.instance, note=note, user=user)


def refuse_a_local_file_for_bigquery(args: argparse.Namespace) -> None:
    if args.bigquery_dataset and not args.topic:
        raise TriageError(f"--bigquery_dataset={args.bigquery_dataset} is read by the streaming job, which takes "
                          "triage actions from its input topic: give --topic (a local triage file reaches no job)")


def triage_file(args: argparse.Namespace) -> str:
    """Where local actions go: ``--triage_file``, else the triage file of ``--local_store``."""
    return triage_file_for(args.local_store) if args.triage_file is None else args.triage_file


def accept(args: argparse.Namespace) -> str:
    check_names(args, args.test, args.metric, args.from_run)
    triage = wire.Triage(TriageAction.ACCEPT.value, args.at, metric=args.metric, run=args.from_run,
                         note=args.note, user=args.user, future=args.allow_future)
    where = send(args.test, triage, args)
    return f"accepted {args.metric} of {args.test} at its level from run {args.from_run}: {where}"


def dismiss(args: argparse.Namespace) -> str:
    store = open_store_or_fail(args)
    try:
        alert = find_alert(read_alerts(store), args.alert_id)
    finally:
        store.close()
    where = send(alert.test, dismiss_message(alert, args.at, args.note, args.user), args)
    return f"dismissed {alert.kind} {alert.alert_id} ({alert.test} {alert.run} {alert.metric or ''}): {where}"


def mute(args: argparse.Namespace) -> str:
    if args.until <= args.at:
        raise TriageError(f"--until {iso_utc(args.until)} is not after --at {iso_utc(args.at)}")
    check_names(args, args.test, args.metric)
    triage = wire.Triage(TriageAction.MUTE.value, args.at, metric=args.metric, until=args.until, note=args.note,
                         user=args.user)
    where = send(args.test, triage, args)
    what = f"{args.metric} of {args.test}" if args.metric else f"every metric of {args.test}"
    return f"muted {what} until {iso_utc(args.until)}: {where}"


def list_alerts(args: argparse.Namespace) -> str:
    store = open_store_or_fail(args)
    try:
        alerts = read_alerts(store)
        stored = read_triage_actions(store.query, store.dialect)
    finally:
        store.close()
    known = {a.id for a in stored}
    pending = [a for a in read_file_actions(triage_file(args)) if a.id not in known]
    states = alert_states([a.facts() for a in alerts], stored + pending,
                          raised_muted=[a.alert_id for a in alerts if a.state is AlertState.MUTED])
    shown = [a for a in alerts if (args.test is None or a.test == args.test)
             and (args.state is None or states[a.alert_id][0].value == args.state)][-args.limit:]
    rows: List[Dict[str, Any]] = []
    for alert in shown:
        state, action = states[alert.alert_id]
        rows.append({"alert_id": alert.alert_id, "state": state.value, "kind": alert.kind, "test": alert.test,
                     "run": alert.run, "metric": alert.metric, "created_at": iso_utc(alert.created_at),
                     "note": (action.note if action else alert.triage.get("note")) or "",
                     "pending": bool(action and action.id not in known)})
    if args.json:
        return json.dumps(rows, indent=1)
    lines = [f"{'alert id':<32}  {'state':<9}  {'kind':<21}  {'test':<24}  {'run':<20}  metric"]
    for row in rows:
        state = row["state"] + ("*" if row["pending"] else "")
        lines.append(f"{row['alert_id']:<32}  {state:<9}  {row['kind']:<21}  {row['test']:<24}  {row['run']:<20}  "
                     f"{row['metric'] or ''}{'  # ' + row['note'] if row['note'] else ''}")
    lines.append(f"{len(rows)} alert(s) shown of {len(alerts)} in {store.name}"
                 + ("; * = set by an action in the triage file that no replay has applied yet" if pending else ""))
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------------------


def build_parser(now: float) -> argparse.ArgumentParser:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = StrictArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="\n\n".join(__doc__.split("\n\n")[1:3]).replace("``", "")
                                  + "\n\n" + DASHES_NOTE)
    common = StrictArgumentParser(add_help=False, formatter_class=formatter)
    where = common.add_argument_group("where actions go and alerts are read")
    where.add_argument("--triage_file", default=None,
                       help="local JSONL file of triage actions, applied by the next replay into --local_store "
                            "(default: the store's own, e.g. trainguard.triage.jsonl beside trainguard.duckdb)")
    where.add_argument("--topic", default=from_environment("topic"),
                       help="publish to this Pub/Sub topic (the pipeline's input: projects/P/topics/T) instead"
                            + environment_note("topic"))
    where.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for Pub/Sub to take a message")
    where.add_argument("--unchecked", action="store_true",
                       help="accept and mute: do not check the test, metric and run against the store")
    add_store_options(where)
    said = StrictArgumentParser(add_help=False, formatter_class=formatter)
    words = said.add_argument_group("the action")
    words.add_argument("--note", default="", help="why (shown with the alert)")
    words.add_argument("--user", default=os.environ.get("USER", ""), help="who says so")
    words.add_argument("--at", type=lambda text: parse_time(text, now), default=now,
                       help="event time of the action (ISO-8601, epoch seconds or +N[smhd]); default: now")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, *parents: StrictArgumentParser) -> StrictArgumentParser:
        return commands.add_parser(name, help=help_text, description=help_text, parents=list(parents),
                                   formatter_class=formatter)

    accept_parser = command("accept", "An intended change: the metric's baseline restarts from a run.", said, common)
    accept_parser.add_argument("test")
    accept_parser.add_argument("metric")
    accept_parser.add_argument("--from_run", required=True, help="the first run at the new level")
    accept_parser.add_argument("--allow_future", action="store_true",
                               help="--from_run is a run still going or to come, not in the store yet (the "
                                    "pipeline waits for it; without this, it refuses a run its history does not hold)")
    accept_parser.set_defaults(handler=accept)
    dismiss_parser = command("dismiss", "A false positive: the alert's value joins the history as normal.",
                             said, common)
    dismiss_parser.add_argument("alert_id", help=f"the alert's id, or a unique prefix of {MIN_ID_PREFIX}+ characters")
    dismiss_parser.set_defaults(handler=dismiss)
    mute_parser = command("mute", "Quiet for a while: the test's alerts are recorded as muted and not sent.",
                          said, common)
    mute_parser.add_argument("test")
    mute_parser.add_argument("--metric", default=None, help="mute only this metric (default: every metric)")
    mute_parser.add_argument("--until", required=True, type=lambda text: parse_time(text, now),
                             help="end of the quiet period (ISO-8601, epoch seconds or +N[smhd])")
    mute_parser.set_defaults(handler=mute)
    list_parser = command("list", "Alerts and their triage state, newest last.", common)
    list_parser.add_argument("--test", default=None, help="only this test")
    list_parser.add_argument("--state", default=None, choices=[s.value for s in AlertState], help="only this state")
    list_parser.add_argument("--limit", type=int, default=50, help="at most this many alerts, the newest")
    list_parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_parser.set_defaults(handler=list_alerts)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser(time.time()).parse_args(argv)
    try:
        print(args.handler(args))
    except UnknownName as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except TriageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a store or network failure: one line, not a traceback
        print(f"{PROG}: error: {cloud_failure(e) or f'{type(e).__name__}: {e}'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

