"""policies: the broker's checks run together, in Kafka's order, whatever order they are listed in.

Kafka verifies the CRC before LogValidator trusts a batch's fields, walks every record of every
batch (a count that does not match the records is INVALID_RECORD), reports the record errors of
several checks together (INVALID_TIMESTAMP when any is a timestamp error) and answers a retry of
an acknowledged batch as a duplicate. Each test here failed before the checks were grouped.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import crc32c
import pytest

from kvproxy.policies import ProducedRecords, Verdict, build_routing, parse_records
from kvproxy.policies.api import TopicConfig
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.producer_state import ProducerStateTracker
from kvproxy.protocol import error_codes
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from tests.harness.produced import NOW, produced

HOUR = 3_600_000
PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
REMAINING = "Incorrect declared batch size, records still remaining in file"
CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]


def chain(policies: list[Any] | None = None, **topic: Any) -> PolicyChain:
    defaults = {"policies": policies} if policies is not None else None
    routing = build_routing(defaults, [{"match": "t", **topic}] if topic else [], Path("."))
    return routing.chain_for("t")


def recs(n: int, key: bytes | None = b"k", ts: int = NOW) -> list[Any]:
    return [(key, b"v%d" % i, None, ts) for i in range(n)]


def with_count(raw: bytes, count: int, *, extra: bytes = b"", fix_crc: bool = True) -> bytes:
    """The batch with its header claiming `count` records (lastOffsetDelta consistent)."""
    buf = bytearray(raw) + extra
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">i", buf, 23, count - 1)
    struct.pack_into(">i", buf, 57, count)
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def patch(raw: bytes, fmt: str, pos: int, value: int, *, fix_crc: bool) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, pos, value)
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


# ---- the records against the declared count ------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("declared", "message"), [(5, PREMATURE_EOF), (1, REMAINING)])
def test_count_other_than_the_records_is_invalid_record_with_no_decoding_policy(
    codec: Codec, declared: int, message: str
) -> None:
    """A LogAppendTime, non-compacted topic: no policy of the chain reads records, yet a header
    that claims 5 (or 1) records over 3 is refused as Kafka's iterators refuse it."""
    raw = with_count(build_batch(recs(3), codec=codec), declared)
    verdict = chain().check(produced(raw, topic_config=TopicConfig(timestamp_type="LogAppendTime")))
    assert (verdict.code, verdict.message, verdict.policy) == (
        error_codes.INVALID_RECORD,
        message,
        "batch_integrity",
    )


@pytest.mark.parametrize("codec", CODECS)
def test_count_mismatch_is_invalid_record_when_a_decoding_policy_runs_first(codec: Codec) -> None:
    """`json` decodes the records; the count is still answered 87 with Kafka's words, not the
    retriable CORRUPT_MESSAGE."""
    raw = with_count(build_batch(recs(3), codec=codec), 5)
    verdict = chain(["json", "batch_integrity"]).check(produced(raw))
    assert (verdict.code, verdict.message) == (error_codes.INVALID_RECORD, PREMATURE_EOF)
    verdict = chain(["json"]).check(produced(raw))
    assert (verdict.code, verdict.message) == (error_codes.INVALID_RECORD, PREMATURE_EOF)


def test_bytes_after_the_last_record_are_records_remaining() -> None:
    raw = with_count(build_batch(recs(3)), 3, extra=b"\x02\x00\x00")
    verdict = chain().check(produced(raw))
    assert (verdict.code, verdict.message) == (error_codes.INVALID_RECORD, REMAINING)


def test_record_longer_than_the_batch_names_the_sizes() -> None:
    raw = bytearray(build_batch(recs(1)))
    raw[61] = 0x7E  # the only record's length varint: 63 bytes, more than the batch holds
    verdict = chain().check(produced(with_count(bytes(raw), 1)))
    assert verdict.code == error_codes.INVALID_RECORD
    assert verdict.message is not None
    assert verdict.message.startswith("Invalid record size: expected 63 bytes in record payload")


