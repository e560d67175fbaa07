"""The scaling benchmark runs on tiny sizes and writes a row per replay and the figure; no timing is checked."""

import csv
from pathlib import Path

import pytest

from bench import bench_scaling as bench


def test_the_workloads_have_the_points_and_runs_each_sweep_varies() -> None:
    assert [bench.longer_runs(n).runs for n in (10_000, 1_000_000)] == [500, 500]
    assert bench.longer_runs(1_000_000).points == 1_000_500
    more = [bench.more_runs(n) for n in (100_000, 1_000_000)]
    assert [w.steps for w in more] == [bench.RUN_STEPS] * 2 and [w.runs for w in more] == [100, 1_000]
    spread = bench.spread_over_tests(100_000, 1_000, 2)
    assert spread.tests == 1_000 and spread.points >= 100_000


@pytest.mark.long
def test_the_benchmark_command_writes_every_row_and_the_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert bench.main(["--points", "3000", "6000", "--tests", "2", "--tests_points", "3000", "--one_run_tests", "5",
                       "--seed_runs", "10", "--seed_points", "3000", "--workdir", str(tmp_path / "work"),
                       "--out_dir", str(out)]) == 0
    with open(out / "scaling.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["sweep"], r["size"]) for r in rows] == [
        ("points, longer runs", "3000"), ("points, longer runs", "6000"), ("points, more runs", "3000"),
        ("points, more runs", "6000"), ("tests", "2"), ("one-run tests", "5"), ("seed", "10")]
    for r in rows:  # a rerun (which finalizes nothing: measure checks it) for the one-run tests only
        reran = r["sweep"] == "one-run tests"
        assert r["runs_finalized"] == r["runs"]
        assert all(bool(r[k]) == (reran or k not in bench.RERUN_FIELDS) for k in bench.FIELDS), r
    assert rows[5]["tests"] == rows[5]["runs"] == "5" and rows[5]["points"] == "30"
    assert rows[-1]["stored_runs"] == "10"
    assert (out / "scaling.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_without_out_dir_the_benchmark_writes_no_tracked_file(tmp_path: Path) -> None:
    """docs/scaling.csv and .png are the README's: a run without --out_dir must not overwrite them."""
    docs = Path(bench.REPO) / "docs"
    before = {name: (docs / name).read_bytes() for name in ("scaling.csv", "scaling.png")}
    work = tmp_path / "work"
    assert bench.main(["--points", "3000", "--sweeps", "points", "--workdir", str(work)]) == 0
    assert (work / "scaling.csv").exists() and (work / "scaling.png").exists()
    assert {name: (docs / name).read_bytes() for name in before} == before
