"""Kafka's own produce-path tests, ported: what a broker refuses or accepts, through ProduceEngine.

Each test names the Kafka test it ports (apache/kafka: LogValidatorTest.java and
ProducerStateManagerTest.java in storage/src/test, UnifiedLogTest.scala and ProduceRequestTest.scala
in core/src/test). The inputs are Kafka's, written with the project's writers
(`tests/harness/kafka_parity.py`); the chain is a broker's checks configured as the Kafka test
configures its topic; what is asserted is what the client decodes: the partition's error code
and, on Produce v8+, `error_message` and `record_errors` in the wording of Kafka's LogValidator,
UnifiedLog, ProducerAppendInfo and DefaultRecordBatch.

For a batch-level refusal a broker puts no `error_message` on the wire (only its code); kvproxy
sends the reason the broker's exception gives (docs/clients.md), and that text is what is checked.
Magic 0/1 inputs travel in Produce v2 (v3+ carry magic 2 only), whose answer is a code alone:
their record errors are checked on the proxy's verdict, which its log and journal keep. Answers
use Kafka's codes on every version (`errors.legacy_below: 0`). A Kafka test that overwrites a
header field leaves the CRC stale (LogValidator alone never reads it); its port recomputes the
CRC so that the field's own check is reached, as it is in a broker, and the stale CRC is a test
of its own (CORRUPT_MESSAGE, checked first).

Not ported, because a proxy does not do it (the proxy forwards the client's bytes, the broker
writes them):
- offset assignment, format conversion and recompression: the offsets, timestamps and batches
  LogValidator writes, shallowOffsetOfMaxTimestamp, RecordValidationStats. Of those tests, where
  the input is a batch a broker accepts, the verdict is kept (accepted and forwarded);
- metrics recording (MetricsRecorder counts, BrokerTopicMetrics);
- testControlRecordsNotCompressed (the coordinator's append, never a client's) and
  testZStdCompressedWithUnavailableIBPVersion (inter.broker.protocol.version < 2.1; the proxy's
  zstd refusal is the Produce version's, ProduceRequestTest.testZSTDProduceRequest);
- ProducerStateManagerTest's transaction markers, snapshots, expiration and replication: the
  proxy learns producer state only from the broker's answers to clients' data batches.
"""

from __future__ import annotations

import re

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch, read_batches
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.kafka_parity import (
    BASE_SEQUENCE,
    CODECS,
    INVALID_TIMESTAMP_MESSAGE,
    LAST_OFFSET_DELTA,
    LEGACY_CODECS,
    NOW,
    RECORDS_COUNT,
    TOPIC_PARTITION,
    Answer,
    broker_policies,
    codec_name,
    empty_batch,
    end_transaction_marker,
    kafka_engine,
    kafka_records,
    legacy_message,
    legacy_wrapper,
    log_append_time,
    out_of_range,
    patch,
    produce,
    record_errors_message,
    two_batches,
    v2_batch,
)

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
INVALID_TIMESTAMP = 32
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

COMPACTED = (
    f"Compacted topic cannot accept message without key in topic partition {TOPIC_PARTITION}"
)
HOUR_MS = 3_600_000
INT_MAX = 2**31 - 1


def assert_refused(answer: Answer, code: int, message: str) -> None:
    """A batch-level refusal on Produce v8+: the code, the broker's reason, no record errors."""
    assert not answer.forwarded
    assert (answer.code, answer.error_message, answer.record_errors) == (code, message, ())


def assert_refused_legacy(answer: Answer, code: int, message: str | None = None) -> None:
    """A refusal on Produce v0-v2, whose answer is a code alone; the reason is the verdict's."""
    assert not answer.forwarded
    assert answer.code == code, answer.verdict
    if message is not None:
        assert answer.verdict.message == message


def assert_accepted(answer: Answer) -> None:
    assert (answer.code, answer.forwarded) == (0, True), answer.verdict


def version_for(magic: int) -> int:
    """Produce v2 carries magic 0/1 message sets, v3+ magic 2 batches only."""
    return 2 if magic < 2 else 9


def test_hand_written_batch_is_what_build_batch_writes() -> None:
    """The field-by-field writer behind the corrupted inputs agrees with the project's builder
    byte for byte on a normal batch, so what the tests change is only what they mean to."""
    records = [(None, b"hello", None, NOW), (b"k", b"there", None, NOW + 5)]
    for codec in (Codec.NONE, Codec.SNAPPY):
        hand = v2_batch([(0, NOW, None, b"hello"), (1, NOW + 5, b"k", b"there")], codec=codec)
        built = build_batch(records, codec=codec)
        if codec is Codec.NONE:
            assert hand == built
        (read,) = read_batches(hand)
        assert read.crc_valid()
        assert [(r.key, r.value, r.timestamp) for r in read.records()] == [
            (None, b"hello", NOW),
            (b"k", b"there", NOW + 5),
        ]


# ---- LogValidatorTest: the batch ----------------------------------------------------------


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_validation_of_batches_with_non_sequential_inner_offsets(magic: int) -> None:
    """LogValidatorTest.testValidationOfBatchesWithNonSequentialInnerOffsets: 20 gzip records,
    all at offset 0. Magic 2 is refused (an offset range of one record cannot hold 20); magic
    0/1 wrappers are accepted (the broker renumbers their inner offsets)."""
    values = [str(i).encode() for i in range(20)]
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    if magic == 2:
        raw = v2_batch([(0, -1, None, value) for value in values], codec=Codec.GZIP)
        assert_refused(
            produce(engine, raw, now_ms=0),
            INVALID_RECORD,
            "Inconsistent batch offset range [0, 0] and count of records 20 in topic partition "
            f"{TOPIC_PARTITION}",
        )
    else:
        inner = [legacy_message(0, magic, value) for value in values]
        raw = legacy_wrapper(inner, magic=magic, codec=Codec.GZIP, offset=0)
        assert_accepted(produce(engine, raw, version=2, now_ms=0))


