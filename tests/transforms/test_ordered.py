"""The ordered stage (``transforms.ordered``): items in a bag, the machine's state apart, seeds delivered keyed.

Most tests drive the real DoFn for one key with its state in stand-ins of Beam's state API that keep bytes
between calls, as a runner does (``bench.bench_ordered.OneKey``), so that they can look at the state itself and
at what each call read; the last ones run pipelines.
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Set, Tuple

import apache_beam as beam
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from bench import bench_ordered
from bench.bench_ordered import OneKey
from core import encoding
from core.history import HistorySeed, SeededState
from core.schema import DEAD_LETTER
from core.window_checks import RunEnded
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, detect, drained, raw, streaming_pipeline
from transforms.ordered import IDLE, OrderedCheck, OrderedStage, StepGroupsFn, in_event_time_order

KEY = "cifar"


class Collect:
    """Keeps the runs it has seen; yields each with how many came before it. A poisoned run raises after it
    has changed the state."""

    def __init__(self, poison=()):
        self.poison = set(poison)

    def initial(self, key):
        return []

    def forget_at(self, state):
        return None

    def step(self, state, item):
        state.append(item.run)
        if item.run in self.poison:
            raise RuntimeError("injected")
        yield item.run, len(state) - 1


def ended(i: int, at: float = None) -> RunEnded:
    return RunEnded(KEY, f"r{i:02d}", "success", T0 + i if at is None else at, "loss", "count")


def one_key(machine=None, streaming=False) -> OneKey:
    return OneKey(in_event_time_order(machine or Collect(), "collect", streaming, 0), KEY)


def plain(outputs: List[Any]) -> List[Tuple[Any, Any]]:
    """(tag, value) of each output (None: the main output)."""
    return [(o.tag, o.value) if isinstance(o, beam.pvalue.TaggedOutput) else (None, o) for o in outputs]


def machine_state(key: OneKey) -> Any:
    return key.state["keyed"].read()


def test_an_item_reads_neither_the_pending_items_nor_the_machine_state():
    key = one_key(streaming=True)
    key.add(ended(0))
    key.fire()
    keyed, pending = key.state["keyed"], key.state["pending"]
    reads = (keyed.reads, pending.reads)
    for i in range(1, 50):
        key.add(ended(i))
    assert (keyed.reads, pending.reads) == reads
    assert len(pending.data) == 49


def test_an_item_only_moves_the_timer_earlier():
    key = one_key(streaming=True)
    key.add(ended(5))
    assert key.timer.at == Timestamp.of(T0 + 5)
    key.add(ended(9))
    assert key.timer.at == Timestamp.of(T0 + 5)
    key.add(ended(2))
    assert key.timer.at == Timestamp.of(T0 + 2) and key.state["scheduled"].read() == Timestamp.of(T0 + 2).micros


def test_a_streaming_firing_steps_what_is_due_in_order_and_keeps_the_rest_for_the_next():
    key = one_key(streaming=True)
    for i in (4, 1, 3, 0, 2):
        key.add(ended(i))
    assert plain(key.fire(Timestamp.of(T0 + 2))) == [(None, ("r00", 0)), (None, ("r01", 1)), (None, ("r02", 2))]
    assert sorted(item.run for item in key.state["pending"].read()) == ["r03", "r04"]
    assert key.timer.at == Timestamp.of(T0 + 3)
    assert plain(key.fire()) == [(None, ("r03", 3))]
    assert plain(key.fire()) == [(None, ("r04", 4))]
    assert key.state["pending"].read() == [] and key.state["scheduled"].read() == IDLE and key.timer.at is None
    assert machine_state(key) == ["r00", "r01", "r02", "r03", "r04"]


def test_a_bounded_firing_steps_every_pending_item_in_order():
    key = one_key()
    order = list(range(20))
    random.Random(1).shuffle(order)
    for i in order:
        key.add(ended(i))
    assert plain(key.fire()) == [(None, (f"r{i:02d}", i)) for i in range(20)]
    assert key.state["pending"].read() == []


def test_a_failing_item_in_the_middle_of_a_firing_leaves_the_state_as_if_it_had_not_been_there():
    poisoned = one_key(Collect(poison={"r04", "r07"}))
    control = one_key()
    for i in range(10):
        poisoned.add(ended(i))
        if i not in (4, 7):
            control.add(ended(i))
    outputs = plain(poisoned.fire())
    dead = [value for tag, value in outputs if tag == DEAD_LETTER.name]
    assert [json.loads(row["payload"])["run"] for row in dead] == ["r04", "r07"]
    assert all("RuntimeError: injected" in row["reason"] and row["source"] == "stage:collect" for row in dead)
    assert [o for o in outputs if o[0] is None] == plain(control.fire())
    assert machine_state(poisoned) == machine_state(control) == ["r00", "r01", "r02", "r03", "r05", "r06", "r08",
                                                                 "r09"]
    assert poisoned.state["keyed"].data == control.state["keyed"].data  # the same bytes


def test_a_timer_firing_with_nothing_pending_does_nothing():
    key = one_key(streaming=True)
    assert key.fire(Timestamp.of(T0)) == []
    assert all(cell.data in (None, []) for cell in key.state.values())
    key.add(ended(0))
    key.fire()
    written = key.saved()
    assert key.fire(Timestamp.of(T0 + 100)) == [] and key.saved() == written


class CollectAndForget(Collect):
    """``Collect`` keyed per run: forgotten 100 s after the latest run it saw."""

    def forget_at(self, state):
        return T0 + int(state[-1][1:]) + 100 if state else None


def test_a_streaming_key_whose_machine_forgets_is_cleared_once_its_time_has_passed():
    key = one_key(CollectAndForget(), streaming=True)
    key.add(ended(0))
    assert plain(key.fire()) == [(None, ("r00", 0))]
    assert key.timer.at == Timestamp.of(T0 + 100) and key.state["scheduled"].read() == key.timer.at.micros
    key.add(ended(5))  # before that time: stepped as usual, and the time moves
    assert key.timer.at == Timestamp.of(T0 + 5)
    assert plain(key.fire()) == [(None, ("r05", 1))]
    assert key.timer.at == Timestamp.of(T0 + 105)
    assert key.fire(Timestamp.of(T0 + 50)) == []  # an earlier timer firing late: the later one stays
    assert key.timer.at == Timestamp.of(T0 + 105) and machine_state(key) == ["r00", "r05"]
    assert key.fire() == []
    assert all(cell.data in (None, []) for cell in key.state.values())
    key.add(ended(300))  # after it: a new key
    assert plain(key.fire()) == [(None, ("r300", 0))]


def test_a_bounded_replay_forgets_nothing():
    key = one_key(CollectAndForget())
    key.add(ended(0))
    key.fire()
    assert key.timer.at is None and machine_state(key) == ["r00"]


def test_a_seeded_state_becomes_the_keys_state_before_its_first_item():
    key = one_key()
    assert key.add(SeededState(["old-1", "old-2"])) == []
    key.add(ended(0))
    assert key.state["keyed"].reads == 1  # the seed's look for a state; the item read nothing
    assert plain(key.fire()) == [(None, ("r00", 2))]


def test_a_seed_for_a_key_that_already_has_a_state_is_a_dead_letter_and_the_state_is_kept():
    key = one_key()
    key.add(ended(0))
    key.fire()
    (dead,) = plain(key.add(SeededState(["old"])))
    assert dead[0] == DEAD_LETTER.name and dead[1]["reason"].startswith("seed of collect check not applied")
    assert machine_state(key) == ["r00"]


def test_a_seed_never_changes_the_object_it_came_from():
    seeded = ["old"]
    key = one_key()
    key.add(SeededState(seeded))
    key.add(ended(0))
    key.fire()
    assert seeded == ["old"]


class CollectCheck(OrderedCheck):
    """(key, RunEnded) -> what ``Collect`` yields, with the seeds of ``HistorySeed.jobs`` (a test's state)."""

    def expand(self, items):
        return self.seeded_in_order(items, "InOrder", Collect(), "collect", "jobs", DEAD_LETTER.name, main="main")


SEED = HistorySeed(jobs={"a": ["a-old"], "unused": ["never"]})


def check_outputs(p, items, streaming=True):
    """What ``CollectCheck`` yields is ``EXPECTED`` (in any order), and it has no dead letters."""
    seed = p | "Seed" >> beam.Create([SEED])
    outputs = items | "Check" >> CollectCheck(None, seed, streaming=streaming, timer_bucket_seconds=0)
    assert_that(outputs.main, equal_to(EXPECTED), label="main")
    assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="dead")


