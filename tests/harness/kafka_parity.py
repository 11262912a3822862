"""What `test_kafka_parity` needs: Kafka's test inputs written with the project's own writers, and
one Produce request through `ProduceEngine` as a client sees it.

Kafka's tests corrupt batches with `ByteBuffer.put*` after building them; the helpers here do the
same to bytes from `kvproxy.protocol.records.build_batch`, or write the batch by hand where the
builder
cannot express the input (records with chosen offset deltas, an empty batch, inner messages of
another magic).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from kvproxy.policies.api import Verdict
from kvproxy.policies.config import build_routing
from kvproxy.protocol.compression import Codec, compress
from kvproxy.protocol.messages import (
    PRODUCE,
    decode_request,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.fast_accept import holds_invariant
from tests.harness.fuzz import produce_request

NOW = 1_700_000_000_000
"""The broker's clock in every test that does not take Kafka's own (MockTime(0, 0) is 0)."""
TOPIC = "topic"
TOPIC_PARTITION = "topic-0"
"""Kafka's tests use `new TopicPartition("topic", 0)`; its `toString()` is what messages quote."""
CODECS = list(Codec)
COMPRESSED = [codec for codec in Codec if codec is not Codec.NONE]
LEGACY_CODECS = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4]
"""What magic 0/1 wrappers may use (zstd came with magic 2)."""


def codec_name(value: object) -> str | None:
    """pytest ids: codecs by name ("gzip"), everything else as pytest names it."""
    return value.name.lower() if isinstance(value, Codec) else None


# Magic 2 header positions (DefaultRecordBatch): what Kafka's tests overwrite.
BASE_OFFSET = 0
CRC = 17
ATTRIBUTES = 21
LAST_OFFSET_DELTA = 23
PRODUCER_ID = 43
BASE_SEQUENCE = 53
RECORDS_COUNT = 57
V2_HEADER = 61
_CONTROL = 0x20
_TRANSACTIONAL = 0x10
_LOG_APPEND_TIME = 0x08


# ---- the broker's chain and one round trip ----


def broker_policies(
    *,
    before_max_ms: int | None = None,
    after_max_ms: int | None = None,
    timestamp_type: str = "CreateTime",
    topic_magic: int = 2,
    producer_state: bool = False,
) -> list[Any]:
    """The built-in policies that make a broker's produce checks, configured like the topic of
    a Kafka test (`timestamps` options for message.timestamp.*, `topic_magic` for the format a
    LogValidator converts to). Not `offsets`: it refuses magic 1 wrappers that Kafka rewrites."""
    timestamps: dict[str, Any] = {"type": timestamp_type}
    if before_max_ms is not None:
        timestamps["before_max_ms"] = before_max_ms
    if after_max_ms is not None:
        timestamps["after_max_ms"] = after_max_ms
    policies: list[Any] = [
        "batch_integrity",
        "crc",
        {"timestamps": timestamps},
        "compacted_key",
        {"message_format": {"topic_magic": topic_magic}},
    ]
    if producer_state:
        policies.append("producer_state")
    return policies


def kafka_engine(
    policies: list[Any] | None,
    *,
    compacted: bool = False,
    topics: list[dict[str, Any]] | None = None,
) -> ProduceEngine:
    """An engine answering with Kafka's codes on every Produce version (`legacy_below: 0`);
    `policies` None is the default chain, `topics` the YAML's topic entries."""
    defaults = None if policies is None else {"policies": policies}
    routing = build_routing(defaults, topics, Path("."))
    return ProduceEngine(routing, ProduceSettings(legacy_below=0), lambda _topic: compacted)


@dataclass(frozen=True, slots=True)
class Answer:
    """One partition's answer as the client decodes it, and the verdict behind it."""

    code: int
    error_message: str | None
    """Produce v8+ only (None before)."""
    record_errors: tuple[tuple[int, str | None], ...]
    """(batch_index, message) pairs; Produce v8+ only."""
    forwarded: bool
    """The partition went upstream (the broker's answer, here a success, is what came back)."""
    verdict: Verdict
    """What the proxy decided: on Produce v0-v2 the only place record errors are kept (its log
    and quarantine journal), since those responses carry a code alone."""


