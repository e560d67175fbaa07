"""The ``bqemulator`` BigQuery emulator in a child process, for tests and benchmarks.

:class:`BigQueryEmulator` starts ``python -m tests.servers.bigquery`` (this
module), which runs bqemulator's REST + gRPC server on free loopback ports with
an in-memory DuckDB database and prints its REST URL once it accepts requests.
The unmodified ``google-cloud-bigquery`` client and Beam's ``WriteToBigQuery``
talk to it through that URL (``api_endpoint``), with anonymous credentials::

    with BigQueryEmulator() as emulator:
        client = emulator.client()
        client.create_dataset("d")

Why a child process rather than bqemulator's own in-process pytest plugin: the
emulator reconfigures the root logger (``logging.basicConfig(force=True)``) and
structlog when it starts, its import prints to stdout, and the plugin module
imports ``testcontainers``; in a child process none of that reaches the test
process, and the emulator's request handling does not compete with the Beam
runner for the test process's GIL.

Deviation from a stock bqemulator: DuckDB's ``spatial`` extension is not
loaded (the emulator downloads it at start-up, which fails offline). Only
GEOGRAPHY functions need it; trainguard's tables have no GEOGRAPHY column.
The child exits when its stdin closes, so it never outlives the test process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import IO, Optional

from tests.support import REPO_ROOT as _REPO_ROOT

DEFAULT_PROJECT = "test-project"
_READY = "bqemulator listening on "


class BigQueryEmulator:
    """A bqemulator child process; ``endpoint`` is its REST URL (``http://127.0.0.1:PORT``).

    Args:
        project: Default project id of the emulator and of :meth:`client`.
        log: File the child's stdout/stderr (bqemulator's JSON logs) go to;
            default: discarded.
        start_timeout: Seconds to wait for the child to report that it listens.
    """

    def __init__(self, project: str = DEFAULT_PROJECT, log: Optional[IO] = None, start_timeout: float = 120.0):
        self.project = project
        self.endpoint: Optional[str] = None
        self._log = log
        self._start_timeout = start_timeout
        self._process: Optional[subprocess.Popen] = None

    def start(self) -> BigQueryEmulator:
        if self._process is not None:
            raise RuntimeError("A BigQueryEmulator can only be started once")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO_ROOT, os.environ.get("PYTHONPATH")])))
        self._process = subprocess.Popen(
            [sys.executable, "-u", "-m", "tests.servers.bigquery", "--project", self.project],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log or subprocess.DEVNULL,
            env=env, cwd=_REPO_ROOT, text=True)
        ready = _first_line_within(self._process.stdout, self._start_timeout)
        if not ready.startswith(_READY):
            self.stop()
            raise RuntimeError(f"bqemulator did not start (exit code {self._process.returncode}): {ready!r}")
        self.endpoint = ready[len(_READY):].strip()
        return self

    def stop(self) -> None:
        """Stops the child (idempotent): closing its stdin asks it to exit, then it is killed."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        try:
            process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            process.stdout.close()

    def __enter__(self) -> BigQueryEmulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def client(self):
        """A ``google.cloud.bigquery.Client`` for the emulator (anonymous credentials)."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        return bigquery.Client(project=self.project, credentials=AnonymousCredentials(),
                               client_options=ClientOptions(api_endpoint=self.endpoint))


def _first_line_within(stream: IO, timeout: float) -> str:
    """The first line of ``stream``, or "" after ``timeout`` seconds or at EOF."""
    lines = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


# --------------------------------------------------------------------------
# The child process
# --------------------------------------------------------------------------


async def _serve(project: str, ready: IO) -> None:
    from bqemulator.config import PersistenceMode, Settings
    from bqemulator.server import EmulatorServer
    from bqemulator.storage import engine

    engine.DuckDBEngine._load_spatial = lambda self: None  # offline: no GEOGRAPHY support (not needed)
    settings = Settings(persistence_mode=PersistenceMode.EPHEMERAL, default_project_id=project,
                        rest_host="127.0.0.1", rest_port=0, grpc_host="127.0.0.1", grpc_port=0,
                        enable_format_extensions=False, metrics_enabled=False, log_level="warning")
    server = EmulatorServer(settings)
    await server.start()
    ready.write(f"{_READY}{server.rest_url}\n")
    ready.flush()
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    finally:
        await server.stop()


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Run bqemulator until stdin closes (see BigQueryEmulator).")
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    args = parser.parse_args(argv)
    # bqemulator writes logs to stdout; only the ready line goes to the parent's pipe, the rest to stderr.
    ready = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    asyncio.run(_serve(args.project, ready))


if __name__ == "__main__":
    main()
