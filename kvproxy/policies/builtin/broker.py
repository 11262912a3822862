"""The checks a Kafka broker makes on produce, with the broker's codes and wording.

Sources (apache/kafka): `ProduceRequest.validateRecords` (per-version batch rules),
`UnifiedLog.analyzeAndValidateRecords` (base offset, CRC), `LogValidator.validateBatch`,
`validateRecord`, `validateKey`, `validateTimestamp`, `validateRecordCompression` and
`processRecordErrors` (record-level rules and the batch message). Where the broker's message
embeds a Java `toString()` of a record, `java_record` reproduces it (exactly for magic 2's
`DefaultRecord`, and `PartialDefaultRecord` in a compressed batch; for legacy records without
the inner CRC, which the batch view does not expose).

The broker's own checks (`batch_integrity`, `crc`, `message_format`, `compacted_key`,
`timestamps`, `producer_state`) run together in the chain's group `broker_checks`, each stage at
its place in Kafka's order (`stages`: 10 the request, 20 the CRC, 30 the batch's fields, 40 the
message format, 50 the record count, 60-80 the records, 90 segment.bytes, 100 the producer).
"""

from __future__ import annotations

from kvproxy.policies.accept_form import ANY_PARTITION, AcceptForm
from kvproxy.policies.api import (
    ACCEPT,
    INVALID_RECORD_REJECTION,
    MISSING_KEY,
    Need,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    Stage,
    TopicConfig,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.protocol import error_codes
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import Record, RecordBatch
from kvproxy.protocol.records.offsets import record_offset

__all__ = [
    "BROKER_CHECKS",
    "BatchIntegrityPolicy",
    "CompactedKeyPolicy",
    "CrcPolicy",
    "MessageFormatPolicy",
    "OffsetsPolicy",
    "java_record",
]

BROKER_CHECKS = "broker_checks"
"""The chain's group of the broker's own checks (`kvproxy.policies.groups`)."""

LONG_MAX = 9223372036854775807
_CODEC_MASK = 0x07
_CONTROL_BIT = 0x20
_CREATE_TIME = "CreateTime"
_LOG_APPEND_TIME = "LogAppendTime"


def java_record(batch: RecordBatch, record: Record, offset: int) -> str:
    """Java's `toString()` of the record (DefaultRecord / LegacyRecordBatch)."""
    key_len = 0 if record.key is None else len(record.key)
    value_len = 0 if record.value is None else len(record.value)
    if record.magic == 2:
        if batch.codec is not Codec.NONE:
            # LogValidator reads a compressed batch it appends as it is with
            # skipKeyValueIterator: PartialDefaultRecord, whose sizes say -1 for null
            key_size = -1 if record.key is None else key_len
            value_size = -1 if record.value is None else value_len
            return (
                f"PartialDefaultRecord(offset={offset}, timestamp={record.timestamp}, "
                f"key={key_size} bytes, value={value_size} bytes)"
            )
        return (
            f"DefaultRecord(offset={offset}, timestamp={record.timestamp}, "
            f"key={key_len} bytes, value={value_len} bytes)"
        )
    codec_id = record.attributes & _CODEC_MASK
    codec = Codec(codec_id).name.lower() if codec_id <= max(Codec) else f"unknown({codec_id})"
    ts = ""
    if record.magic > 0:
        kind = _LOG_APPEND_TIME if record.attributes & 0x08 else _CREATE_TIME
        ts = f"{kind}={record.timestamp}, "
    return (
        f"LegacyRecordBatch(offset={offset}, Record(magic={record.magic}, "
        f"attributes={record.attributes}, compression={codec}, {ts}"
        f"key={key_len} bytes, value={value_len} bytes))"
    )


def _last_inner_offsets(produced: ProducedRecords) -> dict[int, int]:
    """Per batch position: the last inner offset of a magic 1 wrapper (see `record_offset`)."""
    out: dict[int, int] = {}
    pos = 0
    records = produced.record_tuple()
    for i, batch in enumerate(produced.batches):
        count = batch.record_count
        if batch.magic == 1 and batch.codec is not Codec.NONE and count:
            out[i] = records[pos + count - 1].offset_delta
        pos += count
    return out


def _iter_with_offsets(
    produced: ProducedRecords,
) -> list[tuple[RecordBatch, Record, int]]:
    last = _last_inner_offsets(produced)
    records = produced.record_tuple()
    out: list[tuple[RecordBatch, Record, int]] = []
    pos = 0
    for i, batch in enumerate(produced.batches):
        count = batch.record_count
        li = last.get(i, 0)
        for record in records[pos : pos + count]:
            out.append((batch, record, record_offset(batch, record, li)))
        pos += count
    return out


def _invalid(message: str) -> Verdict:
    return Verdict(error_codes.INVALID_RECORD, message)


class BatchIntegrityPolicy(BuiltinPolicy):
    """Structure of what a partition carries, in the broker's order of checks.

    The stages run in Kafka's order: `check_request` (ProduceRequest.validateRecords, the base
    offset and max.message.bytes of UnifiedLog.analyzeAndValidateRecords, which come before the
    CRC), `check_batches` (LogValidator.validateBatch), `check_count` (the record iterators: the
    records present against the header's count), `record_errors` (magic and compression of
    legacy inner records) and `check_append` (segment.bytes). In a chain they run interleaved
    with the other broker checks (group `broker_checks`); alone, `validate` runs them in that
    order.
    """

    name = "batch_integrity"
    judges_parsing = True  # bytes that are not batches are refused in its name
    needs = frozenset({Need.TOPIC_CONFIG})
    topic_settings = frozenset({"max_message_bytes", "segment_bytes"})
    group = BROKER_CHECKS
    stages = (
        Stage(10, "check_request"),
        Stage(30, "check_batches"),
        Stage(50, "check_count"),
        Stage(60, "record_errors", error_codes.INVALID_RECORD, INVALID_RECORD_REJECTION),
        Stage(90, "check_append"),
    )
    OPTIONS = {"check_count": True}

    def setup(self) -> None:
        self.count_checked = self._bool_option("check_count")

    def accept_form(self, config: TopicConfig) -> AcceptForm:
        """The plain shape is its every check but the two sizes the topic sets."""
        return AcceptForm(config.max_message_bytes, config.segment_bytes)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for stage in (self.check_request, self.check_batches, self.check_count):
            verdict = stage(batch)
            if verdict.code:
                return verdict
        errors = self.record_errors(batch)
        if errors:
            return record_errors_verdict(errors)
        return self.check_append(batch)

    def check_request(self, batch: ProducedRecords) -> Verdict:
        """ProduceRequest.validateRecords, then UnifiedLog's base offset and batch size."""
        version = batch.produce_version
        batches = batch.batches
        # ProduceRequest.validateRecords (KafkaApis, before the log is touched)
        if version >= 3:
            if not batches:
                return _invalid(
                    f"Produce requests with version {version} must have at least one record "
                    "batch per partition"
                )
            first = batches[0]
            if first.magic != 2:
                return _invalid(
                    f"Produce requests with version {version} are only allowed to contain "
                    "record batches with magic version 2"
                )
            if version < 7 and first.codec is Codec.ZSTD:
                return Verdict(
                    error_codes.UNSUPPORTED_COMPRESSION_TYPE,
                    f"Produce requests with version {version} are not allowed to use "
                    "ZStandard compression",
                )
            if len(batches) > 1:
                return _invalid(
                    f"Produce requests with version {version} are only allowed to contain "
                    "exactly one record batch per partition"
                )
        # UnifiedLog.analyzeAndValidateRecords (a stored batch carries its assigned offsets)
        max_bytes = batch.topic_config.max_message_bytes
        for b in batches:
            if not batch.stored and b.magic >= 2 and b.base_offset != 0:
                return _invalid(
                    f"The baseOffset of the record batch in the append to "
                    f"{batch.topic_partition} should be 0, but it is {b.base_offset}"
                )
            if max_bytes is not None and b.size > max_bytes:
                return Verdict(
                    error_codes.MESSAGE_TOO_LARGE,
                    f"The record batch size in the append to {batch.topic_partition} is "
                    f"{b.size} bytes which exceeds the maximum configured value of {max_bytes}.",
                )
        return ACCEPT

    def check_batches(self, batch: ProducedRecords) -> Verdict:
        """LogValidator: one batch when compressed or magic 2, then `validateBatch` each."""
        batches = batch.batches
        if not batches:
            return ACCEPT  # v0-v2: the log appends nothing and answers success
        # LogValidator.getFirstBatchAndMaybeValidateNoMoreBatches
        first = batches[0]
        if (first.magic >= 2 or batches[-1].codec is not Codec.NONE) and len(batches) > 1:
            return _invalid("Compressed outer record has more than one batch")
        for b in batches:
            verdict = self._validate_batch(first, b, batch)
            if verdict.code:
                return verdict
        return ACCEPT

    def check_count(self, batch: ProducedRecords) -> Verdict:
        """The records of each magic 2 batch read to the end, as many as its header counts.

        Kafka's record iterators refuse a batch that holds fewer or more records than it declares
        (INVALID_RECORD); a one-pass scan with the C reader (cached: the timestamps and key
        checks read the same scan) finds it whatever other policy decodes records. A mismatch
        raises `InvalidRecords`, which the chain answers with Kafka's words. With the option
        `check_count: false` the batch goes to the broker unread (the broker refuses it).
        """
        if not self.count_checked:
            return ACCEPT
        for b in batch.batches:
            if b.magic == 2:
                b.scan()
        return ACCEPT

    def check_append(self, batch: ProducedRecords) -> Verdict:
        """UnifiedLog.append: the partition's records must fit in one segment (segment.bytes)."""
        limit = batch.topic_config.segment_bytes
        size = len(batch.raw)
        if limit is not None and size > limit:
            return Verdict(
                error_codes.RECORD_LIST_TOO_LARGE,
                f"Message batch size is {size} bytes in append to partition "
                f"{batch.topic_partition}, which exceeds the maximum configured segment size "
                f"of {limit}.",
            )
        return ACCEPT

    @staticmethod
    def _validate_batch(first: RecordBatch, b: RecordBatch, produced: ProducedRecords) -> Verdict:
        """One batch; the common, valid case touches each header field once and builds no text."""
        stored = produced.stored
        magic = b.magic
        if (
            magic == 2
            and magic == first.magic
            and b.last_offset_delta + 1 == b.record_count > 0
            and not b.attributes & _CONTROL_BIT
            and (b.producer_id < 0 or b.base_sequence >= 0)
        ):
            return ACCEPT
        tp = produced.topic_partition
        if b.magic != first.magic:
            return _invalid(
                f"Batch magic {b.magic} is not the same as the first batch's magic byte "
                f"{first.magic} in topic partition {tp}"
            )
        if b.magic >= 2:
            count_from_offsets = b.last_offset - b.base_offset + 1
            if count_from_offsets <= 0:
                return _invalid(
                    f"Batch has an invalid offset range: [{b.base_offset}, {b.last_offset}] "
                    f"in topic partition {tp}"
                )
            count = b.record_count
            # In a log the cleaner may empty a batch or remove records from it, never add any.
            if count <= 0 and not (stored and count == 0):
                return _invalid(
                    f"Invalid reported count for record batch: {count} in topic partition {tp}"
                )
            if count_from_offsets != count and not (stored and count < count_from_offsets):
                return _invalid(
                    f"Inconsistent batch offset range [{b.base_offset}, {b.last_offset}] and "
                    f"count of records {count} in topic partition {tp}"
                )
        if b.is_control and not stored:  # in a log, transaction markers are the broker's own
            return _invalid(
                f"Clients are not allowed to write control records in topic partition {tp}"
            )
        if b.has_producer_id and b.base_sequence < 0:
            return _invalid(
                f"Invalid sequence number {b.base_sequence} in record batch with producerId "
                f"{b.producer_id} in topic partition {tp}"
            )
        return ACCEPT

    @staticmethod
    def record_errors(produced: ProducedRecords) -> RecordErrorList | None:
        """Inner records: magic equal to the batch's; no compression bits inside a wrapper."""
        if all(b.magic == 2 for b in produced.batches):
            return None  # DefaultRecords carry neither their own magic nor attributes
        tp = produced.topic_partition
        errors = RecordErrorList()
        for b, record, offset in _iter_with_offsets(produced):
            if b.codec is not Codec.NONE and record.attributes & _CODEC_MASK:
                errors.append(
                    RecordError(
                        record.index,
                        "Compressed outer record should not have an inner record with a "
                        f"compression attribute set: {java_record(b, record, offset)}",
                    )
                )
            elif record.magic != b.magic:
                errors.append(
                    RecordError(
                        record.index,
                        f"Record {java_record(b, record, offset)}'s magic does not match outer "
                        f"magic {b.magic} in topic partition {tp}",
                    )
                )
        return errors or None


class CrcPolicy(BuiltinPolicy):
    """CRC32C of magic 2 batches, CRC32 of magic 0/1 messages and of a wrapper's inner ones."""

    name = "crc"
    group = BROKER_CHECKS
    stages = (Stage(20),)

    def accept_form(self, config: TopicConfig) -> AcceptForm:
        return ANY_PARTITION  # the fast accept checks every batch's CRC32C

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for b in batch.batches:
            if not b.crc_valid():
                return Verdict(
                    error_codes.CORRUPT_MESSAGE,
                    f"Record is corrupt (stored crc = {b.crc}) in topic partition "
                    f"{batch.topic_partition}.",
                )
            bad = b.bad_inner_crc()
            if bad is not None:
                # LogValidator: record.ensureValid() inside a compressed magic 0/1 wrapper
                # (LegacyRecord's own words, rethrown as they are: no topic partition)
                return Verdict(
                    error_codes.CORRUPT_MESSAGE,
                    f"Record is corrupt (stored crc = {bad[0]}, computed crc = {bad[1]})",
                )
        return ACCEPT


class OffsetsPolicy(BuiltinPolicy):
    """Relative offsets count up from 0: magic 2 offset deltas, magic 1 wrappers' inner offsets.

    Stricter than today's broker, which rewrites a magic 1 wrapper with bad inner offsets
    (Kafka 0.10 rejected it with the wording used here) and never looks at magic 2 deltas.
    Magic 0 wrappers hold absolute inner offsets and are not checked (nor does Kafka). In a log
    (`stored`), where the cleaner may have removed records, offsets need only go up.
    """

    name = "offsets"

    def accept_form(self, config: TopicConfig) -> AcceptForm:
        return ANY_PARTITION  # the fast accept wants the deltas 0, 1, ... exactly

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        if not any(
            b.magic == 2 or (b.magic == 1 and b.codec is not Codec.NONE) for b in batch.batches
        ):
            return ACCEPT
        tp = batch.topic_partition
        errors: list[RecordError] = RecordErrorList()
        records = batch.record_tuple()
        pos = 0
        for b in batch.batches:
            count = b.record_count
            checked = b.magic == 2 or (b.magic == 1 and b.codec is not Codec.NONE)
            if checked:
                last_inner = records[pos + count - 1].offset_delta if count else 0
                previous = -1
                for position, record in enumerate(records[pos : pos + count]):
                    delta = record.offset_delta
                    # A cleaned log batch may skip offsets, but they still only go up.
                    expected = previous + 1 if batch.stored else position
                    in_order = delta >= expected if batch.stored else delta == expected
                    previous = delta
                    if not in_order:
                        offset = record_offset(b, record, last_inner)
                        errors.append(
                            RecordError(
                                record.index,
                                f"Inner record {java_record(b, record, offset)} inside the "
                                "compressed record batch does not have incremental offsets, "
                                f"expected offset is {expected} in topic partition {tp}.",
                            )
                        )
            pos += count
        return record_errors_verdict(errors) if errors else ACCEPT


class CompactedKeyPolicy(BuiltinPolicy):
    """LogValidator.validateKey: every record of a compacted topic needs a key."""

    name = "compacted_key"
    needs = frozenset({Need.TOPIC_CONFIG})
    topic_settings = frozenset({"compacted"})
    group = BROKER_CHECKS
    stages = (Stage(70, "record_errors", error_codes.INVALID_RECORD, MISSING_KEY),)

    def accept_form(self, config: TopicConfig) -> AcceptForm:
        return AcceptForm(keys_required=config.compacted is True)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        errors = self.record_errors(batch)
        if not errors:
            return ACCEPT
        return record_errors_verdict(errors, rejection=MISSING_KEY)

    @staticmethod
    def record_errors(batch: ProducedRecords) -> RecordErrorList | None:
        """The records without a key, on a compacted topic; None if none."""
        if batch.compacted is not True:
            return None
        if all(b.scan().null_keys == 0 for b in batch.batches):
            return None
        # no final period since Kafka 3.5 (KAFKA-14477)
        message = (
            "Compacted topic cannot accept message without key in topic partition "
            f"{batch.topic_partition}"
        )
        errors = RecordErrorList()
        start = 0  # record indexes run across the partition's batches
        for b in batch.batches:  # the null keys' indexes, without decoding every record
            for index in b.null_key_indexes():
                errors.append(RecordError(start + index, message))
            start += max(b.record_count, 0)
        return errors


class MessageFormatPolicy(BuiltinPolicy):
    """Idempotent/transactional batches need magic 2 (43); optional minimum magic per topic.

    `topic_magic` is the topic's message format (Kafka's `toMagic`, 2 since Kafka 3.0; older
    brokers took it from message.format.version).
    """

    name = "message_format"
    group = BROKER_CHECKS
    stages = (Stage(40),)
    OPTIONS = {"min_magic": 0, "topic_magic": 2}

    def setup(self) -> None:
        self.min_magic = self._int_option("min_magic", minimum=0)
        self.topic_magic = self._int_option("topic_magic", minimum=0)
        if self.min_magic > 2 or self.topic_magic > 2:
            raise self._error("magic versions are 0, 1 or 2")

    def accept_form(self, config: TopicConfig) -> AcceptForm | None:
        """Magic 2 passes unless the topic's format is older (then idempotent batches fail)."""
        return ANY_PARTITION if self.topic_magic == 2 else None

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for b in batch.batches:
            to_magic = min(self.topic_magic, b.magic)
            if b.is_transactional and to_magic < 2:
                return Verdict(
                    error_codes.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                    f"Transactional records cannot be used with magic version {to_magic}",
                )
            if b.has_producer_id and to_magic < 2:
                return Verdict(
                    error_codes.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                    f"Idempotent records cannot be used with magic version {to_magic}",
                )
            if b.magic < self.min_magic:
                return _invalid(
                    f"Record batch magic {b.magic} is below the minimum magic version "
                    f"{self.min_magic} of topic partition {batch.topic_partition}"
                )
        return ACCEPT