def produce(
    engine: ProduceEngine,
    records: bytes | None,
    *,
    version: int = 9,
    now_ms: int = NOW,
    transactional_id: str | None = None,
) -> Answer:
    """`records` for topic-0 in a Produce request of `version`, decided at `now_ms`; a forwarded
    partition is answered by a broker that accepts it, and that answer feeds the producer state."""
    frame = produce_request(version, 7, [(TOPIC, 0, records)], transactional_id=transactional_id)
    holds_invariant(engine, frame, now_ms)  # the compiled fast accept passes only what passes
    decision = engine.decide(frame, decode_request(frame), now_ms=now_ms)
    (outcome,) = decision.outcomes
    upstream = None
    if decision.forward is not None:
        upstream = broker_success(version)
        engine.answers.observe(decision, upstream)
    body = decode_response(engine.answers.answer(decision, upstream), PRODUCE, version).body
    (topic,) = body.responses
    (partition,) = topic.partition_responses
    record_errors = tuple(
        (int(e.batch_index), e.batch_index_error_message)
        for e in getattr(partition, "record_errors", ())
    )
    return Answer(
        code=int(partition.error_code),
        error_message=getattr(partition, "error_message", None),
        record_errors=record_errors,
        forwarded=decision.forward is not None,
        verdict=outcome.verdict,
    )


def broker_success(version: int) -> bytes:
    """A broker's answer accepting topic-0 (what a broker that validates nothing says)."""
    types = produce_response_types(version)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, 0, 0)])])
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, 7, body))


# ---- Kafka's messages ----


def record_errors_message(errors: Sequence[tuple[int, str | None]]) -> str:
    """LogValidator.processRecordErrors for INVALID_RECORD (the first three, Java's List)."""
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return (
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]"
    )


INVALID_TIMESTAMP_MESSAGE = "One or more records have been rejected due to invalid timestamp"


def out_of_range(timestamp: int, offset: int, now: int, before: int, after: int) -> str:
    """LogValidator.validateTimestamp's record error for a CreateTime topic."""
    return (
        f"Timestamp {timestamp} of message with offset {offset} is out of range. "
        f"The timestamp should be within [{now - before}, {now + after}]"
    )


# ---- magic 2 batches ----


def kafka_records(
    magic: int, timestamp: int | None, codec: Codec = Codec.NONE, **options: Any
) -> bytes:
    """LogValidatorTest.createRecords: "hello", "there", "beautiful", no keys, one timestamp."""
    values = (b"hello", b"there", b"beautiful")
    return build_batch(
        [(None, value, None, timestamp) for value in values], magic=magic, codec=codec, **options
    )


def patch(raw: bytes, fmt: str, position: int, value: int, *, fix_crc: bool = True) -> bytes:
    """A magic 2 header field overwritten, the CRC recomputed unless `fix_crc` is False (as
    Kafka's LogValidatorTest leaves it: LogValidator alone never reads the batch CRC)."""
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, position, value)
    if fix_crc:
        struct.pack_into(">I", buf, CRC, crc32c.crc32c(bytes(buf[ATTRIBUTES:])))
    return bytes(buf)


