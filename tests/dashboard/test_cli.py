"""``trainguard-dashboard``'s command line, and the store it reads: read-only, never holding a replay up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.request

from dashboard.cli import DEFAULT_HOST, DEFAULT_PORT, main
from tests.dashboard.conftest import client_of
from tests.dashboard.support import served
from tests.support import REPO_ROOT


def test_help_shows_the_defaults(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert f"default: {DEFAULT_HOST}" in out and f"default: {DEFAULT_PORT}" in out
    assert DEFAULT_HOST == "127.0.0.1"


def test_a_missing_store_is_one_line_and_exit_1(tmp_path, capsys):
    assert main([f"--local_store={tmp_path / 'none.duckdb'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainguard-dashboard: error: no store at")


def test_an_unknown_option_exits_2_naming_it(capsys):
    try:
        main(["--prot=9"])
    except SystemExit as e:
        assert e.code == 2
    assert "unknown option --prot (did you mean --port?)" in capsys.readouterr().err


def test_python_m_dashboard_serves_on_loopback(demo_store):
    with served(f"--local_store={demo_store}") as base:
        assert base.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{base}/alerts", timeout=30) as response:
            page = response.read().decode()
        assert response.status == 200 and "pt-cifar-tpu-v3-8" in page
        with urllib.request.urlopen(f"{base}/static/uPlot.iife.min.js", timeout=30) as response:
            assert response.status == 200


HOLD = ("import sys, time; from sinks.duckdb_store import connect_waiting; from sinks.store_lock import StoreLock; "
        "lock = StoreLock(sys.argv[1]).acquire(); c = connect_waiting(sys.argv[1]); "
        "print('holding', flush=True); time.sleep(60)")
# A writer as a replay is one: it takes the store's write lock, then opens the file, waiting for readers within its
# patience (30 s).
WRITE = ("import sys; from sinks.duckdb_store import connect_waiting; from sinks.store_lock import StoreLock; "
         "lock = StoreLock(sys.argv[1]).acquire(); "
         "c = connect_waiting(sys.argv[1]); c.execute('CHECKPOINT'); c.close(); print('wrote')")


def test_the_store_is_read_only_and_a_writer_is_never_held_up(demo_store):
    client = client_of(f"--local_store={demo_store}")
    before = os.path.getmtime(demo_store), os.path.getsize(demo_store)
    assert client.get("/alerts").status_code == 200
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    # Right after a request, a writer (another process, as a replay is) gets the file.
    writer = subprocess.run([sys.executable, "-c", WRITE, str(demo_store)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert writer.returncode == 0 and "wrote" in writer.stdout, writer.stderr
    assert (os.path.getmtime(demo_store), os.path.getsize(demo_store)) >= before
    # While a writer holds the file, the dashboard answers 503 and asks to retry; afterwards it reads again.
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(demo_store)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        busy = client.get("/alerts")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "2"
        assert "is being written" in busy.text
    finally:
        holder.kill()
        holder.wait()
    assert client.get("/alerts").status_code == 200


def test_a_writer_gets_the_store_while_the_dashboard_is_busy(demo_store):
    """Requests without a pause share one connection which, while a replay runs, is let go of every second."""
    client = client_of(f"--local_store={demo_store}")
    stop = threading.Event()
    statuses = []

    def hammer():
        while not stop.is_set():
            statuses.append(client.get("/alerts").status_code)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        env = {**os.environ, "PYTHONPATH": REPO_ROOT}
        writer = subprocess.run([sys.executable, "-c", WRITE, str(demo_store)], env=env, capture_output=True,
                                text=True, timeout=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert writer.returncode == 0 and "wrote" in writer.stdout, writer.stderr
    assert statuses and set(statuses) <= {200, 503}


def test_the_dashboard_never_writes_the_store(demo_store):
    client = client_of(f"--local_store={demo_store}")
    before = demo_store.read_bytes()
    for path in ["/alerts", "/tests", "/dead-letters", "/test?name=pt-cifar-tpu-v3-8"]:
        assert client.get(path).status_code == 200
    assert demo_store.read_bytes() == before


def test_unknown_routes_are_404(demo_store):
    client = client_of(f"--local_store={demo_store}")
    assert client.get("/admin").status_code == 404
    assert client.post("/alerts").status_code == 405


def test_a_running_replay_is_seen_without_taking_its_lock(tmp_path):
    from dashboard.store import writer_running
    from sinks.store_lock import StoreLock

    store = str(tmp_path / "s.duckdb")
    assert not writer_running(store)  # no lock file yet
    with StoreLock(store):
        assert writer_running(store)
        with StoreLock(str(tmp_path / "other.duckdb")):
            assert writer_running(store)
    assert not writer_running(store)
    with StoreLock(store):  # the check never held the lock: a replay still takes it at once
        pass


def test_workers_serve_the_same_pages(demo_store):
    with served(f"--local_store={demo_store}", "--workers=2") as base:
        for _ in range(4):
            with urllib.request.urlopen(f"{base}/alerts", timeout=30) as response:
                assert response.status == 200 and "pt-cifar-tpu-v3-8" in response.read().decode()
