"""The bounded replay: wire-format files in; the local DuckDB store and the alerts JSONL file out.

``python -m pipeline`` without a streaming input runs :func:`run` on the bundled
demo data (or ``--input_files``) on ``FnApiRunner``, prints a short summary and
writes the HTML report. The graph is ``pipeline.graph.DetectRegressions``, the
same one the streaming job (``pipeline/streaming.py``) runs.

While a replay runs, :class:`ProgressPrinter` shows how far its reading has got
on stderr (``--progress``; by default on a terminal), from the counts the reading
stage keeps in a ``transforms.progress`` counter of this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import shlex
import shutil
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, FrozenSet, Iterator, List, NamedTuple, Optional

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from core import encoding
from core.config import ConfigSet
from core.config_versions import ConfigVersions, LoadedConfigs
from core.history import HistorySeed
from core.locations import LEGACY_TRIAGE_FILE, triage_file_for
from core.schema import ALERT_UPDATES, ALERTS, REPLAYED_FILES, TABLES
from pipeline import IMPORTED_AT
from pipeline.check_configs import print_warnings, reported_metrics, unreported
from pipeline.graph import DetectRegressions, GraphSettings
from pipeline.options import (
    DEFAULT_REPORT_DIR,
    DEMO_INPUT,
    PROGRESS_LOG_SECONDS,
    PROGRESS_QUIET_SECONDS,
    TrainguardOptions,
    lifecycle_from,
)
from pipeline.runners import runner_for
from sinks.crash_points import crash_point
from sinks.duckdb_store import DuckDBStore
from sinks.local_outputs import LocalOutputs
from sinks.replayed_files import ReplayedFiles, replay_identity
from sinks.seed import MAX_NAMED_TESTS
from sinks.staging import StageRows
from sinks.stores import DUCKDB_SQL
from transforms.config_versions import read_config_dir
from transforms.progress import LocalCounter, ProgressCounter, ReadCounts, register, unregister
from transforms.sources import (
    LineGroup,
    LineSurvey,
    ReadReplayFiles,
    Spans,
    count_lines,
    is_local_text,
    survey_lines,
)

EXAMPLE_EMAIL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notifier",
                                    "example-config.json")
COUNTERS = ("messages_read", "messages_of_stored_runs", "runs_finalized")
PROGRESS_INTERVAL_ENV = "TRAINGUARD_PROGRESS_INTERVAL"
"""Internal, for tests: seconds between progress lines, and before the first, instead of :class:`ProgressTiming`'s."""


class WriteLocal(beam.PTransform[Dict[str, PCollection[Dict[str, Any]]], None]):
    """The graph's outputs -> files staged under ``staging_dir`` for the store and the alerts file.

    Any worker process may run these steps; ``sinks.local_outputs`` commits the rows to the DuckDB store and
    completes the alerts file from the launching process once the pipeline is done (one writer, whatever the
    runner).
    """

    def __init__(self, staging_dir: str):
        super().__init__()
        self.staging_dir = staging_dir

    def expand(self, outputs: Dict[str, beam.PCollection]):
        for name, rows in outputs.items():
            if name in TABLES or name == ALERT_UPDATES:
                rows | f"Stage_{name}" >> StageRows(self.staging_dir, name)
        return beam.pvalue.PDone(outputs[ALERTS.name].pipeline)


