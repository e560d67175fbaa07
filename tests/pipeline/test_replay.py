"""End-to-end tests of ``python -m pipeline`` on replay files."""

import gc
import json
import os
import random
import subprocess
import sys

import pytest

from core.schema import TABLES
from pipeline.demo import daily_runs, run_messages
from pipeline.main import main
from sinks.duckdb_store import DuckDBStore
from tests.support import REPO_ROOT

REPO = REPO_ROOT
CIFAR = "pt-cifar-tpu-v3-8"


def replay(tmp_path, pattern, store="store.duckdb", alerts="alerts.jsonl", extra=("--report_dir=",)):
    return main([f"--input_files={pattern}", f"--config_dir={REPO}/configs",
                 f"--local_store={tmp_path / store}", f"--alerts_file={tmp_path / alerts}", *extra])


def table_contents(path):
    store = DuckDBStore(str(path))
    return {name: sorted(map(repr, store.query(f'SELECT * FROM "{name}"'))) for name in TABLES}


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def test_demo_replay_prints_summary_and_fills_the_store(tmp_path, capsys):
    assert replay(tmp_path, f"{REPO}/data/demo/*.jsonl", extra=()) == 0
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'trainguard-report' / 'index.html'}" in out and (tmp_path / "trainguard-report" / "index.html").exists()
    assert "replayed 4 file(s)" in out
    assert "messages read          180" in out and "runs finalized          35" in out
    assert "dead letters             3" in out
    store = DuckDBStore(str(tmp_path / "store.duckdb"))
    alerts = sorted(store.query("SELECT kind, run_id, metric_name FROM alerts"))
    assert alerts == sorted([
        ("job_failed", "jax-resnet50-failures-only-005", None),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-010", "Accuracy/test_final"),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-010", "Accuracy/test_max"),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-010", "time_to_accuracy"),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-011", "Accuracy/test_final"),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-011", "Accuracy/test_max"),
        ("metric_out_of_bounds", "pt-cifar-tpu-v3-8-011", "time_to_accuracy"),
        ("metric_out_of_bounds", "tf-bert-squad-v100-007", "throughput/examples_per_sec_average"),
        ("metric_out_of_bounds", "tf-bert-squad-v100-007", "total_wall_time"),
        ("run_missing", "tf-bert-squad-v100-008", None),
        ("window_out_of_bounds", "pt-cifar-tpu-v3-8-010", "Accuracy/test_mean"),
    ])
    # live windows: 6 accuracy windows per cifar run (the last partial), throughput in sliding windows
    assert store.query("SELECT count(*), sum(partial::INT) FROM metric_windows WHERE tag = 'Accuracy/test'") == \
        [(72, 12)]
    lines = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert sorted(a["alert_id"] for a in lines) == sorted(r[0] for r in store.query("SELECT alert_id FROM alerts"))
    assert set(lines[0]) == {"alert_id", "kind", "test_name", "run_id", "metric_name", "value", "lower_bound",
                             "upper_bound", "message", "created_at", "details"}
    # record-only test: history written, nothing alerts; ignored tag not recorded
    assert store.query("SELECT count(*) FROM job_history WHERE test_name = 'pt-llama-record-only'") == [(6,)]
    assert store.query("SELECT count(*) FROM metric_history WHERE metric_name LIKE 'loss_%' "
                       "AND test_name = 'tf-bert-squad-v100'") == [(0,)]
    logs = store.query("SELECT details FROM alerts WHERE run_id = 'pt-cifar-tpu-v3-8-011' LIMIT 1")
    assert json.loads(logs[0][0])["run_data"]["logs_link"] == "https://logs.example/cifar/11"
    dead = store.query("SELECT reason, source FROM dead_letter ORDER BY reason")
    assert [r[0].split(":")[0] for r in dead] == ["invalid message", "invalid message", "invalid point [0]"]


