"""What a replay need not read again: the bytes of its files that it read into the same store before, unchanged.

A bounded replay records in the store, with its last rows, each local file's bytes it read (up to the end of the
file's last line feed) and their SHA-256, under an *identity*: the digest of what decides what becomes of a line
(the configs' files, the run lifecycle options, trainguard's version). A later replay into that store, under the
same identity, reads a file only after the longest recorded prefix that the file's bytes still match: a file
replayed before is skipped, a log that grew is read from where the last replay stopped, a file rewritten or cut
is read whole.

Why this gives the rows of a full read: when a replay ends, every run its lines named is in the store (a bounded
replay finalizes every open run), so every line of a recorded prefix is a message of a stored run, which a
replay counts and skips, or a dead letter the store already holds (its key is its source, reason and payload),
or a triage action the store's seed already carries. The record is committed with the last rows, so a replay
killed before its end recorded nothing and its rerun reads everything, as before.

A file changed while it was read (its size or modification time moved) is not recorded.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from core.schema import REPLAYED_FILES
from sinks.alerts_file import end_of_last_line
from sinks.duckdb_store import DuckDBStore

CHUNK = 1 << 22
BLANK_CHECK_LIMIT = 1 << 20  # a rest longer than this is read as lines, blank or not


def replay_identity(config_digests: Iterable[Tuple[str, str]], lifecycle: Any, version: str) -> str:
    """The digest of what decides what becomes of a line: the config files' digests by name, the run lifecycle
    (a dataclass) and trainguard's version. Another identity reads every file whole."""
    described = {"configs": sorted(config_digests), "lifecycle": dataclasses.asdict(lifecycle), "version": version}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def last_line_end(path: str, size: int) -> int:
    """The offset just after the last line feed among the file's first ``size`` bytes (0: none)."""
    with open(path, "rb") as f:
        return end_of_last_line(f, size)


def prefix_digests(path: str, marks: Iterable[int], stop: Optional[threading.Event] = None) -> Dict[int, str]:
    """SHA-256 of the file's first ``mark`` bytes, for each mark the file still holds, in one pass (cut short,
    with the marks reached so far, once ``stop`` is set)."""
    digest, position, found = hashlib.sha256(), 0, {}  # type: Tuple[Any, int, Dict[int, str]]
    with open(path, "rb") as f:
        for mark in sorted(set(marks)):
            while position < mark:
                chunk = f.read(min(CHUNK, mark - position))
                if not chunk or (stop is not None and stop.is_set()):
                    return found
                digest.update(chunk)
                position += len(chunk)
            found[mark] = digest.hexdigest()
    return found


def _stamp(path: str) -> Tuple[int, int, int]:
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns, status.st_ino


@dataclasses.dataclass(frozen=True)
class FileRead:
    """One local file of a replay: its bytes ``[start, size)`` are to be read (``start``: how many were read into
    the store before, unchanged since), and ``end``, up to its last line feed, are what to record once read."""
    path: str                   # the real path
    start: int
    end: int
    stamp: Tuple[int, int, int]  # size, modification time and inode when planned
    rest_blank: bool             # nothing but blank lines after ``start``

    @property
    def size(self) -> int:
        return self.stamp[0]

    @property
    def unread(self) -> bool:
        """Whether anything after ``start`` is a line to read."""
        return not self.rest_blank


class ReplayedFiles:
    """The read of each local file of one replay into one store, planned from the store's record; the rows to
    record once the replay's last rows are committed (:meth:`records`).

    The digests that only serve the record (a file the store has no record of) are taken on a thread of their
    own while the pipeline runs: the hash releases the interpreter's lock.
    """

    def __init__(self, reads: Mapping[str, FileRead], identity: str, known: Mapping[str, Dict[int, str]]):
        self.reads = dict(reads)
        self.identity = identity
        self._known = known  # by path: the digests already taken (at its ``end`` for the files with a record)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainguard-digest")
        self._stop = threading.Event()  # a replay that fails does not wait for the rest of the digests
        self._pending = {path: self._pool.submit(prefix_digests, path, (read.end,), self._stop)
                         for path, read in self.reads.items() if read.end not in known.get(path, {})}

    @classmethod
    def plan(cls, store: DuckDBStore, paths: Sequence[str], identity: str, reread: bool = False) -> ReplayedFiles:
        """The reads of ``paths`` (real paths of local, uncompressed files) against ``store``'s record; with
        ``reread``, every file whole (and recorded all the same)."""
        recorded: Dict[str, List[Tuple[int, str]]] = {}
        for path, length, digest in () if reread else store.query(
                f'SELECT path, bytes, sha256 FROM "{REPLAYED_FILES.name}" WHERE identity = ?', [identity]):
            recorded.setdefault(path, []).append((length, digest))
        reads, known = {}, {}
        for path in paths:
            stamp = _stamp(path)
            size = stamp[0]
            end = last_line_end(path, size)
            candidates = [(length, digest) for length, digest in recorded.get(path, ()) if length <= size]
            start = 0
            if candidates:
                known[path] = prefix_digests(path, [length for length, _ in candidates] + [end])
                start = max((length for length, digest in candidates if known[path].get(length) == digest),
                            default=0)
            reads[path] = FileRead(path, start, end, stamp, _blank_after(path, start, size))
        return cls(reads, identity, known)

    @property
    def unread(self) -> List[str]:
        """The files with lines to read."""
        return [path for path, read in self.reads.items() if read.unread]

    @property
    def skipped_bytes(self) -> int:
        return sum(read.start for read in self.reads.values())

    @property
    def skipped_files(self) -> int:
        """Files none of whose lines is read again."""
        return sum(1 for read in self.reads.values() if read.start and not read.unread)

    @property
    def files_read_in_part(self) -> int:
        """Files read from where an earlier replay stopped."""
        return sum(1 for read in self.reads.values() if read.start and read.unread)

    def spans(self) -> Dict[str, Tuple[int, int]]:
        """By path, the bytes to read of each file with lines to read."""
        return {path: (read.start, read.size) for path, read in self.reads.items() if read.unread}

    def records(self) -> List[dict]:
        """The rows of ``replayed_files`` for what this replay read: each file's bytes up to its last line feed,
        unless the file changed since it was planned."""
        rows = []
        for path, read in self.reads.items():
            digests = self._pending[path].result() if path in self._pending else self._known[path]
            if read.end and read.end in digests and _stamp(path) == read.stamp:
                rows.append({"path": path, "identity": self.identity, "bytes": read.end, "sha256": digests[read.end]})
        return rows

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ReplayedFiles:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def _blank_after(path: str, start: int, size: int) -> bool:
    """Whether the file's bytes ``[start, size)`` hold no line (white space only); a long rest counts as lines."""
    if size - start > BLANK_CHECK_LIMIT:
        return False
    with open(path, "rb") as f:
        f.seek(start)
        return not f.read(size - start).strip()