def keyed_items():
    items = [(key, RunEnded(key, f"{key}{i}", "success", T0 + i, "loss", "count")) for key in "ab" for i in range(3)]
    random.Random(2).shuffle(items)
    return items


EXPECTED = [("a0", 1), ("a1", 2), ("a2", 3), ("b0", 0), ("b1", 1), ("b2", 2)]


@pytest.mark.parametrize("as_a_replay_runs_it", [False, True])
def test_seeds_reach_their_keys_in_a_replay(as_a_replay_runs_it):
    """Also as a replay runs it (grouped, each key's seed looked up in an index of the seed): a seeded key starts
    from it."""
    with batch_pipeline() as p:
        check_outputs(p, p | "Items" >> beam.Create(keyed_items()).with_output_types(beam.typehints.KV[str, RunEnded]),
                      streaming=not as_a_replay_runs_it)


def test_seeds_reach_their_keys_as_elements_in_a_stream():
    stream = (TestStream().advance_watermark_to(Timestamp.of(T0 - 10))
              .add_elements([beam.window.TimestampedValue(item, item[1].finalized_at) for item in keyed_items()])
              .advance_watermark_to(Timestamp.of(T0 + 1.5)))
    stream = drained(stream, T0 + 100)
    with streaming_pipeline() as p:
        check_outputs(p, p | stream | "Typed" >> beam.Map(lambda kv: kv).with_output_types(
            beam.typehints.KV[str, RunEnded]))


