"""Which tails a metric's noise has, measured on its stored history: the evidence behind ``"noise": "normal"``.

A ``false_alert_rate`` cutoff is calibrated for heavy-tailed noise (Student t,
3 degrees of freedom) unless its condition says ``"noise": "normal"``; on normal
noise the heavy-tailed cutoff lies about twice as far from the centre as it needs
to, and misses drops the normal one catches. A few dozen runs of one test cannot
tell the two apart, so the choice is the user's, and this module measures what the
fleet's history says about it, for ``trainguard-backtest --suggest_noise``.

The measure is a likelihood ratio. Each successful run's value that joined its
history (it was within bounds, so faults that were caught do not count) is
standardized against the history that judged it: r = (value − median) / (scale ·
√(1 + π/2 / n)), the scale being the cutoff's own (``core.stats.false_alert_scale``)
and the root widening it for the median's uncertainty, once the history holds
``MIN_HISTORY`` values. Its log-density under normal noise minus that under t3
noise (whose robust scale is ``T3_ROBUST_SCALE`` of its scale parameter) sums over
the values; both densities are cut at the value's bound on the worse side, since
only values within it are counted. Under t3 noise the ratio is a martingale of mean
one, so the chance that it ever reaches ``ODDS`` for normal is at most 1/``ODDS``
(Ville's inequality; the plug-in centre and scale make that approximate, and
``tests/core/test_noise_evidence.py`` measures it).

A metric of one test rarely has enough runs to decide alone (about 75 values of
normal noise reach odds of 20), so the evidence of a metric name is summed over the
fleet's tests. A (test, metric) is suggested ``normal`` when the fleet's sum for its
metric reaches ``ODDS`` and its own values do not lean the other way.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from core.backtest import StoredHistory, backtest
from core.config import HEAVY_TAILED, NORMAL, Configs, RegressionTestConfig
from core.history import MetricHistory, check_metric, history_segment
from core.records import Alert, MetricObservation
from core.stats import false_alert_scale, median, t3_upper_tail
from core.vocabulary import RunStatus

MIN_HISTORY = 10  # a value counts once the history that judged it holds this many
ODDS = 20.0  # the likelihood ratio for normal noise at which the fleet's evidence suggests it
T3_ROBUST_SCALE = 1.23  # false_alert_scale of t3 noise, in units of its scale parameter (simulated, 2026-11-26)
MEDIAN_VARIANCE = math.pi / 2
QN_EFFICIENCY = 0.82  # Qn's asymptotic efficiency on normal noise: its scale is worth this share of n - 1 values
_LOG_T3_DENSITY = math.log(2 / (math.pi * math.sqrt(3)))


def normal_log_density(r: float, n: int) -> float:
    """Of r under normal noise, as measured from a history of ``n`` values: a Student t of ``QN_EFFICIENCY`` ·
    (n − 1) degrees of freedom, since the scale is estimated too."""
    nu = QN_EFFICIENCY * (n - 1)
    return (math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
            - (nu + 1) / 2 * math.log1p(r * r / nu))


def normal_upper_tail(r: float) -> float:
    return 0.5 * math.erfc(r / math.sqrt(2))


def t3_log_density(r: float) -> float:
    """Of t3 noise with scale 1 / ``T3_ROBUST_SCALE``: what r is when t3 values are divided by their robust scale."""
    t = r * T3_ROBUST_SCALE
    return _LOG_T3_DENSITY - 2 * math.log1p(t * t / 3) + math.log(T3_ROBUST_SCALE)


def t3_robust_upper_tail(r: float) -> float:
    """Of t3 noise divided by its robust scale, as ``t3_log_density``."""
    if math.isinf(r):
        return 0.0 if r > 0 else 1.0
    return t3_upper_tail(r * T3_ROBUST_SCALE)


def value_log_ratio(value: float, history: Sequence[float], cutoff: Optional[float], mirror: Optional[float],
                    worse: int) -> Optional[float]:
    """ln(likelihood under normal noise / under t3 noise) of ``value`` judged by ``history`` (the counted values
    of its level); None while the history is shorter than ``MIN_HISTORY``, has no spread, or the value lies
    beyond the improvement bound ``mirror`` (a change, not noise). ``worse``: +1 when higher is worse.

    Only a value on the better side of the median is measured; one on the worse side says only which side it
    is on, which both models give the same chance. The worse side holds every regression that stayed within
    the cutoff (a 3σ accuracy drop is a t3 tail value to this measure), so looking there would count faults
    as heavy tails; the better side holds noise alone. Both likelihoods are of a value counted within
    (``mirror``, ``cutoff``), so each is divided by its model's chance of that."""
    n = len(history)
    if n < MIN_HISTORY:
        return None
    centre = median(history)
    scale = false_alert_scale(history, centre) * math.sqrt(1 + MEDIAN_VARIANCE / n)
    if not scale > 0:
        return None
    u = worse * (value - centre) / scale  # > 0: the worse side
    beyond_cutoff = math.inf if cutoff is None else worse * (cutoff - centre) / scale
    beyond_mirror = math.inf if mirror is None else -worse * (mirror - centre) / scale
    if -u >= beyond_mirror or beyond_cutoff <= 0 or beyond_mirror <= 0:
        return None  # beyond the improvement bound; or bounds at the centre itself (a history without spread)
    normal_within = 1 - normal_upper_tail(beyond_cutoff) - normal_upper_tail(beyond_mirror)
    t3_within = 1 - t3_robust_upper_tail(beyond_cutoff) - t3_robust_upper_tail(beyond_mirror)
    if u > 0:
        normal_seen = math.log(0.5 - normal_upper_tail(beyond_cutoff))
        t3_seen = math.log(0.5 - t3_robust_upper_tail(beyond_cutoff))
    else:
        normal_seen, t3_seen = normal_log_density(u, n), t3_log_density(u)
    return normal_seen - math.log(normal_within) - t3_seen + math.log(t3_within)


