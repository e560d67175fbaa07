"""The alert-quality benchmark runs as the README shows it (on a small suite) and scores what it generated."""

import json

from bench import bench_alert_quality as bench


def test_the_generator_injects_what_it_says():
    plans = bench.plan_suite(tests=4, runs=30, seed=2)
    assert len(plans) == 120 and len({p.test for p in plans}) == 4
    assert all(p.fault is None for p in plans if p.index < bench.HEALTHY_PREFIX or p.in_change)
    assert {p.fault.kind for p in plans if p.fault} <= set(bench.FAULT_KINDS)
    changed = [p for p in plans if p.loss_level != 1 or p.step_time_level != 1]
    assert {p.test for p in changed} == {"quality-00", "quality-02"}  # every other test changes for good
    crash = next(p for p in bench.plan_suite(8, 40, 1) if p.fault and p.fault.kind == "crash")
    assert crash.steps < bench.STEPS


def test_scores_count_alerts_against_the_plan():
    plans = bench.plan_suite(tests=2, runs=20, seed=3)
    fault = next(p for p in plans if p.fault)
    healthy = next(p for p in plans if not p.fault and not p.in_change)
    alerts = [{"run_id": fault.run, "kind": "metric_out_of_bounds", "metric_name": "loss_final",
               "created_at": "2026-01-01T00:00:00Z"},
              {"run_id": healthy.run, "kind": "metric_out_of_bounds", "metric_name": "epochs_final",
               "created_at": "2026-01-01T00:00:00Z"}]
    scores = bench.score(plans, alerts)
    faults = sum(1 for p in plans if p.fault)
    assert scores["recall"] == 1 / faults and scores["constant_metric_alerts"] == 1
    assert scores["false_alerts_per_100_healthy_runs"] == 100 / scores["healthy_runs"]


def test_the_benchmark_command_runs_end_to_end(tmp_path, capsys):
    assert bench.main(["--tests", "2", "--runs", "14", "--workdir", str(tmp_path / "aq"), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["runs"] == 28 and scores["alerts"] == sum(scores["alert_kinds"].values())
    assert (tmp_path / "aq" / "store.duckdb").exists()
