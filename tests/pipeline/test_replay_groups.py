"""A replay too large for one pipeline run reads its tests in groups, one run each: the same store, the same
alerts file, whatever the number of groups (``--replay_group_mib``)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings

import pipeline.replay as replay_module
from core.config_versions import load_local_versions
from core.history import HistorySeed, JobHistory, MetricHistory
from core.runs import RunAccumulator
from core.triage import AlertLedger
from pipeline.replay import line_groups
from sinks.duckdb_store import DuckDBStore
from tests.pipeline.test_replay import CIFAR, REPO, cifar_lines, replay, table_contents, write_lines
from tests.support import T0
from tests.trainguard.test_fast_points import messages
from tests.transforms.test_ranks import straggler_messages
from trainguard import wire
from transforms import sources
from transforms.sources import (
    file_lines,
    group_of_test,
    line_names,
    line_test_name,
    lines_in_ranges,
    survey_lines,
)

TINY_GROUPS = "--replay_group_mib=0.02"  # ~20 KB of input a group: every test of the input below in a group of its own
TWO_RUN_GROUPS = "--replay_group_runs=2"  # about two runs a group


def messy_input(tmp_path, name: str, lines_of_runs) -> str:
    """(The first input:) the demo's four tests (their bad lines too); cifar's daily runs, a distributed run, triage actions, lines
    without a usable test, redeliveries, all shuffled, CRLF and blank lines among them."""
    lines = [line for path in sorted(glob.glob(f"{REPO}/data/demo/*.jsonl")) if name == "first"
             for line in read_bytes(path).splitlines()]
    lines += [m for run in lines_of_runs for m in run]
    lines += [m.payload for m in straggler_messages(f"{name}-dist", T0 + (0 if name == "first" else 40) * 86400)]
    lines += [wire.encode_triage(CIFAR, wire.Triage("accept", T0 + 8.5 * 86400, metric="Accuracy/test_final",
                                                    run=f"{CIFAR}-008"), f"accept-{name}"),
              wire.encode_triage("pt-llama-record-only", wire.Triage("mute", T0, until=T0 + 99 * 86400),
                                 f"mute-{name}")]
    lines += [b"not json", b'["a list"]', b'{"test": 5, "run": "r"}', b"\xff\xfe" + name.encode(),
              b'{"schema":"trainguard/v1","id":"nan-' + name.encode() + b'","test":"' + CIFAR.encode()
              + b'","run":"nan-run","points":[{"tag":"loss","value":NaN,"time":1763596805}]}']
    lines += lines[::7]
    random.Random(name).shuffle(lines)
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(b"".join(line + (b"\r\n" if i % 5 == 0 else b"\n") + (b"\n" if i % 11 == 0 else b"")
                              for i, line in enumerate(lines)))
    return str(path)


@pytest.mark.long
@pytest.mark.parametrize("grouping", [(TINY_GROUPS,), ("--replay_group_mib=0", TWO_RUN_GROUPS)],
                         ids=["by size", "by runs"])
def test_a_replay_in_groups_gives_the_same_store_and_alerts_file_as_one_group(tmp_path, grouping):
    runs = cifar_lines()
    first, second = messy_input(tmp_path, "first", runs[:8]), messy_input(tmp_path, "second", runs[8:])
    assert len(line_groups([first], 0.02, False)) >= 5 and len(line_groups([first], 0, False, 2)) >= 3
    for path in (first, second):  # the second invocation continues from the stored histories (the seed)
        assert replay(tmp_path, path, store="one.duckdb", alerts="one.jsonl",
                      extra=("--report_dir=", "--replay_group_mib=0", "--replay_group_runs=0")) == 0
        assert replay(tmp_path, path, store="groups.duckdb", alerts="groups.jsonl",
                      extra=("--report_dir=", *grouping)) == 0
        assert table_contents(tmp_path / "groups.duckdb") == table_contents(tmp_path / "one.duckdb")
        assert (tmp_path / "groups.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    contents = table_contents(tmp_path / "one.duckdb")
    assert len(contents["dead_letter"]) >= 8 and contents["triage"] and contents["rank_metrics"]
    assert len(contents["alerts"]) >= 10


def test_runs_are_counted_as_the_lines_name_them(tmp_path):
    lines = [wire.encode_message(f"test-{i % 3}", f"r{i % 4}", [], [wire.event_dict("run_started", T0, {})],
                                 message_id=f"m{i}") for i in range(40)]
    lines += [b"not json", b'{"test": "t"}', b'{"test": "t", "run": 5}', b"  "]
    # read by decoding (not as the encoders begin a message): one run seen above, and one new
    lines += [b'{"run": "r0", "test": "test-0", "schema": "trainguard/v1"}', b'{"test": "t\\u00e9", "run": "r"}']
    # as the encoders begin a message, but with a second test: decoded, the last one counts
    lines += [b'{"schema":"trainguard/v1","id":"d\\"1","test":"test-0","run":"r9","test":"test-1"}']
    files = [write_lines(tmp_path / f"{n}.jsonl", lines[n::2]) for n in range(2)]
    survey = survey_lines(files)
    # (test-i, rj) with i = k mod 3, j = k mod 4: all 12 pairs; ("té", "r"); ("test-1", "r9")
    assert (survey.lines, survey.runs, survey.tests) == (len(lines) - 1, 14, {"test-0", "test-1", "test-2", "té", "t"})
    assert sources._NAMES_FIRST.match(lines[0]).groups() == (b"test-0", b"r0")  # the encoders' lines: not decoded
    assert line_names(lines[-1]) == ("test-1", "r9")
    assert survey_lines(files, test_limit=5).tests is not None and survey_lines(files, test_limit=4).tests is None


def test_small_inputs_are_not_counted_and_many_runs_make_groups(tmp_path):
    lines = [wire.encode_message(f"test-{i}", "r", [], [wire.event_dict("run_started", T0, {})], message_id=f"m{i}")
             for i in range(60)]
    path = write_lines(tmp_path / "many.jsonl", lines)
    assert line_groups([path], 0, False, 0) == [None]
    assert line_groups([path], 0, False, 1000) == [None]  # 60 lines cannot hold 1,000 runs: not even counted
    groups = line_groups([path], 0, False, 20)
    assert [group.count for group in groups] == [3, 3, 3]
    assert line_groups([path], 0, True, 20) == [None]  # a stream is never grouped


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_every_line_is_in_exactly_one_group_and_every_line_of_a_test_in_the_same(tmp_path):
    tests = [f"test-{i}" for i in range(12)]
    lines = [wire.encode_message(tests[(i // 5) % 12], "r", [], [wire.event_dict("run_started", T0, {})],
                                 message_id=f"m{i}") for i in range(300)] + [b"not json", b"  ", b"{}"]
    files = [write_lines(tmp_path / f"{n}.jsonl", lines[n * 101:(n + 1) * 101]) for n in range(3)]
    groups = survey_lines(files).groups(4)
    assert [group.index for group in groups] == [0, 1, 2, 3]
    for path in map(os.path.realpath, files):
        with open(path, "rb") as f:
            whole = list(file_lines(f))
        by_group = [list(file_lines_of(path, group)) for group in groups]
        assert sorted(line for lines in by_group for line in lines) == sorted(whole)
        sequence = [group_of_test(line_test_name(line), 4) for _, line in whole]
        for group, lines in zip(groups, by_group):
            assert all(group.holds(line_test_name(line)) for _, line in lines)
            blocks = sum(1 for i, g in enumerate(sequence) if g == group.index and (i == 0 or sequence[i - 1] != g))
            assert len(group.ranges.get(path, [])) == 2 * blocks  # a range per block of consecutive lines
    assert group_of_test(None, 4) == 0


def file_lines_of(path: str, group):
    with open(path, "rb") as f:
        yield from lines_in_ranges(f, group.ranges.get(path, []))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_the_test_of_a_line_is_the_one_the_parser_reads(payload):
    """A line the wire parser takes (doubled keys, NaN literals, odd envelopes) is grouped by its test as
    parsed; one it refuses whole is a dead letter of whichever group reads it."""
    try:
        message, _ = wire.parse_message(payload)
    except wire.InvalidMessage:
        return
    line = payload.strip()
    assert line_test_name(line) == message.test
    assert line_names(line)[0] == message.test  # as the survey reads it


def test_a_line_with_a_doubled_test_key_is_placed_by_the_test_the_parser_reads(tmp_path):
    """The pass that sizes a replay's groups takes each test from the line's start (a doubled key may size a line
    as another test's); the pass that places the lines, made only where there are several groups, is exact."""
    lines = [wire.encode_message(f"test-{i % 6}", "r", [], [wire.event_dict("run_started", T0, {})],
                                 message_id=f"m{i}") for i in range(60)]
    doubled = lines[0][:-1] + b',"test":"test-5"}'
    assert wire.parse_message(doubled)[0].test == "test-5" == line_names(doubled)[0]
    assert line_names(doubled, exact=False)[0] == "test-0"
    assert group_of_test("test-0", 3) != group_of_test("test-5", 3)
    path = write_lines(tmp_path / "doubled.jsonl", [doubled] + lines[1:])
    groups = line_groups([path], 0, False, 2)  # 6 runs, 2 a group: 3 groups (of which test-0 to 5 fill two)
    assert {group.count for group in groups} == {3} and len(groups) == 2
    placed = [(group, line) for group in groups for _, line in file_lines_of(os.path.realpath(path), group)]
    assert len(placed) == 60 and all(group.holds(line_test_name(line)) for group, line in placed)
    with pytest.raises(ValueError, match="cannot place"):
        survey_lines([path], exact=False).groups(3)


def test_a_replay_grouped_by_its_size_alone_surveys_its_lines_once(tmp_path, monkeypatch):
    """Where every line counts, the size makes the groups before any survey: the one pass is the exact one."""
    import pipeline.replay as replay_module
    passes = []
    monkeypatch.setattr(replay_module, "survey_lines",
                        lambda *args, **kwargs: passes.append(kwargs.get("exact", True)) or survey_lines(*args, **kwargs))
    lines = [wire.encode_message(f"test-{i % 6}", "r", [], [wire.event_dict("run_started", T0, {})],
                                 message_id=f"m{i}") for i in range(60)]
    path = write_lines(tmp_path / "sized.jsonl", lines)
    assert len(line_groups([path], os.path.getsize(path) / 2 ** 20 / 3, False, 1000)) > 1 and passes == [True]


def test_a_line_without_a_usable_test_has_none():
    assert [line_test_name(line) for line in (b"not json", b"[1]", b'{"test": 5}', b"\xff", b'{"run": "r"}')] == \
        [None] * 5
    assert line_test_name(b'{"test": "a", "points": [{"value": NaN}], "test": "b"}') == "b"


def test_the_seed_of_a_group_holds_its_tests_only():
    seed = HistorySeed(
        metrics={("a", "loss"): MetricHistory(), ("b", "loss"): MetricHistory()},
        jobs={"a": JobHistory(), "b": JobHistory()}, stored_runs=frozenset({("a", "r1"), ("b", "r1")}),
        windows={("a", "loss", "count"): None, ("b", "loss", "count"): None}, stored_actions=frozenset({"x"}),
        ledgers={"a": AlertLedger(), "b": AlertLedger()},
        open_runs={("a", "r2"): RunAccumulator("a", "r2"), ("b", "r2"): RunAccumulator("b", "r2")})
    only_a = seed.of_tests(lambda test: test == "a")
    for field in dataclasses.fields(HistorySeed):
        kept = getattr(only_a, field.name)
        if field.name == "stored_actions":  # ids that name no test
            assert kept == seed.stored_actions
        else:
            assert kept and "b" not in json.dumps(sorted(map(repr, kept))), field.name


def held_by_w_tests(test):
    """Lines held whole in these tests: those of tests named w-..., and those without a test."""
    return test is None or test.startswith("w-")


def test_only_the_lines_a_run_holds_whole_count_against_the_size(tmp_path):
    """A run holds the lines of tests with live windows until it windows them, and of the others only their
    runs' aggregates and ids: so ``--replay_group_mib`` bounds the first (and lines without a test), and
    ``--replay_group_lines`` and ``--replay_group_runs`` bound the rest."""
    points = [wire.point_dict("loss", 1.0, T0 + i, i) for i in range(40)]
    def lines(prefix, tests, per_test):
        return [wire.encode_message(f"{prefix}-{t}", f"r{i}", points, message_id=f"{prefix}{t}-{i}")
                for t in range(tests) for i in range(per_test)]
    plain = write_lines(tmp_path / "plain.jsonl", lines("p", 20, 10))  # 200 lines of ~2.5 KB
    size_mib = os.path.getsize(plain) / 2 ** 20
    assert len(line_groups([plain], size_mib / 4, False)) >= 4  # every line counts without the tests' configs
    assert line_groups([plain], size_mib / 4, False, held_whole=held_by_w_tests) == [None]
    assert len(line_groups([plain], size_mib / 4, False, held_whole=held_by_w_tests, group_lines=50)) >= 4
    assert len(line_groups([plain], size_mib / 4, False, 50, held_whole=held_by_w_tests)) >= 4  # 200 runs
    assert line_groups([plain], size_mib / 4, False, 500, held_whole=held_by_w_tests, group_lines=500) == [None]

    mixed = write_lines(tmp_path / "mixed.jsonl", lines("p", 20, 10) + lines("w", 4, 10) + [b"not json"] * 3)
    survey = survey_lines([mixed])
    held = survey.bytes_of_tests(held_by_w_tests)
    assert held == sum(len(line) for line in read_bytes(mixed).splitlines()
                       if line.startswith(b"not") or b'"test":"w-' in line)
    groups = line_groups([mixed], held / 2 ** 20 / 3, False, held_whole=held_by_w_tests)
    assert len(groups) == 3 and len(line_groups([mixed], held / 2 ** 20 * 2, False, held_whole=held_by_w_tests)) == 1
    assert line_groups([mixed], held / 2 ** 20 / 3, False, survey=survey, held_whole=held_by_w_tests) == groups


def test_a_test_may_have_live_windows_if_any_version_of_its_config_or_of_the_default_has(tmp_path):
    windows = json.loads(read_bytes(f"{REPO}/configs/{CIFAR}.json"))["window_config"]
    (tmp_path / "plain.json").write_text("{}")
    assert not load_local_versions(str(tmp_path)).strict().any_live_windows()  # (a graph leaves them out)
    (tmp_path / "later@20260101T000000Z.json").write_text(json.dumps({"window_config": windows}))
    (tmp_path / "later.json").write_text("{}")
    versions = load_local_versions(str(tmp_path)).strict()
    assert not versions.may_have_live_windows("plain") and not versions.may_have_live_windows("unconfigured")
    assert versions.may_have_live_windows("later") and versions.may_have_live_windows(None)
    assert versions.any_live_windows()  # an earlier version of one test has them
    (tmp_path / "default.json").write_text(json.dumps({"window_config": windows}))
    versions = load_local_versions(str(tmp_path)).strict()
    assert versions.may_have_live_windows("plain") and versions.may_have_live_windows("unconfigured")


def demo_lines_of_other_tests():
    """The demo's lines of its three tests other than cifar (which the repository's configs give no live windows)."""
    return [line for path in sorted(glob.glob(f"{REPO}/data/demo/*.jsonl")) if CIFAR not in path
            for line in read_bytes(path).splitlines() if line.strip() and line_test_name(line)]


def test_a_replay_sizes_its_groups_by_the_lines_of_tests_with_live_windows(tmp_path, monkeypatch):
    """The replay asks its configs which tests have live windows: lines of tests without them (the demo's other
    three, which the repository's configs give none) make no groups however many MiB they are; cifar's, which
    have windows, do."""
    import pipeline.replay as replay_module
    pipeline_runs = []
    run_group = replay_module._run_group
    monkeypatch.setattr(replay_module, "_run_group", lambda *args: pipeline_runs.append(1) or run_group(*args))
    others = demo_lines_of_other_tests()
    plain = write_lines(tmp_path / "others.jsonl", others)
    assert replay(tmp_path, plain, store="others.duckdb", alerts="others-alerts.jsonl",
                  extra=("--report_dir=", TINY_GROUPS)) == 0
    assert len(pipeline_runs) == 1 and len(line_groups([plain], 0.02, False)) >= 2  # every line counted: groups
    windowed = write_lines(tmp_path / "both.jsonl", others + [m for run in cifar_lines() for m in run])
    assert replay(tmp_path, windowed, store="both.duckdb", alerts="both-alerts.jsonl",
                  extra=("--report_dir=", TINY_GROUPS)) == 0
    assert len(pipeline_runs) > 1 + 1  # cifar's lines make groups, in which the other tests are spread


def test_a_replay_builds_live_windows_if_a_test_its_lines_name_may_have_them(tmp_path):
    """A small replay surveys its lines: live windows are built where a line's test (as the parser reads it), or a
    line without a test, may have them; without a survey the configs decide."""
    versions = load_local_versions(f"{REPO}/configs").strict()
    others = demo_lines_of_other_tests()
    cifar_action = wire.encode_triage(CIFAR, wire.Triage("mute", T0, until=T0 + 86400), "mute-cifar")
    doubled = others[0][:-1] + b',"test":"' + CIFAR.encode() + b'"}'
    assert line_names(doubled, exact=False)[0] != CIFAR == line_test_name(doubled)
    cases = {"others": ([], False), "a cifar action": ([cifar_action], True), "not json": ([b"not json"], True),
             "a doubled key": ([doubled], True), "cifar": ([m for run in cifar_lines()[:1] for m in run], True)}
    for name, (more, windowed) in cases.items():
        path = write_lines(tmp_path / f"{name}.jsonl", others + more)
        assert replay_module._live_windows(versions, replay_module._survey_for_windows(
            versions, [path], None, True)) is windowed, name
    assert replay_module._live_windows(versions, None) is None
    assert replay_module._survey_for_windows(versions, [path], None, False) is None  # not local text
    plain = load_local_versions(str(tmp_path)).strict()  # no config: no live windows anywhere, nothing surveyed
    assert replay_module._survey_for_windows(plain, [path], None, True) is None


def test_a_replay_of_tests_without_live_windows_leaves_them_out_and_writes_the_same(tmp_path, monkeypatch):
    """Their ~8 stages would start and find nothing (a sixth of a one-message replay): a replay of the demo's three
    tests that have none, after one with cifar's windowed runs, writes the same as one that builds them (an input
    over ``SURVEYED_FOR_WINDOWS_BYTES``, not surveyed)."""
    windowed = []
    run_group = replay_module._run_group
    monkeypatch.setattr(replay_module, "_run_group",
                        lambda options, patterns, group, settings, *rest:
                        windowed.append(settings.windowed()) or run_group(options, patterns, group, settings, *rest))
    others = demo_lines_of_other_tests()
    first = write_lines(tmp_path / "first.jsonl", others[::2] + [m for run in cifar_lines()[:6] for m in run])
    second = write_lines(tmp_path / "second.jsonl", others[1::2])
    for surveyed_bytes in (replay_module.SURVEYED_FOR_WINDOWS_BYTES, 0):
        monkeypatch.setattr(replay_module, "SURVEYED_FOR_WINDOWS_BYTES", surveyed_bytes)
        for path in (first, second):
            assert replay(tmp_path, path, store=f"{surveyed_bytes}.duckdb", alerts=f"{surveyed_bytes}.jsonl") == 0
    assert windowed == [True, False, True, True]
    surveyed, built = (table_contents(tmp_path / f"{size}.duckdb") for size in (replay_module.SURVEYED_FOR_WINDOWS_BYTES, 0))
    assert surveyed == built
    assert built["metric_windows"] and built["alerts"] and len(built["job_history"]) > 6
    assert (tmp_path / f"{replay_module.SURVEYED_FOR_WINDOWS_BYTES}.jsonl").read_text() == (tmp_path / "0.jsonl").read_text()


@pytest.mark.long
def test_groups_of_a_replay_naming_many_stored_tests_read_each_its_own_seed_and_give_the_same_store(
        tmp_path, monkeypatch):
    """A whole seed of 200,000 stored tests is ~1.4 GB: where a replay's lines name more tests than one seed query
    names, each group reads the seed of its own tests as it comes (here: with those limits made tiny), and the
    store and alerts file are those of one group with the whole seed."""
    runs = cifar_lines()
    first, second = messy_input(tmp_path, "first", runs[:8]), messy_input(tmp_path, "second", runs[8:])
    seeds_read = []
    read_seed = DuckDBStore.read_seed
    monkeypatch.setattr(DuckDBStore, "read_seed", lambda store, configs, tests=None:
                        seeds_read.append((os.path.basename(store.path), tests)) or read_seed(store, configs, tests))
    for path in (first, second):
        assert replay(tmp_path, path, store="one.duckdb", alerts="one.jsonl",
                      extra=("--report_dir=", "--replay_group_mib=0", "--replay_group_runs=0")) == 0
        with monkeypatch.context() as limits:
            limits.setattr(replay_module, "SCOPED_SEED_ABOVE_TESTS", 0)
            limits.setattr(replay_module, "MAX_NAMED_TESTS", 1)
            assert replay(tmp_path, path, store="groups.duckdb", alerts="groups.jsonl",
                          extra=("--report_dir=", "--replay_group_mib=0", TWO_RUN_GROUPS)) == 0
        assert table_contents(tmp_path / "groups.duckdb") == table_contents(tmp_path / "one.duckdb")
        assert (tmp_path / "groups.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    grouped = [tests for store, tests in seeds_read if store == "groups.duckdb"]
    assert grouped[0] is None  # the first invocation: an empty store, nothing surveyed for its seed
    by_group = grouped[1:]
    assert len(by_group) >= 2 and all(tests is not None for tests in by_group)  # (a group of lines without a
    assert sum(map(len, by_group)) == len(set().union(*by_group))  # test names none) each test's seed read once
    assert CIFAR in set().union(*by_group)
    assert [tests for store, tests in seeds_read if store == "one.duckdb"] == [None, None]
