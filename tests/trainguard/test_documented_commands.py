"""docs/trainer.md's "## Tests and benchmark" block, run here rather than as written by tests/test_docs.py.

Its first command runs tests/trainguard, which the suite (this file's) already runs in full: here it runs with
``--collect-only``, so that its path and options are checked and every test it names is collected, without
running the trainer's tests a second time (about 80 s of the suite). The benchmark's smoke run runs as written.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.support import REPO_ROOT, readme_block, run_shell_line


@pytest.mark.long
def test_the_trainer_docs_test_and_benchmark_commands_run():
    tests, bench = readme_block("## Tests and benchmark", "docs/trainer.md")
    assert tests.startswith(".venv/bin/python -m pytest tests/trainguard -q") and "bench_publisher.py --quick" in bench
    python = sys.executable
    collected = run_shell_line(tests.split("#")[0].replace(".venv/bin/python", python) + " --collect-only", REPO_ROOT)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "tests collected" in collected.stdout and "test_install.py" in collected.stdout
    smoke = run_shell_line(bench.split("#")[0].replace(".venv/bin/python", python), REPO_ROOT)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert os.path.exists(os.path.join(REPO_ROOT, "bench", "out", "publisher.json"))
