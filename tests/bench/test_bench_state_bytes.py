"""The state-bytes benchmark in its quick form: its tables, and what holds whatever the stages keep in state.

No time is checked against a threshold (the README's figures are measured with the default workload); the
driver is: every run ends, every window is emitted, every timer that fires was set, and a week after the last
run no key of a run holds state. Bytes are exact, so one byte budget is checked: the live windows' state.
"""

import math

import pytest

from bench import bench_state_bytes as bench
from tests.support import REPO_ROOT, readme_block, run_shell_line

RUN_LEVEL, WINDOWED = bench.RUN_LEVEL, bench.WINDOWED
PER_RUN_STAGES = ("Deduplicate", "AssembleRuns", "LiveWindows")


@pytest.fixture(scope="module")
def quick():
    return bench.run(["--quick"])


def test_the_quick_workload_is_what_quick_says(quick):
    m, args = quick
    assert (args.runs, args.messages, args.history_runs, args.fleet) == (1, 4, 2, [20])
    assert (args.points, args.tags) == (1000, 20)
    for test in (RUN_LEVEL, WINDOWED):
        assert m.meter.messages[test] == args.runs * (args.messages + 1)  # and a run_finished each
        assert m.meter.points[test] == args.runs * args.messages * args.points


def test_every_run_ends_once_and_every_window_is_emitted(quick):
    m, args = quick
    assert m.finished == {RUN_LEVEL: args.runs, WINDOWED: args.runs}
    steps = args.points // args.tags * args.messages
    assert m.windows == args.runs * args.tags * math.ceil(steps / args.window_count)
    assert m.dead_letters == 0


def test_a_week_after_the_last_run_no_key_of_a_run_holds_state_or_a_timer(quick):
    m, _ = quick
    for name in PER_RUN_STAGES:
        stage = m.graph.stages[name]
        assert stage.keys, name
        for key, (cells, timers, _) in stage.keys.items():
            assert all(cell.data in (None, []) for cell in cells.values()), (name, key)
            assert all(timer.fires is None for timer in timers.values()), (name, key)


def test_every_stateful_stage_keeps_state_and_only_windowed_tests_reach_the_windows(quick):
    m, _ = quick
    rows = {(r.stage, r.test): r for r in bench.stage_rows(m)}
    for test in (RUN_LEVEL, WINDOWED):
        for stage in ("Deduplicate", "AssembleRuns", "CheckMetrics", "CheckRuns"):
            row = rows[(stage, test)]
            assert row.written_per_message > 0 and row.shuffled_per_message > 0, (stage, test)
    for stage in ("LiveWindows", "LiveWindows/Checks"):
        assert rows[(stage, WINDOWED)].written_per_message > 0
        assert rows[(stage, WINDOWED)].read_per_message > 0
        idle = rows[(stage, RUN_LEVEL)]  # filtered out before the shuffle
        assert (idle.shuffled_per_message, idle.written_per_message, idle.work_items_per_message) == (0, 0, 0)
    assert rows[(bench.PARSE, RUN_LEVEL)].shuffled_per_message == 0  # fused with the read: no shuffle, no state


def test_the_counts_agree_with_each_other(quick):
    m, _ = quick
    meter = m.meter
    for key, fired in meter.firings.items():
        assert fired <= meter.timer_sets[key], key  # a timer fires only once set
    for (stage, test), count in meter.firings.items():
        assert count == sum(n for (s, t, _), n in meter.firings_by_timer.items() if (s, t) == (stage, test))
    for row in bench.stage_rows(m):
        assert row.read_per_point * m.points_per_message == pytest.approx(row.read_per_message)
        assert row.written_per_point * m.points_per_message == pytest.approx(row.written_per_message)
        assert row.shuffled_per_message >= row.payload_per_message + row.window_points_per_message
        assert row.firings_per_message <= row.work_items_per_message
        assert 0 <= row.coding_us_per_point <= row.cpu_us_per_point or row.stage == bench.PARSE
    for (stage, _, cell), tally in meter.cells.items():
        assert tally.read_bytes == 0 or tally.reads > 0, (stage, cell)
        assert tally.written_bytes == 0 or tally.writes > 0, (stage, cell)
    parts = meter.windows_parts
    assert parts["writes"] > 0 and parts["bytes"] > parts["emitted"] + parts["open"]


def test_more_runs_never_cost_less(quick):
    m, args = quick
    totals = bench.path_totals(m)
    rows = bench.cost_rows(totals, [20, 200, 2000], args.tags, 1.0, args.work_item_ms, args.utilization)
    for test in (RUN_LEVEL, WINDOWED):
        mine = [r for r in rows if r.test == test]
        assert [r.runs for r in mine] == [20, 200, 2000]
        assert all(r.workers >= 1 for r in mine)
        for smaller, larger in zip(mine, mine[1:]):
            assert larger.total_usd[0] >= smaller.total_usd[0] and larger.total_usd[1] >= smaller.total_usd[1]
            assert larger.vcpus_needed > smaller.vcpus_needed
        for r in mine:
            assert r.streaming_engine_gib[0] <= r.streaming_engine_gib[1]  # shuffles only, then with state


def test_the_report_has_every_table(quick, capsys):
    m, args = quick
    text = bench.report(m, args)
    for heading in ("| stage | test | state read, B/msg", "| whole path |", "| stage | test | cell |",
                    "LiveWindows `run_windows`, an average write", "| stage | test | timer | firings/msg |",
                    "| runs | test | points/s |"):
        assert heading in text
    for stage in bench.STAGES[:-1]:
        assert f"| {stage} | windowed |" in text
    assert "Nothing reached Triage in this workload (Triage: no alert was raised)." in text  # a healthy fleet
    assert "`run_windows`" in text and "`window_points`" in text and "`settle_windows`" in text


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "default: 3" in text and "default: 48" in text and "--quick" in text


def test_the_readme_command_runs_in_its_quick_form():
    """The README's "### State bytes per message, stage by stage" block, each command with --quick added."""
    commands = readme_block("### State bytes per message, stage by stage")
    assert commands and all("bench/bench_state_bytes.py" in c for c in commands)
    for command in commands:
        done = run_shell_line(f"{command} --quick", REPO_ROOT)
        assert done.returncode == 0, (command, done.stderr[-3000:])
        assert "| LiveWindows | windowed |" in done.stdout


def test_live_windows_read_and_write_at_most_16_kib_a_message(quick):
    """Issue 30's budget for the 20-tag example (the default workload measures 13.8 KiB; this one's four messages
    a run carry more of each run's start and end: 15.4 KiB)."""
    m, _ = quick
    row = {(r.stage, r.test): r for r in bench.stage_rows(m)}[("LiveWindows", WINDOWED)]
    assert row.read_per_message + row.written_per_message <= 16 * 1024
