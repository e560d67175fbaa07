"""Config versions in event time, read from a directory that may change while a job runs.

A config directory holds, per test, ``<test>.json`` (valid from the beginning of time; ``default.json`` for
the tests without files of their own; ``a__b.json`` is test ``a/b``) and any number of dated versions
``<test>@<UTC time>.json`` (e.g. ``pt-cifar@20261120T100000Z.json``), each valid from that event time on. The
directory carries its own validity times: every element picks the version valid at its own event time
(:class:`ConfigVersions`), so a replay and a streaming job given the same files give the same rows, whenever
each of them reads the files. An edit of an undated file, by contrast, reaches a running job when the job
re-reads it, in processing time: from some element on, and which one depends on timing. A dated file is how
to make a change reproducible.

Why not a side input updated in processing time (the "slowly-changing side input" pattern): it would match
each element with whichever version its worker held when it processed the element, non-deterministically;
and the stages read configs inside their timer callbacks, which Beam (2.77) gives no side inputs
(``apache_beam/runners/common.py``, ``invoke_timer_callback``: "TODO(ccy): support side inputs").

:func:`load_config_versions` reads a directory through two functions it is given (list the files, read one),
so that this module stays free of Beam and of any file system (``transforms.config_versions`` reads local
paths and ``gs://`` through Beam's ``FileSystems``), and it never raises. A file that cannot be read, is not
JSON, fails validation or has a bad name is rejected (a :class:`ConfigCheck` naming the file, the key and the
reason) and the version of that file read before, if any, stays in use; a directory that cannot be listed
keeps everything read before. At launch the CLIs refuse to start on any rejection
(:meth:`LoadedConfigs.strict`): failing fast is right there. A running job keeps going and raises a
``config_rejected`` alert (:func:`config_rejected_alert`), once per rejected version of a file
(:func:`next_check`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import datetime
import hashlib
import json
import operator
import os
import re
import time
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

from core.config import (
    DEFAULT_CONFIG_NAME,
    ConfigError,
    ConfigSet,
    TestConfig,
    filename_for_test,
    parse_test_config,
    test_name_from_filename,
)
from core.records import Alert
from core.registry import record
from core.vocabulary import AlertKind

CONFIG_REFRESH_SECONDS = 300.0
"""How often (processing time) a running job re-reads its config directory: per stage instance, one listing
and a read of the files whose listing changed. Five minutes makes an upload live within minutes, and costs a
few listings per worker and minute, even on GCS."""
VALID_FROM_FORMAT = "%Y%m%dT%H%M%SZ"
VALID_FROM_EXAMPLE = "20261120T100000Z"
_VALID_FROM = re.compile(r"[0-9]{8}T[0-9]{6}Z")
BEGINNING = float("-inf")  # the validity time of an undated file
DIRECTORY = ""    # the name under which LoadedConfigs.checks keeps the listing's own check
WHOLE_FILE = "-"  # the key of a rejection about a file (or the directory) as a whole, as ConfigError writes it
CONFIG_ALERT_RUN = "config"  # the run id of a config_rejected alert: it is about a file, not a run
ALL_TESTS = "*"   # the test of a config_rejected alert about the directory, or a file whose name names no test
_valid_from = operator.itemgetter(0)


class ListedFile(NamedTuple):
    """One file of a directory listing."""
    name: str                    # its name in the directory
    stamp: Optional[str] = None  # changes whenever the file does (size and modification time); None: unknown


ListFiles = Callable[[], Iterable[ListedFile]]
"""The files of a directory; raises FileNotFoundError if there is no such directory."""
ReadFile = Callable[[str], bytes]
"""The bytes of a file, by path."""

Version = Tuple[float, TestConfig]  # (valid_from, config)


def dated_name(test: str, valid_from: float) -> str:
    """The file name of ``test``'s version valid from ``valid_from`` (whole seconds since the epoch)."""
    when = time.strftime(VALID_FROM_FORMAT, time.gmtime(valid_from))
    return f"{filename_for_test(test)[:-len('.json')]}@{when}.json"


