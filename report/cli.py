"""``python -m report``: pictures of the history in a store, and one ``index.html`` linking them.

::

    python -m report --local_store=trainguard.duckdb --out_dir=trainguard-report/
    python -m report --bigquery_project=P --bigquery_dataset=D --out_dir=trainguard-report/
    python -m report ... --run=RUN_ID --copy_to='gs://models/{test}/{run}/trainguard'

The run pictures draw the bounds of the live window checks in ``--config_dir`` (the pipeline's configs).

:func:`write_report` is the same for a DuckDB file, from Python (the end of ``python -m pipeline``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import difflib
import logging
import multiprocessing
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Dict, Iterable, List, Optional, Sequence

from core import locations
from core.config import ConfigSet, load_config_dir
from report import page
from report.data import ReportData, ReportSettings, prepare_report
from report.publish import copy_run_pictures
from report.source import ReportSource, bigquery_source, duckdb_source
from sinks.stores import add_store_options
from trainguard.cli import DASHES_NOTE, RUNTIME_ERROR, USAGE_ERROR, StrictArgumentParser, cloud_failure, fail

PROG = "python -m report"
logger = logging.getLogger(__name__)

LONG_REPORT = 40  # figures from which a progress bar shows (on a terminal)
CHUNK = 16        # figures per task of a worker (and between progress updates); layouts are reused within one
MAX_AUTO_JOBS = 4  # --jobs=0 (auto): one process per core up to this, for long reports only


class UnknownTestError(ValueError):
    """A ``--test`` that names no test of the store: one line naming the nearest, or the known ones."""


def check_tests(wanted: Sequence[str], known: Sequence[str], label: str) -> None:
    """Raises :class:`UnknownTestError` for the first wanted test the store does not hold."""
    for test in wanted:
        if test not in known:
            nearest = difflib.get_close_matches(test, known, n=1)
            hint = (f"did you mean {nearest[0]!r}?" if nearest
                    else f"known tests: {', '.join(known[:20]) or 'none'}{' ...' if len(known) > 20 else ''}")
            raise UnknownTestError(f"--test={test} matches no test in {label}; {hint}")


@dataclasses.dataclass
class ReportResult:
    """What a report run wrote, and where its time went (seconds per phase)."""
    index: str
    figures: Dict[str, List[str]]  # relative path -> panel titles, in order
    copies: List[str]
    timings: Dict[str, float]

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


class NoBar:
    """What :func:`progress_bar` returns when there is no bar."""

    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: Optional[bool]):
    """A tqdm bar on stderr when enabled (None: for long reports on a terminal), else a :class:`NoBar`."""
    if enabled is None:
        enabled = total >= LONG_REPORT and sys.stderr.isatty()
    if not enabled:
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety: tqdm is in the report extra, not required
        return NoBar()
    return tqdm(total=total, desc="trainguard report", unit="figure", file=sys.stderr)


def render_chunk(tasks: Sequence[tuple]) -> List[List[str]]:
    """Draws (kind, data, path) figures; a top-level function so that worker processes can run it."""
    try:
        from report import plots  # matplotlib only where figures are drawn
    except ImportError as e:
        raise ImportError(f"the report needs matplotlib: pip install 'trainguard[report]' ({e})") from e
    return plots.render_batch(tasks)


def worker_context():
    """Fresh worker processes (forkserver, else spawn): forking a process whose client libraries
    (DuckDB, gRPC) may hold threads is not safe.

    The fork server imports the drawing code once (matplotlib: half a second of CPU), and each worker forked
    from it starts with it imported; without a preload list it would import the main script instead (some are
    scripts that import Beam), and each worker matplotlib again."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["report.cli", "report.plots"])  # an ImportError is the server's to ignore
    return context


def _import_plots() -> None:
    """A drawing worker's start: matplotlib and its fonts loaded before the first figure is asked for."""
    with contextlib.suppress(ImportError):  # render_chunk says what is missing, when a figure is asked for
        from report import plots
        plots.warm_up()


def _ready() -> None:
    """A task that makes the pool start a worker now."""


