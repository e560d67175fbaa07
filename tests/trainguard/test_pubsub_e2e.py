"""End to end through the real google-cloud-pubsub client and the in-process Pub/Sub server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from typing import List

import google.api_core.exceptions
import grpc
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

import trainguard as tg
from tests.trainguard.support import (
    ROOT,
    events_of,
    jsonl_payloads,
    parse_all,
    points_of,
    received,
    run_python,
    wait_until,
)
from tests.trainguard.tb_files import TF2Writer
from trainguard import outbox, wire
from trainguard.encoding import EncodedMessage
from trainguard.pubsub_handler import PubSubTransport
from trainguard.shipper import Shipper, ShipperConfig


@pytest.fixture
def topic(pubsub_server):
    name = pubsub_server.topic_path("metrics")
    pubsub_v1.PublisherClient().create_topic(name=name)
    return name


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_points_and_events_arrive_as_exact_wire_messages(pubsub_server, topic, handlers):
    handler = handlers.add(tg.PubSubMetricHandler(topic, config=tg.PublisherConfig(max_points_per_message=500)))
    tg.configure(handler)
    with tg.Run("resnet50", "2026-11-21.1", data={"gpus": 8}):
        stream = tg.getStream("train")
        for step in range(2000):
            stream.add_value("loss", 2.0 / (step + 1), step=step)
            if step % 100 == 0:
                tg.put_metric("lr", 0.1, "train", step=step)
        tg.log_event("checkpoint_saved", {"step": 2000})
    messages = received(pubsub_server, topic)
    assert {(m.test, m.run) for m in messages} == {("resnet50", "2026-11-21.1")}
    points = points_of(messages)
    assert [(p.value, p.step) for p in points if p.tag == "loss"] == [(2.0 / (s + 1), s) for s in range(2000)]
    assert [p.step for p in points if p.tag == "lr"] == list(range(0, 2000, 100))
    assert [e.type for e in events_of(messages)] == ["run_started", "checkpoint_saved", "run_finished"]
    assert all(len(m.points) <= 500 for m in messages) and len(messages) <= 8
    # byte for byte what the wire module would encode for the same content (v1.1 columns by default)
    for stored, message in zip(pubsub_server.published_messages(topic), messages):
        rebuilt = wire.encode_message(message.test, message.run, [p._asdict() for p in points_of([message])],
                                      [e._asdict() for e in message.events], message_id=message.id,
                                      schema=wire.SCHEMA_V1_1)
        assert json.loads(stored.data) == json.loads(rebuilt)
    assert handler.stats().points_delivered == 2020


def test_the_pubsub_client_is_made_by_the_background_thread_before_anything_is_logged(pubsub_server, topic,
                                                                                      handlers):
    made_in = []

    def client_factory():
        made_in.append(threading.current_thread())
        return pubsub_v1.PublisherClient()

    handler = handlers.add(tg.PubSubMetricHandler(topic, "t", "r", client_factory=client_factory))
    wait_until(lambda: made_in)  # nothing logged, nothing flushed yet
    stream = tg.MetricStream("train", handler)
    for step in range(2500):
        stream.add_value("loss", float(step), step=step)
    assert handler.flush(timeout=30)
    assert [thread.name for thread in made_in] == ["trainguard-pubsub"]
    assert threading.main_thread() not in made_in
    assert [p.step for p in points_of(received(pubsub_server, topic))] == list(range(2500))


class PublishCounter(grpc.UnaryUnaryClientInterceptor):
    """Records the messages of each Publish request a client's channel carries."""

    def __init__(self) -> None:
        self.requests: List[int] = []

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.method.endswith("/Publish"):
            self.requests.append(len(request.messages))
        return continuation(client_call_details, request)


def test_several_messages_go_in_one_publish_request_intact_and_in_order(pubsub_server, topic, handlers):
    counter = PublishCounter()

    def client_factory():
        channel = grpc.intercept_channel(grpc.insecure_channel(pubsub_server.host), counter)
        return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))

    handler = handlers.add(tg.PubSubMetricHandler(topic, "t", "r", tg.PublisherConfig(
        max_points_per_message=100, linger_ms=60_000, max_latency_ms=60_000), client_factory=client_factory))
    stream = tg.MetricStream("train", handler)
    sent = outbox.MESSAGES_PER_SEND  # full messages of 100 points: one send's worth (10)
    for step in range(100 * sent):
        stream.add_value("loss" if step % 2 else "lr", step / 8, step=step)
    wait_until(lambda: handler.stats().points_delivered == 100 * sent)  # no flush: the send was due
    assert counter.requests == [sent]
    messages = received(pubsub_server, topic)
    # in the order they were logged: message i holds steps 100 i to 100 i + 99, each tag's in order
    assert [sorted(p.step for p in points_of([m])) for m in messages] == [
        list(range(100 * i, 100 * i + 100)) for i in range(sent)]
    assert [p.step for p in points_of(messages) if p.tag == "loss"] == list(range(1, 100 * sent, 2))
    assert [p.value for p in points_of(messages)] == [p.step / 8 for p in points_of(messages)]
    assert handler.stats().messages_delivered == sent


def test_the_transport_raises_what_the_gapic_client_raises(pubsub_server):
    transport = PubSubTransport(pubsub_server.topic_path("no-such-topic"))
    message = EncodedMessage(b"{}", {"id": "1"}, 1, 0)
    [error] = transport.send([message], timeout=10)
    transport.close()
    assert isinstance(error, google.api_core.exceptions.NotFound), error


