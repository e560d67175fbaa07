"""What a value alert says: how its bounds were computed, how far the value is off, its unit and what to do next.

The value alerts (``metric_out_of_bounds``, ``baseline_shifted``, ``window_out_of_bounds``,
``rank_straggler``) carry in their details, besides the threshold (``core.bounds.threshold_details``):

- ``centre``, ``scale`` and ``multiplier``: a statistical bound is centre ∓ multiplier × scale, with the
  scale of its kind (population standard deviation, 1.4826·MAD, 2.2219·Qn). For ``stddevs_from_mean`` and
  ``mads_from_median`` the multiplier is k and the scale is the margin over k, so it includes the widening
  of a re-baselined history's warm-up (``scale_from``: ``"previous_level"``); for ``false_alert_rate`` the
  scale is the history's, or for a young level the one pooled with the level before it (``scale_from``:
  ``"pooled_levels"``), and the multiplier the calibrated one. All None for a fixed value;
- ``change_pct`` (relative to the centre, or to the fixed value) and ``change_in_scales``;
- ``previous_value`` and ``previous_run``: the value compared last (the metric's previous successful run,
  the same-step window of the latest compared run, the previous window of the run); not for stragglers;
- ``step``: the run's step of the value (for windows: the window's last step).

These come from the checks (:func:`threshold_facts`, :func:`change_facts`). :func:`finish_alert` then adds
what the test's config says, for every alert: ``unit`` (``MetricCollectionConfig.unit_for``), ``report_url``
(``RegressionTestConfig.report_url``) and ``next_steps`` (``core.triage.triage_commands``), and writes the
message with the unit (:func:`describe`). It is the one place messages of value alerts are worded, so the
alerts table, the e-mail and the report say the same. Everything here is a pure function of its input.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from core.bounds import Bounds, minimum_history, pooled_scale, pools_levels
from core.config import SuccessCondition, TestConfig
from core.records import Alert
from core.stats import false_alert_scale, mean_and_pstdev, median, robust_scale
from core.triage import triage_commands
from core.vocabulary import AlertKind

VALUE_ALERT_KINDS = frozenset((AlertKind.METRIC_OUT_OF_BOUNDS, AlertKind.BASELINE_SHIFTED, AlertKind.METRIC_SHIFTED,
                               AlertKind.WINDOW_OUT_OF_BOUNDS, AlertKind.RANK_STRAGGLER))
CENTRE_NAMES = {"stddevs_from_mean": "mean", "mads_from_median": "median", "false_alert_rate": "median"}
SCALE_NAMES = {"stddevs_from_mean": "stddev", "mads_from_median": "robust scale",
               "false_alert_rate": "robust scale (Qn)"}
PREVIOUS_LEVEL = "previous_level"
POOLED_LEVELS = "pooled_levels"
MINUS = "\u2212"  # −
TIMES = "\u00d7"  # ×


# -- the numbers (the checks) ----------------------------------------------------------------------------


def threshold_facts(condition: SuccessCondition, bounds: Bounds, history: Sequence[float],
                    previous: Sequence[float] = ()) -> Dict[str, Any]:
    """``centre``, ``scale`` and ``multiplier`` of the bounds ``core.bounds.compute_bounds`` gave for
    ``history`` (and ``previous``, the history before the baseline last moved); None for a fixed value.

    Read back from the bounds, not computed again, so that they say what judged the value: the margin
    |bound − centre| is always multiplier × scale."""
    facts: Dict[str, Any] = {"centre": bounds.centre, "scale": None, "multiplier": None}
    bound = bounds.lower if bounds.lower is not None else bounds.upper
    if bounds.centre is None or bound is None:
        return facts
    kind, k = condition.threshold
    margin = abs(bound - bounds.centre)
    needed = max(condition.wait_for_n_points_of_history, minimum_history(condition))
    bridged = len(history) < needed and len(previous) >= needed
    pooled = pools_levels(condition, history, previous)
    if kind != "false_alert_rate" and k > 0:
        scale, multiplier = margin / k, k
    else:
        scale = pooled_scale(history, previous) if pooled else _scale(kind, previous if bridged else history)
        multiplier = margin / scale if scale > 0 else (0.0 if kind == "false_alert_rate" else k)
    facts.update(scale=scale, multiplier=multiplier)
    if pooled:
        facts["scale_from"] = POOLED_LEVELS
    elif bridged:
        facts["scale_from"] = PREVIOUS_LEVEL
    return facts


def _scale(kind: str, values: Sequence[float]) -> float:
    if not values:
        return 0.0
    if kind == "stddevs_from_mean":
        return mean_and_pstdev(values)[1]
    centre = median(values)
    return robust_scale(values, centre) if kind == "mads_from_median" else false_alert_scale(values, centre)


def change_facts(value: float, reference: Optional[float], scale: Optional[float]) -> Dict[str, Optional[float]]:
    """``change_pct``: value vs ``reference`` (the centre or the fixed value) in % of its magnitude (None at 0);
    ``change_in_scales``: the same difference in scales (None without a positive scale)."""
    pct = (value - reference) / abs(reference) * 100 if reference is not None and reference != 0 else None
    in_scales = (value - reference) / scale if reference is not None and scale is not None and scale > 0 else None
    return {"change_pct": _finite(pct), "change_in_scales": _finite(in_scales)}


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def previous_facts(values: Sequence[float], runs: Sequence[str]) -> Dict[str, Any]:
    """``previous_value`` and ``previous_run``: the last of ``values`` (of ``runs``), None when there is none."""
    return {"previous_value": values[-1] if values else None, "previous_run": runs[-1] if runs else None}


# -- the words (one place) --------------------------------------------------------------------------------


def number(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def with_unit(value: Optional[float], unit: Optional[str]) -> str:
    return number(value) + (f" {unit}" if unit and value is not None else "")


def bounds_text(lower: Optional[float], upper: Optional[float], unit: Optional[str] = None) -> str:
    """``(lower, upper)``, a missing lower bound as -inf and a missing upper one as +inf."""
    low = "-inf" if lower is None else number(lower)
    high = "+inf" if upper is None else number(upper)
    return f"({low}, {high})" + (f" {unit}" if unit else "")


def _float(details: Mapping[str, Any], key: str) -> Optional[float]:
    value = details.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(details: Mapping[str, Any], key: str) -> Optional[int]:
    value = details.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def basis_text(kind: str, details: Mapping[str, Any]) -> str:
    """What a statistical bound was computed from: "from 20 earlier runs", "of the other 7 ranks", ..."""
    if kind == AlertKind.RANK_STRAGGLER:
        ranks = details.get("values_by_rank")
        return f"of the other {_plural(len(ranks) - 1, 'rank')}" if isinstance(ranks, dict) and ranks else ""
    size = _int(details, "history_size")
    if size is None:
        return ""
    if kind == AlertKind.WINDOW_OUT_OF_BOUNDS:
        if details.get("history") == "trailing":
            return f"from the {_plural(size, 'previous window')} of this run"
        share = _float(details, "run_offset_share")
        stands = (f", each run's standing over its first windows taken off (this run's: {share:+.2%})"
                  if share is not None else "")
        return f"from the same-step windows of {_plural(size, 'earlier run')}{stands}"
    segment = details.get("history_segment")
    return f"from {_plural(size, 'earlier run')}" + (f" with {segment}" if isinstance(segment, str) and segment else "")


def threshold_text(kind: str, details: Mapping[str, Any], lower: Optional[float], upper: Optional[float],
                   unit: Optional[str] = None) -> str:
    """How the bounds were computed: "fixed value 60 s", or "median 74.6 − 5 × robust scale 0.3 from 20
    earlier runs"; "" when the details do not say (an alert of an older writer)."""
    threshold = details.get("threshold")
    if threshold == "fixed_value":
        return f"fixed value {with_unit(_float(details, 'fixed_value'), unit)}"
    centre, scale, multiplier = (_float(details, key) for key in ("centre", "scale", "multiplier"))
    if not isinstance(threshold, str) or threshold not in CENTRE_NAMES or centre is None:
        return ""
    text = f"{CENTRE_NAMES[threshold]} {with_unit(centre, unit)}"
    if scale is not None and multiplier is not None:
        sign = MINUS if lower is not None else "+"
        text += f" {sign} {multiplier:.3g} {TIMES} {SCALE_NAMES[threshold]} {with_unit(scale, unit)}"
    if threshold == "false_alert_rate" and _float(details, "false_alert_rate") is not None:
        text += f" (false alert rate {number(_float(details, 'false_alert_rate'))})"
    basis = basis_text(kind, details)
    text += f" {basis}" if basis else ""
    if details.get("scale_from") == PREVIOUS_LEVEL:
        text += ", the scale from before the baseline moved"
    elif details.get("scale_from") == POOLED_LEVELS:
        text += ", the scale pooled with the level before the baseline moved"
    return text


