"""Rows staged by any worker process reach the store and the alerts file once, in an order bundles do not set,
all tables of a commit in one transaction."""

import json

import apache_beam as beam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.schema import ALERT_UPDATES, ALERTS, DEAD_LETTER
from sinks.alerts_file import complete_alerts_file
from sinks.duckdb_store import DuckDBStore
from sinks.staging import StageRows, _row_of, canonical, commit_staged, recorded_alert_lines, staged_rows
from tests.transforms.support import batch_pipeline


def dead_letter(reason, payload="p"):
    return {"reason": reason, "payload": payload, "source": "file:x", "received_at": None,
            "dead_letter_id": f"id-{reason}", "created_at": "2025-11-20T00:00:00.000000Z"}


def alert(alert_id, created_at, state=None):
    row = {c.name: "x" if c.type == "STRING" else None for c in ALERTS.columns}
    details = json.dumps({"triage": {"state": state}}) if state else "{}"
    return {**row, "alert_id": alert_id, "kind": "job_failed", "created_at": created_at, "details": details}


def stage(directory, name, rows):
    with batch_pipeline() as p:
        p | beam.Create(rows) | StageRows(str(directory), name)


def test_a_bundle_written_twice_loads_once(tmp_path):
    staging = tmp_path / "staging"
    rows = [dead_letter("a"), dead_letter("b")]
    stage(staging, DEAD_LETTER.name, rows)
    stage(staging, DEAD_LETTER.name, rows[::-1])  # a retried bundle, in another order
    assert [r["reason"] for r in staged_rows(str(staging), DEAD_LETTER.name)] == ["a", "b"]
    (staging / DEAD_LETTER.name / "torn.partial").write_text("{not json")  # a bundle that died while writing
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    store.ensure_schema()
    assert commit_staged(str(staging), store)[DEAD_LETTER.name] == 2
    assert commit_staged(str(staging), store)[DEAD_LETTER.name] == 0


def test_alerts_are_appended_oldest_first_and_their_triage_updates_after_them(tmp_path):
    staging = tmp_path / "staging"
    stage(staging, ALERTS.name, [alert("late", "2025-11-21T00:00:00.000000Z"),
                                 alert("early", "2025-11-20T00:00:00.000000Z")])
    stage(staging, ALERT_UPDATES, [alert("early", "2025-11-20T00:00:00.000000Z", "dismissed")])
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    store.ensure_schema()
    commit_staged(str(staging), store)
    alerts_file = tmp_path / "alerts.jsonl"
    assert complete_alerts_file(str(alerts_file), recorded_alert_lines(store)) == 3
    lines = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    assert [(a["alert_id"], "dismissed" in a["details"]) for a in lines] == [
        ("early", False), ("late", False), ("early", True)]
    assert complete_alerts_file(str(alerts_file), recorded_alert_lines(store)) == 0


def test_a_commit_that_fails_half_way_leaves_no_table_changed(tmp_path):
    staging = tmp_path / "staging"
    stage(staging, DEAD_LETTER.name, [dead_letter("a")])
    stage(staging, ALERTS.name, [alert("x", "2025-11-20T00:00:00.000000Z")])
    stage(staging, "triage", [{"action_id": None, "action": "accept", "test_name": "t",  # NOT NULL: fails
                               "created_at": "2025-11-20T00:00:00.000000Z"}])
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    store.ensure_schema()
    with pytest.raises(Exception, match="NOT NULL"):
        commit_staged(str(staging), store)
    assert store.counts()[DEAD_LETTER.name] == 0 and store.counts()[ALERTS.name] == 0
    assert recorded_alert_lines(store) == []


ROW_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(),
                       st.text(alphabet=st.characters(max_codepoint=127)),
                       st.sampled_from([1e-5, -2.5e-7, 1e-4, 1e16, 1e300, 5e-324, 0.0, -0.0, 2 ** 63, -2 ** 63 - 1,
                                        10 ** 19, "\x7f", "caf\u00e9", "\ud800"]))


@settings(max_examples=3000, deadline=None)
@given(st.dictionaries(st.text(max_size=8), ROW_VALUES, max_size=8))
def test_a_row_is_staged_as_json_writes_it_and_read_back_as_json_reads_it(row):
    """The shards' text sets their order and which copy of a key wins: orjson's fast path must write exactly what
    ``json.dumps(sort_keys=True)`` writes, and what it reads back must be what ``json.loads`` reads."""
    expected = json.dumps(row, sort_keys=True, separators=(",", ":"))
    assert canonical(row) == expected
    assert repr(_row_of(expected)) == repr(json.loads(expected))  # (repr: NaN equal to NaN, -0.0 not to 0.0)