@dataclasses.dataclass
class ReplaySummary:
    input_files: List[str]
    counters: Dict[str, int]
    rows_added: Dict[str, int]
    alerts_by_kind: Dict[str, int]
    seconds: float
    store: str
    alerts_file: str
    triage_file: Optional[str] = None  # the store's triage file, applied with the input
    # what the configs check that no run in the store has reported (``pipeline.check_configs.unreported``), once
    # the store holds what the replay brought
    unreported: List[str] = dataclasses.field(default_factory=list)
    files_not_read: int = 0  # replayed into the store before, unchanged since (``sinks.replayed_files``)
    files_read_in_part: int = 0  # logs that grew, read from where the last replay stopped
    bytes_not_read: int = 0  # of both

    def render(self) -> str:
        c, rows = self.counters, self.rows_added
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.alerts_by_kind.items())) or "none"
        return "\n".join([
            f"trainguard: replayed {len(self.input_files)} file(s) in {self.seconds:.1f} s",
            f"  messages read     {c['messages_read']:>8}  (of runs already in the store: "
            f"{c['messages_of_stored_runs']})",
            *([f"  not read again    {self.files_not_read:>8}  file(s), and {self.files_read_in_part} in part: "
               f"{self.bytes_not_read / 1e6:,.1f} MB replayed into this store before (--reread_files reads them)"]
              if self.bytes_not_read else []),
            f"  runs finalized    {c['runs_finalized']:>8}",
            "  rows written      " + ", ".join(f"{t} +{n}" for t, n in rows.items()),
            f"  alerts raised     {rows['alerts']:>8}  ({kinds})",
            f"  dead letters      {rows['dead_letter']:>8}",
            f"  store: {self.store}   alerts: {self.alerts_file}"
            + (f"   triage applied: {self.triage_file}" if self.triage_file else ""),
        ])


@dataclasses.dataclass(frozen=True)
class ProgressTiming:
    """When the progress line shows, in seconds since the replay started or between lines."""
    quiet: float = PROGRESS_QUIET_SECONDS    # nothing before: a short replay (the demo) prints what it always did
    tty_every: float = 1.0                   # the line is rewritten on a terminal
    log_every: float = PROGRESS_LOG_SECONDS  # a new line when stderr is not a terminal (--progress)
    unavailable_after: float = 30.0          # nothing counted yet: the runner reads elsewhere (said once)

    @classmethod
    def from_environment(cls) -> ProgressTiming:
        """The defaults, or every interval (and the quiet start) set by ``TRAINGUARD_PROGRESS_INTERVAL``."""
        with contextlib.suppress(ValueError):
            seconds = float(os.environ.get(PROGRESS_INTERVAL_ENV, ""))
            if seconds > 0:
                return cls(quiet=seconds, tty_every=seconds, log_every=seconds)
        return cls()


def format_progress(counts: ReadCounts, total_files: int, elapsed: float, points_per_second: float) -> str:
    """The progress line: files read of all, messages and points read, the reading rate, time since the start."""
    seconds = max(0, int(elapsed))
    return (f"trainguard: files {counts.files}/{total_files}, messages {counts.messages:,}, points {counts.points:,} "
            f"({points_per_second:,.0f}/s), {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}")