@pytest.mark.parametrize(
    ("magic", "codec"),
    [
        (0, Codec.GZIP),
        (1, Codec.GZIP),
        (2, Codec.GZIP),
        (0, Codec.SNAPPY),
        (1, Codec.SNAPPY),
        (2, Codec.SNAPPY),
        (0, Codec.LZ4),
        (1, Codec.LZ4),
        (2, Codec.LZ4),
        (2, Codec.NONE),
        (2, Codec.ZSTD),
    ],
    ids=codec_name,
)
def test_only_one_batch(magic: int, codec: Codec) -> None:
    """LogValidatorTest.checkOnlyOneBatch: two magic 2 batches, or two compressed magic 0/1
    wrappers, in one partition are refused (a v3+ request by ProduceRequest.validateRecords
    before LogValidator sees it)."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    answer = produce(engine, two_batches(magic, codec), version=version_for(magic), now_ms=0)
    if magic == 2:
        assert_refused(
            answer,
            INVALID_RECORD,
            "Produce requests with version 9 are only allowed to contain exactly one record "
            "batch per partition",
        )
    else:
        assert_refused_legacy(
            answer, INVALID_RECORD, "Compressed outer record has more than one batch"
        )


@pytest.mark.parametrize("magic", [0, 1])
def test_allow_multi_batch(magic: int) -> None:
    """LogValidatorTest.checkAllowMultiBatch: uncompressed magic 0/1 messages are each a batch
    of their own, and several of them are a valid message set."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    assert_accepted(produce(engine, two_batches(magic, Codec.NONE), version=2, now_ms=0))


@pytest.mark.parametrize("codec", CODECS, ids=codec_name)
def test_batch_without_records_not_allowed(codec: Codec) -> None:
    """LogValidatorTest.testBatchWithoutRecordsNotAllowed: a transactional header with count 0
    (DefaultRecordBatch.writeEmptyHeader, last offset 5) for every source compression."""
    raw = empty_batch(
        codec,
        producer_id=1324,
        producer_epoch=10,
        base_sequence=984,
        last_offset_delta=5,
        transactional=True,
        timestamp=NOW,
    )
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000))
    assert_refused(
        produce(engine, raw, transactional_id="txn"),
        INVALID_RECORD,
        f"Invalid reported count for record batch: 0 in topic partition {TOPIC_PARTITION}",
    )


def test_record_batch_with_count_overrides() -> None:
    """LogValidatorTest.testRecordBatchWithCountOverrides: three records with the count and
    last offset delta they really have (2, 3) pass, on a LogAppendTime topic."""
    raw = kafka_records(2, 1234)
    raw = patch(patch(raw, ">i", RECORDS_COUNT, 3), ">i", LAST_OFFSET_DELTA, 2)
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime"))
    assert_accepted(produce(engine, raw))


@pytest.mark.parametrize(
    ("last_offset_delta", "count", "message"),
    [
        (0, 3, "Inconsistent batch offset range [0, 0] and count of records 3"),
        (15, 3, "Inconsistent batch offset range [0, 15] and count of records 3"),
        (-3, 3, "Batch has an invalid offset range: [0, -3]"),
    ],
)
def test_inconsistent_count_and_offset(last_offset_delta: int, count: int, message: str) -> None:
    """LogValidatorTest.testInconsistentCountAndOffset: a header whose count and offset range
    disagree, or whose range is empty, is refused by LogValidator.validateBatch."""
    raw = kafka_records(2, 1234)
    raw = patch(patch(raw, ">i", RECORDS_COUNT, count), ">i", LAST_OFFSET_DELTA, last_offset_delta)
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime"))
    assert_refused(
        produce(engine, raw), INVALID_RECORD, f"{message} in topic partition {TOPIC_PARTITION}"
    )


@pytest.mark.parametrize("chain", ["broker", "default"])
@pytest.mark.parametrize("codec", CODECS, ids=codec_name)
@pytest.mark.parametrize(
    ("last_offset_delta", "count", "message"),
    [
        (5, 6, "Incorrect declared batch size, premature EOF reached"),
        (1, 2, "Incorrect declared batch size, records still remaining in file"),
    ],
    ids=["fewer-records", "more-records"],
)
def test_unmatched_number_of_records(
    last_offset_delta: int, count: int, message: str, codec: Codec, chain: str
) -> None:
    """LogValidatorTest.testUnmatchedNumberOfRecords: a header whose count agrees with its
    offset range but not with the three records it holds is refused with DefaultRecordBatch's
    reason, by the broker's checks and by the default chain, whatever the codec (Kafka's test
    uses an uncompressed batch; its iterators say the same for compressed ones)."""
    raw = kafka_records(2, 1234, codec)
    raw = patch(patch(raw, ">i", RECORDS_COUNT, count), ">i", LAST_OFFSET_DELTA, last_offset_delta)
    policies = broker_policies(timestamp_type="LogAppendTime") if chain == "broker" else None
    engine = kafka_engine(policies)
    assert_refused(produce(engine, raw), INVALID_RECORD, message)


@pytest.mark.parametrize("codec", CODECS, ids=codec_name)
@pytest.mark.parametrize("to_magic", [0, 1, 2])
def test_invalid_sequence(to_magic: int, codec: Codec) -> None:
    """LogValidatorTest.checkInvalidSequence: an idempotent batch whose base sequence is
    overwritten with -2 is refused before its topic's format matters, for every codec and every
    format the topic converts to."""
    raw = build_batch(
        [(None, b"hello", None, -1)],
        codec=codec,
        producer_id=1234,
        producer_epoch=0,
        base_sequence=0,
    )
    raw = patch(raw, ">i", BASE_SEQUENCE, -2)
    engine = kafka_engine(
        broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=to_magic)
    )
    assert_refused(
        produce(engine, raw),
        INVALID_RECORD,
        "Invalid sequence number -2 in record batch with producerId 1234 in topic partition "
        f"{TOPIC_PARTITION}",
    )


