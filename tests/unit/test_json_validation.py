"""The json policy reads values with simdjson and keeps orjson as the judge: for every input its
verdict and its message are orjson's (a differential test over random documents, random bytes
and mutations of valid documents), and a valid value is never handed to orjson."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvproxy.policies.api import PolicyContext
from kvproxy.policies.builtin import content
from kvproxy.policies.plugins import find_factory
from kvproxy.protocol.records import build_batch
from tests.harness.produced import NOW, produced

BOM = b"\xef\xbb\xbf"
DEPTH_LIMIT = 1024
"""orjson's and simdjson's nesting limit: the differences sit around it."""

_POLICY = find_factory("json")(PolicyContext())
_POLICY.configure({})


def orjson_message(value: bytes) -> str | None:
    """What the policy must say of `value`: orjson's refusal in the policy's words, or None."""
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        reason = f"{exc.msg}: line {exc.lineno} column {exc.colno}"
        return f"Record value is not valid JSON ({reason}) in topic partition t-0"
    return None


def policy_messages(values: list[bytes]) -> list[str | None]:
    """The policy's message for each value of one batch, None for the accepted."""
    rows = [(b"k", value, None, NOW) for value in values]
    verdict = _POLICY.validate("t", 0, produced(build_batch(rows)))
    messages: list[str | None] = [None] * len(values)
    for error in verdict.record_errors:
        messages[error.index] = error.message
    return messages


def assert_judged_as_orjson(values: list[bytes]) -> None:
    assert policy_messages(values) == [orjson_message(value) for value in values]


# -- the inputs ---------------------------------------------------------------------------------

BIG_INTEGERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, -(2**64)]),
)
NUMBER_TEXT = st.from_regex(r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,5})?\Z")
FLOAT_EDGES = st.sampled_from(
    [
        b"1.7976931348623157e308",
        b"1.7976931348623158e308",
        b"1.7976931348623159e308",
        b"1.797693134862315807937289714053e308",
        b"4.9e-324",
        b"2.4703282292062327e-324",
        b"1e-400",
        b"1e400",
        b"-0",
        b"-0.0e-0",
        b"1" * 400,
        b"0." + b"0" * 400 + b"1e400",
    ]
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    BIG_INTEGERS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
JSON_DOCUMENTS = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)
WHITESPACE = st.text(alphabet=" \t\r\n\x0b\x0c\x00\xa0", max_size=3).map(
    lambda text: text.encode("utf-8")
)


@st.composite
def serialized(draw: st.DrawFn) -> bytes:
    """A document as Python's json module writes it: escaped or raw non-ASCII (lone surrogates
    as raw UTF-8 bytes, which no valid document holds), compact or spaced."""
    document = draw(JSON_DOCUMENTS)
    ascii_only = draw(st.booleans())
    indent = draw(st.sampled_from([None, 0, 2]))
    text = json.dumps(document, ensure_ascii=ascii_only, indent=indent)
    return text.encode("utf-8", "surrogatepass")


