"""Fits the table behind ``{"false_alert_rate": p}`` (core/false_alert_calibration.py); run it to regenerate.

The cutoff for a history of n values is ``median ± c(n, p) · scale`` with
``core.stats.false_alert_scale`` (2.2219·Qn with its small-sample factor, about
twice as efficient as the MAD on normal noise) as the scale. For each (n, p) of
the grid, c is the multiplier at which a healthy next value passes the cutoff
with probability p, averaged over random histories of n values of Student-t
noise with 3 degrees of freedom (the tail probability is exact; only the
histories are simulated). Heavy tails are the honest assumption: a few dozen
values cannot tell normal noise from heavy-tailed noise (a tail statistic of
the history, which an earlier fit of this table followed, overlaps between the
two families up to n ≈ 60, and following it made a third of the cutoffs tens or
hundreds of noise scales wide to pay for the narrow ones), so the cutoff is as
wide as heavy tails need and no wider. On normal noise the same cutoff alerts
less often than p (the ``NORMAL_RATES`` rows say how much), never more.

Between grid points of the same parity of n the pipeline interpolates ln c in
ln n and ln p.

The second table is the threshold of the persistent-shift statistic
(``core.shifts``) for n values before its window: the (1 − p) quantile of the
statistic over random t3 histories of n + 5 values.

    python -m scripts.calibrate_false_alert_rate > core/false_alert_calibration.py

About a minute on two cores; the seed is fixed, so the output is reproducible.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import sys
from typing import Callable, List, Tuple

import numpy as np

from core.stats import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, QN_TO_SIGMA, qn_correction

# The median and Qn of an odd and of an even number of values behave differently: one grid per parity.
N_GRID_EVEN = tuple(range(6, 61, 2)) + (70, 86, 100, 150, 200)
N_GRID_ODD = tuple(range(5, 60, 2)) + (69, 85, 99, 149, 199)
P_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
HISTORIES = 40_000
SEED = 20261125
_GRID = np.linspace(-12.0, 60.0, 720_001)
_LOG_NORMAL_SF = np.log(np.array([0.5 * math.erfc(x / math.sqrt(2)) for x in _GRID]) + 1e-300)


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
    return qn_correction(n) * QN_TO_SIGMA * np.concatenate([  # in chunks: all pairs of many histories of 200 do not fit
        np.partition(np.abs(chunk[:, i] - chunk[:, j]), k - 1, axis=1)[:, k - 1]
        for chunk in np.array_split(x, max(1, len(x) * len(i) // 10_000_000))])


def summaries(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(median, scale) per history, as core/bounds.py computes them (core.stats.false_alert_scale)."""
    median = np.median(x, axis=1)
    deviation = np.abs(x - median[:, None])
    mad = MAD_TO_SIGMA * np.median(deviation, axis=1)
    fallback = np.where(mad > 0, mad, MEAN_AD_TO_SIGMA * deviation.mean(axis=1))
    scale = qn(x)
    return median, np.where(scale > 0, scale, fallback)


def multiplier(p: float, median: np.ndarray, scale: np.ndarray, sf: Callable[[np.ndarray], np.ndarray] = t3_sf
               ) -> float:
    """The c at which noise of upper tail ``sf`` (t3 unless said) passes median + c·scale with probability p on
    average (bisection in ln c)."""
    lo, hi = math.log(0.5), math.log(5000.0)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(sf(median + math.exp(mid) * scale).mean()) > p else (lo, mid)
    return math.exp(hi)


def fit_row(n: int) -> Tuple[List[float], List[float], List[float]]:
    """One n: the multiplier for each p, the rate the same cutoff has on normal noise, and the multiplier for
    noise declared normal (``"noise": "normal"``), fitted the same way on the same normal histories."""
    rng = np.random.default_rng([SEED, n])
    heavy = summaries(rng.standard_t(3, (HISTORIES, n)))
    normal = summaries(rng.standard_normal((HISTORIES, n)))
    row = [multiplier(p, *heavy) for p in P_GRID]
    normal_rates = [float(normal_sf(normal[0] + c * normal[1]).mean()) for c in row]
    normal_row = [multiplier(p, *normal, sf=normal_sf) for p in P_GRID]
    print(f"n={n} done", file=sys.stderr)
    return row, normal_rates, normal_row


