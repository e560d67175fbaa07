"""The seed reads only what the checks compare: the checked keys, each to the depth that rebuilds its history.

Every test here stores rows in a real DuckDB file and reads the seed with the store's own SQL, scoped
(``core.seed_scope``) and unscoped (every row), and compares what the checks would compute from each.
"""

import datetime
import random

import pytest

from core.bounds import compute_bounds
from core.config import ConfigSet, parse_test_config
from core.history import MetricHistory
from core.schema import JOB_HISTORY, METRIC_HISTORY, TRIAGE
from core.seed_scope import KeyScope, seed_scope
from core.vocabulary import TriageAction
from sinks.duckdb_store import DuckDBStore
from sinks.seed import backslash_string, read_history_seed, read_metric_rows, standard_string
from sinks.stores import DUCKDB_SQL

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def iso(seconds: float) -> str:
    return (EPOCH + datetime.timedelta(seconds=seconds)).isoformat()


def condition(max_points, wait=0):
    return {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
            "wait_for_n_points_of_history": wait, "history_max_points": max_points}


def config_set(by_test, default=None) -> ConfigSet:
    default_config = parse_test_config(default or {}, "default.json")
    return ConfigSet({test: parse_test_config(raw, f"{test}.json") for test, raw in by_test.items()}, default_config)


class Store:
    """A DuckDB store filled row by row: runs of tests, metric values with their stored flag, triage actions."""

    def __init__(self, path):
        self.store = DuckDBStore(str(path))
        self.store.ensure_schema()
        self.jobs, self.metrics, self.actions = [], [], []

    def run(self, test, run, at, status="success", values=(), segment=None):
        self.jobs.append({"run_id": run, "test_name": test, "job_status": status, "num_failures": 0,
                          "start_time": iso(at - 10), "timestamp": iso(at), "job_duration_sec": 10.0,
                          "processed_at": iso(at), "events": "[]"})
        for metric, value, within in values:
            self.metrics.append({"run_id": run, "test_name": test, "metric_name": metric, "metric_value": value,
                                 "metric_lower_bound": None, "metric_upper_bound": None, "within_bounds": within,
                                 "timestamp": iso(at), "step": None, "history_segment": segment})

    def triage(self, action_id, action, test, metric, run, at):
        self.actions.append({"action_id": action_id, "action": action, "test_name": test, "metric_name": metric,
                             "run_id": run, "alert_id": None, "alert_kind": None, "alert_instance": None,
                             "until": None, "note": None, "author": "u", "created_at": iso(at)})

    def seed(self, configs, scoped=True):
        for table, rows in ((JOB_HISTORY, self.jobs), (METRIC_HISTORY, self.metrics), (TRIAGE, self.actions)):
            if rows:
                self.store.insert(table, rows)
        self.jobs, self.metrics, self.actions = [], [], []
        return read_history_seed(configs, self.store.query, DUCKDB_SQL, scoped=scoped)


def bounds_of(configs, seed, key):
    test, metric = key
    config = configs.for_test(test).regression_test
    history = seed.metrics.get(key, MetricHistory())  # a key with no successful run is an empty history
    return compute_bounds(config.condition_for(metric), history.values, history.previous)


def random_histories(store: Store, tests: int, seed: int):
    """``tests`` tests of one checked metric each, with their own history size, rebaseline streak and warm-up, and
    random histories: values, stored within-bounds flags (often out of bounds, sometimes unchecked), failed runs,
    and accepts and dismisses of random earlier runs made at random later times. A third of the tests keep a
    history per machine type (``history_by``), their runs on one of two or three."""
    rng = random.Random(seed)
    by_test = {}
    for t in range(tests):
        test, max_points = f"t{t:04}", rng.randint(1, 8)
        segments = rng.choice([(None,), ("accelerator=a", "accelerator=b"), ("accelerator=a", "accelerator=")])
        by_test[test] = {"regression_test_config": {
            "rebaseline_after": rng.randint(0, 4), "history_by": ["accelerator"] if segments[0] else [],
            "metric_success_conditions": {"loss": condition(max_points, rng.randint(0, max_points))}}}
        out_of_bounds = rng.choice([0.05, 0.2, 0.5, 0.8])
        runs = rng.randint(0, 80)
        for i in range(runs):
            within = None if rng.random() < 0.05 else rng.random() >= out_of_bounds
            status = "failure" if rng.random() < 0.1 else "success"
            store.run(test, f"r{i:02}", 100.0 * i, status, [("loss", rng.random(), within)], rng.choice(segments))
        for j in range(rng.randint(0, 3) if runs else 0):
            target = rng.randrange(runs)
            store.triage(f"{test}-a{j}", rng.choice([TriageAction.ACCEPT, TriageAction.DISMISS]), test, "loss",
                         f"r{target:02}", rng.uniform(100.0 * target + 1, 100.0 * runs))
    return config_set(by_test)


def test_a_scoped_seed_gives_every_checked_metric_the_bounds_and_history_of_its_whole_history(tmp_path):
    store = Store(tmp_path / "store.duckdb")
    configs = random_histories(store, tests=3000, seed=1)
    full = store.seed(configs, scoped=False)
    scoped = read_history_seed(configs, store.store.query, DUCKDB_SQL)
    assert len(scoped.metrics) > 2500
    for key, history in full.metrics.items():
        assert bounds_of(configs, scoped, key) == bounds_of(configs, full, key), key
        assert scoped.metrics.get(key, MetricHistory()).entries == history.entries, key
        segments = scoped.metrics.get(key, MetricHistory()).segments
        assert {name: h.entries for name, h in segments.items()} == {
            name: h.entries for name, h in history.segments.items()}, key
    assert sum(bool(history.segments) for history in full.metrics.values()) > 500