def fit(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters, at the end of a comma-separated part where one ends in time."""
    if len(line) <= width:
        return line
    cut = line.rfind(", ", 0, width + 1)
    return line[:cut] if cut > 0 else line[:width]


def is_terminal(stream: Optional[IO[str]]) -> bool:
    """Whether ``stream`` (stderr: None under pythonw, or replaced) is a terminal."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressPrinter:
    """The replay's progress line on ``stream``, from a daemon thread of its own, until :meth:`stop`.

    On a terminal the line is rewritten in place (``\\r``) every ``tty_every`` seconds, and cleared by
    :meth:`stop`; elsewhere (``--progress`` forced) it is a new line every ``log_every`` seconds, and :meth:`stop`
    writes a last one with the final counts. Nothing shows in the first ``quiet`` seconds. The rate is the points
    read over the time until the counts last changed, so that it holds still while later stages run. A counter
    still untouched after ``unavailable_after`` seconds means the runner reads somewhere else: said once.
    """

    def __init__(self, counter: ProgressCounter, total_files: int, stream: IO[str], timing: ProgressTiming,
                 started: float, clock=time.monotonic):
        self.counter, self.total_files, self.stream, self.timing = counter, total_files, stream, timing
        self.started, self.clock = started, clock
        self.tty = is_terminal(stream)
        self._counts = ReadCounts()
        self._changed_at = started
        self._width = 0  # of the line on the terminal, to rewrite and clear it
        self._said_unavailable = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainguard-progress", daemon=True)

    def start(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the thread; clears the line on a terminal, else writes the final counts (once lines show)."""
        self._stopping.set()
        self._thread.join()
        now = self._sample()
        try:
            if self.tty and self._width:
                self._write("\r" + " " * self._width + "\r")
            elif not self.tty and now - self.started >= self.timing.quiet and self._counts != ReadCounts():
                self._write(self.line(now) + "\n")
        except (OSError, ValueError):  # stderr closed or gone: the progress is a nicety
            pass

    def line(self, now: float) -> str:
        reading = self._changed_at - self.started
        rate = self._counts.points / reading if reading > 0 else 0.0
        return format_progress(self._counts, self.total_files, now - self.started, rate)

    def _sample(self) -> float:
        now = self.clock()
        counts = self.counter.snapshot()
        if counts != self._counts:
            self._counts, self._changed_at = counts, now
        return now

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _run(self) -> None:
        every = self.timing.tty_every if self.tty else self.timing.log_every
        due = self.started + self.timing.quiet
        try:
            while not self._stopping.wait(max(0.001, min(every, 1.0))):  # counts sampled at least once a second
                now = self._sample()
                if now < due:
                    continue
                if self._counts == ReadCounts():
                    if now - self.started >= self.timing.unavailable_after and not self._said_unavailable:
                        self._said_unavailable = True
                        self._write("trainguard: progress unavailable on this runner\n")
                    continue
                self._show(self.line(now))
                due = now + every
        except (OSError, ValueError):  # stderr closed or gone: stop showing, let the replay go on
            pass

    def _show(self, line: str) -> None:
        if not self.tty:
            self._write(line + "\n")
            return
        line = fit(line, _columns(self.stream) - 1)  # a wrapped line could not be rewritten in place
        self._write("\r" + line + " " * (self._width - len(line)))
        self._width = max(self._width, len(line))


def _columns(stream: IO[str]) -> int:
    """The terminal's width: ``COLUMNS`` where set (as ``shutil.get_terminal_size``), else the stream's, else 80."""
    with contextlib.suppress(ValueError):
        if int(os.environ.get("COLUMNS", "")) > 0:
            return int(os.environ["COLUMNS"])
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80


@contextlib.contextmanager
def showing_progress(enabled: bool, total_files: int, started: float) -> Iterator[Optional[str]]:
    """The id of a new counter (``transforms.progress``) whose counts a :class:`ProgressPrinter` shows on stderr
    meanwhile; None, and nothing shown, when not ``enabled``."""
    if not enabled:
        yield None
        return
    counter = LocalCounter()
    progress_id = register(counter)
    printer = ProgressPrinter(counter, total_files, sys.stderr, ProgressTiming.from_environment(), started).start()
    try:
        yield progress_id
    finally:
        printer.stop()
        unregister(progress_id)


def _alert_kinds(store: DuckDBStore) -> Dict[str, int]:
    return dict(store.query("SELECT kind, count(*) FROM alerts GROUP BY kind"))


_FIRST_RUN_FROZEN = False  # see start_up_objects_frozen


@contextlib.contextmanager
def start_up_objects_frozen() -> Iterator[None]:
    """Keeps the objects made before the process's first pipeline run (modules, the graph: about a million) out
    of the garbage collector's full passes while it runs, and after: the replay's buffers make those passes
    frequent, and walking what start-up left behind was half their cost (0.2-0.3 s of a million-point replay).

    Frozen once per process, never thawed: a process that runs pipeline after pipeline (the tests, anything
    calling ``pipeline.main.main`` again) used to freeze each run's graph with the start-up objects and thaw it
    after the run, where only a full pass, which then hardly ever came, could free it: 10,000 objects and 4.7 MB
    more at each demo replay (530 MB after 60 of them). What the first run leaves stays; later runs' graphs are
    freed as any garbage is (``python -m pipeline`` freezes its imports before, ``pipeline/__main__.py``; that
    is not a run). Frozen objects are not among what ``gc.get_objects`` and ``gc.get_referrers`` see."""
    global _FIRST_RUN_FROZEN
    if not _FIRST_RUN_FROZEN:
        gc.freeze()
        _FIRST_RUN_FROZEN = True
    yield


def line_groups(files: List[str], group_mib: float, streaming: bool, group_runs: int = 0,
                spans: Optional[Spans] = None, survey: Optional[LineSurvey] = None,
                held_whole: Optional[Callable[[Optional[str]], bool]] = None,
                group_lines: int = 0) -> List[Optional[LineGroup]]:
    """The groups a replay reads its files in: one (None: every line) unless the files, all local text, hold more
    than ``group_mib`` MiB of lines a pipeline run holds whole, more than ``group_runs`` runs or more than
    ``group_lines`` lines; then about that much each, a test's lines all in one (``LineSurvey.groups``).

    Which lines a run holds whole, ``held_whole`` says by their test: those of tests with live windows, whose
    points it keeps until they are windowed (``ConfigVersions.may_have_live_windows``). Of the others it keeps
    each run's aggregates and message ids, which ``group_runs`` and ``group_lines`` bound. Without it, every line
    counts (so the survey is not needed to size by bytes).

    The files are surveyed (``survey_lines``: one pass, which counts the lines and runs, sizes each test's lines
    and places each line) only where they are over ``group_mib`` or have more lines than ``group_runs`` or
    ``group_lines`` (``count_lines``, their line feeds counted), unless ``survey`` is that pass already made. A
    pass made here sizes only (not ``exact``: a line with a doubled ``"test":`` key may be sized as another
    test's); where it finds several groups, an exact pass places the lines (one exact pass where every line counts
    and the size alone makes several). With
    ``spans`` (by real path, the bytes of each file to read: ``sinks.replayed_files``), only those are read, and
    the one group names them."""
    if streaming or not all(is_local_text(f) for f in files):
        return [None]
    size = input_bytes(files, spans)
    budget = group_mib * 2 ** 20
    over_size = group_mib > 0 and size > budget
    count = math.ceil(size / budget) if over_size and held_whole is None else 1
    surveyed = survey is not None or count > 1 or (over_size and held_whole is not None)
    if not surveyed and (group_runs > 0 or group_lines > 0):
        lines = count_lines(files, spans)
        surveyed = (group_runs > 0 and lines > group_runs) or (group_lines > 0 and lines > group_lines)
    if surveyed:
        sizing = survey or survey_lines(files, spans, exact=count > 1)
        if over_size and held_whole is not None:
            count = max(count, math.ceil(sizing.bytes_of_tests(held_whole) / budget))
        if group_runs > 0:
            count = max(count, math.ceil(sizing.runs / group_runs))
        if group_lines > 0:
            count = max(count, math.ceil(sizing.lines / group_lines))
    if count > 1:  # the lines placed by the tests the wire parser reads: exactly
        return list((sizing if sizing.exact else survey_lines(files, spans)).groups(count))
    return [None] if spans is None else [LineGroup(0, 1, {path: span for path, span in spans.items()})]


def input_bytes(files: List[str], spans: Optional[Spans] = None) -> int:
    """The bytes a replay reads of its local files: their ``spans`` where it reads parts of them, else all."""
    return sum(end - start for start, end in spans.values()) if spans else sum(os.path.getsize(f) for f in files)


SEED_FILE = "seed.bin"  # in a group's staging directory: the seed it reads, encoded (``core.encoding``)


def write_seed_file(seed: HistorySeed, staging_dir: str) -> str:
    """Writes ``seed`` where a group's pipeline reads it (``SeedFromFile``); its path."""
    path = os.path.join(staging_dir, SEED_FILE)
    with open(path, "wb") as f:
        f.write(encoding.encode(seed))
    return path


def read_seed_file(path: str) -> HistorySeed:
    with open(path, "rb") as f:
        return encoding.decode(f.read())


class SeedFromFile(beam.PTransform[beam.pvalue.PBegin, PCollection[HistorySeed]]):
    """The seed a replay's group wrote beside its staged rows -> a one-element PCollection of it.

    Not a ``Create`` of the seed: Beam pickles and compresses a ``Create``'s values into the graph, which for a
    store of 10,000 tests was a third of a rerun's time; the graph holds the file's path instead, and the
    workers of a local replay, which write the rows beside it, read it."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, pbegin):
        return (pbegin | "Path" >> beam.Create([self.path])
                | "Read" >> beam.Map(read_seed_file).with_output_types(HistorySeed))


class StagedSeed(NamedTuple):
    """A group's seed as its pipeline run reads it: written beside its staged rows, which the run decodes for
    itself, so the launching process need not hold it meanwhile (at the next night of 200,000 one-run tests, in
    groups of 25,000: 1,073 → 1,005 MiB peak)."""
    path: str
    held: FrozenSet[str]  # ``HistorySeed.held``: which of its per-key fields the graph joins


def stage_seed(seed: HistorySeed, staging_dir: str) -> StagedSeed:
    return StagedSeed(write_seed_file(seed, staging_dir), seed.held())


def _run_group(options: PipelineOptions, patterns: List[str], group: Optional[LineGroup], settings: GraphSettings,
               seed: StagedSeed, staging_dir: str):
    """One pipeline run over a group's lines (all of them for None), its rows staged under ``staging_dir``."""
    pipeline = beam.Pipeline(runner=runner_for(options), options=options)
    outputs = (pipeline
               | "ReadFiles" >> ReadReplayFiles(patterns, settings.progress_id, group)
               | "DetectRegressions" >> DetectRegressions(
                   dataclasses.replace(settings, seed_holds=seed.held), pipeline | "Seed" >> SeedFromFile(seed.path)))
    outputs | "WriteLocal" >> WriteLocal(staging_dir)
    with start_up_objects_frozen():
        result = pipeline.run()
        result.wait_until_finish()
    return result


def trainguard_version() -> str:
    """The installed pipeline's version ("unknown" from a checkout that is not installed)."""
    try:
        return importlib.metadata.version("trainguard-pipeline")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _replayed_files(store: DuckDBStore, files: List[str], loaded: LoadedConfigs,
                    local: TrainguardOptions) -> Optional[ReplayedFiles]:
    """What of ``files`` this bounded replay reads, against what the store recorded of earlier ones under the same
    configs, lifecycle and version (``sinks.replayed_files``); None (every file whole, nothing recorded) unless
    every file is local and uncompressed."""
    if not all(is_local_text(f) for f in files):
        return None
    identity = replay_identity(((name, check.digest) for name, check in loaded.checks.items()),
                               lifecycle_from(local), trainguard_version())
    return ReplayedFiles.plan(store, [os.path.realpath(f) for f in files], identity, reread=local.reread_files)


SCOPED_SEED_ABOVE_TESTS = 1_000
"""A store with runs of more tests than this is read for the tests the input names only (found in a pass over its
lines): a new run of one test among 200,000 read every test's history (45 s) before."""


def _survey_for_seed(store: DuckDBStore, files: List[str], spans: Optional[Spans],
                     local_text: bool) -> Optional[LineSurvey]:
    """The survey of ``files`` (``spans`` of them) whose tests scope the seed, where the store holds many tests;
    the same pass then sizes and places the replay's groups (``line_groups``)."""
    if local_text and files and store.stored_tests() > SCOPED_SEED_ABOVE_TESTS:
        return survey_lines(files, spans, test_limit=MAX_NAMED_TESTS)
    return None


SURVEYED_FOR_WINDOWS_BYTES = 16 * 2 ** 20
"""A replay of at most this many bytes of local lines whose configs have live windows surveys its lines for their
tests first (about 1 ms a MiB), where no survey was made for the seed: their ~8 stages take ~0.2 s to start, a
sixth of a one-message replay, and find nothing where none of those tests has live windows."""


def _survey_for_windows(configs: ConfigVersions, files: List[str], spans: Optional[Spans],
                        local_text: bool) -> Optional[LineSurvey]:
    """The survey of a small replay's lines (``SURVEYED_FOR_WINDOWS_BYTES``) that tells whether any of its tests
    has live windows (``_live_windows``); None where its configs have none or it is not small."""
    if local_text and files and configs.any_live_windows() and input_bytes(files, spans) <= SURVEYED_FOR_WINDOWS_BYTES:
        return survey_lines(files, spans)
    return None


def _live_windows(configs: ConfigVersions, survey: Optional[LineSurvey]) -> Optional[bool]:
    """``GraphSettings.live_windows`` of a replay: whether a test its lines name (``survey``, an exact one: a line
    goes with the test the wire parser reads) or a line without one may have live windows
    (``ConfigVersions.may_have_live_windows``, any version of its config or the default's); None (the configs
    decide) without a survey."""
    if survey is None or not survey.exact:
        return None
    return any(configs.may_have_live_windows(test) for test in survey.crcs)


def _read_seed(store: DuckDBStore, configs: ConfigSet, survey: Optional[LineSurvey]) -> HistorySeed:
    """The store's history for a bounded replay: of the tests its lines name where they were surveyed for it
    (``_survey_for_seed``) and name few, else whole."""
    tests = None if survey is None else survey.tests
    return store.read_seed(configs) if tests is None else store.read_seed(configs, tests)


def _seeds_by_group(survey: Optional[LineSurvey], groups: List[Optional[LineGroup]]) -> bool:
    """Whether a replay reads each group's seed for that group's tests alone, as the group comes: where its lines
    name more tests than one seed query names (``MAX_NAMED_TESTS``; the whole seed would be read) and it runs in
    groups. A whole seed of 200,000 stored tests is ~1.4 GB (every test's histories): a nightly replay of a run of
    each held it all (2,117 MiB peak), where a group's holds a group's tests (1,073 MiB)."""
    return survey is not None and survey.tests is None and len(groups) > 1


def _group_seed(store: DuckDBStore, configs: ConfigSet, survey: LineSurvey, group: LineGroup) -> HistorySeed:
    """The seed of the tests a group's lines name (``survey``'s, every test it met), read for them alone, however
    many (``MAX_NAMED_TESTS`` keeps a BigQuery query's text small; DuckDB reads the seed of 25,000 named tests of
    200,000 in about 3 s). Groups hold other tests, so the groups committed before it changed none of its rows; each query is per test
    (``sinks.seed``), so it equals the whole seed's ``of_tests`` of the group's (its open runs of other tests, which
    every scoped read takes, left out)."""
    seed = store.read_seed(configs, {test for test in survey.crcs if test is not None and group.holds(test)})
    store.close()  # (the next pipeline run's workers do not share this process's connection)
    return seed.of_tests(group.holds)


def run(argv: Optional[List[str]] = None) -> ReplaySummary:
    """Replays wire-format files through the pipeline into the local store."""
    options = PipelineOptions(argv)
    local = options.view_as(TrainguardOptions)
    pattern = local.input_files or DEMO_INPUT
    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"--input_files={pattern!r} matches no file")
    for path in files:
        if os.path.isdir(path):
            raise IsADirectoryError(f"--input_files={pattern!r} names the directory {path}: name its files, e.g. "
                                    f"--input_files={shlex.quote(os.path.join(path, '*.jsonl'))}")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"--input_files={pattern!r}: cannot read {path}")
    patterns = [pattern]
    triage_file = triage_file_for(local.local_store) if local.triage_file is None else local.triage_file
    applied = None
    if triage_file and os.path.isfile(triage_file) and os.path.abspath(triage_file) not in map(os.path.abspath, files):
        patterns.append(triage_file)
        files.append(triage_file)
        applied = triage_file
    elif local.triage_file is None and os.path.isfile(LEGACY_TRIAGE_FILE):
        print(f"trainguard: {LEGACY_TRIAGE_FILE} here is not applied: a store's triage actions are in its own file, "
              f"{triage_file} for this one (move them there to apply them)", file=sys.stderr)
    loaded = read_config_dir(local.config_dir)
    configs = loaded.strict()  # each test's dated versions, by event time
    started = time.monotonic()
    show_progress = is_terminal(sys.stderr) if local.progress is None else local.progress
    streaming = options.view_as(StandardOptions).streaming
    counters = {name: 0 for name in COUNTERS}
    rows_added: Dict[str, int] = {}
    with LocalOutputs(local.local_store, local.alerts_file) as outputs, contextlib.ExitStack() as stack:
        for note in outputs.notes:
            print(f"trainguard: {note}", file=sys.stderr)
        store = outputs.store
        kinds_before = _alert_kinds(store)
        replayed = None if streaming else _replayed_files(store, files, loaded, local)
        if replayed is not None:
            stack.enter_context(replayed)
        unread = None if replayed is None else replayed.spans()
        to_read = files if unread is None else [f for f in files if os.path.realpath(f) in unread]
        spans = unread if replayed is not None and replayed.skipped_bytes else None
        survey = _survey_for_seed(store, to_read, spans, replayed is not None)
        lines_surveyed = survey or _survey_for_windows(configs, to_read, spans, replayed is not None)
        groups = line_groups(to_read, local.replay_group_mib, streaming, local.replay_group_runs, spans,
                             lines_surveyed, configs.may_have_live_windows, local.replay_group_lines) if to_read else []
        seeds_by_group = _seeds_by_group(survey, groups)
        seed = _read_seed(store, configs.latest, survey) if groups and not seeds_by_group else HistorySeed()
        store.close()  # no step writes the store: the rows are committed after each pipeline run
        with showing_progress(show_progress and bool(groups), len(files), started) as progress_id:
            settings = GraphSettings(configs, lifecycle_from(local), streaming, progress_id,
                                     live_windows=_live_windows(configs, lines_surveyed))
            for number, group in enumerate(groups):
                if number:  # the last group's graph and buffers go before the collector is told to skip what lives
                    gc.collect()
                    crash_point("replay.between_groups")
                staging_dir = outputs.new_staging_dir()
                if seeds_by_group:
                    assert survey is not None and group is not None
                    group_seed = _group_seed(store, configs.latest, survey, group)
                else:
                    group_seed = seed if group is None or group.count == 1 else seed.of_tests(group.holds)
                last = number == len(groups) - 1
                staged_seed = stage_seed(group_seed, staging_dir)
                del group_seed  # (the group's pipeline run decodes its own copy)
                if last:
                    seed = HistorySeed()
                result = _run_group(options, patterns, group, settings, staged_seed, staging_dir)
                also = [(REPLAYED_FILES, replayed.records())] if last and replayed is not None else []
                for table, added in outputs.commit(staging_dir, also).items():
                    rows_added[table] = rows_added.get(table, 0) + added
                for counter in result.metrics().query(MetricsFilter().with_namespace("trainguard"))["counters"]:
                    if counter.key.metric.name in counters:
                        counters[counter.key.metric.name] += counter.committed or 0
                del result  # so that the next group's gc.collect frees this one's runner
        if not groups:
            rows_added = {table: 0 for table in TABLES}
            if replayed is not None:
                store.insert(REPLAYED_FILES, replayed.records())  # files of blank lines only, if any are new
        outputs.complete_alerts_file()
        kinds_after = _alert_kinds(store)
        not_reported = unreported(configs.latest, reported_metrics(store.query, DUCKDB_SQL, configs.latest.by_test))
    return ReplaySummary(
        input_files=files, counters=counters,
        rows_added=rows_added,
        alerts_by_kind={k: n - kinds_before.get(k, 0) for k, n in kinds_after.items() if n > kinds_before.get(k, 0)},
        seconds=time.monotonic() - started, store=local.local_store, alerts_file=local.alerts_file,
        triage_file=applied, unreported=not_reported,
        files_not_read=0 if replayed is None else replayed.skipped_files,
        files_read_in_part=0 if replayed is None else replayed.files_read_in_part,
        bytes_not_read=0 if replayed is None else replayed.skipped_bytes)


