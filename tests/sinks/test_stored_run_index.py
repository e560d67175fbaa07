"""The streaming job's index of stored runs stays as large as a week of runs, however many years are stored.

Every worker holds the index whole (a side input). A job forgets a run of its own a retention after it ended;
the index of runs of earlier jobs does the same (``sinks.seed.recent_stored_runs``), keeping every back-fill,
whose row does not say when it was stored. A replay, which reads history, still gets every stored run.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from core.config import load_config_dir
from core.history import HistorySeed
from core.records import iso_utc
from core.runs import RunLifecycle
from core.schema import JOB_HISTORY
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.runners import local_batch_runner
from sinks.bigquery import BigQueryTarget, ReadSeedFromBigQuery, SeedPolicy, ensure_tables
from sinks.duckdb_store import DuckDBStore
from sinks.seed import read_history_seed
from sinks.stores import DUCKDB_SQL
from tests.sinks.test_seed_reads import interrupted_row
from tests.support import T0

CONFIGS = load_config_dir(DEFAULT_CONFIG_DIR)
DAY = 86400.0
HORIZON = RunLifecycle().stored_run_horizon_seconds  # 7 days of retention and the 6 h run timeout


def job_row(test: str, run: str, ended_at: float, status: str = "success", out_of_order: bool = False) -> dict:
    return {"run_id": run, "test_name": test, "job_status": status, "num_failures": 0, "start_time": None,
            "timestamp": iso_utc(ended_at - 60), "job_duration_sec": None, "processed_at": iso_utc(ended_at),
            "events": "[]", "out_of_order": out_of_order}


def daily_runs(first_day: int, days: int, tests: int = 20, per_day: int = 4):
    """``tests`` tests, each running ``per_day`` times a day for ``days`` days from day ``first_day`` after T0."""
    return [job_row(f"test-{t}", f"test-{t}-{d}-{r}", T0 + d * DAY + r * DAY / per_day)
            for d in range(first_day, first_day + days) for t in range(tests) for r in range(per_day)]


def test_a_year_of_stored_runs_gives_an_index_as_large_as_a_week(tmp_path):
    store = DuckDBStore(str(tmp_path / "year.duckdb"))
    store.ensure_schema()
    sizes, stored_days = {}, 0
    for days in (30, 182, 365):  # a job started after a month, half a year and a year of runs
        store.insert(JOB_HISTORY, daily_runs(stored_days, days - stored_days))
        stored_days = days
        now = T0 + days * DAY
        seed = read_history_seed(CONFIGS, store.query, DUCKDB_SQL, stored_since=now - HORIZON)
        assert all(int(run.split("-")[2]) >= days - 8 for _, run in seed.stored_runs)
        sizes[days] = len(seed.stored_runs)
    # the last 7 days' runs, and one more each in the timeout's quarter day before them
    assert sizes[30] == sizes[182] == sizes[365] == 20 * (4 * 7 + 1)
    replay = read_history_seed(CONFIGS, store.query, DUCKDB_SQL)
    assert len(replay.stored_runs) == 20 * 4 * 365  # a replay still recognises every stored run


def test_back_fills_stay_in_the_index(tmp_path):
    store = DuckDBStore(str(tmp_path / "store.duckdb"))
    store.ensure_schema()
    now = T0 + 100 * DAY
    store.insert(JOB_HISTORY, [job_row("t", "old", T0 + DAY), job_row("t", "recent", now - DAY),
                               job_row("t", "old-back-fill", T0 + 2 * DAY, out_of_order=True)])
    seed = read_history_seed(CONFIGS, store.query, DUCKDB_SQL, stored_since=now - HORIZON)
    assert seed.stored_runs == {("t", "recent"), ("t", "old-back-fill")}
    assert seed.jobs["t"].last_status == "success"


def test_the_streaming_seed_step_bounds_the_index_by_the_wall_clock(bigquery_emulator):
    target = BigQueryTarget(bigquery_emulator.project, "bounded_index", bigquery_emulator.endpoint)
    ensure_tables(target)
    now = T0 + 400 * DAY
    interrupted, _ = interrupted_row("t", "drained-long-ago", T0 + 100, [(1.0, T0 + 10)])
    rows = [job_row("t", "a-year-ago", now - 365 * DAY), job_row("t", "yesterday", now - DAY),
            job_row("t", "a-back-fill", now - 200 * DAY, out_of_order=True),
            interrupted, job_row("t", "drained-long-ago", T0 + 1000)]
    assert bigquery_emulator.client().insert_rows_json(target.table_id(JOB_HISTORY), rows) == []
    with beam.Pipeline(runner=local_batch_runner()) as pipeline:
        seeds = pipeline | ReadSeedFromBigQuery(
            target, CONFIGS, SeedPolicy(60.0, stored_horizon_seconds=HORIZON), clock=lambda: now)
        index = seeds | beam.Map(HistorySeed.index) | beam.Map(lambda index: sorted(index.stored_runs))
        assert_that(index, equal_to([[("t", "a-back-fill"), ("t", "yesterday")]]), label="index")
        # a run drained long ago that a later job ended is not resumed, though the index forgot it
        assert_that(seeds | beam.Map(lambda seed: sorted(seed.open_runs)), equal_to([[]]), label="open runs")
