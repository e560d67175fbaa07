"""The documented commands run: every block marked runnable in the README and docs/, as written.

A block is marked by the line ``<!-- runnable: tests/test_docs.py runs this block -->`` right before its
```sh fence. Its commands run in order, with bash, in a scratch directory where the demo replay has run
(the store and alerts file a newcomer has after the README's first command) and where ``data/``, ``configs/``
and ``notifier/`` are the repository's, with this Python's console scripts first on the PATH. Commands that
need the cloud are documented in blocks of their own, unmarked; their dry-run and help forms are tested
beside their tools (tests/deploy, tests/pipeline/test_command_line.py).
"""

import glob
import os
import shutil

import pytest

from pipeline.main import main as pipeline_main
from tests.support import REPO_ROOT, run_shell_line

MARK = "<!-- runnable: tests/test_docs.py runs this block -->"
DOCS = [os.path.join(REPO_ROOT, "README.md"), *sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))]


def commands_of(block: str):
    """The commands of a shell block: continuation lines joined, blank lines left out."""
    commands, current = [], ""
    for line in block.splitlines():
        current += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


def runnable_blocks():
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, part in enumerate(text.split("\n" + MARK + "\n")[1:], start=1):  # the mark on a line of its own
            body = part.lstrip("\n")
            assert body.startswith("```sh\n"), f"{path}: runnable block {number} is not a ```sh block"
            block = body[len("```sh\n"):body.index("\n```", len("```sh\n") - 1) + 1]
            yield pytest.param(commands_of(block), id=f"{os.path.relpath(path, REPO_ROOT)}#{number}")


@pytest.fixture(scope="module")
def demo_replay(tmp_path_factory):
    where = tmp_path_factory.mktemp("demo")
    cwd = os.getcwd()
    try:
        os.chdir(where)
        assert pipeline_main(["--report_dir="]) == 0
    finally:
        os.chdir(cwd)
    return where


@pytest.fixture
def scratch(demo_replay, tmp_path):
    for name in ("trainguard.duckdb", "alerts.jsonl"):
        shutil.copy(demo_replay / name, tmp_path / name)
    for name in ("data", "configs", "notifier"):
        os.symlink(os.path.join(REPO_ROOT, name), tmp_path / name)
    return tmp_path


def test_the_docs_mark_blocks_to_run():
    assert len(list(runnable_blocks())) >= 2


@pytest.mark.parametrize("commands", list(runnable_blocks()))
def test_a_documented_block_runs_as_written(commands, scratch):
    for command in commands:
        done = run_shell_line(command, str(scratch))
        assert done.returncode == 0, f"{command!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