def run_and_report(argv: List[str]) -> None:
    """Runs the replay, prints its summary, then writes the HTML report unless ``--report_dir=`` is empty,
    and says what to do next."""
    local = PipelineOptions(argv).view_as(TrainguardOptions)
    report_dir = local.report_dir
    if report_dir is None:
        report_dir = os.path.join(os.path.dirname(local.local_store), DEFAULT_REPORT_DIR)
    with _drawers(enabled=bool(report_dir)) as drawers:
        summary = run(argv)
        print(summary.render())
        print_warnings(summary.unreported, "trainguard")
        report = _write_report(summary.store, report_dir, local.config_dir, drawers) if report_dir else None
    if report is not None:
        print(f"  report: {report}")
    print(f"  total {time.monotonic() - IMPORTED_AT:.1f} s, start-up and report included")
    print(next_steps(summary, report))


def next_steps(summary: ReplaySummary, report: Optional[str]) -> str:
    """The commands worth running after a replay, spelled for its own files and for this interpreter (the
    venv's, whether or not it is activated: ``python`` and the console scripts may be other ones)."""
    store, alerts, python = shlex.quote(summary.store), shlex.quote(summary.alerts_file), interpreter()
    triage = "trainguard-triage" if python == "python" else f"{python} -m pipeline.triage"
    lines = ["next:"]
    if report and report.endswith(".html"):
        lines.append(f"  {python} -m webbrowser -t {shlex.quote(report)}   # the pictures and the alert list")
    lines += [
        f"  {triage} list --state open --local_store={store}   # accept, dismiss or mute what fired",
        f"  {python} -m notifier --config {shlex.quote(os.path.relpath(EXAMPLE_EMAIL_CONFIG))} --alerts_file={alerts} "
        "--dry_run --once   # the e-mails, rendered to files",
    ]
    if summary.rows_added.get("dead_letter"):
        query = (f"import duckdb; duckdb.connect({json.dumps(summary.store)}, read_only=True)"
                 '.sql("SELECT reason, source, payload FROM dead_letter").show()')
        lines.append(f"  {python} -c {shlex.quote(query)}   # the dead letters: why, and the raw payload")
    return "\n".join(lines)