# ---- the CRC before the batch's fields ---------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "pos", "value"),
    [
        (">i", 23, 5),  # lastOffsetDelta: inconsistent with the count
        (">i", 57, 0),  # count 0
        (">i", 53, -2),  # base sequence < 0 with a producer id
        (">h", 21, 0x20),  # control bit
    ],
)
def test_a_stale_crc_is_corrupt_message_before_any_field_check(
    fmt: str, pos: int, value: int
) -> None:
    """LogValidatorTest.testInconsistentCountAndOffset / checkInvalidSequence leave the CRC
    stale: the broker answers CORRUPT_MESSAGE (retriable), not INVALID_RECORD."""
    raw = build_batch(recs(3), producer_id=7, producer_epoch=0, base_sequence=0)
    broken = patch(raw, fmt, pos, value, fix_crc=False)
    for order in (["batch_integrity", "crc"], ["crc", "batch_integrity"]):
        verdict = chain(order).check(produced(broken))
        assert (verdict.code, verdict.policy) == (error_codes.CORRUPT_MESSAGE, "crc"), order
    fixed = patch(raw, fmt, pos, value, fix_crc=True)
    verdict = chain(["batch_integrity", "crc"]).check(produced(fixed))
    assert (verdict.code, verdict.policy) == (error_codes.INVALID_RECORD, "batch_integrity")


def test_base_offset_comes_before_the_crc() -> None:
    """UnifiedLog.analyzeAndValidateRecords checks the base offset before the CRC."""
    raw = patch(build_batch(recs(1)), ">q", 0, 3, fix_crc=False)  # CRC does not cover it
    raw = patch(raw, ">i", 57, 1, fix_crc=False)
    raw = bytearray(raw)
    raw[-1] ^= 0xFF
    verdict = chain().check(produced(bytes(raw)))
    assert verdict.code == error_codes.INVALID_RECORD
    assert verdict.message == (
        "The baseOffset of the record batch in the append to t-0 should be 0, but it is 3"
    )


def test_broker_checks_run_before_other_policies_whatever_the_order() -> None:
    raw = bytearray(build_batch([(b"k", b"not json", None, NOW)]))
    raw[-1] ^= 0xFF
    verdict = chain(["json", "crc"]).check(produced(bytes(raw)))
    assert (verdict.code, verdict.policy) == (error_codes.CORRUPT_MESSAGE, "crc")


# ---- record errors of several checks together --------------------------------------------


def test_key_and_timestamp_errors_are_reported_together_as_invalid_timestamp() -> None:
    """Null keys (records 0, 2) and bad timestamps (records 2, 3) on a compacted topic: each
    record keeps its first error (the key before the timestamp), the code is 32."""
    rows = [
        (None, b"a", None, NOW),
        (b"k", b"b", None, NOW),
        (None, b"c", None, NOW - 10 * HOUR),
        (b"k", b"d", None, NOW + 10 * HOUR),
    ]
    routing_chain = chain(["batch_integrity", "crc", "timestamps", "compacted_key"])
    verdict = routing_chain.check(
        produced(
            build_batch(rows),
            compacted=True,
            topic_config=TopicConfig(timestamp_before_max_ms=HOUR),
        )
    )
    assert verdict.code == error_codes.INVALID_TIMESTAMP
    assert verdict.policy == "timestamps"
    assert verdict.message == "One or more records have been rejected due to invalid timestamp"
    assert [e.index for e in verdict.record_errors] == [0, 2, 3]
    # each merged error names its own check (the audit's rows use it)
    assert [e.policy for e in verdict.record_errors] == [
        "compacted_key",
        "compacted_key",
        "timestamps",
    ]
    assert verdict.record_errors[1].message.startswith("Compacted topic cannot accept message")
    assert verdict.record_errors[2].message.startswith(f"Timestamp {NOW + 10 * HOUR} of message")


def test_only_key_errors_keep_the_missing_key_rejection() -> None:
    verdict = chain().check(produced(build_batch(recs(2, key=None)), compacted=True))
    assert (verdict.code, verdict.rejection, verdict.policy) == (87, "missing_key", "compacted_key")
    assert verdict.message is not None
    assert "due to 2 record errors in total" in verdict.message