@pytest.mark.parametrize("codec", CODECS, ids=codec_name)
def test_invalid_sequence_under_a_stale_crc_is_corrupt(codec: Codec) -> None:
    """LogValidatorTest.checkInvalidSequence as a broker receives it: Kafka's test overwrites the
    sequence and leaves the CRC stale, and a broker checks the CRC first
    (UnifiedLog.analyzeAndValidateRecords, before LogValidator): CORRUPT_MESSAGE."""
    raw = build_batch(
        [(None, b"hello", None, -1)],
        codec=codec,
        producer_id=1234,
        producer_epoch=0,
        base_sequence=0,
    )
    (stored,) = read_batches(raw)
    raw = patch(raw, ">i", BASE_SEQUENCE, -2, fix_crc=False)
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    assert_refused(
        produce(engine, raw),
        CORRUPT_MESSAGE,
        f"Record is corrupt (stored crc = {stored.crc}) in topic partition {TOPIC_PARTITION}.",
    )


@pytest.mark.parametrize(("last_offset_delta", "count"), [(0, 3), (15, 3), (-3, 3), (5, 6), (1, 2)])
def test_count_overrides_under_a_stale_crc_are_corrupt(last_offset_delta: int, count: int) -> None:
    """LogValidatorTest.testInconsistentCountAndOffset and testUnmatchedNumberOfRecords as a
    broker receives their batches, CRC left stale: the CRC is checked before the header's
    fields and the records (UnifiedLog.analyzeAndValidateRecords), so CORRUPT_MESSAGE."""
    raw = kafka_records(2, 1234)
    (stored,) = read_batches(raw)
    raw = patch(raw, ">i", RECORDS_COUNT, count, fix_crc=False)
    raw = patch(raw, ">i", LAST_OFFSET_DELTA, last_offset_delta, fix_crc=False)
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime"))
    assert_refused(
        produce(engine, raw),
        CORRUPT_MESSAGE,
        f"Record is corrupt (stored crc = {stored.crc}) in topic partition {TOPIC_PARTITION}.",
    )


def test_non_increasing_offset_record_batch() -> None:
    """LogValidatorTest.testNonIncreasingOffsetRecordBatchHasMetricsLogged: records at offsets
    0, 2 and 3, the batch's last offset then set to 2 (its base offset becomes -1). A broker
    refuses it for the base offset (UnifiedLog.analyzeAndValidateRecords) before LogValidator
    sees the offset range; with base offset 0 the range [0, 3] cannot hold three records."""
    records = [(0, -1, None, b"hello"), (2, -1, None, b"there"), (3, -1, None, b"beautiful")]
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000, topic_magic=0))
    assert_refused(
        produce(engine, v2_batch(records, base_offset=-1)),
        INVALID_RECORD,
        f"The baseOffset of the record batch in the append to {TOPIC_PARTITION} should be 0, "
        "but it is -1",
    )
    assert_refused(
        produce(engine, v2_batch(records)),
        INVALID_RECORD,
        "Inconsistent batch offset range [0, 3] and count of records 3 in topic partition "
        f"{TOPIC_PARTITION}",
    )


def test_control_records_not_allowed_from_clients() -> None:
    """LogValidatorTest.testControlRecordsNotAllowedFromClients: an end-transaction marker sent
    by a client (in a transactional request: the marker batch is transactional)."""
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000))
    assert_refused(
        produce(engine, end_transaction_marker(23423, 5, NOW), transactional_id="txn"),
        INVALID_RECORD,
        f"Clients are not allowed to write control records in topic partition {TOPIC_PARTITION}",
    )


@pytest.mark.parametrize(
    ("transactional", "message"),
    [
        (True, "Transactional records cannot be used with magic version 1"),
        (False, "Idempotent records cannot be used with magic version 1"),
    ],
    ids=[
        "testDownConversionOfTransactionalRecordsNotPermitted",
        "testDownConversionOfIdempotentRecordsNotPermitted",
    ],
)
def test_down_conversion_of_producer_records_not_permitted(
    transactional: bool, message: str
) -> None:
    """LogValidatorTest.testDownConversionOfTransactionalRecordsNotPermitted and
    testDownConversionOfIdempotentRecordsNotPermitted: a transactional or idempotent batch for
    a topic whose format is magic 1 is UNSUPPORTED_FOR_MESSAGE_FORMAT."""
    values = (b"hello", b"there", b"beautiful")
    raw = build_batch(
        [(None, value, None, NOW) for value in values],
        producer_id=1344,
        producer_epoch=16,
        base_sequence=0,
        is_transactional=transactional,
    )
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000, topic_magic=1))
    answer = produce(engine, raw, transactional_id="txn" if transactional else None)
    assert_refused(answer, UNSUPPORTED_FOR_MESSAGE_FORMAT, message)


def test_batch_magic_differs_from_the_first_batch() -> None:
    """LogValidator.validateBatch's first check (no LogValidatorTest case of its own): a magic 1
    message after a magic 0 one in the same message set."""
    raw = build_batch([(b"k", b"a", None, None)], magic=0) + build_batch(
        [(b"k", b"b", None, NOW)], magic=1, base_offset=1
    )
    engine = kafka_engine(broker_policies())
    assert_refused_legacy(
        produce(engine, raw, version=2),
        INVALID_RECORD,
        "Batch magic 1 is not the same as the first batch's magic byte 0 in topic partition "
        f"{TOPIC_PARTITION}",
    )


