"""What the report shows, as plain data: no matplotlib and no I/O (``plots.py`` draws it).

- Metric history panels (:func:`metric_panels`): one per metric, the values over runs with the bounds each
  value was checked against, ordered so that metrics whose latest value is out of bounds come first.
- Per-run pictures (:func:`run_picture`): each windowed tag's curve against the training step, with the
  bounds its live window check compared each window with (:func:`tag_checks`: the alert's stored bounds where
  a window alerted, else the check replayed over the stored windows with its own configuration), the windows
  out of bounds and the alert windows; a tag without a check gets no bounds, and says so.
- The status grid (:func:`status_grid`): tests x days, the latest run of each day.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import re
from typing import Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from core.alert_record import alert_problems
from core.config import ConfigSet, TestConfig, WindowCheck
from core.triage import TriageItem
from core.vocabulary import TriageAction
from core.window_checks import (
    NUMERIC_AGGREGATIONS,
    CheckedWindow,
    replay_window_checks,
    window_triage_targets,
)
from core.windows import WindowResult
from report.source import CURVE_AGGREGATIONS, AlertRecord, JobRow, MetricRow
from trainguard.wire import STATUS_SUCCESS

RUNNING = "running"              # windows but no job_history row yet: a live run
OUT_OF_BOUNDS = "out_of_bounds"  # a successful run with a metric or a window out of bounds
NO_RUN = "no_run"                # a day without a run
GRID_STATES = (NO_RUN, STATUS_SUCCESS, OUT_OF_BOUNDS, "failure", "timeout", "missing")
WINDOW_ALERT = "window_out_of_bounds"
DAY_SECONDS = 86400
TITLE_NAME_CHARS = 36     # of the test and of the run in a run picture's title: its status stays on the line
TITLE_PROBLEM_CHARS = 110  # of its second line, what went wrong (fits the figure's width at the title's size)

WindowKey = Tuple[str, str]  # (tag, window kind)


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """What goes into a report (the command line's options)."""
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
    triage: Optional[str] = None  # "accept" or "dismiss": someone looked at this value and said so

    @property
    def out_of_bounds(self) -> bool:
        return self.within is False


@dataclasses.dataclass(frozen=True)
class MetricPanel:
    """One metric of a test over its runs, in run-end order."""
    metric: str
    points: Tuple[HistoryPoint, ...]
    unit: Optional[str] = None  # the metric's unit in its test's config (metric_units), for the y axis

    @property
    def latest_out_of_bounds(self) -> bool:
        return bool(self.points) and self.points[-1].out_of_bounds and not self.points[-1].triage


class Bounded(Protocol):
    """A point with the bounds it was checked against (None: none on that side)."""

    @property
    def lower(self) -> Optional[float]: ...

    @property
    def upper(self) -> Optional[float]: ...


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


def bound_lines(points: Sequence[Bounded]) -> BoundLines:
    """Splits each point's bounds (of a history panel or of a run's curve) into the band (both sides) and the
    one-sided lines."""
    nan = math.nan
    both = [p.lower is not None and p.upper is not None for p in points]
    return BoundLines(
        band_lower=tuple(p.lower if p.lower is not None and b else nan for p, b in zip(points, both)),
        band_upper=tuple(p.upper if p.upper is not None and b else nan for p, b in zip(points, both)),
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
# Per-run curves against the bounds of the live window checks
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
class WindowBound:
    """The bounds one live window check compared one window with (None: unbounded on that side)."""
    lower: Optional[float]
    upper: Optional[float]
    centre: Optional[float]  # of a statistical threshold; None for a fixed value
    out_of_bounds: bool      # the window counted as out of bounds (it alerts once the check's debounce trips)
    stored: bool             # read from the alert the window raised; else recomputed by replaying the check


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """One window of the run, and the bounds its check compared it with."""
    index: int
    start_step: int
    end_step: int
    value: float
    bound: Optional[WindowBound] = None  # None: no check, or too little history to judge yet

    @property
    def step(self) -> float:
        """Where the window is drawn: the middle of its steps."""
        return (self.start_step + self.end_step) / 2

    @property
    def lower(self) -> Optional[float]:
        return self.bound.lower if self.bound else None

    @property
    def upper(self) -> Optional[float]:
        return self.bound.upper if self.bound else None

    @property
    def out_of_bounds(self) -> bool:
        return self.bound is not None and self.bound.out_of_bounds


@dataclasses.dataclass(frozen=True)
class Curve:
    """One tag of one run against the step: one aggregation, with the bounds of one live check of it."""
    tag: str
    kind: str
    aggregation: str
    points: Tuple[CurvePoint, ...]
    alert_spans: Tuple[Tuple[int, int], ...]   # steps of the windows that raised window_out_of_bounds
    check: Optional[WindowCheck] = None           # the check whose bounds are drawn; None: the tag has none
    limits: Optional[Tuple[float, float]] = None  # y-range shared by the test's pictures of this tag
    unit: Optional[str] = None                    # the tag's unit in its test's config, for the y axis

    @property
    def key(self) -> Tuple[str, str, str]:
        return self.tag, self.kind, self.aggregation

    @property
    def out_of_bounds(self) -> int:
        """How many of the run's windows counted as out of bounds."""
        return sum(p.out_of_bounds for p in self.points)


@dataclasses.dataclass(frozen=True)
class RunPicture:
    """Everything drawn for one run."""
    test: str
    run: str
    status: str
    end: float
    curves: Tuple[Curve, ...]       # alerting tags first, then by tag
    problems: Tuple[str, ...] = ()  # what the run's alerts say went wrong, most severe first
    alert_count: int = 0


@dataclasses.dataclass(frozen=True)
class TagChecks:
    """The live checks of one (tag, window kind) of a test, and what each compared each stored window with."""
    checks: Tuple[WindowCheck, ...]
    checked: Mapping[Tuple[str, int], Tuple[CheckedWindow, ...]]  # (run, window index) -> one per check


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


def tag_checks(config: TestConfig, key: WindowKey, runs: Sequence[RunWindows],
               actions: Sequence[TriageItem] = ()) -> Optional[TagChecks]:
    """The configured checks of ``key`` and, by replaying them over the stored windows of every run of the
    test as the pipeline does (``core.window_checks.replay_window_checks``), what each compared each window
    with: only the earlier successful runs the check counted, without their out-of-bounds windows, from where
    its level last moved, with the triage actions applied. None when ``key`` has no check."""
    tag, kind = key
    tag_config = config.windows.tags.get(tag)
    if tag_config is None or tag_config.spec.kind != kind or not tag_config.checks:
        return None
    stored = [(None if math.isinf(r.finalized) else r.finalized, r.run, r.status, r.windows[key])
              for r in runs if key in r.windows]
    targets = [t for action in actions for t in window_triage_targets(action, config.windows)
               if (t.tag, t.kind) == key]
    return TagChecks(tag_config.checks, replay_window_checks(stored, tag_config,
                                                             config.regression_test.rebaseline_after, targets))


def curve_aggregation(windows: Sequence[WindowResult]) -> Optional[str]:
    """The first of mean, p50, last that every window has (None: no curve can be drawn)."""
    for aggregation in CURVE_AGGREGATIONS:
        if windows and all(aggregation in w.values for w in windows):
            return aggregation
    return None


def alert_tag(metric: Optional[str], tags: Iterable[str]) -> Optional[str]:
    """The tag of a window alert's metric (``<tag>_<aggregation>``); the longest tag that fits."""
    if not metric:
        return None
    fitting = [t for t in tags if metric.startswith(t + "_") and metric[len(t) + 1:] in NUMERIC_AGGREGATIONS]
    return max(fitting, key=len, default=None)


@dataclasses.dataclass(frozen=True)
class WindowAlert:
    """A ``window_out_of_bounds`` alert of one (tag, kind), read for drawing."""
    aggregation: str
    history: Optional[str]  # the check's history (step_aligned or trailing); None from an older writer
    index: Optional[int]
    start_step: Optional[int]
    end_step: Optional[int]
    bound: WindowBound      # what the check compared the window with, as the alert stored it


def window_alerts(alerts: Iterable[AlertRecord], key: WindowKey, tags: Iterable[str]) -> List[WindowAlert]:
    """The window alerts of one run on (tag, kind), from their metric (``<tag>_<aggregation>``) and
    ``details``: the window, the check's history and the bounds (``lower_bound``, ``upper_bound``, ``centre``)."""
    tags = tuple(tags)
    found = []
    for alert in alerts:
        window, tag = alert.window, alert_tag(alert.metric, tags)
        if alert.kind != WINDOW_ALERT or window is None or tag != key[0] or window.get("kind", key[1]) != key[1]:
            continue
        index, start, end = (v if isinstance(v, int) and not isinstance(v, bool) else None
                             for v in (window.get(k) for k in ("index", "start_step", "end_step")))
        history, centre = alert.details.get("history"), alert.details.get("centre")
        found.append(WindowAlert(
            (alert.metric or "")[len(tag) + 1:], history if isinstance(history, str) else None, index, start, end,
            WindowBound(alert.lower_bound, alert.upper_bound,
                        float(centre) if isinstance(centre, (int, float)) and not isinstance(centre, bool) else None,
                        out_of_bounds=True, stored=True)))
    return found


def alert_spans(alerts: Iterable[AlertRecord], key: WindowKey, tags: Iterable[str]) -> Tuple[Tuple[int, int], ...]:
    """The step ranges of one run's window alerts on (tag, kind), from their ``details.window``."""
    return tuple(sorted({(a.start_step, a.end_step) for a in window_alerts(alerts, key, tags)
                         if a.start_step is not None and a.end_step is not None}))


def stored_bound(fired: Sequence[WindowAlert], index: int, aggregation: str,
                 check: Optional[WindowCheck]) -> Optional[WindowBound]:
    """The bound stored with the alert window ``index`` raised for ``check`` (any check of ``aggregation``
    when None), if it raised one: what the live check really compared it with."""
    for alert in fired:
        if alert.index == index and alert.aggregation == aggregation and (
                check is None or alert.history in (None, check.history)):
            return alert.bound
    return None


def replayed_bound(checked: Optional[CheckedWindow]) -> Optional[WindowBound]:
    """The bound a replayed check compared a window with; None while its history was too short."""
    if checked is None or checked.bounds is None:
        return None
    bounds = checked.bounds
    return WindowBound(bounds.lower, bounds.upper, bounds.centre, checked.out_of_bounds, stored=False)


def window_point(window: WindowResult, aggregation: str, bound: Optional[WindowBound]) -> CurvePoint:
    """One window with steps (``run_curves`` draws only those) as a curve's point; NaN for a value beyond the
    float range."""
    assert window.start_step is not None and window.end_step is not None
    value = window.values[aggregation]
    return CurvePoint(window.index, window.start_step, window.end_step, math.nan if value is None else value, bound)


def run_curves(runs: Sequence[RunWindows], position: int, key: WindowKey, alerts: Sequence[AlertRecord],
               checks: Optional[TagChecks]) -> List[Curve]:
    """The curves of ``runs[position]`` on ``key``: one per live check of the tag, drawn in the check's
    aggregation with its bounds (the alert's stored bound where the window alerted, else the replayed one);
    without a check, one curve (mean, else p50, else last) with no bounds. None for windows without steps."""
    run = runs[position]
    windows = sorted((w for w in run.windows[key] if w.start_step is not None and w.end_step is not None),
                     key=lambda w: (w.start_step, w.end_step, w.index))
    tags = {tag for tag, _ in run.windows}
    fired = window_alerts(alerts, key, tags)
    spans = alert_spans(alerts, key, tags)
    if checks is None:
        aggregation = curve_aggregation(windows)
        if aggregation is None:
            return []
        return [Curve(key[0], key[1], aggregation,
                      tuple(window_point(w, aggregation, stored_bound(fired, w.index, aggregation, None))
                            for w in windows),
                      spans)]

    def point(w: WindowResult, number: int, check: WindowCheck) -> CurvePoint:
        replayed = checks.checked.get((run.run, w.index))
        bound = stored_bound(fired, w.index, check.aggregation, check) or replayed_bound(
            replayed[number] if replayed else None)
        return window_point(w, check.aggregation, bound)

    return [Curve(key[0], key[1], check.aggregation, tuple(point(w, number, check) for w in windows), spans, check)
            for number, check in enumerate(checks.checks)
            if windows and all(check.aggregation in w.values for w in windows)]


def run_picture(test: str, runs: Sequence[RunWindows], position: int, alerts: Sequence[AlertRecord],
                checks: Mapping[WindowKey, Optional[TagChecks]]) -> RunPicture:
    """The curves of one run (only its own alerts are passed in) and what its alerts say went wrong."""
    run = runs[position]
    curves = [c for key in run.windows for c in run_curves(runs, position, key, alerts, checks.get(key))]
    curves.sort(key=lambda c: (not c.alert_spans, c.tag, c.kind))  # stable: a tag's checks in config order
    return RunPicture(test, run.run, run.status, run.end, tuple(curves), tuple(alert_problems(alerts)), len(alerts))


def run_title(picture: RunPicture) -> str:
    """What a run picture says at the top: the run, how it ended and how many alerts it raised, then on a
    second line what they say went wrong (the words of the e-mail subject, ``core.alert_record``), cut
    with "…" to fit the figure's width."""
    title = f"{short_label(picture.test, TITLE_NAME_CHARS)} / run {short_label(picture.run, TITLE_NAME_CHARS)}" \
            f" \u2014 {picture.status}"
    if picture.alert_count:
        title += f", {plural(picture.alert_count, 'alert')}"
    out = sum(c.out_of_bounds for c in picture.curves)
    if out:
        title += f", {plural(out, 'window')} out of bounds"
    if picture.problems:
        title += ":\n" + short_label("; ".join(picture.problems), TITLE_PROBLEM_CHARS)
    return title


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


CENTRE_WORDS = {"stddevs_from_mean": "mean", "mads_from_median": "median", "false_alert_rate": "median"}
SCALE_WORDS = {"stddevs_from_mean": "stddev", "mads_from_median": "robust scale", "false_alert_rate": "Qn scale"}
def check_rule(check: WindowCheck) -> str:
    """A live window check in a few words, for a panel: "check > mean − 4·stddev of the same steps in the
    last 5 successful runs"."""
    condition = check.condition
    kind, value = condition.threshold
    sign = condition.comparison.sign
    if kind == "fixed_value":
        rule = f"{sign} {value:g}"
    else:
        side = "\u2212" if condition.comparison.greater else "+"
        multiplier = f"k(rate {value:g})" if kind == "false_alert_rate" else f"{value:g}"
        rule = f"{sign} {CENTRE_WORDS[kind]} {side} {multiplier}\u00b7{SCALE_WORDS[kind]}"
    if check.history == "trailing":
        return f"check {rule} of the previous {plural(check.trailing_windows, 'window')} of the run"
    return f"check {rule} of the same steps in the last {plural(check.history_runs, 'successful run')}"


NO_CHECK = "no window check: no bounds"
ALERTS_ONLY = "no window check in the configs: bounds of its alerts only"


def check_text(curve: Curve) -> str:
    """Which bounds a curve's panel draws: its check's rule, or that it has no check (a tag whose check was
    removed from the configs still shows the bounds its alerts stored)."""
    if curve.check is not None:
        return check_rule(curve.check)
    return ALERTS_ONLY if any(p.bound for p in curve.points) else NO_CHECK


def curve_values(curve: Curve) -> List[float]:
    """Every y value a curve's panel shows: the windows, their bounds and the centres."""
    values = [p.value for p in curve.points]
    values += [v for p in curve.points if p.bound for v in (p.bound.lower, p.bound.upper, p.bound.centre)
               if v is not None]
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
    """The pictures with one y-range per (tag, kind, aggregation) across all of them, so that runs compare at
    a glance."""
    values: Dict[Tuple[str, str, str], List[float]] = collections.defaultdict(list)
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
    unchecked_tags: Tuple[str, ...] = ()   # windowed tags without a live window check: curves without bounds

    @property
    def slug(self) -> str:
        return safe_name(self.test)


def curveless_notes(pictures: Sequence[RunPicture], runs: Sequence[RunWindows]) -> Tuple[str, ...]:
    """Windowed tags with no curve in any picture: no steps reported, or not the aggregation to draw."""
    drawn = {(c.tag, c.kind) for p in pictures for c in p.curves}
    keys = sorted({key for r in runs for key in r.windows} - drawn)
    return tuple(f"{tag} ({kind} windows): no curve, the windows carry no steps, or not the aggregation its "
                 f"window check is on (without a check: none of {', '.join(CURVE_AGGREGATIONS)})"
                 for tag, kind in keys)


TRIAGED_VALUE_ACTIONS = (TriageAction.ACCEPT, TriageAction.DISMISS)


def with_triage(panels: Sequence[MetricPanel], actions: Sequence[TriageItem]) -> List[MetricPanel]:
    """The panels with each value that an accept or a dismiss names (its metric and run) marked so: an
    out-of-bounds value somebody triaged is not an open problem, and the figure must not draw it as one."""
    done = {(a.metric, a.run): a.action for a in sorted(actions, key=lambda a: a.time)
            if a.action in TRIAGED_VALUE_ACTIONS and a.metric and a.run}
    return [dataclasses.replace(panel, points=tuple(
        dataclasses.replace(p, triage=done[(panel.metric, p.run)]) if (panel.metric, p.run) in done else p
        for p in panel.points)) for panel in panels]


def with_units(panels: Sequence[MetricPanel], config: TestConfig) -> List[MetricPanel]:
    """The panels with their metrics' units from the test's config: an axis without one cannot be read."""
    return [dataclasses.replace(p, unit=config.metric_collection.unit_for(p.metric)) for p in panels]


def section_for_test(test: str, jobs: Sequence[JobRow], metrics: Sequence[MetricRow],
                     windows: Sequence[WindowResult], alerts: Sequence[AlertRecord],
                     settings: ReportSettings, config: TestConfig = TestConfig(),
                     actions: Sequence[TriageItem] = ()) -> ReportSection:
    """One test's panels and pictures from its rows, its config (the live window checks) and its triage actions."""
    jobs_by_run = {j.run: j for j in jobs}
    runs = run_windows(windows, jobs_by_run)
    alerts_by_run: Dict[str, List[AlertRecord]] = collections.defaultdict(list)
    for alert in alerts:
        alerts_by_run[alert.run].append(alert)
    keys = sorted({key for r in runs for key in r.windows})
    checks = {key: tag_checks(config, key, runs, actions) for key in keys}
    pictures = shared_limits([run_picture(test, runs, i, alerts_by_run[runs[i].run], checks)
                              for i in runs_to_draw(runs, settings)])
    tags = tuple(sorted({tag for tag, _ in keys}))
    panels = with_triage(with_units(metric_panels(metrics, {j.run: j.status for j in jobs}), config), actions)
    pictures = [dataclasses.replace(p, curves=tuple(dataclasses.replace(c, unit=config.metric_collection.unit_for(c.tag))
                                                    for c in p.curves)) for p in pictures]
    curveless = tuple(p.metric for p in panels if not any(p.metric.startswith(t + "_") for t in tags))
    unchecked = tuple(sorted({tag for (tag, kind), found in checks.items() if found is None}))
    return ReportSection(test, tuple(panels), incidents(jobs), tuple(pictures), tags, tuple(sorted(curveless)),
                         curveless_notes(pictures, runs), unchecked)


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
    # (test, run) -> its job_history row: what lifecycle alerts leave out (how long it ran, when last heard from)
    jobs: Mapping[Tuple[str, str], JobRow] = dataclasses.field(default_factory=dict)


def prepare_report(jobs: Sequence[JobRow], metrics: Sequence[MetricRow], windows: Sequence[WindowResult],
                   alerts: Sequence[AlertRecord], settings: ReportSettings, configs: ConfigSet = ConfigSet({}),
                   actions: Sequence[TriageItem] = ()) -> ReportData:
    """Every test's report, the status grid and the alert list from the rows of the tables, with the tests'
    configs (``--config_dir``: which live window checks each tag has) and the stored triage actions."""
    wanted = set(settings.tests)

    def by_test(rows) -> Dict[str, list]:
        grouped = collections.defaultdict(list)
        for row in rows:
            if not wanted or row.test in wanted:
                grouped[row.test].append(row)
        return grouped

    jobs_t, metrics_t, windows_t, alerts_t = by_test(jobs), by_test(metrics), by_test(windows), by_test(alerts)
    actions_t = by_test(actions)
    tests = sorted(set(jobs_t) | set(metrics_t) | set(windows_t))
    sections = tuple(section_for_test(t, jobs_t[t], metrics_t[t], windows_t[t], alerts_t[t], settings,
                                      configs.for_test(t), actions_t[t])
                     for t in tests)
    all_jobs = [j for t in tests for j in jobs_t[t]]
    all_alerts = [a for rows in alerts_t.values() for a in rows]
    oob = out_of_bounds_runs((m for t in tests for m in metrics_t[t]), all_alerts)
    shown, left_out = alert_list(all_alerts, settings.max_alerts)
    return ReportData(sections, status_grid(all_jobs, oob, settings.days), shown, left_out, len(all_jobs),
                      {(j.test, j.run): j for j in all_jobs})
