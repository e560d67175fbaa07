"""One writer per local store: an advisory lock on a file beside it, which the OS releases when its holder dies.

A replay reads the store's history at start-up and writes its rows at the end: two replays into one store at
once would each run without the other's history, and both exit 0. So a writer takes ``<store>.lock`` (``flock``,
exclusive, not waiting) for its whole invocation and writes who it is into it; a second writer stops with one
line naming the holder. Readers (the report, ``trainguard-triage list``, the backtest) take no lock. A killed
holder leaves the file, not the lock: the next writer takes it at once. The file is never removed, since
removing a lock file while another process waits on it would let two writers in.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Optional


class StoreBusy(Exception):
    """Another process holds the store's write lock; ``str(error)`` names it."""


def lock_path(store: str) -> str:
    return os.path.abspath(store) + ".lock"


class StoreLock:
    """The write lock of the DuckDB store at ``store``; a context manager. :meth:`acquire` raises
    :class:`StoreBusy` (held by another process) or ``OSError`` (the lock file cannot be made)."""

    def __init__(self, store: str):
        self.store = store
        self.path = lock_path(store)
        self._fd: Optional[int] = None

    def acquire(self) -> StoreLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StoreBusy(f"the store {self.store} is being written by {holder} (lock {self.path}); "
                            "wait for it to end, or stop it") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode() + b"\n", 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *_) -> None:
        self.release()


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])[:300]}


def _read_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it; 'another process' if it has not written yet."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']} ({holder['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