@pytest.mark.parametrize(
    ("magic", "codec"),
    [(magic, codec) for magic in (0, 1) for codec in LEGACY_CODECS],
    ids=codec_name,
)
def test_invalid_checksum(magic: int, codec: Codec) -> None:
    """LogValidatorTest.checkInvalidChecksum: a wrapper whose inner message has the first byte of
    its CRC set to 0 is CORRUPT_MESSAGE (before its timestamp, 0, is found out of range)."""
    inner = legacy_message(0, magic, b"hello", timestamp=0, crc_first_byte=0)
    raw = legacy_wrapper([inner], magic=magic, codec=codec, offset=0, timestamp=0)
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    assert_refused_legacy(produce(engine, raw, version=2), CORRUPT_MESSAGE)


# ---- LogValidatorTest: the records -------------------------------------------------------


@pytest.mark.parametrize(("batch_magic", "record_magic"), [(0, 1), (1, 0)])
def test_mismatch_magic(batch_magic: int, record_magic: int) -> None:
    """LogValidatorTest.checkMismatchMagic: a gzip wrapper of one magic holding 20 messages of
    the other; every record is in error."""
    inner = [
        legacy_message(1234567 + i, record_magic, str(i).encode(), key=str(i).encode())
        for i in range(20)
    ]
    raw = legacy_wrapper(inner, magic=batch_magic, codec=Codec.GZIP, offset=1234586)
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    answer = produce(engine, raw, version=2, now_ms=0)
    assert_refused_legacy(answer, INVALID_RECORD)
    errors = answer.verdict.record_errors
    assert [error.index for error in errors] == list(range(20))
    suffix = f"'s magic does not match outer magic {batch_magic} in topic partition topic-0"
    assert all(error.message.endswith(suffix) for error in errors), errors[0]
    assert answer.verdict.message == record_errors_message(
        [(error.index, error.message) for error in errors]
    )


def test_invalid_record_exception_has_batch_index() -> None:
    """LogValidatorTest.testInvalidRecordExceptionHasBatchIndex: a magic 0 gzip wrapper of 20
    magic 1 messages; one record error per record, each with its index."""
    inner = [
        legacy_message(1234567 + i, 1, str(i).encode(), key=str(i).encode()) for i in range(20)
    ]
    raw = legacy_wrapper(inner, magic=0, codec=Codec.GZIP, offset=1234586)
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=0))
    answer = produce(engine, raw, version=2, now_ms=0)
    assert_refused_legacy(answer, INVALID_RECORD)
    assert [error.index for error in answer.verdict.record_errors] == list(range(20))
    assert all(error.message for error in answer.verdict.record_errors)


def test_batch_with_invalid_records_and_invalid_timestamp() -> None:
    """LogValidatorTest.testBatchWithInvalidRecordsAndInvalidTimestamp: a magic 1 gzip wrapper
    holding a magic 1 message stamped 1200 (out of range at time 0) and five magic 0 messages:
    six record errors, and the timestamp error makes the answer INVALID_TIMESTAMP."""
    inner = [legacy_message(0, 1, b"timestamp", timestamp=1200)]
    inner += [legacy_message(30 * (i + 1), 0, str(i).encode()) for i in range(5)]
    raw = legacy_wrapper(inner, magic=1, codec=Codec.GZIP, offset=150, timestamp=1200)
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=0))
    answer = produce(engine, raw, version=2, now_ms=0)
    assert_refused_legacy(answer, INVALID_TIMESTAMP, INVALID_TIMESTAMP_MESSAGE)
    errors = answer.verdict.record_errors
    assert [error.index for error in errors] == list(range(6))
    assert errors[0].message == out_of_range(1200, 0, 0, 1000, 1000)
    suffix = f"'s magic does not match outer magic 1 in topic partition {TOPIC_PARTITION}"
    assert all(error.message.endswith(suffix) for error in errors[1:]), errors[1:]


def test_record_errors_of_several_checks_are_merged_timestamp_first() -> None:
    """LogValidator.validateRecord and processRecordErrors on magic 2, the wire form of
    testBatchWithInvalidRecordsAndInvalidTimestamp: each record's first error (key before
    timestamp) is kept, and one timestamp error among them makes the answer INVALID_TIMESTAMP
    with every record error listed."""
    late = NOW + 2 * HOUR_MS
    raw = build_batch([(None, b"a", None, NOW), (b"k", b"b", None, late), (None, b"c", None, late)])
    engine = kafka_engine(broker_policies(after_max_ms=HOUR_MS), compacted=True)
    answer = produce(engine, raw)
    assert not answer.forwarded
    assert answer.code == INVALID_TIMESTAMP
    assert answer.error_message == INVALID_TIMESTAMP_MESSAGE
    low = NOW - (2**63 - 1)
    assert answer.record_errors == (
        (0, COMPACTED),
        (
            1,
            f"Timestamp {late} of message with offset 1 is out of range. The timestamp should "
            f"be within [{low}, {NOW + HOUR_MS}]",
        ),
        (2, COMPACTED),
    )


