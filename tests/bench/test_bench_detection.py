"""The detection benchmark: its generator makes what it says, its scorer counts right, its detectors work, and it runs."""

import dataclasses
import json
import statistics

import duckdb
import numpy as np
import pytest

from bench import bench_detection
from bench.detection import anchors, harness, oracle, scoring
from bench.detection import suite as gen
from bench.detection.scoring import Alert

TINY = gen.SuiteSpec(tests=3, runs=30, seed=1, noise="normal")


@pytest.fixture(scope="module")
def tiny():
    return gen.generate(TINY)


def _z(plan, run, metric, value, changes=None):
    """A value in σ of the noise from the level of ``plan`` (with only ``changes``, when given)."""
    if changes is not None:
        plan = dataclasses.replace(plan, changes=tuple(changes))
    centre, sigma = gen.level(plan, run.index, metric)
    return (value - centre) / sigma


def _kurtosis(x):
    x = np.asarray(x) - np.mean(x)
    return float(np.mean(x ** 4) / np.mean(x ** 2) ** 2 - 3)


def test_t3_noise_has_heavy_tails_and_unit_variance_and_normal_noise_does_not():
    t3 = gen.unit_noise(np.random.default_rng(7), "t3", 400_000)
    normal = gen.unit_noise(np.random.default_rng(7), "normal", 400_000)
    assert abs(np.std(normal) - 1) < 0.01 and abs(_kurtosis(normal)) < 0.1
    assert abs(np.std(t3) - 1) < 0.1 and _kurtosis(t3) > 10  # t(3) has no finite kurtosis: large in any big sample
    heavy = gen.generate(dataclasses.replace(TINY, noise="t3"))  # the points of a suite carry it too
    residuals = [r.step_time[:10] / np.median(r.step_time[:10]) - 1 for runs in heavy.runs for r in runs]
    assert _kurtosis(np.concatenate(residuals)) > 3


def test_the_same_seed_plans_the_same_events_in_both_noise_families():
    assert [gen.plan_test(TINY, t) for t in range(3)] == [
        gen.plan_test(dataclasses.replace(TINY, noise="t3"), t) for t in range(3)]
    assert gen.generate(TINY).runs[2][20].values == gen.generate(TINY).runs[2][20].values  # pure


def test_healthy_run_level_values_follow_the_true_level_with_unit_noise(tiny):
    for metric in (gen.ACCURACY, gen.LOSS, gen.STEP_TIME):
        z = [_z(plan, run, metric, run.values[metric.name]) for plan, runs in zip(tiny.plans, tiny.runs)
             for run in runs if plan.is_healthy(run.index)]
        assert abs(statistics.mean(z)) < 0.35 and 0.7 < statistics.pstdev(z) < 1.3, metric.name
    assert {run.values[gen.CONSTANT.name] for runs in tiny.runs for run in runs if run.succeeded} == {gen.EPOCHS}


def test_the_bimodal_test_has_two_modes_and_the_drifting_test_drifts(tiny):
    drift, bimodal = tiny.plans[0], tiny.plans[1]
    assert (drift.role, bimodal.role) == ("drift", "bimodal")
    slow = [r.values[gen.STEP_TIME.name] for r in tiny.runs[1] if r.index in bimodal.slow_runs and r.succeeded]
    fast = [r.values[gen.STEP_TIME.name] for r in tiny.runs[1] if r.index not in bimodal.slow_runs and r.succeeded]
    assert len(slow) >= 5 and len(fast) >= 5
    assert 1.2 < statistics.median(slow) / statistics.median(fast) < 1.3
    # the drifting test's step time, its accepted change and shift divided out, grows 0.2% a run
    index, values = [], []
    for run in tiny.runs[0]:
        if drift.is_healthy(run.index) and run.succeeded:
            moved = [c for c in drift.changes if c.metric is gen.STEP_TIME and c.first_run <= run.index]
            factor = np.prod([c.factor * (1 + c.sigmas * gen.noise_sigma(gen.STEP_TIME)) for c in moved])
            index.append(run.index)
            values.append(np.log(run.values[gen.STEP_TIME.name] / factor))
    assert 0.001 < np.polyfit(index, values, 1)[0] < 0.003


