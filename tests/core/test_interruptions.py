"""Runs a drain cuts short: told apart from missing runs, stored with their open state, resumed by the next job."""

import json
import random

import pytest

from core import encoding
from core.config import MetricCollectionConfig, TestConfig
from core.history import JobHistory, check_job
from core.parse import summarize
from core.records import job_history_row
from core.runs import RUN_INTERRUPTED, RunAccumulator, RunLifecycle, interrupt, open_run_text
from core.vocabulary import RunStatus
from tests.support import T0
from trainguard import wire

CONFIG = TestConfig(MetricCollectionConfig(default_aggregation_strategies=("final", "min", "max", "average")))
LIFECYCLE = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0, clock_skew_seconds=600.0)


def message(mid, points=(), events=(), rank=None, world_size=None):
    return wire.Message(mid, "t", "r", tuple(points), tuple(wire.Event(*e) for e in events), rank, world_size)


def run_messages():
    """A distributed run of two ranks: started, points, then both ranks finish."""
    messages = [message("s0", events=[("run_started", T0, {"logs": "x"})], rank=0, world_size=2),
                message("s1", events=[("run_started", T0 + 1, {})], rank=1, world_size=2)]
    for step in range(1, 9):
        for rank in (0, 1):
            messages.append(message(f"p{step}-{rank}", points=[("loss", 1.0 / step + rank, step, T0 + 10 * step),
                                                               ("acc", 10.0 * step - rank, step, T0 + 10 * step)],
                                    rank=rank, world_size=2))
    messages += [message(f"f{rank}", events=[("run_finished", T0 + 100 + rank, {"status": "success"})], rank=rank,
                         world_size=2) for rank in (0, 1)]
    return messages


def accumulate(messages):
    accumulator = RunAccumulator("t", "r")
    for m in messages:
        accumulator.add(summarize(m, b"", CONFIG))
    return accumulator


@pytest.mark.parametrize("seed", range(5))
def test_a_run_split_at_any_point_and_merged_back_ends_as_the_whole_run(seed):
    messages = run_messages()
    random.Random(seed).shuffle(messages)
    cut = random.Random(seed).randrange(len(messages) + 1)
    whole = accumulate(messages).result(CONFIG, LIFECYCLE)
    before, after = accumulate(messages[:cut]), accumulate(messages[cut:])
    # whichever holds which part: the drained job's state, or what the new job heard first
    for into, other in ((before, after), (accumulate(messages[cut:]), accumulate(messages[:cut]))):
        assert into.absorb(other) == []
        assert into.result(CONFIG, LIFECYCLE) == whole


def test_merging_keeps_no_more_events_than_a_run_may_have_and_returns_the_rest():
    full = RunAccumulator("t", "r")
    full.add(summarize(message("a", events=[("note", T0 + i, {}) for i in range(RunAccumulator.MAX_EVENTS - 1)]),
                       b"", CONFIG))
    other = accumulate([message("b", events=[("note", T0 + 5000, {}), ("note", T0 + 5001, {})])])
    overflow = full.absorb(other)
    assert len(full.events) == RunAccumulator.MAX_EVENTS and [e.time for e in overflow] == [T0 + 5001]
    with pytest.raises(ValueError, match="cannot merge run"):
        full.absorb(RunAccumulator("t", "another run"))


def test_a_run_ending_further_ahead_of_the_wall_clock_than_clock_skew_is_interrupted():
    assert LIFECYCLE.interrupted(T0 + 3600, now=T0)            # a drain fired its timeout timer early
    assert not LIFECYCLE.interrupted(T0 + 3600, now=T0 + 3600)  # the watermark got there with the clock
    assert not LIFECYCLE.interrupted(T0 + 3600, now=T0 + 3000)  # senders' clocks a little ahead
    assert RunLifecycle().clock_skew_seconds > 0


def test_an_interrupted_run_keeps_its_open_state_in_its_events_and_raises_no_alert():
    open_part = accumulate([m for m in run_messages() if not m.id.startswith("f")])
    missing = open_part.result(CONFIG, LIFECYCLE)
    assert missing.status == RunStatus.MISSING and missing.metrics
    result = interrupt(missing, T0 + 120, encoding.to_text(open_part))
    assert result.status == RunStatus.INTERRUPTED == "interrupted"
    assert result.metrics == () and result.rank_metrics == () and result.finalized_at == T0 + 120
    row = job_history_row(result)
    assert row["job_status"] == "interrupted" and row["processed_at"].startswith("2025-11-20T00:02:00")
    events = json.loads(row["events"])
    assert [e["type"] for e in events].count(RUN_INTERRUPTED) == 1
    resumed = encoding.from_text(open_run_text(events))
    assert resumed.to_state() == open_part.to_state()
    # never a run_missing or job_failed alert, and the test's last status stays what it was
    history = JobHistory("success")
    assert check_job(history, result, CONFIG) == [] and history.last_status == "success"


def test_events_without_an_open_state_give_none():
    assert open_run_text([]) is None
    assert open_run_text([{"type": RUN_INTERRUPTED, "time": T0, "data": {}}, "junk", {"type": "run_started"}]) is None
    with pytest.raises(encoding.EncodingError):
        encoding.from_text("not base64 at all!")
