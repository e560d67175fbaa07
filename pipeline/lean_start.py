"""A local replay starts without the cloud clients Beam imports for other runs.

``import apache_beam`` imports the Google Cloud Storage, BigQuery, Pub/Sub and Dataflow clients, their
credentials (google-auth, apitools, oauth2client) and pymongo, each under Beam's own ``try: ... except
ImportError``: about 660 modules and two fifths of the imports a replay of local files waits for, none of
which it uses. ``python -m pipeline`` (``pipeline/__main__.py``) imports with them left out where its command
line reaches no cloud service (:func:`reaches_no_cloud`): Beam then registers no ``gs://`` file system and no
BigQuery or Pub/Sub client, which such a replay never asks for. They are left out only while the entry point
imports: a client imported later is imported as usual.

Should an import fail for a module left out (a Beam release that imports one of them without its guard), the
process starts again as it was started, with every import (``TRAINGUARD_FULL_IMPORTS=1``). The warnings Beam
logs for what it did not find (the ``gs://`` file system, bson, apitools) are not shown: they are about what was
left out on purpose.

Stdlib only: this module runs before Beam is imported.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import sys
from typing import Callable, Iterator, Sequence, Tuple

LEFT_OUT: Tuple[str, ...] = (
    "google.cloud.storage", "google.cloud.bigquery", "google.cloud.bigquery_storage_v1", "google.cloud.pubsub",
    "google.cloud.pubsub_v1", "google.pubsub_v1", "google.cloud.dataflow", "google.auth", "google_auth_httplib2",
    "oauth2client", "apitools", "pymongo", "bson",
)
"""Packages a local replay imports without; Beam imports each of them under ``try: ... except ImportError``."""

FULL_IMPORTS_VARIABLE = "TRAINGUARD_FULL_IMPORTS"
"""Set (to anything but empty or 0): every import, as Beam makes them."""

LOCAL_RUNNERS = frozenset({"FnApiRunner", "BundleBasedDirectRunner", "DirectRunner", "SwitchingDirectRunner"})

LOCAL_OPTIONS = frozenset({
    # trainguard's own, but for those of its Pub/Sub and BigQuery groups (tests/pipeline/test_lean_start.py)
    "input_files", "triage_file", "reread_files", "replay_group_mib", "replay_group_runs", "replay_group_lines",
    "config_dir", "config_refresh_seconds", "local_store", "alerts_file", "report_dir", "progress", "no_progress",
    "run_grace_seconds", "run_timeout_seconds", "dedup_horizon_seconds", "finalized_run_retention_seconds",
    "timer_bucket_seconds", "backfill_lag_seconds", "backfill_quiet_seconds",
    # Beam's, for a local runner
    "runner", "direct_num_workers", "direct_running_mode",
})
"""Options of a replay that reaches no cloud service (any other option: every import)."""

# What Beam logs when what LEFT_OUT holds is missing (a record whose message starts with one of these).
_EXPECTED_WARNINGS = ("Failed to import GCSFileSystem", "Could not find a compatible bson package",
                      "apitools not found")


def reaches_no_cloud(argv: Sequence[str], environ=os.environ) -> bool:
    """Whether a ``python -m pipeline`` command line is a replay that reaches no cloud service: every option one of
    ``LOCAL_OPTIONS`` (or ``--help``), a local runner if one is named, and no value naming a remote file system
    (``gs://`` and the like)."""
    if environ.get(FULL_IMPORTS_VARIABLE, "") not in ("", "0"):
        return False
    for argument in argv:
        if "://" in argument:
            return False
        if argument in ("-h", "--help") or not argument.startswith("--"):
            continue
        name, _, value = argument[2:].partition("=")
        name = name.replace("-", "_")
        if name not in LOCAL_OPTIONS:
            return False
        if name == "runner" and value.rsplit(".", 1)[-1] not in LOCAL_RUNNERS:
            return False  # (a runner given as the next argument is not one of these: every import)
    return True


class _LeftOut(importlib.abc.MetaPathFinder):
    """Finds each package of ``LEFT_OUT`` (and its modules) missing."""

    def __init__(self, packages: Sequence[str]):
        self.packages = tuple(packages)
        self.prefixes = tuple(f"{package}." for package in packages)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.packages or fullname.startswith(self.prefixes):
            raise ModuleNotFoundError(f"{fullname} is left out of a local replay (pipeline/lean_start.py)",
                                      name=fullname)
        return None


class _ExpectedWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_EXPECTED_WARNINGS)


@contextlib.contextmanager
def left_out(packages: Sequence[str]) -> Iterator[None]:
    """Imports within the block find ``packages`` missing, and Beam's warnings about them are not shown."""
    finder, quiet = _LeftOut(packages), _ExpectedWarnings()
    loggers = [logging.getLogger(), logging.getLogger("apache_beam.io.filesystems"),
               logging.getLogger("apache_beam.io.mongodbio")]
    sys.meta_path.insert(0, finder)
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for logger in loggers:
            logger.removeFilter(quiet)


def import_main(argv: Sequence[str], packages: Sequence[str] = LEFT_OUT) -> Callable:
    """``pipeline.main.main``, imported without ``packages`` where ``argv`` reaches no cloud service. If that
    import fails, the process is started again with every import (it does not return)."""
    if not reaches_no_cloud(argv):
        from pipeline.main import main
        return main
    try:
        with left_out(packages):
            from pipeline.main import main
    except ImportError:
        sys.stdout.flush()
        sys.stderr.flush()
        os.environ[FULL_IMPORTS_VARIABLE] = "1"
        command = getattr(sys, "orig_argv", None) or [sys.executable, "-m", "pipeline", *argv]  # (3.9: no orig_argv)
        os.execv(sys.executable, command)
    return main