def test_accepted_changes_and_shifts_stay_at_their_new_level(tiny):
    for plan, runs in zip(tiny.plans, tiny.runs):
        assert len(gen.accepted_changes_of(plan)) == 2 and len(gen.shifts_of(plan)) == 1
        for change in plan.changes:
            others = [c for c in plan.changes if c is not change]
            after = [_z(plan, r, change.metric, r.values[change.metric.name], others) for r in runs
                     if r.index >= change.first_run and plan.is_healthy(r.index) and r.succeeded]
            after += [_z(plan, r, change.metric, r.values[change.metric.name], others) for r in runs
                      if r.index in change.stretch]
            moved = statistics.median(after) * change.metric.worse
            if change.shift is None:
                size = abs(change.factor - 1) / gen.noise_sigma(change.metric)
                assert abs(abs(moved) - size) < 0.1 * size, (plan.name, change)
            else:  # a regression: the bad direction, its size in σ
                assert abs(moved - change.sigmas) < 1.0, (plan.name, change)


def test_faults_are_where_the_truth_says_and_nowhere_else():
    spec = dataclasses.replace(TINY, tests=6, runs=60)
    suite = gen.generate(spec)
    seen = set()
    for plan, runs in zip(suite.plans, suite.runs):
        assert all(run >= spec.warmup and not plan.in_stretch(run) for run in plan.faults)
        for run in runs:
            fault = plan.faults.get(run.index)
            kind = fault.kind if fault else None
            seen.add(kind)
            assert run.succeeded == (kind is not gen.FaultKind.CRASH)
            if kind is gen.FaultKind.CRASH:
                assert run.steps[-1] < gen.STEPS
                continue
            z = {m.name: _z(plan, run, m, run.values[m.name]) for m in (gen.ACCURACY, gen.LOSS, gen.STEP_TIME)}
            if kind in gen.ACCURACY_DROPS:
                assert abs(z[gen.ACCURACY.name] + gen.ACCURACY_DROPS[kind]) < 4
            elif kind is gen.FaultKind.DIVERGENCE:
                assert run.values[gen.LOSS.name] > 3 * gen.level(plan, run.index, gen.LOSS)[0]
            elif kind in gen.SLOWDOWNS:
                onset = int(np.ceil(fault.onset * gen.STEPS))
                ratio = np.median(run.step_time[onset + 1:]) / np.median(run.step_time[:onset - 1])
                assert abs(ratio / gen.SLOWDOWNS[kind] - 1) < 0.05
            if kind not in gen.ACCURACY_DROPS:
                assert abs(z[gen.ACCURACY.name]) < 5
            if kind is not gen.FaultKind.DIVERGENCE:
                assert abs(z[gen.LOSS.name]) < 5
            if kind not in gen.SLOWDOWNS:
                assert abs(z[gen.STEP_TIME.name]) < 5
    assert seen >= set(gen.ONE_OFF_KINDS)


def test_the_scorer_counts_a_hand_made_alert_list(tiny):
    plan = next(p for p in tiny.plans if p.faults)
    t = plan.index
    fault_run = min(plan.faults)
    shift = gen.shifts_of(plan)[0]
    change = gen.accepted_changes_of(plan)[0]
    healthy = [r for r in range(TINY.runs) if plan.is_healthy(r)]
    alerts = [Alert(t, fault_run, None, "job_failed"), Alert(t, fault_run, "loss", "x"),  # one fault, two alerts
              Alert(t, shift.first_run + 2, shift.metric.tag, "x"),  # the shift, seen in its third run
              Alert(t, change.first_run, "loss", "x"),  # the change, twice
              Alert(t, change.first_run + 1, "loss", "x"),
              Alert(t, healthy[0], gen.CONSTANT.tag, "x"), Alert(t, healthy[1], "loss", "x")]  # two false ones
    counts = scoring.score(tiny, alerts)
    faults = sum(len(p.faults) + len(gen.shifts_of(p)) for p in tiny.plans)
    assert counts.faults[plan.faults[fault_run].kind.value] >= 1 and sum(counts.faults.values()) == faults
    assert sum(counts.caught.values()) == 2 and counts.recall == 2 / faults
    assert counts.caught[shift.shift.value] == 1 and counts.shift_delays == [3] and counts.median_shift_delay == 3
    assert counts.accepted_changes == 6 and counts.change_alerts == 2 and counts.alerts_per_change == 2 / 6
    healthy_runs = sum(1 for p in tiny.plans for r in range(TINY.runs) if p.is_healthy(r))
    assert counts.healthy_runs == healthy_runs and counts.false_alerts == 2
    assert counts.false_alerts_per_100 == 200 / healthy_runs and counts.constant_alerts == 1
    sixth, seventh = shift.first_run + gen.SHIFT_DEADLINE, shift.first_run + gen.SHIFT_DEADLINE + 1
    late = scoring.score(tiny, [Alert(t, sixth, shift.metric.tag, "x"), Alert(t, seventh, shift.metric.tag, "x")])
    assert late.caught[shift.shift.value] == 0 and late.shift_delays == []  # the sixth run is too late
    # ... but the shift is there: its first alert is late, not false; the one after it is false
    assert late.late_shift_alerts == 1 and late.false_alerts == (1 if plan.is_healthy(seventh) else 0)
    assert scoring.pool([counts, counts]).false_alerts == 4


