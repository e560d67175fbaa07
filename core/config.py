"""Per-test configuration: ``configs/<test>.json`` plus an optional ``default.json``.

Keys and semantics follow the ML-accelerator metrics handler. Loading is strict:
an unknown key, a value of the wrong type or an impossible combination is a
``ConfigError`` at start-up that names the file and the key, because a typo in
an alerting config otherwise shows up as silence on the day a regression lands.
Keys named ``"//"`` are comments and may appear in any object. (A running
streaming job re-reads the directory instead of raising: a file that fails
then is rejected with a ``config_rejected`` alert, see ``core.config_versions``.)
"""

from __future__ import annotations

import dataclasses
import string
import unicodedata
import urllib.parse
from typing import Any, Dict, FrozenSet, Mapping, Optional, Protocol, Tuple

from core.strict_json import ConfigError, StrictReader
from core.vocabulary import StrEnum
from core.windows import AGGREGATIONS as WINDOW_AGGREGATIONS
from core.windows import WindowSpec

__all__ = ["ConfigError", "ConfigSet", "TestConfig", "load_config_dir", "parse_test_config"]

STRATEGIES = ("final", "min", "max", "average")
# How a tag's values of the ranks of one distributed run become the run's value (``core.runs``).
RANK_REDUCTIONS = ("rank0", "mean", "min", "max")


class Comparison(StrEnum):
    """Which side of its bounds a value must stay on (``core.bounds``). A ``str`` enum: a member equals, prints
    and JSON-encodes as its config text, which alert details and rows carry (as the plain ``.value``)."""
    GREATER = "greater"                    # higher is better: (lower bound, +inf)
    LESS = "less"                          # lower is better: (-inf, upper bound)
    EQUAL = "equal"                        # a fixed value only: (v, v)
    GREATER_OR_EQUAL = "greater_or_equal"
    LESS_OR_EQUAL = "less_or_equal"

    @property
    def greater(self) -> bool:
        """Higher is better (``greater``, ``greater_or_equal``): bounded below only."""
        return self in (Comparison.GREATER, Comparison.GREATER_OR_EQUAL)

    @property
    def is_equal(self) -> bool:
        """``equal``: two-sided, a fixed value only; no way is better."""
        return self is Comparison.EQUAL

    @property
    def inclusive(self) -> bool:
        """Whether a value on a bound is within (``equal``, ``*_or_equal``); else within is strict."""
        return self in (Comparison.EQUAL, Comparison.GREATER_OR_EQUAL, Comparison.LESS_OR_EQUAL)

    @property
    def sign(self) -> str:
        """The comparison as a sign: >, ≥, <, ≤, =."""
        return _COMPARISON_SIGNS[self]


_COMPARISON_SIGNS = {Comparison.GREATER: ">", Comparison.GREATER_OR_EQUAL: "\u2265", Comparison.LESS: "<",
                     Comparison.LESS_OR_EQUAL: "\u2264", Comparison.EQUAL: "="}
COMPARISONS = tuple(comparison.value for comparison in Comparison)
DEFAULT_CONFIG_NAME = "default"
TIME_TO_ACCURACY_METRIC = "time_to_accuracy"
TOTAL_WALL_TIME_METRIC = "total_wall_time"
JOB_DURATION_METRIC = "job_duration"
SECONDS_METRICS = frozenset((TIME_TO_ACCURACY_METRIC, TOTAL_WALL_TIME_METRIC, JOB_DURATION_METRIC))
SECONDS_UNIT = "s"  # the unit of the durations trainguard measures itself (``SECONDS_METRICS``)
UNIT_MAX_CHARS = 40
REPORT_URL_PLACEHOLDERS = ("test", "run")
DEFAULT_HISTORY_MAX_POINTS = 100  # values of history a condition compares with, unless it says otherwise
DEFAULT_REBASELINE_AFTER = 3
DEFAULT_FALSE_ALERTS_PER_100_RUNS = 1.0  # a test's false-alert budget, split over its checks without a threshold


@dataclasses.dataclass(frozen=True)
class TimeToAccuracy:
    accuracy_tag: str
    accuracy_threshold: float


THRESHOLD_KINDS = ("fixed_value", "stddevs_from_mean", "mads_from_median", "false_alert_rate")
STATISTICAL_THRESHOLDS = THRESHOLD_KINDS[1:]
# What a false_alert_rate cutoff assumes of a metric's noise: heavy tails (Student t, 3 degrees of freedom; the
# default, which holds the rate whatever the tails) or normal (a cutoff about twice as near, which holds the
# rate only when the noise is in fact that light: ``trainguard-backtest --suggest_noise`` measures it).
HEAVY_TAILED = "heavy_tailed"
NORMAL = "normal"
NOISE_MODELS = (HEAVY_TAILED, NORMAL)


