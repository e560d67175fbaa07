"""The synthetic fleet: what each test's runs look like, what was injected where, and the truth to score against.

A suite is ``tests`` daily tests of ``runs`` runs. Every run is a training curve
logged a point per step (``loss``, ``step_time``), test accuracy every
``ACCURACY_EVERY`` steps (``Accuracy/test``, an eval metric) and a constant
``epochs``. Its run-level metrics are what trainguard's config computes
(``Accuracy/test_final``, ``loss_final``, ``step_time_average``,
``epochs_final``) and what the reference detectors see.

Noise, in every term: a run-level effect per metric (the seed, the data order,
the host) and a per-point term, each of unit variance times its scale, normal
or Student t with 3 degrees of freedom over sqrt(3) (``noise``). "σ" of a
metric is the standard deviation of its run-level value (both terms
together), known exactly (:func:`noise_sigma`): a 2σ accuracy drop is 2σ of
that, whatever the family.

What a fleet does to a test, each planned from ``(seed, test)`` alone, so the
normal and the t3 suite of a seed carry the same events in the same runs:

- test 0 drifts: step time +0.2% a run, healthy; test 1 runs on two kinds of
  hardware at random, step time x1.25 on one, healthy;
- two accepted changes per test that stay: final loss x1.5 from one run on,
  step time x0.8 from another (an improvement: one-sided checks stay quiet);
- one persistent regression per test that stays, 1σ or 2σ (alternating by
  test) on one metric in its bad direction: scored by the runs it takes to be
  seen (:data:`SHIFT_DEADLINE`);
- one-off faults after a warm-up of ``warmup`` runs, in ``fault_share`` of the
  runs outside those stretches: final accuracy 2σ, 3σ or 6σ lower, loss
  divergence from mid-run, step time x1.15 or x1.6 from mid-run, a crash.

Each change's and shift's first runs (:data:`STRETCH`) carry no one-off fault and
do not count as healthy. Everything here is pure: the same spec gives the
same suite, bit for bit.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

NOISE_FAMILIES = ("t3", "normal")
START = 1767225600.0  # 2026-01-01T00:00:00Z; run i starts i days later
DAY = 86400.0
STEPS = 100  # a point per step: 101 points of loss and step_time a run, 10 count windows of 10
ACCURACY_EVERY = 10  # test accuracy is an eval metric, logged every 10 steps
REBASELINE_AFTER = 3
STRETCH = REBASELINE_AFTER + 2  # runs from a change's (or shift's) first run on that are "the change", not healthy
SHIFT_DEADLINE = 5  # a persistent shift counts as caught when seen within its first 5 runs
ONSET = (0.3, 0.7)  # mid-run faults start in this share of the run
DRIFT_PER_RUN = 1.002  # the drifting test's step time, a run
SLOW_HARDWARE = 1.25  # the bimodal test's step time on its slower hardware
EPOCHS = 90.0

# Noise scales (standard deviations; relative ones multiply the level).
ACCURACY_CURVE = 76.0  # accuracy(p) = 76 (1 - exp(-4 p)) + run effect + point noise
ACCURACY_RUN_SD = 0.3
ACCURACY_POINT_SD = 0.1
LOSS_RUN_REL = 0.02  # loss(p) = (2.3 exp(-3 p) + 0.1) (1 + run effect) (1 + point noise)
LOSS_POINT_REL = 0.02
STEP_SECONDS = 3.0  # step_time = 3 s x levels x (1 + run effect) (1 + point noise)
STEP_RUN_REL = 0.02
STEP_POINT_REL = 0.05


@dataclasses.dataclass(frozen=True)
class Metric:
    """A run-level metric as the config names it, its tag, and which way is bad."""
    name: str
    tag: str
    comparison: str  #: "greater" (a lower value is bad) or "less" (a higher value is bad)

    @property
    def worse(self) -> int:
        """+1 when a higher value is the regression, -1 when a lower one is."""
        return 1 if self.comparison == "less" else -1


ACCURACY = Metric("Accuracy/test_final", "Accuracy/test", "greater")
LOSS = Metric("loss_final", "loss", "less")
STEP_TIME = Metric("step_time_average", "step_time", "less")
CONSTANT = Metric("epochs_final", "epochs", "less")
METRICS = (ACCURACY, LOSS, STEP_TIME, CONSTANT)
METRIC_BY_TAG = {m.tag: m for m in METRICS}


class FaultKind(str, enum.Enum):
    """What was injected into a run (one-off) or from a run on (a shift that stays)."""
    ACCURACY_2 = "accuracy -2σ"
    ACCURACY_3 = "accuracy -3σ"
    ACCURACY_6 = "accuracy -6σ"
    DIVERGENCE = "loss divergence"
    SLOWDOWN_115 = "step time x1.15"
    SLOWDOWN_160 = "step time x1.6"
    CRASH = "crash"
    SHIFT_1 = "shift 1σ"
    SHIFT_2 = "shift 2σ"


ONE_OFF_KINDS = tuple(k for k in FaultKind if k not in (FaultKind.SHIFT_1, FaultKind.SHIFT_2))
SHIFT_KINDS = (FaultKind.SHIFT_1, FaultKind.SHIFT_2)
ACCURACY_DROPS = {FaultKind.ACCURACY_2: 2.0, FaultKind.ACCURACY_3: 3.0, FaultKind.ACCURACY_6: 6.0}  # in σ
SLOWDOWNS = {FaultKind.SLOWDOWN_115: 1.15, FaultKind.SLOWDOWN_160: 1.6}
SHIFT_SIGMAS = {FaultKind.SHIFT_1: 1.0, FaultKind.SHIFT_2: 2.0}


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
    """What to generate. The defaults are the issue's fleet (12 tests x 60 runs, t3 noise)."""
    tests: int = 12
    runs: int = 60
    seed: int = 1
    noise: str = "t3"  #: "t3" or "normal"
    warmup: int = 12  #: no fault, change or shift before this run
    fault_share: float = 0.2  #: share of the eligible runs with a one-off fault

    def __post_init__(self) -> None:
        if self.noise not in NOISE_FAMILIES:
            raise ValueError(f"noise must be one of {NOISE_FAMILIES}, got {self.noise!r}")


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: FaultKind
    onset: float  #: share of the run's steps after which it shows (a crash stops there)


