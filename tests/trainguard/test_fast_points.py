"""The compiled path of ``wire.parse_message`` (``trainguard._fast_points``) gives exactly what the general path
gives, for every payload: the same points (same types, same -0.0), the same rejections, the same error."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard import wire

pytest.importorskip("msgspec")


def general_path(payload: bytes):
    """What parse_message gives without the compiled path."""
    return wire._parse_object(wire.decode_json(payload), None)


def outcome(parse, payload: bytes) -> str:
    """The result or the error, spelled so that 5 and 5.0, 0.0 and -0.0 differ."""
    try:
        return "ok " + repr(parse(payload))
    except wire.InvalidMessage as e:
        return f"invalid {e}"


def check(payload: bytes) -> None:
    assert outcome(wire.parse_message, payload) == outcome(general_path, payload), payload


# JSON texts of values, valid and not, as a hostile or sloppy publisher would write them.
NUMBERS = ["0", "-0", "-0.0", "1", "1.0", "5", "-3", "2.5e3", "1e400", "-1e400", "1E-400", "NaN", "Infinity",
           "-Infinity", "9007199254740993", "123456789012345678901234567890", "1763596805", "1763596805.25",
           "946684800", "946684799.999", "7258118400", "7258118399.5", "9223372036854775807",
           "9223372036854775808", "0.1", "1.7976931348623157e308", "true", "false", "null"]
STRINGS = ['"loss"', '"Accuracy/test"', '""', '"a\\u0000b"', '"\\ud800"', '"tab\\tin"', '"é"', '"\\u00e9"',
           '"' + "x" * 256 + '"', '"' + "x" * 257 + '"', '"5"', '"a\\"b"']
OTHERS = ["[]", "{}", '[1]', '{"a":1}']
ANY_VALUE = st.sampled_from(NUMBERS + STRINGS + OTHERS)
FIELD = st.sampled_from(["tag", "value", "time", "step", "stpe", "Tag"])


def text_of(fields) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields) + "}"


@st.composite
def points(draw) -> str:
    """A point object: mostly well formed, sometimes a field changed, dropped, doubled or added."""
    fields = [("tag", draw(st.sampled_from(['"loss"', '"acc"']))),
              ("value", draw(st.sampled_from(["0.5", "-2", "1763.25", "-0.0"]))),
              ("time", draw(st.sampled_from(["1763596805.0", "1763596806", "1763596807.125"]))),
              ("step", draw(st.sampled_from(["0", "7", "null"])))]
    if draw(st.booleans()):
        fields = fields[:3]  # no step
    for _ in range(draw(st.integers(0, 2))):
        action = draw(st.sampled_from(["change", "drop", "double", "add"]))
        if action == "change" and fields:
            i = draw(st.integers(0, len(fields) - 1))
            fields[i] = (fields[i][0], draw(ANY_VALUE))
        elif action == "drop" and fields:
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        elif action == "double":
            fields.append((draw(FIELD), draw(ANY_VALUE)))
        else:
            fields.insert(draw(st.integers(0, len(fields))), (draw(FIELD), draw(ANY_VALUE)))
    if draw(st.integers(0, 20)) == 0:
        return draw(ANY_VALUE)  # not an object at all
    return text_of(fields)


ENVELOPE_CHANGES = {
    "schema": ['"trainguard/v1"', '"trainguard/v1.1"', '"trainguard/v2"', "null", "1"],
    "id": ['"m1"', '""', "null", "7"], "test": ['"t"', '"' + "t" * 300 + '"', '"a\\nb"'],
    "run": ['"r"', "null", "[]"], "rank": ["0", "3", "-1", "true", "null", "1.0"],
    "world_size": ["4", "0", "null", '"4"'],
    "events": ["[]", "null", "0", "false", "{}", '""',
               '[{"type":"run_finished","time":1763596900.5,"data":{"status":"success","n":1e400}}]'],
    "columns": ["[]", "null", '[{"tag":"x","values":[1.5],"ms":[0]}]'],
    "triage": ['{"action":"mute","time":1763596805,"until":1763596905}', "null"],
    "extra": ["1", '{"deep":[1,2,{"x":NaN}]}'],
}


@st.composite
def messages(draw) -> bytes:
    fields = [("schema", '"trainguard/v1"'), ("id", '"m1"'), ("test", '"t"'), ("run", '"r"')]
    point_texts = draw(st.lists(points(), min_size=0, max_size=6))
    if draw(st.integers(0, 10)) > 0:
        fields.append(("points", "[" + ",".join(point_texts) + "]"))
    else:
        fields.append(("points", draw(st.sampled_from(["null", "{}", '"x"', "[]"]))))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(ENVELOPE_CHANGES)))
        value = draw(st.sampled_from(ENVELOPE_CHANGES[name]))
        if draw(st.booleans()):
            fields = [(k, v) for k, v in fields if k != name]
        fields.insert(draw(st.integers(0, len(fields))), (name, value))
    text = text_of(fields)
    if draw(st.integers(0, 30)) == 0:
        text = text[:draw(st.integers(0, len(text)))]  # cut short
    encoded = text.encode("utf-8")
    if draw(st.integers(0, 30)) == 0:
        encoded = encoded.replace(b"loss", b"lo\xffss")  # not UTF-8
    return encoded


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_both_paths_give_the_same_outcome(payload):
    check(payload)


@pytest.mark.parametrize("payload", [
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","value":1,"time":1763596805}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","value":true,"time":1763596805}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","value":1.0,"time":1763596805,'
    b'"step":true}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","tag":"b","value":1.5,'
    b'"time":1763596805}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","run":"s","points":[{"tag":"a","value":1.5,'
    b'"time":1763596805}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","value":1e308,'
    b'"time":1763596805},{"tag":"a","value":1e308,"time":1763596805}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[{"tag":"a","value":-0.0,'
    b'"time":1763596805,"step":9223372036854775807}]}',
    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","events":0,"points":[{"tag":"a","value":1.5,'
    b'"time":1763596805}]}',
    b' \n{"schema":"trainguard/v1","id":"m","test":"t","run":"r","points":[]}\n',
])
def test_edge_cases(payload):
    check(payload)


def test_the_common_shape_takes_the_compiled_path():
    payload = wire.encode_message("t", "r", [wire.point_dict("loss", 0.5, 1763596805.0, 3)] * 3)
    assert wire._fast_decode(payload) is not None
