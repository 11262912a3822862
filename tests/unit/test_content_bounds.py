"""What one value may cost a content check: a small compressed batch can hold a value of tens of
MiB, and a parser builds several times what it reads. Over `max_value_bytes` a value is refused
unread; one simdjson declines reaches orjson only up to `max_fallback_bytes`; a large value is
read by a parser of its own, not by the thread's reused one (which would keep its buffer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from kvproxy.policies.api import ACCEPT, PolicyContext, Verdict
from kvproxy.policies.builtin import content
from kvproxy.policies.plugins import find_factory
from kvproxy.protocol import error_codes
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from tests.harness.produced import produced

MiB = 1 << 20


def policy(name: str, **options: Any) -> Any:
    made = find_factory(name)(PolicyContext())
    made.configure(options)
    return made


def verdict_of(check: Any, values: list[bytes], *, codec: Codec = Codec.NONE) -> Verdict:
    raw = build_batch([(None, value, None, None) for value in values], codec=codec)
    return check.validate("t", 0, produced(raw, topic="t"))  # type: ignore[no-any-return]


def messages(verdict: Verdict) -> list[tuple[int, str]]:
    assert verdict.code == error_codes.INVALID_RECORD, verdict
    return [(error.index, error.message) for error in verdict.record_errors]


def big_document(size: int, tail: bytes = b"1") -> bytes:
    """A JSON array of about `size` bytes of small objects, `tail` its last element."""
    item = b'{"k":"vvvvvvvv","n":12345},'
    return b"[" + item * (size // len(item)) + tail + b"]"


@pytest.fixture
def no_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(value: Any) -> Any:
        raise AssertionError(f"orjson was given {len(value)} bytes")

    monkeypatch.setattr(orjson, "loads", refused)


def test_a_json_value_over_max_value_bytes_is_refused_unread(no_orjson: None) -> None:
    check = policy("json", max_value_bytes=1 * MiB)
    value = big_document(2 * MiB)
    verdict = verdict_of(check, [b'{"ok": 1}', value], codec=Codec.ZSTD)
    assert messages(verdict) == [
        (
            1,
            f"Record value of {len(value)} bytes exceeds the 1048576-byte limit of the json "
            "check (max_value_bytes) in topic partition t-0",
        )
    ]


def test_a_large_value_simdjson_declines_does_not_reach_orjson(no_orjson: None) -> None:
    check = policy("json")  # defaults: 8 MiB a value, 1 MiB for orjson
    value = big_document(3 * MiB, tail=b"1" + b"0" * 20)  # an integer beyond 64 bits
    verdict = verdict_of(check, [value], codec=Codec.ZSTD)
    assert messages(verdict) == [
        (
            0,
            f"Record value of {len(value)} bytes is not JSON the fast reader takes (invalid, or "
            "an integer beyond 64 bits, or nesting beyond 1024 levels) and exceeds the "
            "1048576-byte limit of the full reader (max_fallback_bytes) in topic partition t-0",
        )
    ]


def test_a_small_value_simdjson_declines_is_still_judged_by_orjson() -> None:
    check = policy("json")
    beyond_64_bits = b'{"n": 1' + b"0" * 25 + b"}"
    assert verdict_of(check, [beyond_64_bits]) == ACCEPT
    assert messages(verdict_of(check, [b'{"n": 1' + b"0" * 25])) == [
        (
            0,
            "Record value is not valid JSON (unexpected end of data: line 1 column 33) in topic "
            "partition t-0",
        )
    ]


def test_a_large_valid_value_is_accepted_by_a_parser_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reused: list[int] = []
    thread_parse = content._thread_parse

    def spied() -> Any:
        parse = thread_parse()

        def counted(value: bytes) -> object:
            reused.append(len(value))
            return parse(value)

        return counted

    monkeypatch.setattr(content, "_thread_parse", spied)
    check = policy("json")
    small, large = b'{"a": [1, 2]}', big_document(4 * MiB)
    assert verdict_of(check, [small, large], codec=Codec.ZSTD) == ACCEPT
    assert reused == [len(small)]  # the 4 MiB value did not grow the thread's parser


@pytest.mark.parametrize("name", ["json_schema", "avro"])
def test_schema_file_checks_refuse_a_value_over_max_value_bytes(
    name: str, tmp_path: Path, no_orjson: None
) -> None:
    schema: Any = {"type": "array"} if name == "json_schema" else {"type": "string"}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    check = policy(name, value=str(path), max_value_bytes=MiB)
    value = big_document(MiB + 1_000)
    assert messages(verdict_of(check, [value], codec=Codec.ZSTD)) == [
        (
            0,
            f"Record value of {len(value)} bytes exceeds the 1048576-byte limit of the {name} "
            "check (max_value_bytes) in topic partition t-0",
        )
    ]
