"""Every tool's network calls have a deadline: against an endpoint that refuses and one that accepts and never
answers, each fails within its documented bound with one line and exit 1, not a hang or a traceback.

The bounds are set small here (2 s) through each tool's own option; the wall time allowed is generous, so a
loaded machine does not fail the test, yet far below the client libraries' own defaults (10 minutes of retries
for BigQuery, a minute per Pub/Sub message).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.support import REPO_ROOT
from tests.trainguard.support import SilentServer

BOUND = 2  # seconds: each tool's option
ALLOWED = 60  # seconds of wall time for the whole command, start-up included


def refused() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(params=["refused", "silent"])
def endpoint(request):
    if request.param == "refused":
        yield refused()
        return
    server = SilentServer()
    yield server.host
    server.close()


def run_tool(argv, tmp_path, **env):
    started = time.monotonic()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=ALLOWED,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, "no_proxy": "127.0.0.1", **env})
    return done, time.monotonic() - started


def one_line_failure(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_the_streaming_job_start_up(endpoint, tmp_path):
    done, _ = run_tool(["-m", "pipeline", "--streaming", "--input_subscription=projects/my-project/subscriptions/s",
                        "--bigquery_project=p", "--bigquery_dataset=d", f"--bigquery_endpoint=http://{endpoint}",
                        f"--seed_timeout_seconds={BOUND}", f"--config_dir={REPO_ROOT}/configs"], tmp_path)
    assert "cannot reach the endpoint" in one_line_failure(done)


def test_trainguard_triage_list(endpoint, tmp_path):
    done, _ = run_tool(["-m", "pipeline.triage", "list", "--bigquery_project=p", "--bigquery_dataset=d",
                        f"--bigquery_endpoint=http://{endpoint}", f"--bigquery_timeout_seconds={BOUND}"], tmp_path)
    assert "cannot reach the endpoint" in one_line_failure(done)


def test_the_report(endpoint, tmp_path):
    done, _ = run_tool(["-m", "report", "--bigquery_project=p", "--bigquery_dataset=d",
                        f"--bigquery_endpoint=http://{endpoint}", f"--bigquery_timeout_seconds={BOUND}",
                        f"--out_dir={tmp_path / 'report'}"], tmp_path)
    assert "cannot reach the endpoint" in one_line_failure(done)


def test_publish_demo(endpoint, tmp_path):
    done, _ = run_tool([os.path.join(REPO_ROOT, "scripts", "publish_demo.py"), "--topic=projects/p/topics/t",
                        f"--timeout_seconds={BOUND}"], tmp_path, PUBSUB_EMULATOR_HOST=endpoint)
    assert "is Pub/Sub (or PUBSUB_EMULATOR_HOST) reachable?" in one_line_failure(done)
