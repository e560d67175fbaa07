"""What a detector that learns each metric's scale from its history can catch: the ceilings behind issue 29's targets.

The detection benchmark's oracle (``bench/detection/oracle.py``) knows each
run's level and the noise's exact distribution, scale included, so it says
what is reachable only for a detector that needs no history. trainguard, and
every detector a user can run, learns the scale from the runs it has seen.
This computes what the best such rules catch, with the noise's family given to
them for free, at one check's false-alert rate p:

- **The suite's accuracy drops** (``bench/detection/suite.py``, the seeds'
  plans: the same runs for normal and t3 noise), each at its own history: the
  runs since accuracy's level last moved, faulted runs left out (a generous
  history: no detector knows which runs were faulted). On normal noise the rule
  is the t prediction interval (mean and standard deviation of the history,
  Student's t quantile), the most powerful rule that does not depend on the
  noise's location and scale, so no such rule catches more; its power is exact
  (the noncentral t). On t3 noise the rule is the t3 likelihood's estimate of
  location and scale (the noise's own family), its multiplier calibrated by
  simulation to hold p; an efficient rule, not a proven best one.
- **The scale's estimator**: 6σ drops caught at a few history sizes, and the
  cutoff's median distance from the level, by rules that hold p on t3 noise
  (the default's guarantee) and are scored on t3 and normal noise: trainguard's
  median and Qn, the t likelihood with 3, 6 and 12 degrees of freedom, and the
  mean and standard deviation; on clean histories, and on histories where a
  share of the values (``--contamination``, 10%) lie 2–3σ on the bad side, as
  the small faults a check lets through do.
- **Persistent shifts**: a shift that stays, seen within its first 5 runs by a
  rule that knows the level, the scale and the run it started at, on normal
  noise, at the shift check's rate (a quarter of p): the mean of those 5 runs
  against the normal quantile. A ceiling for any shift detector.

p defaults to 1/300, the oracle's share of the default budget (1 false alert
per 100 runs over three noisy checks); trainguard's own share on the
benchmark's config is 1/500 (its constant metric and shift checks take shares
too), so at p = 1/300 the ceilings are generous to the issue's targets. ::

    python bench/bench_detection_ceiling.py [--rate 0.00333] [--seeds 1,2,3] [--histories 4000] [--sizes 12,20,30]

About 20 seconds. scipy comes with the bench extra.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scipy import stats  # scipy comes with the bench extra (ruptures needs it)

from bench.detection.suite import ACCURACY, ACCURACY_DROPS, SHIFT_SIGMAS, SuiteSpec, TestPlan, plan_test, unit_noise
from core.config import SHIFT_SHARE
from core.stats import MAD_TO_SIGMA
from scripts.calibrate_false_alert_rate import multiplier, normal_sf, summaries, t3_sf
from trainguard.cli import DASHES_NOTE, StrictArgumentParser, comma_separated_ints

DEFAULT_RATE = 1 / 300
SHIFT_RUNS = 5  # the "within 5 runs"
Estimator = Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]]  # histories (rows) -> (centre, scale) each


def drop_histories(seeds: Sequence[int], tests: int = 12, runs: int = 60) -> List[Tuple[float, int]]:
    """(size in σ, history length) of every accuracy drop in the seeds' suites (the plans are the noise's)."""
    found = []
    for seed in seeds:
        for index in range(tests):
            plan = plan_test(SuiteSpec(tests=tests, runs=runs, seed=seed), index)
            for run, fault in sorted(plan.faults.items()):
                if fault.kind in ACCURACY_DROPS:
                    found.append((ACCURACY_DROPS[fault.kind], clean_history(plan, run)))
    return found


def clean_history(plan: TestPlan, run: int) -> int:
    """Runs before ``run`` since accuracy's level last moved, without a fault."""
    since = max([0] + [c.first_run for c in plan.changes if c.metric is ACCURACY and c.first_run <= run])
    return sum(1 for r in range(since, run) if r not in plan.faults)


