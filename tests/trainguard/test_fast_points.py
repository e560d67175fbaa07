"""The compiled path of ``wire.parse_message`` (``trainguard._fast_points``) gives exactly what the general path
gives, for every payload: the same points (same types, same -0.0), the same rejections, the same error."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import T0
from trainguard import wire

pytest.importorskip("msgspec")


def general_path(payload: bytes):
    """What parse_message gives without the compiled path."""
    return wire.parse_message_object(wire.decode_json(payload), None)


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
@pytest.mark.long
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


ONE_POINT = b'"points":[{"tag":"a","value":1.5,"time":1763596805}]'


@pytest.mark.parametrize("extra", [
    b'"x\xff":1', b'"x":"\xff"', b'"x":["\xc3"]', b'"x":{"a":"\xed\xa0\x80"}', b'"\xc0\x80":1',  # not UTF-8
    b'"x":NaN', b'"x":"\\ud800"', b'"x":1e400', b'"x":' + b"9" * 400, b'"x":{"a":1,"a":[}',  # JSON only some read
    b'"events":[{"type":"run_started","time":1763596805}],"events":[]',  # the last of a key counts, in each reader
    b'"events":[],"events":[{"type":"run_started","time":1763596805}]',
    b'"id":123456789012345678901234567890', b'"rank":18446744073709551616', b'"rank":9223372036854775808',
    b'"rank":1048576', b'"rank":0,"world_size":0', b'"run":"\xe2\x82"', b'"\\u0072un":"s"',
])
def test_what_the_compiled_path_would_skip_or_read_otherwise_is_read_by_the_general_path(extra):
    """An unknown key is skipped unread by msgspec (its UTF-8 unchecked), a big integer read as an int where orjson
    reads a float: the compiled path leaves such a message to the general path, whose verdict it is."""
    for payload in (b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r",' + extra + b"," + ONE_POINT + b"}",
                    b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r",' + ONE_POINT + b"," + extra + b"}"):
        check(payload)


def test_a_line_whose_unknown_key_is_not_utf8_is_rejected_whole_not_read_without_it():
    payload = (b'{"schema":"trainguard/v1","id":"m","test":"t","run":"r","ev\xe9nts":[{"type":"run_finished",'
               b'"time":1763596900,"data":{"status":"failure"}}],' + ONE_POINT + b"}")
    with pytest.raises(wire.InvalidMessage, match="not UTF-8"):
        wire.parse_message(payload)


def test_the_common_shape_takes_the_compiled_path():
    payload = wire.encode_message("t", "r", [wire.point_dict("loss", 0.5, 1763596805.0, 3)] * 3)
    assert wire.fast_decode(payload) is not None
    points = [wire.point_dict(tag, value, 1763596805.0 + i, i) for i in range(5)
              for tag, value in (("loss", 0.5 + i), ("lr", 0.1), ("acc", 3.0))]
    columns = wire.encode_message("t", "r", points, schema=wire.SCHEMA_V1_1)
    decoded = wire.fast_decode(columns)
    assert decoded is not None and all(isinstance(part, wire.PointColumn) for part in decoded[1].parts)
    assert b'"f32":true' in columns  # 0.5 and 3.0 are float32: that column is rounded to float32 on the way
    check(columns)
    body = json.loads(wire.encode_message("tëst", "r", [wire.point_dict("lôss/ü", 0.5, 1763596805.0, 3)] * 3,
                                          rank=3, world_size=wire.MAX_WORLD_SIZE))
    assert wire.fast_decode(json.dumps(body, ensure_ascii=False).encode("utf-8")) is not None  # UTF-8 read as such


# -- raw bytes: valid messages mutated where JSON readers differ (UTF-8, keys, numbers, escapes, whitespace) --------

TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|[][{}:,]|true|false|null|\s+|.',
                    re.DOTALL)
NOT_UTF8 = [b"\x80", b"\xbf", b"\xc0", b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3(",
            b"\xc0\x80", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80"]
UTF8 = [b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xe2\x80\xa8", b"\xc2\xa0", b"\x7f"]
ESCAPES = [rb"\ud800", rb"\udfff", rb"\udc00\ud800", rb"\ud83d\ude00", rb"\u0000", rb"\u00e9", rb"\u0041", rb"\/",
           rb"\n", rb"\q", rb"\u12"]
HUGE = [str(n).encode() for n in (2 ** 31 - 1, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
                                  -2 ** 63, -2 ** 63 - 1, -1, 0, 10 ** 30, -10 ** 30, 10 ** 308, 10 ** 309, 10 ** 400)]
HUGE += [b"1e400", b"-1e400", b"1E-400", b"NaN", b"Infinity", b"-Infinity", b"-0", b"-0.0", b"1.5e300", b"007",
         b"1" * 4301]
WHITESPACE = [b" ", b"\t", b"\n", b"\r", b"\r\n", b"\x0c", b"\x0b", b"\x00", b"\xc2\xa0", b"\xe2\x80\xa8"]
KEYS = [b'"schema"', b'"id"', b'"test"', b'"run"', b'"rank"', b'"world_size"', b'"points"', b'"events"',
        b'"columns"', b'"triage"', b'"tag"', b'"value"', b'"time"', b'"step"', b'"x"', b'"Tag"', b'"po\\u0069nts"',
        b'"\\u0072un"', b'"x\xff"', b'"\xc3"', b'"\\ud800"', b'"\xed\xa0\x80"', b'""']
VALUES = [b"1", b"0", b"3", b"-1", b"1.5", b'"s"', b'"r"', b'"trainguard/v1"', b"null", b"true", b"[]", b"{}",
          b'"\xff"', b'["\xc3"]', b'{"a":"\xed\xa0\x80"}', b"NaN", b'"\\ud800"', b'{"a":1,"a":NaN}',
          b'[{"tag":"a","value":1.5,"time":1763596805}]', b'[{"tag":"a","value":1.5,"time":1763596805,"x\xff":1}]',
          b'[{"type":"run_started","time":1763596805}]', *HUGE[:8]]


@st.composite
def valid_messages(draw) -> bytes:
    """A valid message, mostly of the compiled path's shape (points only), spelled compactly or not."""
    points = [wire.point_dict(draw(st.sampled_from(["loss", "acc", "é/ü", "\u2028", "a" * 256])),
                              draw(st.sampled_from([0.5, -2, 0, -0.0, 1e300, 2 ** 63, 3.4028234663852886e38])),
                              draw(st.sampled_from([T0, T0 + 0.125, 1763596806])),
                              draw(st.sampled_from([None, 0, 7, wire.MAX_STEP])))
              for _ in range(draw(st.integers(0, 4)))]
    events = draw(st.sampled_from([[], [wire.event_dict(wire.RUN_STARTED, T0)],
                                   [wire.event_dict(wire.RUN_FINISHED, T0, {"status": "success", "num_failures": 1})]]))
    if not points and not events:
        events = [wire.event_dict(wire.RUN_STARTED, T0)]
    rank = draw(st.sampled_from([None, (0, None), (1, 2)]))
    body = json.loads(wire.encode_message("t", draw(st.sampled_from(["r", "ré"])), points, events, "m1",
                                          *(rank or (None, None)), schema=draw(st.sampled_from(wire.SCHEMAS))))
    if draw(st.booleans()):
        body["events"] = []
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    return json.dumps(body, separators=separators, ensure_ascii=draw(st.booleans())).encode("utf-8")


