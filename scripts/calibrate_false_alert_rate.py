"""Fits the table behind ``{"false_alert_rate": p}`` (core/false_alert_calibration.py); run it to regenerate.

The cutoff for a history of n values is ``centre ± c · scale`` with the median as
centre, ``core.stats.false_alert_scale`` (2.2219·Qn with its small-sample factor,
about twice as efficient as the MAD on normal noise) as scale, and a multiplier c that depends on n, p and
r = ``core.stats.tail_weight`` (the root mean square of the largest 30% of the
deviations, the largest one left out, over the scale; larger for heavy tails,
not moved by one wild value):

    ln c = a + b_lo · min(0, r − r0) + b_hi · max(0, r − r0)

For each (n, p) of the grid the shape (r0, b_lo, b_hi) is chosen from a grid and
``a`` fitted so that the *marginal* one-sided rate of a healthy next value
passing the cutoff, averaged over random histories, is within a factor TOLERANCE
of p both for normal noise and for Student-t noise with 3 degrees of freedom
(the tail probabilities are exact; only the histories are simulated), and, among
the shapes that achieve it, the one with the narrowest cutoff for typical
histories (the least mean ln c over the histories of both families) wins; if
none does, the most accurate one. A few values cannot tell normal from
heavy-tailed noise, so in short histories the fit is wide enough for heavy
tails unless the history looks distinctly light-tailed (r below r0: b_lo), and
in long ones it follows r (b_hi), as a power law of r did before for every n.
Between grid points of the same parity of n the pipeline interpolates the four
coefficients in ln n and ln p. b_lo is the same in every cell: a narrow band of r below r0 carries much of
the rate for normal noise, and interpolating two cells with different shapes
would lose it (off-grid n got a much lower rate than p when each cell had its own
b_lo).

    python -m scripts.calibrate_false_alert_rate > core/false_alert_calibration.py

A few minutes on two cores; the seed is fixed, so the output is reproducible.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
from typing import List, Tuple

import numpy as np

from core.stats import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, QN_TO_SIGMA, TAIL_SHARE, TAIL_WEIGHT_RANGE, qn_correction

# The median and Qn of an odd and of an even number of values behave differently enough that
# interpolating between even n misses the rate at odd n by up to 2x: one grid per parity, every n
# up to 60 and about every 15-20% beyond: the fitted shape can change from one n to the next,
# and interpolating across such a change missed the rate by more than 2x with a coarser grid.
N_GRID_EVEN = tuple(range(6, 61, 2)) + (70, 86, 100, 150, 200)
N_GRID_ODD = tuple(range(5, 60, 2)) + (69, 85, 99, 149, 199)
P_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
HISTORIES = 20_000
SEED = 20261122
TOLERANCE = 1.4  # the fitted rates' largest factor from p, before interpolation
R0_QUANTILES = (0.03, 0.08, 0.15, 0.25, 0.4)  # candidate r0: these quantiles of r over both families
B_LO = (20.0,)  # one steepness for every cell, so that neighbouring cells' fits interpolate (see below)
B_HI = (0.0, 1.0, 2.5, 5.0)
_GRID = np.linspace(-12.0, 60.0, 720_001)
_LOG_NORMAL_SF = np.log(np.array([0.5 * math.erfc(x / math.sqrt(2)) for x in _GRID]) + 1e-300)

Fit = Tuple[float, float, float, float]  # (a, b_lo, b_hi, r0)


def normal_sf(x: np.ndarray) -> np.ndarray:
    """The standard normal's upper tail, interpolated in log space on a 1e-4 grid (exact to ~1e-8 relative)."""
    return np.exp(np.interp(x, _GRID, _LOG_NORMAL_SF))


def t3_sf(t: np.ndarray) -> np.ndarray:
    return 0.5 - (t / (math.sqrt(3) * (1 + t * t / 3)) + np.arctan(t / math.sqrt(3))) / math.pi