def seed_side_inputs(streaming: bool) -> Tuple[Set[Tuple[str, str]], Set[str]]:
    """(step, producer of its side input) of each side input of the graph, with live windows; and its steps."""
    p = beam.Pipeline()
    detect(p | "Messages" >> beam.Create([raw(KEY, "r0", "m0", points=[("acc", 1.0, 1, T0)])]),
           GraphSettings(configs(cifar={"window_config": {"tags": {"loss": {"count": 4, "aggregations": ["mean"]}}}}),
                         streaming=streaming), SEED)  # (with live windows: a replay without any leaves them out)
    components = p.to_runner_api().components
    producers = {output: t.unique_name for t in components.transforms.values() if not t.subtransforms
                 for output in t.outputs.values()}
    side_inputs = set()
    for t in components.transforms.values():
        if t.spec.urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            side_inputs |= {(t.unique_name, producers[t.inputs[tag]]) for tag in payload.side_inputs}
    return side_inputs, {t.unique_name for t in components.transforms.values()}


CHECKS = ("CheckMetrics", "CheckRuns", "LiveWindows/Checks", "Triage")
STORED_INDEX = {("DetectRegressions/SkipStoredActions/NotStored", "DetectRegressions/StoredIndex"),
                ("DetectRegressions/SkipStoredRuns/NotStored/ParDo(_SkipStoredRunsFn)", "DetectRegressions/StoredIndex")}


def test_a_stream_broadcasts_of_the_seed_only_the_index_of_stored_ids():
    """Each key's history reaches it as an element (``WithSeeds``): no worker of a stream reads every history."""
    side_inputs, steps = seed_side_inputs(streaming=True)
    assert side_inputs == STORED_INDEX
    assert {step for step in steps if step.endswith("/WithSeeds/Seeds")} == {
        f"DetectRegressions/{check}/WithSeeds/Seeds" for check in CHECKS}


