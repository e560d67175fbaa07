"""The floor benchmark's loop does the pipeline's per-test work: on the same files it makes the job and metric rows
(bounds included) and the alerts a replay stores. No timing is checked."""

from pathlib import Path

import duckdb
import pytest
from apache_beam.testing.util import BeamAssertException

from bench import bench_test_floor as bench
from bench.bench_scaling import Workload
from core.config import load_config_dir
from pipeline.main import main as pipeline_main

JOB_FIELDS = ("run_id", "test_name", "job_status", "num_failures", "job_duration_sec", "events")
METRIC_FIELDS = ("run_id", "test_name", "metric_name", "metric_value", "metric_lower_bound", "metric_upper_bound",
                 "within_bounds", "step")


def stored(store: Path, table: str, fields: tuple) -> list:
    with duckdb.connect(str(store), read_only=True) as connection:
        return connection.execute(f"SELECT {', '.join(fields)} FROM {table} ORDER BY ALL").fetchall()


def test_the_loop_makes_the_rows_a_replay_stores(tmp_path: Path) -> None:
    # 4 tests of 8 runs: later runs are bounded by their history, and some fall out of bounds
    pattern, config_dir = bench.prepare(str(tmp_path / "work"), Workload(4, 8, 3))
    store = tmp_path / "store.duckdb"
    assert pipeline_main([f"--input_files={pattern}", f"--config_dir={config_dir}", f"--local_store={store}",
                          f"--alerts_file={tmp_path / 'alerts.jsonl'}", "--report_dir="]) == 0
    seconds, tests, rows = bench.one_pass(bench.read_lines(pattern), load_config_dir(config_dir))
    assert tests == 4 and len(seconds) == len(bench.PHASES)
    assert sorted(tuple(row[f] for f in JOB_FIELDS) for row in rows.job_rows) == stored(store, "job_history", JOB_FIELDS)
    metric_rows = sorted(tuple(row[f] for f in METRIC_FIELDS) for row in rows.metric_rows)
    assert metric_rows == stored(store, "metric_history", METRIC_FIELDS) and len(metric_rows) == 4 * 8 * 4
    assert sum(row[4] is not None for row in metric_rows) > 0  # bounds were computed
    with duckdb.connect(str(store), read_only=True) as connection:
        assert rows.alerts == connection.execute("SELECT count(*) FROM alerts").fetchone()[0] > 0


def test_beams_least_graph_brings_each_tests_runs_together(tmp_path: Path) -> None:
    pattern, _ = bench.prepare(str(tmp_path), Workload(5, 3, 2))
    assert bench.beam_least_graph(pattern, 5) > 0  # its assert_that checks the count of tests it grouped
    with pytest.raises(BeamAssertException, match=r"missing elements \[6\]"):
        bench.beam_least_graph(pattern, 6)


def test_the_reference_loop_must_store_every_run(tmp_path: Path) -> None:
    pattern, _ = bench.prepare(str(tmp_path), Workload(2, 2, 2))
    assert bench.reference_loop(pattern, str(tmp_path), 4) > 0
    with pytest.raises(RuntimeError, match="stored 4 runs \\(5 expected\\)"):
        bench.reference_loop(pattern, str(tmp_path), 5)


def test_the_command_prints_each_phase_and_refuses_unknown_options(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--tests", "3", "--rounds", "1", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 tests, 6 messages, 3 runs, 12 metric rows")
    assert all(phase in out for phase in bench.PHASES) and "s for 200,000 such tests" in out
    beside = out.split("beside it, on the same files")[1]
    assert "Beam's least graph" in beside and "the reference loop (whole process)" in beside
    assert (tmp_path / "reference.duckdb").exists()
    assert bench.main(["--tests", "3", "--rounds", "1", "--workdir", str(tmp_path), "--no_beside"]) == 0
    assert "beside it" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--test_count", "3"])
    assert exit_info.value.code == 2
    assert "--test_count" in capsys.readouterr().err
