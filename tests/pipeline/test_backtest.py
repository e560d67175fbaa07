"""``trainguard-backtest`` end to end: the demo replay's store re-evaluated under the same and under other configs."""

import datetime
import json
import shutil
import subprocess
import sys

import pytest

from core.records import Alert
from core.schema import TABLES
from core.vocabulary import AlertKind
from pipeline import backtest as cli
from pipeline import replay
from sinks.bigquery import BigQueryTarget, ensure_tables
from sinks.duckdb_store import DuckDBStore
from tests.support import REPO_ROOT, heavy_imports_of

CONFIGS = f"{REPO_ROOT}/configs"
BERT = "tf-bert-squad-v100"
NEW_FLOOR = 74.6  # between the demo's BERT accuracies: some runs fall below it


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """The store and alerts file of one replay of the bundled demo data (shared: the tests only read it)."""
    where = tmp_path_factory.mktemp("demo")
    replay.run([f"--input_files={REPO_ROOT}/data/demo/*.jsonl", f"--config_dir={CONFIGS}",
                f"--local_store={where / 'store.duckdb'}", f"--alerts_file={where / 'alerts.jsonl'}",
                "--triage_file=", "--report_dir="])
    return where / "store.duckdb"


def backtest_json(capsys, *argv):
    capsys.readouterr()
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def query_store(path, sql, parameters=()):
    """Rows of the store, closed again: DuckDB will not open a file read-only while this process writes to it."""
    store = DuckDBStore(str(path))
    try:
        return store.query(sql, parameters)
    finally:
        store.close()


def stored_alert_count(store):
    [(count,)] = query_store(store, "SELECT count(*) FROM alerts")
    return count


def test_the_demo_store_under_its_own_configs_fires_exactly_what_it_fired(demo_store, capsys):
    summary = backtest_json(capsys, f"--config_dir={CONFIGS}", f"--local_store={demo_store}")
    assert not summary["changed"] and summary["errors"] == []
    for diff in summary["diffs"]:
        assert diff["only_fired"] == [] and diff["only_would_fire"] == [], diff
        assert diff["fired"] == diff["would_fire"]
    assert sum(d["fired"] for d in summary["diffs"]) == stored_alert_count(demo_store) == 11
    assert {d["kind"] for d in summary["diffs"]} == {"job_failed", "run_missing", "metric_out_of_bounds",
                                                     "window_out_of_bounds"}
    assert (summary["runs"], summary["values"], summary["windows"]) == (35, 217, 72)

    assert cli.main([f"--config_dir={CONFIGS}", f"--local_store={demo_store}"]) == 0
    text = capsys.readouterr().out
    assert "re-evaluated 35 runs, 217 metric values and 72 windows" in text
    assert "no change: every re-evaluated alert would fire as it did" in text


def test_a_tighter_threshold_names_the_alerts_it_would_add(demo_store, tmp_path, capsys):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    path = configs / f"{BERT}.json"
    config = json.loads(path.read_text())
    config["regression_test_config"]["metric_success_conditions"]["Accuracy/test_final"] = {
        "comparison": "greater_or_equal", "success_threshold": {"fixed_value": NEW_FLOOR}}
    path.write_text(json.dumps(config))

    summary = backtest_json(capsys, f"--config_dir={configs}", f"--local_store={demo_store}")
    [changed] = [d for d in summary["diffs"] if d["only_fired"] or d["only_would_fire"]]
    assert (changed["test"], changed["kind"], changed["only_fired"]) == (BERT, "metric_out_of_bounds", [])
    below = query_store(
        demo_store, "SELECT run_id FROM metric_history JOIN job_history USING (test_name, run_id) WHERE test_name = ? "
        "AND metric_name = 'Accuracy/test_final' AND job_status = 'success' AND metric_value < ? ORDER BY run_id",
        (BERT, NEW_FLOOR))
    expected = {Alert(AlertKind.METRIC_OUT_OF_BOUNDS, BERT, run, "", 0.0, "Accuracy/test_final").alert_id: run
                for (run,) in below}
    assert len(expected) == 4
    assert {a["alert_id"]: a["run"] for a in changed["only_would_fire"]} == expected
    assert changed["would_fire"] == changed["fired"] + 4

    assert cli.main([f"--config_dir={configs}", f"--local_store={demo_store}"]) == 0
    text = capsys.readouterr().out
    assert "alerts that differ" in text
    assert all(f"+ {BERT}  metric_out_of_bounds  {run}  Accuracy/test_final  {alert_id}" in text
               for alert_id, run in expected.items())


