"""Default local file names shared by the pipeline and its tools (relative to the working directory).

The replay writes ``LOCAL_STORE`` and ``ALERTS_FILE``; the report reads the store
and draws into ``REPORT_DIR`` (not ``report``: that is the report tool's package,
and writing pictures into it from the repository root would be a mess). ``CONFIG_DIR``,
the bundled per-test configs, is where both look for the checks unless told otherwise.
"""

import os

LOCAL_STORE = "trainguard.duckdb"
ALERTS_FILE = "alerts.jsonl"
TRIAGE_FILE = "triage.jsonl"  # triage actions for replays (``trainguard-triage``), read by the replay if present
REPORT_DIR = "trainguard-report"
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