def test_rerun_on_the_same_files_adds_nothing(tmp_path, capsys):
    assert replay(tmp_path, f"{REPO}/data/demo/*.jsonl") == 0
    before = table_contents(tmp_path / "store.duckdb")
    alerts_before = (tmp_path / "alerts.jsonl").read_text()
    assert replay(tmp_path, f"{REPO}/data/demo/*.jsonl") == 0
    assert "runs finalized           0" in capsys.readouterr().out
    assert table_contents(tmp_path / "store.duckdb") == before
    assert (tmp_path / "alerts.jsonl").read_text() == alerts_before


def test_the_same_files_named_another_way_add_nothing_either(tmp_path, monkeypatch):
    """Dead letters are keyed by the file's real path: a relative glob and an absolute one store them once."""
    monkeypatch.chdir(REPO)
    assert replay(tmp_path, "data/demo/*.jsonl") == 0
    before = table_contents(tmp_path / "store.duckdb")
    assert replay(tmp_path, f"{REPO}/data/../data/demo/*.jsonl") == 0
    assert table_contents(tmp_path / "store.duckdb") == before
    [(sources,)] = DuckDBStore(str(tmp_path / "store.duckdb")).query("SELECT list(DISTINCT source) FROM dead_letter")
    assert all(source.startswith(f"file:{os.path.realpath(REPO)}/data/demo/") for source in sources)


def cifar_lines():
    plans = daily_runs(CIFAR, 12, day_9={"accuracy_drop": 5.0}, day_10={"accuracy_drop": 5.0},
                       day_11={"status": "failure"})
    return [[m for m in run_messages(plan)] for plan in plans]


def test_history_continues_across_invocations(tmp_path):
    runs = cifar_lines()
    whole = write_lines(tmp_path / "all.jsonl", [m for run in runs for m in run])
    assert replay(tmp_path, whole, store="once.duckdb", alerts="once.jsonl") == 0
    first = write_lines(tmp_path / "first.jsonl", [m for run in runs[:8] for m in run])
    second = write_lines(tmp_path / "second.jsonl", [m for run in runs[8:] for m in run])
    assert replay(tmp_path, first, store="twice.duckdb", alerts="twice.jsonl") == 0
    assert replay(tmp_path, second, store="twice.duckdb", alerts="twice.jsonl") == 0
    assert table_contents(tmp_path / "twice.duckdb") == table_contents(tmp_path / "once.duckdb")
    once = DuckDBStore(str(tmp_path / "once.duckdb"))
    assert ("metric_out_of_bounds", f"{CIFAR}-009") in once.query("SELECT kind, run_id FROM alerts")
    assert sorted((tmp_path / "twice.jsonl").read_text().splitlines()) == \
        sorted((tmp_path / "once.jsonl").read_text().splitlines())


def test_line_order_and_duplicates_do_not_change_the_rows(tmp_path):
    lines = [m for run in cifar_lines() for m in run]
    ordered = write_lines(tmp_path / "ordered.jsonl", lines)
    shuffled = lines + lines[::3]
    random.Random(7).shuffle(shuffled)
    scrambled = write_lines(tmp_path / "scrambled.jsonl", shuffled)
    assert replay(tmp_path, ordered, store="a.duckdb", alerts="a.jsonl") == 0
    assert replay(tmp_path, scrambled, store="b.duckdb", alerts="b.jsonl") == 0
    a, b = table_contents(tmp_path / "a.duckdb"), table_contents(tmp_path / "b.duckdb")
    assert a == b and len(a["metric_history"]) > 50


