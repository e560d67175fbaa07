"""How far a replay's reading has got: files, messages and points, counted where they are read.

The replay (``pipeline/replay.py``) registers a counter under an id of its own and hands the id, a string, to the
transforms that count: ``ReadReplayFiles`` (files) and ``ParseMessages`` (messages, and their points, which only
the parser knows). Their DoFns look the counter up in this process's registry when a bundle starts, and count per
file and per message, never per point. Where the DoFns run in the replay's own process (FnApiRunner, and Beam's
DirectRunner in its default mode) they find the counter; where they run elsewhere (Dataflow, worker processes)
they find none and count nothing, and the replay's printer says progress is unavailable. Two replays in one
process have two ids, so their counts never mix.

Counters are used through :class:`ProgressCounter` and the three functions below only, so that another kind
(one shared between processes, which :func:`counter_for` would then attach to from the id) can replace
:class:`LocalCounter` without changing the transforms.
"""

from __future__ import annotations

import threading
import uuid
from typing import Dict, NamedTuple, Optional, Protocol, Set


class ReadCounts(NamedTuple):
    """What has been read so far: files of which a line was read, messages, and their valid points."""
    files: int = 0
    messages: int = 0
    points: int = 0


class ProgressCounter(Protocol):
    """What the transforms count into and the printer reads; safe to call from any thread."""

    def read_file(self, name: str) -> None:
        """A line of file ``name`` was read (each file counts once, however often this is called)."""

    def read_message(self, points: int) -> None:
        """One message was read, with ``points`` valid points."""

    def snapshot(self) -> ReadCounts:
        """The counts so far."""


class LocalCounter:
    """A :class:`ProgressCounter` for one process: a lock and three numbers (and the set of file names)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: Set[str] = set()
        self._messages = 0
        self._points = 0

    def read_file(self, name: str) -> None:
        with self._lock:
            self._files.add(name)

    def read_message(self, points: int) -> None:
        with self._lock:
            self._messages += 1
            self._points += points

    def snapshot(self) -> ReadCounts:
        with self._lock:
            return ReadCounts(len(self._files), self._messages, self._points)


_COUNTERS: Dict[str, ProgressCounter] = {}
_COUNTERS_LOCK = threading.Lock()


def register(counter: Optional[ProgressCounter] = None) -> str:
    """Registers a counter (a new :class:`LocalCounter` by default) in this process; returns its new id."""
    progress_id = f"replay-{uuid.uuid4().hex}"
    with _COUNTERS_LOCK:
        _COUNTERS[progress_id] = LocalCounter() if counter is None else counter
    return progress_id


def unregister(progress_id: str) -> None:
    """Forgets a counter; DoFns still holding it count into it harmlessly."""
    with _COUNTERS_LOCK:
        _COUNTERS.pop(progress_id, None)


def counter_for(progress_id: Optional[str]) -> Optional[ProgressCounter]:
    """The counter registered under ``progress_id`` in this process; None for None, or where none is."""
    if progress_id is None:
        return None
    with _COUNTERS_LOCK:
        return _COUNTERS.get(progress_id)
