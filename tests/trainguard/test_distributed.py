"""Distributed jobs (torchrun, torchelastic): every message names its worker's rank and the job's world size."""

from __future__ import annotations

import json
import socket
import textwrap

import numpy as np
import pytest
from google.cloud import pubsub_v1

import trainguard as tg
from tests.trainguard.support import events_of, jsonl_payloads, parse_all, points_of, received, run_python
from trainguard import distributed, wire

DISTRIBUTED_ENV = (distributed.ENV_RANK, distributed.ENV_WORLD_SIZE, distributed.ENV_RESTART_COUNT, "LOCAL_RANK")


@pytest.fixture(autouse=True)
def single_process_environment(monkeypatch):
    """Each test starts as a single process (subprocesses inherit this environment) with no warnings given yet."""
    for name in DISTRIBUTED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distributed, "_warned", set())


# A worker as torchrun starts it: torchelastic's metrics API, nothing about ranks in the code.
TORCHELASTIC_WORKER = textwrap.dedent("""
    import sys
    import trainguard as tg
    import trainguard.metrics as metrics    # was: import torch.distributed.elastic.metrics as metrics

    target = sys.argv[1]
    handler = tg.PubSubMetricHandler(target) if target.startswith("projects/") else tg.JsonlMetricHandler(target)
    metrics.configure(handler)
    with tg.Run("bert-ddp", "2026-11-23.1"):
        stream = metrics.getStream("train")
        for step in range(500):
            stream.add_value("loss", 1.0 / (step + 1), step=step)
        metrics.put_metric("epoch_time_s", 12.5, "train", step=499)
        tg.log_event("checkpoint_saved", {"step": 499})
""")


def run_worker(target: str, **env: str):
    result = run_python(TORCHELASTIC_WORKER, env=env, args=[target])
    assert result.returncode == 0, result.stderr
    return result


def raw_messages(path) -> list:
    return [json.loads(payload) for payload in jsonl_payloads(str(path))]


def test_a_torchrun_worker_publishes_its_rank_world_size_and_restart_through_pubsub(pubsub_server):
    topic = pubsub_server.topic_path("metrics")
    pubsub_v1.PublisherClient().create_topic(name=topic)
    run_worker(topic, RANK="2", WORLD_SIZE="4", LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT="1")
    messages = received(pubsub_server, topic)  # each one parsed by wire.parse_message, attributes checked
    assert {(m.test, m.run, m.rank, m.world_size) for m in messages} == {("bert-ddp", "2026-11-23.1", 2, 4)}
    assert len(points_of(messages)) == 501
    events = events_of(messages)
    assert [e.type for e in events] == ["run_started", wire.ELASTIC_RESTART, "checkpoint_saved", "run_finished"]
    started, restart, _, finished = events
    assert started.data["rank"] == 2 and started.data["world_size"] == 4
    assert started.data["host"] == socket.gethostname()
    assert restart.data == {"restart_count": 1} and restart.time == started.time
    assert finished.data["status"] == "success" and finished.data["num_failures"] == 1


def test_without_the_environment_variables_nothing_about_ranks_is_sent(tmp_path):
    path = tmp_path / "m.jsonl"
    result = run_worker(str(path))
    messages = raw_messages(path)
    assert messages and not [m for m in messages if {"rank", "world_size"} & m.keys()]
    events = events_of(parse_all(jsonl_payloads(str(path))))
    assert [e.type for e in events] == ["run_started", "checkpoint_saved", "run_finished"]
    assert "rank" not in events[0].data and "host" in events[0].data
    assert events[-1].data["num_failures"] == 0
    assert "WARNING" not in result.stderr and "ignoring" not in result.stderr


@pytest.mark.parametrize("env", [
    {"RANK": "two", "WORLD_SIZE": "4"},
    {"RANK": "2.0", "WORLD_SIZE": "4"},
    {"RANK": "4", "WORLD_SIZE": "4"},
    {"RANK": "-1"},
    {"RANK": "1", "WORLD_SIZE": "0"},
    {"WORLD_SIZE": "4"},
    {"RANK": str(wire.MAX_WORLD_SIZE + 1)},
])
def test_invalid_environment_values_warn_once_and_send_without_rank(tmp_path, env):
    path = tmp_path / "m.jsonl"
    result = run_worker(str(path), **env)
    assert result.stderr.count("trainguard: ignoring RANK=") == 1, result.stderr
    messages = raw_messages(path)
    assert messages and not [m for m in messages if {"rank", "world_size"} & m.keys()]
    parsed = parse_all(jsonl_payloads(str(path)))
    assert len(points_of(parsed)) == 501
    assert "rank" not in events_of(parsed)[0].data


