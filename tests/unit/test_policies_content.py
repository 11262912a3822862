"""policies: content checks, request checks (compression, acks) and producer state."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from kvproxy.policies import (
    PolicyConfigError,
    ProducedRecords,
    ProducerStateTracker,
    Verdict,
    parse_records,
)
from kvproxy.policies.api import PolicyContext
from kvproxy.policies.plugins import find_factory
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch

NOW = 1_700_000_000_000
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REJECTED = "One or more records have been rejected due to"


def produced(raw: bytes, **kw: Any) -> ProducedRecords:
    result = parse_records(
        "t",
        0,
        raw,
        produce_version=kw.pop("version", 9),
        acks=kw.pop("acks", -1),
        transactional_id=None,
        compacted=None,
        now_ms=NOW,
    )
    assert isinstance(result, ProducedRecords), result
    return result


def make(name: str, options: dict | None = None, **context: Any) -> Any:
    policy = find_factory(name)(PolicyContext(base_dir=EXAMPLES, **context))
    policy.configure(options or {})
    return policy


def check(name: str, rows: list[Any], options: dict | None = None, **kw: Any) -> Verdict:
    codec = kw.pop("codec", Codec.NONE)
    return make(name, options).validate("t", 0, produced(build_batch(rows, codec=codec), **kw))


def values(*vals: bytes | None, key: bytes | None = b"k") -> list[Any]:
    return [(key, v, None, NOW) for v in vals]


def indexes(verdict: Verdict) -> list[int]:
    return [e.index for e in verdict.record_errors]


# -- max_record_bytes -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_max_record_bytes(codec: Codec) -> None:
    big = b"x" * 100
    assert check("max_record_bytes", values(b"a", b"b"), {"limit": 10}, codec=codec).ok
    rows = values(b"a", big, b"b", big, b"c")
    verdict = check("max_record_bytes", rows, {"limit": 50}, codec=codec)
    assert verdict.code == 10 and indexes(verdict) == [1, 3] and verdict.rejection is None
    assert verdict.record_errors[0].message == (
        "Record of 101 bytes (key, value and headers) exceeds the limit of 50 bytes "
        "in topic partition t-0"
    )
    assert verdict.message is not None and verdict.message.startswith(f"{REJECTED} 2 record errors")


def test_max_record_bytes_counts_headers_and_batch_limit() -> None:
    rows = [(b"k", b"v", [("trace", b"x" * 20)], NOW)]
    assert check("max_record_bytes", rows, {"limit": 27}).ok
    assert check("max_record_bytes", rows, {"limit": 26}).code == 10
    raw = build_batch(values(b"a" * 50))
    verdict = make("max_record_bytes", {"batch_limit": 60}).validate("t", 0, produced(raw))
    assert verdict.code == 10
    assert verdict.message == (
        f"The record batch size in the append to t-0 is {len(raw)} bytes which exceeds the "
        "maximum configured value of 60."
    )


# -- required_headers -------------------------------------------------------------------------


def test_required_headers() -> None:
    good = [("trace-id", b"1"), ("tenant", b"a")]
    rows = [
        (b"k", b"v", good, NOW),
        (b"k", b"v", [("tenant", b"a")], NOW),
        (b"k", b"v", good, NOW),
        (b"k", b"v", None, NOW),
        (b"k", b"v", good, NOW),
    ]
    options = {"names": ["trace-id", "tenant"]}
    assert check("required_headers", [rows[0]], options).ok
    verdict = check("required_headers", rows, options)
    assert (
        verdict.code == 87 and verdict.rejection == "invalid_record" and indexes(verdict) == [1, 3]
    )
    assert [e.message for e in verdict.record_errors] == [
        "Record lacks the required header(s) trace-id in topic partition t-0",
        "Record lacks the required header(s) trace-id, tenant in topic partition t-0",
    ]


# -- key_pattern ------------------------------------------------------------------------------


def test_key_pattern() -> None:
    options = {"regex": "order-[0-9]+"}
    rows = [
        (b"order-1", b"v", None, NOW),
        (b"order-x", b"v", None, NOW),
        (b"order-22", b"v", None, NOW),
        (None, b"v", None, NOW),
        (b"\xff\xfe", b"v", None, NOW),
    ]
    assert check("key_pattern", [rows[0], rows[2]], options).ok
    verdict = check("key_pattern", rows, options)
    assert verdict.code == 87 and indexes(verdict) == [1, 3, 4]
    assert verdict.record_errors[0].message == (
        "Record key 'order-x' does not match order-[0-9]+ in topic partition t-0"
    )
    assert verdict.record_errors[1].message == (
        "Record has no key; keys must match order-[0-9]+ in topic partition t-0"
    )
    assert "is not valid UTF-8" in verdict.record_errors[2].message
    allow = check("key_pattern", rows[:4], {**options, "allow_null": True})
    assert indexes(allow) == [1]
    assert check("key_pattern", [(b"order-12x", b"v", None, NOW)], options).code == 87  # fullmatch
    with pytest.raises(PolicyConfigError, match="bad regex"):
        make("key_pattern", {"regex": "("})


# -- json -------------------------------------------------------------------------------------


def test_json() -> None:
    rows = values(b'{"a": 1}', b"{nope", b"[1, 2]", b"", None)
    verdict = check("json", rows)
    assert verdict.code == 87 and indexes(verdict) == [1, 3]
    assert verdict.record_errors[0].message == (
        "Record value is not valid JSON (unexpected character, expected a string key: "
        "line 1 column 2) in topic partition t-0"
    )
    assert indexes(check("json", rows, {"allow_null": False})) == [1, 3, 4]
    assert check("json", values(b'"s"', b"1", b"null", None)).ok
    # RFC 8259 JSON: Python's json module accepts NaN and lone surrogates, the policy does not
    assert indexes(check("json", values(b"NaN", b'"\xed\xa0\x80"', b"[1.5e3]"))) == [0, 1]


# -- json_schema ------------------------------------------------------------------------------


ORDER = {"id": "o1", "customer": "c", "amount": 12.5, "currency": "EUR"}


def test_json_schema() -> None:
    options = {"value": "schemas/order.json"}
    good = json.dumps(ORDER).encode()
    negative = json.dumps({**ORDER, "amount": -1}).encode()
    bad_item = json.dumps({**ORDER, "items": [{"sku": "a", "quantity": 0}]}).encode()
    rows = values(good, negative, good, bad_item, b"{")
    assert check("json_schema", values(good, good), options).ok
    verdict = check("json_schema", rows, options)
    assert verdict.code == 87 and indexes(verdict) == [1, 3, 4]
    assert verdict.record_errors[0].message == (
        "Record value does not match order.json: data.amount must be bigger than or equal to 0 "
        "in topic partition t-0"
    )
    assert "data.items[0].quantity" in verdict.record_errors[1].message
    assert "is not valid JSON" in verdict.record_errors[2].message
    assert indexes(check("json_schema", values(None), options)) == [0]
    assert check("json_schema", values(None), {**options, "allow_null": True}).ok


def test_json_schema_bad_schema(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"type": "no-such-type"}')
    policy = find_factory("json_schema")(PolicyContext(base_dir=tmp_path))
    with pytest.raises(PolicyConfigError, match="does not compile"):
        policy.configure({"value": "bad.json"})


# -- avro -------------------------------------------------------------------------------------


def avro_bytes(datum: dict) -> bytes:
    schema = fastavro.parse_schema(json.loads((EXAMPLES / "schemas/order.avsc").read_text()))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, datum)
    return out.getvalue()


def test_avro() -> None:
    options = {"value": "schemas/order.avsc"}
    good = avro_bytes({**ORDER, "items": [{"sku": "a", "quantity": 2}]})
    rows = values(good, good + b"\x00", good, good[:5], None)
    assert check("avro", values(good, good), options).ok
    verdict = check("avro", rows, options)
    assert verdict.code == 87 and indexes(verdict) == [1, 3, 4]
    assert verdict.record_errors[0].message == (
        "Record value has 1 bytes after the Avro datum of order.avsc in topic partition t-0"
    )
    assert verdict.record_errors[1].message.startswith(
        "Record value is not a valid Avro datum of order.avsc ("
    )
    assert check("avro", values(None), {**options, "allow_null": True}).ok


def test_avro_schema_required() -> None:
    with pytest.raises(PolicyConfigError, match="option value"):
        make("avro", {})


# -- compression, acks ------------------------------------------------------------------------


def test_compression() -> None:
    options = {"allowed": ["none", "lz4"]}
    assert check("compression", values(b"v"), options).ok
    assert check("compression", values(b"v"), options, codec=Codec.LZ4).ok
    verdict = check("compression", values(b"v"), options, codec=Codec.GZIP)
    assert verdict.code == 76
    assert verdict.message == (
        "Compression type gzip is not allowed in topic partition t-0 (allowed: none, lz4)"
    )
    with pytest.raises(PolicyConfigError, match="unknown codec 'brotli'"):
        make("compression", {"allowed": ["brotli"]})


def test_acks() -> None:
    assert check("acks", values(b"v"), {"allowed": [-1]}, acks=-1).ok
    verdict = check("acks", values(b"v"), {"allowed": [-1]}, acks=1)
    assert verdict.code == 21
    assert verdict.message == "acks=1 is not allowed for topic t (allowed: -1)"
    with pytest.raises(PolicyConfigError):
        make("acks", {"allowed": [2]})


# -- producer_state ---------------------------------------------------------------------------


def idem(first_seq: int, n: int = 10, epoch: int = 1, pid: int = 5) -> bytes:
    rows = values(*[b"v"] * n)
    return build_batch(rows, producer_id=pid, producer_epoch=epoch, base_sequence=first_seq)


def test_producer_state() -> None:
    tracker = ProducerStateTracker()
    policy = make("producer_state", producer_state=tracker)
    assert policy.tracker is tracker

    def run(raw: bytes) -> Verdict:
        return policy.validate("t", 0, produced(raw))

    assert run(idem(40)).ok  # nothing known: pass
    tracker.record_batch_success("t", 0, produced(idem(0)).batches[0])
    tracker.record_success("t", 0, 5, 1, 10, 19)
    assert run(idem(20)).ok  # next in line
    assert run(idem(0)).ok and run(idem(10)).ok  # retries of acknowledged batches
    gap = run(idem(30))
    assert gap.code == 45
    assert gap.message == (
        "Out of order sequence number for producer 5 at offset 0 in partition t-0: "
        "30 (incoming seq. number), 19 (current end sequence number)"
    )
    fenced = run(idem(20, epoch=0))
    assert fenced.code == 47
    assert fenced.message == (
        "Epoch of producer 5 at offset 0 in t-0 is 0, which is smaller than the last seen epoch 1"
    )
    assert run(idem(0, epoch=2)).ok  # a new epoch starts at 0
    new_epoch = run(idem(7, epoch=2))
    assert new_epoch.code == 45
    assert (
        new_epoch.message is not None
        and "Invalid sequence number for new epoch" in new_epoch.message
    )
    assert run(idem(20, pid=6)).ok  # another producer
    assert policy.validate("t", 1, produced(idem(99))).ok  # another partition


def test_producer_state_wraps_and_is_bounded() -> None:
    tracker = ProducerStateTracker(max_producers=2)
    tracker.record_success("t", 0, 1, 0, 2**31 - 10, 2**31 - 1)
    policy = make("producer_state", {"max_producers": 2}, producer_state=tracker)
    assert policy.validate("t", 0, produced(idem(0, pid=1, epoch=0))).ok  # wraps to 0
    assert policy.validate("t", 0, produced(idem(1, pid=1, epoch=0))).code == 45
    tracker.record_success("t", 0, 2, 0, 0, 0)
    tracker.record_success("t", 0, 3, 0, 0, 0)
    assert len(tracker) == 2 and tracker.get("t", 0, 1) is None  # least recently used went
    tracker.record_success("t", 0, 3, 0, 1, 1)
    tracker.record_success("t", 0, 3, 0, 2, 2)
    entry = tracker.get("t", 0, 3)
    assert entry is not None and entry.batches == ((0, 0), (1, 1), (2, 2))
    for seq in range(3, 10):
        tracker.record_success("t", 0, 3, 0, seq, seq)
    entry = tracker.get("t", 0, 3)
    assert entry is not None and len(entry.batches) == 5 and entry.last_sequence == 9


def test_producer_state_shared_through_routing() -> None:
    from kvproxy.policies import build_routing

    routing = build_routing(
        None,
        [
            {"match": "a", "policies": [{"producer_state": {"max_producers": 10}}]},
            {"match": "b", "policies": ["producer_state"]},
        ],
        Path("."),
    )
    tracker = routing.producer_state
    assert tracker.max_producers == 10  # the explicit bound; 100,000 when none is set
    tracker.record_success("a", 0, 5, 1, 0, 9)
    raw = idem(50)
    verdict = routing.chain_for("a").check(
        parse_records(
            "a",
            0,
            raw,
            produce_version=9,
            acks=-1,
            transactional_id=None,
            compacted=None,
            now_ms=NOW,
        )  # type: ignore[arg-type]
    )
    assert verdict.code == 45 and verdict.policy == "producer_state"