def change_text(details: Mapping[str, Any]) -> str:
    """"change −5.5% (−13.7 scales)" vs the centre or fixed value; "" when unknown."""
    pct, scales = _float(details, "change_pct"), _float(details, "change_in_scales")
    if pct is None and scales is None:
        return ""
    parts = ([f"{pct:+.3g}%"] if pct is not None else []) + ([f"{scales:+.3g} scales"] if scales is not None else [])
    reference = "the fixed value" if details.get("threshold") == "fixed_value" else \
        f"the {CENTRE_NAMES.get(str(details.get('threshold')), 'centre')}"
    text = parts[0] + (f" ({parts[1]})" if len(parts) > 1 else "")
    return f"change {text} vs {reference}".replace("-", MINUS)


def previous_text(details: Mapping[str, Any], unit: Optional[str] = None) -> str:
    """"previous 74.5 % (run r07)"; "" without a previous value."""
    value = _float(details, "previous_value")
    if value is None:
        return ""
    run = details.get("previous_run")
    return f"previous {with_unit(value, unit)}" + (f" (run {run})" if isinstance(run, str) and run else "")


def _window_text(details: Mapping[str, Any]) -> str:
    window = details.get("window")
    if not isinstance(window, dict):
        return ""
    return (f" in {window.get('kind')} window {window.get('index')} "
            f"(steps {window.get('start_step')}-{window.get('end_step')})")