def test_the_matched_comparison_takes_the_best_recall_within_the_false_alert_budget():
    def row(detector, point, caught, false_alerts):
        counts = scoring.Counts(healthy_runs=100, false_alerts=false_alerts)
        counts.faults["crash"], counts.caught["crash"] = 10, caught
        return scoring.Row(detector, point, counts)

    rows = [row("a", "loose", 9, 3), row("a", "mid", 7, 1), row("a", "tight", 5, 0),
            row("b", "loose", 9, 5), row("b", "tight", 8, 2)]
    assert [(r.detector, r.point) for r in scoring.matched(rows)] == [("a", "mid"), ("b", "tight")]


CHANGE_POINT_MISSING = not anchors.change_points_available()


@pytest.mark.parametrize("anchor", [pytest.param(a, id=f"{a.detector} {a.point}") for a in anchors.anchors(
    with_change_points=not CHANGE_POINT_MISSING)])
@pytest.mark.parametrize("worse", [1, -1])
def test_each_reference_detector_catches_a_10_sigma_regression_and_is_quiet_on_a_constant(anchor, worse):
    noise = np.random.default_rng(3).standard_normal(40)
    values = list(100 + (noise - noise.mean()) / noise.std())
    values[30] += 10 * worse
    assert 30 in anchor.detect(values, worse)
    values[30] -= 20 * worse  # as far the other way: one-sided, so quiet there
    assert 30 not in anchor.detect(values, worse)
    assert anchor.detect([90.0] * 40, worse) == []


def test_the_rule_based_detectors_keep_out_of_bounds_values_and_rebaseline_after_three_in_a_row():
    noise = np.random.default_rng(4).standard_normal(40)
    values = list(100 + noise[:20]) + list(130 + noise[20:])  # a level that moved for good at run 20
    assert anchors.robust_z(values, 1, 6.0) == [20, 21, 22]  # then judged against the new level
    # two values at a new level among n widen mean ± kσ of all earlier runs to take in the third unless
    # sqrt((n - 2) / 2) > k: with 20 runs of history never at k = 4, with 40 it re-baselines
    assert anchors.mean_sigma(values, 1, 4.0) == [20, 21]
    longer = list(100 + np.random.default_rng(4).standard_normal(40)) + [130.0] * 10
    assert anchors.mean_sigma(longer, 1, 4.0) == [40, 41, 42]


@pytest.mark.skipif(CHANGE_POINT_MISSING, reason="ruptures is in the bench extra")
def test_the_change_point_detector_alerts_a_shift_once():
    noise = np.random.default_rng(5).standard_normal(40)
    values = list(100 + noise[:25]) + list(105 + noise[25:])
    alerts = anchors.change_points(values, 1, 8.0)
    assert len(alerts) == 1 and 25 <= alerts[0] < 25 + gen.SHIFT_DEADLINE


