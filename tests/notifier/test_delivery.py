"""End to end: alerts from the in-process Pub/Sub server, e-mails through the real sendgrid client.

The notifier runs on a :class:`FakeClock` (grouping waits, backoff and the
budget day move only when a test advances it); Pub/Sub and the fake SendGrid
endpoint are real servers on other threads, so tests wait for their effects
with a generous timeout and never assert on durations.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
from typing import List

import pytest
from google.cloud import pubsub_v1

from notifier.api_key import Secret
from notifier.cli import Loop
from notifier.deadletter import FileDeadLetters, PubSubDeadLetters
from notifier.notifier import Notifier
from notifier.sending import SendGridSender
from notifier.sources import PubSubSource
from notifier.state import NotifierState, next_utc_midnight
from sinks.pubsub import alert_message
from tests.notifier.support import API_KEY, FakeClock, alert, config, run_alerts, wait_until
from tests.servers.pubsub import PubSubServer
from tests.servers.sendgrid import FakeSendGrid, Reply, sendgrid_server  # noqa: F401 - fixture

_ALERT_ID = re.compile(r"^   alert ([0-9a-f]{32})", re.MULTILINE)


def mailed_ids(server: FakeSendGrid) -> List[str]:
    """Alert ids carried by accepted e-mails, in order, one entry per e-mail carrying it."""
    return [i for body in server.accepted_bodies() for i in _ALERT_ID.findall(body["content"][0]["value"])]


@dataclasses.dataclass
class Harness:
    """A notifier reading the test subscription and sending to the fake SendGrid."""
    pubsub: PubSubServer
    sendgrid: FakeSendGrid
    tmp_path: object
    email_config: object
    dead_letters: object = None
    clock: FakeClock = dataclasses.field(default_factory=FakeClock)

    def __post_init__(self):
        self.publisher = pubsub_v1.PublisherClient()
        self.topic = self.publisher.create_topic(name=self.pubsub.topic_path("alerts")).name
        self.subscription = self.pubsub.subscription_path("alerts-email")
        with pubsub_v1.SubscriberClient() as subscriber:
            subscriber.create_subscription(request={"name": self.subscription, "topic": self.topic})
        self.dead_letters = self.dead_letters or FileDeadLetters(str(self.tmp_path / "dead.jsonl"))
        self.published = []
        self.start()

    def start(self) -> None:
        """(Re)start the notifier process: fresh state handle, source and notifier, same state file."""
        self.state = NotifierState(str(self.tmp_path / "state.sqlite"))
        self.source = PubSubSource(self.subscription).start()
        sender = SendGridSender(Secret(API_KEY), host=self.sendgrid.url)
        self.notifier = Notifier(self.email_config, self.state, sender, self.dead_letters)
        self.loop = Loop(self.notifier, self.source, self.clock)

    def stop(self) -> None:
        self.notifier.close()
        self.source.close()
        self.state.close()

    def publish(self, *alerts) -> None:
        """Publish alerts exactly as the pipeline's PublishAlerts does (data + test/run/kind attributes)."""
        for item in alerts:
            message = alert_message(item.to_row())
            self.publisher.publish(self.topic, message.data, **message.attributes).result(timeout=10)
            self.published.append(item.alert_id)

    def receive(self, count: int) -> None:
        """Pump until the notifier has received ``count`` deliveries in total."""
        wait_until(lambda: self.notifier.stats.received >= count, lambda: self.loop.step(max_wait=0.05))

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.notifier.tick(self.clock.now())

    def wait_settled(self, acked: int) -> None:
        """Until Pub/Sub counts ``acked`` acks and nothing is waiting or outstanding."""
        def settled() -> bool:
            stats = self.pubsub.subscription_stats("alerts-email")
            return stats.acked >= acked and stats.backlog == 0 and stats.outstanding == 0

        wait_until(settled)


@pytest.fixture
def harness_factory(pubsub_server, sendgrid_server, tmp_path):  # noqa: F811 - fixture from import
    made = []

    def make(**config_overrides) -> Harness:
        dead_letters = config_overrides.pop("dead_letters", None)
        made.append(Harness(pubsub_server, sendgrid_server, tmp_path, config(**config_overrides), dead_letters))
        return made[-1]

    yield make
    for harness in made:
        harness.stop()
        harness.publisher.stop()