@dataclasses.dataclass(frozen=True)
class SuccessCondition:
    """When a value is a regression (see ``core.bounds``); exactly one threshold kind is set."""
    comparison: Comparison  # its text is taken too, and made the member (ValueError for another)
    fixed_value: Optional[float] = None
    stddevs_from_mean: Optional[float] = None
    mads_from_median: Optional[float] = None
    false_alert_rate: Optional[float] = None
    wait_for_n_points_of_history: int = 0
    history_max_points: int = DEFAULT_HISTORY_MAX_POINTS
    min_effect_abs: float = 0.0    # out of bounds only counts when this far from the reference...
    min_effect_rel: float = 0.0    # ...and this far relative to it
    # The threshold is the test's false-alert budget's share (``false_alert_rate`` set from it at parse time).
    from_budget: bool = False
    # A run-level condition's own history_by (None: the test's; (): one history for this metric).
    history_by: Optional[Tuple[str, ...]] = None
    noise: str = HEAVY_TAILED  # one of NOISE_MODELS: the tails a false_alert_rate is calibrated for

    def __post_init__(self) -> None:
        if type(self.comparison) is not Comparison:
            object.__setattr__(self, "comparison", Comparison(self.comparison))

    @property
    def threshold(self) -> Tuple[str, float]:
        """(kind, value) of the threshold, e.g. ("false_alert_rate", 0.0005)."""
        for kind in THRESHOLD_KINDS:
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        raise ValueError("a SuccessCondition needs a threshold")


@dataclasses.dataclass(frozen=True)
class MetricCollectionConfig:
    default_aggregation_strategies: Tuple[str, ...] = ("final",)
    metric_to_aggregation_strategies: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    tags_to_ignore: FrozenSet[str] = frozenset()
    time_to_accuracy: Optional[TimeToAccuracy] = None
    write_to_bigquery: bool = True
    default_rank_reduction: str = "rank0"  # most training code logs on rank 0 only
    tag_to_rank_reduction: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # What the alerts print after a value: per metric name, or per tag for all its metrics.
    metric_units: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def strategies_for(self, tag: str) -> Tuple[str, ...]:
        return self.metric_to_aggregation_strategies.get(tag, self.default_aggregation_strategies)

    def rank_reduction_for(self, tag: str) -> str:
        return self.tag_to_rank_reduction.get(tag, self.default_rank_reduction)

    def unit_for(self, metric: str) -> Optional[str]:
        """The unit of a metric: ``metric_units`` of its name, seconds for the durations trainguard measures,
        else ``metric_units`` of its tag (the name without its ``_<strategy>`` or ``_<aggregation>``)."""
        if metric in self.metric_units:
            return self.metric_units[metric]
        if metric in SECONDS_METRICS:
            return SECONDS_UNIT
        tag, _, suffix = metric.rpartition("_")
        if tag and (suffix in STRATEGIES or suffix in WINDOW_AGGREGATIONS):
            return self.metric_units.get(tag)
        return None


@dataclasses.dataclass(frozen=True)
class RegressionTestConfig:
    metric_success_conditions: Mapping[str, SuccessCondition] = dataclasses.field(default_factory=dict)
    metric_subset_to_alert: Optional[FrozenSet[str]] = None
    required_metrics: Tuple[str, ...] = ()
    alert_for_oob_metrics: bool = True
    alert_for_failed_jobs: bool = True
    alert_after_second_test_failure: bool = True
    # After this many successful runs in a row out of bounds, a metric's baseline moves to them (0: never).
    rebaseline_after: int = DEFAULT_REBASELINE_AFTER
    # The run's page of an outside report, e.g. "https://reports.example/{test}/{run}.html" (None: no link).
    report_url_pattern: Optional[str] = None
    # The dashboard's address (``trainguard-dashboard``), e.g. "https://trainguard.example": each alert links
    # its page there (None: no link).
    dashboard_url: Optional[str] = None
    # False alerts a test may raise per 100 healthy runs, split over its checks that give no threshold.
    false_alerts_per_100_runs: float = DEFAULT_FALSE_ALERTS_PER_100_RUNS
    # Each one-sided false_alert_rate condition also looks for small persistent shifts (core.shifts).
    detect_shifts: bool = True
    # Keys of a run's data (run_started/run_finished) whose values pick its baseline: one history per value,
    # e.g. ("accelerator",) for a test whose runs land on different machine types (() : one per metric).
    history_by: Tuple[str, ...] = ()

    def checks_shifts(self, condition: SuccessCondition) -> bool:
        """Whether a metric with ``condition`` gets the persistent-shift check: a one-sided ``false_alert_rate``
        condition of a test that detects shifts."""
        return self.detect_shifts and condition.false_alert_rate is not None and not condition.comparison.is_equal

    def condition_for(self, metric: str) -> Optional[SuccessCondition]:
        conditions = self.metric_success_conditions
        return conditions.get(metric, conditions.get(DEFAULT_CONFIG_NAME))

    def history_by_for(self, metric: str) -> Tuple[str, ...]:
        """The run-data keys whose values split ``metric``'s history: its condition's, else the test's."""
        condition = self.condition_for(metric)
        return self.history_by if condition is None or condition.history_by is None else condition.history_by

    def may_alert_on(self, metric: str) -> bool:
        return self.metric_subset_to_alert is None or metric in self.metric_subset_to_alert

    def dashboard_alert_url(self, alert_id: str) -> Optional[str]:
        """The alert's page on the dashboard (``/alerts/<id>``); None without ``dashboard_url``."""
        if self.dashboard_url is None:
            return None
        return f"{self.dashboard_url.rstrip('/')}/alerts/{urllib.parse.quote(alert_id, safe='')}"

    def report_url(self, test: str, run: str) -> Optional[str]:
        """``report_url_pattern`` with {test} and {run} URL-quoted; None without a pattern."""
        if self.report_url_pattern is None:
            return None
        return self.report_url_pattern.format(test=urllib.parse.quote(test, safe=""),
                                              run=urllib.parse.quote(run, safe=""))


