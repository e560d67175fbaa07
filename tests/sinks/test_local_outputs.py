"""A replay's outputs are checked before any work, and one process at a time writes a store."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import duckdb
import pytest

from sinks.local_outputs import LocalOutputs, OutputUnusable, check_outputs
from sinks.store_lock import StoreBusy, StoreLock
from sinks.stores import open_duckdb


def a_store(path) -> str:
    duckdb.connect(str(path)).close()
    return str(path)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "is a directory, not a DuckDB file"),
    (lambda p: p.write_bytes(b"name,value\na,1\n" * 10), "is not a DuckDB file"),
    (lambda p: p.write_bytes(b""), "is not a DuckDB file"),
    (lambda p: (a_store(p), p.chmod(0o444)), "is read-only"),
])
def test_a_store_that_cannot_be_written_is_one_line(tmp_path, make, message):
    store = tmp_path / "store.duckdb"
    make(store)
    with pytest.raises(OutputUnusable, match=message) as error:
        check_outputs(str(store), str(tmp_path / "alerts.jsonl"))
    assert "\n" not in str(error.value) and str(store) in str(error.value)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "is a directory, not a file"),
    (lambda p: (p.write_text(""), p.chmod(0o444)), "is read-only"),
    (lambda p: p.parent.joinpath("file").write_text("") or None, "is a file, not a directory"),
])
def test_an_alerts_file_that_cannot_be_written_is_one_line(tmp_path, make, message):
    alerts = tmp_path / "alerts.jsonl"
    make(alerts)
    path = tmp_path / "file" / "alerts.jsonl" if "not a directory" in message else alerts
    with pytest.raises(OutputUnusable, match=message):
        check_outputs(str(tmp_path / "store.duckdb"), str(path))


def test_outputs_that_can_be_made_pass_and_nothing_is_made_by_the_check(tmp_path):
    check_outputs(str(tmp_path / "new" / "store.duckdb"), str(tmp_path / "new" / "alerts.jsonl"))
    assert not (tmp_path / "new").exists()


def test_the_store_and_the_alerts_file_must_differ(tmp_path):
    with pytest.raises(OutputUnusable, match="both name"):
        check_outputs(str(tmp_path / "x"), str(tmp_path / "x"))


HOLD = """
import sys, time
from sinks.store_lock import StoreLock
lock = StoreLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def holder(store: str) -> subprocess.Popen:
    """Another process that takes the store's write lock and keeps it."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, store], stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_writer_stops_with_one_line_naming_the_holder_and_readers_go_on(tmp_path):
    store = a_store(tmp_path / "store.duckdb")
    process = holder(store)
    try:
        with pytest.raises(StoreBusy, match=rf"is being written by pid {process.pid} on .* since .*\(-c "):
            StoreLock(store).acquire()
        with pytest.raises(OutputUnusable, match=f"pid {process.pid}"):
            LocalOutputs(store, str(tmp_path / "alerts.jsonl")).__enter__()
        reader = open_duckdb(store)  # the report and trainguard-triage list take no lock
        assert reader.query("SELECT 1") == [(1,)]
        reader.close()
    finally:
        process.kill()
        process.wait()
    with StoreLock(store):  # the OS released the dead holder's lock
        pass


def test_the_lock_is_taken_again_after_its_release_and_the_file_says_who_held_it(tmp_path):
    store = a_store(tmp_path / "store.duckdb")
    with StoreLock(store) as lock:
        assert f'"pid": {os.getpid()}' in pathlib.Path(lock.path).read_text()
    with StoreLock(store):
        pass


def test_staging_directories_of_a_killed_run_of_this_store_are_removed_and_others_are_not(tmp_path):
    store = tmp_path / "store.duckdb"
    stale = tmp_path / ".trainguard-staging-store.duckdb-abc123"
    other = tmp_path / ".trainguard-staging-other.duckdb-abc123"  # another store's, maybe running
    for directory in (stale, other):
        (directory / "alerts").mkdir(parents=True)
    with LocalOutputs(str(store), str(tmp_path / "alerts.jsonl")) as outputs:
        assert not stale.exists() and other.exists()
        assert outputs.notes == ["removed 1 staging directory left by an interrupted run"]
        ours = outputs.new_staging_dir()
        assert os.path.basename(ours).startswith(".trainguard-staging-store.duckdb-")
    assert not os.path.exists(ours)


def test_a_writer_waits_for_a_reader_holding_the_duckdb_file_briefly(tmp_path):
    store = a_store(tmp_path / "store.duckdb")
    reader = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], "
                               "read_only=True); print('open', flush=True); time.sleep(1.5)", store],
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "open"
    started = time.monotonic()
    with LocalOutputs(store, str(tmp_path / "alerts.jsonl")) as outputs:
        assert outputs.store.counts()["alerts"] == 0
    assert time.monotonic() - started < 30
    reader.wait()