def test_one_digest_per_run_after_the_group_wait(harness_factory, sendgrid_server):  # noqa: F811
    h = harness_factory(group_wait_seconds=60)
    h.publish(*run_alerts("pt-cifar", "run-1", ["a", "b"]), alert(test="pt-cifar", run="run-2", metric="c"))
    h.receive(3)
    h.advance(30)
    h.publish(alert(test="pt-cifar", run="run-1", metric="d"))
    h.receive(4)
    assert sendgrid_server.requests == [] and h.pubsub.subscription_stats("alerts-email").acked == 0
    h.advance(30)  # 60 s after the first alert of each run

    bodies = sendgrid_server.accepted_bodies()
    assert [b["subject"] for b in bodies] == ["[trainguard] pt-cifar run run-1: a, b and 1 more out of bounds",
                                              "[trainguard] pt-cifar run run-2: c out of bounds"]
    first = bodies[0]
    assert first["from"] == {"name": "trainguard", "email": "alerts@example.com"}
    assert first["personalizations"] == [{"to": [{"email": "oncall@example.com"}]}]
    assert [c["type"] for c in first["content"]] == ["text/plain", "text/html"]
    assert sorted(mailed_ids(sendgrid_server)) == sorted(h.published)
    assert {r.headers["Authorization"] for r in sendgrid_server.requests} == {f"Bearer {API_KEY}"}
    h.wait_settled(acked=4)


def test_retries_with_backoff_and_acks_only_after_202(harness_factory, sendgrid_server):  # noqa: F811
    h = harness_factory(retry={"initial_seconds": 2, "multiplier": 2, "max_seconds": 60, "jitter": 0})
    sendgrid_server.script(Reply(429, {"Retry-After": "30"}), 500, 503)
    h.publish(*run_alerts("t", "r", ["a", "b"]))
    h.receive(2)
    attempts = []
    for advance in (60, 29, 1, 3.9, 0.1, 8):  # group wait, Retry-After 30 s, then 4 s and 8 s of backoff
        h.advance(advance)
        attempts.append([r.status for r in sendgrid_server.requests])
        if len(attempts[-1]) < 4:
            assert h.pubsub.subscription_stats("alerts-email").acked == 0
    assert attempts == [[429], [429], [429, 500], [429, 500], [429, 500, 503], [429, 500, 503, 202]]
    assert sorted(mailed_ids(sendgrid_server)) == sorted(h.published)
    h.wait_settled(acked=2)


