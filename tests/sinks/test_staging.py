"""Rows staged by any worker process reach the store and the alerts file once, in an order bundles do not set."""

import json

import apache_beam as beam

from core.schema import ALERT_UPDATES, ALERTS, DEAD_LETTER
from sinks.duckdb_store import DuckDBStore
from sinks.staging import StageRows, append_staged_alerts, load_staged_tables, staged_rows
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
    store_path = str(tmp_path / "s.duckdb")
    DuckDBStore(store_path).ensure_schema()
    assert load_staged_tables(str(staging), store_path)[DEAD_LETTER.name] == 2
    assert load_staged_tables(str(staging), store_path)[DEAD_LETTER.name] == 0


def test_alerts_are_appended_oldest_first_and_their_triage_updates_after_them(tmp_path):
    staging = tmp_path / "staging"
    stage(staging, ALERTS.name, [alert("late", "2025-11-21T00:00:00.000000Z"),
                                 alert("early", "2025-11-20T00:00:00.000000Z")])
    stage(staging, ALERT_UPDATES, [alert("early", "2025-11-20T00:00:00.000000Z", "dismissed")])
    alerts_file = tmp_path / "alerts.jsonl"
    append_staged_alerts(str(staging), str(alerts_file))
    lines = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    assert [(a["alert_id"], "dismissed" in a["details"]) for a in lines] == [
        ("early", False), ("late", False), ("early", True)]
