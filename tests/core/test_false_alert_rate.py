"""``{"false_alert_rate": p}`` keeps its promise: on healthy noise a check alerts with probability about p.

Simulated as the pipeline judges: histories of n healthy values, the bound computed by
``core.bounds`` exactly as in production, and the exact probability that the next healthy
value passes it (normal and Student-t with 3 degrees of freedom tail functions), averaged
over histories. The calibration was fitted on other random histories
(scripts/calibrate_false_alert_rate.py); this test uses its own seed, off-grid n and p
values included, so it checks the fit and its interpolation, not the fitting sample.
"""

import math

import numpy as np
import pytest

from core.bounds import compute_bounds
from core.config import SuccessCondition

HISTORIES = 20_000


def normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2))


def t3_sf(t: float) -> float:
    return 0.5 - (t / (math.sqrt(3) * (1 + t * t / 3)) + math.atan(t / math.sqrt(3))) / math.pi


def observed_rate(noise: str, n: int, p: float, comparison: str, seed: int) -> float:
    rng = np.random.default_rng(seed)
    draws = rng.standard_normal((HISTORIES, n)) if noise == "normal" else rng.standard_t(3, (HISTORIES, n))
    sf = normal_sf if noise == "normal" else t3_sf
    condition = SuccessCondition(comparison, false_alert_rate=p)
    total = 0.0
    for history in draws:
        bounds = compute_bounds(condition, history.tolist())
        # the noise is symmetric: passing the lower bound is as likely as passing -lower from above
        total += sf(bounds.upper) if comparison == "less" else sf(-bounds.lower)
    return total / HISTORIES


@pytest.mark.parametrize("noise", ["normal", "t3"])
@pytest.mark.parametrize("n, p, comparison", [
    (10, 0.0005, "less"), (20, 0.0005, "greater"), (35, 0.0005, "less"), (50, 0.0005, "greater"),
    (100, 0.0005, "less"), (10, 0.01, "greater"), (60, 0.002, "less"), (100, 0.05, "greater"),
])
def test_the_observed_false_alert_rate_stays_within_twice_the_stated_one(noise, n, p, comparison):
    rate = observed_rate(noise, n, p, comparison, seed=1000 + n)
    assert p / 2 <= rate <= 2 * p, f"{noise} noise, n={n}: observed {rate:.2e} for p={p:g}"
