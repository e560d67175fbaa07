"""The dashboard served as its users run it: ``python -m dashboard`` in a process of its own (no tests here)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator, Tuple

from tests.support import REPO_ROOT

START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(*argv: str) -> Iterator[str]:
    """``python -m dashboard ARGV --port=<free>`` until the block ends (stopped with Ctrl-C); yields its base URL."""
    with served_process(*argv) as (base, _):
        yield base


@contextlib.contextmanager
def served_process(*argv: str) -> Iterator[Tuple[str, subprocess.Popen]]:
    """:func:`served`, yielding the process too (its pid: the benchmark reads the CPU time it used)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    process = subprocess.Popen([sys.executable, "-m", "dashboard", *argv, f"--port={port}"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the dashboard exited {process.returncode}: {process.stderr.read()}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base, process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