@dataclasses.dataclass(frozen=True)
class WindowCheck:
    """One live check of one window aggregate against history."""
    aggregation: str
    condition: SuccessCondition
    history: str = "step_aligned"  # or "trailing": earlier windows of the same run
    history_runs: int = 5          # step_aligned: the last K successful runs
    trailing_windows: int = 10     # trailing: the last J windows of the run
    debounce_windows: int = 1      # alert once `debounce_out_of_bounds` of the last
    debounce_out_of_bounds: int = 1  # `debounce_windows` windows are out of bounds


@dataclasses.dataclass(frozen=True)
class RankCheck:
    """Stragglers: each rank's window aggregate against the other ranks' in the same window of the same run."""
    aggregation: str
    condition: SuccessCondition    # centre and scale from the other ranks (mads_from_median is the robust choice)
    debounce_windows: int = 1      # alert once `debounce_out_of_bounds` of the rank's last
    debounce_out_of_bounds: int = 1  # `debounce_windows` windows are out of bounds


@dataclasses.dataclass(frozen=True)
class TagWindowConfig:
    spec: WindowSpec
    checks: Tuple[WindowCheck, ...] = ()
    rank_check: Optional[RankCheck] = None
    # Keys of a run's run_started data whose values pick the step-aligned history its windows are checked against
    # (None: the test's ``history_by``; (): one history for the tag).
    history_by: Optional[Tuple[str, ...]] = None


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    tags: Mapping[str, TagWindowConfig] = dataclasses.field(default_factory=dict)
    allowed_lateness_seconds: float = 0.0
    stall_seconds: Optional[float] = None


def ranks_matter(config: TestConfig, tag: str) -> bool:
    """Whether a tag's live windows need every rank's points: a reduction other than rank 0's, or a rank check."""
    tag_config = config.windows.tags.get(tag)
    return (config.metric_collection.rank_reduction_for(tag) != "rank0"
            or (tag_config is not None and tag_config.rank_check is not None))


@dataclasses.dataclass(frozen=True)
class TestConfig:
    __test__ = False  # not a pytest test class
    metric_collection: MetricCollectionConfig = MetricCollectionConfig()
    regression_test: RegressionTestConfig = RegressionTestConfig()
    source: str = "<built-in default>"
    windows: WindowConfig = WindowConfig()

    def window_history_by(self, tag: str) -> Tuple[str, ...]:
        """The ``history_by`` of a tag's window checks: its own, else the test's."""
        tag_config = self.windows.tags.get(tag)
        own = tag_config.history_by if tag_config is not None else None
        return self.regression_test.history_by if own is None else own

    def window_history_keys(self) -> Tuple[str, ...]:
        """Every key of a run's data that picks the history of one of its tags' window checks."""
        return tuple(dict.fromkeys(key for tag, tag_config in self.windows.tags.items() if tag_config.checks
                                   for key in self.window_history_by(tag)))


@dataclasses.dataclass(frozen=True)
class ConfigSet:
    """All per-test configs; tests without a file of their own get the default."""
    by_test: Mapping[str, TestConfig]
    default: TestConfig = TestConfig()

    def for_test(self, test: str, at: Optional[float] = None) -> TestConfig:
        """The config of ``test``; one set is valid at every event time ``at``."""
        return self.by_test.get(test, self.default)

    def any_live_windows(self) -> bool:
        return any(config.windows.tags for config in (*self.by_test.values(), self.default))