def t_interval_power(n: int, rate: float, drop: float) -> float:
    """P(the t prediction interval of n normal values catches a value ``drop`` σ out) at one-sided ``rate``."""
    if n < 2:
        return 0.0
    return float(stats.nct.sf(stats.t.ppf(1 - rate, n - 1), n - 1, drop / math.sqrt(1 + 1 / n)))


def upper_tail(family: str, z: np.ndarray) -> np.ndarray:
    """P(noise > z) for unit-variance noise of the family (the calibration script's tails)."""
    return normal_sf(z) if family == "normal" else t3_sf(z * math.sqrt(3))


def t_likelihood(df: float, iterations: int = 100) -> Estimator:
    """Location and scale maximizing the Student t(df) likelihood (EM), from the median and MAD."""
    def estimate(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        centre = np.median(x, axis=1)
        scale = MAD_TO_SIGMA * np.median(np.abs(x - centre[:, None]), axis=1)
        for _ in range(iterations):
            weight = (df + 1) / (df + ((x - centre[:, None]) / scale[:, None]) ** 2)
            centre = (weight * x).sum(axis=1) / weight.sum(axis=1)
            scale = np.sqrt((weight * (x - centre[:, None]) ** 2).mean(axis=1))
        return centre, scale
    return estimate


def mean_sd(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    return x.mean(axis=1), x.std(axis=1, ddof=1)


ESTIMATORS: Dict[str, Estimator] = {
    "median and Qn (trainguard)": summaries,  # as core/bounds.py computes them
    "t3 likelihood": t_likelihood(3),
    "t6 likelihood": t_likelihood(6),
    "t12 likelihood": t_likelihood(12),
    "mean and standard deviation": mean_sd,
}


def calibrated(centre: np.ndarray, scale: np.ndarray, rate: float) -> float:
    """The c at which a healthy value of unit-variance t3 noise passes centre + c·scale with probability ``rate``,
    averaged over the histories: the calibration script's ``multiplier``, in this bench's unit of noise."""
    return multiplier(rate, centre, scale, sf=lambda z: upper_tail("t3", z))


@dataclasses.dataclass(frozen=True)
class Scored:
    """A rule on one family's histories."""
    rate: float  #: its false-alert rate over p
    caught: Dict[float, float]  #: per drop in σ, the chance it is caught
    distance: float  #: the cutoff's median distance from the level, in σ


def powers(estimator: Estimator, n: int, rate: float, drops: Sequence[float], histories: int,
           rng: np.random.Generator, contamination: float = 0.0) -> Dict[str, Scored]:
    """Per family scored: the false-alert rate over p, each drop's chance of being caught, and the cutoff's
    median distance from the level in σ, for the rule calibrated to hold ``rate`` on clean t3 noise and scored
    on histories of which a share ``contamination`` of the values lie 2–3σ on the bad side."""
    c = calibrated(*estimator(unit_noise(rng, "t3", (histories, n))), rate)
    scored: Dict[str, Scored] = {}
    for family in ("t3", "normal"):
        values = unit_noise(rng, family, (histories, n))
        if contamination:
            values = values + (rng.random(values.shape) < contamination) * rng.uniform(2.0, 3.0, values.shape)
        centre, scale = estimator(values)
        cutoff = centre + c * scale
        scored[family] = Scored(float(np.mean(upper_tail(family, cutoff))) / rate,
                                {d: float(np.mean(upper_tail(family, cutoff - d))) for d in drops},
                                float(np.median(cutoff)))
    return scored


def drop_ceilings(drops: Sequence[Tuple[float, int]], rate: float, histories: int, seed: int
                  ) -> Dict[str, Dict[float, Tuple[float, int]]]:
    """Per family: per drop size, (expected drops caught, drops) by its ceiling rule at each drop's history."""
    rng = np.random.default_rng(seed)
    sizes = sorted({d for d, _ in drops})
    t3_power = {n: powers(ESTIMATORS["t3 likelihood"], n, rate, sizes, histories, rng)["t3"].caught
                for n in sorted({n for _, n in drops if n >= 2})}
    found: Dict[str, Dict[float, Tuple[float, int]]] = {"normal": {}, "t3": {}}
    for size in sizes:
        at = [n for d, n in drops if d == size]
        found["normal"][size] = (sum(t_interval_power(n, rate, size) for n in at), len(at))
        found["t3"][size] = (sum(t3_power[n][size] if n >= 2 else 0.0 for n in at), len(at))
    return found


def shift_ceiling(sigmas: float, rate: float, runs: int = SHIFT_RUNS) -> float:
    """P(the mean of a shift's first ``runs`` runs, level, scale and start known, passes the normal quantile at
    the shift check's rate) on normal noise."""
    return float(stats.norm.sf(stats.norm.isf(rate * SHIFT_SHARE) - sigmas * math.sqrt(runs)))


def main(argv: Optional[List[str]] = None) -> int:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="one check's one-sided false-alert rate p")
    parser.add_argument("--seeds", type=comma_separated_ints, default=[1, 2, 3], help="comma-separated suite seeds")
    parser.add_argument("--histories", type=int, default=4000, help="simulated histories per size and family")
    parser.add_argument("--sizes", type=comma_separated_ints, default=[12, 20, 30],
                        help="history sizes of the estimator table")
    parser.add_argument("--contamination", type=float, default=0.1,
                        help="share of a history's values 2–3σ on the bad side, in the estimator table's second "
                             "columns")
    parser.add_argument("--seed", type=int, default=7, help="the simulation's seed")
    args = parser.parse_args(argv)
    if not 0 < args.rate < 0.5:
        parser.error(f"--rate must be between 0 and 0.5, got {args.rate!r}")
    if not 0 <= args.contamination < 1:
        parser.error(f"--contamination must be a share in [0, 1), got {args.contamination!r}")

    drops = drop_histories(args.seeds)
    ceilings = drop_ceilings(drops, args.rate, args.histories, args.seed)
    sizes = sorted(ceilings["normal"])
    largest = sorted(n for d, n in drops if d == max(sizes))
    print(f"## Accuracy drops of seeds {','.join(map(str, args.seeds))} at p = {args.rate:.5f}, each at its own "
          f"history (the {len(largest)} largest: {largest[0]}–{largest[-1]} runs, median {largest[len(largest) // 2]})\n")
    print("| noise | rule (the family known) | " + " | ".join(f"−{d:g}σ" for d in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for family, rule in (("normal", "t prediction interval (no scale-invariant rule catches more)"),
                         ("t3", "t3 likelihood's location and scale, calibrated")):
        cells = [f"{caught:.1f}/{count} ({caught / count:.0%})" for caught, count in
                 (ceilings[family][d] for d in sizes)]
        print(f"| {family} | {rule} | " + " | ".join(cells) + " |")

    rng = np.random.default_rng([args.seed, 1])
    share = f"{args.contamination:.0%} of it 2–3σ worse"
    print(f"\n## 6σ drops caught by rules that hold p = {args.rate:.5f} on t3 noise, with a clean history and with "
          f"{share} (the cutoff's median distance from the level in σ, clean)\n")
    print(f"| history | scale from | t3: caught | t3: cutoff | t3: caught, {share} "
          f"| normal: caught | normal: cutoff | normal: caught, {share} |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for name, estimator in ESTIMATORS.items():
            clean = powers(estimator, n, args.rate, (6.0,), args.histories, rng)
            dirty = powers(estimator, n, args.rate, (6.0,), args.histories, rng, args.contamination)
            cells = [f"{clean[f].caught[6.0]:.0%} | {clean[f].distance:.1f}σ | {dirty[f].caught[6.0]:.0%}"
                     for f in ("t3", "normal")]
            print(f"| {n} | {name} | " + " | ".join(cells) + " |")

    print(f"\n## Persistent shifts seen within {SHIFT_RUNS} runs, normal noise, level, scale and start known, at the "
          f"shift check's rate {args.rate * SHIFT_SHARE:.5f}\n")
    print("| shift | caught |")
    print("|---|---|")
    for sigmas in sorted(SHIFT_SIGMAS.values()):
        print(f"| {sigmas:g}σ | {shift_ceiling(sigmas, args.rate):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