def _varint(value: int) -> bytes:
    """`value` zigzag-encoded, whatever its width (a delta beyond int64 takes 10 bytes or more,
    as a hostile client may write it)."""
    zigzag = value << 1 if value >= 0 else ((-value) << 1) - 1
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _sized(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def v2_batch(
    records: Sequence[tuple[int, int, bytes | None, bytes | None]],
    *,
    codec: Codec = Codec.NONE,
    base_offset: int = 0,
    last_offset_delta: int | None = None,
    count: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """A magic 2 batch written field by field: records are (offset delta, timestamp, key,
    value); `last_offset_delta` and `count` default to what the records say."""
    stamps = [timestamp for _, timestamp, _, _ in records]
    first = base_timestamp if base_timestamp is not None else (stamps[0] if stamps else -1)
    body = b""
    for delta, timestamp, key, value in records:
        record = bytes([0]) + _varint(timestamp - first) + _varint(delta)
        record += _sized(key) + _sized(value) + _varint(0)
        body += _varint(len(record)) + record
    if codec is not Codec.NONE:
        body = compress(codec, body)
    if last_offset_delta is None:
        last_offset_delta = max((delta for delta, _, _, _ in records), default=0)
    if count is None:
        count = len(records)
    if max_timestamp is None:
        max_timestamp = max(stamps, default=-1)
    tail = struct.pack(
        ">hiqqqhii",
        attributes | int(codec),
        last_offset_delta,
        first,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    tail += body
    crc = crc32c.crc32c(tail)
    length = 4 + 1 + 4 + len(tail)  # leader epoch, magic, crc, then the rest
    return struct.pack(">qiibI", base_offset, length, -1, 2, crc) + tail


def empty_batch(
    codec: Codec,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    last_offset_delta: int,
    transactional: bool,
    timestamp: int,
) -> bytes:
    """DefaultRecordBatch.writeEmptyHeader: a header with count 0 and no records, the codec
    bits set to `codec` (the compression the broker is told the records use)."""
    return v2_batch(
        [],
        codec=Codec.NONE,
        last_offset_delta=last_offset_delta,
        count=0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=int(codec) | (_TRANSACTIONAL if transactional else 0),
        base_timestamp=timestamp,
        max_timestamp=timestamp,
    )


def end_transaction_marker(producer_id: int, producer_epoch: int, timestamp: int) -> bytes:
    """MemoryRecords.withEndTransactionMarker: a control batch holding one COMMIT marker
    (key: version 0, type 1; value: version 0, coordinator epoch 0)."""
    key = struct.pack(">hh", 0, 1)
    value = struct.pack(">hi", 0, 0)
    return build_batch(
        [(key, value, None, timestamp)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        is_transactional=True,
        is_control=True,
    )


def log_append_time(raw: bytes) -> bytes:
    """The batch with its timestamp type set to LogAppendTime, as a producer may not send it."""
    (attributes,) = struct.unpack_from(">h", raw, ATTRIBUTES)
    return patch(raw, ">h", ATTRIBUTES, attributes | _LOG_APPEND_TIME)


# ---- magic 0/1 messages ----


def legacy_message(
    offset: int,
    magic: int,
    value: bytes | None,
    *,
    key: bytes | None = None,
    timestamp: int = -1,
    attributes: int = 0,
    crc_first_byte: int | None = None,
) -> bytes:
    """LegacyRecord.create written with its log header; `crc_first_byte` overwrites the CRC's
    first byte as LogValidatorTest.checkInvalidChecksum does (`buf.put(CRC_OFFSET, 0)`)."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for data in (key, value):
        body += struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data
    crc = bytearray(struct.pack(">I", zlib.crc32(body)))
    if crc_first_byte is not None:
        assert crc[0] != crc_first_byte, "the overwrite must change the CRC"
        crc[0] = crc_first_byte
    return struct.pack(">qi", offset, 4 + len(body)) + bytes(crc) + body


def legacy_wrapper(
    inner: Sequence[bytes], *, magic: int, codec: Codec, offset: int, timestamp: int = -1
) -> bytes:
    """A compressed magic 0/1 wrapper around `inner` messages, as MemoryRecordsBuilder writes
    it: the wrapper's offset is the last inner offset, its timestamp the largest inner one."""
    payload = compress(codec, b"".join(inner), legacy_lz4_checksum=magic == 0)
    return legacy_message(offset, magic, payload, timestamp=timestamp, attributes=int(codec))


def two_batches(magic: int, codec: Codec) -> bytes:
    """LogValidatorTest.createTwoBatchedRecords: ("1", "a") at offset 0, then ("2", "b") and
    ("3", "c") from offset 1, timestamps 10, 11, 12 (Kafka's MockTime(0, 0) makes them current)."""
    first = build_batch([(b"1", b"a", None, 10)], magic=magic, codec=codec)
    second = build_batch(
        [(b"2", b"b", None, 11), (b"3", b"c", None, 12)], magic=magic, codec=codec, base_offset=1
    )
    return first + second
