"""The reference detectors: what trainguard is measured against, on the same run-level values.

Each sees one metric of one test as the values of its successful runs in run
order (``Suite.series``), is one-sided like the config (``worse`` = +1 when a
higher value is the regression) and returns the positions in that series it
alerts on. All of them wait for :data:`WAIT` values of history and take the
config's ``min_effect_rel`` (an out-of-bounds value counts only when it is that
far from the centre, relative to the centre), as trainguard does. A failed run
is alerted by every detector alike (:func:`detect_suite`): it has no values.

- :func:`robust_z`: median ± k·1.4826·MAD of the last 30 values.
- :func:`mean_sigma`: mean ± k·σ (population) of all earlier values, the seed
  system's rule.

  Both keep every value in their history (out-of-bounds ones too: that is how
  these rules are used), and re-baseline as trainguard does: after
  :data:`~bench.detection.suite.REBASELINE_AFTER` out-of-bounds values in a row
  the history restarts from them, and until it holds ``WAIT`` values its
  centre comes from the new values and its scale from the old history.
- :func:`change_points`: a change-point detector run at each new run, as a
  nightly job would: ruptures' ``KernelCPD`` with the linear kernel (the
  least-squares cost of a change in mean, exact by dynamic programming, in C)
  and a penalty of β·ln n on the values standardized by a robust scale (the
  MAD of successive differences, which a change of level does not inflate).
  It alerts at run i when the segmentation of the values up to i has a change
  starting within the last :data:`RECENT` runs that it has not alerted before,
  in the bad direction (the new segment's mean against the mean of the segment
  before it: the change it found; the return from a one-run outlier is no
  regression). ``min_size`` 1, so that a single bad run is a segment.

Every detector is a pure function of its inputs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from bench.detection.scoring import Alert
from bench.detection.suite import METRICS, REBASELINE_AFTER, Suite

WAIT = 10  # values of history before a check, the config's wait_for_n_points_of_history
MIN_EFFECT_REL = 0.005  # the config's min_effect_rel
ROBUST_WINDOW = 30  # median ± k·MAD looks at the last 30 values
MAD_SCALE = 1.4826  # MAD to σ for normal noise
RECENT = 5  # a change point alerts when it starts within the last 5 runs (the shift deadline)

Detect = Callable[[Sequence[float], int], List[int]]


def _out(value: float, centre: float, scale: float, k: float, worse: int) -> bool:
    deviation = (value - centre) * worse
    return deviation > 0 and deviation > k * scale and abs(value - centre) >= MIN_EFFECT_REL * abs(centre)


def _bounded(values: Sequence[float], worse: int, k: float, window: Optional[int],
             centre_scale: Callable[[np.ndarray], Tuple[float, float]]) -> List[int]:
    """A centre ± k·scale rule with the anchors' history and re-baselining (see the module docstring)."""
    history: List[float] = []
    old_scale: Optional[float] = None  # the scale before the last re-baseline, while the new history is short
    streak = 0
    alerts = []
    for position, value in enumerate(values):
        recent = np.asarray(history[-window:] if window else history)
        if len(recent) >= WAIT or (old_scale is not None and len(recent)):
            centre, scale = centre_scale(recent)
            if len(recent) < WAIT and old_scale is not None:
                scale = old_scale
            if _out(value, centre, scale, k, worse):
                alerts.append(position)
                streak += 1
                if streak >= REBASELINE_AFTER:
                    old_scale, history, streak = scale, history[len(history) - streak + 1:] + [value], 0
                    continue
            else:
                streak = 0
        history.append(value)
    return alerts


def _median_mad(values: np.ndarray) -> Tuple[float, float]:
    centre = float(np.median(values))
    return centre, MAD_SCALE * float(np.median(np.abs(values - centre)))


def _mean_std(values: np.ndarray) -> Tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))


def robust_z(values: Sequence[float], worse: int, k: float) -> List[int]:
    return _bounded(values, worse, k, ROBUST_WINDOW, _median_mad)


def mean_sigma(values: Sequence[float], worse: int, k: float) -> List[int]:
    return _bounded(values, worse, k, None, _mean_std)


def _robust_scale(values: np.ndarray) -> float:
    """σ from successive differences (MAD of the differences / sqrt 2): a change of level adds one outlier."""
    differences = np.diff(values)
    scale = MAD_SCALE * float(np.median(np.abs(differences - np.median(differences)))) / math.sqrt(2)
    return scale if scale > 0 else float(np.std(values))


def change_points(values: Sequence[float], worse: int, beta: float) -> List[int]:
    import ruptures  # the bench extra: pip install -e '.[bench]'

    x = np.asarray(values, dtype=float)
    alerted_starts = set()
    alerts = []
    for position in range(WAIT, len(x)):
        prefix = x[:position + 1]
        scale = _robust_scale(prefix)
        if scale == 0:  # every value alike: no change
            continue
        standardized = ((prefix - np.median(prefix)) / scale).reshape(-1, 1)
        ends = ruptures.KernelCPD(kernel="linear", min_size=1).fit(standardized).predict(
            pen=beta * math.log(len(prefix)))
        starts = [int(e) for e in ends[:-1]]
        if not starts or position - starts[-1] >= RECENT or starts[-1] in alerted_starts:
            continue
        start = starts[-1]
        before = float(np.mean(prefix[starts[-2] if len(starts) > 1 else 0:start]))
        if _out(float(np.mean(prefix[start:])), before, 0.0, 0.0, worse):
            alerted_starts.add(start)
            alerts.append(position)
    return alerts


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A reference detector at one operating point."""
    detector: str  #: the family, as the table names it
    point: str  #: the operating point, e.g. "k=6"
    detect: Detect


ROBUST_KS = (4.5, 6.0, 8.0)  # 6 is the issue's; on t3 noise 4.5 / 6 / 8 give about 3 / 1.7 / 0.9 false alerts per 100
SIGMA_KS = (3.0, 4.0, 5.0)  # 4 is the seed system's
BETAS = (4.0, 8.0, 16.0)  # on t3 noise about 5 / 2 / 0.8 false alerts per 100 healthy runs


def change_points_available() -> bool:
    """ruptures is in the bench extra (pip install -e '.[bench]'), not in the pipeline's."""
    try:
        import ruptures  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def anchors(robust_ks: Sequence[float] = ROBUST_KS, sigma_ks: Sequence[float] = SIGMA_KS,
            betas: Sequence[float] = BETAS, with_change_points: bool = True) -> List[Anchor]:
    """Every reference detector at its three operating points."""
    out = [Anchor("median ± k·1.4826·MAD of the last 30", f"k={k:g}",
                  lambda v, w, k=k: robust_z(v, w, k)) for k in robust_ks]
    out += [Anchor("mean ± k·σ of all earlier runs", f"k={k:g}", lambda v, w, k=k: mean_sigma(v, w, k))
            for k in sigma_ks]
    if with_change_points:
        out += [Anchor("change points (ruptures KernelCPD, at each run)", f"penalty {b:g}·ln n",
                       lambda v, w, b=b: change_points(v, w, b)) for b in betas]
    return out


def detect_suite(suite: Suite, detect: Detect) -> List[Alert]:
    """One detector's alerts on a suite: each metric of each test in run order, and every failed run."""
    alerts = []
    for plan in suite.plans:
        for metric in METRICS:
            runs, values = suite.series(plan.index, metric)
            alerts += [Alert(plan.index, runs[p], metric.tag, "out_of_bounds") for p in detect(values, metric.worse)]
        alerts += [Alert(plan.index, r.index, None, "job_failed") for r in suite.runs[plan.index] if not r.succeeded]
    return alerts
