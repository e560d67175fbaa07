"""The replay's progress line: its counts, its format, when it shows, and that it changes no row."""

import io
import re
import sys
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipeline.main import main
from pipeline.replay import PROGRESS_INTERVAL_ENV, ProgressPrinter, ProgressTiming, fit, format_progress
from pipeline.runners import local_batch_runner
from tests.pipeline.test_replay import table_contents
from tests.support import REPO_ROOT
from trainguard import wire
from transforms import progress
from transforms.parse import ParseMessages
from transforms.progress import LocalCounter, ReadCounts
from transforms.sources import ReadReplayFiles

DEMO = f"{REPO_ROOT}/data/demo/*.jsonl"
LINE = re.compile(r"trainguard: files (\d+)/(\d+), messages ([\d,]+), points ([\d,]+) \(([\d,]+)/s\), (\d+:\d\d:\d\d)")


def replay(tmp_path, *extra, store="store.duckdb"):
    return main([f"--input_files={DEMO}", f"--config_dir={REPO_ROOT}/configs", f"--local_store={tmp_path / store}",
                 f"--alerts_file={tmp_path / (store + '.alerts.jsonl')}", "--report_dir=", "--triage_file=", *extra])


def progress_lines(text):
    """The progress lines of stderr's text (those rewritten in place too, without their padding), matched."""
    return [LINE.fullmatch(line.rstrip(" ")) for line in re.split(r"[\r\n]", text) if line.startswith("trainguard: files")]


def summary_counts(summary):
    """(files replayed, messages read) of a replay's summary."""
    return (int(re.search(r"replayed (\d+) file", summary).group(1)),
            int(re.search(r"messages read +(\d+)", summary).group(1)))


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """Progress lines on a terminal are cut to its width: a wide one here, whatever runs the tests."""
    monkeypatch.setenv("COLUMNS", "200")


# -- the line --

def test_the_line_names_files_messages_points_rate_and_elapsed_time():
    assert format_progress(ReadCounts(3, 45120, 9876543), 12, 3723.9, 812345.4) == (
        "trainguard: files 3/12, messages 45,120, points 9,876,543 (812,345/s), 1:02:03")
    assert format_progress(ReadCounts(), 1, 0.4, 0.0) == "trainguard: files 0/1, messages 0, points 0 (0/s), 0:00:00"


def test_a_line_too_wide_for_the_terminal_loses_whole_parts_from_its_end():
    line = "trainguard: files 3/12, messages 45,120, points 9,876,543 (812,345/s), 1:02:03"
    assert fit(line, 200) == fit(line, len(line)) == line
    assert fit(line, len(line) - 1) == "trainguard: files 3/12, messages 45,120, points 9,876,543 (812,345/s)"
    assert fit(line, 40) == "trainguard: files 3/12, messages 45,120"
    assert fit(line, 10) == "trainguard"


# -- the counter --