def test_an_invalid_restart_count_warns_and_counts_no_restart(handlers, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "once")
    path = str(tmp_path / "m.jsonl")
    with tg.Run("test", "run", handler=handlers.jsonl(path)):
        pass
    events = events_of(parse_all(jsonl_payloads(path)))
    assert [e.type for e in events] == ["run_started", "run_finished"]
    assert events[1].data["num_failures"] == 0
    assert "ignoring TORCHELASTIC_RESTART_COUNT='once'" in caplog.text


def test_a_restart_count_of_zero_sends_no_restart_event(handlers, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    path = str(tmp_path / "m.jsonl")
    with tg.Run("test", "run", handler=handlers.jsonl(path)):
        pass
    assert [e.type for e in events_of(parse_all(jsonl_payloads(path)))] == ["run_started", "run_finished"]


def test_the_callers_num_failures_wins_over_the_restart_count(handlers, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    path = str(tmp_path / "m.jsonl")
    with tg.Run("test", "run", handler=handlers.jsonl(path)) as run:
        assert run.restart_count == 3 and run.num_failures == 3
        run.num_failures = 5
    events = events_of(parse_all(jsonl_payloads(path)))
    assert [(e.type, e.data.get("restart_count"), e.data.get("num_failures")) for e in events] == [
        ("run_started", None, None), (wire.ELASTIC_RESTART, 3, None), ("run_finished", None, 5)]


def test_explicit_arguments_win_over_the_environment(handlers, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    path = str(tmp_path / "m.jsonl")
    handler = handlers.add(tg.JsonlMetricHandler(path, "t", "r", rank=np.int64(1), world_size=8))
    assert (handler.rank, handler.world_size) == (1, 8)
    with tg.Run("t", "r", handler=handler, rank=1, world_size=8):
        tg.MetricStream("train", handler).add_value("loss", 0.5)
    messages = parse_all(jsonl_payloads(path))
    assert {(m.rank, m.world_size) for m in messages} == {(1, 8)}
    assert events_of(messages)[0].data["rank"] == 1


def test_a_rank_given_only_to_run_reaches_a_handler_that_waits_for_its_run(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, test=None, run=None)
    tg.MetricStream("train", handler).add_value("loss", 0.5)  # buffered until the run is known
    with tg.Run("t", "r", handler=handler, rank=3):
        pass
    messages = parse_all(jsonl_payloads(path))
    assert {(m.rank, m.world_size) for m in messages} == {(3, None)}
    assert [p.tag for p in points_of(messages)] == ["loss"]


def test_a_run_whose_rank_contradicts_the_handlers_is_refused(handlers, tmp_path):
    handler = handlers.add(tg.JsonlMetricHandler(str(tmp_path / "m.jsonl"), rank=1, world_size=2))
    with pytest.raises(ValueError, match="already publishes for rank=1"):
        tg.Run("t", "r", handler=handler, rank=0, world_size=2).start()


def test_run_started_names_the_handlers_rank_when_run_has_none(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.add(tg.JsonlMetricHandler(path, "t", "r", rank=0, world_size=2))
    with tg.Run("t", "r", handler=handler):
        pass
    assert events_of(parse_all(jsonl_payloads(path)))[0].data["rank"] == 0


@pytest.mark.parametrize("rank, world_size", [(-1, None), (None, 4), (4, 4), (True, None), ("1", None),
                                              (wire.MAX_WORLD_SIZE + 1, None), (0, 0)])
def test_invalid_explicit_ranks_are_refused_at_once(tmp_path, rank, world_size):
    with pytest.raises(ValueError):
        tg.JsonlMetricHandler(str(tmp_path / "m.jsonl"), "t", "r", rank=rank, world_size=world_size)
    with pytest.raises(ValueError):
        tg.Run("t", "r", rank=rank, world_size=world_size)