def odds(log_ratio: float) -> float:
    """The likelihood ratio for normal noise of a ``log_ratio``, capped at 1e12 either way (for printing)."""
    return math.exp(max(-27.6, min(27.6, log_ratio)))


@dataclasses.dataclass(frozen=True)
class NoiseEvidence:
    """The evidence of some values: how many, and ln(likelihood under normal noise / under t3 noise)."""
    values: int = 0
    log_ratio: float = 0.0

    def plus(self, other: NoiseEvidence) -> NoiseEvidence:
        return NoiseEvidence(self.values + other.values, self.log_ratio + other.log_ratio)



@dataclasses.dataclass(frozen=True)
class NoiseSuggestion:
    """What the stored history says of one (test, metric) that has a ``false_alert_rate`` check."""
    test: str
    metric: str
    own: NoiseEvidence  #: this test's values
    fleet: NoiseEvidence  #: every test's values of the same metric name, this one's included
    current: str  #: the condition's ``noise`` now
    suggested: str  #: ``normal`` when the fleet's odds reach ``ODDS`` and its own lean no other way

    @property
    def changes(self) -> bool:
        return self.current != self.suggested


def measure_noise(history: StoredHistory, configs: Configs) -> Dict[Tuple[str, str], NoiseEvidence]:
    """Per (test, metric) with a one-sided ``false_alert_rate`` condition, the evidence of its counted values,
    re-evaluated under ``configs`` as ``trainguard-backtest`` does. When a history restarts at a new level
    (an improvement that stayed, a shift, ``rebaseline_after`` runs), the values it restarts from were judged
    against the old level: they measured the change, not the noise, and are taken back. A change the history
    never follows (an improvement inside the improvement bound that the shift statistic missed) stays in, as
    heavy-tailed evidence: the measure errs towards the default."""
    found: Dict[Tuple[str, str], Dict[str, float]] = collections.defaultdict(dict)

    def measured_check(whole: MetricHistory, observation: MetricObservation,
                       config: RegressionTestConfig) -> Tuple[Dict[str, Any], Optional[Alert]]:
        condition = config.condition_for(observation.metric)
        if (condition is None or condition.false_alert_rate is None or condition.comparison.is_equal
                or observation.status != RunStatus.SUCCESS):
            return check_metric(whole, observation, config)
        segment = whole.judging(history_segment(observation.run_data, config.history_by_for(observation.metric)),
                                observation.run, observation.status)
        values, level = segment.values, segment.previous
        row, alert = check_metric(whole, observation, config)
        ratios = found[(observation.test, observation.metric)]
        if segment.previous is not level:  # a new level: its runs so far were judged against the old one
            for entry in segment.entries:
                ratios.pop(entry.run, None)
            return row, alert
        if row["within_bounds"] is True:
            greater = condition.comparison.greater
            lower, upper = row["metric_lower_bound"], row["metric_upper_bound"]
            cutoff, mirror = (lower, upper) if greater else (upper, lower)
            ratio = value_log_ratio(observation.value, values, cutoff, mirror, -1 if greater else 1)
            if ratio is not None:
                ratios[observation.run] = ratio
        return row, alert

    backtest(history, configs, metric_check=measured_check)
    return {key: NoiseEvidence(len(ratios), math.fsum(ratios.values())) for key, ratios in found.items() if ratios}


def suggest_noise(evidence: Dict[Tuple[str, str], NoiseEvidence], configs: Configs,
                  at: float) -> List[NoiseSuggestion]:
    """A suggestion for every measured (test, metric), against the configs in force at event time ``at``."""
    fleet: Dict[str, NoiseEvidence] = collections.defaultdict(NoiseEvidence)
    for (_, metric), own in evidence.items():
        fleet[metric] = fleet[metric].plus(own)
    suggestions = []
    for (test, metric), own in sorted(evidence.items()):
        condition = configs.for_test(test, at).regression_test.condition_for(metric)
        current = condition.noise if condition is not None else HEAVY_TAILED
        normal = fleet[metric].log_ratio >= math.log(ODDS) and own.log_ratio >= 0
        suggestions.append(NoiseSuggestion(test, metric, own, fleet[metric], current,
                                           NORMAL if normal else HEAVY_TAILED))
    return suggestions
