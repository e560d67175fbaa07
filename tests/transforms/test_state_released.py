"""A streaming job keeps no state of a run once the run is over: its state grows with tests, not with runs.

A Dataflow streaming job runs for months: a state cell per run or per message
that is never cleared is memory (and a per-key state entry) that only grows.
The streaming graph runs here on ``BundleBasedDirectRunner`` over several days
of runs (windowed, distributed with a rank check, duplicate deliveries) until
the watermark passes the end of time, so every timer that releases state
(de-duplication horizon, a finalized run's tombstone, closed windows, a
distributed run's rank windows) has fired. Then the state the runner holds
is read back, step by step and key by key: only the per-test history checks
may hold anything (their machine's state and their timer cell), and which keys
hold state does not change with the number of days.

The runner's state is read from its evaluation context (``DirectPipelineResult``
internals): if Beam moves it, this fails loudly (no stateful step found), it
does not pass quietly.
"""

from __future__ import annotations

import re
from typing import Dict, Set, Tuple

from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from core.runs import RunLifecycle
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import configs, detect, streaming_pipeline
from tests.transforms.test_ranks import STRAGGLER_CONFIG, straggler_messages
from tests.transforms.test_windows import LOSS_WINDOWS, run_messages

DAY = 86400.0
SETTINGS = GraphSettings(configs(cifar=LOSS_WINDOWS, slow=STRAGGLER_CONFIG),
                         RunLifecycle(grace_seconds=60, timeout_seconds=3600), streaming=True)
# The history checks, keyed per test (and metric, or tag): the only steps whose state outlives a run.
PER_TEST_CHECK = re.compile(r"InEventTimeOrder\[(metric|job|window|triage)\]")
# The window checks keep their history in parts (``transforms.window_checks``): besides the live part and the timer
# cell, the finished runs, their near view and the log of open runs' windows (here the windows of a run that came
# after its end had been checked, which the one cell before the parts kept as well).
KEPT_APART = {"window": ("settled", "near", "log")}

Held = Dict[str, Dict[bytes, Tuple[Set[str], Set[str]]]]


def days_of_runs(days: int) -> TestStream:
    """A windowed run of ``cifar`` and a distributed run of ``slow`` a day, some messages delivered twice."""
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for day in range(days):
        start = T0 + day * DAY
        messages = run_messages(f"day{day}", start, [1.0, 2.0, 3.0, 2.5, 2.0, 1.5]) + straggler_messages(
            f"day{day}", start)
        stream = (stream.add_elements(messages[:7]).add_elements(messages[5:])
                  .advance_watermark_to(Timestamp.of(start + DAY - 1)))
    return stream.advance_watermark_to_infinity()


def state_left(days: int) -> Tuple[Held, Dict[str, int]]:
    """Runs the streaming graph over ``days`` of runs; returns, per step, each key whose state cells or timers
    are not empty when the job ends (its cells' and timers' names), and how many keys each stateful step saw
    (a step that saw none is not there)."""
    pipeline = streaming_pipeline()
    detect(pipeline | days_of_runs(days), SETTINGS)
    result = pipeline.run()
    result.wait_until_finish()
    held: Held = {}
    keys_seen: Dict[str, int] = {}
    for transform, states in result._evaluation_context._transform_keyed_states.items():
        if not states or transform.full_label.startswith("TestStream"):
            continue
        keys_seen[transform.full_label] = len(states)
        for key, state in states.items():
            cells = {tag for tags in state.state.values() for tag, values in tags.items() if values}
            timers = {name for timers in state.timers.values() for name, *_ in timers}
            if cells or timers:
                held.setdefault(transform.full_label, {})[key] = (cells, timers)
    return held, keys_seen


def step_with(fragment: str, keys_seen: Dict[str, int]) -> str:
    [label] = [label for label in keys_seen if fragment in label]
    return label


def test_a_streaming_job_keeps_no_state_of_runs_that_are_over():
    held, keys_seen = state_left(days=3)
    # Not vacuous: the stateful steps of runs and messages saw every run (cifar, and slow's 4 ranks' windows).
    assert keys_seen[step_with("AssembleRunFn", keys_seen)] == 6
    assert keys_seen[step_with("WindowRunFn", keys_seen)] == 3 + 3 * 4
    assert keys_seen[step_with("InEventTimeOrder[rank_windows]", keys_seen)] == 3
    assert keys_seen[step_with("DeduplicateFn", keys_seen)] == 3 * (8 + 4 * 8)  # message ids
    for label, keys in held.items():
        match = PER_TEST_CHECK.search(label)
        assert match, f"{label} holds state of runs that are over: {keys}"
        name = match.group(1)
        for key, (cells, timers) in keys.items():
            assert not timers, (label, key, timers)
            kept = ("keyed", "scheduled", *KEPT_APART.get(name, ()))
            assert cells <= {f"user/{name}_{cell}" for cell in kept}, (label, key, cells)
    assert len(held) == 4  # metric, job, window and triage checks hold each test's history


def test_the_state_a_streaming_job_keeps_does_not_grow_with_its_runs():
    fewer, _ = state_left(days=2)
    more, _ = state_left(days=4)
    assert {label: set(keys) for label, keys in more.items()} == {label: set(keys) for label, keys in fewer.items()}