@pytest.mark.parametrize(
    ("magic", "codec"),
    [
        (0, Codec.GZIP),
        (1, Codec.GZIP),
        (2, Codec.GZIP),
        (0, Codec.LZ4),
        (1, Codec.LZ4),
        (2, Codec.LZ4),
        (0, Codec.SNAPPY),
        (1, Codec.SNAPPY),
        (2, Codec.SNAPPY),
        (2, Codec.ZSTD),
    ],
    ids=codec_name,
)
def test_no_key_compacted_topic(magic: int, codec: Codec) -> None:
    """LogValidatorTest.checkNoKeyCompactedTopic: three records without a key on a compacted
    topic, one record error each (the message has no final period since KAFKA-14477)."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000), compacted=True)
    answer = produce(engine, kafka_records(magic, -1, codec), version=version_for(magic))
    expected = ((0, COMPACTED), (1, COMPACTED), (2, COMPACTED))
    if magic == 2:
        assert not answer.forwarded
        assert answer.code == INVALID_RECORD
        assert answer.record_errors == expected
        assert answer.error_message == record_errors_message(expected)
    else:
        assert_refused_legacy(answer, INVALID_RECORD, record_errors_message(expected))
        assert tuple((e.index, e.message) for e in answer.verdict.record_errors) == expected


def out_of_range_v2(timestamp: int, before: int, after: int) -> Answer:
    """createRecords(V2, timestamp, gzip) on a CreateTime topic with the given bounds."""
    return produce(
        kafka_engine(broker_policies(before_max_ms=before, after_max_ms=after)),
        kafka_records(2, timestamp, Codec.GZIP),
    )


def assert_timestamps_refused(answer: Answer, timestamp: int, before: int, after: int) -> None:
    """INVALID_TIMESTAMP with one record error per record of createRecords, in Kafka's words."""
    assert not answer.forwarded
    assert answer.code == INVALID_TIMESTAMP
    assert answer.error_message == INVALID_TIMESTAMP_MESSAGE
    assert answer.record_errors == tuple(
        (i, out_of_range(timestamp, i, NOW, before, after)) for i in range(3)
    )


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP], ids=["NonCompressed", "Compressed"])
def test_invalid_create_time_v2(codec: Codec) -> None:
    """LogValidatorTest.testInvalidCreateTimeNonCompressedV2 and testInvalidCreateTimeCompressedV2:
    records 1001 ms old on a topic that allows 1000."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    answer = produce(engine, kafka_records(2, NOW - 1001, codec))
    assert_timestamps_refused(answer, NOW - 1001, 1000, 1000)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP], ids=["NonCompressed", "Compressed"])
def test_invalid_create_time_v1(codec: Codec) -> None:
    """LogValidatorTest.testInvalidCreateTimeNonCompressedV1 and testInvalidCreateTimeCompressedV1:
    magic 1 messages 1001 ms old on a topic that allows 1000."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=1))
    answer = produce(engine, kafka_records(1, NOW - 1001, codec), version=2)
    assert_refused_legacy(answer, INVALID_TIMESTAMP, INVALID_TIMESTAMP_MESSAGE)
    assert answer.verdict.record_errors[0].message == out_of_range(NOW - 1001, 0, NOW, 1000, 1000)


def test_invalid_timestamp_exception_has_batch_index() -> None:
    """LogValidatorTest.testInvalidTimestampExceptionHasBatchIndex: a gzip batch 1001 ms old for
    a magic 1 topic; each of the three records has its error."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=1))
    answer = produce(engine, kafka_records(2, NOW - 1001, Codec.GZIP))
    assert_timestamps_refused(answer, NOW - 1001, 1000, 1000)


def test_record_with_past_timestamp_is_rejected() -> None:
    """LogValidatorTest.testRecordWithPastTimestampIsRejected: five minutes before a 24 h
    message.timestamp.before.max.ms."""
    before, after = 24 * HOUR_MS, HOUR_MS
    timestamp = NOW - before - 5 * 60_000
    assert_timestamps_refused(out_of_range_v2(timestamp, before, after), timestamp, before, after)


def test_record_with_future_timestamp_is_rejected() -> None:
    """LogValidatorTest.testRecordWithFutureTimestampIsRejected: five minutes after a 1 h
    message.timestamp.after.max.ms."""
    before, after = 24 * HOUR_MS, HOUR_MS
    timestamp = NOW + after + 5 * 60_000
    assert_timestamps_refused(out_of_range_v2(timestamp, before, after), timestamp, before, after)


@pytest.mark.parametrize("codec", CODECS, ids=codec_name)
def test_producer_set_log_append_time(codec: Codec) -> None:
    """LogValidator.validateTimestamp's second branch (no LogValidatorTest case of its own): on a
    LogAppendTime topic a batch the producer marked LogAppendTime is refused, one error per
    record quoting DefaultRecord.toString(), or PartialDefaultRecord's in a compressed batch
    (LogValidator reads those with skipKeyValueIterator; a null key is "-1 bytes")."""
    raw = log_append_time(kafka_records(2, NOW, codec))
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime"))
    answer = produce(engine, raw)
    assert not answer.forwarded
    assert answer.code == INVALID_TIMESTAMP
    assert answer.error_message == INVALID_TIMESTAMP_MESSAGE
    sizes = (5, 5, 9)
    kind, key = ("DefaultRecord", 0) if codec is Codec.NONE else ("PartialDefaultRecord", -1)
    assert answer.record_errors == tuple(
        (
            i,
            f"Invalid timestamp type in message {kind}(offset={i}, timestamp={NOW}, "
            f"key={key} bytes, value={size} bytes). Producer should not set timestamp type to "
            "LogAppendTime.",
        )
        for i, size in enumerate(sizes)
    )


# ---- LogValidatorTest: batches a broker accepts --------------------------------------------


def producer_fields(magic: int) -> dict[str, object]:
    """checkCompressed / checkNonCompressed / checkRecompression: magic 2 batches are
    transactional (producer 1324, epoch 10, sequence 984); magic 0/1 have no such fields."""
    if magic < 2:
        return {}
    return {
        "producer_id": 1324,
        "producer_epoch": 10,
        "base_sequence": 984,
        "is_transactional": True,
    }


def three_stamped(magic: int, codec: Codec) -> bytes:
    """ "hello", "there", "beautiful" stamped now - 1, now + 1 and now."""
    stamps = (NOW - 1, NOW + 1, NOW)
    values = (b"hello", b"there", b"beautiful")
    return build_batch(
        [(None, value, None, stamp) for value, stamp in zip(values, stamps, strict=True)],
        magic=magic,
        codec=codec,
        **producer_fields(magic),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("magic", [1, 2])
@pytest.mark.parametrize(
    "codec",
    [Codec.GZIP, Codec.NONE],
    ids=["checkCompressed", "checkNonCompressed"],
)
def test_valid_batches_are_accepted(codec: Codec, magic: int) -> None:
    """LogValidatorTest.checkCompressed and checkNonCompressed (their verdict): three records
    within a second of now, magic 1 or a transactional magic 2 batch, gzip or uncompressed."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=magic))
    answer = produce(
        engine,
        three_stamped(magic, codec),
        version=version_for(magic),
        transactional_id="txn" if magic == 2 else None,
    )
    assert_accepted(answer)


