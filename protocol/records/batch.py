"""`RecordBatch`: a lazy view over one batch or message, decoding its records on demand."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Any

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch

from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import CODEC_MASK, Codec, codec_from_id, decompress
from kvproxy.protocol.errors import CorruptRecords, InvalidRecords
from kvproxy.protocol.records.layout import (
    CONTROL_BIT,
    LOG_OVERHEAD,
    MAGIC_POS,
    MIN_LENGTH_BY_MAGIC,
    PREFIX,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    V0_HEADER,
    V1_HEADER,
    V2_ATTRIBUTES_POS,
    V2_HEADER,
    V2_HEADER_SIZE,
)
from kvproxy.protocol.records.legacy import Message, legacy_record, parse_message
from kvproxy.protocol.records.record import Record, RecordScan
from kvproxy.protocol.records.skim import SKIM_FROM_BYTES_PER_RECORD, skim_v2
from kvproxy.protocol.records.structure import PREMATURE_EOF, RECORDS_REMAINING, v2_structure_error

_tuple_new = tuple.__new__


class RecordBatch:
    """A lazy view over one magic-2 batch or one magic 0/1 message (maybe a compressed wrapper).

    For magic 0/1, `base_offset` is the stored offset field (for a compressed wrapper Kafka stores
    the last inner offset there) and `last_offset_delta` is 0: both are readable without
    decompressing. Producer fields are -1 and the transactional/control flags False.
    """

    __slots__ = (
        "_charged",
        "_count",
        "_inner_crcs_valid",
        "_plain",
        "_scan",
        "allowance",
        "attributes",
        "base_offset",
        "base_sequence",
        "batch_length",
        "buffer",
        "codec",
        "crc",
        "first_timestamp",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition_leader_epoch",
        "producer_epoch",
        "producer_id",
    )

    buffer: memoryview
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    codec: Codec
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    _count: int | None
    _inner_crcs_valid: bool | None
    _plain: memoryview | bytes | bytearray | None
    _scan: RecordScan | None
    allowance: Allowance | None
    """Where the memory of decompressing is counted (None: bounded by the codec's constant)."""
    _charged: int

    def __init__(self, buffer: memoryview, allowance: Allowance | None = None) -> None:
        """Wrap exactly one batch's bytes; use `read_batch` rather than calling this directly."""
        self.buffer = buffer
        self.allowance = allowance
        self._charged = 0
        self._inner_crcs_valid = None
        self._plain = None
        self._scan = None
        magic = buffer[MAGIC_POS]
        if magic == 2:
            (
                self.base_offset,
                self.batch_length,
                self.partition_leader_epoch,
                self.magic,
                self.crc,
                self.attributes,
                self.last_offset_delta,
                self.first_timestamp,
                self.max_timestamp,
                self.producer_id,
                self.producer_epoch,
                self.base_sequence,
                self._count,
            ) = V2_HEADER.unpack_from(buffer)
        else:
            if magic == 1:
                offset, length, crc, _, attributes, timestamp = V1_HEADER.unpack_from(buffer)
            else:
                offset, length, crc, _, attributes = V0_HEADER.unpack_from(buffer)
                timestamp = -1
            self.base_offset = offset
            self.batch_length = length
            self.partition_leader_epoch = -1
            self.magic = magic
            self.crc = crc
            self.attributes = attributes
            self.last_offset_delta = 0
            self.first_timestamp = timestamp
            self.max_timestamp = timestamp
            self.producer_id = -1
            self.producer_epoch = -1
            self.base_sequence = -1
            self._count = None if attributes & CODEC_MASK else 1
        self.codec = codec_from_id(self.attributes & CODEC_MASK)

    def __repr__(self) -> str:
        return (
            f"RecordBatch(magic={self.magic}, base_offset={self.base_offset}, "
            f"size={self.size}, codec={self.codec.name}, crc={self.crc:#010x})"
        )

    @property
    def size(self) -> int:
        """Bytes the batch occupies, offset and length prefix included."""
        return len(self.buffer)

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime (always 0 for magic 0, which has no timestamps)."""
        if self.magic == 0:
            return 0
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return self.magic == 2 and bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return self.magic == 2 and bool(self.attributes & CONTROL_BIT)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def record_count(self) -> int:
        """Magic 2: the header's count. Magic 0/1: 1, or the inner messages of a wrapper
        (counted by their length fields, without parsing them)."""
        if self._count is None:
            self._count = self._count_inner()
        return self._count

    @property
    def counted_records(self) -> int:
        """`record_count` when it is known without decoding anything more; 1 for a compressed
        wrapper whose inner messages were never counted (it did not decode, or would have
        needed more memory than allowed). For the metrics, which must not decode on their own."""
        return self._count if self._count is not None else 1

    def plain_size(self) -> int:
        """Bytes of the batch once decompressed (decompressing it, once, if it is compressed)."""
        if self.codec is Codec.NONE:
            return len(self.buffer)
        return len(self._plain_v2() if self.magic == 2 else self._inner())

    def release(self) -> None:
        """Drop the decompressed bytes kept for a second pass and give their memory back."""
        self._plain = None
        if self._charged and self.allowance is not None:
            self.allowance.give_back(self._charged)
        self._charged = 0

    def computed_crc(self) -> int:
        """CRC32C over attributes..end (magic 2); CRC32 over magic..end (magic 0/1)."""
        if self.magic == 2:
            return int(crc32c.crc32c(self.buffer[V2_ATTRIBUTES_POS:]))
        return zlib.crc32(self.buffer[MAGIC_POS:])

    def crc_valid(self) -> bool:
        return self.computed_crc() == self.crc

    def inner_crcs_valid(self) -> bool:
        """Whether every inner message of a compressed magic 0/1 wrapper has a valid CRC.

        True when there are no inner messages (magic 2, or an uncompressed message).
        """
        if self.magic == 2 or self.codec is Codec.NONE:
            return True
        if self._inner_crcs_valid is None:
            self._inner_crcs_valid = all(
                message.crc == zlib.crc32(message.body) for message in self._inner_messages()
            )
        return self._inner_crcs_valid

    def bad_inner_crc(self) -> tuple[int, int] | None:
        """(stored, computed) CRC of the first inner message of a compressed magic 0/1 wrapper
        whose CRC does not match; None when all match (or there are no inner messages)."""
        if self.inner_crcs_valid():
            return None
        for message in self._inner_messages():
            computed = zlib.crc32(message.body)
            if message.crc != computed:
                return message.crc, computed
        return None

    def records(self) -> Iterator[Record]:
        """Decode the records, decompressing first when needed; bad bytes raise CorruptRecords."""
        if self.magic == 2:
            return self._records_v2()
        return self._records_legacy()

    # -- magic 2 -------------------------------------------------------------------------------

    def scan(self) -> RecordScan:
        """Count, timestamp range and null keys of the records, in one pass; cached.

        Magic 2 reads each record with the C reader and keeps only those figures (about three
        times the rate of building `Record`s); bad bytes raise CorruptRecords as `records()` does.
        """
        if self._scan is None:
            if self.magic == 2:
                self._scan = self._scan_v2()
            else:
                records = tuple(self.records())
                stamps = [r.timestamp for r in records] or [0]
                self._scan = RecordScan(
                    len(records),
                    min(stamps),
                    max(stamps),
                    sum(1 for r in records if r.key is None),
                )
        return self._scan

    def _scan_v2(self) -> RecordScan:
        count = self._checked_count()
        low = high = 0
        null_keys = 0
        index = 0
        plain = self._plain_v2()  # outside the try: a decompression error is its own
        if len(plain) - V2_HEADER_SIZE >= count * SKIM_FROM_BYTES_PER_RECORD:  # large records
            log_append = self.timestamp_type == 1
            skimmed = skim_v2(plain, count, self.first_timestamp, self.max_timestamp, log_append)
            if skimmed is not None:
                return skimmed
        try:
            for raw in DefaultRecordBatch(plain):
                timestamp = raw.timestamp
                if index == 0:
                    low = high = timestamp
                elif timestamp < low:
                    low = timestamp
                elif timestamp > high:
                    high = timestamp
                if raw.key is None:
                    null_keys += 1
                index += 1
        except Exception as exc:  # aiokafka's CorruptRecordException, struct.error, ...
            raise self._undecodable(index, exc) from exc
        self._check_read(index, count)
        return RecordScan(count, low, high, null_keys)

    def stamps(self) -> Iterator[tuple[int, int]]:
        """Magic 2: each record's (offset delta, timestamp), read with the C reader, no `Record`
        built; bad bytes raise CorruptRecords as `records()` does."""
        if self.magic != 2:
            raise ValueError("stamps() reads magic 2 batches")
        base_offset = self.base_offset
        return ((raw.offset - base_offset, raw.timestamp) for raw in self._raw_records())

    def null_key_indexes(self) -> list[int]:
        """The 0-based indexes of the records without a key (magic 2: read with the C reader,
        no `Record` built); bad bytes raise CorruptRecords as `records()` does."""
        if self.magic != 2:
            return [record.index for record in self.records() if record.key is None]
        if self._scan is not None and self._scan.null_keys == 0:
            return []
        return [index for index, raw in enumerate(self._raw_records()) if raw.key is None]

    def _raw_records(self) -> Iterator[Any]:
        """aiokafka's records of a magic 2 batch, its errors as CorruptRecords, the count
        checked at the end (for the rejection paths: `scan` keeps its own loop, it is hot)."""
        count = self._checked_count()
        index = 0
        plain = self._plain_v2()  # outside the try: a decompression error is its own
        try:
            for raw in DefaultRecordBatch(plain):
                yield raw
                index += 1
        except Exception as exc:  # aiokafka's CorruptRecordException, struct.error, ...
            raise self._undecodable(index, exc) from exc
        self._check_read(index, count)

    def values(self) -> Iterator[bytes | None]:
        """Each record's value, without building `Record`s (for checks that read only values);
        bad bytes raise CorruptRecords as `records()` does."""
        if self.magic != 2:
            return (record.value for record in self.records())
        return self._values_v2()

    def _values_v2(self) -> Iterator[bytes | None]:
        count = self._checked_count()
        index = 0
        plain = self._plain_v2()  # outside the try: a decompression error is its own
        try:
            for raw in DefaultRecordBatch(plain):
                yield raw.value
                index += 1
        except Exception as exc:  # aiokafka's CorruptRecordException, struct.error, ...
            raise self._undecodable(index, exc) from exc
        self._check_read(index, count)

    def _undecodable(self, index: int, exc: Exception) -> CorruptRecords:
        """What a record the reader could not read means: for magic 2, Kafka's reason
        (`InvalidRecords`, from the records' length prefixes); else CorruptRecords."""
        if self.magic == 2 and self._plain is not None and self._count is not None:
            return InvalidRecords(
                v2_structure_error(
                    self._plain, self._count, compressed=self.codec is not Codec.NONE
                )
            )
        return CorruptRecords(
            f"record {index} of batch at offset {self.base_offset} does not decode: {exc}"
        )

    def _check_read(self, index: int, count: int) -> None:
        """The reader stopped after `index` records: the header said `count`."""
        if index != count:
            raise InvalidRecords(PREMATURE_EOF if index < count else RECORDS_REMAINING)

    def _checked_count(self) -> int:
        count = self._count
        if count is None or count < 0:
            raise CorruptRecords(f"invalid record count {count} in batch at {self.base_offset}")
        return count

    def _plain_v2(self) -> memoryview | bytes | bytearray:
        """The batch with its records uncompressed (decompressed once, kept for a second pass,
        counted in the allowance until `release`)."""
        if self._plain is None:
            if self.codec is Codec.NONE:
                self._plain = self.buffer
            else:
                plain = self._decompress(self.buffer[V2_HEADER_SIZE:], V2_HEADER_SIZE)
                plain[:V2_HEADER_SIZE] = self.buffer[:V2_HEADER_SIZE]
                struct.pack_into(">h", plain, V2_ATTRIBUTES_POS, self.attributes & ~CODEC_MASK)
                self._plain = plain
        return self._plain

    def _decompress(self, payload: memoryview, headroom: int = 0) -> bytearray | memoryview:
        allowance = self.allowance
        held = 0 if allowance is None else allowance.held
        plain = decompress(
            self.codec,
            payload,
            legacy_lz4_checksum=self.magic == 0,
            allowance=allowance,
            headroom=headroom,
            what=f"the batch at offset {self.base_offset} ({self.codec.name.lower()}, "
            f"{len(self.buffer)} bytes)",
        )
        if allowance is not None:
            self._charged += allowance.held - held
        return plain

    def _records_v2(self) -> Iterator[Record]:
        count = self._checked_count()
        return self._iter_v2(self._plain_v2(), count)

    def _iter_v2(self, source: memoryview | bytes | bytearray, count: int) -> Iterator[Record]:
        base_offset = self.base_offset
        new = _tuple_new
        index = 0
        try:
            for raw in DefaultRecordBatch(source):
                headers = raw.headers
                yield new(
                    Record,
                    (
                        index,
                        raw.offset - base_offset,
                        raw.timestamp,
                        raw.key,
                        raw.value,
                        tuple(headers) if headers else (),
                        2,
                        0,
                    ),
                )
                index += 1
        except CorruptRecords:
            raise
        except Exception as exc:  # aiokafka's CorruptRecordException, UnicodeDecodeError, ...
            raise self._undecodable(index, exc) from exc
        self._check_read(index, count)

    # -- magic 0 / 1 ---------------------------------------------------------------------------

    def _records_legacy(self) -> Iterator[Record]:
        if self.codec is Codec.NONE:
            message = parse_message(self.buffer, 0, len(self.buffer))
            return iter((legacy_record(0, 0, message, message.timestamp),))
        return self._iter_inner()

    def _iter_inner(self) -> Iterator[Record]:
        log_append = self.magic == 1 and self.attributes & TIMESTAMP_TYPE_BIT
        for index, message in enumerate(self._inner_messages()):
            timestamp = self.max_timestamp if log_append else message.timestamp
            yield legacy_record(index, message.offset, message, timestamp)

    def _inner(self) -> memoryview:
        """A compressed wrapper's inner message set (decompressed once, kept as `_plain`)."""
        if self._plain is None:
            wrapper = parse_message(self.buffer, 0, len(self.buffer))
            if wrapper.value is None:
                raise CorruptRecords(
                    f"compressed message at offset {self.base_offset} has no value"
                )
            self._plain = self._decompress(memoryview(wrapper.value))
        return memoryview(self._plain)

    def _inner_bounds(self) -> Iterator[tuple[int, int]]:
        """(start, end) of each inner message, read from the length fields only."""
        inner = self._inner()
        pos = 0
        while pos < len(inner):
            if len(inner) - pos < LOG_OVERHEAD + MIN_LENGTH_BY_MAGIC[0]:
                raise CorruptRecords(f"inner message cut off at byte {pos} of the wrapper")
            (_, length) = PREFIX.unpack_from(inner, pos)
            end = pos + LOG_OVERHEAD + length
            if length < MIN_LENGTH_BY_MAGIC[0] or end > len(inner):
                raise CorruptRecords(f"inner message at byte {pos} has bad length {length}")
            yield pos, end
            pos = end

    def _count_inner(self) -> int:
        return sum(1 for _ in self._inner_bounds())

    def _inner_messages(self) -> Iterator[Message]:
        inner = self._inner()
        for pos, end in self._inner_bounds():
            yield parse_message(inner, pos, end)