class Configs(Protocol):
    """What the stages look configs up in: one set, the dated versions of a config directory
    (``core.config_versions.ConfigVersions``) or those versions followed while a job runs
    (``transforms.config_versions.LiveConfigs``)."""

    def for_test(self, test: str, at: Optional[float] = None) -> TestConfig:
        """The config of ``test`` valid at event time ``at`` (None: the latest)."""

    def any_live_windows(self) -> bool:
        """Whether a config, in any version, has live windows: a graph for bounded input, whose configs are all
        known when it is built, leaves the live windows out where none has (True for configs that may change)."""


def test_name_from_filename(filename: str) -> str:
    return filename[: -len(".json")].replace("__", "/")


def filename_for_test(test: str) -> str:
    return test.replace("/", "__") + ".json"


def load_config_dir(directory: str) -> ConfigSet:
    """The configs in the local ``directory`` valid now: each test's latest version, ``default.json`` the fallback.

    ``ConfigError`` names the first file that fails (and the key). Dated versions (``<test>@<time>.json``) are
    read as well, by ``core.config_versions``, which also gives the versions themselves.
    """
    from core.config_versions import load_local_versions  # it builds on this module

    return load_local_versions(directory).strict().latest


def parse_test_config(raw: Any, source: str) -> TestConfig:
    reader = StrictReader(source)
    top = reader.object(raw, "", {"metric_collection_config", "regression_test_config", "window_config"})
    collection = _parse_collection(reader, top.get("metric_collection_config", {}))
    regression = _parse_regression(reader, top.get("regression_test_config", {}))
    windows = _parse_windows(reader, top.get("window_config", {}))
    regression, windows = _spend_budget(regression, windows)
    tta = collection.time_to_accuracy
    if tta is not None and tta.accuracy_tag in collection.tags_to_ignore:
        reader.fail("metric_collection_config.time_to_accuracy.accuracy_tag",
                    f"{tta.accuracy_tag!r} is also in tags_to_ignore")
    return TestConfig(collection, regression, source, windows)


def _parse_collection(reader: StrictReader, raw: Any) -> MetricCollectionConfig:
    where = "metric_collection_config"
    singular, plural = "metric_to_aggregation_strategy", "metric_to_aggregation_strategies"
    obj = reader.object(raw, where, {"default_aggregation_strategies", plural, singular,
                                     "tags_to_ignore", "time_to_accuracy", "write_to_bigquery",
                                     "default_rank_reduction", "tag_to_rank_reduction", "metric_units"})
    if singular in obj and plural in obj:
        reader.fail(f"{where}.{singular}", f"give either {singular} or {plural}, not both")
    defaults = _strategies(reader, obj.get("default_aggregation_strategies", ["final"]),
                                 f"{where}.default_aggregation_strategies")
    per_tag_key = singular if singular in obj else plural
    per_tag_raw = reader.object(obj.get(per_tag_key, {}), f"{where}.{per_tag_key}")
    per_tag = {tag: _strategies(reader, value, f"{where}.{per_tag_key}.{tag}")
               for tag, value in per_tag_raw.items()}
    ignored = frozenset(reader.strings(obj.get("tags_to_ignore", []), f"{where}.tags_to_ignore"))
    tta = None
    if obj.get("time_to_accuracy") is not None:
        tta_where = f"{where}.time_to_accuracy"
        tta_obj = reader.object(obj["time_to_accuracy"], tta_where, {"accuracy_tag", "accuracy_threshold"},
                            required=sorted({"accuracy_tag", "accuracy_threshold"}))
        tta = TimeToAccuracy(reader.string(tta_obj["accuracy_tag"], f"{tta_where}.accuracy_tag"),
                             reader.number(tta_obj["accuracy_threshold"], f"{tta_where}.accuracy_threshold"))
    write = reader.boolean(obj.get("write_to_bigquery", True), f"{where}.write_to_bigquery")
    default_reduction = _rank_reduction(reader, obj.get("default_rank_reduction", "rank0"),
                                        f"{where}.default_rank_reduction")
    reductions_raw = reader.object(obj.get("tag_to_rank_reduction", {}), f"{where}.tag_to_rank_reduction")
    reductions = {tag: _rank_reduction(reader, value, f"{where}.tag_to_rank_reduction.{tag}")
                  for tag, value in reductions_raw.items()}
    units_raw = reader.object(obj.get("metric_units", {}), f"{where}.metric_units")
    units = {name: _unit(reader, value, f"{where}.metric_units.{name}") for name, value in units_raw.items()}
    return MetricCollectionConfig(defaults, per_tag, ignored, tta, write, default_reduction, reductions, units)