def describe(alert: Alert, unit: Optional[str] = None) -> str:
    """The message of a value alert: what is off, by how much, against what; ``alert.message`` for others."""
    details = alert.details
    if alert.kind not in VALUE_ALERT_KINDS or alert.metric is None or alert.value is None:
        return alert.message
    how = threshold_text(alert.kind, details, alert.lower_bound, alert.upper_bound, unit)
    bounds = bounds_text(alert.lower_bound, alert.upper_bound, unit)
    tail = "; ".join(part for part in (change_text(details), previous_text(details, unit)) if part)
    tail = f"; {tail}" if tail else ""
    value = f"{alert.metric} = {with_unit(alert.value, unit)}"
    if alert.kind == AlertKind.BASELINE_SHIFTED:
        runs = details.get("runs")
        count = len(runs) if isinstance(runs, list) else 0
        return (f"{alert.metric} moved from {with_unit(_float(details, 'old_centre'), unit)} to "
                f"{with_unit(_float(details, 'new_centre'), unit)} in {count} runs in a row from run "
                f"{details.get('first_run')}; its baseline now follows the new level. This run: {value}, "
                f"outside the old bounds {bounds}: {how}{tail}")
    if alert.kind == AlertKind.METRIC_SHIFTED:
        runs = details.get("runs")
        count = len(runs) if isinstance(runs, list) else 0
        size, statistic, threshold = (_float(details, key) for key in ("size_in_scales", "statistic", "shift_threshold"))
        return (f"{alert.metric} shifted worse in the {count} runs from run {details.get('first_run')}: their mean "
                f"{with_unit(_float(details, 'shifted_mean'), unit)} against the median "
                f"{with_unit(_float(details, 'old_centre'), unit)} {basis_text(alert.kind, details)} "
                f"({number(size)} robust scales of {with_unit(_float(details, 'scale'), unit)}; shift statistic "
                f"{number(statistic)} over {number(threshold)}, false alert rate "
                f"{number(_float(details, 'false_alert_rate'))}), though no run was out of bounds. This run: "
                f"{value}{tail}")
    if alert.kind == AlertKind.RANK_STRAGGLER:
        host = details.get("host")
        where = f"rank {details.get('rank')}" + (f" on {host}" if isinstance(host, str) and host else "")
        return f"{where} is a straggler: {value}{_window_text(details)} is outside bounds {bounds}: {how}{tail}"
    return f"{value}{_window_text(details)} is outside bounds {bounds}: {how}{tail}"



