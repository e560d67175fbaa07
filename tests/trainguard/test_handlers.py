"""Batching, bounded memory, drop accounting, retries and exit flush of wire handlers."""

from __future__ import annotations

import logging
import os
import textwrap
import threading
import time

import numpy as np
import pytest

import trainguard as tg
from tests.trainguard.support import (
    ScriptedTransport,
    events_of,
    jsonl_payloads,
    parse_all,
    points_of,
    run_python,
    wait_until,
)
from trainguard import outbox, wire
from trainguard.metrics.api import MetricData

FAR = 60_000.0  # a max_latency_ms that never fires during a test


def test_a_full_message_is_sent_without_waiting_for_the_latency(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_points_per_message=100, max_latency_ms=FAR, messages_per_wake=1)
    stream = tg.MetricStream("g", handler)
    for i in range(100):
        stream.add_value("loss", i / 10, step=i)
    messages = wait_until(lambda: parse_all(jsonl_payloads(path)))
    assert [len(m.points) for m in messages] == [100]
    assert [(p.value, p.step) for p in points_of(messages[:1])] == [(i / 10, i) for i in range(100)]


def test_full_messages_are_made_a_wake_at_a_time(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_points_per_message=100, max_latency_ms=FAR, messages_per_wake=3)
    assert handler.config.points_per_wake() == 300
    assert handler.flush(timeout=10)  # the cycle binding the run asked for is over,
    time.sleep(0.2)  # and so is the one after the flush: the background thread waits on its timer (30 s)
    wake, wakes = handler.intake._wake, []
    handler.intake._wake = lambda: (wakes.append(handler.intake.point_count()), wake())
    add_value = tg.MetricStream("g", handler).add_value  # (an adder takes the intake's wake when made)
    for i in range(250):
        add_value("loss", i / 10, i)
    time.sleep(0.2)
    assert wakes == [] and jsonl_payloads(path) == [] and handler.intake.point_count() == 250
    for i in range(250, 320):
        add_value("loss", i / 10, i)
    messages = wait_until(lambda: (lambda m: m if len(m) == 3 else None)(parse_all(jsonl_payloads(path))))
    assert wakes == [300]  # once, as the 300th point went in
    assert [len(m.points) for m in messages] == [100, 100, 100]  # full messages only: the rest waits
    assert [p.step for p in points_of(messages)] == list(range(300))


@pytest.mark.parametrize("messages, buffered, linger, points", [
    (4, 100_000, 100, 4000), (4, 3000, 100, 1500), (4, 500, 100, 1000), (1, 100_000, 100, 1000),
    (4, 100_000, 0, 1000)])  # without a linger, nothing is held back
def test_a_wake_is_a_few_messages_never_more_than_half_the_buffer(messages, buffered, linger, points):
    config = tg.PublisherConfig(max_points_per_message=1000, messages_per_wake=messages, max_buffered_points=buffered,
                                linger_ms=linger)
    assert config.points_per_wake() == points


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4", None])
def test_messages_per_wake_is_a_positive_integer(bad):
    with pytest.raises(ValueError, match="messages_per_wake"):
        tg.PublisherConfig(messages_per_wake=bad).validate()


def test_a_partial_message_is_sent_after_the_latency(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_points_per_message=1000, max_latency_ms=50)
    stream = tg.MetricStream("g", handler)
    for i in range(3):
        stream.add_value("acc", 0.5 + i, step=i)
    messages = wait_until(lambda: parse_all(jsonl_payloads(path)))
    assert [(p.tag, p.value, p.step) for p in points_of(messages)] == [("acc", 0.5, 0), ("acc", 1.5, 1),
                                                                        ("acc", 2.5, 2)]


def test_full_messages_linger_to_share_one_send_and_flush_sends_them_at_once(handlers):
    transport = ScriptedTransport()
    handler = handlers.scripted(transport, max_points_per_message=10, linger_ms=FAR, max_latency_ms=FAR,
                                messages_per_wake=1)
    stream = tg.MetricStream("g", handler)
    for i in range(30):
        stream.add_value("loss", float(i), step=i)
    wait_until(lambda: len(handler.outbox) == 3)  # three full messages encoded, lingering
    assert transport.received == []
    assert handler.flush(timeout=20)
    assert transport.sends == [3]  # one request
    assert [p.step for p in points_of(parse_all(transport.payloads))] == list(range(30))
    assert handler.stats().points_delivered == 30