def _unit(reader: StrictReader, value: Any, key: str) -> str:
    unit = reader.string(value, key)
    if unit != unit.strip() or len(unit) > UNIT_MAX_CHARS or any(unicodedata.category(c)[0] == "C" for c in unit):
        reader.fail(key, f"must be a short unit such as \"s\" or \"images/s\" (at most {UNIT_MAX_CHARS} "
                         f"characters, no line breaks or surrounding spaces), got {unit!r}")
    return unit


def checked_report_url_pattern(reader: StrictReader, value: Any, key: str) -> str:
    """An http(s) URL whose only placeholders are {test} and {run}."""
    pattern = reader.string(value, key)
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(pattern)
                  if name is not None]
    except ValueError as e:
        reader.fail(key, f"is not a valid pattern ({e}): write a literal brace as {{{{ or }}}}")
    for name, spec, conversion in fields:
        if name not in REPORT_URL_PLACEHOLDERS or spec or conversion:
            reader.fail(key, f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} is "
                             f"not a placeholder: use {{test}} and {{run}} only")
    if not _is_web_address(pattern.format(test="t", run="r")):
        reader.fail(key, f"must be an http(s) URL without spaces, got {pattern!r}")
    return pattern


def _is_web_address(url: str) -> bool:
    """An http(s) URL with a host and no control or space characters."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not any(
        unicodedata.category(c)[0] in "CZ" for c in url)


def checked_dashboard_url(reader: StrictReader, value: Any, key: str) -> str:
    """An http(s) address with no placeholder, query or fragment: the dashboard's root."""
    url = reader.string(value, key)
    parts = urllib.parse.urlsplit(url)
    if not _is_web_address(url) or parts.query or parts.fragment or "{" in url:
        reader.fail(key, f"must be the dashboard's http(s) address, e.g. \"https://trainguard.example\", got {url!r}")
    return url


def _rank_reduction(reader: StrictReader, value: Any, key: str) -> str:
    name = reader.string(value, key)
    if name not in RANK_REDUCTIONS:
        reader.fail(key, f"{name!r} is not one of {list(RANK_REDUCTIONS)}")
    return name


def _parse_regression(reader: StrictReader, raw: Any) -> RegressionTestConfig:
    where = "regression_test_config"
    obj = reader.object(raw, where, {"metric_success_conditions", "metric_subset_to_alert", "required_metrics",
                                  "alert_for_oob_metrics", "alert_for_failed_jobs",
                                  "alert_after_second_test_failure", "rebaseline_after", "report_url_pattern",
                                  "dashboard_url", "false_alerts_per_100_runs", "detect_shifts", "history_by"})
    conditions_where = f"{where}.metric_success_conditions"
    conditions_raw = reader.object(obj.get("metric_success_conditions", {}), conditions_where)
    conditions = {metric: _parse_condition(reader, value, f"{conditions_where}.{metric}", run_level=True)
                  for metric, value in conditions_raw.items()}
    subset = obj.get("metric_subset_to_alert")
    return RegressionTestConfig(
        metric_success_conditions=conditions,
        metric_subset_to_alert=None if subset is None else frozenset(
            reader.strings(subset, f"{where}.metric_subset_to_alert")),
        required_metrics=tuple(reader.strings(obj.get("required_metrics", []), f"{where}.required_metrics")),
        alert_for_oob_metrics=reader.boolean(obj.get("alert_for_oob_metrics", True),
                                             f"{where}.alert_for_oob_metrics"),
        alert_for_failed_jobs=reader.boolean(obj.get("alert_for_failed_jobs", True),
                                             f"{where}.alert_for_failed_jobs"),
        alert_after_second_test_failure=reader.boolean(obj.get("alert_after_second_test_failure", True),
                                                       f"{where}.alert_after_second_test_failure"),
        rebaseline_after=reader.integer(obj.get("rebaseline_after", DEFAULT_REBASELINE_AFTER),
                                        f"{where}.rebaseline_after", minimum=0),
        detect_shifts=reader.boolean(obj.get("detect_shifts", True), f"{where}.detect_shifts"),
        history_by=_history_by(reader, obj.get("history_by", []), f"{where}.history_by"),
        false_alerts_per_100_runs=_budget(reader, obj.get("false_alerts_per_100_runs",
                                                          DEFAULT_FALSE_ALERTS_PER_100_RUNS),
                                          f"{where}.false_alerts_per_100_runs"),
        report_url_pattern=None if obj.get("report_url_pattern") is None else checked_report_url_pattern(
            reader, obj["report_url_pattern"], f"{where}.report_url_pattern"),
        dashboard_url=None if obj.get("dashboard_url") is None else checked_dashboard_url(
            reader, obj["dashboard_url"], f"{where}.dashboard_url"),
    )


