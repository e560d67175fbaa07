"""The dashboard benchmark (README "Dashboard") in a quick form: it builds its store, serves it, asks every page
alone and under concurrent clients, and writes its results. No figure is checked against a threshold."""

import json
import os

import duckdb
import pytest

from bench import bench_dashboard as bench
from tests.support import REPO_ROOT, run_shell_line

SECTION = "## Dashboard"
QUICK = "--tests=2 --runs=30 --metrics=3 --requests=2 --clients=2 --seconds=1"


def test_the_quick_benchmark_asks_every_page_and_writes_its_results(tmp_path, capsys):
    assert bench.main(["--tests=3", "--runs=40", "--metrics=4", "--requests=2", "--clients=2", "--seconds=1",
                       f"--out_dir={tmp_path}"]) == 0
    with duckdb.connect(str(tmp_path / "store-3x40x4-by-time.duckdb"), read_only=True) as store:
        assert store.execute("SELECT COUNT(*) FROM job_history").fetchone()[0] == 120
        assert store.execute("SELECT COUNT(*) FROM metric_history").fetchone()[0] == 480
        assert store.execute("SELECT COUNT(*) FROM alerts").fetchone()[0] > 0
        for table, column in (("job_history", "timestamp"), ("metric_history", "timestamp"), ("alerts", "created_at"),
                              ("metric_windows", "end_time")):  # written in time order, tests interleaved
            times = [t for (t,) in store.execute(f"SELECT {column} FROM {table} ORDER BY rowid").fetchall()]
            assert times == sorted(times), table
        tests = [t for (t,) in store.execute("SELECT test_name FROM job_history ORDER BY rowid LIMIT 3").fetchall()]
        assert len(set(tests)) == 3
    results = json.loads((tmp_path / "results-1-workers.json").read_text())
    assert set(results["alone"]) == set(bench.pages(str(tmp_path / "store-3x40x4-by-time.duckdb")))
    assert results["load"]["requests"] > 0 and results["load"]["errors"] == 0
    assert results["load"]["cpu_ms_per_request"] > 0 and all(p["cpu_ms"] >= 0 for p in results["alone"].values())
    assert "load: 2 clients" in capsys.readouterr().out


@pytest.mark.long
def test_the_readme_commands_run(tmp_path):
    """The README's commands as written, made quick and pointed at a scratch directory."""
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in section.splitlines() if line.startswith("python bench/bench_dashboard.py")]
    assert len(commands) == 3
    for command in commands:
        result = run_shell_line(f"{command} {QUICK} --out_dir={tmp_path}", REPO_ROOT)
        assert result.returncode == 0, result.stderr
        assert "requests in" in result.stdout and "CPU" in result.stdout
    assert json.loads((tmp_path / "results-1-workers.json").read_text())["vary"] is False
    varied = json.loads((tmp_path / "results-2-workers-varied.json").read_text())
    assert varied["workers"] == 2 and varied["vary"] is True and varied["load"]["errors"] == 0
    people = json.loads((tmp_path / "results-2-workers-varied-think-1.json").read_text())
    assert people["load"]["think_s"] == 1 and people["load"]["requests"] > 0 and people["load"]["errors"] == 0