@pytest.mark.parametrize("noise", gen.NOISE_FAMILIES)
def test_the_oracle_cutoff_passes_healthy_runs_it_never_saw_at_its_rate(tmp_path, noise):
    """The oracle's quantiles, sampled from the generator, hold on other healthy runs: at 1% a check, 3,000
    fresh runs put about 30 values of each metric beyond it (binomial: 30 ± 5.5)."""
    quantiles = oracle.cached_noise_quantiles(noise, str(tmp_path), runs=4000)
    again = oracle.cached_noise_quantiles(noise, str(tmp_path), runs=4000)  # read back from its file
    assert all(np.array_equal(quantiles.residuals[m.name], again.residuals[m.name]) for m in oracle.NOISY)
    spec = gen.SuiteSpec(tests=1, runs=3000, seed=77, noise=noise)
    plan = gen.TestPlan("fresh", 0, "plain", (), {}, frozenset())
    runs = [gen.generate_run(spec, plan, i) for i in range(spec.runs)]
    for metric in oracle.NOISY:
        cutoff = quantiles.cutoff(metric.name, 0.01)
        beyond = sum((r.values[metric.name] - gen.level(plan, r.index, metric)[0]) * metric.worse
                     > cutoff * gen.level(plan, r.index, metric)[1] for r in runs)
        assert 15 <= beyond <= 50, (metric.name, beyond)
    heavier = quantiles.cutoff(gen.ACCURACY.name, 0.001) - quantiles.cutoff(gen.ACCURACY.name, 0.01)
    assert heavier > (1.5 if noise == "t3" else 0.5)  # t3's tail reaches further between the two rates


def test_the_oracle_catches_a_6_sigma_drop_of_normal_noise_and_alerts_a_shift_once(tmp_path):
    """Knowing the level and the noise, a 6σ accuracy drop of normal noise is out past any cutoff of these
    rates; a shift is alerted at its first run out and is the level from then on."""
    spec = gen.SuiteSpec(tests=6, runs=60, seed=3, noise="normal")
    suite = gen.generate(spec)
    quantiles = oracle.cached_noise_quantiles("normal", str(tmp_path), runs=4000)
    alerts = oracle.detect_suite(suite, quantiles, oracle.rate_of(1.0))
    counts = scoring.score(suite, alerts)
    assert counts.faults["accuracy -6σ"] > 0 and counts.caught["accuracy -6σ"] == counts.faults["accuracy -6σ"]
    assert counts.caught["crash"] == counts.faults["crash"] and counts.constant_alerts == 0
    for plan in suite.plans:
        for shift in gen.shifts_of(plan):
            on_it = [a.run for a in alerts if a.test == plan.index and a.tag == shift.metric.tag
                     and a.run >= shift.first_run and plan.is_healthy(a.run)]
            assert len(on_it) <= 2, (plan.name, shift, on_it)  # its first alert, and at most one by chance