# ---- the topic's settings ----------------------------------------------------------------


def test_topic_timestamp_settings_apply_unless_the_policy_sets_its_own() -> None:
    old = build_batch(recs(1, ts=NOW - 2 * HOUR))
    config = TopicConfig(timestamp_before_max_ms=HOUR)
    assert chain().check(produced(old)).ok  # Kafka's default: no lower bound
    verdict = chain().check(produced(old, topic_config=config))
    assert verdict.code == error_codes.INVALID_TIMESTAMP
    assert verdict.record_errors[0].message.endswith(f"[{NOW - HOUR}, {NOW + HOUR}]")
    explicit = chain(["batch_integrity", {"timestamps": {"before_max_ms": 3 * HOUR}}])
    assert explicit.check(produced(old, topic_config=config)).ok
    log_append = TopicConfig(timestamp_type="LogAppendTime", timestamp_before_max_ms=HOUR)
    assert chain().check(produced(old, topic_config=log_append)).ok


def test_producer_set_log_append_time_on_a_create_time_topic() -> None:
    raw = build_batch(recs(1), timestamp_type=1)
    verdict = chain().check(produced(raw, topic_config=TopicConfig(timestamp_type="LogAppendTime")))
    assert verdict.code == error_codes.INVALID_TIMESTAMP
    assert "Producer should not set timestamp type to LogAppendTime" in (
        verdict.record_errors[0].message
    )


def test_batch_over_max_message_bytes_is_message_too_large_before_the_crc() -> None:
    raw = bytearray(build_batch(recs(3)))
    size = len(raw)
    config = TopicConfig(max_message_bytes=size - 1)
    raw[-1] ^= 0xFF  # a stale CRC too: the size comes first
    verdict = chain().check(produced(bytes(raw), topic_config=config))
    assert (verdict.code, verdict.message) == (
        error_codes.MESSAGE_TOO_LARGE,
        f"The record batch size in the append to t-0 is {size} bytes which exceeds the maximum "
        f"configured value of {size - 1}.",
    )
    assert (
        chain()
        .check(produced(build_batch(recs(3)), topic_config=TopicConfig(max_message_bytes=size)))
        .ok
    )


def test_records_over_segment_bytes_are_record_list_too_large() -> None:
    raw = build_batch(recs(3))
    verdict = chain().check(produced(raw, topic_config=TopicConfig(segment_bytes=len(raw) - 1)))
    assert verdict.code == error_codes.RECORD_LIST_TOO_LARGE
    assert verdict.message == (
        f"Message batch size is {len(raw)} bytes in append to partition t-0, which exceeds the "
        f"maximum configured segment size of {len(raw) - 1}."
    )


# ---- duplicates ----------------------------------------------------------------------------


def test_retry_of_an_older_acknowledged_batch_changes_nothing() -> None:
    """UnifiedLogTest.testDuplicateAppends: batches 0..8 acknowledged one by one; a retry of
    sequence 2 is a duplicate (answered with success), and sequence 9 still follows 8."""
    tracker = ProducerStateTracker()
    routing = build_routing(
        {"policies": ["batch_integrity", "producer_state"]}, [], Path("."), producer_state=tracker
    )
    policy_chain = routing.chain_for("t")

    def batch(seq: int) -> bytes:
        return build_batch(recs(1), producer_id=1, producer_epoch=0, base_sequence=seq)

    for seq in range(9):
        assert policy_chain.check(produced(batch(seq))).ok
        tracker.record_success("t", 0, 1, 0, seq, seq)
    assert policy_chain.check(produced(batch(6))).ok  # one of the last five: a duplicate
    tracker.record_success("t", 0, 1, 0, 6, 6)  # the broker answers a duplicate with success
    verdict: Verdict = policy_chain.check(produced(batch(9)))
    assert verdict.ok, verdict
    assert tracker.get("t", 0, 1) is not None
    assert tracker.get("t", 0, 1).last_sequence == 8  # type: ignore[union-attr]
    verdict = policy_chain.check(produced(batch(11)))
    assert verdict.code == error_codes.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_check_count_false_leaves_the_count_to_the_broker() -> None:
    """`batch_integrity: {check_count: false}`: a LogAppendTime topic's batches go unread (the
    broker refuses a wrong count itself); a check that reads records still finds it."""
    raw = with_count(build_batch(recs(3)), 5)
    log_append = TopicConfig(timestamp_type="LogAppendTime")
    unread = chain([{"batch_integrity": {"check_count": False}}, "crc", "timestamps"])
    assert unread.check(produced(raw, topic_config=log_append)).ok
    verdict = unread.check(produced(raw))  # CreateTime: timestamps reads every record
    assert (verdict.code, verdict.message, verdict.policy) == (
        error_codes.INVALID_RECORD,
        PREMATURE_EOF,
        "timestamps",
    )