def test_a_replays_grouped_checks_look_their_keys_up_in_an_index_of_the_seed():
    """A replay's grouped step of each check reads its field of the seed, each state encoded apart (``SeedIndex``),
    and no seed is joined to the keys as elements."""
    label = {"Triage": "InOrder"}
    side_inputs, steps = seed_side_inputs(streaming=False)
    assert side_inputs == STORED_INDEX | {
        (f"DetectRegressions/{check}/{label.get(check, 'CheckInOrder')}/StepInOrder/ParDo(StepGroupsFn)",
         f"DetectRegressions/{check}/SeedIndex") for check in CHECKS}
    assert not [step for step in steps if "WithSeeds" in step]


def test_the_benchmark_runs_and_prints_its_tables(capsys):
    bench_ordered.main(["--pending", "3", "30", "--items", "4", "--repeat", "1", "--runs", "1", "--windows", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| pending items |") and lines[2].startswith("| 3 |") and lines[3].startswith("| 30 |")
    assert lines[-1].startswith("| 1 runs x 5 windows")



class CollectInOrder(OrderedCheck):
    """(key, RunEnded or ``SeededState``) -> (tag, output as JSON, its timestamp in µs) of what ``Collect`` (a03 and
    b02, of seeded keys, and c04 poisoned) yields: as ``in_order`` runs it, or (``stateful``) with the stateful DoFn whatever the input."""

    def __init__(self, streaming: bool, stateful: bool = False):
        super().__init__(None, None, streaming=streaming, timer_bucket_seconds=0)
        self.stateful = stateful

    def expand(self, items):
        machine = Collect(poison={"a03", "b02", "c04"})
        in_order = (beam.ParDo(in_event_time_order(machine, "collect", self.streaming, 0)) if self.stateful
                    else self.in_order(machine, "collect"))
        outputs = items | "InOrder" >> in_order.with_outputs(DEAD_LETTER.name, main="main")

        def stamped(tag):
            def with_time(value, at=beam.DoFn.TimestampParam):
                yield tag, json.dumps(value, sort_keys=True, default=str), at.micros
            return with_time
        return ((outputs.main | "MainAt" >> beam.ParDo(stamped("main")),
                 outputs[DEAD_LETTER.name] | "DeadAt" >> beam.ParDo(stamped("dead")))
                | "Stamped" >> beam.Flatten())


FOUND: List[Any] = []


def keep(output: Any) -> None:
    FOUND.append(output)  # FnApiRunner runs the pipeline in this process


def bounded_outputs(stateful: bool) -> List[Any]:
    """What ``CollectInOrder`` gives on a bounded input: with the stateful DoFn, or as a replay runs it."""
    items = [(key, RunEnded(key, f"{key}{i:02d}", "success", T0 + 10 * i + ord(key), "loss", "count"))
             for key in "abc" for i in range(6)]
    items += [("a", SeededState(["a-old"])), ("b", SeededState(["b-old"])), ("b", SeededState(["b-old"]))]
    random.Random(3).shuffle(items)
    FOUND.clear()
    with batch_pipeline() as p:
        (p | beam.Create(items).with_output_types(beam.typehints.KV[str, Any])
         | CollectInOrder(streaming=False, stateful=stateful) | beam.Map(keep))
    return sorted(FOUND)


def test_a_replay_groups_each_key_and_gives_what_the_stateful_stage_gives():
    grouped = bounded_outputs(stateful=False)
    assert grouped == bounded_outputs(stateful=True)
    main = [json.loads(value) for tag, value, _ in grouped if tag == "main"]
    assert len(main) == 15 and ["a00", 1] in main and ["b00", 1] in main and ["c00", 0] in main  # seeds first
    # a failed item leaves the state as it was, whether the key started from its seed or from nothing
    assert ["a05", 5] in main and ["b05", 5] in main and ["c05", 4] in main
    dead = [json.loads(value) for tag, value, _ in grouped if tag == "dead"]
    assert sorted(row["reason"].split(":")[0] for row in dead) == [
        "error in collect check", "error in collect check", "error in collect check",
        "seed of collect check not applied"]
    assert {at for tag, _, at in grouped if tag == "main"} == {Timestamp.of(T0 + ord(k)).micros for k in "abc"}


def test_a_key_seeded_from_the_index_starts_from_it_keeps_it_through_a_failure_and_refuses_a_second_seed():
    stage = OrderedStage(Collect(poison={"r01"}), "collect", False, 0)
    items = [ended(2), ended(1), ended(0)]
    outputs = list(stage.step_group(KEY, items + [SeededState(["other"])], encoding.encode(["old"])))
    main = [o.value for o in outputs if not isinstance(o, beam.pvalue.TaggedOutput)]
    assert main == [("r00", 1), ("r02", 2)]  # after the seed; r01 failed and left the state as it was
    dead = [o.value.value["reason"].split(":")[0] for o in outputs if isinstance(o, beam.pvalue.TaggedOutput)]
    assert sorted(dead) == ["error in collect check", "seed of collect check not applied"]
    # the index's bytes are decoded again for a failure, never an object shared with another key
    assert [o.value for o in stage.step_group(KEY, [ended(0)], encoding.encode(["old"]))
            if not isinstance(o, beam.pvalue.TaggedOutput)] == [("r00", 1)]


def test_items_grouped_under_an_outer_key_are_stepped_per_machine_key_as_if_keyed_one_by_one():
    """``keys_within``: a replay groups a test's runs, each holding items of several machine keys (its metrics);
    each machine key is stepped, from its seed, as it would be had each item been keyed on its own."""
    items = [(key, RunEnded(key, f"{key}{i:02d}", "success", T0 + 10 * i + ord(key), tag, "count"))
             for key in "ab" for tag in ("loss", "acc") for i in range(4)]
    random.Random(4).shuffle(items)
    seeds = {("a", "loss"): encoding.encode(["a-old"]), ("b", "acc"): encoding.encode(["b-old", "b-older"])}
    one_by_one = StepGroupsFn(OrderedStage(Collect(poison={"a02"}), "collect", False, 0))
    expected = []
    for key in sorted({(test, item.tag) for test, item in items}):
        expected += one_by_one.process((key, [item for test, item in items if (test, item.tag) == key]),
                                       seeds)
    by_test: Dict[str, List[List[RunEnded]]] = {}
    for test, item in items:  # values holding several items, as a run holds its metrics
        by_test.setdefault(test, []).append([item])
    within = StepGroupsFn(OrderedStage(Collect(poison={"a02"}), "collect", False, 0),
                          lambda test, held: (((test, item.tag), item) for item in held))
    grouped = [output for test, held in by_test.items() for output in within.process((test, held), seeds)]
    def described(outputs):  # (tag, value, timestamp) of each output
        stamped = [(o.tag, o.value) if isinstance(o, beam.pvalue.TaggedOutput) else (None, o) for o in outputs]
        return sorted(repr((tag, value.value, value.timestamp)) for tag, value in stamped)
    assert described(grouped) == described(expected) and len(expected) == 16  # 14 stepped, 2 dead


def test_a_replay_keeps_no_state_in_its_ordered_stages():
    p = beam.Pipeline(runner=FnApiRunner())
    (p | beam.Create([("a", ended(0))]).with_output_types(beam.typehints.KV[str, RunEnded])
     | CollectInOrder(streaming=False))
    transforms = p.to_runner_api().components.transforms.values()
    assert any(t.unique_name.endswith("InOrder/GroupByKey") for t in transforms)
    for t in transforms:
        if t.spec.urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            assert not payload.state_specs and not payload.timer_family_specs, t.unique_name
