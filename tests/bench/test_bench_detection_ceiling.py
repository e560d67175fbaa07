"""bench/bench_detection_ceiling.py: its ceilings are what they say (checked against simulation and the shipped
calibration), and it prints the README's figures."""

import math

import numpy as np
import pytest

from bench import bench_detection_ceiling as ceiling
from bench.detection import suite as gen
from core.bounds import false_alert_multiplier


def test_the_t_interval_power_is_what_simulating_the_t_prediction_interval_gives():
    rng = np.random.default_rng(3)
    n, rate, drop = 8, 0.01, 4.0
    history = rng.standard_normal((200_000, n))
    width = history.std(axis=1, ddof=1) * math.sqrt(1 + 1 / n) * ceiling.stats.t.ppf(1 - rate, n - 1)
    new = rng.standard_normal(200_000)
    assert np.mean(new > history.mean(axis=1) + width) == pytest.approx(rate, rel=0.1)  # it holds the rate
    caught = np.mean(new - drop < history.mean(axis=1) - width)
    assert ceiling.t_interval_power(n, rate, drop) == pytest.approx(caught, abs=0.005)
    assert ceiling.t_interval_power(1, rate, drop) == 0.0


def test_median_and_qn_calibrated_here_is_the_shipped_multiplier():
    """The bench's calibration of trainguard's own rule agrees with core/false_alert_calibration.py's table,
    so the estimator table compares trainguard as it ships."""
    rng = np.random.default_rng(5)
    for n, rate in ((20, 0.003), (11, 0.01)):
        centre, scale = ceiling.ESTIMATORS["median and Qn (trainguard)"](gen.unit_noise(rng, "t3", (20_000, n)))
        assert ceiling.calibrated(centre, scale, rate) == pytest.approx(false_alert_multiplier(n, rate), rel=0.05)


def test_the_t_likelihood_estimates_location_and_scale():
    rng = np.random.default_rng(9)
    values = 5.0 + 2.0 * rng.standard_t(6, (4, 20_000))
    centre, scale = ceiling.t_likelihood(6)(values)
    assert centre == pytest.approx([5.0] * 4, abs=0.05)
    assert scale == pytest.approx([2.0] * 4, rel=0.03)


def test_a_history_is_the_clean_runs_since_accuracy_last_moved():
    plan = gen.TestPlan("t", 0, "plain", (gen.LevelChange(gen.ACCURACY, 20, sigmas=1.0, shift=gen.FaultKind.SHIFT_1),
                                          gen.LevelChange(gen.LOSS, 30, factor=1.5)),
                        {15: gen.Fault(gen.FaultKind.CRASH, 0.5), 25: gen.Fault(gen.FaultKind.ACCURACY_6, 0.5),
                         40: gen.Fault(gen.FaultKind.ACCURACY_3, 0.5)}, frozenset())
    assert ceiling.clean_history(plan, 15) == 15
    assert ceiling.clean_history(plan, 19) == 18  # the crash left out
    assert ceiling.clean_history(plan, 25) == 5  # accuracy moved at 20; loss's change does not restart it
    assert ceiling.clean_history(plan, 40) == 19  # 20..39 without 25


def test_contaminated_histories_widen_the_cutoff():
    rng = np.random.default_rng(2)
    trainguard = ceiling.ESTIMATORS["median and Qn (trainguard)"]
    clean = ceiling.powers(trainguard, 20, 0.003, (6.0,), 4000, rng)
    dirty = ceiling.powers(trainguard, 20, 0.003, (6.0,), 4000, rng, contamination=0.2)
    assert clean["t3"].rate == pytest.approx(1.0, rel=0.15)
    for family in ("t3", "normal"):
        assert dirty[family].caught[6.0] < clean[family].caught[6.0] - 0.1


def test_it_prints_the_readme_figures(capsys):
    """The analytic rows (no simulation): the t interval on the suite's drops and the shift ceiling."""
    assert ceiling.main(["--histories", "400", "--sizes", "12"]) == 0
    out = capsys.readouterr().out
    assert "the 42 largest: 5–56 runs, median 19" in out
    assert "| normal | t prediction interval (no scale-invariant rule catches more) | 5.9/34 (17%) | 14.1/32 (44%) " \
           "| 41.2/42 (98%) |" in out
    assert "| 1σ | 18% |" in out and "| 2σ | 91% |" in out
    assert out.count("| 12 | ") == len(ceiling.ESTIMATORS)


def test_unknown_and_bad_options_exit_2(capsys):
    for argv in (["--bogus"], ["--rate", "0.7"], ["--contamination", "1.5"]):
        with pytest.raises(SystemExit) as exit_:
            ceiling.main(argv)
        assert exit_.value.code == 2
    assert "--contamination" in capsys.readouterr().err
