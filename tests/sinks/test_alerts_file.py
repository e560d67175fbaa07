import json

from sinks.alerts_file import append_alerts


def row(alert_id, created_at="2025-11-21T00:00:00.000000Z"):
    return {"alert_id": alert_id, "kind": "job_failed", "created_at": created_at}


def append(path, rows):
    append_alerts(str(path), rows)


def ids(path):
    return [json.loads(line)["alert_id"] for line in path.read_text().splitlines()]


def test_each_alert_id_is_appended_once_across_runs(tmp_path):
    path = tmp_path / "alerts.jsonl"
    append(path, [row("a"), row("b", "2025-11-20T00:00:00.000000Z"), row("a")])
    append(path, [row("b"), row("c")])
    assert sorted(ids(path)) == ["a", "b", "c"] and ids(path)[:2] == ["b", "a"]


def test_a_file_changed_between_runs_is_read_again(tmp_path):
    path = tmp_path / "alerts.jsonl"
    append(path, [row("a"), row("b")])
    path.write_text(json.dumps(row("b")) + "\n")  # rewritten behind the sink's back: "a" is gone
    append(path, [row("a"), row("b")])
    assert ids(path) == ["b", "a"]
    path.unlink()
    append(path, [row("a")])
    assert ids(path) == ["a"]