def qn(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    i, j = np.triu_indices(n, 1)
    h = n // 2 + 1
    k = h * (h - 1) // 2
    return qn_correction(n) * QN_TO_SIGMA * np.concatenate([  # in chunks: all pairs of 20,000 histories of 200 do not fit in memory
        np.partition(np.abs(chunk[:, i] - chunk[:, j]), k - 1, axis=1)[:, k - 1]
        for chunk in np.array_split(x, max(1, len(x) * len(i) // 10_000_000))])


def summaries(x: np.ndarray):
    """(median, scale, r) per history, as core/bounds.py computes them (core.stats: false_alert_scale,
    tail_weight)."""
    n = x.shape[1]
    median = np.median(x, axis=1)
    deviation = np.abs(x - median[:, None])
    mad = MAD_TO_SIGMA * np.median(deviation, axis=1)
    fallback = np.where(mad > 0, mad, MEAN_AD_TO_SIGMA * deviation.mean(axis=1))
    scale = qn(x)
    scale = np.where(scale > 0, scale, fallback)
    k = max(3, math.ceil(TAIL_SHARE * n))
    kept = np.sort(deviation, axis=1)[:, max(0, n - 1 - k):n - 1]  # the largest deviations but the largest
    r = np.sqrt((kept ** 2).mean(axis=1)) / scale
    return median, scale, np.clip(r, *TAIL_WEIGHT_RANGE)


def log_multiplier(fit: Fit, r: np.ndarray) -> np.ndarray:
    a, b_lo, b_hi, r0 = fit
    return a + b_lo * np.minimum(0.0, r - r0) + b_hi * np.maximum(0.0, r - r0)


def fit_cell(n: int, p: float, normal, heavy) -> Fit:
    """The fit of one (n, p): see the module docstring."""
    def rate(fit: Fit, family) -> float:
        (median, scale, r), sf = family
        return float(sf(median + np.exp(log_multiplier(fit, r)) * scale).mean())

    def least_a(shape: Tuple[float, float, float], family) -> float:
        """The least a whose rate for the family is at most TOLERANCE·p."""
        lo, hi = -2.0, 12.0
        for _ in range(18):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if rate((mid, *shape), family) > TOLERANCE * p else (lo, mid)
        return hi

    pooled = np.concatenate([normal[0][2], heavy[0][2]])
    best, fallback = None, None
    for q in R0_QUANTILES:
        r0 = float(np.quantile(pooled, q))
        for b_lo in B_LO:
            for b_hi in B_HI:
                shape = (b_lo, b_hi, r0)
                a = max(least_a(shape, normal), least_a(shape, heavy))
                fit = (a, *shape)
                error = max(abs(math.log(rate(fit, family) / p)) for family in (normal, heavy))
                width = float(log_multiplier(fit, pooled).mean())
                if error <= math.log(TOLERANCE) + 1e-9:
                    if best is None or width < best[0]:
                        best = (width, fit)
                elif fallback is None or error < fallback[0]:
                    fallback = (error, fit)
    chosen = best or fallback
    assert chosen is not None
    return chosen[1]


def fit_row(n: int) -> List[Fit]:
    rng = np.random.default_rng([SEED, n])
    normal = (summaries(rng.standard_normal((HISTORIES, n))), normal_sf)
    heavy = (summaries(rng.standard_t(3, (HISTORIES, n))), t3_sf)
    row = [fit_cell(n, p, normal, heavy) for p in P_GRID]
    print(f"n={n} done", file=sys.stderr)
    return row


def main() -> int:
    with multiprocessing.Pool(2) as pool:
        even = pool.map(fit_row, N_GRID_EVEN)
        odd = pool.map(fit_row, N_GRID_ODD)
    print('"""Generated by scripts/calibrate_false_alert_rate.py; do not edit (see that script for the model)."""')
    print()
    print(f"N_GRID_EVEN = {N_GRID_EVEN!r}")
    print(f"N_GRID_ODD = {N_GRID_ODD!r}")
    print(f"P_GRID = {P_GRID!r}")
    print("# COEFFICIENTS_EVEN[i][j] = (a, b_lo, b_hi, r0) for N_GRID_EVEN[i], P_GRID[j] (ODD: N_GRID_ODD):")
    print("# ln multiplier = a + b_lo * min(0, r - r0) + b_hi * max(0, r - r0)")
    for name, rows in (("COEFFICIENTS_EVEN", even), ("COEFFICIENTS_ODD", odd)):
        print(f"{name} = (")
        for row in rows:
            print("    (" + ", ".join(f"({a:.4f}, {b_lo:.2f}, {b_hi:.2f}, {r0:.4f})" for a, b_lo, b_hi, r0 in row)
                  + "),")
        print(")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
