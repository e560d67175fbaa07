"""Run: run_started / run_finished lifecycle events."""

from __future__ import annotations

import pytest

import trainguard as tg
from tests.trainguard.support import ScriptedTransport, events_of, jsonl_payloads, parse_all, points_of


def finished(path):
    return [e for e in events_of(parse_all(jsonl_payloads(path))) if e.type == "run_finished"]


def test_successful_block_publishes_started_points_and_finished(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, test=None, run=None, max_latency_ms=60_000)
    tg.configure(handler)
    with tg.Run("bert-squad", "run-7", data={"config": {"lr": 3e-5}}) as run:
        tg.getStream("train").add_value("loss", 1.5, step=1)
    assert run.status == "success"
    messages = parse_all(jsonl_payloads(path))  # Run flushed on exit: nothing waits for the latency
    assert {(m.test, m.run) for m in messages} == {("bert-squad", "run-7")}
    events = events_of(messages)
    assert [e.type for e in events] == ["run_started", "run_finished"]
    assert events[0].data["config"] == {"lr": 3e-5} and "host" in events[0].data
    assert events[1].data["status"] == "success" and events[1].data["num_failures"] == 0
    assert events[0].time <= points_of(messages)[0].time <= events[1].time


def test_raising_block_publishes_failure_and_re_raises(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    tg.configure(handlers.jsonl(path))
    with pytest.raises(ZeroDivisionError), tg.Run("test", "run") as run:
        run.num_failures = 2
        raise ZeroDivisionError("division by zero")
    [event] = finished(path)
    assert event.data["status"] == "failure" and event.data["num_failures"] == 2
    assert event.data["error"].startswith("ZeroDivisionError")


@pytest.mark.parametrize("code, status", [(0, "success"), (None, "success"), (2, "failure"), ("bye", "failure")])
def test_system_exit_status(handlers, tmp_path, code, status):
    path = str(tmp_path / "m.jsonl")
    tg.configure(handlers.jsonl(path))
    with pytest.raises(SystemExit), tg.Run("test", "run"):
        raise SystemExit(code)
    assert [e.data["status"] for e in finished(path)] == [status]


def test_explicit_start_and_finish_with_timeout_status(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path)
    run = tg.Run("test", "run", handler=handler).start()
    run.start()  # idempotent
    run.finish("timeout", reason="wall clock limit")
    run.finish("success")  # only the first finish counts
    events = events_of(parse_all(jsonl_payloads(path)))
    assert [e.type for e in events] == ["run_started", "run_finished"]
    assert events[1].data["status"] == "timeout" and events[1].data["reason"] == "wall clock limit"
    with pytest.raises(ValueError):
        tg.Run("test", "run2", handler=handler).finish("exploded")


def test_a_handler_bound_to_another_run_is_refused(handlers, tmp_path):
    handler = handlers.jsonl(str(tmp_path / "m.jsonl"), test="a", run="1")
    with pytest.raises(ValueError, match="already publishes"):
        tg.Run("b", "2", handler=handler).start()
    with pytest.raises(ValueError):
        tg.Run("", "2")


def test_run_without_any_configured_handler_warns():
    with pytest.warns(tg.UnconfiguredGroupWarning), tg.Run("test", "run"):
        pass


def test_run_finished_says_what_the_handler_dropped(handlers):
    """Overload: a loop logging faster than a (here hung) sink drains. A user looks at the run's data (its
    alerts, job_history), not the trainer's log: run_finished carries the points dropped so far; a run that
    dropped nothing says nothing of it."""
    transport = ScriptedTransport()
    transport.unblocked.clear()  # the network hangs
    handler = handlers.scripted(transport, test=None, run=None, max_buffered_points=1000, max_points_per_message=100,
                                max_latency_ms=60_000, send_timeout_s=60)
    tg.configure(handler)
    with tg.Run("test", "overloaded", flush_timeout=0.2):
        for step in range(20_000):
            tg.getStream("train").add_value("loss", 1.0, step=step)
        dropped = handler.stats().points_dropped_buffer_full
    transport.unblocked.set()
    assert handler.flush(timeout=20) and dropped > 0
    [event] = [e for e in events_of(parse_all(transport.payloads)) if e.type == "run_finished"]
    assert event.data["points_dropped"] >= dropped and "events_dropped" not in event.data

    quiet = ScriptedTransport()
    tg.configure(handlers.scripted(quiet, test=None, run=None))
    with tg.Run("test", "clean"):
        tg.getStream("train").add_value("loss", 1.0, step=1)
    [event] = [e for e in events_of(parse_all(quiet.payloads)) if e.type == "run_finished"]
    assert "points_dropped" not in event.data