@st.composite
def mutated_messages(draw) -> bytes:
    """A valid message with one to three edits: bytes that are not UTF-8 inside keys, values or between tokens,
    unknown and duplicated keys (before the real one or after it), huge and non-finite numbers, escapes,
    whitespace JSON does or does not allow, a cut."""
    tokens = TOKENS.findall(draw(valid_messages()))
    for _ in range(draw(st.integers(1, 3))):
        strings = [i for i, t in enumerate(tokens) if t.startswith(b'"') and len(t) >= 2]
        numbers = [i for i, t in enumerate(tokens) if t[:1] in b"-0123456789" and t]
        opens = [i for i, t in enumerate(tokens) if t == b"{"]
        closes = [i for i, t in enumerate(tokens) if t == b"}"]
        action = draw(st.sampled_from(["bytes in a string", "bytes between tokens", "number", "key first",
                                       "key last", "escape", "whitespace", "cut"]))
        if action in ("bytes in a string", "escape") and strings:
            i = draw(st.sampled_from(strings))
            at = draw(st.integers(1, len(tokens[i]) - 1))
            inserted = draw(st.sampled_from(NOT_UTF8 + UTF8 if action == "bytes in a string" else ESCAPES))
            cut = draw(st.integers(0, 1)) if action == "bytes in a string" and at < len(tokens[i]) - 1 else 0
            tokens[i] = tokens[i][:at] + inserted + tokens[i][at + cut:]
        elif action == "bytes between tokens":
            tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from(NOT_UTF8 + UTF8)))
        elif action == "number" and numbers:
            tokens[draw(st.sampled_from(numbers))] = draw(st.sampled_from(HUGE))
        elif action == "key first" and opens:
            i = draw(st.sampled_from(opens))
            tokens.insert(i + 1, draw(st.sampled_from(KEYS)) + b":" + draw(st.sampled_from(VALUES)) + b",")
        elif action == "key last" and closes:
            i = draw(st.sampled_from(closes))
            tokens.insert(i, b"," + draw(st.sampled_from(KEYS)) + b":" + draw(st.sampled_from(VALUES)))
        elif action == "whitespace":
            tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from(WHITESPACE)))
        elif action == "cut":
            tokens = tokens[:draw(st.integers(0, len(tokens)))]
    return b"".join(tokens)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_messages())
def test_both_paths_give_the_same_outcome_on_mutated_bytes(payload):
    check(payload)


# -- v1.1 columns: each field's entries valid or not, lists of other lengths, unknown and doubled keys -------------