def parse_file_name(name: str) -> Tuple[str, float]:
    """(test, valid_from) of a config file's name (``BEGINNING`` when undated); ValueError saying what is wrong."""
    stem = name[:-len(".json")]
    test_part, dated, when = stem.rpartition("@")
    valid_from: Optional[float] = BEGINNING
    if not dated:
        test_part = stem
    else:
        valid_from = _utc_seconds(when)
    if not test_part or valid_from is None:
        raise ValueError(f"the file name must be <test>.json or <test>@<UTC time>.json, the time written as "
                         f"{VALID_FROM_EXAMPLE}, got {name!r}")
    return test_name_from_filename(test_part + ".json"), valid_from


def _utc_seconds(when: str) -> Optional[float]:
    """Seconds since the epoch of a ``VALID_FROM_FORMAT`` time; None if it is not one (a month 13 included)."""
    if not _VALID_FROM.fullmatch(when):
        return None
    try:
        return datetime.datetime.strptime(when, VALID_FROM_FORMAT).replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def _valid_at(versions: Tuple[Version, ...], at: Optional[float]) -> Optional[TestConfig]:
    """The version valid at ``at`` (None: the latest); None before the first."""
    if not versions:
        return None
    if at is None:
        return versions[-1][1]
    index = bisect.bisect_right(versions, at, key=_valid_from) - 1
    return versions[index][1] if index >= 0 else None


@dataclasses.dataclass(frozen=True)
class ConfigVersions:
    """Each test's config versions in event time, as a config directory holds them (each tuple in time order).

    A test without a version valid at an element's time gets the default's valid then (``default.json``,
    ``default@<time>.json``), else the built-in default.
    """
    by_test: Mapping[str, Tuple[Version, ...]] = dataclasses.field(default_factory=dict)
    default: Tuple[Version, ...] = ()

    def for_test(self, test: str, at: Optional[float] = None) -> TestConfig:
        """The config of ``test`` valid at event time ``at`` (None: the latest)."""
        config = _valid_at(self.by_test.get(test, ()), at)
        if config is None:
            config = _valid_at(self.default, at)
        return TestConfig() if config is None else config

    def any_live_windows(self) -> bool:
        return any(config.windows.tags for versions in (*self.by_test.values(), self.default)
                   for _, config in versions)

    def may_have_live_windows(self, test: Optional[str]) -> bool:
        """Whether a version of the test's config, or of the default, has live windows (a replay's pipeline run
        holds the points of their tags until it windows them: ``pipeline.replay.line_groups``); True for no
        test (a line without one is a dead letter, held whole)."""
        if test is None:
            return True
        return any(config.windows.tags for _, config in (*self.by_test.get(test, ()), *self.default))

    @property
    def latest(self) -> ConfigSet:
        """The latest version of each test and of the default: what the start-up seed and the tools read."""
        return ConfigSet({test: versions[-1][1] for test, versions in self.by_test.items()},
                         self.default[-1][1] if self.default else TestConfig())


@record("ConfigCheck")
@dataclasses.dataclass(frozen=True)
class ConfigCheck:
    """What one read of a config file (or a listing of the directory) found: accepted, or rejected and why.

    ``transforms.config_versions.WatchConfigs`` shuffles these and keeps the latest of each file in state.
    """
    file: str                     # the file's path; the directory's, for a listing
    digest: str = ""              # SHA-256 of the bytes read; "" when none were (unreadable, gone, a listing)
    checked_at: float = 0.0       # when it was read (processing time, seconds since the epoch)
    key: Optional[str] = None     # rejected: the bad key's path as the StrictReader names it, "-" the whole file
    reason: Optional[str] = None  # rejected: why; None: accepted
    test: Optional[str] = None    # the test the file configures, when its name says
    kept_previous: bool = False   # rejected: what was read before stays in use

    @property
    def rejected(self) -> bool:
        return self.reason is not None

    def error(self) -> ConfigError:
        """The rejection as the launch-time error: "<file>: <key>: <reason>"."""
        return ConfigError(self.file, self.key or WHOLE_FILE, self.reason or "accepted")


@dataclasses.dataclass(frozen=True)
class LoadedFile:
    """A version in use: one config file, parsed."""
    name: str
    test: str
    valid_from: float
    config: TestConfig


def _outcome(check: Optional[ConfigCheck]) -> Optional[Tuple[str, bool]]:
    return None if check is None else (check.digest, check.rejected)


