"""The ceiling: what a detector that knew the truth could catch at a given false-alert rate.

The oracle knows, for every run, the healthy level of each metric (accepted
changes, drift and the run's machine type included; :func:`~bench.detection.suite.level`)
and the exact distribution of the noise around it (sampled from the generator
itself: :func:`noise_quantiles`). It alerts on a run-level value beyond the
level's (1 − p) quantile in the bad direction, with the config's
``min_effect_rel``, and on every failed run, as every detector does. A
persistent shift is not part of the level until the oracle has alerted on it;
from its first alert on the shifted metric on, it is (a perfect re-baseline).

No detector that sees only run-level values can beat it at the same false-alert
rate: it has no estimation error at all. Its rows say how much of a target is
reachable at all. For example, with the budget split evenly over three noisy
checks, a 3σ accuracy drop of t3 noise passes the oracle's cutoff in only a few
percent of runs: the noise itself puts that many healthy runs as far out.
trainguard's live window checks see the points within a run, which this oracle
does not, so for mid-run faults it is a ceiling for the reference detectors
only.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from bench.detection.anchors import MIN_EFFECT_REL
from bench.detection.scoring import Alert
from bench.detection.suite import (
    ACCURACY,
    LOSS,
    STEP_TIME,
    Metric,
    Suite,
    SuiteSpec,
    TestPlan,
    accepted_changes_of,
    generate_run,
    level,
    shifts_of,
)

ORACLE = "oracle (knows each run's level and the noise's distribution)"
NOISY = (ACCURACY, LOSS, STEP_TIME)  # the constant metric has no noise, and the oracle no alert on it
BUDGETS = (3.0, 1.0, 0.3)  # false alerts per 100 healthy runs, split evenly over the NOISY checks
CEILING_BUDGETS = tuple(round(0.1 * k, 1) for k in range(1, 31))  # 0.1 to 3: a seed's best point within a rate
SAMPLE_RUNS = 50_000  # healthy runs sampled per noise family for the quantiles (50 beyond the strictest cutoff)
SAMPLE_SEED = 1_000_003  # a seed no benchmark suite uses, so the quantiles come from other runs


def rate_of(budget: float) -> float:
    """The one-sided false-alert rate of each noisy check at a budget of false alerts per 100 runs."""
    return budget / 100 / len(NOISY)


@dataclasses.dataclass(frozen=True)
class NoiseQuantiles:
    """The standardized healthy residuals of each noisy metric, in its bad direction, sorted."""
    residuals: Mapping[str, np.ndarray]

    def cutoff(self, metric_name: str, rate: float) -> float:
        """The (1 − rate) quantile of the metric's residual, in σ of its noise."""
        return float(np.quantile(self.residuals[metric_name], 1.0 - rate))


def noise_quantiles(noise: str, runs: int = SAMPLE_RUNS) -> NoiseQuantiles:
    """Healthy runs of a test with no change, fault or machine type, drawn by the benchmark's own generator,
    each metric's value standardized by its true level and σ (bad direction positive)."""
    spec = SuiteSpec(tests=1, runs=runs, seed=SAMPLE_SEED, noise=noise)
    plan = TestPlan("oracle", 0, "plain", (), {}, frozenset())
    residuals: Dict[str, List[float]] = {m.name: [] for m in NOISY}
    for index in range(runs):
        record = generate_run(spec, plan, index)
        for metric in NOISY:
            centre, sigma = level(plan, index, metric)
            residuals[metric.name].append((record.values[metric.name] - centre) * metric.worse / sigma)
    return NoiseQuantiles({name: np.sort(np.asarray(values)) for name, values in residuals.items()})


def cached_noise_quantiles(noise: str, directory: str, runs: Optional[int] = None) -> NoiseQuantiles:
    """:func:`noise_quantiles` of ``runs`` (default :data:`SAMPLE_RUNS`) healthy runs, kept in ``directory``
    (about 12 s each to sample; the suites of a family share it)."""
    runs = runs or SAMPLE_RUNS
    path = os.path.join(directory, f"oracle-residuals-{noise}-{runs}.npz")
    if os.path.exists(path):
        with np.load(path) as stored:
            return NoiseQuantiles({m.name: stored[m.name] for m in NOISY})
    quantiles = noise_quantiles(noise, runs)
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".npz", delete=False) as out:
        np.savez(out, **quantiles.residuals)
    os.replace(out.name, path)  # whole or absent, when two suites of a family sample at once
    return quantiles


def detect_suite(suite: Suite, quantiles: NoiseQuantiles, rate: float) -> List[Alert]:
    """The oracle's alerts on a suite at a one-sided rate per noisy check."""
    alerts = []
    for plan in suite.plans:
        for metric in NOISY:
            cutoff = quantiles.cutoff(metric.name, rate)
            runs, values = suite.series(plan.index, metric)
            alerts += [Alert(plan.index, run, metric.tag, "out_of_bounds")
                       for run in _alerted(plan, metric, runs, values, cutoff)]
        alerts += [Alert(plan.index, r.index, None, "job_failed") for r in suite.runs[plan.index] if not r.succeeded]
    return alerts


def _alerted(plan: TestPlan, metric: Metric, runs: Sequence[int], values: Sequence[float], cutoff: float) -> List[int]:
    shifts = [s for s in shifts_of(plan) if s.metric is metric]
    known = dataclasses.replace(plan, changes=tuple(accepted_changes_of(plan)))  # the level without the shifts
    out = []
    for run, value in zip(runs, values):
        centre, sigma = level(known, run, metric)
        if sigma > 0 and (value - centre) * metric.worse > cutoff * sigma \
                and abs(value - centre) >= MIN_EFFECT_REL * abs(centre):
            out.append(run)
            found = [s for s in shifts if s.first_run <= run and s not in known.changes]
            if found:  # the first alert on a shift: from here on it is the level
                known = dataclasses.replace(known, changes=known.changes + tuple(found))
    return out


def oracle_points(suite: Suite, quantiles: NoiseQuantiles,
                  budgets: Sequence[float] = BUDGETS) -> List[Tuple[str, List[Alert]]]:
    """The oracle at each budget: (operating point, alerts)."""
    return [(f"budget {budget:g} (p={rate_of(budget):.2g} a check)", detect_suite(suite, quantiles, rate_of(budget)))
            for budget in budgets]
