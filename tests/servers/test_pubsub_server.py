"""Tests of the in-process Pub/Sub server, driven by the real Google clients."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from typing import Callable

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from tests.servers.pubsub import PubSubServer

WAIT_SECONDS = 10.0
"""Generous upper bound for anything the tests wait for."""


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


@pytest.fixture
def publisher(pubsub_server: PubSubServer) -> Iterator[pubsub_v1.PublisherClient]:
    client = pubsub_v1.PublisherClient()
    yield client
    client.stop()


@pytest.fixture
def subscriber(pubsub_server: PubSubServer) -> Iterator[pubsub_v1.SubscriberClient]:
    with pubsub_v1.SubscriberClient() as client:
        yield client


@pytest.fixture
def topic(pubsub_server: PubSubServer, publisher: pubsub_v1.PublisherClient) -> str:
    return publisher.create_topic(name=pubsub_server.topic_path("events")).name


@pytest.fixture
def make_subscription(
    pubsub_server: PubSubServer, subscriber: pubsub_v1.SubscriberClient, topic: str
) -> Callable[..., str]:
    """Create a subscription on ``topic``; keyword arguments go into the Subscription."""

    def make(subscription_id: str = "events-sub", **fields) -> str:
        name = pubsub_server.subscription_path(subscription_id)
        return subscriber.create_subscription(request={"name": name, "topic": topic, **fields}).name

    return make


@pytest.fixture
def subscription(make_subscription: Callable[..., str]) -> str:
    return make_subscription()


def publish(publisher: pubsub_v1.PublisherClient, topic: str, *payloads: bytes, **attributes: str) -> list[str]:
    """Publish ``payloads`` and wait until the server has accepted them all."""
    publish_futures = [publisher.publish(topic, payload, **attributes) for payload in payloads]
    return [future.result(timeout=WAIT_SECONDS) for future in publish_futures]


def pull_until(subscriber: pubsub_v1.SubscriberClient, subscription: str, count: int) -> list:
    """Pull (without acking) until ``count`` messages arrived; fails after WAIT_SECONDS."""
    received: list = []
    give_up_at = time.monotonic() + WAIT_SECONDS
    while len(received) < count and time.monotonic() < give_up_at:
        response = subscriber.pull(subscription=subscription, max_messages=count - len(received))
        received.extend(response.received_messages)
    assert len(received) == count, f"pulled {len(received)} of {count} messages"
    return received


def pull_now(subscriber: pubsub_v1.SubscriberClient, subscription: str, max_messages: int = 100) -> list:
    """Whatever is deliverable right now (``return_immediately``, deprecated but honoured)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        response = subscriber.pull(subscription=subscription, max_messages=max_messages, return_immediately=True)
    return list(response.received_messages)


def payloads(received: list) -> list[bytes]:
    return [message.message.data for message in received]


def wait_until(condition: Callable[[], bool], what: str) -> None:
    give_up_at = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < give_up_at, f"timed out waiting for {what}"
        time.sleep(0.02)


class Collector:
    """A ``SubscriberClient.subscribe`` callback that records messages.

    ``decide(message)`` returns True to ack, False to nack and None to leave
    the message outstanding (kept in ``held``).
    """

    def __init__(self, decide: Callable[[object], bool | None] = lambda message: True) -> None:
        self.messages: list = []
        self.held: list = []
        self._decide = decide
        self._cond = threading.Condition()

    def __call__(self, message) -> None:
        decision = self._decide(message)
        if decision is True:
            message.ack()
        elif decision is False:
            message.nack()
        with self._cond:
            if decision is None:
                self.held.append(message)
            self.messages.append(message)
            self._cond.notify_all()

    def wait_for(self, count: int) -> list:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.messages) >= count, WAIT_SECONDS), (
                f"received {len(self.messages)} of {count} messages"
            )
            return list(self.messages)


class streaming_pull:  # noqa: N801 - used like a function
    """Context manager running ``subscriber.subscribe`` and cancelling it on exit."""

    def __init__(self, subscriber: pubsub_v1.SubscriberClient, subscription: str, callback, **kwargs) -> None:
        self._future = subscriber.subscribe(subscription, callback, **kwargs)

    def __enter__(self):
        return self._future

    def __exit__(self, *exc_info) -> None:
        self._future.cancel()
        self._future.result(timeout=WAIT_SECONDS)


