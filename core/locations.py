"""Default local file names shared by the pipeline and its tools (relative to the working directory).

The replay writes ``LOCAL_STORE`` and ``ALERTS_FILE``; the report reads the store
and draws into ``REPORT_DIR`` (not ``report``: that is the report tool's package,
and writing pictures into it from the repository root would be a mess). ``CONFIG_DIR``,
the bundled per-test configs, is where both look for the checks unless told otherwise.
"""

import os

LOCAL_STORE = "trainguard.duckdb"
ALERTS_FILE = "alerts.jsonl"
LEGACY_TRIAGE_FILE = "triage.jsonl"  # where triage actions went before each store had its own file
REPORT_DIR = "trainguard-report"
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def triage_file_for(store: str) -> str:
    """The triage file of a local store (``trainguard-triage`` appends to it, replays into that store apply it):
    beside the store, named after it (``runs/trainguard.duckdb`` -> ``runs/trainguard.triage.jsonl``)."""
    return os.path.splitext(store)[0] + ".triage.jsonl"
