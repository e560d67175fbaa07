"""Lint and types are part of the suite: ``ruff check .`` (``ruff.toml``) and ``mypy`` (``mypy.ini``: every product
package, core/ strictly)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT


def tool(name: str) -> str:
    """The tool installed beside this Python (the test extra installs both), else from PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.path.exists(beside) else shutil.which(name)
    assert found, f"{name} is required: pip install -e '.[test]' installs it"
    return found


def test_ruff_finds_nothing():
    result = subprocess.run([tool("ruff"), "check", "--no-cache", "."], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.long
def test_the_product_type_checks():
    result = subprocess.run([tool("mypy"), "--no-incremental", "--cache-dir", os.devnull], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
