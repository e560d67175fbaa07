"""Replay files: every line a message with its exact bytes, and where it lies, so that summaries need not carry it.

A summary of a line of a local, uncompressed file crosses the shuffles without its payload (``payload_span``
says where to read it again); a dead letter made downstream still holds the line's exact bytes.
"""

from __future__ import annotations

import gzip
import json
import os

import apache_beam as beam
import duckdb
from apache_beam.testing.util import assert_that, equal_to

import core.runs
from core.parse import FileSpan
from pipeline.replay import run
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, finished, raw, started
from tests.transforms.test_containment import poisoned
from transforms.parse import ParseMessages, SummarizeMessages
from transforms.sources import ReadReplayFiles, file_source


def lines_of_a_run(run: str = "run-1") -> list:
    """A small run's messages as replay lines."""
    return [raw("cifar", run, f"{run}/start", events=[started(T0)]).payload,
            raw("cifar", run, f"{run}/points", points=[("loss", 0.5, 10, T0 + 1), ("loss", 0.4, 20, T0 + 2)]).payload,
            raw("cifar", run, f"{run}/end", events=[finished(T0 + 3)]).payload]


def read(pattern: str, check) -> None:
    """``check(messages)`` in ``assert_that``, on the messages read, in the order of their file and offset."""
    with batch_pipeline() as p:
        assert_that(p | ReadReplayFiles(pattern), lambda messages: check(sorted(
            messages, key=lambda m: (m.source, m.span.offset if m.span else 0, m.payload))))


def test_each_line_is_a_message_with_its_exact_bytes_and_where_it_lies(tmp_path):
    first, second, third = lines_of_a_run()
    not_utf8 = b'{"id": "caf\xe9"}'
    path = tmp_path / "a.jsonl"
    path.write_bytes(first + b"\r\n" + b"\n" + b"  \t\r\n" + second + b"\n" + not_utf8 + b"\n" + third)  # no last \n
    source, real_path = file_source(str(path)), os.path.realpath(path)

    def check(messages):
        assert [m.payload for m in messages] == [first, second, not_utf8, third]
        assert {m.source for m in messages} == {source}
        assert [m.span.read() for m in messages] == [m.payload for m in messages]
        assert {m.span.path for m in messages} == {real_path}
    read(str(tmp_path / "*.jsonl"), check)


def test_a_compressed_file_gives_the_same_messages_which_carry_their_payload(tmp_path):
    lines = lines_of_a_run()
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as f:
        f.write(b"\n".join(lines) + b"\n")

    def check(messages):
        assert sorted(m.payload for m in messages) == sorted(lines)
        assert all(m.span is None for m in messages)
    read(str(tmp_path / "*.jsonl.gz"), check)


def test_summaries_of_file_lines_carry_where_the_payload_lies_not_the_payload(tmp_path):
    lines = lines_of_a_run()
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines))

    def check(summaries):
        assert len(summaries) == 3
        assert all(s.payload == b"" for s in summaries)
        assert sorted(s.raw_payload() for s in summaries) == sorted(lines)
    with batch_pipeline() as p:
        messages, _, _ = p | ReadReplayFiles(str(tmp_path / "a.jsonl")) | ParseMessages()
        summaries, _ = messages | SummarizeMessages(configs(cifar={}))
        assert_that(summaries, check)


def test_a_dead_letter_made_after_the_shuffle_holds_the_line_read_again(tmp_path, monkeypatch):
    lines = lines_of_a_run()
    (tmp_path / "in.jsonl").write_bytes(b"\r\n".join(lines) + b"\r\n")
    monkeypatch.setattr(core.runs.RunAccumulator, "add", poisoned(
        core.runs.RunAccumulator.add, lambda self, summary: summary.id == "run-1/points"))
    summary = run([f"--input_files={tmp_path / 'in.jsonl'}", f"--local_store={tmp_path / 's.duckdb'}",
                   f"--alerts_file={tmp_path / 'alerts.jsonl'}"])
    rows = duckdb.connect(summary.store, read_only=True).sql("SELECT reason, payload FROM dead_letter").fetchall()
    ((reason, payload),) = rows
    assert reason.startswith("error in assemble run: ")
    assert payload.encode() == lines[1]
    assert json.loads(payload)["id"] == "run-1/points"


def test_a_span_whose_file_changed_says_so_instead_of_giving_other_bytes(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"0123456789")
    assert FileSpan(str(path), 2, 5).read() == b"23456"
    path.write_bytes(b"0123")
    assert b"could not be read again: the file now ends at byte 4" in FileSpan(str(path), 2, 5).read()
    path.unlink()
    assert b"could not be read again: FileNotFoundError" in FileSpan(str(path), 2, 5).read()


def test_the_read_messages_flow_through_beam_on_any_in_process_runner(tmp_path):
    lines = lines_of_a_run()
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines))
    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        assert_that(p | ReadReplayFiles(str(tmp_path / "a.jsonl")) | beam.Map(lambda m: m.payload), equal_to(lines))


def test_the_store_and_the_alerts_file_may_be_in_directories_that_do_not_exist_yet(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines_of_a_run()))
    summary = run([f"--input_files={tmp_path / 'in.jsonl'}", f"--local_store={tmp_path / 'a' / 'b' / 's.duckdb'}",
                   f"--alerts_file={tmp_path / 'c' / 'alerts.jsonl'}"])
    assert summary.rows_added["job_history"] == 1 and os.path.isfile(tmp_path / "a" / "b" / "s.duckdb")