COLUMN_ENTRIES = {
    "values": ["0.5", "-0.0", "3", "-0", "1e308", "3.5e38", "3.4028235e38", "1e-46", "true", "null", '"1"', "1e400",
               "NaN", "123456789012345678901234567890", "9007199254740993", "18446744073709551615", "9223372036854775809",
               "-9223372036854775809", "1.0000000000000002", "4.9e-324"],
    "ms": ["1763596805000", "0", "1", "-1", "5.0", "null", "true", "9223372036854775807", "9223372036854775808",
           "-9223372036854775807", "-9223372036854775808", "7258118400000", "946684799999", "1e3", "-0",
           "18446744073709551616"],
    "steps": ["0", "1", "7", "-1", "-8", "null", "true", "1.0", "9223372036854775807", "9223372036854775808",
              "-9223372036854775807"],
}


@st.composite
def columns(draw) -> str:
    """A column object: mostly well formed, sometimes an entry, a list's length, a field or the tag changed."""
    n = draw(st.integers(1, 4))
    fields = [("tag", draw(st.sampled_from(['"loss"', '"acc"', '"loss"', '""', '"a\\u0000b"', '"\\ud800"', "7"]))),
              ("values", [draw(st.sampled_from(["0.5", "-2", "1763.25", "-0.0"])) for _ in range(n)]),
              ("ms", ["1763596805000"] + [draw(st.sampled_from(["0", "1", "125"])) for _ in range(n - 1)])]
    if draw(st.booleans()):
        fields.append(("steps", [draw(st.sampled_from(["0", "3"]))] + ["1"] * (n - 1)))
    if draw(st.booleans()):
        fields.append(("f32", draw(st.sampled_from(["true", "false", "true", "1", "null"]))))
    for _ in range(draw(st.integers(0, 2))):
        if not fields:
            break
        i = draw(st.integers(0, len(fields) - 1))
        name, value = fields[i]
        action = draw(st.sampled_from(["entry", "entry", "shorter", "longer", "drop", "double", "add"]))
        if action == "entry" and isinstance(value, list) and value:
            value = list(value)
            value[draw(st.integers(0, len(value) - 1))] = draw(st.sampled_from(COLUMN_ENTRIES[name]))
            fields[i] = (name, value)
        elif action == "shorter" and isinstance(value, list):
            fields[i] = (name, value[:-1])
        elif action == "longer" and isinstance(value, list):
            fields[i] = (name, value + value[-1:])
        elif action == "drop":
            fields.pop(i)
        elif action == "double":
            fields.append((name, value))
        else:
            fields.insert(i, (draw(st.sampled_from(["x", "Values", "f32", "steps"])), draw(ANY_VALUE)))
    return text_of([(name, "[" + ",".join(value) + "]" if isinstance(value, list) else value)
                    for name, value in fields])


@st.composite
def column_messages(draw) -> bytes:
    fields = [("schema", draw(st.sampled_from(['"trainguard/v1.1"'] * 5 + ['"trainguard/v1"']))), ("id", '"m1"'),
              ("test", '"t"'), ("run", '"r"'), ("columns", "[" + ",".join(draw(st.lists(columns(), max_size=4))) + "]")]
    extra = draw(st.sampled_from([None, None, None, ("points", "[]"), ("points", '[{"tag":"a","value":1,'
                                                                                 '"time":1763596805}]'),
                                  ("events", "[]"), ("columns", "null"), ("rank", "1")]))
    if extra:
        fields.insert(draw(st.integers(0, len(fields))), extra)
    return text_of(fields).encode("utf-8")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(column_messages())
def test_both_paths_give_the_same_outcome_on_columns(payload):
    check(payload)


@pytest.mark.parametrize("payload", [
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[3.5e38],'
    b'"f32":true,"ms":[1763596805000]}]}',  # past the float32 range: a bad point
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[1,2],'
    b'"ms":[1763596805000,-1],"steps":[5,-6]}]}',  # a step below 0 after a negative delta
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[1,2],'
    b'"ms":[7258118399999,1]}]}',  # the second time at 2200-01-01: not plausible
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[-0,-0.0],'
    b'"ms":[1763596805000,0],"steps":null}]}',  # -0 is the integer 0 (+0.0), -0.0 keeps its sign
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[1e308,1e308],'
    b'"ms":[1763596805000,0]}]}',  # finite values whose sum overflows: each one is checked
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[]}',
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[{"tag":"a","values":[1],"ms":[1763596805000]}'
    b',{"tag":"a","values":[2],"ms":[1763596806000]}]}',  # one tag in two columns
    b'{"schema":"trainguard/v1.1","id":"m","test":"t","run":"r","columns":[' + b",".join(
        [b'{"tag":"a","values":[' + b",".join([b"1"] * 5001) + b'],"ms":[1763596805000' + b",0" * 5000 + b"]}"] * 2)
    + b"]}",  # 10,002 points: over the limit
])
def test_column_edge_cases(payload):
    check(payload)