def test_bad_config_is_a_start_up_error_naming_file_and_key(tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{CIFAR}.json").write_text(json.dumps({"regression_test_config": {"alert_for_failed_jobs": "yes"}}))
    code = main([f"--input_files={REPO}/data/demo/*.jsonl", f"--config_dir={configs}",
                 f"--local_store={tmp_path / 's.duckdb'}", f"--alerts_file={tmp_path / 'a.jsonl'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{CIFAR}.json: regression_test_config.alert_for_failed_jobs:" in err


def test_no_matching_input_is_an_error(tmp_path, capsys):
    assert replay(tmp_path, str(tmp_path / "nothing-*.jsonl")) == 2
    assert "matches no file" in capsys.readouterr().err


def test_a_directory_or_an_unreadable_file_as_input_is_one_line_and_a_usage_error(tmp_path, capsys):
    assert replay(tmp_path, f"{REPO}/data/demo") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "names the directory" in line and "data/demo/*.jsonl" in line
    locked = tmp_path / "locked.jsonl"
    locked.write_bytes(b"")
    locked.chmod(0)
    if not os.access(locked, os.R_OK):  # root reads anything
        assert replay(tmp_path, str(locked)) == 2
        assert "cannot read" in capsys.readouterr().err
    assert not (tmp_path / "store.duckdb").exists()


def test_module_entry_point_runs_on_embedded_defaults(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipeline"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "runs finalized          35" in result.stdout
    assert (tmp_path / "trainguard.duckdb").exists() and (tmp_path / "alerts.jsonl").exists()
    assert "report: trainguard-report/index.html" in result.stdout and (tmp_path / "trainguard-report" / "index.html").exists()


def test_the_summary_ends_with_next_steps_that_run_as_printed(tmp_path, monkeypatch, capsys):
    """As printed, in a shell where the venv is not activated: neither its python nor its scripts on the PATH
    (with them on it, the summary says `python` and `trainguard-triage`, as the README shows)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert main([f"--config_dir={REPO}/configs"]) == 0
    out = capsys.readouterr().out
    assert "total " in out and "start-up and report included" in out
    steps = out[out.index("next:\n") + len("next:\n"):].splitlines()
    assert any("webbrowser" in step for step in steps) and any("dead_letter" in step for step in steps)
    bare = {**os.environ, "PATH": "/usr/bin:/bin"}
    for step in steps:
        if "webbrowser" in step:
            continue  # opens a browser
        done = subprocess.run(["bash", "-c", step.strip()], capture_output=True, text=True, cwd=tmp_path, env=bare)
        assert done.returncode == 0, (step, done.stderr)
    assert f"{sys.executable} -m pipeline.triage list" in out
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")
    assert main([f"--config_dir={REPO}/configs", "--report_dir="]) == 0
    assert "\n  trainguard-triage list --state open" in capsys.readouterr().out


MIXED = "mixed-hardware"


def mixed_hardware_lines(runs=40, fault_at=32):
    """A test whose runs land at random on a fast (v5e) or a slow (v4, x1.25) machine type, said by run_started;
    run ``fault_at`` is x1.2 slower on the fast type, still faster than the slow type."""
    from trainguard import wire
    rng = random.Random(4)
    lines = []
    for i in range(runs):
        run, start = f"{MIXED}-{i:03d}", 1_764_000_000.0 + 3600.0 * i
        accelerator = "v5e" if i == fault_at else rng.choice(["v4", "v5e"])
        level = (1.25 if accelerator == "v4" else 1.0) * (1.2 if i == fault_at else 1.0)
        points = [wire.point_dict("step_time", level * (1 + rng.gauss(0, 0.01)), start + 10 + step, step)
                  for step in range(20)]
        lines.append([
            wire.encode_message(MIXED, run, events=[wire.event_dict(wire.RUN_STARTED, start,
                                                                    {"accelerator": accelerator})]),
            wire.encode_message(MIXED, run, points),
            wire.encode_message(MIXED, run, events=[wire.event_dict(wire.RUN_FINISHED, start + 40,
                                                                    {"status": "success"})])])
    return lines


def replay_mixed(tmp_path, configs, lines, name) -> int:
    """Replays the runs' ``lines`` under ``configs`` into ``<name>.duckdb`` (and ``<name>.alerts.jsonl``)."""
    path = write_lines(tmp_path / f"{name}.jsonl", [m for run in lines for m in run])
    return main([f"--input_files={path}", f"--config_dir={configs}", f"--local_store={tmp_path / name}.duckdb",
                 f"--alerts_file={tmp_path / name}.alerts.jsonl", "--report_dir="])


def replayed_once_and_in_two(tmp_path, configs, runs) -> DuckDBStore:
    """Replays ``runs`` in one invocation and in two (the first 25, then the rest): the same tables; the first's
    store."""
    assert replay_mixed(tmp_path, configs, runs, "once") == 0
    assert replay_mixed(tmp_path, configs, runs[:25], "twice") == 0
    assert replay_mixed(tmp_path, configs, runs[25:], "twice") == 0
    assert table_contents(tmp_path / "twice.duckdb") == table_contents(tmp_path / "once.duckdb")
    return DuckDBStore(str(tmp_path / "once.duckdb"))


def test_history_by_keeps_a_baseline_per_machine_type_across_invocations(tmp_path):
    """history_by: ["accelerator"] judges each run against the runs of its machine type: the fast type's x1.2
    slowdown is the one alert, naming its segment, every row says its segment, and a second invocation seeds
    each type's history from the store (the same tables as one invocation)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{MIXED}.json").write_text(json.dumps({
        "metric_collection_config": {"default_aggregation_strategies": ["average"]},
        "regression_test_config": {
            "history_by": ["accelerator"], "alert_after_second_test_failure": False,
            "metric_success_conditions": {"step_time_average": {
                "comparison": "less", "success_threshold": {"false_alert_rate": 0.002},
                "wait_for_n_points_of_history": 5}}}}))
    runs = mixed_hardware_lines()
    store = replayed_once_and_in_two(tmp_path, configs, runs)
    assert store.query("SELECT kind, run_id FROM alerts") == [("metric_out_of_bounds", f"{MIXED}-032")]
    details = json.loads(store.query("SELECT details FROM alerts")[0][0])
    assert details["history_segment"] == "accelerator=v5e"
    assert {row[0] for row in store.query("SELECT history_segment FROM metric_history")} == {
        "accelerator=v4", "accelerator=v5e"}


@pytest.mark.parametrize("history_runs", [20, 6])
def test_history_by_gives_the_live_windows_of_each_machine_type_their_own_history(tmp_path, history_runs):
    """The test's history_by reaches its window checks: each run's windows take the machine type its run_started
    names, are compared with the same steps of that type's runs and are stored with it; the slow type's runs raise
    no window alert, the fast type's x1.2 slowdown does, and a second invocation seeds each type's window history
    from the stored segments, each type's latest runs (the same tables as one invocation; with 6 runs compared,
    the seed reads 15 runs of each type, not 15 of both)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    check = {"aggregation": "mean", "history": "step_aligned", "history_runs": history_runs,
             "condition": {"comparison": "less", "success_threshold": {"false_alert_rate": 0.002},
                           "wait_for_n_points_of_history": 5}}
    (configs / f"{MIXED}.json").write_text(json.dumps({
        "metric_collection_config": {"default_aggregation_strategies": ["average"]},
        "regression_test_config": {"history_by": ["accelerator"], "alert_after_second_test_failure": False},
        "window_config": {"tags": {"step_time": {"count": 5, "aggregations": ["mean"], "checks": [check]}}}}))
    runs = mixed_hardware_lines()
    store = replayed_once_and_in_two(tmp_path, configs, runs)
    alerted = store.query("SELECT DISTINCT run_id FROM alerts WHERE kind = 'window_out_of_bounds'")
    assert alerted == [(f"{MIXED}-032",)]
    assert {row[0] for row in store.query("SELECT history_segment FROM metric_windows")} == {
        "accelerator=v4", "accelerator=v5e"}
    from pipeline.replay import read_config_dir
    from sinks.seed import read_history_seed
    from sinks.stores import DUCKDB_SQL
    config_set = read_config_dir(str(configs)).strict().latest
    [whole] = read_history_seed(config_set, store.query, DUCKDB_SQL, scoped=False).windows.values()
    [scoped] = read_history_seed(config_set, store.query, DUCKDB_SQL).windows.values()
    assert {s: [f.run for f in h.finished_runs] for s, h in scoped.segments.items()} == {
        s: [f.run for f in h.finished_runs] for s, h in whole.segments.items()}
    compared = json.loads(store.query("SELECT details FROM alerts WHERE kind = 'window_out_of_bounds'")[0][0])
    v5e = {run for (run,) in store.query("SELECT run_id FROM metric_windows WHERE history_segment = 'accelerator=v5e'")}
    assert compared["compared_runs"] and set(compared["compared_runs"]) <= v5e

    # The same runs checked with one window history, then backtested under history_by: what would change
    flat = tmp_path / "flat"
    flat.mkdir()
    config = json.loads((configs / f"{MIXED}.json").read_text())
    config["window_config"]["tags"]["step_time"]["history_by"] = []
    (flat / f"{MIXED}.json").write_text(json.dumps(config))
    assert replay_mixed(tmp_path, flat, runs, "flat") == 0
    from pipeline.backtest import run as backtest
    [diff] = [d for d in backtest([f"--config_dir={configs}", f"--local_store={tmp_path / 'flat.duckdb'}"])["diffs"]
              if d["kind"] == "window_out_of_bounds"]
    assert {a["run"] for a in diff["only_fired"]} == {f"{MIXED}-008"}
    assert {a["run"] for a in diff["only_would_fire"]} == {f"{MIXED}-032"}


def test_the_first_run_freezes_its_graph_even_where_the_imports_were_frozen_before(monkeypatch):
    """``python -m pipeline`` freezes what its imports made before anything runs (``pipeline/__main__.py``); the
    first run still freezes what start-up made after them (its graph, the runner), and no later run does."""
    import pipeline.replay as replay_module
    monkeypatch.setattr(replay_module, "_FIRST_RUN_FROZEN", False)  # a process whose first run is to come
    gc.freeze()  # what the entry point does after its imports
    made_after_the_imports = [[number] for number in range(100)]
    frozen = gc.get_freeze_count()
    with replay_module.start_up_objects_frozen():
        assert gc.get_freeze_count() >= frozen + len(made_after_the_imports)
    made_later = [[number] for number in range(100)]
    frozen = gc.get_freeze_count()
    with replay_module.start_up_objects_frozen():
        assert gc.get_freeze_count() == frozen
    assert made_later and made_after_the_imports


def test_the_entry_point_freezes_its_imports_and_leaves_the_collector_on():
    """``python -m pipeline`` imports with the collector paused and freezes what the imports made
    (``pipeline/__main__.py``); the collector is on again after, whatever the imports raised."""
    code = "import gc, pipeline.__main__; print(gc.get_freeze_count() > 100_000, gc.isenabled())"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_a_process_that_replays_again_and_again_frees_what_each_replay_leaves(tmp_path, capsys):
    """A replay freezes the objects made before its run (``start_up_objects_frozen``). Freezing each run's graph
    and thawing it after the run left it where only a full pass of the collector, which then hardly ever came,
    could free it: 10,000 objects more at each demo replay, 530 MB after 60 of them. Frozen once per process,
    each later run's graph is freed as any garbage is."""
    path = write_lines(tmp_path / "one.jsonl", cifar_lines()[0])
    gc.collect()
    for number in range(8):
        assert replay(tmp_path, path, store=f"store{number}.duckdb", alerts=f"alerts{number}.jsonl",
                      extra=("--report_dir=", "--no_progress")) == 0
    left = gc.collect()
    # What is left to free: two or three runs' worth, whenever the collector's last full pass came (20,000 to
    # 33,000 seen; other threads' garbage counts too); it grew by 10,000 a run before (57,000 after five runs).
    assert left < 60_000, left
