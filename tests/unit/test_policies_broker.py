"""policies: the broker's own checks, with Kafka's codes and wording."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import crc32c
import pytest

from kvproxy.policies import PolicyConfigError, Verdict, build_routing
from kvproxy.policies.api import PolicyContext
from kvproxy.policies.plugins import find_factory
from kvproxy.protocol.compression import Codec, compress
from kvproxy.protocol.records import build_batch
from tests.harness.produced import NOW, produced

LONG_MAX = 2**63 - 1
MORE_THAN_ONE = "Compressed outer record has more than one batch"
REJECTED = "One or more records have been rejected due to"


def check(
    name: str, raw: bytes | None, options: dict[str, Any] | None = None, **kw: Any
) -> Verdict:
    policy = find_factory(name)(PolicyContext(base_dir=Path(".")))
    policy.configure(options or {})
    return policy.validate("t", 0, produced(raw, **kw))


def recs(n: int, key: bytes | None = b"k", ts: int = NOW) -> list[Any]:
    return [(key, b"v%d" % i, None, ts) for i in range(n)]


def patch_v2(raw: bytes, fmt: str, pos: int, value: int) -> bytes:
    """Rewrite one magic 2 header field and fix the CRC."""
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, pos, value)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def legacy_message(  # noqa: PLR0917
    offset: int,
    magic: int,
    attributes: int,
    ts: int,
    key: bytes | None,
    value: bytes | None,
    *,
    bad_crc: bool = False,
) -> bytes:
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", ts)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    crc = zlib.crc32(body) ^ (1 if bad_crc else 0)
    return struct.pack(">qiI", offset, 4 + len(body), crc) + body


def wrapper(
    inner: list[bytes], *, magic: int = 1, codec: Codec = Codec.GZIP, offset: int = 0
) -> bytes:
    payload = compress(codec, b"".join(inner), legacy_lz4_checksum=magic == 0)
    return legacy_message(offset, magic, int(codec), NOW, None, payload)


def assert_verdict(verdict: Verdict, code: int, message: str | None = None) -> None:
    assert verdict.code == code, verdict
    if message is not None:
        assert verdict.message == message


# -- batch_integrity --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 7, 9, 11])
@pytest.mark.parametrize("codec", list(Codec))
def test_batch_integrity_accepts_a_normal_batch(version: int, codec: Codec) -> None:
    verdict = check("batch_integrity", build_batch(recs(3), codec=codec), version=version)
    if codec is Codec.ZSTD and version < 7:
        assert_verdict(
            verdict,
            76,
            f"Produce requests with version {version} are not allowed to use ZStandard compression",
        )
    else:
        assert verdict.ok


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4])
def test_batch_integrity_accepts_legacy_on_old_versions(magic: int, codec: Codec) -> None:
    assert check("batch_integrity", build_batch(recs(3), magic=magic, codec=codec), version=2).ok


def test_v3_needs_magic_2() -> None:
    assert_verdict(
        check("batch_integrity", build_batch(recs(1), magic=1), version=3),
        87,
        "Produce requests with version 3 are only allowed to contain record batches with "
        "magic version 2",
    )


def test_v3_needs_exactly_one_batch() -> None:
    raw = build_batch(recs(1)) + build_batch(recs(1))
    assert_verdict(
        check("batch_integrity", raw, version=5),
        87,
        "Produce requests with version 5 are only allowed to contain exactly one record batch "
        "per partition",
    )
    assert_verdict(
        check("batch_integrity", raw, version=2),
        87,
        MORE_THAN_ONE,
    )


def test_legacy_compressed_wrappers_one_per_partition() -> None:
    raw = build_batch(recs(2), magic=1, codec=Codec.GZIP) * 2
    assert_verdict(
        check("batch_integrity", raw, version=2),
        87,
        MORE_THAN_ONE,
    )
    assert check("batch_integrity", build_batch(recs(1), magic=1) * 3, version=2).ok


def test_base_offset_must_be_zero() -> None:
    raw = build_batch(recs(2), base_offset=5)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "The baseOffset of the record batch in the append to t-0 should be 0, but it is 5",
    )


def test_offset_range() -> None:
    raw = patch_v2(build_batch(recs(1)), ">i", 23, -1)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "Batch has an invalid offset range: [0, -1] in topic partition t-0",
    )


def test_count_positive() -> None:
    raw = patch_v2(build_batch(recs(1)), ">i", 57, 0)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "Invalid reported count for record batch: 0 in topic partition t-0",
    )


def test_count_consistent_with_offsets() -> None:
    raw = patch_v2(build_batch(recs(3)), ">i", 57, 2)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "Inconsistent batch offset range [0, 2] and count of records 2 in topic partition t-0",
    )


def test_no_control_batches() -> None:
    raw = build_batch(recs(1), is_control=True, producer_id=1, producer_epoch=0, base_sequence=0)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "Clients are not allowed to write control records in topic partition t-0",
    )


def test_sequence_with_producer_id() -> None:
    raw = build_batch(recs(2), producer_id=7, producer_epoch=0, base_sequence=-1)
    assert_verdict(
        check("batch_integrity", raw),
        87,
        "Invalid sequence number -1 in record batch with producerId 7 in topic partition t-0",
    )
    ok = build_batch(recs(2), producer_id=7, producer_epoch=0, base_sequence=0)
    assert check("batch_integrity", ok).ok


def test_batch_magic_consistent() -> None:
    raw = build_batch(recs(1), magic=1) + build_batch(recs(1), magic=0)
    assert_verdict(
        check("batch_integrity", raw, version=2),
        87,
        "Batch magic 0 is not the same as the first batch's magic byte 1 in topic partition t-0",
    )


def test_inner_record_magic_and_compression_bits() -> None:
    inner = [
        legacy_message(0, 1, 0, NOW, b"k", b"a"),
        legacy_message(1, 0, 0, -1, b"k", b"b"),  # magic 0 inside a magic 1 wrapper
        legacy_message(2, 1, 0, NOW, b"k", b"c"),
        legacy_message(3, 1, 1, NOW, b"k", b"d"),  # gzip bit on an inner message
        legacy_message(4, 1, 0, NOW, b"k", b"e"),
    ]
    verdict = check("batch_integrity", wrapper(inner, offset=4), version=2)
    assert verdict.code == 87 and verdict.rejection == "invalid_record"
    assert [e.index for e in verdict.record_errors] == [1, 3]
    assert verdict.record_errors[0].message == (
        "Record LegacyRecordBatch(offset=1, Record(magic=0, attributes=0, compression=none, "
        "key=1 bytes, value=1 bytes))'s magic does not match outer magic 1 in topic partition t-0"
    )
    assert verdict.record_errors[1].message.startswith(
        "Compressed outer record should not have an inner record with a compression attribute "
        "set: LegacyRecordBatch(offset=3, Record(magic=1, attributes=1, compression=gzip, "
    )
    assert verdict.message is not None
    assert verdict.message.startswith(f"{REJECTED} 2 record errors")


# -- crc --------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [0, 1, 2])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.LZ4])
def test_crc_accepts_and_rejects_a_flipped_byte(magic: int, codec: Codec) -> None:
    raw = build_batch(recs(3), magic=magic, codec=codec)
    assert check("crc", raw, version=2).ok
    bad = bytearray(raw)
    bad[-1] ^= 0x01
    stored = produced(bytes(bad), version=2).batches[-1].crc  # the message the flip is in
    verdict = check("crc", bytes(bad), version=2)
    assert_verdict(verdict, 2, f"Record is corrupt (stored crc = {stored}) in topic partition t-0.")


def test_crc_inner_message_of_a_wrapper() -> None:
    inner = [
        legacy_message(0, 1, 0, NOW, b"k", b"a"),
        legacy_message(1, 1, 0, NOW, b"k", b"b", bad_crc=True),
    ]
    verdict = check("crc", wrapper(inner, offset=1), version=2)
    good = zlib.crc32(inner[1][16:])  # magic..end, what the CRC covers
    stored = struct.unpack_from(">I", inner[1], 12)[0]
    assert stored != good
    # LegacyRecord.ensureValid's words, which LogValidator rethrows as they are
    assert_verdict(verdict, 2, f"Record is corrupt (stored crc = {stored}, computed crc = {good})")


# -- offsets ----------------------------------------------------------------------------------


def set_offset_deltas(raw: bytes, deltas: list[int]) -> bytes:
    """Rewrite the one-byte offset-delta varints of a small uncompressed magic 2 batch."""
    buf = bytearray(raw)
    pos = 61
    for delta in deltas:
        length = buf[pos] >> 1  # zigzag, one byte
        assert buf[pos + 2] == 0  # timestamp delta 0, one byte
        buf[pos + 3] = delta << 1
        pos += 1 + length
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def test_offsets_magic_2_deltas_in_order() -> None:
    raw = build_batch(recs(5))
    assert check("offsets", raw).ok
    bad = set_offset_deltas(raw, [0, 9, 2, 7, 4])
    verdict = check("offsets", bad)
    assert verdict.code == 87 and verdict.rejection == "invalid_record"
    assert [e.index for e in verdict.record_errors] == [1, 3]
    assert verdict.record_errors[0].message == (
        f"Inner record DefaultRecord(offset=9, timestamp={NOW}, key=1 bytes, value=2 bytes) "
        "inside the compressed record batch does not have incremental offsets, expected offset "
        "is 1 in topic partition t-0."
    )


def test_offsets_magic_1_wrapper_inner_offsets() -> None:
    assert check("offsets", build_batch(recs(3), magic=1, codec=Codec.GZIP), version=2).ok
    inner = [legacy_message(o, 1, 0, NOW, b"k", b"x") for o in (0, 1, 5)]
    verdict = check("offsets", wrapper(inner, offset=5), version=2)
    assert [e.index for e in verdict.record_errors] == [2]
    assert "expected offset is 2 in topic partition t-0." in verdict.record_errors[0].message
    # magic 0 wrappers hold absolute offsets: not checked
    assert check(
        "offsets", build_batch(recs(3), magic=0, codec=Codec.GZIP, base_offset=40), version=2
    ).ok


# -- timestamps -------------------------------------------------------------------------------


def test_timestamps_accept_within_range() -> None:
    assert check("timestamps", build_batch(recs(3))).ok
    assert check("timestamps", build_batch(recs(3, ts=0))).ok  # before_max_ms defaults to Long.MAX
    assert check("timestamps", build_batch(recs(3), magic=0), version=2).ok  # no timestamps


def test_timestamps_records_1_and_3_of_5_in_the_future() -> None:
    future = NOW + 2 * 3_600_000
    rows = [(b"k", b"v", None, future if i in (1, 3) else NOW) for i in range(5)]
    verdict = check("timestamps", build_batch(rows))
    assert_verdict(verdict, 32, "One or more records have been rejected due to invalid timestamp")
    assert verdict.rejection is None
    assert [e.index for e in verdict.record_errors] == [1, 3]
    low, high = NOW - LONG_MAX, NOW + 3_600_000
    assert verdict.record_errors[1].message == (
        f"Timestamp {future} of message with offset 3 is out of range. "
        f"The timestamp should be within [{low}, {high}]"
    )


def test_timestamps_range_of_a_batch_reaching_minus_one_is_decided_record_by_record() -> None:
    """-1 (no timestamp) is never range-checked: a batch whose smallest timestamp is -1 falls back
    from the one-pass range to the exact check, which accepts it, or names only the bad record."""
    options = {"before_max_ms": 1000}
    rows = [(b"k", b"v", None, ts) for ts in (NOW, -1, NOW - 10)]
    assert check("timestamps", build_batch(rows), options).ok
    rows.append((b"k", b"v", None, NOW - 5000))
    verdict = check("timestamps", build_batch(rows), options)
    assert verdict.code == 32 and [e.index for e in verdict.record_errors] == [3]


def test_timestamps_before_max_ms_and_legacy() -> None:
    old = NOW - 10_000
    verdict = check(
        "timestamps", build_batch(recs(2, ts=old), magic=1), {"before_max_ms": 1000}, version=2
    )
    assert verdict.code == 32 and [e.index for e in verdict.record_errors] == [0, 1]
    assert verdict.record_errors[0].message == (
        f"Timestamp {old} of message with offset 0 is out of range. "
        f"The timestamp should be within [{NOW - 1000}, {NOW + 3_600_000}]"
    )


def test_timestamps_log_append_time() -> None:
    far = NOW + 10 * 3_600_000
    # LogAppendTime topic: no range check, but a producer may not set LogAppendTime
    assert check("timestamps", build_batch(recs(2, ts=far)), {"type": "LogAppendTime"}).ok
    verdict = check("timestamps", build_batch(recs(2), timestamp_type=1), {"type": "LogAppendTime"})
    assert verdict.code == 32 and [e.index for e in verdict.record_errors] == [0, 1]
    assert verdict.record_errors[0].message.startswith(
        "Invalid timestamp type in message DefaultRecord(offset=0"
    )
    assert verdict.record_errors[0].message.endswith(
        ". Producer should not set timestamp type to LogAppendTime."
    )
    # CreateTime topic: Kafka range-checks a LogAppendTime batch like any other
    assert check("timestamps", build_batch(recs(2), timestamp_type=1)).ok


def test_timestamps_bad_options() -> None:
    with pytest.raises(PolicyConfigError, match="CreateTime or LogAppendTime"):
        build_routing(
            None, [{"match": "a", "policies": [{"timestamps": {"type": "Now"}}]}], Path(".")
        )


# -- compacted_key ----------------------------------------------------------------------------


def test_compacted_key_records_1_and_3_of_5() -> None:
    rows = [(None if i in (1, 3) else b"k", b"v", None, NOW) for i in range(5)]
    raw = build_batch(rows)
    assert check("compacted_key", raw, compacted=False).ok
    assert check("compacted_key", raw, compacted=None).ok
    verdict = check("compacted_key", raw, compacted=True)
    message = "Compacted topic cannot accept message without key in topic partition t-0"
    assert verdict.code == 87 and verdict.rejection == "missing_key"
    assert [(e.index, e.message) for e in verdict.record_errors] == [(1, message), (3, message)]
    assert verdict.message == (
        "One or more records have been rejected due to 2 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, message='{message}'), "
        f"RecordError(batchIndex=3, message='{message}')]"
    )


def test_compacted_key_shows_three_of_four() -> None:
    verdict = check(
        "compacted_key", build_batch(recs(4, key=None), codec=Codec.SNAPPY), compacted=True
    )
    assert len(verdict.record_errors) == 4
    assert verdict.message is not None
    assert verdict.message.startswith(f"{REJECTED} 4 record errors")
    assert verdict.message.count("RecordError(") == 3
    assert check("compacted_key", build_batch(recs(3), magic=0), compacted=True, version=2).ok


# -- message_format ---------------------------------------------------------------------------


def test_message_format() -> None:
    idempotent = build_batch(recs(1), producer_id=3, producer_epoch=0, base_sequence=0)
    transactional = build_batch(
        recs(1), producer_id=3, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    assert check("message_format", idempotent).ok
    assert_verdict(
        check("message_format", idempotent, {"topic_magic": 1}),
        43,
        "Idempotent records cannot be used with magic version 1",
    )
    assert_verdict(
        check("message_format", transactional, {"topic_magic": 0}),
        43,
        "Transactional records cannot be used with magic version 0",
    )
    assert check("message_format", build_batch(recs(1), magic=1), version=2).ok
    assert_verdict(
        check("message_format", build_batch(recs(1), magic=1), {"min_magic": 2}, version=2),
        87,
        "Record batch magic 1 is below the minimum magic version 2 of topic partition t-0",
    )
    with pytest.raises(PolicyConfigError):
        find_factory("message_format")().configure({"min_magic": 3})