def duration_text(seconds: float) -> str:
    """``2 h 5 min``, ``14 min``, ``40 s``: how long a run ran, to the minute past a minute."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{max(0, int(seconds))} s"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def utc_minute(seconds: float) -> str:
    """``2025-11-28 00:16``: a time to the minute, UTC."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def best_value_text(value: float, step: Optional[int]) -> str:
    """"0.734 at step 900": the best value a run's accuracy reached, for a lifecycle alert."""
    return f"{value:.6g}" + ("" if step is None else f" at step {step}")


def run_lifecycle_text(started_at: Optional[float], last_heard_at: Optional[float],
                       ranks_missing: Sequence[int] = (), best: Any = None) -> str:
    """How a run went, for a lifecycle alert: how long it ran, from when, when it was last heard from (a missing
    run's end is its last message), the best value its accuracy reached (``best``: the alert's
    ``details.best_value``, user-reachable JSON, used only when well-formed), and the ranks of a distributed
    run that never finished; "" if unknown."""
    parts = []
    if started_at is not None and last_heard_at is not None:
        parts.append(f"ran {duration_text(last_heard_at - started_at)} from {utc_minute(started_at)} UTC")
    if last_heard_at is not None:
        parts.append(f"last heard from {utc_minute(last_heard_at)} UTC")
    value = _float(best, "value") if isinstance(best, dict) else None
    if value is not None and math.isfinite(value) and isinstance(best.get("metric"), str):
        parts.append(f"best {best['metric']} {best_value_text(value, _int(best, 'step'))}")
    if ranks_missing:
        listed = ", ".join(str(rank) for rank in ranks_missing)
        parts.append(f"rank{'s' if len(ranks_missing) > 1 else ''} {listed} never finished")
    return "; ".join(parts)

# What "scales" means wherever a change is given in them (the report's footnote, the e-mail's note).
SCALES_NOTE = ("scales: how far a value is from the centre of its history, in the scale its bounds used: the "
               "standard deviation (stddevs_from_mean), the robust standard deviation MAD \u00d7 1.4826 "
               "(mads_from_median) or Qn \u00d7 2.2219 (false_alert_rate) of the history.")

# -- what the test's config adds ---------------------------------------------------------------------------


def finish_alert(alert: Alert, config: TestConfig, destination: Sequence[Tuple[str, str]] = ()) -> Alert:
    """The alert with ``unit``, ``report_url`` (its page on the dashboard when the config has ``dashboard_url``,
    else the run's page of ``report_url_pattern``), ``dashboard_url`` and ``next_steps`` in its details, and its
    message with the unit.

    Applied once to every alert the pipeline raises, with the config valid at its event time; the alert's
    id does not change. ``destination``: where its triage commands point (``core.triage.triage_commands``)."""
    details = dict(alert.details)
    if alert.metric is not None:
        details["unit"] = config.metric_collection.unit_for(alert.metric)
    dashboard = config.regression_test.dashboard_alert_url(alert.alert_id)
    url = dashboard or config.regression_test.report_url(alert.test, alert.run)
    if url is not None:
        details["report_url"] = url
    details["next_steps"] = triage_commands(alert, destination)
    if dashboard is not None:  # a shell comment: every step still runs as written
        details["dashboard_url"] = dashboard
        details["next_steps"].append(f"# or in one click on the dashboard: {dashboard}")
    finished = dataclasses.replace(alert, details=details)
    return dataclasses.replace(finished, message=describe(finished, details.get("unit")))
