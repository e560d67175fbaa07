"""Small persistent shifts (``core.shifts``): calibrated like the one-run cutoff, found within five runs,
reported once, as a pure function of the counted values."""

import math
import random

import numpy as np
import pytest

from core.config import NORMAL, SHIFT_SHARE, RegressionTestConfig, SuccessCondition, parse_test_config, shift_rate
from core.history import MetricHistory, check_metric, history_policy, seed_metric_history
from core.records import MetricObservation
from core.shifts import MODE_GAP, RECENT, _known_mode, find_shift, shift_statistic, shift_threshold
from core.stats import median, robust_scale

HISTORIES = 6000


def histories(noise: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((HISTORIES, n)) if noise == "normal" else rng.standard_t(3, (HISTORIES, n))


@pytest.mark.parametrize("n, p", [(15, 0.003), (30, 0.002), (45, 0.005), (80, 0.003)])
def test_healthy_heavy_tailed_noise_crosses_the_threshold_within_twice_the_rate(n, p):
    draws = histories("t3", n + RECENT, seed=n)
    exceeded = sum((shift_statistic(h.tolist(), 1) or (0.0,))[0] > shift_threshold(n, p) for h in draws) / HISTORIES
    assert p / 2 <= exceeded <= 2 * p, f"n={n}: {exceeded:.4f} for p={p}"
    fired = sum(find_shift(h.tolist(), 1, p) is not None for h in draws) / HISTORIES
    assert fired <= exceeded  # reported at the first crossing only


@pytest.mark.parametrize("n, p", [(15, 0.003), (45, 0.005)])
def test_normal_noise_declared_normal_crosses_its_threshold_within_twice_the_rate(n, p):
    draws = histories("normal", n + RECENT, seed=200 + n)
    exceeded = sum((shift_statistic(h.tolist(), 1) or (0.0,))[0] > shift_threshold(n, p, NORMAL)
                   for h in draws) / HISTORIES
    assert p / 2 <= exceeded <= 2 * p, f"n={n}: {exceeded:.4f} for p={p}"
    assert shift_threshold(n, p, NORMAL) < shift_threshold(n, p)


@pytest.mark.parametrize("n, p", [(30, 0.003), (60, 0.003)])
def test_healthy_normal_noise_crosses_it_at_most_at_the_rate(n, p):
    draws = histories("normal", n + RECENT, seed=100 + n)
    fired = sum(find_shift(h.tolist(), -1, p) is not None for h in draws) / HISTORIES
    assert fired <= 1.5 * p


def runs_to_detect(noise: str, size: float, n: int, p: float, seed: int, trials: int = 400) -> list:
    """For each trial: the run (1-5) of a shift of ``size`` standard deviations at which it is found, or None."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(trials):
        draw = rng.standard_normal(n + RECENT) if noise == "normal" else rng.standard_t(3, n + RECENT) / math.sqrt(3)
        values = draw[:n].tolist()
        found.append(None)
        for run, value in enumerate(draw[n:] + size, start=1):
            values.append(float(value))
            if find_shift(values, 1, p) is not None:
                found[-1] = run
                break
    return found


@pytest.mark.parametrize("noise, least", [("t3", 0.75), ("normal", 0.35)])
def test_a_two_sigma_shift_that_stays_is_found_within_five_runs(noise, least):
    found = runs_to_detect(noise, 2.0, 30, 0.002, seed=7)
    assert sum(run is not None for run in found) / len(found) >= least
    assert sum(run is not None for run in runs_to_detect(noise, 0.0, 30, 0.002, seed=8)) <= 4  # healthy


@pytest.mark.parametrize("noise, n, most", [("normal", 30, 0.02), ("t3", 30, 0.02), ("normal", 15, 0.03),
                                           ("t3", 15, 0.03)])
def test_a_one_mode_base_is_seldom_taken_for_holding_a_shifts_level(noise, n, most):
    """The machine-type exception (``_known_mode``): a healthy one-mode base seldom reaches halfway to a
    level ``MODE_GAP`` scales away as often as it asks (more than heavy-tailed noise of one mode puts there).
    When a fifth of the base sufficed, it did in a third of bases or more, and hid as many real shifts of
    that size."""
    rng = np.random.default_rng(4)
    held, fifth = 0, 0
    for _ in range(2000):
        base = (rng.standard_normal(n) if noise == "normal" else rng.standard_t(3, n) / math.sqrt(3)).tolist()
        centre = median(base)
        scale = robust_scale(base, centre)
        held += _known_mode(base, centre, centre + MODE_GAP * scale, 1, MODE_GAP)
        fifth += sum(value >= centre + MODE_GAP * scale / 2 for value in base) >= max(3, 0.2 * n)
    assert held / 2000 <= most
    assert fifth / 2000 >= 0.3


def observe(history, values, config, start=0):
    alerts = []
    for i, value in enumerate(values, start=start):
        _, alert = check_metric(history, MetricObservation("t", f"r{i:02d}", "acc", value, i, "success", i, i), config)
        alerts.append(alert)
    return alerts


CONFIG = RegressionTestConfig(metric_success_conditions={"acc": SuccessCondition("greater", false_alert_rate=0.002)},
                              alert_after_second_test_failure=False)


def test_a_shift_is_one_metric_shifted_alert_naming_the_first_run_at_the_new_level():
    rng = random.Random(1)
    values = [76 + rng.gauss(0, 0.3) for _ in range(30)] + [75.3 + rng.gauss(0, 0.3) for _ in range(12)]
    history = MetricHistory()
    alerts = observe(history, values, CONFIG)
    shifted = [a for a in alerts if a is not None]
    assert [a.kind for a in shifted] == ["metric_shifted"]
    [alert] = shifted
    at = alerts.index(alert)
    assert 30 < at < 35 and alert.details["first_run"] in alert.details["runs"]
    assert int(alert.details["first_run"][1:]) >= 30 - 1  # the new level's first run (or the one before it)
    assert alert.details["size_in_scales"] > 1.5 and alert.details["statistic"] > alert.details["shift_threshold"]
    assert "shifted worse" in alert.message and "no run was out of bounds" in alert.message
    # the same stored rows seed a history that raises the same alert at the next run
    seeded = seed_metric_history([(i, f"r{i:02d}", v, True, "success") for i, v in enumerate(values[:at])],
                                 history_policy(CONFIG, "acc"))
    again = observe(seeded, values[at:at + 1], CONFIG, start=at)
    assert again[0] is not None and again[0].details == alert.details


def test_a_reported_shift_restarts_the_history_at_its_first_run_and_is_not_reported_again():
    """After ``metric_shifted`` the new level is the baseline: 40 more runs at it raise nothing (the old level no
    longer holds the median between the two), a second shift on top of it is reported, and a history seeded
    from the stored rows is the running one, restart included."""
    rng = random.Random(7)
    values = ([76 + rng.gauss(0, 0.3) for _ in range(30)] + [75.3 + rng.gauss(0, 0.3) for _ in range(40)]
              + [74.4 + rng.gauss(0, 0.3) for _ in range(12)])
    history = MetricHistory()
    alerts = observe(history, values, CONFIG)
    shifted = [(i, a) for i, a in enumerate(alerts) if a is not None]
    assert [a.kind for _, a in shifted] == ["metric_shifted", "metric_shifted"]
    (first_at, first), (second_at, second) = shifted
    assert 30 < first_at < 35 and 70 < second_at < 76
    assert second.details["old_centre"] == pytest.approx(75.3, abs=0.3)  # measured from the first shift's level
    assert int(second.details["first_run"][1:]) >= 69
    policy = history_policy(CONFIG, "acc")
    assert policy.shift_rate == shift_rate(CONFIG.metric_success_conditions["acc"])
    seeded = seed_metric_history([(i, f"r{i:02d}", v, True, "success") for i, v in enumerate(values)], policy)
    assert seeded == history
    probe = MetricHistory()
    observe(probe, values[:first_at + 1], CONFIG)
    assert probe.entries[0].run == first.details["first_run"] and probe.previous  # restarted; the old level bridges


def test_no_shift_check_without_it_or_for_an_improvement():
    rng = random.Random(2)
    values = [76 + rng.gauss(0, 0.3) for _ in range(30)] + [76.7 + rng.gauss(0, 0.3) for _ in range(10)]
    assert observe(MetricHistory(), values, CONFIG) == [None] * len(values)  # better, not worse
    worse = [2 * 76 - v for v in values]
    off = RegressionTestConfig(metric_success_conditions=CONFIG.metric_success_conditions,
                               alert_after_second_test_failure=False, detect_shifts=False)
    assert observe(MetricHistory(), worse, off) == [None] * len(worse)
    assert any(a is not None for a in observe(MetricHistory(), worse, CONFIG))


def test_the_shift_checks_take_their_share_of_the_budget():
    raw = {"regression_test_config": {"metric_success_conditions": {"acc": {"comparison": "greater"}}}}
    condition = parse_test_config(raw, "t.json").regression_test.metric_success_conditions["acc"]
    assert condition.false_alert_rate == pytest.approx(0.01 / (1 + SHIFT_SHARE))  # the cutoff's share, and ...
    assert shift_rate(condition) == pytest.approx(0.01 / (1 + SHIFT_SHARE) * SHIFT_SHARE)  # ... the shift check's
    raw["regression_test_config"]["detect_shifts"] = False
    assert parse_test_config(raw, "t.json").regression_test.metric_success_conditions["acc"].false_alert_rate \
        == pytest.approx(0.01)


def test_runs_on_the_slower_of_two_machine_types_are_no_shift():
    """A base that holds the slower type's level a fifth of the time or more: slow runs in a row are a mode,
    not a shift; the same runs after a one-mode base are one."""
    rng = random.Random(9)
    fast = [10 + rng.gauss(0, 0.1) for _ in range(30)]
    slow = [12.5 + rng.gauss(0, 0.1) for _ in range(10)]
    mixed = fast[:20] + slow
    rng.shuffle(mixed)
    window = [10.0, 10.1, 12.5, 12.6, 12.4]

    def shifts(base):
        values = base + window
        return [find_shift(values[:end], 1, 0.002) for end in range(len(base) + 1, len(values) + 1)]
    assert any(shifts(fast))
    assert not any(shifts(mixed))
