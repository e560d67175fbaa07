"""The window-check benchmark in a small form: its table, the same windows checked both ways, and the offsets back
on afterwards. No time is checked against a threshold (the README's figures are measured with the defaults)."""

from bench import bench_window_checks as bench
from core import window_checks


def test_the_table_times_the_same_windows_with_and_without_the_runs_offsets(capsys):
    bench.main(["--runs", "24", "--windows", "12", "--timed", "2", "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step-aligned window checks against the last 20 of 24 runs, 2 runs x 12 windows")
    rows = [line.split("|")[1:-1] for line in lines[3:]]
    assert [row[0].strip() for row in rows] == ["with the runs' offsets taken off", "without (before)"]
    assert all(row[1].strip().endswith("µs") and row[2].strip().isdigit() for row in rows)
    assert window_checks.RUN_OFFSET_MIN == 2