# --------------------------------------------------------------------------
# Administration and errors
# --------------------------------------------------------------------------


def test_topic_and_subscription_administration(pubsub_server, publisher, subscriber, topic, subscription):
    project = f"projects/{pubsub_server.project}"
    assert publisher.get_topic(topic=topic).name == topic
    assert [t.name for t in publisher.list_topics(project=project)] == [topic]
    assert list(publisher.list_topic_subscriptions(topic=topic)) == [subscription]
    assert [s.name for s in subscriber.list_subscriptions(project=project)] == [subscription]

    created = subscriber.get_subscription(subscription=subscription)
    assert created.topic == topic
    assert created.ack_deadline_seconds == 10

    updated = publisher.update_topic(
        request={"topic": {"name": topic, "labels": {"team": "ml"}}, "update_mask": {"paths": ["labels"]}}
    )
    assert dict(updated.labels) == {"team": "ml"}

    subscriber.delete_subscription(subscription=subscription)
    assert list(publisher.list_topic_subscriptions(topic=topic)) == []
    publisher.delete_topic(topic=topic)
    assert list(publisher.list_topics(project=project)) == []


def test_list_topics_paginates(pubsub_server, publisher):
    names = [publisher.create_topic(name=pubsub_server.topic_path(f"t{i}")).name for i in range(5)]
    pager = publisher.list_topics(request={"project": f"projects/{pubsub_server.project}", "page_size": 2})
    assert [t.name for t in pager] == sorted(names)


def test_missing_and_duplicate_resources_raise(pubsub_server, publisher, subscriber, topic, subscription):
    missing_topic = pubsub_server.topic_path("missing")
    missing_subscription = pubsub_server.subscription_path("missing")

    with pytest.raises(exceptions.AlreadyExists):
        publisher.create_topic(name=topic)
    with pytest.raises(exceptions.AlreadyExists):
        subscriber.create_subscription(name=subscription, topic=topic)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=missing_topic)
    with pytest.raises(exceptions.NotFound):
        publisher.delete_topic(topic=missing_topic)
    with pytest.raises(exceptions.NotFound):
        subscriber.create_subscription(name=missing_subscription, topic=missing_topic)
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(subscription=missing_subscription)
    with pytest.raises(exceptions.NotFound):
        subscriber.pull(subscription=missing_subscription, max_messages=1)
    with pytest.raises(exceptions.NotFound):
        publisher.publish(missing_topic, b"x").result(timeout=WAIT_SECONDS)
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name="not-a-topic-path")


# --------------------------------------------------------------------------
# Delivery
# --------------------------------------------------------------------------


def test_pull_returns_published_messages_with_attributes(pubsub_server, publisher, subscriber, topic, subscription):
    message_ids = publish(publisher, topic, b"one", b"two", run="r1", step="7")

    received = pull_until(subscriber, subscription, 2)

    assert payloads(received) == [b"one", b"two"]
    assert [m.message.message_id for m in received] == message_ids
    for message in received:
        assert dict(message.message.attributes) == {"run": "r1", "step": "7"}
        assert message.message.publish_time is not None
        assert message.delivery_attempt == 0  # only set with a dead-letter policy
    subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in received])
    assert pull_now(subscriber, subscription) == []
    assert pubsub_server.subscription_stats(subscription).acked == 2
    assert [m.data for m in pubsub_server.published_messages(topic)] == [b"one", b"two"]


def test_ordering_key_is_kept(pubsub_server, topic, subscription):
    client = pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    try:
        client.publish(topic, b"ordered", ordering_key="run-1").result(timeout=WAIT_SECONDS)
    finally:
        client.stop()
    assert pubsub_server.published_messages(topic)[0].ordering_key == "run-1"


def test_messages_published_before_the_subscription_are_not_delivered(publisher, subscriber, topic, make_subscription):
    publish(publisher, topic, b"before")
    subscription = make_subscription()
    publish(publisher, topic, b"after")

    assert payloads(pull_until(subscriber, subscription, 1)) == [b"after"]
    assert pull_now(subscriber, subscription) == []


