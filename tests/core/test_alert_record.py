"""The one alert read model: what the writer writes, every reader reads back the same."""

import json

import pytest

from core.alert_record import InvalidAlert, alert_from_row, decode_details, epoch_seconds, parse_alert
from core.records import Alert
from core.vocabulary import AlertKind
from tests.support import T0


def written(**changes) -> Alert:
    fields = dict(kind=AlertKind.METRIC_OUT_OF_BOUNDS, test="t", run="r", message="m", created_at=T0 + 0.25,
                  metric="loss", value=2.5, lower_bound=None, upper_bound=2.0,
                  details={"history_size": 7, "run_data": {"logs_link": "https://l/1", "status": "success"}})
    return Alert(**{**fields, **changes})


def test_a_payload_reads_back_as_the_alert_that_was_written():
    alert = written()
    record = parse_alert(json.dumps(alert.to_row()).encode())
    assert (record.alert_id, record.kind, record.test, record.run, record.metric) == \
        (alert.alert_id, "metric_out_of_bounds", "t", "r", "loss")
    assert (record.value, record.lower_bound, record.upper_bound, record.message) == (2.5, None, 2.0, "m")
    assert record.created_at == T0 + 0.25
    assert (record.history_size, record.logs_link, record.status, record.window) == (7, "https://l/1", "success", None)
    assert record.severity == AlertKind.METRIC_OUT_OF_BOUNDS.severity


def test_a_table_row_reads_as_the_same_record_as_the_payload():
    row = written().to_row()
    from_payload = parse_alert(json.dumps(row).encode())
    assert alert_from_row({**row, "created_at": T0 + 0.25}) == from_payload


def test_unknown_kinds_are_kept_and_sort_after_known_ones():
    record = alert_from_row({**written().to_row(), "kind": "from_a_newer_pipeline"})
    assert record.kind == "from_a_newer_pipeline" and record.severity == len(AlertKind)


@pytest.mark.parametrize("payload, reason", [
    (b"\xff", "not JSON"), (b"[1]", "not a JSON object"), (b'{"kind": "x"}', "alert_id must be"),
    (json.dumps({**written().to_row(), "value": "1"}).encode(), "value must be a number"),
    (json.dumps({**written().to_row(), "metric_name": 5}).encode(), "metric_name must be a string"),
])
def test_what_is_not_an_alert_is_refused_with_a_reason(payload, reason):
    with pytest.raises(InvalidAlert, match=reason):
        parse_alert(payload)


def test_details_that_are_not_a_json_object():
    assert decode_details('{"window": {"start_step": 1}}') == {"window": {"start_step": 1}}
    assert decode_details("[1, 2]") == {} and decode_details(None) == {}
    assert decode_details("{oops") == {"raw": "{oops"}


@pytest.mark.parametrize("moment, seconds", [
    ("2025-11-20T00:00:00.000000Z", T0), ("2025-11-20T01:00:00+01:00", T0), ("2025-11-20T00:00:00", T0),
    (T0, T0), (int(T0), T0), ("yesterday", None), (None, None), (True, None), (float("nan"), None),
])
def test_created_at_reads_from_every_form_a_store_gives(moment, seconds):
    assert epoch_seconds(moment) == seconds