@dataclasses.dataclass(frozen=True)
class LevelChange:
    """A level that moves for good from ``first_run`` on: an accepted change, or a shift (a regression)."""
    metric: Metric
    first_run: int
    factor: float = 1.0  #: multiplies loss or step time (accepted changes)
    sigmas: float = 0.0  #: a shift's size in σ of the metric, in its bad direction
    shift: Optional[FaultKind] = None  #: SHIFT_1 or SHIFT_2 for a shift; None for an accepted change

    @property
    def stretch(self) -> range:
        return range(self.first_run, self.first_run + STRETCH)


@dataclasses.dataclass(frozen=True)
class TestPlan:
    """One test: its role, what changes for good, which runs carry a fault, which run on slow hardware."""
    __test__ = False  # not a pytest class
    name: str
    index: int
    role: str  #: "drift", "bimodal" or "plain"
    changes: Tuple[LevelChange, ...]
    faults: Mapping[int, Fault]
    slow_runs: FrozenSet[int]

    def in_stretch(self, run: int) -> bool:
        return any(run in c.stretch for c in self.changes)

    def is_healthy(self, run: int) -> bool:
        """No fault and not among a change's or shift's first runs: any alert here is a false one."""
        return run not in self.faults and not self.in_stretch(run)


def name_of_test(index: int) -> str:
    return f"det{index:02d}"


def plan_test(spec: SuiteSpec, index: int) -> TestPlan:
    """The events of one test, from (seed, test) alone: the same in the normal and the t3 suite."""
    rng = random.Random(f"detection/{spec.seed}/{index}")
    role = ("drift", "bimodal")[index] if index < 2 else "plain"
    shift_kind = SHIFT_KINDS[index % 2]
    planned = [(LOSS, 1.5, None), (STEP_TIME, 0.8, None), (rng.choice((ACCURACY, LOSS, STEP_TIME)), 1.0, shift_kind)]
    free = spec.runs - spec.warmup - STRETCH * len(planned)
    while free < 0 and planned:  # a short suite drops the shift first, then the changes
        planned.pop()
        free += STRETCH
    rng.shuffle(planned)
    cuts = sorted(rng.randint(0, free) for _ in planned)  # free runs split into len + 1 gaps
    changes, run = [], spec.warmup
    for (metric, factor, shift), cut, previous in zip(planned, cuts, [0] + cuts):
        run += cut - previous
        changes.append(LevelChange(metric, run, factor, SHIFT_SIGMAS[shift] if shift else 0.0, shift))
        run += STRETCH
    plan = TestPlan(name_of_test(index), index, role, tuple(changes), {}, frozenset())
    faults = {}
    for i in range(spec.warmup, spec.runs):
        if not plan.in_stretch(i) and rng.random() < spec.fault_share:
            faults[i] = Fault(rng.choice(ONE_OFF_KINDS), rng.uniform(*ONSET))
    slow = frozenset(i for i in range(spec.runs) if role == "bimodal" and rng.random() < 0.5)
    return dataclasses.replace(plan, faults=faults, slow_runs=slow)