def test_streaming_pull_delivers_and_acks(pubsub_server, publisher, subscriber, topic, subscription):
    collector = Collector()
    with streaming_pull(subscriber, subscription, collector):
        publish(publisher, topic, b"a", b"b", b"c", source="stream")
        received = collector.wait_for(3)
        wait_until(lambda: pubsub_server.subscription_stats(subscription).acked == 3, "3 acks")

    assert sorted(m.data for m in received) == [b"a", b"b", b"c"]
    assert all(m.attributes["source"] == "stream" for m in received)
    stats = pubsub_server.subscription_stats(subscription)
    assert (stats.delivered, stats.outstanding, stats.backlog) == (3, 0, 0)


def test_streaming_pull_respects_client_flow_control(pubsub_server, publisher, subscriber, topic, subscription):
    collector = Collector(decide=lambda message: None)  # hold every message
    flow_control = pubsub_v1.types.FlowControl(max_messages=2)
    with streaming_pull(subscriber, subscription, collector, flow_control=flow_control):
        publish(publisher, topic, *[b"m%d" % i for i in range(5)])
        collector.wait_for(2)
        for _ in range(10):  # the server must not push beyond the client's limit
            assert pubsub_server.subscription_stats(subscription).outstanding <= 2
            time.sleep(0.02)
        for message in list(collector.held):
            message.ack()
        collector.wait_for(4)


def test_unacked_message_is_redelivered_after_its_ack_deadline(publisher, subscriber, topic, make_subscription):
    subscription = make_subscription(ack_deadline_seconds=1)
    publish(publisher, topic, b"slow")

    first = pull_until(subscriber, subscription, 1)[0]
    again = pull_until(subscriber, subscription, 1)[0]  # arrives once the 1 s deadline passed

    assert again.message.message_id == first.message.message_id
    assert again.ack_id != first.ack_id
    subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id])  # stale: ignored
    subscriber.acknowledge(subscription=subscription, ack_ids=[again.ack_id])


def test_nack_redelivers_immediately(pubsub_server, publisher, subscriber, topic, subscription):
    publish(publisher, topic, b"retry-me")
    first = pull_until(subscriber, subscription, 1)[0]

    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=0)

    assert payloads(pull_now(subscriber, subscription)) == [b"retry-me"]
    assert pubsub_server.subscription_stats(subscription).nacked == 1


def test_modify_ack_deadline_extends_the_lease(publisher, subscriber, topic, make_subscription):
    subscription = make_subscription(ack_deadline_seconds=1)
    publish(publisher, topic, b"long-job")
    first = pull_until(subscriber, subscription, 1)[0]

    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=60)

    time.sleep(1.2)  # past the original 1 s deadline
    assert pull_now(subscriber, subscription) == []


def test_dead_letter_after_max_delivery_attempts(pubsub_server, publisher, subscriber, topic, make_subscription):
    dead_letters = publisher.create_topic(name=pubsub_server.topic_path("dead-letters")).name
    subscription = make_subscription(dead_letter_policy={"dead_letter_topic": dead_letters, "max_delivery_attempts": 3})
    collector = Collector(decide=lambda message: False)  # always nack

    with streaming_pull(subscriber, subscription, collector):
        publish(publisher, topic, b"poison", kind="bad")
        [forwarded] = pubsub_server.wait_for_published(dead_letters, 1)

    assert [m.delivery_attempt for m in collector.messages] == [1, 2, 3]
    assert forwarded.data == b"poison"
    assert forwarded.attributes["kind"] == "bad"
    assert forwarded.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "3"
    assert forwarded.attributes["CloudPubSubDeadLetterSourceSubscription"] == "events-sub"
    stats = pubsub_server.subscription_stats(subscription)
    assert (stats.dead_lettered, stats.backlog, stats.outstanding) == (1, 0, 0)


def test_deleting_a_subscription_ends_its_streams(subscriber, subscription):
    stream = subscriber.subscribe(subscription, Collector())

    subscriber.delete_subscription(subscription=subscription)

    with pytest.raises(exceptions.NotFound):
        stream.result(timeout=WAIT_SECONDS)


# --------------------------------------------------------------------------
# Fault injection
# --------------------------------------------------------------------------


def test_duplicate_next_delivers_a_message_twice(pubsub_server, publisher, subscriber, topic, subscription):
    pubsub_server.duplicate_next(1)
    publish(publisher, topic, b"first", b"second")

    received = pull_until(subscriber, subscription, 3)

    assert payloads(received) == [b"first", b"first", b"second"]
    assert received[0].message.message_id == received[1].message.message_id
    assert received[0].ack_id != received[1].ack_id