def interpreter() -> str:
    """How to call this Python in a shell here: ``python`` when that is it (an activated venv: its console
    scripts are on the PATH too), else its path, relative to the working directory when it lies below it
    (``.venv/bin/python``), quoted."""
    on_path = shutil.which("python")
    if on_path and os.path.abspath(on_path) == os.path.abspath(sys.executable):
        return "python"
    relative = os.path.relpath(sys.executable)
    return shlex.quote(relative if not relative.startswith(os.pardir) else sys.executable)


@contextlib.contextmanager
def _drawers(enabled: bool) -> Iterator[Optional[Any]]:
    """The report's drawing processes, started now so that they load matplotlib on a core the replay leaves
    idle; None without a report or without the report extra."""
    if not enabled or importlib.util.find_spec("matplotlib") is None:
        yield None
        return
    from report.cli import Drawers
    try:
        drawers = Drawers.for_this_machine()
    except (OSError, RuntimeError):  # no processes to be had here: the report draws in this one
        yield None
        return
    with drawers:
        yield drawers


def _write_report(store: str, report_dir: str, config_dir: str, drawers: Optional[Any] = None) -> str:
    try:
        from report import write_report  # the report is a tool of its own, with its own extra
        return write_report(store, report_dir, config_dir=config_dir, drawers=drawers)
    except ImportError as e:  # an install without the report extra
        return f"skipped ({e})"
