"""A replay does not read again what it read into the same store before (``sinks.replayed_files``): the store and
the alerts file are those of a replay that reads every file whole (``--reread_files``), step after step, as logs
grow, are rewritten, gain triage actions, and configs change."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from core.schema import REPLAYED_FILES
from pipeline.replay import run
from sinks.duckdb_store import DuckDBStore
from sinks.replayed_files import ReplayedFiles, last_line_end, prefix_digests
from tests.pipeline.test_replay import CIFAR, REPO, cifar_lines, table_contents
from tests.pipeline.test_replay_groups import TINY_GROUPS, messy_input
from tests.support import T0
from trainguard import wire
from transforms.sources import count_lines, file_lines, lines_in_ranges, survey_lines


def replay_both(tmp_path, input_pattern, config_dir=f"{REPO}/configs", extra=()):
    """The same replay into the store that skips what it read (``skip``) and into one that rereads (``whole``):
    the summary of the first; both stores' rows and alerts files are compared."""
    summaries = {}
    for name, more in (("skip", ()), ("whole", ("--reread_files",))):
        summaries[name] = run([f"--input_files={input_pattern}", f"--config_dir={config_dir}",
                               f"--local_store={tmp_path / name}.duckdb", f"--alerts_file={tmp_path / name}.jsonl",
                               "--no_progress", *extra, *more])
    assert table_contents(tmp_path / "skip.duckdb") == table_contents(tmp_path / "whole.duckdb")
    assert (tmp_path / "skip.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert summaries["whole"].bytes_not_read == 0
    return summaries["skip"]


def split_lines(path):
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def append(path, data: bytes):
    with open(path, "ab") as f:
        f.write(data)


def triage_line(action: str, **fields) -> bytes:
    return wire.encode_triage(CIFAR, wire.Triage(action, T0 + 11.5 * 86400, **fields), f"{action}-{len(fields)}") + b"\n"


@pytest.mark.long
@pytest.mark.parametrize("grouping", ["--replay_group_mib=0", TINY_GROUPS], ids=["one group", "groups"])
def test_a_log_that_grows_is_read_from_where_the_last_replay_stopped_and_gives_a_whole_read_s_rows(
        tmp_path, grouping):
    messy = split_lines(messy_input(tmp_path, "first", cifar_lines()))
    log = tmp_path / "log.jsonl"
    cut = len(messy) // 2
    half_line = messy[cut][: len(messy[cut]) // 2]
    log.write_bytes(b"".join(messy[:cut]) + half_line)  # the writer is in the middle of a line
    first = replay_both(tmp_path, log, extra=(grouping,))
    assert first.bytes_not_read == 0 and first.counters["messages_read"] > 0

    again = replay_both(tmp_path, log, extra=(grouping,))  # only the torn last line is read again
    assert again.bytes_not_read == last_line_end(str(log), os.path.getsize(log)) > 0
    assert again.counters["messages_read"] == 1

    append(log, messy[cut][len(half_line):] + b"".join(messy[cut + 1:]))  # the line completed, the rest written
    for name in ("skip", "whole"):  # a triage action in each store's own file
        append(tmp_path / f"{name}.triage.jsonl", triage_line("mute", until=T0 + 20 * 86400))
    grown = replay_both(tmp_path, log, extra=(grouping,))
    assert grown.bytes_not_read == again.bytes_not_read
    assert 0 < grown.counters["messages_read"] < len(messy)
    assert grown.triage_file

    nothing = replay_both(tmp_path, log, extra=(grouping,))
    assert nothing.files_not_read == 2 and nothing.counters["messages_read"] == 0
    assert nothing.rows_added == dict.fromkeys(nothing.rows_added, 0)
    assert "not read again           2  file(s), and 0 in part:" in nothing.render()

    for name in ("skip", "whole"):  # another action: only it is read
        append(tmp_path / f"{name}.triage.jsonl", triage_line("accept", metric="Accuracy/test_final",
                                                               run=f"{CIFAR}-010"))
    triaged = replay_both(tmp_path, log, extra=(grouping,))
    assert triaged.files_not_read == 1 and triaged.files_read_in_part == 1
    assert triaged.counters["messages_read"] == 1 and triaged.rows_added["triage"] == 1
    assert grown.files_read_in_part == 1 and grown.files_not_read == 0


@pytest.mark.long
def test_a_rewritten_file_a_new_file_and_changed_configs_are_read_whole(tmp_path):
    runs = cifar_lines()
    inputs = tmp_path / "in"
    inputs.mkdir()
    first = messy_input(inputs, "first", runs[:8])
    replay_both(tmp_path, first)
    lines = split_lines(first)
    random.Random(1).shuffle(lines)  # the same lines, rewritten in another order
    with open(first, "wb") as f:
        f.write(b"".join(lines))
    rewritten = replay_both(tmp_path, first)
    assert rewritten.bytes_not_read == 0 and rewritten.counters["messages_read"] > 0

    second = messy_input(inputs, "second", runs[8:])
    both = replay_both(tmp_path, inputs / "*.jsonl")
    assert both.files_not_read == 1 and both.bytes_not_read == os.path.getsize(first)
    assert both.input_files[-1] == second

    configs = tmp_path / "configs"
    shutil.copytree(f"{REPO}/configs", configs)
    changed = replay_both(tmp_path, second, config_dir=configs)  # the same bytes under another name: the same
    assert changed.files_not_read == 1
    config = configs / f"{CIFAR}.json"
    config.write_text(config.read_text().replace('"regression_test_config": {',
                                                 '"regression_test_config": {"rebaseline_after": 7, ', 1))
    changed = replay_both(tmp_path, second, config_dir=configs)
    assert changed.bytes_not_read == 0 and changed.counters["messages_of_stored_runs"] > 0
    after = replay_both(tmp_path, second, config_dir=configs, extra=("--run_grace_seconds=61",))
    assert after.bytes_not_read == 0


def test_the_record_holds_each_file_s_bytes_to_its_last_line_feed_and_only_matching_prefixes_count(tmp_path):
    store = DuckDBStore(str(tmp_path / "store.duckdb"))
    store.ensure_schema()
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"a": 1}\n\n{"b": 2}\r\n{"c"')
    path = str(log)
    assert last_line_end(path, os.path.getsize(path)) == 20 and last_line_end(path, 9) == 9
    assert last_line_end(path, 8) == 0
    with ReplayedFiles.plan(store, [path], "identity") as plan:
        assert plan.reads[path].start == 0 and plan.unread == [path] and plan.spans() == {path: (0, 24)}
        rows = plan.records()
    assert rows == [{"path": path, "identity": "identity", "bytes": 20,
                     "sha256": prefix_digests(path, [20])[20]}]
    store.insert(REPLAYED_FILES, rows)
    with ReplayedFiles.plan(store, [path], "identity") as plan:  # the torn line is still to read
        assert plan.reads[path].start == 20 and plan.spans() == {path: (20, 24)} and plan.skipped_files == 0
    with ReplayedFiles.plan(store, [path], "another identity") as plan:
        assert plan.reads[path].start == 0
    with ReplayedFiles.plan(store, [path], "identity", reread=True) as plan:
        assert plan.reads[path].start == 0 and plan.records() == rows

    append(log, b': 3}\n  \n')  # completed, then a blank line: nothing left to read once recorded
    with ReplayedFiles.plan(store, [path], "identity") as plan:
        assert plan.reads[path].start == 20 and plan.unread == [path]
        store.insert(REPLAYED_FILES, plan.records())
    with ReplayedFiles.plan(store, [path], "identity") as plan:
        assert plan.reads[path].start == 32 and plan.unread == [] and plan.skipped_files == 1

    log.write_bytes(b'{"a": 2}\n\n{"b": 2}\r\n{"c": 3}\n  \n')  # a byte of the prefix changed
    with ReplayedFiles.plan(store, [path], "identity") as plan:
        assert plan.reads[path].start == 0
        append(log, b"{}\n")  # changed while the replay read it: not recorded
        assert plan.records() == []


def test_a_span_is_counted_planned_and_read_as_a_file_of_its_bytes_alone(tmp_path):
    lines = split_lines(messy_input(tmp_path, "first", cifar_lines()[:3]))
    cut = len(lines) // 3
    prefix, rest = b"".join(lines[:cut]), b"".join(lines[cut:])
    whole, alone = tmp_path / "whole.jsonl", tmp_path / "alone.jsonl"
    whole.write_bytes(prefix + rest)
    alone.write_bytes(rest)
    spans = {str(whole): (len(prefix), len(prefix) + len(rest))}
    assert count_lines([str(whole)], spans) == count_lines([str(alone)]) < count_lines([str(whole)])
    surveys = survey_lines([str(whole)], spans), survey_lines([str(alone)])
    assert surveys[0].runs == surveys[1].runs > 0 and surveys[0].tests == surveys[1].tests
    shifted = [{path: [offset - len(prefix) for offset in ranges] for path, ranges in group.ranges.items()}
               for group in surveys[0].groups(3)]
    assert shifted == [{str(whole): list(group.ranges[str(alone)])} for group in surveys[1].groups(3)]
    with open(whole, "rb") as f:
        read = [(start - len(prefix), line) for start, line in lines_in_ranges(f, spans[str(whole)])]
    with open(alone, "rb") as f:
        assert read == list(file_lines(f))