class Drawers:
    """Worker processes that draw the report's figures, started ahead of the report.

    ``python -m pipeline`` starts them before its pipeline runs: the replay keeps one core busy, so the
    workers' start-up and matplotlib import happen on the other, and the figures are then drawn on
    every core. Use as a context manager, or :meth:`close` when done.
    """

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=worker_context(),
                                                            initializer=_import_plots)
        for _ in range(jobs):  # a pool of fresh processes starts a worker per task waiting
            self._pool.submit(_ready)

    @classmethod
    def for_this_machine(cls) -> Drawers:
        return cls(min(os.cpu_count() or 1, MAX_AUTO_JOBS))

    def draw(self, chunks: Sequence[Sequence[tuple]]) -> List[List[List[str]]]:
        """Each chunk's panel titles; drawn here if the workers are gone (a pool whose process died)."""
        try:
            return list(self._pool.map(render_chunk, chunks))
        except BrokenProcessPool as e:
            logger.warning("report: the drawing processes failed (%s); drawing in this one", e)
            return [render_chunk(chunk) for chunk in chunks]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Drawers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def draw_figures(data: ReportData, out_dir: str, jobs: int, progress: Optional[bool],
                 drawers: Optional[Drawers] = None) -> Dict[str, List[str]]:
    """Every figure of the report as a PNG under ``out_dir``; returns their panel titles by path.

    ``drawers``: started workers to draw on (``jobs`` is then theirs); else ``jobs`` new processes
    (0: auto, one per core for long reports), or this one."""
    files = list(page.figure_files(data))
    for _, _, relative in files:
        os.makedirs(os.path.dirname(os.path.join(out_dir, relative)), exist_ok=True)
    tasks = [(kind, item, os.path.join(out_dir, relative)) for kind, item, relative in files]
    if drawers is not None:
        jobs = drawers.jobs
    else:
        jobs = jobs or (min(os.cpu_count() or 1, MAX_AUTO_JOBS) if len(tasks) >= LONG_REPORT else 1)
    size = max(1, min(CHUNK, -(-len(tasks) // jobs)))  # every worker gets a share of a short report
    chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    bar = progress_bar(len(tasks), progress)
    titles: List[List[str]] = []
    results: Iterable[List[List[str]]]
    with contextlib.ExitStack() as stack:
        if drawers is not None and chunks:
            results = drawers.draw(chunks)
        elif jobs > 1 and len(chunks) > 1:
            pool = concurrent.futures.ProcessPoolExecutor(min(jobs, len(chunks)), mp_context=worker_context())
            results = stack.enter_context(pool).map(render_chunk, chunks)
        else:
            results = map(render_chunk, chunks)
        for chunk, chunk_titles in zip(chunks, results):
            titles += chunk_titles
            bar.update(len(chunk))
    bar.close()
    return {relative: t for (_, _, relative), t in zip(files, titles)}


def write_index(data: ReportData, out_dir: str, source_label: str) -> str:
    """Writes ``index.html`` (replacing any earlier one at once); returns its path."""
    path = os.path.join(out_dir, "index.html")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(page.index_html(data, source_label))
    os.replace(path + ".tmp", path)
    return path


def build_report(source: ReportSource, out_dir: str, settings: ReportSettings, source_label: str,
                 configs: ConfigSet, jobs: int = 1, progress: Optional[bool] = False,
                 copy_to: Optional[str] = None, drawers: Optional[Drawers] = None) -> ReportResult:
    """Reads the rows, prepares (with ``configs``: the tests' live window checks), draws (``jobs`` processes,
    0: auto; or the started ``drawers``), writes the page, copies the pictures."""
    timings = {}
    started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        timings[name] = now - started
        started = now

    try:
        rows = source.jobs(), source.metrics(), source.windows(), source.alerts()
        actions = source.triage_actions()
    finally:
        source.close()
    lap("read")
    check_tests(settings.tests, sorted({row.test for table in rows[:3] for row in table}), source_label)
    data = prepare_report(*rows, settings, configs, actions)
    lap("prepare")
    os.makedirs(out_dir, exist_ok=True)
    figures = draw_figures(data, out_dir, jobs, progress, drawers)
    lap("draw")
    index = write_index(data, out_dir, source_label)
    copies = []
    if copy_to:
        copies = copy_run_pictures(((p.test, p.run, os.path.join(out_dir, page.run_file(p.test, p.run)))
                                    for s in data.sections for p in s.pictures), copy_to)
    lap("write")
    return ReportResult(index, figures, copies, timings)


def write_report(store_path: str, out_dir: str, settings: Optional[ReportSettings] = None,
                 config_dir: str = locations.CONFIG_DIR, drawers: Optional[Drawers] = None) -> str:
    """The report of a DuckDB store in ``out_dir``, with the checks of the configs in ``config_dir`` (those the
    pipeline ran with), drawn by ``drawers`` if given; returns the path of its ``index.html``."""
    configs = load_config_dir(config_dir)
    source = duckdb_source(store_path)
    return build_report(source, out_dir, settings or ReportSettings(), store_path, configs,
                        drawers=drawers).index


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = StrictArgumentParser(
        prog=PROG, epilog=DASHES_NOTE + " --out is the former name of --out_dir.",
        description="Pictures of the history in a trainguard store (a DuckDB file or a BigQuery dataset): metric "
                    "history per test, each run's curves against the bounds their live window checks used, a "
                    "status grid, and one index.html linking them with the alerts. See docs/report.md.")
    source = p.add_argument_group("source (a DuckDB store, or a BigQuery dataset when --bigquery_dataset is set)")
    add_store_options(source)
    source.add_argument("--since", default=None, metavar="YYYY-MM-DD",
                        help="Only rows from this UTC day on (default: all).")
    source.add_argument("--config_dir", default=locations.CONFIG_DIR,
                        help="Directory of the per-test JSON configs the pipeline runs with: the live window "
                             "checks whose bounds the run pictures draw (default: %(default)s).")
    what = p.add_argument_group("what to draw")
    what.add_argument("--out_dir", "--out", default=locations.REPORT_DIR,
                      help="Directory of the PNG files and index.html (default: %(default)s).")
    what.add_argument("--test", action="append", default=[],
                      help="Only this test (repeatable; default: all); a test the store does not hold is an error.")
    what.add_argument("--run", action="append", default=[], help="Also draw this run, however old (repeatable).")
    what.add_argument("--runs_per_test", type=non_negative, default=5,
                      help="Latest runs of each test with a picture; 0: all (default: %(default)s).")
    what.add_argument("--days", type=at_least_one, default=30,
                      help="Days in the status grid (default: %(default)s).")
    what.add_argument("--max_alerts", type=non_negative, default=200,
                      help="Rows of the alert list (default: %(default)s).")
    out = p.add_argument_group("output")
    out.add_argument("--copy_to", default=None, metavar="PATH",
                     help="Also copy each run's picture, as <run>.png, to PATH, a local directory or "
                          "gs://bucket/prefix. {test} and {run} in PATH become the test and run ids as they are; "
                          "without them the files go to PATH/<test>/<run>/. Only what cannot stay one path "
                          "component is percent-escaped: '/', '\\', '%%', control characters, and the ids '.' "
                          "and '..' (a/b -> a%%2Fb); an id over 200 bytes is cut and followed by a digest.")
    out.add_argument("--jobs", type=non_negative, default=0,
                     help=f"Processes drawing figures; 0: one per core, at most {MAX_AUTO_JOBS}, for reports of "
                          f"{LONG_REPORT} figures or more (default: 0).")
    out.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="Always show a progress bar (default: for long reports, on a terminal).")
    out.add_argument("--no_progress", dest="progress", action="store_false", help="Never show a progress bar.")
    return p


def settings_from(args: argparse.Namespace) -> ReportSettings:
    return ReportSettings(runs_per_test=args.runs_per_test, extra_runs=tuple(args.run), days=args.days,
                          tests=tuple(args.test), max_alerts=args.max_alerts)


def open_source(args: argparse.Namespace):
    """(source, label) from the options."""
    if args.bigquery_dataset:
        source = bigquery_source(args.bigquery_project, args.bigquery_dataset, args.bigquery_endpoint, args.since,
                                 args.bigquery_timeout_seconds)
        return source, f"BigQuery {args.bigquery_project or '(default project)'}.{args.bigquery_dataset}"
    return duckdb_source(args.local_store, args.since), args.local_store


def run(argv: Optional[List[str]] = None) -> ReportResult:
    args = parser().parse_args(argv)
    configs = load_config_dir(args.config_dir)
    source, label = open_source(args)
    return build_report(source, args.out_dir, settings_from(args), label, configs, jobs=args.jobs,
                        progress=args.progress, copy_to=args.copy_to)


def main(argv: Optional[List[str]] = None) -> int:
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    except (FileNotFoundError, ImportError, ValueError) as e:
        return fail(PROG, str(e), USAGE_ERROR)
    except Exception as e:
        line = cloud_failure(e)
        if line is None:
            raise
        return fail(PROG, line, RUNTIME_ERROR)
    copies = f", {len(result.copies)} copied" if result.copies else ""
    print(f"trainguard: report of {len(result.figures)} figures{copies} in {result.seconds:.1f} s: {result.index}")
    return 0