SHIFT_BASE_GRID = (10, 12, 15, 20, 25, 30, 40, 50, 70, 100)
SHIFT_HISTORIES = 400_000


def shift_statistics(x: np.ndarray) -> np.ndarray:
    """``core.shifts.shift_statistic`` of each history (rows of x), worse = +1, vectorized."""
    from core.shifts import CAP, RECENT, WINDOWS

    base, recent = x[:, :-RECENT], x[:, -RECENT:]
    centre = np.median(base, axis=1)
    deviation = np.abs(base - centre[:, None])
    scale = MAD_TO_SIGMA * np.median(deviation, axis=1)
    scale = np.where(scale > 0, scale, MEAN_AD_TO_SIGMA * deviation.mean(axis=1))
    capped = np.clip((recent - centre[:, None]) / scale[:, None], -CAP, CAP)
    return np.max([np.where(capped[:, -k:].min(axis=1) > 0, capped[:, -k:].sum(axis=1) / math.sqrt(k), 0.0)
                   for k in WINDOWS], axis=0)


def shift_row(n: int, family: str = "t3") -> List[float]:
    """The shift statistic's threshold for n values before its window, for each p, on t3 or normal noise."""
    from core.shifts import RECENT

    rng = np.random.default_rng([SEED, 1, n] if family == "t3" else [SEED, 2, n])

    def draw() -> np.ndarray:
        shape = (SHIFT_HISTORIES // 8, n + RECENT)
        return rng.standard_t(3, shape) if family == "t3" else rng.standard_normal(shape)
    statistics = np.concatenate([shift_statistics(draw()) for _ in range(8)])
    print(f"shift n={n} ({family}) done", file=sys.stderr)
    return [float(np.quantile(statistics, 1 - p)) for p in P_GRID]


def print_table(name: str, rows: List[List[float]], number: str) -> None:
    """``name = (...)``: one tuple of numbers (formatted with ``number``) per row."""
    print(f"{name} = (")
    for row in rows:
        print("    (" + ", ".join(format(value, number) for value in row) + "),")
    print(")")


def main() -> int:
    with multiprocessing.Pool(2) as pool:
        even = pool.map(fit_row, N_GRID_EVEN)
        odd = pool.map(fit_row, N_GRID_ODD)
        shifts = pool.map(shift_row, SHIFT_BASE_GRID)
        normal_shifts = pool.map(functools.partial(shift_row, family="normal"), SHIFT_BASE_GRID)
    print('"""Generated by scripts/calibrate_false_alert_rate.py; do not edit (see that script for the model)."""')
    print()
    print(f"N_GRID_EVEN = {N_GRID_EVEN!r}")
    print(f"N_GRID_ODD = {N_GRID_ODD!r}")
    print(f"P_GRID = {P_GRID!r}")
    print("# MULTIPLIERS_EVEN[i][j]: c for N_GRID_EVEN[i], P_GRID[j] (ODD: N_GRID_ODD); cutoff = median ± c·scale")
    for name, rows in (("MULTIPLIERS_EVEN", even), ("MULTIPLIERS_ODD", odd)):
        print_table(name, [row for row, _, _ in rows], ".4f")
    print("# NORMAL_RATES_*[i][j]: the rate the same cutoff has on normal noise (at most p; for the docs)")
    for name, rows in (("NORMAL_RATES_EVEN", even), ("NORMAL_RATES_ODD", odd)):
        print_table(name, [rates for _, rates, _ in rows], ".2e")
    print('# NORMAL_MULTIPLIERS_*[i][j]: c for a condition that declares its noise normal ("noise": "normal")')
    for name, rows in (("NORMAL_MULTIPLIERS_EVEN", even), ("NORMAL_MULTIPLIERS_ODD", odd)):
        print_table(name, [normal_row for _, _, normal_row in rows], ".4f")
    print(f"SHIFT_BASE_GRID = {SHIFT_BASE_GRID!r}")
    print("# SHIFT_THRESHOLDS[i][j]: core.shifts' threshold for SHIFT_BASE_GRID[i] values before its window, P_GRID[j]")
    print_table("SHIFT_THRESHOLDS", shifts, ".4f")
    print("# NORMAL_SHIFT_THRESHOLDS: the same on normal noise, for a condition that declares it")
    print_table("NORMAL_SHIFT_THRESHOLDS", normal_shifts, ".4f")
    return 0


if __name__ == "__main__":
    sys.exit(main())
