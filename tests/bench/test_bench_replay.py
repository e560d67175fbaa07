"""The replay benchmark's reference does the replay's work: on the benchmark's own input, v1 and v1.1, it stores
the runs, statuses and values the pipeline stores. No timing is checked."""

from pathlib import Path

import duckdb
import pytest

from bench import bench_replay as bench

RUNS = "SELECT run_id, test_name, job_status FROM job_history ORDER BY ALL"
VALUES = "SELECT run_id, test_name, metric_name, metric_value, step FROM metric_history ORDER BY ALL"


def rows(store: Path, query: str) -> list:
    with duckdb.connect(str(store), read_only=True) as connection:
        return connection.execute(query).fetchall()


@pytest.mark.long
def test_the_plain_loop_stores_what_the_pipeline_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--points", "6000", "--rows", "no_report", "--out_dir", str(tmp_path)])
    out = capsys.readouterr().out
    for schema in ("v1", "v1.1"):
        assert f"plain Python loop, same work ({schema}; reference)" in out
        reference, pipeline = tmp_path / schema / "reference.duckdb", tmp_path / schema / "no-report.duckdb"
        assert len(rows(reference, RUNS)) == 500 and rows(reference, RUNS) == rows(pipeline, RUNS)
        assert len(rows(reference, VALUES)) == 2000 and rows(reference, VALUES) == rows(pipeline, VALUES)
    with pytest.raises(SystemExit):
        bench.main(["--schemas", "v2"])