def test_a_sends_worth_of_full_messages_goes_without_waiting_for_the_linger(handlers):
    transport = ScriptedTransport()
    handler = handlers.scripted(transport, max_points_per_message=10, linger_ms=FAR, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    for i in range(10 * outbox.MESSAGES_PER_SEND):
        stream.add_value("loss", float(i), step=i)
    wait_until(lambda: transport.sends)  # no flush: the tenth full message makes the send due
    assert transport.sends == [outbox.MESSAGES_PER_SEND]
    assert [p.step for p in points_of(parse_all(transport.payloads))] == list(range(10 * outbox.MESSAGES_PER_SEND))


def test_a_lingering_message_still_goes_within_the_latency(handlers):
    transport = ScriptedTransport()
    handler = handlers.scripted(transport, max_points_per_message=10, linger_ms=FAR, max_latency_ms=50)
    stream = tg.MetricStream("g", handler)
    for i in range(10):
        stream.add_value("loss", float(i), step=i)
    wait_until(lambda: transport.sends)  # no flush: the linger is capped by max_latency_ms
    assert [p.step for p in points_of(parse_all(transport.payloads))] == list(range(10))


def test_a_lone_full_message_goes_once_its_linger_is_over(handlers):
    transport = ScriptedTransport()
    handler = handlers.scripted(transport, max_points_per_message=10, linger_ms=300, max_latency_ms=FAR,
                                messages_per_wake=1)
    stream = tg.MetricStream("g", handler)
    logged = time.monotonic()
    for i in range(15):  # a full message and half of the next
        stream.add_value("loss", float(i), step=i)
    wait_until(lambda: transport.sends)  # no flush, no second message: the linger ends it
    assert time.monotonic() - logged >= 0.3 and transport.sends == [1]
    assert [p.step for p in points_of(parse_all(transport.payloads))] == list(range(10))
    assert handler.intake.point_count() == 5


def test_without_linger_a_full_message_is_not_held_back(handlers):
    transport = ScriptedTransport()
    handler = handlers.scripted(transport, max_points_per_message=10, linger_ms=0, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    for i in range(10):
        stream.add_value("loss", float(i), step=i)
    wait_until(lambda: transport.sends)
    assert transport.sends == [1]


def test_flush_delivers_everything_in_order_in_batches(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_points_per_message=64, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    for i in range(1000):
        stream.add_value(f"tag{i % 3}", float(i), step=i)
    assert handler.flush(timeout=20)
    messages = parse_all(jsonl_payloads(path))
    assert all(len(m.points) <= 64 for m in messages)
    points = points_of(messages)  # v1.1 columns: each tag's points in order
    assert sorted(p.step for p in points) == list(range(1000))
    for k in range(3):
        assert [p.step for p in points if p.tag == f"tag{k}"] == list(range(k, 1000, 3))
    assert len({m.id for m in messages}) == len(messages)
    assert all((m.test, m.run) == ("test", "run") for m in messages)
    stats = handler.stats()
    assert (stats.points_delivered, stats.messages_delivered, stats.points_dropped) == (1000, len(messages), 0)


def test_buffer_is_bounded_and_drops_are_counted(handlers):
    transport = ScriptedTransport()
    transport.unblocked.clear()  # the network hangs
    handler = handlers.scripted(transport, max_buffered_points=1000, max_points_per_message=100,
                                max_latency_ms=FAR, send_timeout_s=60)
    stream = tg.MetricStream("g", handler)
    high_water = 0
    for i in range(20_000):
        stream.add_value("x", float(i), step=i)
        high_water = max(high_water, handler.intake.point_count())
    assert high_water <= 1000
    transport.unblocked.set()
    assert handler.flush(timeout=20)
    stats = handler.stats()
    delivered = [p.step for p in points_of(parse_all(transport.payloads))]
    assert stats.points_delivered == len(delivered) <= 2000
    assert stats.points_dropped_buffer_full == 20_000 - len(delivered)
    assert delivered == sorted(delivered) and len(set(delivered)) == len(delivered)


def test_failed_sends_are_retried_with_backoff_and_delivered_once(handlers):
    transport = ScriptedTransport()
    transport.failures_left = 3
    handler = handlers.scripted(transport, max_points_per_message=10, retry_initial_backoff_s=0.01,
                                retry_max_backoff_s=0.05, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    for i in range(95):
        stream.add_value("x", float(i), step=i)
    assert handler.flush(timeout=20)
    messages = parse_all(transport.payloads)
    assert [p.step for p in points_of(messages)] == list(range(95))
    assert len({m.id for m in messages}) == len(messages)
    assert handler.stats().send_failures == 3
    assert transport.attempts >= 4


def test_messages_are_given_up_after_the_retry_deadline_and_counted(handlers, caplog):
    transport = ScriptedTransport()
    transport.failing = True
    handler = handlers.scripted(transport, max_points_per_message=10, retry_initial_backoff_s=0.01,
                                retry_max_backoff_s=0.02, retry_deadline_s=0.2, max_latency_ms=20)
    stream = tg.MetricStream("g", handler)
    for i in range(50):
        stream.add_value("x", float(i))
    wait_until(lambda: handler.stats().points_undeliverable == 50)
    transport.failing = False
    stream.add_value("after", 1.0)
    assert handler.flush(timeout=20)
    assert [p.tag for p in points_of(parse_all(transport.payloads))] == ["after"]
    with caplog.at_level(logging.INFO, logger="trainguard"):
        handler.close()
    assert "delivered 1 points" in caplog.text and "undeliverable 50" in caplog.text


def test_undeliverable_messages_spill_to_jsonl_within_the_memory_bound(handlers, tmp_path):
    spill = str(tmp_path / "spill" / "undelivered.jsonl")
    transport = ScriptedTransport()
    transport.failing = True
    handler = handlers.scripted(transport, max_points_per_message=50, max_pending_bytes=20_000,
                                retry_initial_backoff_s=0.01, retry_max_backoff_s=0.02, max_latency_ms=10,
                                spill_path=spill, exit_flush_timeout_s=0.5)
    stream = tg.MetricStream("g", handler)
    for i in range(5000):
        stream.add_value("loss", float(i), step=i)
        if i % 500 == 0:
            assert handler.outbox.pending_bytes <= 20_000
    wait_until(lambda: handler.stats().points_spilled > 0)
    handler.close(timeout=0.5)
    assert handler.outbox.pending_bytes == 0
    stats = handler.stats()
    spilled = parse_all(jsonl_payloads(spill))
    assert [p.step for p in points_of(spilled)] == list(range(5000))
    assert stats.points_spilled == 5000 and stats.points_delivered == 0 and stats.points_dropped == 0
    assert stats.messages_spilled == len(spilled)


def test_training_code_never_sees_an_exception(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    for value in (None, "abc", object(), float("nan"), 10 ** 500, [1], np.float32(1.5), np.array(2.0)):
        stream.add_value("v", value, step=1)
    for name in (None, "", "x" * 1000, 42, ("a",)):
        stream.add_value(name, 1.0)
    stream.add_value("bad_step", 1.0, step=-5)
    handler.emit(MetricData("not a time", "g", "t", 1.0))
    handler.emit(("not", "metric", "data"))
    handler.emit_event("", {}, 0.0)
    assert handler.flush(timeout=20)
    assert sorted(p.value for p in points_of(parse_all(jsonl_payloads(path)))) == [1.5, 2.0]
    stats = handler.stats()
    assert stats.points_nonfinite == 1 and stats.points_invalid == 5 + 5 + 1 + 2


@pytest.mark.parametrize("schema", wire.SCHEMAS)
def test_a_point_with_a_non_finite_time_is_counted_invalid_and_the_thread_goes_on(handlers, tmp_path, schema):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR, schema=schema)
    for step, at in enumerate((float("nan"), float("inf"), 1_790_000_000.0)):
        handler.add_point("loss", 1.0 + step, step, at)
    assert handler.flush(timeout=20)
    handler.add_point("loss", 5.0, 5, 1_790_000_001.0)
    assert handler.flush(timeout=20)  # the background thread is still there
    assert [(p.value, p.step) for p in points_of(parse_all(jsonl_payloads(path)))] == [(3.0, 2), (5.0, 5)]
    stats = handler.stats()
    assert (stats.points_invalid, stats.points_nonfinite, stats.points_delivered) == (2, 0, 2)


def test_emit_keeps_the_metric_data_timestamp_and_step(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR)
    tg.configure(handler)
    handler.emit(MetricData(1_790_000_000.1234, "g", "loss", 0.5, step=42))
    tg.log_event("checkpoint", {"step": 42}, timestamp=1_790_000_001.5)
    assert handler.flush(timeout=20)
    messages = parse_all(jsonl_payloads(path))
    [point] = points_of(messages)
    assert (point.tag, point.value, point.step, point.time) == ("loss", 0.5, 42, 1_790_000_000.123)
    assert [(e.type, e.time, e.data) for e in events_of(messages)] == [("checkpoint", 1_790_000_001.5, {"step": 42})]


def test_group_prefix_puts_the_group_in_the_tag(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR, group_prefix=True)
    tg.configure(handler)
    tg.getStream("train").add_value("loss", 1.0)
    tg.put_metric("rendezvous.ms", 3, "torchelastic")
    handler.emit(MetricData(1_790_000_000.0, "eval", "acc", 0.9))
    assert handler.flush(timeout=20)
    tags = [p.tag for p in points_of(parse_all(jsonl_payloads(path)))]
    assert tags == ["train/loss", "torchelastic/rendezvous.ms", "eval/acc"]


def test_a_nonfinite_value_event_names_the_tag_as_the_points_do(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR, group_prefix=True)
    stream = tg.MetricStream("train", handler)
    stream.add_value("loss", 1.0, step=1)
    stream.add_value("loss", float("nan"), step=2)
    handler.emit(MetricData(1_790_000_000.0, "eval", "acc", float("inf"), step=3))
    assert handler.flush(timeout=20)
    messages = parse_all(jsonl_payloads(path))
    assert [p.tag for p in points_of(messages)] == ["train/loss"]
    assert [e.data for e in events_of(messages) if e.type == "nonfinite_value"] == [
        {"tag": "train/loss", "value": "nan", "step": 2}, {"tag": "eval/acc", "value": "inf", "step": 3}]


def test_many_training_threads_lose_nothing(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=20)
    tg.configure(handler)

    def produce(thread):
        stream = tg.getStream(f"t{thread}")
        for i in range(5000):
            stream.add_value(f"thread{thread}", float(i), step=i)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert handler.flush(timeout=30)
    seen = sorted((p.tag, p.step) for p in points_of(parse_all(jsonl_payloads(path))))
    assert seen == sorted((f"thread{n}", i) for n in range(4) for i in range(5000))


def test_identity_from_the_environment(handlers, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINGUARD_TEST", "env-test")
    monkeypatch.setenv("TRAINGUARD_RUN", "env-run")
    path = str(tmp_path / "m.jsonl")
    handler = handlers.add(tg.JsonlMetricHandler(path))
    tg.MetricStream("g", handler).add_value("x", 1.0)
    assert handler.flush(timeout=20)
    [message] = parse_all(jsonl_payloads(path))
    assert (message.test, message.run) == ("env-test", "env-run")


def test_values_wait_for_the_run_to_be_known(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, test=None, run=None, max_latency_ms=10)
    stream = tg.MetricStream("g", handler)
    stream.add_value("early", 1.0)
    assert handler.flush(timeout=0.2) is False
    handler.bind("late-test", "late-run")
    assert handler.flush(timeout=20)
    [message] = parse_all(jsonl_payloads(path))
    assert (message.test, message.run, points_of([message])[0].tag) == ("late-test", "late-run", "early")


def test_handler_without_a_run_drops_at_close_and_says_so(handlers, tmp_path, caplog):
    handler = handlers.jsonl(str(tmp_path / "m.jsonl"), test=None, run=None)
    tg.MetricStream("g", handler).add_value("x", 1.0)
    with caplog.at_level(logging.INFO, logger="trainguard"):
        handler.close(timeout=5)
    assert handler.stats().points_unsent_at_exit == 1
    assert "no test/run was ever set" in caplog.text


EXIT_SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO)
    import trainguard as tg
    handler = tg.JsonlMetricHandler(sys.argv[1], "exit-test", "exit-run",
                                    tg.PublisherConfig(max_latency_ms=600_000, max_points_per_message=1000))
    tg.configure(handler)
    stream = tg.getStream("train")
    for i in range(2500):
        stream.add_value("loss", 1.0 / (i + 1), step=i)
    window_stat = tg.Stat("loss_window", ["mean"], window=1_000_000, group="train")
    window_stat.add(3.0)
    if sys.argv[2] == "raise":
        raise RuntimeError("training crashed")
    sys.exit(int(sys.argv[2]))
""")


def test_flush_at_interpreter_exit(tmp_path):
    for how, code in (("0", 0), ("3", 3), ("raise", 1)):
        path = str(tmp_path / f"exit-{how}.jsonl")
        result = run_python(EXIT_SCRIPT, args=[path, how])
        assert result.returncode == code, result.stderr
        points = points_of(parse_all(jsonl_payloads(path)))
        assert [p.step for p in points if p.tag == "loss"] == list(range(2500))
        # the open Stat window is flushed before the handler
        assert {(p.tag, p.value) for p in points if p.tag.startswith("loss_window")} == {
            ("loss_window.mean", 3.0), ("loss_window.count", 1.0)}
        assert "delivered 2502 points" in result.stderr and "dropped 0 points" in result.stderr


def test_a_forked_child_does_not_publish_through_the_parents_handler(tmp_path):
    path = str(tmp_path / "fork.jsonl")
    code = textwrap.dedent("""
        import os, sys
        import trainguard as tg
        handler = tg.JsonlMetricHandler(sys.argv[1], "t", "r")
        stream = tg.MetricStream("g", handler)
        stream.add_value("parent", 1.0)
        pid = os.fork()
        if pid == 0:
            stream.add_value("child", 2.0)
            sys.exit(0)   # runs atexit in the child: must neither write nor hang
        _, status = os.waitpid(pid, 0)
        stream.add_value("parent", 3.0)
        print("child status", status)
    """)
    result = run_python(code, args=[path])
    assert result.returncode == 0, result.stderr
    assert "child status 0" in result.stdout
    assert [(p.tag, p.value) for p in points_of(parse_all(jsonl_payloads(path)))] == [("parent", 1.0),
                                                                                       ("parent", 3.0)]
    assert os.path.exists(path)


def test_values_are_read_when_logged_not_when_sent(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=FAR)
    stream = tg.MetricStream("g", handler)
    running_loss = np.array(2.5)  # like a 0-d tensor accumulated in place
    stream.add_value("loss", running_loss, step=1)
    handler.add_point("loss", running_loss, 2, 1_790_000_000.0)
    running_loss *= 0
    assert handler.flush(timeout=20)
    assert [p.value for p in points_of(parse_all(jsonl_payloads(path)))] == [2.5, 2.5]


def test_configs_outside_the_contract_are_refused_at_setup(tmp_path):
    for bad in ({"max_points_per_message": 0}, {"max_points_per_message": 20_000},
                {"max_message_bytes": 2 << 20}, {"max_latency_ms": 0}, {"max_buffered_points": -1},
                {"linger_ms": -1}):
        with pytest.raises(ValueError):
            tg.JsonlMetricHandler(str(tmp_path / "x.jsonl"), "t", "r", tg.PublisherConfig(**bad))
    with pytest.raises(ValueError):
        tg.JsonlMetricHandler(str(tmp_path / "x.jsonl"), "t", None)  # both or neither
    with pytest.raises(ValueError):
        tg.JsonlMetricHandler(str(tmp_path / "x.jsonl"), "bad\nname", "r")
    with pytest.raises(ValueError):
        tg.PubSubMetricHandler("my-topic", "t", "r")