def noise_sigma(metric: Metric) -> float:
    """The standard deviation of a healthy run-level value (relative to the level for loss and step time)."""
    if metric is ACCURACY:
        return math.hypot(ACCURACY_RUN_SD, ACCURACY_POINT_SD)
    if metric is LOSS:  # the product of two independent unit-variance terms
        return math.sqrt((1 + LOSS_RUN_REL ** 2) * (1 + LOSS_POINT_REL ** 2) - 1)
    if metric is STEP_TIME:  # the mean over the run's points averages the point term
        return math.sqrt((1 + STEP_RUN_REL ** 2) * (1 + STEP_POINT_REL ** 2 / (STEPS + 1)) - 1)
    return 0.0


def _loss_final_curve() -> float:
    return 2.3 * math.exp(-3.0) + 0.1


def _accuracy_final_curve() -> float:
    return ACCURACY_CURVE * (1 - math.exp(-4.0))


def level(plan: TestPlan, run: int, metric: Metric, slow: Optional[bool] = None) -> Tuple[float, float]:
    """The noise-free run-level value of a healthy run and its σ (absolute): the truth a bound is judged by.

    ``slow`` picks the hardware (default: the run's own); for the bimodal test the bound of a "less" check
    should sit beyond the slow mode, so :func:`bound_centre` asks for that one.
    """
    sigma = noise_sigma(metric)
    if metric is CONSTANT:
        return EPOCHS, 0.0
    moved = [c for c in plan.changes if c.metric is metric and c.first_run <= run]
    if metric is ACCURACY:
        return _accuracy_final_curve() - sum(c.sigmas for c in moved) * sigma, sigma
    factor = math.prod(c.factor * (1 + c.sigmas * sigma) for c in moved)
    if metric is LOSS:
        centre = _loss_final_curve() * factor
    else:
        is_slow = run in plan.slow_runs if slow is None else slow
        centre = STEP_SECONDS * factor * hardware_factor(plan, run, is_slow)
    return centre, centre * sigma


def hardware_factor(plan: TestPlan, run: int, slow: bool) -> float:
    drift = DRIFT_PER_RUN ** run if plan.role == "drift" else 1.0
    return drift * (SLOW_HARDWARE if slow else 1.0)


def bound_centre(plan: TestPlan, run: int, metric: Metric) -> Tuple[float, float]:
    """The centre a healthy bound must clear, and σ: the level, or for the bimodal test the mode on the bad side."""
    slow = (metric.worse > 0) if plan.role == "bimodal" and metric is STEP_TIME else None
    return level(plan, run, metric, slow)


@dataclasses.dataclass(frozen=True, eq=False)
class RunRecord:
    """One generated run: its points (as written, rounded) and the run-level values of a successful run."""
    test: str
    index: int
    start: float
    end: float
    succeeded: bool
    steps: np.ndarray  #: the steps of loss and step_time points
    times: np.ndarray  #: their times (unix seconds, rounded to ms)
    loss: np.ndarray
    step_time: np.ndarray
    accuracy_steps: np.ndarray
    accuracy: np.ndarray
    values: Mapping[str, float]  #: metric name -> run-level value; empty for a failed run


def unit_noise(rng: np.random.Generator, family: str, size: Union[int, Tuple[int, ...]]) -> np.ndarray:
    """Zero mean, unit variance: normal, or Student t(3) over sqrt(3)."""
    if family == "normal":
        return rng.standard_normal(size)
    return rng.standard_t(3, size) / math.sqrt(3.0)


