import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import T0
from trainguard import wire


def message(**fields):
    body = {"schema": wire.SCHEMA, "id": "m1", "test": "t", "run": "r",
            "points": [{"tag": "loss", "value": 0.5, "step": 10, "time": T0}]}
    body.update(fields)
    return json.dumps(body).encode()


def test_valid_message_round_trips_through_encode():
    payload = wire.encode_message("t/x", "r1", [wire.point_dict("loss", 1.5, T0, 3)],
                                  [wire.event_dict(wire.RUN_FINISHED, T0 + 1, {"status": "success"})], "id-1")
    parsed, rejections = wire.parse_message(payload)
    assert rejections == []
    assert parsed.id == "id-1" and parsed.test == "t/x" and parsed.run == "r1"
    assert parsed.points == (("loss", 1.5, 3, T0),)
    assert parsed.events[0].type == wire.RUN_FINISHED
    assert parsed.event_time == T0 + 1


def test_integer_values_become_floats_and_step_is_optional():
    parsed, _ = wire.parse_message(message(points=[{"tag": "a", "value": 3, "time": T0}]))
    assert parsed.points == (("a", 3.0, None, T0),)
    assert isinstance(parsed.points[0][1], float)


@pytest.mark.parametrize("payload, reason", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (message(schema="trainguard/v2"), "schema is 'trainguard/v2'"),
    (message(id=None), "missing field 'id'"),
    (message(test=7), "test must be a string"),
    (message(run=""), "run must have 1 to"),
    (message(run="a\nb"), "control characters"),
    (message(points={"tag": "x"}), "points must be a list"),
    (message(points=[{"tag": "x", "value": 1, "time": T0}] * (wire.MAX_POINTS_PER_MESSAGE + 1)), "limit is"),
    (b" " * (wire.MAX_MESSAGE_BYTES + 1), "bytes, limit is"),
    (message(points=[], events=[]), "no points and no events"),
])
def test_invalid_messages_are_rejected_with_a_reason(payload, reason):
    with pytest.raises(wire.InvalidMessage, match=reason.replace("(", r"\(")):
        wire.parse_message(payload)


@pytest.mark.parametrize("point, reason", [
    ({"tag": "x", "value": float("nan"), "time": T0}, "value is nan"),
    ({"tag": "x", "value": 1e400, "time": T0}, "value is inf"),
    ({"tag": "x", "value": True, "time": T0}, "value must be a number"),
    ({"tag": "x", "value": "1", "time": T0}, "value must be a number"),
    ({"tag": "x", "value": 1, "time": T0, "step": 1.5}, "step must be an integer"),
    ({"tag": "x", "value": 1, "time": T0, "step": -1}, "out of range"),
    ({"tag": "x", "value": 1, "time": 12}, "not plausible"),
    ({"tag": "x", "value": 1}, "time must be a number"),
    ({"value": 1, "time": T0}, "tag must be a string"),
    ({"tag": "x", "value": 1, "time": T0, "extra": 1}, "unknown fields"),
    ("loss=1", "not an object"),
])
def test_a_bad_point_is_rejected_alone(point, reason):
    good = {"tag": "ok", "value": 1.0, "time": T0}
    parsed, rejections = wire.parse_message(message(points=[good, point]))
    assert parsed.points == (("ok", 1.0, None, T0),)
    assert len(rejections) == 1
    assert rejections[0].reason.startswith("invalid point [1]: ") and reason in rejections[0].reason
    context = json.loads(rejections[0].payload)
    assert context["id"] == "m1" and context["test"] == "t" and context["run"] == "r"


@pytest.mark.parametrize("event, reason", [
    ({"type": "run_finished", "time": T0, "data": {"status": "done"}}, "status must be one of"),
    ({"type": "run_finished", "time": T0, "data": {"status": "success", "num_failures": -1}}, "num_failures"),
    ({"type": "run_started", "time": T0, "data": [1]}, "data must be an object"),
    ({"type": "custom", "time": T0, "data": {"blob": "x" * (wire.MAX_EVENT_DATA_BYTES + 1)}}, "data is larger"),
])
def test_a_bad_event_is_rejected_alone(event, reason):
    parsed, rejections = wire.parse_message(message(events=[event]))
    assert len(parsed.points) == 1 and parsed.events == ()
    assert len(rejections) == 1 and reason in rejections[0].reason


def test_other_event_types_are_kept():
    parsed, rejections = wire.parse_message(message(events=[{"type": "checkpoint_saved", "time": T0, "data": {"n": 1}}]))
    assert rejections == [] and parsed.events == (wire.Event("checkpoint_saved", T0, {"n": 1}),)


def test_nan_literal_in_json_is_a_point_rejection_not_a_crash():
    payload = message().replace(b'"value": 0.5', b'"value": NaN')
    parsed, rejections = wire.parse_message(payload)
    assert parsed.points == () and "value is nan" in rejections[0].reason


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                              lambda children: st.lists(children, max_size=4)
                              | st.dictionaries(st.sampled_from(["schema", "id", "test", "run", "points", "events",
                                                                 "tag", "value", "time", "step", "type", "data"]),
                                                children, max_size=6),
                              max_leaves=30).map(lambda o: json.dumps(o).encode())))
