import json
import math

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
    wire.Triage("accept", T0, metric="loss_final", run="r9", future=True),
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
    ({"action": "accept", "time": T0, "metric": "m", "run": "r", "future": "yes"}, "future must be true or false"),
    ({"action": "mute", "time": T0, "until": T0 + 1, "future": True}, "does not take ['future']"),
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
    ({"rank": -1}, "rank must be an integer from 0 to 1048576, got -1"),
    ({"rank": (1 << 20) + 1}, "rank must be an integer from 0 to 1048576, got 1048577"),
    ({"rank": 1 << 63}, "rank must be an integer from 0 to 1048576, got 9223372036854775808"),
    ({"rank": 0, "world_size": (1 << 20) + 1}, "world_size must be an integer from 1 to 1048576, got 1048577"),
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


BIG = 10 ** 400  # 401 digits: past the float range, so float() of it raises OverflowError


def test_a_time_or_step_of_any_size_rejects_its_item_alone():
    points = [{"tag": "ok", "value": 1.0, "time": T0, "step": 1}, {"tag": "x", "value": 1.0, "time": BIG},
              {"tag": "x", "value": 1.0, "time": T0, "step": BIG}]
    events = [{"type": "run_started", "time": T0}, {"type": "checkpoint_saved", "time": BIG}]
    parsed, rejections = wire.parse_message(message(points=points, events=events))
    assert parsed.points == (("ok", 1.0, 1, T0),) and parsed.events == (wire.Event("run_started", T0, {}),)
    assert [r.reason for r in rejections] == [f"invalid point [1]: time {BIG} is not plausible unix seconds",
                                              f"invalid point [2]: step {BIG} is out of range",
                                              f"invalid event [1]: time {BIG} is not plausible unix seconds"]


@pytest.mark.parametrize("triage", [{"action": "mute", "time": BIG, "until": T0},
                                    {"action": "mute", "time": T0, "until": BIG},
                                    {"action": "mute", "time": -BIG, "until": T0}])
def test_a_triage_time_of_any_size_is_a_reason_not_a_crash(triage):
    with pytest.raises(wire.InvalidMessage, match="is not plausible unix seconds"):
        wire.parse_message(control(**triage))


COUNT_REASON = "must be an integer from 0 to 2147483647, got "


@pytest.mark.parametrize("event_type, field", [(wire.RUN_FINISHED, "num_failures"),
                                               (wire.ELASTIC_RESTART, "restart_count")])
@pytest.mark.parametrize("count, reason", [
    (0, None), (2 ** 31 - 1, None), (2 ** 31, COUNT_REASON + "2147483648"),
    (2 ** 63, COUNT_REASON + "9223372036854775808"), (-1, COUNT_REASON + "-1"), (True, COUNT_REASON + "True"),
    (3.0, COUNT_REASON + "3.0"), ("3", COUNT_REASON + "'3'"), (None, COUNT_REASON + "None"),
])
def test_a_failure_count_the_store_cannot_hold_rejects_its_event_alone(event_type, field, count, reason):
    data = {"status": "failure", field: count} if event_type == wire.RUN_FINISHED else {field: count}
    parsed, rejections = wire.parse_message(message(events=[{"type": event_type, "time": T0, "data": data}]))
    assert len(parsed.points) == 1
    if reason is None:
        assert rejections == [] and parsed.events == (wire.Event(event_type, T0, data),)
    else:
        assert parsed.events == () and [r.reason for r in rejections] == [f"invalid event [0]: {field} {reason}"]


def test_a_restart_event_may_leave_its_count_out():
    parsed, rejections = wire.parse_message(message(events=[{"type": wire.ELASTIC_RESTART, "time": T0}]))
    assert rejections == [] and parsed.events == (wire.Event(wire.ELASTIC_RESTART, T0, {}),)


# -- every integer of the contract, at any size --------------------------------------------------------------------

