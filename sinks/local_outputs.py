"""The replay's local outputs for one invocation: checked before any work, one writer at a time, crash-safe.

:class:`LocalOutputs` is what a replay holds from start to end:

- before any work, the store and the alerts file are checked (:func:`check_outputs`): a path that is a
  directory, a store that is not a DuckDB file, a read-only file, a store another process is writing, an alerts
  file with a line that is not an alert: :class:`OutputUnusable`, one line for the user;
- the store's write lock (``sinks.store_lock``), so that a second writer stops instead of running without the
  first's history;
- staging directories beside the store (``sinks.staging``), named after it, so that the next holder of the lock
  removes what a killed run left;
- one transaction per commit (every table and the alerts file's record: ``sinks.staging.commit_staged``);
- the alerts file completed from the store at the end (``sinks.alerts_file``), after cutting a torn last line.

A kill at any instant, then a rerun, gives the store and the alerts file of a clean run
(``tests/pipeline/test_kills.py``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import stat
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from core.schema import Table
from sinks.alerts_file import AlertsFileDamaged, complete_alerts_file, cut_torn_tail, read_alert_keys
from sinks.crash_points import crash_point
from sinks.duckdb_store import DuckDBStore
from sinks.staging import commit_staged, recorded_alert_lines
from sinks.store_lock import StoreBusy, StoreLock

DUCKDB_MAGIC = b"DUCK"  # at bytes 8..12 of every DuckDB database file
STAGING_PREFIX = ".trainguard-staging-"


class OutputUnusable(Exception):
    """The store or the alerts file cannot be used as named; ``str(error)`` is one line for the user."""


def _read_only(path: str) -> bool:
    """No write permission bits (respected even by root, who could write anyway), or no access for this user."""
    return not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK)


def _check_directory_for(path: str, what: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutputUnusable(f"{what} {path}: {existing} is a file, not a directory")
    if _read_only(existing):
        raise OutputUnusable(f"{what} {path}: the directory {existing} is read-only")


def _check_output_file(path: str, option: str, kind: str) -> bool:
    """A path an output file can be written at (``option``, ``kind`` name it for the user): whether it exists."""
    if os.path.isdir(path):
        raise OutputUnusable(f"{option}={path} is a directory, not {kind}")
    _check_directory_for(path, option)  # the store's write-ahead log and lock file go beside it too
    if not os.path.exists(path):
        return False
    if not os.path.isfile(path):
        raise OutputUnusable(f"{option}={path} is not a regular file")
    if _read_only(path):
        raise OutputUnusable(f"{option}={path} is read-only")
    return True


def check_store(path: str) -> None:
    """The store is a writable DuckDB file, or can be made; else :class:`OutputUnusable`."""
    if not _check_output_file(path, "--local_store", "a DuckDB file"):
        return
    with open(path, "rb") as f:
        header = f.read(12)
    if header[8:12] != DUCKDB_MAGIC:
        raise OutputUnusable(f"--local_store={path} is not a DuckDB file ({os.path.getsize(path)} bytes that "
                             "DuckDB did not write); name another file, or move this one away")


def check_alerts_file(path: str) -> None:
    """The alerts file is a writable file, or can be made (its lines are checked once the store is locked)."""
    _check_output_file(path, "--alerts_file", "a file")


def check_outputs(store: str, alerts_file: str) -> None:
    """Every check a replay makes of its outputs before any work, the lock aside."""
    check_store(store)
    check_alerts_file(alerts_file)
    if os.path.abspath(store) == os.path.abspath(alerts_file):
        raise OutputUnusable(f"--local_store and --alerts_file both name {store}")


class LocalOutputs:
    """The store and the alerts file of one replay invocation; a context manager (see the module docstring).

    ``notes``: what was repaired on entry (a torn alerts-file line, staging directories of killed runs), for the
    user.
    """

    def __init__(self, store_path: str, alerts_file: str):
        self.store_path, self.alerts_file = store_path, alerts_file
        self.notes: List[str] = []
        self._lock = StoreLock(store_path)
        self._staging_dirs: List[str] = []
        self._store: Optional[DuckDBStore] = None

    @property
    def store(self) -> DuckDBStore:
        """The store, open for this invocation (inside the ``with`` block)."""
        if self._store is None:
            raise RuntimeError("LocalOutputs.store outside its with block")
        return self._store

    def __enter__(self) -> LocalOutputs:
        check_outputs(self.store_path, self.alerts_file)
        for path in (self.store_path, self.alerts_file):  # out/run1.duckdb makes out/ as it makes the file
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            self._lock.acquire()
        except StoreBusy as e:
            raise OutputUnusable(str(e)) from None
        except OSError as e:
            raise OutputUnusable(f"--local_store={self.store_path}: cannot make its lock file: {e}") from None
        try:
            self._open()
        except BaseException:
            self._lock.release()
            raise
        return self

    def _open(self) -> None:
        self._remove_stale_staging()
        torn = cut_torn_tail(self.alerts_file)
        if torn:
            self.notes.append(torn)
        try:
            read_alert_keys(self.alerts_file)
        except AlertsFileDamaged as e:
            raise OutputUnusable(str(e)) from None
        self._store = DuckDBStore(self.store_path)
        self._store.ensure_schema()

    def _staging_place(self) -> Tuple[str, str]:
        """(directory, name prefix) of this store's staging directories: beside it, named after it."""
        directory, name = os.path.split(os.path.abspath(self.store_path))
        return directory, f"{STAGING_PREFIX}{name}-"

    def _remove_stale_staging(self) -> None:
        """Staging directories of this store that are not ours are a killed run's: we hold the lock."""
        directory, prefix = self._staging_place()
        stale = glob.glob(os.path.join(directory, f"{prefix}*"))
        for directory in stale:
            shutil.rmtree(directory, ignore_errors=True)
        if stale:
            self.notes.append(f"removed {len(stale)} staging director{'y' if len(stale) == 1 else 'ies'} "
                              "left by an interrupted run")

    def new_staging_dir(self) -> str:
        """A new, empty staging directory for one pipeline run's rows."""
        directory, prefix = self._staging_place()
        self._staging_dirs.append(tempfile.mkdtemp(prefix=prefix, dir=directory))
        return self._staging_dirs[-1]

    def commit(self, staging_dir: str, also: Sequence[Tuple[Table, List[dict]]] = ()) -> Dict[str, int]:
        """The staged rows (and ``also``'s) into the store, in one transaction; the rows inserted per table."""
        inserted = commit_staged(staging_dir, self.store, also)
        shutil.rmtree(staging_dir, ignore_errors=True)
        return inserted

    def complete_alerts_file(self) -> int:
        """Appends what the store records and the file lacks; how many lines."""
        appended = complete_alerts_file(self.alerts_file, recorded_alert_lines(self.store))
        crash_point("alerts_file.done")
        return appended

    def __exit__(self, *_) -> None:
        for directory in self._staging_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(Exception):
            if self._store is not None:
                self._store.close()
        self._lock.release()
