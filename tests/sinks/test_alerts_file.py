"""The alerts file holds each recorded line once, completed from the store's record whatever the file lost."""

import json

import pytest

from sinks.alerts_file import AlertsFileDamaged, alert_json, complete_alerts_file, cut_torn_tail, line_key


def row(alert_id, created_at="2025-11-21T00:00:00.000000Z"):
    return {"alert_id": alert_id, "kind": "job_failed", "created_at": created_at}


def record(*rows):
    return [(*line_key(r), alert_json(r)) for r in rows]


def ids(path):
    return [json.loads(line)["alert_id"] for line in path.read_text().splitlines()]


def test_each_recorded_line_is_appended_once_in_the_order_recorded(tmp_path):
    path = tmp_path / "alerts.jsonl"
    assert complete_alerts_file(str(path), record(row("b"), row("a"))) == 2
    assert complete_alerts_file(str(path), record(row("b"), row("a"), row("c"))) == 1
    assert ids(path) == ["b", "a", "c"]


def test_a_file_changed_between_runs_is_read_again(tmp_path):
    path = tmp_path / "alerts.jsonl"
    complete_alerts_file(str(path), record(row("a"), row("b")))
    path.write_text(json.dumps(row("b")) + "\n")  # rewritten behind the sink's back: "a" is gone
    complete_alerts_file(str(path), record(row("a"), row("b")))
    assert ids(path) == ["b", "a"]
    path.unlink()
    complete_alerts_file(str(path), record(row("a")))
    assert ids(path) == ["a"]


def test_a_torn_last_line_is_cut_and_then_completed_from_the_record(tmp_path):
    path = tmp_path / "alerts.jsonl"
    complete_alerts_file(str(path), record(row("a")))
    whole = path.read_bytes()
    path.write_bytes(whole + alert_json(row("b")).encode()[:17])  # killed half way through "b"
    note = cut_torn_tail(str(path))
    assert "torn line (17 bytes" in note and path.read_bytes() == whole
    assert cut_torn_tail(str(path)) is None and cut_torn_tail(str(tmp_path / "none.jsonl")) is None
    complete_alerts_file(str(path), record(row("a"), row("b")))
    assert ids(path) == ["a", "b"]


def test_a_file_torn_inside_its_only_line_is_cut_to_nothing(tmp_path):
    path = tmp_path / "alerts.jsonl"
    path.write_bytes(b'{"alert_id": "a", "cr')
    assert cut_torn_tail(str(path)) and path.read_bytes() == b""


def test_a_line_that_is_not_an_alert_in_the_middle_of_the_file_is_named_not_skipped(tmp_path):
    path = tmp_path / "alerts.jsonl"
    path.write_text(alert_json(row("a")) + "\nnot an alert\n" + alert_json(row("b")) + "\n")
    with pytest.raises(AlertsFileDamaged, match="line 2 of the alerts file"):
        complete_alerts_file(str(path), record(row("c")))
