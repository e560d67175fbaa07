"""What the tests of run_dataflow.sh share: running it against stubs of the cloud tools and a fake ``java``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

from tests.support import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "run_dataflow.sh")

JAVA_17 = 'openjdk version "17.0.9" 2023-10-17\nOpenJDK Runtime Environment (build 17.0.9+9)\n'
"""What ``java -version`` prints (on stderr) for the fake java the tests put first on the PATH by default."""

FAILING_STUB = '#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit 1\n'


def write_tool(directory, name: str, text: str):
    """An executable ``directory/name`` with the given text."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(text)
    tool.chmod(0o755)
    return tool


def fake_java(directory, version_output: str = JAVA_17, exit_code: int = 0):
    """A ``java`` that prints ``version_output`` on stderr, as ``java -version`` does, and exits ``exit_code``."""
    return write_tool(directory, "java",
                      f"#!/bin/sh\ncat >&2 <<'EOF'\n{version_output}EOF\nexit {exit_code}\n")


def path_without_java(tmp_path) -> str:
    """A PATH directory holding every command of this PATH (as symlinks) except ``java``."""
    tools = tmp_path / "no-java-bin"
    if not tools.exists():
        tools.mkdir()
        for directory in os.environ["PATH"].split(os.pathsep):
            if not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                target = os.path.join(directory, name)
                if name != "java" and not (tools / name).exists() and os.access(target, os.X_OK):
                    (tools / name).symlink_to(target)
    return str(tools)


def run_script(tmp_path, *args: str, env: Optional[Dict[str, str]] = None, java: Optional[str] = JAVA_17,
               tools: Optional[Dict[str, str]] = None, timeout: float = 120):
    """Runs run_dataflow.sh with gcloud/bq/gsutil replaced by stubs that log their calls (to called.log) and fail.

    ``java``: what the fake java first on the PATH prints for ``java -version``; None: no java on the PATH at
    all. ``tools``: other stubs by name, as script text; ``{log}`` in it is the log file.
    """
    stubs = tmp_path / "stubs"
    log = tmp_path / "called.log"
    for tool in ("gcloud", "bq", "gsutil"):
        write_tool(stubs, tool, FAILING_STUB.format(tool=tool, log=log))
    for tool, text in (tools or {}).items():
        write_tool(stubs, tool, text.replace("{log}", str(log)))
    if java is None:
        (stubs / "java").unlink(missing_ok=True)
        rest = path_without_java(tmp_path)
    else:
        fake_java(stubs, java)
        rest = os.environ["PATH"]
    environment = {"PATH": f"{stubs}{os.pathsep}{rest}", "PYTHON": sys.executable, "HOME": str(tmp_path),
                   **(env or {})}
    result = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=environment,
                            cwd=tmp_path, timeout=timeout)
    called = log.read_text() if log.exists() else ""
    return result, called


def commands(output: str) -> List[List[str]]:
    """The printed commands, each as a list of words."""
    return [shlex.split(line[2:]) for line in output.splitlines() if line.startswith("+ ")]
