"""Persisted notifier state (sent ids, budget, offsets) and the alerts-file source."""

from __future__ import annotations

import json

from notifier.sources import FileSource
from notifier.state import NotifierState, next_utc_midnight, utc_day
from tests.notifier.support import START, alert, payload


def test_sent_ids_persist_across_restarts(tmp_path):
    path = str(tmp_path / "state.sqlite")
    with NotifierState(path) as state:
        state.mark_sent(["a", "b"], START)
    with NotifierState(path) as state:
        assert state.was_sent("a", START + 1) and state.was_sent("b", START + 1)
        assert not state.was_sent("c", START + 1)


def test_sent_ids_are_bounded_by_count_least_recently_seen_first(tmp_path):
    with NotifierState(str(tmp_path / "s.sqlite"), max_ids=3) as state:
        state.mark_sent(["a", "b", "c"], START)
        assert state.was_sent("a", START + 5)  # a duplicate of "a" keeps it fresh
        state.mark_sent(["d"], START + 10)
        assert state.sent_count() == 3
        assert [state.was_sent(i, START + 20) for i in "abcd"] == [True, False, True, True]


def test_sent_ids_are_bounded_by_age(tmp_path):
    with NotifierState(str(tmp_path / "s.sqlite"), max_age_seconds=3600) as state:
        state.mark_sent(["old"], START)
        state.mark_sent(["new"], START + 7200)
        assert not state.was_sent("old", START + 7200) and state.was_sent("new", START + 7200)


def test_budget_is_counted_per_utc_day(tmp_path):
    midnight = next_utc_midnight(START)
    assert utc_day(midnight - 1) != utc_day(midnight) and midnight > START
    with NotifierState(str(tmp_path / "s.sqlite")) as state:
        state.use_budget(3, START)
        state.use_budget(2, midnight - 1)
        state.use_budget(1, midnight)
        assert (state.budget_used(START), state.budget_used(midnight)) == (5, 1)


def _lines(path, *alerts):
    with open(path, "ab") as f:
        f.writelines(payload(a) + b"\n" for a in alerts)


def test_file_source_commits_only_the_acked_prefix(tmp_path):
    alerts_file, state = str(tmp_path / "alerts.jsonl"), NotifierState(str(tmp_path / "s.sqlite"))
    _lines(alerts_file, *(alert(metric=f"m{i}") for i in range(3)))
    with open(alerts_file, "ab") as f:
        f.write(b'{"partial": ')  # a line the pipeline is still writing
    source = FileSource(alerts_file, state)
    first, second, third = source.poll(0)
    assert source.poll(0) == []
    second.ack()
    assert state.file_offset(alerts_file) == 0  # the first line is still open
    first.ack()
    assert state.file_offset(alerts_file) == 2 * (len(payload(alert(metric="m0"))) + 1)
    third.nack()
    assert source.poll(0) == [third]  # a nacked line is handed out again


def test_file_source_resumes_from_the_saved_offset_and_reads_dead_letter_records(tmp_path):
    alerts_file, state = str(tmp_path / "alerts.jsonl"), NotifierState(str(tmp_path / "s.sqlite"))
    _lines(alerts_file, alert(metric="a"), alert(metric="b"))
    for delivery in FileSource(alerts_file, state).poll(0):
        delivery.ack()
    with open(alerts_file, "a", encoding="utf-8") as f:  # a dead-letter record line, as the file sink writes it
        record = {"alert": json.loads(payload(alert(metric="c"))), "reason": "sendgrid: HTTP 401", "status": 401}
        f.write(json.dumps(record) + "\n")
    (again,) = FileSource(alerts_file, state).poll(0)
    assert again.payload == payload(alert(metric="c"))