@pytest.mark.parametrize("status", [401, 403, 400])
def test_permanent_failure_keeps_the_alerts_in_the_dead_letter_file(harness_factory, sendgrid_server,  # noqa: F811
                                                                     tmp_path, caplog, status):
    h = harness_factory()
    sendgrid_server.script(status)
    h.publish(*run_alerts("t", "r", ["a", "b"]))
    h.receive(2)
    with caplog.at_level(logging.DEBUG):
        h.advance(60)
    records = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert sorted(r["alert"]["alert_id"] for r in records) == sorted(h.published)
    assert {(r["status"], r["attributes"]["test"]) for r in records} == {(status, "t")}
    assert f"HTTP {status}" in records[0]["reason"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"HTTP {status}" in errors[0] and "dead.jsonl" in errors[0]
    assert API_KEY not in caplog.text
    h.wait_settled(acked=2)
    assert len(sendgrid_server.requests) == 1  # not retried


def test_permanent_failure_can_dead_letter_to_a_topic(harness_factory, pubsub_server, sendgrid_server):  # noqa: F811
    pubsub_v1.PublisherClient().create_topic(name=pubsub_server.topic_path("alerts-dead"))
    h = harness_factory(dead_letters=PubSubDeadLetters(pubsub_server.topic_path("alerts-dead")))
    sendgrid_server.script(401)
    h.publish(alert(test="t", run="r"))
    h.receive(1)
    h.advance(60)
    (dead,) = pubsub_server.published_messages("alerts-dead")
    assert json.loads(dead.data)["alert_id"] == h.published[0]
    assert dead.attributes["status"] == "401" and dead.attributes["test"] == "t"
    assert "rejected the API key" in dead.attributes["reason"]
    h.wait_settled(acked=1)
    h.dead_letters.close()


def test_redelivered_and_republished_alerts_are_mailed_once(harness_factory, pubsub_server,
                                                            sendgrid_server):  # noqa: F811
    h = harness_factory()
    alerts = run_alerts("t", "r", ["a", "b"])
    h.publish(*alerts)
    h.receive(2)
    assert pubsub_server.redeliver_all_unacked("alerts-email") == 2  # lease expiry while grouping
    h.receive(4)
    h.advance(60)
    assert len(sendgrid_server.accepted_bodies()) == 1
    h.wait_settled(acked=2)  # acks of the expired copies do not count

    pubsub_server.duplicate_next(2)
    h.publish(*alerts)  # the pipeline published again (a retried bundle)
    h.receive(8)
    h.stop()
    h.start()  # and a restart: the sent ids come from the state file
    h.publish(*alerts)
    h.receive(2)
    h.advance(3600)
    assert len(sendgrid_server.requests) == 1 and sorted(mailed_ids(sendgrid_server)) == sorted(h.published[:2])
    h.wait_settled(acked=2 + 4 + 2)


def test_budget_folds_the_rest_into_one_summary(harness_factory, sendgrid_server):  # noqa: F811
    h = harness_factory(daily_budget=4, summary_wait_seconds=600)  # 3 digests + 1 summary per day
    h.publish(*(alert(test="t", run=f"r{i}") for i in range(1, 6)), alert(test="t", run="r5", metric="m2"))
    h.receive(6)
    h.advance(60)
    assert [b["subject"] for b in sendgrid_server.accepted_bodies()] == [
        f"[trainguard] t run r{i}: Accuracy/test_final out of bounds" for i in (1, 2, 3)]
    h.advance(599)
    assert len(sendgrid_server.requests) == 3
    h.advance(1)
    summary = sendgrid_server.accepted_bodies()[-1]
    assert summary["subject"] == "[trainguard] daily e-mail budget reached: 3 alerts from 2 runs of 1 test"

    h.publish(alert(test="t", run="r6"))  # the budget is spent: waits for the next UTC day
    h.receive(7)
    h.advance(3600)
    assert len(sendgrid_server.requests) == 4
    h.advance(next_utc_midnight(h.clock.now()) - h.clock.now())
    assert sendgrid_server.accepted_bodies()[-1]["subject"].endswith("1 alert from 1 run of 1 test")
    counts = collections.Counter(mailed_ids(sendgrid_server))
    assert sorted(counts) == sorted(h.published) and set(counts.values()) == {1}
    h.wait_settled(acked=7)


def test_nothing_is_lost_while_sendgrid_is_down(harness_factory, pubsub_server, sendgrid_server):  # noqa: F811
    h = harness_factory(retry={"initial_seconds": 5, "multiplier": 2, "max_seconds": 40, "jitter": 0})
    sendgrid_server.set_default(500)
    h.publish(*run_alerts("t", "r1", ["a", "b"]), alert(test="t", run="r2"))
    h.receive(3)
    for _ in range(6):
        h.advance(60)
    failures = len(sendgrid_server.requests)
    assert failures >= 6 and pubsub_server.subscription_stats("alerts-email").acked == 0

    pubsub_server.redeliver_all_unacked("alerts-email")  # leases ran out during the outage
    h.publish(alert(test="t", run="r3"))
    h.receive(7)
    h.stop()  # and the process restarts, still during the outage: held alerts are nacked
    h.start()
    h.receive(4)
    h.advance(60)
    assert {r.status for r in sendgrid_server.requests} == {500}

    sendgrid_server.set_default(202)
    h.advance(40)
    counts = collections.Counter(mailed_ids(sendgrid_server))
    assert sorted(counts) == sorted(h.published) and set(counts.values()) == {1}
    h.wait_settled(acked=4)
