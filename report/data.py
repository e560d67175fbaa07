"""What the report shows, as plain data: no matplotlib and no I/O (``plots.py`` draws it).

- Metric history panels (:func:`metric_panels`): one per metric, the values over runs with the bounds each
  value was checked against, ordered so that metrics whose latest value is out of bounds come first.
- Per-run pictures (:func:`run_picture`): each windowed tag's curve against the training step, with the
  step-aligned band of the earlier successful runs (:func:`step_aligned_band`) and the alert windows.
- The status grid (:func:`status_grid`): tests x days, the latest run of each day.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from core.stats import mean_and_pstdev
from core.window_checks import NUMERIC_AGGREGATIONS, FinishedRun, WindowResult, step_aligned_history
from report.source import CURVE_AGGREGATIONS, AlertRecord, JobRow, MetricRow
from trainguard.wire import STATUS_SUCCESS

RUNNING = "running"              # windows but no job_history row yet: a live run
OUT_OF_BOUNDS = "out_of_bounds"  # a successful run with a metric or a window out of bounds
NO_RUN = "no_run"                # a day without a run
GRID_STATES = (NO_RUN, STATUS_SUCCESS, OUT_OF_BOUNDS, "failure", "timeout", "missing")
WINDOW_ALERT = "window_out_of_bounds"
MIN_BAND_RUNS = 2                # one earlier run gives a line, not a band
DAY_SECONDS = 86400

WindowKey = Tuple[str, str]  # (tag, window kind)


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """What goes into a report (the command line's options)."""
    band_stddevs: float = 2.0         # k of the mean +- k*std band
    band_runs: int = 10               # earlier successful runs behind a band; 0: all
    runs_per_test: int = 5            # latest runs of each test with a picture; 0: all
    extra_runs: Tuple[str, ...] = ()  # run ids that get a picture whatever their age
    days: int = 30                    # columns of the status grid
    tests: Tuple[str, ...] = ()       # only these tests; (): all
    max_alerts: int = 200             # rows of the alert list


def safe_name(name: str, max_chars: int = 48) -> str:
    """A file name for any test or run name: [A-Za-z0-9._-] only, never hidden, unique per name.

    The readable part may collide ("a/b" and "a_b"), so a digest of the exact name follows it.
    """
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:max_chars]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}-{digest}" if readable else digest


def short_label(text: str, limit: int) -> str:
    """``text`` for a figure: non-printable characters as "?", at most ``limit`` characters ("…" marks a cut)."""
    printable = "".join(c if c.isprintable() else "?" for c in text)
    return printable if len(printable) <= limit else printable[:limit - 1] + "…"


# --------------------------------------------------------------------------
# Metric history
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HistoryPoint:
    """One run's value of a metric."""
    run: str
    time: float  # run end
    value: float
    lower: Optional[float]
    upper: Optional[float]
    within: Optional[bool]
    status: str

    @property
    def out_of_bounds(self) -> bool:
        return self.within is False


@dataclasses.dataclass(frozen=True)
class MetricPanel:
    """One metric of a test over its runs, in run-end order."""
    metric: str
    points: Tuple[HistoryPoint, ...]

    @property
    def latest_out_of_bounds(self) -> bool:
        return bool(self.points) and self.points[-1].out_of_bounds


@dataclasses.dataclass(frozen=True)
class BoundLines:
    """A panel's bounds, point by point (NaN where a line has no value).

    Where both bounds exist they form a band (``band_lower``..``band_upper``); where only one
    does it is a dashed line (``lower_only`` or ``upper_only``).
    """
    band_lower: Tuple[float, ...]
    band_upper: Tuple[float, ...]
    lower_only: Tuple[float, ...]
    upper_only: Tuple[float, ...]


def bound_lines(points: Sequence[HistoryPoint]) -> BoundLines:
    """Splits each point's bounds into the band (both sides) and the one-sided lines."""
    nan = math.nan
    both = [p.lower is not None and p.upper is not None for p in points]
    return BoundLines(
        band_lower=tuple(p.lower if b else nan for p, b in zip(points, both)),
        band_upper=tuple(p.upper if b else nan for p, b in zip(points, both)),
        lower_only=tuple(p.lower if p.lower is not None and not b else nan for p, b in zip(points, both)),
        upper_only=tuple(p.upper if p.upper is not None and not b else nan for p, b in zip(points, both)))