def _history_by(reader: StrictReader, value: Any, key: str) -> Tuple[str, ...]:
    keys = reader.strings(value, key)
    if any(not name or name != name.strip() for name in keys) or len(set(keys)) != len(keys):
        reader.fail(key, f"must list distinct keys of the runs' data, such as [\"accelerator\"], got {value!r}")
    if "status" in keys:
        reader.fail(key, "cannot hold \"status\": a failed run has no baseline of its own")
    return tuple(keys)


def _budget(reader: StrictReader, value: Any, key: str) -> float:
    budget = reader.number(value, key)
    if not 0 < budget <= MAX_FALSE_ALERTS_PER_100_RUNS:
        reader.fail(key, f"must be more than 0 and at most {MAX_FALSE_ALERTS_PER_100_RUNS:g}, got {value!r}")
    return budget


MAX_FALSE_ALERTS_PER_100_RUNS = 20.0  # beyond this a check alerts on one healthy run in five: no longer a check


SHIFT_SHARE = 0.25  # what the shift check of a metric condition costs of the budget, against 1 for its cutoff


def shift_rate(condition: SuccessCondition) -> float:
    """The false-alert rate of a condition's persistent-shift check: ``SHIFT_SHARE`` of its cutoff's. The shift
    statistic caps each value, so its threshold barely moves with the rate (a quarter of the rate: about 10%
    higher), while a heavy-tailed cutoff moves a lot (twice the rate: about 15% nearer); so the budget buys
    more power spent on the cutoffs."""
    assert condition.false_alert_rate is not None
    return condition.false_alert_rate * SHIFT_SHARE


def budget_shares(config: RegressionTestConfig, windows: WindowConfig) -> float:
    """How many checks share the test's false-alert budget: each metric condition and each window check that
    gives no ``success_threshold``, and ``SHIFT_SHARE`` for the shift check of each such metric condition
    (``detect_shifts``; the ``default`` condition counts once, rank checks are not history checks). A window
    check that alerts on two or more out-of-bounds windows (its debounce) takes the same rate without a share:
    its chance of a false alert per run is about windows × (ways to pick them) × rate², far below one share."""
    budgeted = [c for c in config.metric_success_conditions.values() if c.from_budget]
    shifts = sum(not c.comparison.is_equal for c in budgeted) if config.detect_shifts else 0
    return (len(budgeted) + SHIFT_SHARE * shifts
            + sum(check.condition.from_budget and check.debounce_out_of_bounds < 2
                  for tag in windows.tags.values() for check in tag.checks))


def _spend_budget(config: RegressionTestConfig, windows: WindowConfig) -> Tuple[RegressionTestConfig, WindowConfig]:
    """Sets the ``false_alert_rate`` of every check without a threshold: the test's budget split evenly over
    ``budget_shares``. A run-level check's rate is per run, a window check's per window."""
    shares = budget_shares(config, windows)
    if not shares:
        return config, windows
    rate = config.false_alerts_per_100_runs / 100 / shares

    def spent(condition: SuccessCondition) -> SuccessCondition:
        return dataclasses.replace(condition, false_alert_rate=rate) if condition.from_budget else condition

    conditions = {metric: spent(c) for metric, c in config.metric_success_conditions.items()}
    tags = {tag: dataclasses.replace(t, checks=tuple(dataclasses.replace(check, condition=spent(check.condition))
                                                    for check in t.checks))
            for tag, t in windows.tags.items()}
    return (dataclasses.replace(config, metric_success_conditions=conditions),
            dataclasses.replace(windows, tags=tags))