def test_duplicate_probability_is_deterministic_for_a_seed(
    pubsub_server, publisher, subscriber, topic, make_subscription
):
    def delivered_payloads(subscription_id: str) -> list[bytes]:
        subscription = make_subscription(subscription_id)
        pubsub_server.configure_faults(duplicate_probability=0.5, seed=42)
        publish(publisher, topic, *[b"%d" % i for i in range(20)])
        received = pull_now(subscriber, subscription)
        subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in received])
        return payloads(received)

    first, second = delivered_payloads("run-1"), delivered_payloads("run-2")

    assert first == second
    assert 20 < len(first) < 40
    assert sorted(set(first)) == sorted(b"%d" % i for i in range(20))


def test_reorder_shuffles_deliveries_deterministically(pubsub_server, publisher, subscriber, topic, make_subscription):
    originals = [b"%02d" % i for i in range(10)]

    def delivered_order(subscription_id: str) -> list[bytes]:
        subscription = make_subscription(subscription_id)
        pubsub_server.configure_faults(reorder=True, seed=7)
        publish(publisher, topic, *originals)
        return payloads(pull_now(subscriber, subscription))

    first, second = delivered_order("run-1"), delivered_order("run-2")

    assert first == second
    assert first != originals
    assert sorted(first) == originals


def test_delivery_delay_holds_messages_back(pubsub_server, publisher, subscriber, topic, subscription):
    pubsub_server.configure_faults(delivery_delay=1.5)
    publish(publisher, topic, b"late")

    assert pull_now(subscriber, subscription) == []
    assert payloads(pull_until(subscriber, subscription, 1)) == [b"late"]


def test_redeliver_all_unacked(pubsub_server, publisher, subscriber, topic, subscription):
    publish(publisher, topic, b"x", b"y")
    pull_until(subscriber, subscription, 2)

    assert pubsub_server.redeliver_all_unacked() == 2

    assert sorted(payloads(pull_now(subscriber, subscription))) == [b"x", b"y"]
    assert pubsub_server.subscription_stats(subscription).expired == 2


# --------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------


def test_stop_ends_open_streams_and_leaves_no_threads(monkeypatch):
    threads_before = set(threading.enumerate())
    server = PubSubServer().start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.host)
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.create_topic(name=server.topic_path("t")).name
    subscription = subscriber.create_subscription(name=server.subscription_path("s"), topic=topic).name
    stream = subscriber.subscribe(subscription, Collector())
    publish(publisher, topic, b"before-stop")
    wait_until(lambda: server.subscription_stats(subscription).acked == 1, "the ack")

    server.stop()  # must not hang on the open StreamingPull

    assert not any(t.name.startswith(server.thread_name_prefix) for t in threading.enumerate())
    with pytest.raises(exceptions.Cancelled):
        stream.result(timeout=WAIT_SECONDS)  # the subscriber gives up by itself
    subscriber.close()
    publisher.stop()
    wait_until(lambda: set(threading.enumerate()) <= threads_before, "all threads to exit")


# --------------------------------------------------------------------------
# Beam
# --------------------------------------------------------------------------


def test_beam_streaming_pipeline_reads_and_writes(pubsub_server, publisher, topic, subscription):
    import apache_beam as beam
    from apache_beam.io.gcp.pubsub import ReadFromPubSub, WriteToPubSub
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    output = publisher.create_topic(name=pubsub_server.topic_path("forwarded")).name
    pipeline = beam.Pipeline(runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"]))
    _ = (
        pipeline
        | ReadFromPubSub(subscription=subscription, with_attributes=True)
        | WriteToPubSub(output, with_attributes=True)
    )
    threads_before = set(threading.enumerate())
    result = pipeline.run()
    try:
        publish(publisher, topic, b"m1", b"m2", b"m3", origin="trainer")
        forwarded = pubsub_server.wait_for_published(output, 3, timeout=30)
    finally:
        result.cancel()

    assert sorted(m.data for m in forwarded) == [b"m1", b"m2", b"m3"]
    assert all(m.attributes["origin"] == "trainer" for m in forwarded)
    assert pubsub_server.subscription_stats(subscription).acked == 3
    # Let Beam's workers finish their last Pull before the server goes away.
    for thread in set(threading.enumerate()) - threads_before:
        if not thread.name.startswith(pubsub_server.thread_name_prefix):
            thread.join(timeout=WAIT_SECONDS)