def panel_order(panel: MetricPanel) -> Tuple[bool, str]:
    """Panels whose latest value is out of bounds first, then by metric name."""
    return not panel.latest_out_of_bounds, panel.metric


def metric_panels(metrics: Iterable[MetricRow], status_by_run: Mapping[str, str]) -> List[MetricPanel]:
    """One panel per metric of one test's rows, in :func:`panel_order`."""
    by_metric: Dict[str, List[HistoryPoint]] = collections.defaultdict(list)
    for m in metrics:
        by_metric[m.metric].append(HistoryPoint(m.run, m.time, m.value, m.lower, m.upper, m.within,
                                                status_by_run.get(m.run, RUNNING)))
    panels = [MetricPanel(metric, tuple(sorted(points, key=lambda p: (p.time, p.run))))
              for metric, points in by_metric.items()]
    return sorted(panels, key=panel_order)


def value_range(panel: MetricPanel) -> Tuple[float, float]:
    """The y-range of a history panel: its values and bounds."""
    values = [v for p in panel.points for v in (p.value, p.lower, p.upper) if v is not None and math.isfinite(v)]
    return padded(min(values), max(values)) if values else (0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Incident:
    """A run that did not succeed, marked across every history panel of its test."""
    run: str
    time: float
    status: str  # failure, timeout or missing


def incidents(jobs: Iterable[JobRow]) -> Tuple[Incident, ...]:
    return tuple(sorted((Incident(j.run, j.end, j.status) for j in jobs if j.status != STATUS_SUCCESS),
                        key=lambda i: (i.time, i.run)))


# --------------------------------------------------------------------------
# Per-run curves against the step-aligned band
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunWindows:
    """One run's windows by (tag, kind), with what orders it among the test's runs."""
    run: str
    status: str
    end: float
    finalized: float  # inf for a run still running
    windows: Mapping[WindowKey, Tuple[WindowResult, ...]]

    @property
    def order(self) -> Tuple[float, str]:
        """The history order of the README: finalization time, ties by run id."""
        return self.finalized, self.run


@dataclasses.dataclass(frozen=True)
class Band:
    """mean +- k*std of the same-step windows of earlier successful runs."""
    mean: float
    lower: float
    upper: float
    runs: int


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """One window of the run."""
    start_step: int
    end_step: int
    value: float
    band: Optional[Band]

    @property
    def step(self) -> float:
        """Where the window is drawn: the middle of its steps."""
        return (self.start_step + self.end_step) / 2


@dataclasses.dataclass(frozen=True)
class Curve:
    """One tag of one run, against the step."""
    tag: str
    kind: str
    aggregation: str
    points: Tuple[CurvePoint, ...]
    alert_spans: Tuple[Tuple[int, int], ...]   # steps of the windows that raised window_out_of_bounds
    limits: Optional[Tuple[float, float]] = None  # y-range shared by the test's pictures of this tag

    @property
    def key(self) -> WindowKey:
        return self.tag, self.kind


@dataclasses.dataclass(frozen=True)
class RunPicture:
    """Everything drawn for one run."""
    test: str
    run: str
    status: str
    end: float
    curves: Tuple[Curve, ...]  # alerting tags first, then by tag


def run_windows(windows: Iterable[WindowResult], jobs: Mapping[str, JobRow]) -> List[RunWindows]:
    """One test's windows grouped by run, in history order; runs without a job row are running."""
    grouped: Dict[str, Dict[WindowKey, List[WindowResult]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for w in windows:
        grouped[w.run][(w.tag, w.kind)].append(w)
    runs = []
    for run, by_key in grouped.items():
        job = jobs.get(run)
        end = job.end if job else max(w.end_time for ws in by_key.values() for w in ws)
        runs.append(RunWindows(run, job.status if job else RUNNING, end, job.finalized if job else math.inf,
                               {key: tuple(sorted(ws, key=lambda w: w.index)) for key, ws in by_key.items()}))
    return sorted(runs, key=lambda r: r.order)


def curve_aggregation(windows: Sequence[WindowResult]) -> Optional[str]:
    """The first of mean, p50, last that every window has (None: no curve can be drawn)."""
    for aggregation in CURVE_AGGREGATIONS:
        if windows and all(aggregation in w.values for w in windows):
            return aggregation
    return None


def step_aligned_band(window: WindowResult, earlier: Sequence[Tuple[str, Sequence[WindowResult]]],
                      aggregation: str, k: float) -> Optional[Band]:
    """mean +- k*std over the earlier runs of the window overlapping ``window``'s steps the most.

    The same alignment as the live ``step_aligned`` check (``core.window_checks``). None with
    fewer than ``MIN_BAND_RUNS`` earlier runs.
    """
    usable = [FinishedRun(run, [w for w in ws if aggregation in w.values]) for run, ws in earlier]
    values, _ = step_aligned_history(window, usable, aggregation)
    if len(values) < MIN_BAND_RUNS:
        return None
    mean, std = mean_and_pstdev(values)
    return Band(mean, mean - k * std, mean + k * std, len(values))


def alert_tag(metric: Optional[str], tags: Iterable[str]) -> Optional[str]:
    """The tag of a window alert's metric (``<tag>_<aggregation>``); the longest tag that fits."""
    if not metric:
        return None
    fitting = [t for t in tags if metric.startswith(t + "_") and metric[len(t) + 1:] in NUMERIC_AGGREGATIONS]
    return max(fitting, key=len, default=None)


def alert_spans(alerts: Iterable[AlertRecord], key: WindowKey, tags: Iterable[str]) -> Tuple[Tuple[int, int], ...]:
    """The step ranges of one run's window alerts on (tag, kind), from their ``details.window``."""
    tags = tuple(tags)
    spans = set()
    for alert in alerts:
        window = alert.details.get("window")
        if alert.kind != WINDOW_ALERT or not isinstance(window, dict) or alert_tag(alert.metric, tags) != key[0]:
            continue
        start, end = window.get("start_step"), window.get("end_step")
        if window.get("kind", key[1]) == key[1] and isinstance(start, int) and isinstance(end, int):
            spans.add((start, end))
    return tuple(sorted(spans))


def earlier_successful(runs: Sequence[RunWindows], position: int, key: WindowKey,
                       band_runs: int) -> List[Tuple[str, Sequence[WindowResult]]]:
    """The last ``band_runs`` (0: all) successful runs before ``runs[position]`` with windows on ``key``."""
    earlier = [(r.run, r.windows[key]) for r in runs[:position]
               if r.status == STATUS_SUCCESS and key in r.windows]
    return earlier[-band_runs:] if band_runs > 0 else earlier


def run_curve(runs: Sequence[RunWindows], position: int, key: WindowKey, alerts: Sequence[AlertRecord],
              settings: ReportSettings) -> Optional[Curve]:
    """The curve of ``runs[position]`` on ``key``; None when its windows carry no steps or no value."""
    windows = [w for w in runs[position].windows[key] if w.start_step is not None and w.end_step is not None]
    aggregation = curve_aggregation(windows)
    if aggregation is None:
        return None
    earlier = earlier_successful(runs, position, key, settings.band_runs)
    points = tuple(CurvePoint(w.start_step, w.end_step, w.values[aggregation],
                              step_aligned_band(w, earlier, aggregation, settings.band_stddevs))
                   for w in sorted(windows, key=lambda w: (w.start_step, w.end_step, w.index)))
    tags = {tag for tag, _ in runs[position].windows}
    return Curve(key[0], key[1], aggregation, points, alert_spans(alerts, key, tags))


def run_picture(test: str, runs: Sequence[RunWindows], position: int, alerts: Sequence[AlertRecord],
                settings: ReportSettings) -> RunPicture:
    """The curves of one run (only its own alerts are passed in)."""
    run = runs[position]
    curves = [c for c in (run_curve(runs, position, key, alerts, settings) for key in run.windows) if c]
    curves.sort(key=lambda c: (not c.alert_spans, c.tag, c.kind))
    return RunPicture(test, run.run, run.status, run.end, tuple(curves))


def curve_values(curve: Curve) -> List[float]:
    """Every y value a curve's panel shows: the windows and the band edges."""
    values = [p.value for p in curve.points]
    values += [edge for p in curve.points if p.band for edge in (p.band.lower, p.band.upper)]
    return [v for v in values if math.isfinite(v)]


def padded(lo: float, hi: float, fraction: float = 0.05, flat: Optional[float] = None) -> Tuple[float, float]:
    """A range with a margin; a flat range (lo == hi) gets ``flat`` on each side (default: 5% of it, or 1)."""
    pad = (hi - lo) * fraction or (flat if flat is not None else abs(hi) * fraction) or 1.0
    return lo - pad, hi + pad


def step_range(picture: RunPicture) -> Tuple[float, float]:
    """The x-range of a run's panels: every window's steps."""
    steps = [s for c in picture.curves for p in c.points for s in (p.start_step, p.end_step)] or [0]
    return padded(min(steps), max(steps), 0.02)


def shared_limits(pictures: Sequence[RunPicture]) -> List[RunPicture]:
    """The pictures with one y-range per (tag, kind) across all of them, so that runs compare at a glance."""
    values: Dict[WindowKey, List[float]] = collections.defaultdict(list)
    for picture in pictures:
        for curve in picture.curves:
            values[curve.key] += curve_values(curve)
    limits = {key: padded(min(v), max(v)) for key, v in values.items() if v}
    return [dataclasses.replace(p, curves=tuple(dataclasses.replace(c, limits=limits.get(c.key))
                                                for c in p.curves)) for p in pictures]


def runs_to_draw(runs: Sequence[RunWindows], settings: ReportSettings) -> List[int]:
    """Positions of the runs that get a picture, latest first: the last ``runs_per_test`` and ``extra_runs``."""
    latest = list(range(len(runs) - 1, -1, -1))
    chosen = set(latest[:settings.runs_per_test] if settings.runs_per_test > 0 else latest)
    chosen |= {i for i, r in enumerate(runs) if r.run in settings.extra_runs}
    return sorted(chosen, reverse=True)


# --------------------------------------------------------------------------
# One test, the status grid, the alert list
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReportSection:
    """Everything the report shows about one test."""
    test: str
    panels: Tuple[MetricPanel, ...]
    incidents: Tuple[Incident, ...]
    pictures: Tuple[RunPicture, ...]       # latest run first
    windowed_tags: Tuple[str, ...]         # tags with live windows (per-run curves)
    curveless_metrics: Tuple[str, ...]     # metrics of tags without windows: history only
    notes: Tuple[str, ...] = ()            # windowed tags that still cannot be drawn, and why

    @property
    def slug(self) -> str:
        return safe_name(self.test)


def curveless_notes(pictures: Sequence[RunPicture], runs: Sequence[RunWindows]) -> Tuple[str, ...]:
    """Windowed tags with no curve in any picture: no steps reported, or no mean/p50/last aggregation."""
    drawn = {c.key for p in pictures for c in p.curves}
    keys = sorted({key for r in runs for key in r.windows} - drawn)
    return tuple(f"{tag} ({kind} windows): no curve, the windows carry no steps or none of "
                 f"{', '.join(CURVE_AGGREGATIONS)}" for tag, kind in keys)


def section_for_test(test: str, jobs: Sequence[JobRow], metrics: Sequence[MetricRow],
                     windows: Sequence[WindowResult], alerts: Sequence[AlertRecord],
                     settings: ReportSettings) -> ReportSection:
    """One test's panels and pictures from its rows."""
    jobs_by_run = {j.run: j for j in jobs}
    runs = run_windows(windows, jobs_by_run)
    alerts_by_run: Dict[str, List[AlertRecord]] = collections.defaultdict(list)
    for alert in alerts:
        alerts_by_run[alert.run].append(alert)
    pictures = shared_limits([run_picture(test, runs, i, alerts_by_run[runs[i].run], settings)
                              for i in runs_to_draw(runs, settings)])
    tags = tuple(sorted({tag for r in runs for tag, _ in r.windows}))
    panels = metric_panels(metrics, {j.run: j.status for j in jobs})
    curveless = tuple(p.metric for p in panels if not any(p.metric.startswith(t + "_") for t in tags))
    return ReportSection(test, tuple(panels), incidents(jobs), tuple(pictures), tags, tuple(sorted(curveless)),
                      curveless_notes(pictures, runs))


def time_range(section: ReportSection) -> Tuple[float, float]:
    """The x-range (run end, seconds) of a test's history panels: every value and incident."""
    times = [p.time for panel in section.panels for p in panel.points] + [i.time for i in section.incidents]
    return padded(min(times), max(times), 0.03, flat=DAY_SECONDS / 2) if times else (0.0, DAY_SECONDS)


@dataclasses.dataclass(frozen=True)
class StatusGrid:
    """tests x days: the state of the latest run of each day (``GRID_STATES``) and its run id."""
    tests: Tuple[str, ...]
    days: Tuple[int, ...]  # days since the epoch (UTC)
    states: Tuple[Tuple[str, ...], ...]
    runs: Tuple[Tuple[Optional[str], ...], ...]


def out_of_bounds_runs(metrics: Iterable[MetricRow], alerts: Iterable[AlertRecord]) -> Set[Tuple[str, str]]:
    """(test, run) with a metric out of bounds or a window alert."""
    runs = {(m.test, m.run) for m in metrics if m.within is False}
    return runs | {(a.test, a.run) for a in alerts if a.kind == WINDOW_ALERT}


def run_state(job: JobRow, out_of_bounds: Set[Tuple[str, str]]) -> str:
    """A run's cell: its status, or ``out_of_bounds`` for a success with a metric out of bounds."""
    if job.status == STATUS_SUCCESS and (job.test, job.run) in out_of_bounds:
        return OUT_OF_BOUNDS
    return job.status


def status_grid(jobs: Sequence[JobRow], out_of_bounds: Set[Tuple[str, str]], days: int) -> StatusGrid:
    """At most the last ``days`` days up to the latest run's day (none before the first run's day).

    Each cell holds the day's latest run (by end time, then run id).
    """
    tests = tuple(sorted({j.test for j in jobs}))
    if not jobs:
        return StatusGrid(tests, (), (), ())
    first_day, last_day = (int(f(j.end for j in jobs) // DAY_SECONDS) for f in (min, max))
    columns = tuple(range(max(first_day, last_day - days + 1), last_day + 1))
    latest: Dict[Tuple[str, int], JobRow] = {}
    for job in sorted(jobs, key=lambda j: (j.end, j.run)):
        latest[(job.test, int(job.end // DAY_SECONDS))] = job
    cells = [[latest.get((test, day)) for day in columns] for test in tests]
    return StatusGrid(tests, columns,
                      tuple(tuple(run_state(j, out_of_bounds) if j else NO_RUN for j in row) for row in cells),
                      tuple(tuple(j.run if j else None for j in row) for row in cells))


def alert_list(alerts: Sequence[AlertRecord], limit: int) -> Tuple[Tuple[AlertRecord, ...], int]:
    """The latest ``limit`` alerts, latest first, and how many were left out."""
    ordered = sorted(alerts, key=lambda a: (-(a.created_at or 0.0), a.test, a.run, a.alert_id))
    return tuple(ordered[:limit]), max(0, len(ordered) - limit)


@dataclasses.dataclass(frozen=True)
class ReportData:
    """The whole report, ready to draw and to write out."""
    sections: Tuple[ReportSection, ...]
    grid: StatusGrid
    alerts: Tuple[AlertRecord, ...]
    alerts_left_out: int
    run_count: int  # runs in job_history (of the selected tests)


def prepare_report(jobs: Sequence[JobRow], metrics: Sequence[MetricRow], windows: Sequence[WindowResult],
                   alerts: Sequence[AlertRecord], settings: ReportSettings) -> ReportData:
    """Every test's report, the status grid and the alert list from the rows of the four tables."""
    wanted = set(settings.tests)

    def by_test(rows) -> Dict[str, list]:
        grouped = collections.defaultdict(list)
        for row in rows:
            if not wanted or row.test in wanted:
                grouped[row.test].append(row)
        return grouped

    jobs_t, metrics_t, windows_t, alerts_t = by_test(jobs), by_test(metrics), by_test(windows), by_test(alerts)
    tests = sorted(set(jobs_t) | set(metrics_t) | set(windows_t))
    sections = tuple(section_for_test(t, jobs_t[t], metrics_t[t], windows_t[t], alerts_t[t], settings)
                     for t in tests)
    all_jobs = [j for t in tests for j in jobs_t[t]]
    all_alerts = [a for rows in alerts_t.values() for a in rows]
    oob = out_of_bounds_runs((m for t in tests for m in metrics_t[t]), all_alerts)
    shown, left_out = alert_list(all_alerts, settings.max_alerts)
    return ReportData(sections, status_grid(all_jobs, oob, settings.days), shown, left_out, len(all_jobs))