@dataclasses.dataclass(frozen=True)
class LoadedConfigs:
    """One read of a config directory: the versions in use, and what the read found of each file.

    The next read takes this one as ``previous``: a rejected file keeps the version in use here, and a file
    whose listing ``stamp`` has not changed is not read again.
    """
    directory: str
    files: Mapping[str, LoadedFile] = dataclasses.field(default_factory=dict)    # by name: the version in use
    checks: Mapping[str, ConfigCheck] = dataclasses.field(default_factory=dict)  # by name; DIRECTORY: the listing
    stamps: Mapping[str, Optional[str]] = dataclasses.field(default_factory=dict)  # by name: of the bytes checked
    versions: ConfigVersions = ConfigVersions()

    @property
    def rejections(self) -> Tuple[ConfigCheck, ...]:
        """The rejected checks, the listing's first, then by file name."""
        return tuple(check for _, check in sorted(self.checks.items()) if check.rejected)

    def strict(self) -> ConfigVersions:
        """The versions, or ``ConfigError`` naming the first rejected file and key: the launch-time check."""
        for check in self.rejections:
            raise check.error()
        return self.versions

    def changes_since(self, earlier: LoadedConfigs) -> List[ConfigCheck]:
        """The checks whose outcome differs from ``earlier``'s (another version of the file, or accepted where
        it was rejected and back), and an accepted check without digest for each file gone since."""
        now = self.checks[DIRECTORY].checked_at if DIRECTORY in self.checks else 0.0
        changed = [check for name, check in sorted(self.checks.items())
                   if _outcome(earlier.checks.get(name)) != _outcome(check)]
        gone = [ConfigCheck(check.file, checked_at=now, test=check.test)
                for name, check in sorted(earlier.checks.items()) if name not in self.checks]
        return changed + gone


def load_config_versions(directory: str, list_files: ListFiles, read_file: ReadFile,
                         previous: Optional[LoadedConfigs] = None, now: float = 0.0) -> LoadedConfigs:
    """The config versions in ``directory``, read with ``list_files`` and ``read_file``; never raises.

    ``previous`` is the last read of the same directory (None: there was none): a rejected file keeps the
    version in use there, a file whose listing stamp has not changed since is not read again, and a listing
    that fails keeps all of it. ``now`` is the time of this read, for its checks.
    """
    before = previous if previous is not None and previous.directory == directory else LoadedConfigs(directory)
    try:
        return _load(directory, list_files, read_file, before, now)
    except Exception as error:  # noqa: BLE001 - a bug of ours must not stop a running job either
        return _unlisted(before, now, f"cannot load the config directory: {type(error).__name__}: {error}")


def _unlisted(before: LoadedConfigs, now: float, reason: str) -> LoadedConfigs:
    """``before``, kept whole, with the listing's rejection."""
    check = ConfigCheck(before.directory, checked_at=now, key=WHOLE_FILE, reason=reason, kept_previous=True)
    return dataclasses.replace(before, checks={**before.checks, DIRECTORY: check})


def _listing(items: Iterable[ListedFile]) -> Dict[str, Optional[str]]:
    listed: Dict[str, Optional[str]] = {}
    for item in items:
        name, stamp = (item.name, item.stamp) if isinstance(item, ListedFile) else (str(item), None)
        if name.endswith(".json") and "/" not in name and os.sep not in name:  # subdirectories are not read
            listed[name] = stamp
    return listed


def _load(directory: str, list_files: ListFiles, read_file: ReadFile, before: LoadedConfigs,
          now: float) -> LoadedConfigs:
    try:
        listed = _listing(list_files())
    except FileNotFoundError:
        return _unlisted(before, now, "config directory does not exist")
    except NotADirectoryError:
        return _unlisted(before, now, "config directory is not a directory")
    except Exception as error:  # noqa: BLE001 - any failure to list is the listing's rejection
        return _unlisted(before, now, f"cannot list the config directory: {type(error).__name__}: {error}")
    files: Dict[str, LoadedFile] = {}
    checks: Dict[str, ConfigCheck] = {DIRECTORY: ConfigCheck(directory, checked_at=now)}
    for name in sorted(listed):
        stamp, earlier = listed[name], before.checks.get(name)
        if stamp is not None and earlier is not None and before.stamps.get(name) == stamp:
            check, in_use = dataclasses.replace(earlier, checked_at=now), before.files.get(name)  # unchanged
        else:
            check, in_use = _check_file(directory, name, read_file, before.files.get(name), now)
        checks[name] = check
        if in_use is not None:
            files[name] = in_use
    return LoadedConfigs(directory, files, checks, listed, _versions(files.values()))


