"""``python -m pipeline.check_configs``: a valid directory described; with a store, the names its configs check
that no stored run has reported, each with the nearest reported one."""

import json
import shutil

from core.schema import METRIC_HISTORY
from pipeline import check_configs
from pipeline.main import main as pipeline_main
from sinks import seed
from sinks.duckdb_store import DuckDBStore
from sinks.stores import DUCKDB_SQL
from tests.support import REPO_ROOT

CIFAR = "pt-cifar-tpu-v3-8"


def demo_store(tmp_path) -> str:
    store = str(tmp_path / "store.duckdb")
    assert pipeline_main([f"--input_files={REPO_ROOT}/data/demo/*.jsonl", f"--config_dir={REPO_ROOT}/configs",
                          f"--local_store={store}", f"--alerts_file={tmp_path / 'alerts.jsonl'}",
                          "--report_dir=", "--triage_file="]) == 0
    return store


def misspelled_configs(tmp_path):
    """The bundled configs with a metric, a window tag and a test's file name misspelled."""
    configs = tmp_path / "configs"
    shutil.copytree(f"{REPO_ROOT}/configs", configs)
    path = configs / f"{CIFAR}.json"
    config = json.loads(path.read_text())
    conditions = config["regression_test_config"]["metric_success_conditions"]
    conditions["Accuracy/test_finale"] = conditions.pop("Accuracy/test_final")
    config["window_config"] = {"tags": {"los": {"count": 10, "aggregations": ["mean"]}}}
    path.write_text(json.dumps(config))
    (configs / "pt-cifar-tpu-v3-9.json").write_text("{}")
    return configs


MISSPELLED = [
    f"warning: {CIFAR}: no stored run reported the metric Accuracy/test_finale: its check never runs "
    "(did you mean Accuracy/test_final?)",
    f"warning: {CIFAR}: no stored run reported the tag los: its check never runs (did you mean loss?)",
    "warning: pt-cifar-tpu-v3-9: no stored run of this test (a misspelled file name?)"]


def test_names_no_stored_run_reported_are_warned_with_the_nearest(tmp_path, capsys):
    store = demo_store(tmp_path)
    configs = misspelled_configs(tmp_path)
    capsys.readouterr()
    assert check_configs.main([f"--config_dir={configs}", f"--local_store={store}"]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert warnings == MISSPELLED


def test_a_replay_ends_with_the_same_warnings_on_stderr(tmp_path, capsys):
    configs = misspelled_configs(tmp_path)
    assert pipeline_main([f"--input_files={REPO_ROOT}/data/demo/*.jsonl", f"--config_dir={configs}",
                          f"--local_store={tmp_path / 'store.duckdb'}", f"--alerts_file={tmp_path / 'alerts.jsonl'}",
                          "--report_dir=", "--triage_file="]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("trainguard: warning: ")] == [
        f"trainguard: {warning}" for warning in MISSPELLED]


def test_the_bundled_configs_check_names_the_demo_reports_and_a_missing_store_is_a_usage_error(tmp_path, capsys):
    store = demo_store(tmp_path)
    capsys.readouterr()
    assert check_configs.main([f"--config_dir={REPO_ROOT}/configs", f"--local_store={store}"]) == 0
    assert "every configured test, metric and tag has stored runs" in capsys.readouterr().out
    assert check_configs.main([f"--config_dir={REPO_ROOT}/configs", f"--local_store={tmp_path / 'nope.duckdb'}"]) == 2
    assert "no store at" in capsys.readouterr().err


def test_the_names_reported_are_read_for_the_tests_named_only(tmp_path, monkeypatch):
    store = DuckDBStore(str(tmp_path / "store.duckdb"))
    store.ensure_schema()
    store.insert(METRIC_HISTORY, [
        {"run_id": f"r{i}", "test_name": test, "metric_name": metric, "metric_value": 1.0, "within_bounds": True,
         "timestamp": "2026-11-27T00:00:00Z"}
        for i, (test, metric) in enumerate([("a", "loss_final"), ("b'c", "loss_final"), ("b'c", "acc_max"),
                                            ("d", "loss_final")])])
    everything = {"a": {"loss_final"}, "b'c": {"loss_final", "acc_max"}, "d": {"loss_final"}}
    assert check_configs.reported_metrics(store.query, DUCKDB_SQL) == everything
    assert check_configs.reported_metrics(store.query, DUCKDB_SQL, ["b'c", "x"]) == {"b'c": everything["b'c"]}
    assert check_configs.reported_metrics(store.query, DUCKDB_SQL, []) == {}
    monkeypatch.setattr(seed, "MAX_NAMED_TESTS", 1)  # too many to name: all read, the same warnings
    assert check_configs.reported_metrics(store.query, DUCKDB_SQL, ["a", "d"]) == everything