ESCAPES = st.one_of(
    st.integers(min_value=0, max_value=0xFFFF).map(lambda code: f"\\u{code:04x}".encode()),
    st.sampled_from([0xD800, 0xDBFF, 0xDC00, 0xDFFF]).map(lambda code: f"\\u{code:04X}".encode()),
    st.sampled_from([b'\\"', b"\\\\", b"\\/", b"\\b", b"\\f", b"\\n", b"\\r", b"\\t", b"\\x"]),
    st.sampled_from([b"\\", b"\\u12", b"\\U0041", b"\\'"]),
    st.integers(min_value=0, max_value=0x20).map(lambda code: bytes([code])),
    st.sampled_from([b"\x7f", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xc3"]),
    st.text(max_size=3).map(lambda text: text.encode("utf-8", "surrogatepass")),
)


@st.composite
def escaped_strings(draw: st.DrawFn) -> bytes:
    """A JSON string of escapes (surrogates alone and in pairs), raw control characters and
    UTF-8 good and bad."""
    return b'"' + b"".join(draw(st.lists(ESCAPES, max_size=6))) + b'"'


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    """Arrays and objects nested about as deep as the parsers allow."""
    depth = draw(st.integers(min_value=DEPTH_LIMIT - 3, max_value=DEPTH_LIMIT + 2))
    kinds = draw(st.lists(st.booleans(), min_size=depth, max_size=depth))
    inner = draw(st.sampled_from([b"", b"1", b"[]", b"{}", b'"s"']))
    opening = b"".join(b"[" if is_array else b'{"k":' for is_array in kinds)
    closing = b"".join(b"]" if is_array else b"}" for is_array in reversed(kinds))
    if inner == b"" and kinds and not kinds[-1]:
        inner = b"null"  # an object member needs a value; an empty one is its own mutation
    return opening + inner + closing


VALID = st.one_of(
    serialized(),
    JSON_SCALARS.map(lambda value: json.dumps(value).encode()),
    BIG_INTEGERS.map(lambda number: str(number).encode()),
    NUMBER_TEXT.map(str.encode),
    FLOAT_EDGES,
    escaped_strings(),
    nested(),
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A document with a byte order mark, whitespace or garbage around it, bytes replaced,
    inserted or dropped, or cut short."""
    value = draw(VALID)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(value)))
        piece = draw(st.one_of(st.binary(max_size=3), WHITESPACE, st.just(BOM), ESCAPES))
        how = draw(st.sampled_from(["prefix", "suffix", "insert", "replace", "drop", "cut"]))
        if how == "prefix":
            value = piece + value
        elif how == "suffix":
            value += piece
        elif how == "insert":
            value = value[:at] + piece + value[at:]
        elif how == "replace":
            value = value[:at] + piece + value[at + len(piece) :]
        elif how == "drop":
            value = value[:at] + value[at + 1 :]
        else:
            value = value[:at]
    return value


ANY_VALUE = st.one_of(VALID, mutated(), st.binary(max_size=40), WHITESPACE)

# -- the tests ----------------------------------------------------------------------------------

KNOWN_DIFFERENCES = [
    BOM + b"{}",  # simdjson skips a byte order mark, orjson refuses it
    BOM + b" [1]",
    BOM + b"1",
    b"18446744073709551616",  # beyond 64 bits: simdjson refuses, orjson accepts
    b"-9223372036854775809",
    b'{"k":' * DEPTH_LIMIT + b"1" + b"}" * DEPTH_LIMIT,  # simdjson refuses, orjson accepts
    b"[" * DEPTH_LIMIT + b"]" * DEPTH_LIMIT,
    b"[" * (DEPTH_LIMIT + 1) + b"]" * (DEPTH_LIMIT + 1),
    b"",
    b" ",
    b'"\\ud800"',
    b'"\xed\xa0\x80"',
    b"[1]\x00",
    b"[1]\xc2\xa0",
    b"1e400",
]


@pytest.mark.parametrize("value", KNOWN_DIFFERENCES, ids=lambda value: repr(value[:12]))
def test_known_differences_are_judged_by_orjson(value: bytes) -> None:
    assert_judged_as_orjson([value, b"{}"])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ANY_VALUE, min_size=1, max_size=4))
def test_every_verdict_is_orjsons(values: list[bytes]) -> None:
    assert_judged_as_orjson(values)


def test_valid_values_are_not_parsed_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson builds each document's Python objects only to drop them: the valid path does not
    call it."""
    calls: list[Any] = []

    def counting_loads(value: Any) -> Any:
        calls.append(value)
        return orjson_loads(value)

    orjson_loads = orjson.loads
    monkeypatch.setattr(content.orjson, "loads", counting_loads)
    values = [b'{"a": [1, 2.5, "x", null, true]}', b"[]", b'"s"', b"12", b"null"]
    assert policy_messages(values) == [None] * len(values)
    assert calls == []
    # a refusal is still orjson's
    assert policy_messages([b"{nope"])[0] is not None
    assert calls


def test_each_thread_parses_with_its_own_parser() -> None:
    """A simdjson parser is not thread-safe; the proxy decides on the loop and a decoding
    thread."""
    seen: list[Any] = []
    worker = threading.Thread(target=lambda: seen.append(content._thread_parse().__self__))
    worker.start()
    worker.join()
    here = content._thread_parse().__self__
    assert seen and seen[0] is not here
    assert content._thread_parse().__self__ is here