@pytest.mark.parametrize("magic", [1, 2])
def test_recompression_input_is_accepted(magic: int) -> None:
    """LogValidatorTest.checkRecompression (its verdict): the uncompressed batch a gzip topic
    recompresses is valid as sent."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=magic))
    answer = produce(
        engine,
        three_stamped(magic, Codec.NONE),
        version=version_for(magic),
        transactional_id="txn" if magic == 2 else None,
    )
    assert_accepted(answer)


def test_create_time_up_conversion_v1_to_v2() -> None:
    """LogValidatorTest.testCreateTimeUpConversionV1ToV2 (its verdict): a magic 1 gzip wrapper
    stamped now, for a magic 2 topic."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000))
    assert_accepted(produce(engine, kafka_records(1, NOW, Codec.GZIP), version=2))


@pytest.mark.parametrize("to_magic", [1, 2])
def test_create_time_up_conversion_from_v0(to_magic: int) -> None:
    """LogValidatorTest.checkCreateTimeUpConversionFromV0 (its verdict): a magic 0 gzip wrapper,
    which has no timestamps, for a magic 1 or 2 topic."""
    engine = kafka_engine(
        broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=to_magic)
    )
    assert_accepted(produce(engine, kafka_records(0, -1, Codec.GZIP), version=2))


@pytest.mark.parametrize("magic", [1, 2])
def test_log_append_time_without_recompression(magic: int) -> None:
    """LogValidatorTest.checkLogAppendTimeWithoutRecompression (its verdict): CreateTime records
    stamped 1234 on a LogAppendTime topic, whose broker overwrites the time."""
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime", topic_magic=magic))
    answer = produce(engine, kafka_records(magic, 1234, Codec.GZIP), version=version_for(magic))
    assert_accepted(answer)


@pytest.mark.parametrize("target_magic", [1, 2])
def test_log_append_time_with_recompression(target_magic: int) -> None:
    """LogValidatorTest.checkLogAppendTimeWithRecompression (its verdict): a magic 0 gzip
    wrapper for a LogAppendTime topic of magic 1 or 2."""
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime", topic_magic=target_magic))
    assert_accepted(produce(engine, kafka_records(0, -1, Codec.GZIP), version=2))


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_log_append_time_non_compressed(magic: int) -> None:
    """LogValidatorTest.checkLogAppendTimeNonCompressed (its verdict): uncompressed records
    stamped 1234 on a LogAppendTime topic."""
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime", topic_magic=magic))
    answer = produce(engine, kafka_records(magic, 1234), version=version_for(magic))
    assert_accepted(answer)


def test_absolute_offset_assignment_compressed() -> None:
    """LogValidatorTest.testAbsoluteOffsetAssignmentCompressed (its verdict): a magic 0 gzip
    wrapper for a magic 0 topic."""
    engine = kafka_engine(broker_policies(before_max_ms=1000, after_max_ms=1000, topic_magic=0))
    assert_accepted(produce(engine, kafka_records(0, -1, Codec.GZIP), version=2))


def test_relative_offset_assignment_compressed_v2() -> None:
    """LogValidatorTest.testRelativeOffsetAssignmentCompressedV2 (its verdict): a magic 2 gzip
    batch stamped now, five seconds allowed either way."""
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000))
    assert_accepted(produce(engine, kafka_records(2, NOW, Codec.GZIP)))


def test_offset_assignment_after_down_conversion_v2_to_v0_compressed() -> None:
    """LogValidatorTest.testOffsetAssignmentAfterDownConversionV2ToV0Compressed (its verdict):
    a magic 2 batch without producer fields may go to a magic 0 topic."""
    engine = kafka_engine(broker_policies(before_max_ms=5000, after_max_ms=5000, topic_magic=0))
    assert_accepted(produce(engine, kafka_records(2, NOW, Codec.GZIP)))


def test_offset_assignment_after_up_conversion_v0_to_v2_compressed() -> None:
    """LogValidatorTest.testOffsetAssignmentAfterUpConversionV0ToV2Compressed (its verdict): a
    magic 0 gzip wrapper for a magic 2 LogAppendTime topic."""
    engine = kafka_engine(broker_policies(timestamp_type="LogAppendTime"))
    assert_accepted(produce(engine, kafka_records(0, -1, Codec.GZIP), version=2))


# ---- UnifiedLogTest and ProducerStateManagerTest: producer epochs and sequences -------------


def producer_engine() -> ProduceEngine:
    """The broker's checks with `producer_state`, whose tracker learns from each accepted
    partition's answer (`produce` answers every forwarded one with success)."""
    return kafka_engine(broker_policies(producer_state=True))