def test_a_counter_counts_each_file_once_and_every_message_from_any_thread():
    counter = LocalCounter()

    def read(name):
        for _ in range(1000):
            counter.read_file(name)
            counter.read_message(3)

    threads = [threading.Thread(target=read, args=(f"f{i % 2}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.snapshot() == ReadCounts(files=2, messages=4000, points=12000)


def test_two_replays_count_apart_and_an_unknown_id_finds_no_counter():
    first, second = progress.register(), progress.register()
    try:
        assert first != second
        progress.counter_for(first).read_message(5)
        assert progress.counter_for(first).snapshot() == ReadCounts(0, 1, 5)
        assert progress.counter_for(second).snapshot() == ReadCounts()
    finally:
        progress.unregister(first)
        progress.unregister(second)
    assert progress.counter_for(first) is None and progress.counter_for(None) is None


def test_the_reader_counts_files_and_the_parser_messages_and_valid_points(tmp_path):
    good = wire.encode_message("t", "r", [wire.point_dict("loss", 1.0, 1763596800.0, step=s) for s in range(3)])
    bad_point = wire.encode_message("t", "r", [wire.point_dict("loss", 1.0, 1763596800.0, step=9),
                                               {"tag": "loss", "value": "x", "time": 1763596800.0}])
    (tmp_path / "a.jsonl").write_bytes(good + b"\n\n" + bad_point + b"\n")
    (tmp_path / "b.jsonl").write_bytes(b"not json\n")
    (tmp_path / "blank.jsonl").write_bytes(b"\n  \n")
    counter = LocalCounter()
    progress_id = progress.register(counter)
    try:
        with beam.Pipeline(runner=local_batch_runner()) as p:
            messages, _, bad = (p | ReadReplayFiles(str(tmp_path / "*.jsonl"), progress_id)
                                | ParseMessages(progress_id))
            assert_that(messages | "Count" >> beam.combiners.Count.Globally(), equal_to([2]))
            assert_that(bad | "CountBad" >> beam.combiners.Count.Globally(), equal_to([2]), label="Bad")
    finally:
        progress.unregister(progress_id)
    assert counter.snapshot() == ReadCounts(files=3, messages=3, points=4)


# -- the printer, on its own --

class Stream(io.StringIO):
    """A stderr that says whether it is a terminal and tells when something is written."""

    def __init__(self, tty):
        super().__init__()
        self.tty = tty
        self.written = threading.Event()

    def isatty(self):
        return self.tty

    def write(self, text):
        self.written.set()
        return super().write(text)


class Counter(LocalCounter):
    """A LocalCounter that tells when it has been read ``reads`` times."""

    def __init__(self, reads):
        super().__init__()
        self.reads, self.read_enough = reads, threading.Event()

    def snapshot(self):
        self.reads -= 1
        if self.reads <= 0:
            self.read_enough.set()
        return super().snapshot()


FAST = ProgressTiming(quiet=0.0, tty_every=0.001, log_every=0.001, unavailable_after=3600.0)


def printed(tty, counter, timing=FAST, wait_for="write"):
    stream = Stream(tty)
    printer = ProgressPrinter(counter, 2, stream, timing, started=0.0, clock=lambda: 5.0)
    printer.start()
    try:
        if wait_for == "write":
            assert stream.written.wait(60)
        elif wait_for == "reads":
            assert counter.read_enough.wait(60)
    finally:
        printer.stop()
    return stream.getvalue()


def test_on_a_terminal_the_line_is_rewritten_in_place_and_cleared_at_the_end():
    counter = LocalCounter()
    counter.read_file("a")
    counter.read_message(7)
    text = printed(True, counter)
    assert text.startswith("\rtrainguard: files 1/2, messages 1, points 7 (1/s), 0:00:05")
    assert "\n" not in text
    width = len(progress_lines(text)[0].group(0))
    assert text.endswith("\r" + " " * width + "\r")


def test_off_a_terminal_lines_follow_each_other_and_the_last_has_the_final_counts():
    counter = LocalCounter()
    counter.read_message(7)
    stream = Stream(False)
    printer = ProgressPrinter(counter, 2, stream, FAST, started=0.0, clock=lambda: 5.0).start()
    assert stream.written.wait(60)
    counter.read_file("a")
    counter.read_message(1)
    printer.stop()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and all(LINE.fullmatch(line) for line in lines)
    assert lines[-1].startswith("trainguard: files 1/2, messages 2, points 8 (")


@pytest.mark.parametrize("tty", [True, False])
def test_nothing_shows_in_the_quiet_start(tty):
    counter = Counter(reads=3)
    counter.read_message(7)
    stream = Stream(tty)
    printer = ProgressPrinter(counter, 2, stream, ProgressTiming(quiet=3600.0, tty_every=0.001, log_every=0.001),
                              started=time.monotonic())
    printer.start()
    assert counter.read_enough.wait(60)
    printer.stop()
    assert stream.getvalue() == ""


@pytest.mark.parametrize("tty", [True, False])
def test_a_counter_nothing_counts_into_is_said_once_to_be_unavailable(tty):
    timing = ProgressTiming(quiet=0.0, tty_every=0.001, log_every=0.001, unavailable_after=0.0)
    text = printed(tty, Counter(reads=20), timing, wait_for="reads")
    assert text == "trainguard: progress unavailable on this runner\n"


# -- the replay --

def test_a_forced_progress_shows_lines_whose_last_counts_are_the_summarys(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0.01")
    assert replay(tmp_path, "--progress") == 0
    out, err = capsys.readouterr()
    lines = progress_lines(err)
    assert lines and all(lines) and "\r" not in err
    files, messages = summary_counts(out)
    assert {int(line.group(2)) for line in lines} == {files} and files == 4
    last = lines[-1]
    assert int(last.group(1)) == files and int(last.group(3).replace(",", "")) == messages == 180
    assert int(last.group(4).replace(",", "")) > 0


def test_without_a_terminal_or_progress_no_line_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0.01")
    assert replay(tmp_path) == 0
    assert "trainguard: files" not in capsys.readouterr().err
    assert replay(tmp_path, "--no-progress", store="other.duckdb") == 0  # the dashed spelling is accepted too
    assert "trainguard: files" not in capsys.readouterr().err


def test_on_a_terminal_progress_is_on_and_cleared_before_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0.01")
    terminal = Stream(True)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert replay(tmp_path) == 0
    text = terminal.getvalue()
    lines = progress_lines(text)
    assert lines and all(lines) and text.startswith("\r") and "\n" not in text
    assert re.search(r"\r +\r$", text)
    assert "replayed 4 file(s)" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stderr", Stream(True))
    assert replay(tmp_path, "--no_progress", store="other.duckdb") == 0
    assert sys.stderr.getvalue() == ""


def test_progress_changes_no_row(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0.01")
    assert replay(tmp_path, "--progress", store="with.duckdb") == 0
    assert replay(tmp_path, "--no_progress", store="without.duckdb") == 0
    assert table_contents(tmp_path / "with.duckdb") == table_contents(tmp_path / "without.duckdb")
    assert sorted((tmp_path / "with.duckdb.alerts.jsonl").read_text().splitlines()) == \
        sorted((tmp_path / "without.duckdb.alerts.jsonl").read_text().splitlines())