def one_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_missing_store_or_a_bad_config_is_one_line_and_exit_status_2(tmp_path, capsys):
    assert cli.main([f"--config_dir={CONFIGS}", f"--local_store={tmp_path / 'none.duckdb'}"]) == 2
    assert one_line(capsys.readouterr().err).startswith("trainguard-backtest: error: no store at ")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "t.json").write_text('{"regression_test_config": {"alert_for_failed_jobs": "yes"}}')
    assert cli.main([f"--config_dir={bad}", f"--local_store={tmp_path / 'none.duckdb'}"]) == 2
    assert "alert_for_failed_jobs" in one_line(capsys.readouterr().err)


def test_an_unreadable_store_is_one_line_and_exit_status_1(tmp_path, capsys):
    not_a_store = tmp_path / "store.duckdb"
    not_a_store.write_text("not a database")
    assert cli.main([f"--config_dir={CONFIGS}", f"--local_store={not_a_store}"]) == 1
    assert one_line(capsys.readouterr().err).startswith("trainguard-backtest: error: ")


def test_the_module_runs_without_beam_and_rejects_an_unknown_option_naming_it():
    unknown = subprocess.run([sys.executable, "-m", "pipeline.backtest", f"--config_dir={CONFIGS}", "--frobnicate"],
                             capture_output=True, text=True, cwd=REPO_ROOT)
    assert unknown.returncode == 2 and "--frobnicate" in unknown.stderr
    assert heavy_imports_of("pipeline.backtest") == []
    helped = subprocess.run([sys.executable, "-m", "pipeline.backtest", "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert helped.returncode == 0 and "(default: trainguard.duckdb)" in " ".join(helped.stdout.split())


def test_the_same_rows_in_bigquery_give_the_same_backtest_even_when_inserted_twice(demo_store, bigquery_emulator,
                                                                                 capsys):
    tables = BigQueryTarget(bigquery_emulator.project, "backtest", bigquery_emulator.endpoint)
    ensure_tables(tables)
    client = bigquery_emulator.client()
    for table in TABLES.values():
        rows = [dict(zip(table.column_names, (v.isoformat() if isinstance(v, datetime.datetime) else v
                                              for v in row)))
                for row in query_store(demo_store, f'SELECT {", ".join(table.column_names)} FROM "{table.name}"')]
        if rows:  # every row twice: streaming inserts are at least once, and BigQuery has no keys
            assert client.insert_rows_json(tables.table_id(table), rows + rows) == []

    def comparable(summary):
        return {k: v for k, v in summary.items() if k not in ("seconds", "store")}

    local = backtest_json(capsys, f"--config_dir={CONFIGS}", f"--local_store={demo_store}")
    remote = backtest_json(capsys, f"--config_dir={CONFIGS}", f"--bigquery_project={tables.project}",
                           f"--bigquery_dataset={tables.dataset}", f"--bigquery_endpoint={tables.endpoint}")
    assert remote["store"] == f"{tables.project}.{tables.dataset}"
    assert comparable(remote) == comparable(local) and not remote["changed"]


def test_the_readme_backtest_commands_run_as_shown(demo_store, tmp_path):
    from tests.support import readme_block, run_shell_line

    shutil.copytree(CONFIGS, tmp_path / "configs")
    shutil.copy(demo_store, tmp_path / "trainguard.duckdb")
    for command in readme_block("## Backtest"):
        done = run_shell_line(command, str(tmp_path))
        assert done.returncode == 0, (command, done.stderr)
    assert "no change" in done.stdout  # the copy is unchanged: it fires what fired


def test_the_readme_noise_command_runs_as_shown(demo_store, tmp_path):
    from tests.support import readme_block, run_shell_line

    shutil.copytree(CONFIGS, tmp_path / "configs")
    shutil.copy(demo_store, tmp_path / "trainguard.duckdb")
    (command,) = readme_block("### Is a metric's noise normal?")
    done = run_shell_line(command, str(tmp_path))
    assert done.returncode == 0, (command, done.stderr)
    assert "odds for normal noise against heavy tails" in done.stdout
    done = run_shell_line(command + " --json", str(tmp_path))
    report = json.loads(done.stdout)
    assert report["odds_needed"] == 20 and isinstance(report["checks"], list)