def idempotent(sequence: int, records: int = 1, *, epoch: int = 0, producer_id: int = 1) -> bytes:
    """TestUtils.records with a producer id: `records` keyed records stamped now."""
    return build_batch(
        [(b"key", b"value", None, NOW)] * records,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def out_of_order(incoming: int, current: int, producer_id: int = 1) -> re.Pattern[str]:
    """ProducerAppendInfo.checkSequence's reason; the offset is the broker's log end, which the
    proxy cannot know, so any offset matches."""
    return re.compile(
        re.escape(f"Out of order sequence number for producer {producer_id} at offset ")
        + r"-?\d+"
        + re.escape(
            f" in partition {TOPIC_PARTITION}: {incoming} (incoming seq. number), {current} "
            "(current end sequence number)"
        )
    )


def assert_out_of_order(answer: Answer, incoming: int, current: int) -> None:
    assert not answer.forwarded
    assert answer.code == OUT_OF_ORDER_SEQUENCE_NUMBER, answer.verdict
    assert answer.record_errors == ()
    assert answer.error_message is not None
    assert out_of_order(incoming, current).fullmatch(answer.error_message), answer.error_message


def test_duplicate_appends() -> None:
    """UnifiedLogTest.testDuplicateAppends: six single-record batches (sequences 0-5), then one
    of three records (6-8). Its retry is accepted (the broker answers it as a duplicate); a
    partial overlap (7-8) is out of order; a retry of sequence 2, one of the last five batches,
    is accepted and changes nothing, so the next batch (9) is still in order; sequence 1, older
    than the last five, is out of order; and a retried single-record batch at the tail passes."""
    engine = producer_engine()
    for sequence in range(6):
        assert_accepted(produce(engine, idempotent(sequence)))
    assert_accepted(produce(engine, idempotent(6, 3)))
    assert_accepted(produce(engine, idempotent(6, 3)))
    assert_out_of_order(produce(engine, idempotent(7, 2)), 7, 8)
    assert_accepted(produce(engine, idempotent(2)))
    assert_out_of_order(produce(engine, idempotent(1)), 1, 8)
    assert_accepted(produce(engine, idempotent(9)))
    assert_accepted(produce(engine, idempotent(9)))
    assert_out_of_order(produce(engine, idempotent(11)), 11, 9)


def test_non_sequential_append() -> None:
    """UnifiedLogTest.testNonSequentialAppend: sequence 2 after sequence 0 is out of order."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(0)))
    assert_out_of_order(produce(engine, idempotent(2)), 2, 0)


def test_old_producer_epoch() -> None:
    """UnifiedLogTest.testOldProducerEpoch: epoch 0 after epoch 1 is INVALID_PRODUCER_EPOCH."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(0, epoch=1)))
    answer = produce(engine, idempotent(0, epoch=0))
    assert not answer.forwarded
    assert answer.code == INVALID_PRODUCER_EPOCH
    assert answer.error_message is not None
    assert re.fullmatch(
        r"Epoch of producer 1 at offset -?\d+ in topic-0 is 0, which is smaller than the last "
        r"seen epoch 1",
        answer.error_message,
    ), answer.error_message


def test_basic_id_mapping() -> None:
    """ProducerStateManagerTest.testBasicIdMapping through a log: sequences 0 and 1; 1 again is
    a duplicate (UnifiedLog answers it before ProducerStateManager sees it, see
    testDuplicateAppends); 5 is out of order; epoch 1 from sequence 0 passes; epoch 0 is then
    fenced."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(0)))
    assert_accepted(produce(engine, idempotent(1)))
    assert_accepted(produce(engine, idempotent(1)))
    assert_out_of_order(produce(engine, idempotent(5)), 5, 1)
    assert_accepted(produce(engine, idempotent(0, epoch=1)))
    assert produce(engine, idempotent(0, epoch=0)).code == INVALID_PRODUCER_EPOCH


def test_new_epoch_must_start_at_sequence_zero() -> None:
    """ProducerStateManagerTest.testOutOfSequenceAfterControlRecordEpochBump, its client
    appends: a newer epoch that does not start at sequence 0 is out of order (the marker that
    bumps the epoch there is the coordinator's, which the proxy never sees); from 0 it passes."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(0)))
    assert_accepted(produce(engine, idempotent(1)))
    answer = produce(engine, idempotent(2, epoch=2))
    assert (answer.code, answer.forwarded) == (OUT_OF_ORDER_SEQUENCE_NUMBER, False)
    assert answer.error_message is not None
    assert re.fullmatch(
        # sic: Kafka's message has no space before "at offset"
        r"Invalid sequence number for new epoch of producer 1at offset -?\d+ in partition "
        r"topic-0: 2 \(request epoch\), 2 \(seq. number\), 0 \(current producer epoch\)",
        answer.error_message,
    ), answer.error_message
    assert_accepted(produce(engine, idempotent(0, epoch=1)))


def test_producer_sequence_wrap_around() -> None:
    """ProducerStateManagerTest.testProducerSequenceWrapAround and
    testProducerSequenceInvalidWrapAround: after sequence Int.MAX_VALUE the next is 0, not 1."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(INT_MAX, epoch=15)))
    assert_out_of_order(produce(engine, idempotent(1, epoch=15)), 1, INT_MAX)
    assert_accepted(produce(engine, idempotent(0, epoch=15)))


def test_producer_sequence_with_wrap_around_batch_record() -> None:
    """ProducerStateManagerTest.testProducerSequenceWithWrapAroundBatchRecord: a batch of 21
    records from Int.MAX_VALUE - 10 ends at sequence 9, so 10 is next."""
    engine = producer_engine()
    assert_accepted(produce(engine, idempotent(INT_MAX - 10, 21, epoch=15)))
    assert_out_of_order(produce(engine, idempotent(11, epoch=15)), 11, 9)
    assert_accepted(produce(engine, idempotent(10, epoch=15)))


# ---- UnifiedLogTest and ProduceRequestTest: the rest of a broker's produce path ----------


def test_compacted_topic_constraints() -> None:
    """UnifiedLogTest.testCompactedTopicConstraints: on a compacted topic a record without a key
    is refused with its index (1 in the gzip batch), keyed records pass."""
    keyed = (b"and here it is", b"this message has a key", None, -1)
    another = (b"another key", b"this message also has a key", None, -1)
    unkeyed = (None, b"this message does not have a key", None, -1)
    engine = kafka_engine(broker_policies(), compacted=True)
    for records, codec, index in (
        ([unkeyed, keyed], Codec.NONE, 0),
        ([unkeyed], Codec.NONE, 0),
        ([keyed, unkeyed], Codec.GZIP, 1),
    ):
        answer = produce(engine, build_batch(records, codec=codec))
        assert not answer.forwarded
        assert answer.code == INVALID_RECORD
        assert answer.record_errors == ((index, COMPACTED),)
        assert answer.error_message == record_errors_message([(index, COMPACTED)])
    for records, codec in (
        ([keyed], Codec.NONE),
        ([keyed, another], Codec.NONE),
        ([keyed], Codec.GZIP),
    ):
        assert_accepted(produce(engine, build_batch(records, codec=codec)))


def test_message_size_check() -> None:
    """UnifiedLogTest.testMessageSizeCheck: max.message.bytes one byte below the second batch's
    size lets the first through and refuses the second with RecordTooLargeException's words."""
    first = build_batch([(None, b"You", None, -1), (None, b"bethe", None, -1)])
    second = build_batch(
        [
            (None, b"change (I need more bytes)... blah blah blah.", None, -1),
            (None, b"More padding boo hoo", None, -1),
        ]
    )
    limit = len(second) - 1
    topics = [{"match": "topic", "config": {"max.message.bytes": limit}}]
    engine = kafka_engine(broker_policies(), topics=topics)
    assert_accepted(produce(engine, first))
    assert_refused(
        produce(engine, second),
        MESSAGE_TOO_LARGE,
        f"The record batch size in the append to {TOPIC_PARTITION} is {len(second)} bytes which "
        f"exceeds the maximum configured value of {limit}.",
    )


def test_checks_in_the_order_of_analyze_and_validate_records() -> None:
    """UnifiedLog.analyzeAndValidateRecords' order (no test of its own): the base offset, then
    the batch's size against max.message.bytes, then the CRC, then LogValidator's checks."""
    raw = kafka_records(2, NOW)
    (stored,) = read_batches(raw)
    stale = patch(raw, ">i", RECORDS_COUNT, 2, fix_crc=False)
    moved = patch(stale, ">q", 0, 5, fix_crc=False)  # the base offset is outside the CRC
    topics = [{"match": "topic", "config": {"max.message.bytes": len(raw) - 1}}]
    small = kafka_engine(broker_policies(), topics=topics)
    engine = kafka_engine(broker_policies())
    base_offset = (
        f"The baseOffset of the record batch in the append to {TOPIC_PARTITION} should be 0, "
        "but it is 5"
    )
    assert_refused(produce(small, moved), INVALID_RECORD, base_offset)
    assert_refused(produce(engine, moved), INVALID_RECORD, base_offset)
    assert_refused(
        produce(small, stale),
        MESSAGE_TOO_LARGE,
        f"The record batch size in the append to {TOPIC_PARTITION} is {len(raw)} bytes which "
        f"exceeds the maximum configured value of {len(raw) - 1}.",
    )
    assert_refused(
        produce(engine, stale),
        CORRUPT_MESSAGE,
        f"Record is corrupt (stored crc = {stored.crc}) in topic partition {TOPIC_PARTITION}.",
    )


@pytest.mark.parametrize("via", ["topic config", "policy options"])
@pytest.mark.parametrize(
    ("setting", "offset_ms"),
    [
        ("message.timestamp.difference.max.ms", -5 * HOUR_MS),
        ("message.timestamp.before.max.ms", -5 * HOUR_MS),
        ("message.timestamp.after.max.ms", 5 * HOUR_MS),
    ],
)
def test_produce_with_invalid_timestamp(setting: str, offset_ms: int, via: str) -> None:
    """ProduceRequestTest.testProduceWithInvalidTimestamp: the topic allows 1000 ms on one side
    (difference.max.ms, the older setting, on the side left at its default) and the gzip
    records are five hours off on that side: INVALID_TIMESTAMP, a record error per record,
    Kafka's message. The setting is the topic's (`config:`), or the `timestamps` options."""
    if via == "topic config":
        topics = [{"match": "topic", "config": {setting: 1000}}]
        engine = kafka_engine(broker_policies(), topics=topics)
    else:
        option = "after_max_ms" if setting.endswith("after.max.ms") else "before_max_ms"
        engine = kafka_engine(broker_policies(**{option: 1000}))  # type: ignore[arg-type]
    answer = produce(engine, kafka_records(2, NOW + offset_ms, Codec.GZIP))
    assert not answer.forwarded
    assert answer.code == INVALID_TIMESTAMP
    assert [index for index, _ in answer.record_errors] == [0, 1, 2]
    assert all(message for _, message in answer.record_errors)
    assert answer.error_message == INVALID_TIMESTAMP_MESSAGE


def test_corrupt_lz4_produce_request() -> None:
    """ProduceRequestTest.testCorruptLz4ProduceRequest: a byte of the lz4 frame's checksum set
    to 0 (inside the batch's CRC) is CORRUPT_MESSAGE."""
    raw = bytearray(build_batch([(b"key", b"value", None, 1_000_000)], codec=Codec.LZ4))
    (stored,) = read_batches(bytes(raw))
    assert raw[61 + 6] != 0
    raw[61 + 6] = 0
    engine = kafka_engine(broker_policies())
    assert_refused(
        produce(engine, bytes(raw)),
        CORRUPT_MESSAGE,
        f"Record is corrupt (stored crc = {stored.crc}) in topic partition {TOPIC_PARTITION}.",
    )


def test_zstd_produce_request() -> None:
    """ProduceRequestTest.testZSTDProduceRequest: a zstd batch passes on Produce v7 and is
    UNSUPPORTED_COMPRESSION_TYPE on v3 (ProduceRequest.validateRecords)."""
    raw = build_batch([(b"key", b"value", None, NOW)], codec=Codec.ZSTD)
    engine = kafka_engine(broker_policies())
    assert_accepted(produce(engine, raw, version=7))
    answer = produce(engine, raw, version=3)
    assert not answer.forwarded
    assert answer.code == UNSUPPORTED_COMPRESSION_TYPE
    assert answer.verdict.message == (
        "Produce requests with version 3 are not allowed to use ZStandard compression"
    )
