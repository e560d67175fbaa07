"""Configs that change while the streaming job runs: :class:`LiveConfigs` for the stages, :class:`WatchConfigs`
for the ``config_rejected`` alerts.

The Beam side of ``core.config_versions`` (dated versions valid from an event time, and a loader that never
raises): the config directory is read through Beam's ``FileSystems``, a local path or ``gs://`` on Dataflow
(``run_dataflow.sh`` uploads it there), at launch and then again and again while the job runs.

Why the stages hold the configs themselves rather than get them as a side input: Beam (2.77) gives timer
callbacks no side inputs (``runners/common.py``, ``invoke_timer_callback``), and every stage that orders items
in event time or finalizes a run looks configs up in a timer. :class:`LiveConfigs` has the ``for_test(test,
at)`` of every other ``core.config.Configs``, so the stages need no change: each element still picks its
version by its own event time, among the versions read so far.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from core.config import TestConfig
from core.config_versions import (
    CONFIG_REFRESH_SECONDS,
    ConfigCheck,
    ListedFile,
    LoadedConfigs,
    config_rejected_alert,
    load_config_versions,
    next_check,
)
from transforms.coders import RecordCoder

_LOG = logging.getLogger(__name__)
Clock = Callable[[], float]


# -- reading a directory, local or on GCS ----------------------------------------------------------------------


def _is_local_directory(directory: str) -> bool:
    return isinstance(FileSystems.get_filesystem(directory), LocalFileSystem) and os.path.isdir(directory)


def _list_files(directory: str) -> List[ListedFile]:
    """The directory's files, each stamped with its size and last update; FileNotFoundError if there are none
    and the directory is not a local one (GCS has no empty directories: a prefix without files is a wrong path)."""
    matched = FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list
    files = [ListedFile(posixpath.basename(m.path.rstrip("/")), f"{m.size_in_bytes}:{m.last_updated_in_seconds}")
             for m in matched]
    if not files and not _is_local_directory(directory):
        raise FileNotFoundError(directory)
    return files


def _read_file(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def read_config_dir(directory: str, previous: Optional[LoadedConfigs] = None,
                    now: Optional[float] = None) -> LoadedConfigs:
    """``core.config_versions.load_config_versions`` of a local or ``gs://`` directory (``now``: the time of the
    read, default the wall clock). Never raises; at launch, ``.strict()`` of the result refuses a bad config."""
    return load_config_versions(directory, lambda: _list_files(directory), _read_file, previous,
                                time.time() if now is None else now)


# -- the configs the stages look up --------------------------------------------------------------------------


class _Reader:
    """One process's reader of a job's config directory: what it read last and when to read again, locked,
    shared by every stage's copy of the job's :class:`LiveConfigs` in the process."""

    def __init__(self, loaded: LoadedConfigs, refresh_seconds: float, clock: Clock):
        self.loaded = loaded
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._due: Optional[float] = None  # when to read again (processing time); None: at the first lookup
        self._lock = threading.Lock()

    def current(self) -> LoadedConfigs:
        """What the directory holds, read again first if the refresh period has passed since the last read."""
        with self._lock:
            now = self.clock()
            if self._due is None or now >= self._due:
                self._due = now + self.refresh_seconds
                self._read(now)
            return self.loaded

    def _read(self, now: float) -> None:
        before = self.loaded
        try:
            self.loaded = read_config_dir(before.directory, before, now)
            changes = self.loaded.changes_since(before)
        except Exception:  # noqa: BLE001 - the loader never raises; should anything else, keep what was read
            _LOG.exception("trainguard: re-reading the configs in %s failed; the last ones read stay in use",
                           before.directory)
            self.loaded = before
            return
        for check in changes:
            if check.rejected:
                _LOG.warning("trainguard: config rejected: %s", check.error())


_READERS: Dict[str, _Reader] = {}  # by LiveConfigs.job_id: one reader per job and process
_READERS_LOCK = threading.Lock()


class LiveConfigs:
    """``Configs`` that follow a config directory while the job runs, and never raise.

    Built at launch from the directory read then (checked strictly: a bad config refuses to start) and
    pickled into every DoFn that looks configs up. On a worker all those copies share one reader per process
    (:class:`_Reader`, found by the job's ``job_id``): it reads the directory at the first lookup and then
    whenever ``refresh_seconds`` of processing time (``clock``) have passed since its last read, in the lookup
    itself: a listing, and a read of only the files whose listing changed. So a worker lists the directory once
    per refresh period, however many stages and threads it runs, and every stage of the worker switches to an
    edit at the same moment. A file rejected then keeps the version read before (at worst the launch-time one,
    on a worker started while the file was bad), and a directory that cannot be read keeps everything.

    An edit of an undated file thus reaches each worker within ``refresh_seconds``, at a processing time: which
    elements see it depends on timing. A dated file (``<test>@<time>.json``) is valid from its event time
    whenever it is read, so the elements after that time pick it as a replay of the same files would, provided
    it was uploaded before they were processed.
    """

    def __init__(self, loaded: LoadedConfigs, refresh_seconds: float = CONFIG_REFRESH_SECONDS,
                 clock: Clock = time.time):
        self.launched = loaded
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self.job_id = uuid.uuid4().hex  # the same in every copy: they find their process's reader by it

    @property
    def directory(self) -> str:
        return self.launched.directory

    def _reader(self) -> _Reader:
        with _READERS_LOCK:
            reader = _READERS.get(self.job_id)
            if reader is None:
                reader = _READERS[self.job_id] = _Reader(self.launched, self.refresh_seconds, self.clock)
            return reader

    def current(self) -> LoadedConfigs:
        """The configs as this process last read them, after a re-read if one is due."""
        return self._reader().current()

    @property
    def loaded(self) -> LoadedConfigs:
        """The configs as this process last read them, without a re-read."""
        return self._reader().loaded

    def for_test(self, test: str, at: Optional[float] = None) -> TestConfig:
        """The config of ``test`` valid at event time ``at`` (None: the latest), after a re-read if one is due."""
        return self.current().versions.for_test(test, at)

    def any_live_windows(self) -> bool:
        return True  # a version with windows may come while the job runs


def forget_readers() -> None:
    """Drops this process's readers, as a new worker process starts without any (for tests)."""
    with _READERS_LOCK:
        _READERS.clear()


# -- the config_rejected alerts ------------------------------------------------------------------------------


class _CheckConfigsFn(beam.DoFn):
    """Any element -> (file, ConfigCheck) for what changed in the directory since this instance last looked
    (at first: since launch), once the process's reader has read it again."""

    def __init__(self, configs: LiveConfigs):
        self.configs = configs
        self._seen: Optional[LoadedConfigs] = None

    def setup(self) -> None:
        self._seen = self.configs.launched

    def process(self, unused_element: Any) -> Iterator[Tuple[str, ConfigCheck]]:
        current = self.configs.current()
        seen, self._seen = self._seen or self.configs.launched, current
        if current is not seen:
            for check in current.changes_since(seen):
                yield check.file, check


_LATEST_CHECK = ReadModifyWriteStateSpec("config_check", RecordCoder())


class AlertOnceFn(beam.DoFn):
    """(file, ConfigCheck) -> a ``config_rejected`` alert row, once per rejected version of the file."""

    def process(self, element: Tuple[str, ConfigCheck],
                latest=beam.DoFn.StateParam(_LATEST_CHECK)) -> Iterator[Dict[str, Any]]:
        _, check = element
        kept, alert = next_check(latest.read(), check)
        latest.write(kept)
        if alert:
            yield config_rejected_alert(check).to_row()


class WatchConfigs(beam.PTransform[PCollection[Any], PCollection[Dict[str, Any]]]):
    """The job's input (any PCollection) -> ``config_rejected`` alert rows: each rejected version of a config
    file alerts once, naming the file, the key and the reason.

    ``Check`` looks at the directory through the stages' :class:`LiveConfigs` (the process's reader, which
    reads it at most once per refresh period) and passes on what changed since it last looked; ``AlertOnce``, keyed by
    file, keeps each file's latest check in state and alerts once per rejected version
    (``core.config_versions.next_check``), whichever instance and re-read found it. Every instance and every
    stage reads the same files by the same rules, so the alert says what the stages do with the file.

    The re-reads are driven by the job's input rather than by a ``PeriodicImpulse``: Beam (2.77) cannot run a
    splittable DoFn such as ``PeriodicImpulse`` on the local streaming runner (``BundleBasedDirectRunner``
    fails to expand it, "was not replaced as expected"), and a stateful processing-time loop started from an
    ``Impulse`` would live in a global window that expires as soon as the bounded impulse's watermark reaches
    the end of time. With no input for a while, a rejection alerts with the next message; the stages meanwhile
    keep what they read before, as always.
    """

    def __init__(self, configs: LiveConfigs):
        super().__init__()
        self.configs = configs

    def expand(self, pulse: beam.PCollection) -> beam.PCollection:
        return (pulse
                | "Check" >> beam.ParDo(_CheckConfigsFn(self.configs)).with_output_types(
                    beam.typehints.KV[str, ConfigCheck])
                | "AlertOnce" >> beam.ParDo(AlertOnceFn()))