def test_the_seed_reads_a_checked_metric_to_its_depth_and_no_unchecked_one(tmp_path):
    configs = config_set({"checked": {"regression_test_config": {
        "rebaseline_after": 2, "metric_success_conditions": {"loss": condition(3)}}}})
    store = Store(tmp_path / "store.duckdb")
    for i in range(50):
        within = i % 5 != 0  # one in five out of bounds: they are read with the counted values around them
        store.run("checked", f"r{i:02}", 100.0 * i, values=[("loss", float(i), within), ("lr", 0.1, None)])
        store.run("unconfigured", f"r{i:02}", 100.0 * i, values=[("loss", float(i), None)])
    store.run("checked", "failed", 100.0 * 50, "failure", [("loss", 99.0, None)])
    full = store.seed(configs, scoped=False)
    scope = seed_scope(configs).metrics
    assert scope.depth == 2 * 3 + 2
    rows = read_metric_rows(store.store.query, DUCKDB_SQL, scope)
    assert {(row.test, row.metric) for row in rows} == {("checked", "loss")}
    runs = sorted(row.run for row in rows)
    counted = [run for run in runs if int(run[1:]) % 5 != 0]
    assert len(counted) == 8 and counted[0] == runs[0] and runs[-1] == "r49"  # 8 counted, and what lies between
    assert "failed" not in runs  # a failed run never enters a metric's history
    scoped = read_history_seed(configs, store.store.query, DUCKDB_SQL)
    assert set(scoped.metrics) == {("checked", "loss")} < set(full.metrics)
    assert bounds_of(configs, scoped, ("checked", "loss")) == bounds_of(configs, full, ("checked", "loss"))
    assert scoped.jobs == full.jobs and scoped.stored_runs == full.stored_runs


def test_a_default_condition_scopes_every_metric_of_the_tests_it_covers(tmp_path):
    configs = config_set({"named": {"regression_test_config": {"metric_success_conditions": {"acc": condition(2)}}}},
                         default={"regression_test_config": {"metric_success_conditions": {"default": condition(4)}}})
    scope = seed_scope(configs).metrics
    assert scope.needs("other", "anything") and scope.needs("named", "acc") and not scope.needs("named", "loss")
    store = Store(tmp_path / "store.duckdb")
    for i in range(20):
        store.run("other", f"r{i:02}", 100.0 * i, values=[("anything", float(i), True)])
        store.run("named", f"r{i:02}", 100.0 * i, values=[("acc", float(i), True), ("loss", 1.0, True)])
    full = store.seed(configs, scoped=False)
    scoped = read_history_seed(configs, store.store.query, DUCKDB_SQL)
    assert set(scoped.metrics) == {("other", "anything"), ("named", "acc")}
    for key in scoped.metrics:
        assert bounds_of(configs, scoped, key) == bounds_of(configs, full, key)


@pytest.mark.parametrize("name", ["it's", 'a "quoted" one', "back\\slash", "line\nbreak", "%s {0} ?", "ümlaut/ß"])
def test_names_that_need_escaping_reach_the_seed_query_as_text(tmp_path, name):
    configs = config_set({name: {"regression_test_config": {"metric_success_conditions": {name: condition(2)}}}})
    store = Store(tmp_path / "store.duckdb")
    for i in range(5):
        store.run(name, f"r{i}", 100.0 * i, values=[(name, float(i), True)])
    assert list(store.seed(configs).metrics) == [(name, name)]


def test_string_literals_of_both_dialects():
    assert standard_string("it's") == "'it''s'"
    assert backslash_string("it's \\ \n") == "'it\\'s \\\\ \\n'"


def test_a_store_with_no_checked_key_is_not_asked_for_metrics_or_windows(tmp_path):
    asked = []
    store = Store(tmp_path / "store.duckdb")

    def query(sql):
        asked.append(sql)
        return store.store.query(sql)

    read_history_seed(config_set({}), query, DUCKDB_SQL)
    assert not any('"metric_history"' in sql or '"metric_windows"' in sql for sql in asked)
    assert KeyScope({}, frozenset(), 5).empty


def test_an_accept_of_a_run_still_to_come_survives_a_scoped_seed(tmp_path):
    """A future accept whose run has not ended waits in the history; the next job's seed keeps it waiting, as the
    job that received it did, however little of the history the scoped read takes."""
    store = Store(tmp_path / "store.duckdb")
    configs = config_set({"t": {"regression_test_config": {"metric_success_conditions": {"loss": condition(3)}}}})
    for i in range(10):
        store.run("t", f"r{i:02}", 100.0 * i, values=[("loss", 1.0 + 0.01 * i, True)])
    store.triage("t-a", TriageAction.ACCEPT, "t", "loss", "r10", 950.0)
    store.actions[-1]["future"] = True
    full = store.seed(configs, scoped=False)
    scoped = read_history_seed(configs, store.store.query, DUCKDB_SQL)
    assert full.metrics[("t", "loss")].pending_accept == "r10"
    assert scoped.metrics[("t", "loss")].pending_accept == "r10"