def _parse_condition(reader: StrictReader, raw: Any, where: str,
                     min_effect: Optional[Dict[str, Any]] = None, run_level: bool = False) -> SuccessCondition:
    """A success condition; ``min_effect`` holds a window check's own min_effect_* keys, if any; a
    ``run_level`` one (of a metric) may have its own ``history_by``."""
    obj = reader.object(raw, where, {"comparison", "success_threshold", "wait_for_n_points_of_history",
                                     "history_max_points", "min_effect_abs", "min_effect_rel", "noise",
                                     *(("history_by",) if run_level else ())},
                        required=("comparison",))
    text = reader.string(obj["comparison"], f"{where}.comparison")
    if text not in COMPARISONS:
        reader.fail(f"{where}.comparison", f"{text!r} is not one of {list(COMPARISONS)}")
    comparison = Comparison(text)
    threshold_where = f"{where}.success_threshold"
    if "success_threshold" in obj:
        threshold = reader.object(obj["success_threshold"], threshold_where)
        kinds = list(threshold)
        if len(kinds) != 1 or kinds[0] not in THRESHOLD_KINDS:
            reader.fail(threshold_where, f"must hold exactly one of {', '.join(repr(k) for k in THRESHOLD_KINDS)}")
        kind = kinds[0]
        value = reader.number(threshold[kind], f"{threshold_where}.{kind}")
    else:  # the test's false-alert budget's share, set by _spend_budget once every check is known
        kind, value = "false_alert_rate", BUDGET_PLACEHOLDER
    if kind in STATISTICAL_THRESHOLDS and comparison.is_equal:
        reader.fail(threshold_where, f"'equal' cannot be combined with {kind!r}")
    if kind in ("stddevs_from_mean", "mads_from_median") and value < 0:
        reader.fail(f"{threshold_where}.{kind}", "must not be negative")
    if kind == "false_alert_rate" and not 0 < value < 0.5:
        reader.fail(f"{threshold_where}.{kind}", f"must be a probability between 0 and 0.5, got {value!r}")
    noise = reader.string(obj.get("noise", HEAVY_TAILED), f"{where}.noise")
    if noise not in NOISE_MODELS:
        reader.fail(f"{where}.noise", f"{noise!r} is not one of {list(NOISE_MODELS)}")
    if noise != HEAVY_TAILED and kind != "false_alert_rate":
        reader.fail(f"{where}.noise", f"only a false_alert_rate (or the test's budget) is calibrated for a noise "
                                      f"model, not {kind!r}")
    effects = dict(min_effect or {})
    for key in ("min_effect_abs", "min_effect_rel"):
        if key in obj:
            if key in effects:
                reader.fail(f"{where}.{key}", "is also set on the window check: set it in one place")
            effects[key] = obj[key]
    return SuccessCondition(
        comparison=comparison,
        **{kind: value},
        from_budget="success_threshold" not in obj,
        wait_for_n_points_of_history=reader.integer(obj.get("wait_for_n_points_of_history", 0),
                                                    f"{where}.wait_for_n_points_of_history", minimum=0),
        history_max_points=reader.integer(obj.get("history_max_points", DEFAULT_HISTORY_MAX_POINTS),
                                          f"{where}.history_max_points", minimum=1),
        min_effect_abs=reader.number(effects.get("min_effect_abs", 0), f"{where}.min_effect_abs", minimum=0),
        min_effect_rel=reader.number(effects.get("min_effect_rel", 0), f"{where}.min_effect_rel", minimum=0),
        history_by=_history_by(reader, obj["history_by"], f"{where}.history_by") if "history_by" in obj else None,
        noise=noise,
    )


BUDGET_PLACEHOLDER = 0.01  # replaced by _spend_budget before any check sees it


def _parse_windows(reader: StrictReader, raw: Any) -> WindowConfig:
    where = "window_config"
    obj = reader.object(raw, where, {"tags", "allowed_lateness_seconds", "stall_seconds"})
    tags_raw = reader.object(obj.get("tags", {}), f"{where}.tags")
    tags = {tag: _parse_tag_windows(reader, value, f"{where}.tags.{tag}")
            for tag, value in tags_raw.items()}
    lateness = reader.number(obj.get("allowed_lateness_seconds", 0), f"{where}.allowed_lateness_seconds")
    stall = obj.get("stall_seconds")
    return WindowConfig(tags, reader.positive(lateness, f"{where}.allowed_lateness_seconds", allow_zero=True),
                        None if stall is None else reader.positive(
                            reader.number(stall, f"{where}.stall_seconds"), f"{where}.stall_seconds"))


def _parse_tag_windows(reader: StrictReader, raw: Any, where: str) -> TagWindowConfig:
    obj = reader.object(raw, where, {"count", "time_seconds", "period_seconds", "aggregations", "checks",
                                     "rank_check", "history_by"})
    count = obj.get("count")
    if count is not None:
        count = reader.integer(count, f"{where}.count", minimum=1)
    time_seconds = period = None
    if obj.get("time_seconds") is not None:
        time_seconds = reader.positive(reader.number(obj["time_seconds"], f"{where}.time_seconds"),
                                       f"{where}.time_seconds")
    if obj.get("period_seconds") is not None:
        period = reader.positive(reader.number(obj["period_seconds"], f"{where}.period_seconds"),
                                 f"{where}.period_seconds")
        if time_seconds is None or count is not None or period > time_seconds:
            reader.fail(f"{where}.period_seconds",
                              "needs time_seconds (no count) and must not exceed it")
    if count is None and time_seconds is None:
        reader.fail(where, "needs count, time_seconds or both")
    aggregations = tuple(dict.fromkeys(reader.strings(obj.get("aggregations", ["mean", "min", "max"]),
                                                      f"{where}.aggregations")))
    for name in aggregations:
        if name not in WINDOW_AGGREGATIONS:
            reader.fail(f"{where}.aggregations", f"{name!r} is not one of {list(WINDOW_AGGREGATIONS)}")
    checks_raw = obj.get("checks", [])
    if not isinstance(checks_raw, list):
        reader.fail(f"{where}.checks", "must be a list")
    checks = tuple(_parse_window_check(reader, check, f"{where}.checks[{i}]", aggregations)
                   for i, check in enumerate(checks_raw))
    rank_check = None
    if obj.get("rank_check") is not None:
        rank_check = _parse_rank_check(reader, obj["rank_check"], f"{where}.rank_check", aggregations)
    history_by = _history_by(reader, obj["history_by"], f"{where}.history_by") if "history_by" in obj else None
    return TagWindowConfig(WindowSpec(count, time_seconds, period, aggregations), checks, rank_check, history_by)


