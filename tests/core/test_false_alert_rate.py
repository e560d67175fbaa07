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
    # odd n: the median and the scale of an odd count behave differently from an even one
    (11, 0.0005, "greater"), (31, 0.0005, "less"), (37, 0.0005, "greater"), (55, 0.0005, "less"),
])
def test_the_observed_false_alert_rate_stays_within_twice_the_stated_one(noise, n, p, comparison):
    rate = observed_rate(noise, n, p, comparison, seed=1000 + n)
    assert p / 2 <= rate <= 2 * p, f"{noise} noise, n={n}: observed {rate:.2e} for p={p:g}"


def test_the_calibration_script_summarises_histories_as_the_pipeline_does():
    from core.stats import false_alert_scale, median, tail_weight
    from scripts.calibrate_false_alert_rate import summaries

    rng = np.random.default_rng(3)
    histories = np.concatenate([rng.standard_normal((5, 12)), rng.standard_t(3, (5, 12)),
                                np.array([[1.0] * 8 + [2.0, 0.0, 1.0, 1.0]])])
    centres, scales, weights = summaries(histories)
    for history, centre, scale, weight in zip(histories.tolist(), centres, scales, weights):
        assert median(history) == pytest.approx(centre)
        assert false_alert_scale(history, median(history)) == pytest.approx(scale)
        assert tail_weight(history, median(history), scale) == pytest.approx(weight)


def test_one_wild_value_in_the_history_does_not_blind_the_check():
    rng = np.random.default_rng(4)
    healthy = rng.standard_normal(30).tolist()
    condition = SuccessCondition("less", false_alert_rate=0.0005)
    clean = compute_bounds(condition, healthy).upper
    with_wild_value = compute_bounds(condition, healthy[:-1] + [40.0]).upper
    assert clean < with_wild_value < 1.25 * clean  # a stddev-based tail weight would multiply it