def parsed(raw: bytes, version: int) -> Verdict | ProducedRecords:
    return parse_records(
        "t", 0, raw, produce_version=version, acks=-1, transactional_id=None, compacted=None,
        now_ms=NOW,
    )  # fmt: skip


def test_a_batch_cut_short_is_no_batch_at_all_on_v3_plus() -> None:
    """Kafka's batch iterator stops quietly at an incomplete batch; with none before it,
    ProduceRequest.validateRecords answers 87. After a complete batch, Kafka would drop the
    incomplete tail and write the rest: the proxy refuses it (CORRUPT_MESSAGE) rather than
    forward bytes that are not a batch."""
    whole = build_batch(recs(1))
    cut = whole[:-6]
    verdict = parsed(cut, 9)
    assert isinstance(verdict, Verdict)
    assert (verdict.code, verdict.message) == (
        error_codes.INVALID_RECORD,
        "Produce requests with version 9 must have at least one record batch per partition",
    )
    for raw, version in ((whole + cut, 9), (cut, 2), (whole[:5], 2)):
        verdict = parsed(raw, version)
        assert isinstance(verdict, Verdict)
        assert verdict.code == error_codes.CORRUPT_MESSAGE


@pytest.mark.parametrize("code", [error_codes.MESSAGE_TOO_LARGE, error_codes.RECORD_LIST_TOO_LARGE])
def test_size_refusals_keep_their_code_on_legacy_produce_versions(code: int) -> None:
    """A broker answers max.message.bytes and segment.bytes with their own codes on Produce
    v0-v2 too: the legacy code (CORRUPT_MESSAGE, retried) would have the client resend forever."""
    from kvproxy.proxy.produce.decision import ProduceSettings
    from kvproxy.proxy.produce.engine import ProduceEngine

    engine = ProduceEngine(build_routing(None, None, Path(".")), ProduceSettings(), lambda _: None)
    verdict = Verdict(code, "too large", policy="batch_integrity")
    assert [engine.answers.code(verdict, version) for version in (0, 2, 9)] == [code] * 3
    other = Verdict(error_codes.INVALID_RECORD, "x", policy="batch_integrity")
    assert engine.answers.code(other, 2) == error_codes.CORRUPT_MESSAGE


def test_a_grouped_check_that_crashes_fails_closed_under_its_own_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker check that raises inside its group (`PolicyGroup`) is that policy's failure:
    INVALID_RECORD, counted and named as such, as any policy that crashes."""
    from kvproxy.policies.builtin.broker import CompactedKeyPolicy

    def broken(_batch: ProducedRecords) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(CompactedKeyPolicy, "record_errors", staticmethod(broken))
    policy_chain = chain()
    verdict = policy_chain.check(produced(build_batch(recs(1)), compacted=True))
    assert (verdict.code, verdict.policy) == (error_codes.INVALID_RECORD, "compacted_key")
    assert verdict.message == "policy compacted_key failed: RuntimeError('boom')"
    assert policy_chain.crash_counts == {"compacted_key": 1}