def test_the_benchmark_command_runs_trainguard_end_to_end_on_a_tiny_suite(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(oracle, "SAMPLE_RUNS", 2000)
    workdir = tmp_path / "detection"
    assert bench_detection.main(["--tests", "3", "--runs", "30", "--seeds", "1", "--noise", "t3", "--jobs", "1",
                                 "--workdir", str(workdir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    family = out["families"]["t3"]
    points = [(r["detector"], r["point"], r["default"]) for r in family["rows"]]
    assert points[:3] == [(harness.TRAINGUARD, "false_alerts_per_100_runs 3", False),
                          (harness.TRAINGUARD, "false_alerts_per_100_runs 1", True),
                          (harness.TRAINGUARD, "false_alerts_per_100_runs 0.3", False)]
    assert points[3:6] == [(harness.TRAINGUARD_MEASURED, f"false_alerts_per_100_runs {b}", False)
                           for b in ("3", "1", "0.3")]
    assert len(points) == 6 + len(anchors.anchors(with_change_points=out["change_points"])) + len(oracle.BUDGETS)
    assert [p for d, p, _ in points if d == oracle.ORACLE] == ["budget 3 (p=0.01 a check)",
                                                               "budget 1 (p=0.0033 a check)",
                                                               "budget 0.3 (p=0.001 a check)"]
    suite = gen.generate(gen.SuiteSpec(tests=3, runs=30, seed=1, noise="t3"))
    for row in family["rows"]:  # every detector scored on the same faults
        assert row["faults"] == scoring.score(suite, []).faults and row["constant_metric_alerts"] == 0
    trainguard = family["rows"][1]
    assert trainguard["caught"]["crash"] == trainguard["faults"]["crash"]  # job_failed, read back from the store
    assert trainguard["change_alerts"] > 0  # the loss x1.5 changes alert before the baseline moves
    # the ceiling: the oracle's finer sweep, its best point within the rate at least as good as the table's
    ceiling, = family["oracle_at_most_1_per_seed"]["1"]
    table = [r for r in family["per_seed"]["1"] if r["detector"] == oracle.ORACLE
             and r["false_alerts_per_100_healthy_runs"] <= scoring.MATCHED_FALSE_ALERTS]
    assert ceiling["false_alerts_per_100_healthy_runs"] <= scoring.MATCHED_FALSE_ALERTS
    assert ceiling["recall"] >= max(r["recall"] for r in table)
    bounds = family["bound_distances_in_sigma"]["false_alerts_per_100_runs 1"]
    assert bounds[gen.ACCURACY.name]["n"] > 0 and bounds[gen.ACCURACY.name]["median"] > 0
    with duckdb.connect(str(workdir / "t3-seed1" / "store.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM dead_letter").fetchone() == (0,)  # every line was valid
        assert db.execute("SELECT count(DISTINCT test_name) FROM job_history").fetchone() == (9,)
    # the noise is measured on another suite of the same fleet, then the suite replays with it
    with duckdb.connect(str(workdir / "t3-seed1-last-month" / "store.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(DISTINCT test_name) FROM job_history").fetchone() == (3,)
    assert len(list((workdir / "t3-seed1-measured-noise" / "configs").glob("*.json"))) == 9


def test_a_measured_noise_reaches_the_configs_of_the_test_it_was_measured_for():
    from bench.detection import trainguard_path
    from core.config import parse_test_config

    raw = trainguard_path.config(1.0, noise={gen.ACCURACY.name: "normal"})
    conditions = parse_test_config(raw, "det00-op0.json").regression_test.metric_success_conditions
    assert conditions[gen.ACCURACY.name].noise == "normal"
    assert {conditions[m.name].noise for m in gen.METRICS if m is not gen.ACCURACY} == {"heavy_tailed"}


def test_the_benchmark_prints_its_tables(monkeypatch, capsys, tiny):
    result = harness.SuiteResult(
        TINY, (("trainguard", "false_alerts_per_100_runs 1", True),),
        {("trainguard", "false_alerts_per_100_runs 1"): scoring.score(tiny, [])},
        {1.0: {gen.ACCURACY.name: [1.0, 3.0]}}, {1.0: {"crash": (0, 1)}},
        {"generate": 0.0, "trainguard": 0.0, "anchors": 0.0})
    monkeypatch.setattr(harness, "evaluate_all", lambda *args: [result])
    assert bench_detection.main(["--seeds", "1", "--noise", "normal"]) == 0
    out = capsys.readouterr().out
    assert "| trainguard, false_alerts_per_100_runs 1 (default) | 0.00 | 0.00 |" in out
    assert "| false_alerts_per_100_runs 1: Accuracy/test_final | 2 | 2.0 | 2.8 | 3.0 | 0% |" in out
    assert "| 1 | false_alerts_per_100_runs 1: 0.00, 0.00 | – | – | – | – |" in out  # no reference, no ceiling


def test_the_tail_frontier_holds_every_family_at_the_rate_and_narrows_normal_cutoffs(capsys):
    """bench/bench_tail_frontier.py (the README's claim that following the tail weight gains little): its best
    rule keeps every family's rate at most p and its normal cutoff no wider than today's."""
    from bench import bench_tail_frontier as frontier

    assert frontier.main(["--sizes", "30", "--histories", "3000", "--bins", "6", "--rate", "0.003"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 30 |")]
    today, best = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert today[1] == "today" and best[1] == "best tail-following"
    rates = [float(cell.split()[1].split("·")[0]) for cell in best[2:]]
    assert max(rates) <= 1.0 + 1e-9
    median = [float(cell.split(", ")[1].split("σ")[0]) for cell in (today[2], best[2])]
    assert median[1] <= median[0]