def test_any_payload_parses_or_is_rejected_with_a_reason(payload):
    try:
        parsed, rejections = wire.parse_message(payload)
    except wire.InvalidMessage as e:
        assert str(e)
        return
    assert parsed.points or parsed.events or rejections
    assert all(r.reason and r.payload for r in rejections)


def test_attributes_carry_event_time_in_millis():
    points = [wire.point_dict("a", 1.0, T0 + 0.25)]
    events = [wire.event_dict("run_started", T0)]
    ts = wire.event_time_millis(points, events)
    assert wire.message_attributes("t", "r", ts, "m-1") == {"schema": wire.SCHEMA, "test": "t", "run": "r",
                                                            "ts": str(int((T0 + 0.25) * 1000)), "id": "m-1"}


TRIAGE_CASES = [
    wire.Triage("accept", T0, metric="loss_final", run="r7", note="new optimizer", user="ana"),
    wire.Triage("dismiss", T0, metric="loss_mean", run="r7", alert_id="a" * 32, alert_kind="window_out_of_bounds",
                instance="count/3"),
    wire.Triage("mute", T0, until=T0 + 86400),
    wire.Triage("mute", T0, metric="step_time_average", until=T0 + 60),
]


@pytest.mark.parametrize("triage", TRIAGE_CASES)
def test_triage_control_messages_round_trip(triage):
    message, rejections = wire.parse_message(wire.encode_triage("test", triage, "m1"))
    assert rejections == [] and message.triage == triage and message.points == message.events == ()
    assert message.event_time == T0 and message.test == "test" and message.run == (triage.run or "")


def control(**triage):
    return json.dumps({"schema": wire.SCHEMA, "id": "m", "test": "t", "triage": triage}).encode()


@pytest.mark.parametrize("triage, reason", [
    ({"action": "forget", "time": T0}, "triage.action must be one of"),
    ({"action": "accept", "time": T0, "metric": "m"}, "triage accept needs 'run'"),
    ({"action": "dismiss", "time": T0, "run": "r", "alert_kind": "job_failed"}, "needs 'alert_id'"),
    ({"action": "mute", "time": T0}, "triage mute needs 'until'"),
    ({"action": "mute", "time": T0, "until": T0}, "until must be after"),
    ({"action": "mute", "time": T0, "until": T0 + 1, "run": "r"}, "does not take ['run']"),
    ({"action": "accept", "time": "yesterday", "metric": "m", "run": "r"}, "time must be a number"),
    ({"action": "accept", "time": T0, "metric": "m", "run": "r", "note": 5}, "note must be a string"),
])
def test_invalid_triage_messages_are_rejected_with_a_reason(triage, reason):
    with pytest.raises(wire.InvalidMessage, match=reason.replace("[", r"\[").replace("]", r"\]")):
        wire.parse_message(control(**triage))


def test_a_triage_message_carries_nothing_else():
    payload = json.dumps({"schema": wire.SCHEMA, "id": "m", "test": "t", "run": "r",
                          "triage": {"action": "mute", "time": T0, "until": T0 + 1}}).encode()
    with pytest.raises(wire.InvalidMessage, match="carries only schema, id, test and triage"):
        wire.parse_message(payload)


def test_rank_and_world_size_are_optional_and_round_trip():
    point = [wire.point_dict("loss", 1.0, T0, 5)]
    message, _ = wire.parse_message(wire.encode_message("t", "r", point, message_id="m", rank=3, world_size=8))
    assert (message.rank, message.world_size) == (3, 8)
    message, _ = wire.parse_message(wire.encode_message("t", "r", point, message_id="m"))
    assert (message.rank, message.world_size) == (None, None)  # v1 without them: rank unknown
    message, _ = wire.parse_message(wire.encode_message("t", "r", point, message_id="m", rank=0))
    assert (message.rank, message.world_size) == (0, None)


@pytest.mark.parametrize("fields, reason", [
    ({"rank": -1}, "rank must be an integer from 0"),
    ({"rank": 1.0}, "rank must be an integer"),
    ({"rank": True}, "rank must be an integer"),
    ({"rank": 0, "world_size": 0}, "world_size must be an integer from 1"),
    ({"world_size": 4}, "world_size needs rank"),
    ({"rank": 4, "world_size": 4}, "rank 4 is not below world_size 4"),
])
def test_invalid_ranks_reject_the_message(fields, reason):
    payload = json.dumps({"schema": wire.SCHEMA, "id": "m", "test": "t", "run": "r", **fields,
                          "points": [wire.point_dict("loss", 1.0, T0)]}).encode()
    with pytest.raises(wire.InvalidMessage, match=reason):
        wire.parse_message(payload)