def generate_run(spec: SuiteSpec, plan: TestPlan, index: int) -> RunRecord:
    """The points of one run, from (seed, noise, test, run): pure."""
    rng = np.random.default_rng([spec.seed, NOISE_FAMILIES.index(spec.noise), plan.index, index])
    fault = plan.faults.get(index)
    kind = fault.kind if fault else None
    last = int(STEPS * fault.onset) if kind is FaultKind.CRASH else STEPS
    steps = np.arange(last + 1)
    progress = steps / STEPS
    past = np.maximum(0.0, progress - fault.onset) if fault else np.zeros(len(steps))
    run_effect = unit_noise(rng, spec.noise, 3)
    (accuracy_centre, accuracy_sigma) = level(plan, index, ACCURACY)
    loss_level = level(plan, index, LOSS)[0] / _loss_final_curve()
    step_level = level(plan, index, STEP_TIME)[0] / STEP_SECONDS

    loss = (2.3 * np.exp(-3 * progress) + 0.1) * loss_level * max(0.2, 1 + LOSS_RUN_REL * run_effect[1])
    loss = loss * np.maximum(0.2, 1 + LOSS_POINT_REL * unit_noise(rng, spec.noise, len(steps)))
    if kind is FaultKind.DIVERGENCE:
        loss = loss * np.exp(5 * past)
    step_time = STEP_SECONDS * step_level * max(0.2, 1 + STEP_RUN_REL * run_effect[2])
    step_time = step_time * np.maximum(0.2, 1 + STEP_POINT_REL * unit_noise(rng, spec.noise, len(steps)))
    if kind in SLOWDOWNS:
        step_time = np.where(progress >= fault.onset, step_time * SLOWDOWNS[kind], step_time)

    shape = 1 - np.exp(-4 * progress)  # the curve, and how much of the run effect shows yet
    accuracy = (accuracy_centre - _accuracy_final_curve()) + ACCURACY_CURVE * shape
    accuracy = accuracy + shape / (1 - math.exp(-4.0)) * ACCURACY_RUN_SD * run_effect[0]
    accuracy = accuracy + ACCURACY_POINT_SD * unit_noise(rng, spec.noise, len(steps))
    if kind in ACCURACY_DROPS:
        accuracy = accuracy - ACCURACY_DROPS[kind] * accuracy_sigma * np.minimum(1.0, past / 0.1)
    on_eval = (steps % ACCURACY_EVERY == 0) | (steps == last)

    start = START + index * DAY
    times = np.round(start + 5.0 + np.concatenate(([0.0], np.cumsum(step_time[:-1]))), 3)
    loss, step_time = np.round(loss, 6), np.round(step_time, 6)
    accuracy_steps, accuracy = steps[on_eval], np.round(accuracy[on_eval], 6)
    succeeded = kind is not FaultKind.CRASH
    values: Dict[str, float] = {}
    if succeeded:
        values = {ACCURACY.name: float(accuracy[-1]), LOSS.name: float(loss[-1]),
                  STEP_TIME.name: math.fsum(step_time.tolist()) / len(step_time), CONSTANT.name: EPOCHS}
    return RunRecord(plan.name, index, start, float(times[-1]) + 10.0, succeeded, steps, times, loss, step_time,
                     accuracy_steps, accuracy, values)


@dataclasses.dataclass(frozen=True, eq=False)
class Suite:
    spec: SuiteSpec
    plans: Tuple[TestPlan, ...]
    runs: Tuple[Tuple[RunRecord, ...], ...]  #: runs[test][index]

    def series(self, test: int, metric: Metric) -> Tuple[List[int], List[float]]:
        """The metric's values of the test's successful runs in run order, and their run indices."""
        runs = [r for r in self.runs[test] if r.succeeded]
        return [r.index for r in runs], [r.values[metric.name] for r in runs]


def generate(spec: SuiteSpec) -> Suite:
    plans = tuple(plan_test(spec, t) for t in range(spec.tests))
    return Suite(spec, plans, tuple(tuple(generate_run(spec, p, i) for i in range(spec.runs)) for p in plans))


def shifts_of(plan: TestPlan) -> Sequence[LevelChange]:
    return [c for c in plan.changes if c.shift is not None]


def accepted_changes_of(plan: TestPlan) -> Sequence[LevelChange]:
    return [c for c in plan.changes if c.shift is None]