def _check_file(directory: str, name: str, read_file: ReadFile, previous: Optional[LoadedFile],
                now: float) -> Tuple[ConfigCheck, Optional[LoadedFile]]:
    """What reading one file found, and the version of it in use after: the new one, or ``previous``."""
    path = os.path.join(directory, name)
    test: Optional[str] = None
    digest = ""

    def rejected(key: str, reason: str) -> Tuple[ConfigCheck, Optional[LoadedFile]]:
        return ConfigCheck(path, digest, now, key, reason, test, previous is not None), previous

    try:
        test, valid_from = parse_file_name(name)
    except ValueError as error:
        return rejected(WHOLE_FILE, str(error))
    try:
        data = bytes(read_file(path))
        digest = hashlib.sha256(data).hexdigest()
    except Exception as error:  # noqa: BLE001 - unreadable for any reason: a rejection of this file
        return rejected(WHOLE_FILE, f"cannot read the file: {type(error).__name__}: {error}")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8 (a ValueError), not JSON, nested too deep
        return rejected(WHOLE_FILE, f"cannot read JSON: {error}")
    try:
        config = parse_test_config(raw, path)
    except ConfigError as error:
        return rejected(error.key, error.problem)
    except Exception as error:  # noqa: BLE001 - whatever else the parser may meet in hand-written JSON
        return rejected(WHOLE_FILE, f"{type(error).__name__}: {error}")
    return ConfigCheck(path, digest, now, test=test), LoadedFile(name, test, valid_from, config)


def _versions(files: Iterable[LoadedFile]) -> ConfigVersions:
    by_test: Dict[str, List[Version]] = collections.defaultdict(list)
    for file in files:
        by_test[file.test].append((file.valid_from, file.config))
    ordered = {test: tuple(sorted(versions, key=_valid_from)) for test, versions in by_test.items()}
    default = ordered.pop(DEFAULT_CONFIG_NAME, ())
    return ConfigVersions(ordered, default)


# -- a local directory ---------------------------------------------------------------------------------------


def local_listing(directory: str) -> ListFiles:
    """Lists the files of a local directory, each stamped with its size and modification time."""
    def list_files() -> List[ListedFile]:
        with os.scandir(directory) as entries:
            return [ListedFile(entry.name, f"{entry.stat().st_size}:{entry.stat().st_mtime_ns}")
                    for entry in entries if entry.is_file()]
    return list_files


def read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def load_local_versions(directory: str, previous: Optional[LoadedConfigs] = None,
                        now: float = 0.0) -> LoadedConfigs:
    """:func:`load_config_versions` of a local directory."""
    return load_config_versions(directory, local_listing(directory), read_local, previous, now)


# -- the alert -----------------------------------------------------------------------------------------------


def next_check(seen: Optional[ConfigCheck], check: ConfigCheck) -> Tuple[ConfigCheck, bool]:
    """A file's latest check after ``check`` arrives where ``seen`` was the latest, and whether to alert.

    Each rejected version of a file (its digest) alerts once while it stays rejected: the same rejection read
    again (every refresh of every worker reads it) does not alert again, but the file broken anew after an
    accepted read does. A check read before the latest seen (another worker, slower to report) changes nothing.
    """
    if seen is not None and check.checked_at < seen.checked_at:
        return seen, False
    repeated = seen is not None and seen.rejected and seen.digest == check.digest
    return check, check.rejected and not repeated


def config_rejected_alert(check: ConfigCheck) -> Alert:
    """The ``config_rejected`` alert of a rejected check: its message is the launch-time error line and what
    is used instead; one alert id per file and version (content digest)."""
    if check.kept_previous:
        instead = "what was read before stays in use"
    elif check.test is not None:
        instead = f"not used: {check.test} keeps its other versions, else the default"
    else:
        instead = "not used"
    return Alert(
        kind=AlertKind.CONFIG_REJECTED, test=check.test or ALL_TESTS, run=CONFIG_ALERT_RUN,
        message=f"{check.error()} ({instead})", created_at=check.checked_at,
        details={"file": check.file, "key": check.key, "reason": check.reason, "digest": check.digest,
                 "kept_previous": check.kept_previous},
        instance=f"{check.file}@{check.digest}")