T0_MS = int(T0 * 1000)
EDGES = [2 ** 31 - 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, -1, 0, 1, 2 ** 20, 2 ** 20 + 1, 2 ** 64 - 1, 2 ** 64,
         -(2 ** 63) + 1, -(2 ** 63), -(2 ** 63) - 1, 2 ** 70, -(2 ** 70), int(wire.MIN_TIME) - 1, int(wire.MIN_TIME),
         int(T0), int(wire.MAX_TIME) - 1, int(wire.MAX_TIME), T0_MS, int(wire.MIN_TIME) * 1000 - 1,
         int(wire.MAX_TIME) * 1000, 2 ** 1023, 2 ** 1024]


def any_integer(low: int = -(2 ** 70), high: int = 2 ** 70):
    """Integers anywhere from -2**70 to 2**70, the edges of every range of the contract, and ones from the
    field's own valid range (so that the rest of the message is often valid and gets checked too)."""
    return st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.sampled_from(EDGES), st.integers(low, high))


@st.composite
def integer_messages(draw) -> bytes:
    """A v1.1 message whose every integer field (points, columns, events, rank) is drawn by ``any_integer``."""
    point = {"tag": "a", "value": draw(any_integer()), "time": draw(any_integer(int(T0), int(T0) + 9)),
             "step": draw(any_integer(0, 9))}
    ms = [draw(any_integer(T0_MS, T0_MS + 9))] + draw(st.lists(any_integer(-9, 9), max_size=3))
    column = {"tag": "b", "values": [draw(any_integer()) for _ in ms], "ms": ms}
    if draw(st.booleans()):
        column["steps"] = [draw(st.one_of(st.none(), any_integer(0, 9))) for _ in ms]
    events = [{"type": wire.RUN_FINISHED, "time": draw(any_integer(int(T0), int(T0) + 9)),
               "data": {"status": "failure", "num_failures": draw(any_integer(0, 9))}},
              {"type": wire.ELASTIC_RESTART, "time": draw(any_integer(int(T0), int(T0) + 9)),
               "data": {"restart_count": draw(any_integer(0, 9))}}]
    body = {"schema": wire.SCHEMA_V1_1, "id": "m", "test": "t", "run": "r", "points": [point], "columns": [column],
            "events": events}
    for field in draw(st.sampled_from([(), ("rank",), ("rank", "world_size")])):
        body[field] = draw(any_integer(0, 9))
    return json.dumps(body).encode()


@st.composite
def integer_triage(draw) -> bytes:
    return control(action="mute", time=draw(any_integer(int(T0), int(T0) + 9)),
                   until=draw(any_integer(int(T0) + 10, int(T0) + 19)))


def assert_within_the_contract(parsed: wire.Message) -> None:
    """What a valid message holds fits its column: BIGINT integers in their documented ranges, finite floats."""
    def count(value):
        return type(value) is int and 0 <= value < 2 ** 31

    assert parsed.rank is None or type(parsed.rank) is int and 0 <= parsed.rank <= 2 ** 20
    assert parsed.world_size is None or type(parsed.world_size) is int and 1 <= parsed.world_size <= 2 ** 20
    for _tag, value, step, time in parsed.points:
        assert type(value) is float and math.isfinite(value)
        assert step is None or type(step) is int and 0 <= step <= 2 ** 63 - 1
        assert type(time) is float and wire.MIN_TIME <= time < wire.MAX_TIME
    for event in parsed.events:
        assert type(event.time) is float and wire.MIN_TIME <= event.time < wire.MAX_TIME
        if event.type == wire.RUN_FINISHED:
            assert count(event.data.get("num_failures", 0))
        if event.type == wire.ELASTIC_RESTART:
            assert count(event.data.get("restart_count", 0))
    if parsed.triage is not None:
        for time in (parsed.triage.time, parsed.triage.until):
            assert type(time) is float and wire.MIN_TIME <= time < wire.MAX_TIME


@settings(max_examples=600, deadline=None)
@given(st.one_of(integer_messages(), integer_triage()))
def test_every_integer_of_the_contract_is_taken_within_its_documented_range_or_rejected(payload):
    try:
        parsed, rejections = wire.parse_message(payload)  # anything but InvalidMessage fails the test
    except wire.InvalidMessage as e:
        assert str(e)
        return
    assert_within_the_contract(parsed)
    assert all(r.reason for r in rejections)