def test_publishing_is_retried_until_the_topic_exists(pubsub_server, handlers):
    name = pubsub_server.topic_path("late-topic")
    handler = handlers.add(tg.PubSubMetricHandler(name, "t", "r", tg.PublisherConfig(
        max_latency_ms=10, retry_initial_backoff_s=0.02, retry_max_backoff_s=0.1)))
    stream = tg.MetricStream("g", handler)
    for step in range(300):
        stream.add_value("x", float(step), step=step)
    wait_until(lambda: handler.stats().send_failures >= 2)  # NOT_FOUND, retried
    pubsub_v1.PublisherClient().create_topic(name=name)
    assert handler.flush(timeout=30)
    assert [p.step for p in points_of(received(pubsub_server, name))] == list(range(300))


def test_requests_too_large_for_the_server_are_split(pubsub_server, topic, handlers):
    # The server takes at most 4 MB per request; ask for 8 MB sends of ~0.9 MB messages (v1 point objects:
    # v1.1 columns of the same points are a tenth of that).
    # Unbound, the handler buffers without encoding: once bound, all ~6 MB are encoded before the first send,
    # whatever the threads' timing.
    handler = handlers.add(tg.PubSubMetricHandler(topic, config=tg.PublisherConfig(
        max_points_per_message=10_000, max_send_bytes=8 << 20, max_latency_ms=60_000,
        retry_initial_backoff_s=0.01, schema=wire.SCHEMA)))
    stream = tg.MetricStream("g", handler)
    tags = ["t" * 250 + str(i) for i in range(10)]
    for step in range(20_000):
        stream.add_value(tags[step % 10], float(step), step=step)
    handler.bind("t", "r")
    assert handler.flush(timeout=60)
    assert handler.stats().send_failures >= 1  # RESOURCE_EXHAUSTED, then smaller requests
    assert [p.step for p in points_of(received(pubsub_server, topic))] == list(range(20_000))


def test_unreachable_pubsub_keeps_memory_bounded_and_spills(monkeypatch, handlers, tmp_path):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", closed_port())
    spill = str(tmp_path / "spill.jsonl")
    handler = handlers.add(tg.PubSubMetricHandler("projects/p/topics/t", "t", "r", tg.PublisherConfig(
        max_points_per_message=100, max_latency_ms=10, max_pending_bytes=30_000, retry_initial_backoff_s=0.01,
        retry_max_backoff_s=0.05, spill_path=spill)))
    stream = tg.MetricStream("g", handler)
    for step in range(3000):
        stream.add_value("loss", float(step), step=step)
        assert handler.outbox.pending_bytes <= 30_000
    wait_until(lambda: handler.stats().send_failures >= 1 and handler.stats().points_spilled > 0)
    handler.close(timeout=1.0)
    stats = handler.stats()
    assert stats.points_delivered == 0
    assert stats.points_spilled == 3000 and stats.points_dropped == 0
    assert [p.step for p in points_of(parse_all(jsonl_payloads(spill)))] == list(range(3000))


EXIT_SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO)
    import trainguard as tg
    tg.configure(tg.PubSubMetricHandler(sys.argv[1], "exit", "e1", tg.PublisherConfig(
        max_latency_ms=600_000, exit_flush_timeout_s=float(sys.argv[2]))))
    stream = tg.getStream("train")
    for step in range(3000):
        stream.add_value("loss", float(step), step=step)
    tg.log_event("about_to_exit", {})
""")


def test_interpreter_exit_flushes_to_pubsub(pubsub_server, topic):
    result = run_python(EXIT_SCRIPT, args=[topic, "20"])
    assert result.returncode == 0, result.stderr
    messages = received(pubsub_server, topic)
    assert [p.step for p in points_of(messages)] == list(range(3000))
    assert [e.type for e in events_of(messages)] == ["about_to_exit"]
    assert "delivered 3000 points and 1 events" in result.stderr


def test_exit_with_pubsub_unreachable_is_bounded_and_reports_what_was_lost():
    result = run_python(EXIT_SCRIPT, env={"PUBSUB_EMULATOR_HOST": closed_port()},
                        args=["projects/p/topics/t", "1"])
    assert result.returncode == 0, result.stderr
    assert "delivered 0 points" in result.stderr
    assert "dropped 3000 points" in result.stderr and "unsent at exit 3000" in result.stderr
    assert "and 1 events" in result.stderr


def test_shipper_publishes_tensorboard_scalars(pubsub_server, topic, tmp_path):
    logdir = tmp_path / "logs"
    writer = TF2Writer(str(logdir / "train"))
    for step in range(100):
        writer.scalar("loss", float(step), step)
    writer.close()
    shipper = Shipper(ShipperConfig(logdir=str(logdir), test="tb", run="tb1", finish_on_idle_s=0.1,
                                    poll_interval_s=0.02), PubSubTransport(topic))
    assert shipper.run() == 0
    messages = received(pubsub_server, topic)
    assert [(p.tag, p.step) for p in points_of(messages)] == [("train/loss", s) for s in range(100)]
    assert [e.type for e in events_of(messages)] == ["run_started", "run_finished"]


def test_wrapped_command_is_not_held_up_when_pubsub_is_unreachable(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, PUBSUB_EMULATOR_HOST=closed_port())
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.shipper", "--logdir", str(tmp_path / "logs"), "--test", "t",
         "--run", "r", "--topic", "projects/p/topics/t", "--exit-timeout", "0.5", "--poll-interval", "0.05",
         "--", sys.executable, "-c", "import sys; sys.exit(7)"],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 7, result.stderr
    assert "run it again with the same --state" in result.stderr
    state_file = tmp_path / "logs" / ".trainguard-ship.t.r.json"
    assert not state_file.exists() or json.loads(state_file.read_text())["started"] is False
    # run_started was never delivered: a later run with the same state sends it
