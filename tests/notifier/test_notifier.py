"""Notifier rules that need neither Pub/Sub nor a file: per-recipient budget, a failing dead-letter sink."""

from __future__ import annotations

import dataclasses
import json
import os

from notifier.api_key import Secret
from notifier.deadletter import FileDeadLetters
from notifier.notifier import Notifier
from notifier.sending import SendGridSender
from notifier.state import NotifierState
from tests.notifier.support import API_KEY, START, Settled, alert, config, payload
from tests.servers.sendgrid import sendgrid_server  # noqa: F401 - fixture


def notifier(sendgrid, tmp_path, dead_letters=None, **overrides) -> Notifier:
    return Notifier(config(**overrides), NotifierState(str(tmp_path / "state.sqlite")),
                    SendGridSender(Secret(API_KEY), host=sendgrid.url),
                    dead_letters or FileDeadLetters(str(tmp_path / "dead.jsonl")))


def test_budget_counts_recipients_and_the_summary_falls_back_to_the_default_recipients(sendgrid_server,  # noqa: F811
                                                                                        tmp_path):
    big = ["a@x.example", "b@x.example", "c@x.example"]
    n = notifier(sendgrid_server, tmp_path, daily_budget=5, per_test={"big": {"recipients": big}})
    settled = Settled()
    for run in ("r1", "r2"):
        n.receive(settled.delivery(payload(alert(test="big", run=run))), START)
    n.tick(START + 60)  # r1 costs 3 of the 4 units outside the reserve; r2 does not fit
    n.tick(START + 60 + 600)  # the summary: all three "big" recipients do not fit in 2 units, the default does
    digest, summary = sendgrid_server.accepted_bodies()
    assert [p["email"] for p in digest["personalizations"][0]["to"]] == big
    assert [p["email"] for p in summary["personalizations"][0]["to"]] == ["oncall@example.com"]
    assert n.state.budget_used(START) == 4 and len(settled.acked) == 2


def test_a_failing_dead_letter_sink_keeps_the_alerts_until_it_works(sendgrid_server, tmp_path):  # noqa: F811
    blocked = tmp_path / "dead"
    blocked.mkdir()  # a directory where the file should be: every write fails
    n = notifier(sendgrid_server, tmp_path, FileDeadLetters(str(blocked)))
    settled = Settled()
    n.receive(settled.delivery(b"garbage"), START)
    n.receive(settled.delivery(payload(alert(run="refused"))), START)
    n.receive(settled.delivery(payload(alert(run="fine"))), START + 1)
    sendgrid_server.script(403, 202)
    n.tick(START + 61)
    assert settled.acked == [payload(alert(run="fine"))]  # mailing goes on meanwhile
    assert n.held_count == 2 and n.next_wake(START + 61) > START + 61
    os.rmdir(blocked)
    n.tick(n.next_wake(START + 61))
    assert settled.acked[1:] == [b"garbage", payload(alert(run="refused"))] and n.held_count == 0
    assert len(blocked.read_text().splitlines()) == 2 and len(sendgrid_server.requests) == 2


def triaged(item, state: str) -> bytes:
    """The payload of an alert announced again by the pipeline with a triage state (``core.triage``)."""
    return payload(dataclasses.replace(item, details={**item.details, "triage": {"state": state, "action_id": "a1"}}))


def test_muted_dismissed_and_accepted_alerts_are_not_mailed_and_every_copy_is_settled(sendgrid_server,  # noqa: F811
                                                                                        tmp_path):
    n = notifier(sendgrid_server, tmp_path)
    settled = Settled()
    kept, dismissed, accepted = (alert(run="r1", metric=m) for m in ("loss_final", "acc_final", "step_time"))
    muted = alert(run="r2")
    for item in (kept, dismissed, accepted):
        n.receive(settled.delivery(payload(item)), START)
    n.receive(settled.delivery(triaged(muted, "muted")), START)
    n.receive(settled.delivery(triaged(dismissed, "dismissed")), START + 10)  # within the group wait
    n.receive(settled.delivery(triaged(accepted, "accepted")), START + 20)
    n.receive(settled.delivery(payload(dismissed)), START + 30)  # a late copy of the open original
    n.tick(START + 120)
    [digest] = sendgrid_server.accepted_bodies()
    text = json.dumps(digest)
    assert "loss_final" in text and "acc_final" not in text and "step_time" not in text and "r2" not in text
    assert len(settled.acked) == 7 and n.held_count == 0 and n.stats.triaged == 3


def test_a_run_whose_alerts_are_all_triaged_gets_no_e_mail(sendgrid_server, tmp_path):  # noqa: F811
    n = notifier(sendgrid_server, tmp_path)
    settled = Settled()
    item = alert(run="r1")
    n.receive(settled.delivery(payload(item)), START)
    n.receive(settled.delivery(triaged(item, "dismissed")), START + 1)
    n.tick(START + 120)
    assert sendgrid_server.requests == [] and len(settled.acked) == 2