def _aggregation_of(reader: StrictReader, obj: Dict[str, Any], where: str, aggregations: Tuple[str, ...]) -> str:
    aggregation = reader.string(obj.get("aggregation"), f"{where}.aggregation")
    if aggregation not in aggregations or aggregation == "histogram":
        reader.fail(f"{where}.aggregation", f"{aggregation!r} is not a numeric aggregation of this tag's "
                                            f"windows {list(aggregations)}")
    return aggregation


def _debounce(reader: StrictReader, obj: Dict[str, Any], where: str) -> Tuple[int, int]:
    debounce = reader.object(obj.get("debounce", {"windows": 1, "out_of_bounds": 1}), f"{where}.debounce",
                             {"windows", "out_of_bounds"}, required=sorted({"windows", "out_of_bounds"}))
    windows = reader.integer(debounce["windows"], f"{where}.debounce.windows", minimum=1)
    out_of_bounds = reader.integer(debounce["out_of_bounds"], f"{where}.debounce.out_of_bounds", minimum=1)
    if out_of_bounds > windows:
        reader.fail(f"{where}.debounce.out_of_bounds", "must not exceed debounce.windows")
    return windows, out_of_bounds


def _parse_rank_check(reader: StrictReader, raw: Any, where: str, aggregations: Tuple[str, ...]) -> RankCheck:
    obj = reader.object(raw, where, {"aggregation", "condition", "min_effect_abs", "min_effect_rel", "debounce"})
    aggregation = _aggregation_of(reader, obj, where, aggregations)
    if "condition" not in obj:
        reader.fail(f"{where}.condition", "is required")
    effects: Dict[str, Any] = {key: obj[key] for key in ("min_effect_abs", "min_effect_rel") if key in obj}
    condition = _parse_condition(reader, obj["condition"], f"{where}.condition", effects)
    if condition.from_budget:  # ranks of one window, not a history of runs: no share of a per-run budget
        reader.fail(f"{where}.condition.success_threshold", "is required: a rank check compares ranks with "
                                                            "each other, e.g. {\"mads_from_median\": 4}")
    if condition.fixed_value is not None:
        reader.fail(f"{where}.condition.success_threshold", "compares ranks with each other: use a statistical "
                                                            "threshold such as mads_from_median")
    windows, out_of_bounds = _debounce(reader, obj, where)
    return RankCheck(aggregation, condition, windows, out_of_bounds)


def _parse_window_check(reader: StrictReader, raw: Any, where: str, aggregations: Tuple[str, ...]) -> WindowCheck:
    obj = reader.object(raw, where, {"aggregation", "condition", "history", "history_runs", "trailing_windows",
                                  "min_effect_abs", "min_effect_rel", "debounce"})
    aggregation = _aggregation_of(reader, obj, where, aggregations)
    if "condition" not in obj:
        reader.fail(f"{where}.condition", "is required")
    history = obj.get("history", "step_aligned")
    if history not in ("step_aligned", "trailing"):
        reader.fail(f"{where}.history", f"{history!r} is not 'step_aligned' or 'trailing'")
    windows, out_of_bounds = _debounce(reader, obj, where)
    effects: Dict[str, Any] = {key: obj[key] for key in ("min_effect_abs", "min_effect_rel") if key in obj}
    return WindowCheck(
        aggregation=aggregation, condition=_parse_condition(reader, obj["condition"], f"{where}.condition", effects),
        history=history,
        history_runs=reader.integer(obj.get("history_runs", 5), f"{where}.history_runs", minimum=1),
        trailing_windows=reader.integer(obj.get("trailing_windows", 10), f"{where}.trailing_windows", minimum=1),
        debounce_windows=windows, debounce_out_of_bounds=out_of_bounds)


def _strategies(reader: StrictReader, value: Any, key: str) -> Tuple[str, ...]:
    names = reader.strings(value, key)
    if not names:
        reader.fail(key, "must name at least one strategy")
    for name in names:
        if name not in STRATEGIES:
            reader.fail(key, f"{name!r} is not one of {list(STRATEGIES)}")
    return tuple(dict.fromkeys(names))
