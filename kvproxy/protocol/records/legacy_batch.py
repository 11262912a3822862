"""`LegacyBatch`: a magic 0/1 message, maybe a compressed wrapper of inner messages."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import CODEC_MASK, Codec, codec_from_id
from kvproxy.protocol.errors import CorruptRecords
from kvproxy.protocol.records.batch import RecordBatch
from kvproxy.protocol.records.layout import (
    LOG_OVERHEAD,
    MAGIC_POS,
    MIN_LENGTH_BY_MAGIC,
    PREFIX,
    TIMESTAMP_TYPE_BIT,
    V0_HEADER,
    V1_HEADER,
)
from kvproxy.protocol.records.legacy import Message, legacy_record, parse_message
from kvproxy.protocol.records.record import Record, RecordScan


class LegacyBatch(RecordBatch):
    """One magic 0/1 message; when compressed, a wrapper whose value is a message set.

    `base_offset` is the stored offset field (for a compressed wrapper Kafka stores the last
    inner offset there) and `last_offset_delta` is 0: both are readable without decompressing.
    Producer fields are -1 and the transactional/control flags False. Parsed here rather than by
    aiokafka, which hides what the checks read (inner attributes, inner CRCs, Kafka 0.8's lz4
    framing).
    """

    __slots__ = ("_inner_crcs_valid",)

    _inner_crcs_valid: bool | None

    def __init__(self, buffer: memoryview, allowance: Allowance | None = None) -> None:
        super().__init__(buffer, allowance)
        self._inner_crcs_valid = None
        magic = buffer[MAGIC_POS]
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
        self.codec = codec_from_id(attributes & CODEC_MASK)

    @property
    def record_count(self) -> int:
        if self._count is None:
            self._count = sum(1 for _ in self._inner_bounds())
        return self._count

    def plain_size(self) -> int:
        if self.codec is Codec.NONE:
            return len(self.buffer)
        return len(self._inner())

    def inner_crcs_valid(self) -> bool:
        if self.codec is Codec.NONE:
            return True
        if self._inner_crcs_valid is None:
            self._inner_crcs_valid = all(
                message.crc == zlib.crc32(message.body) for message in self._inner_messages()
            )
        return self._inner_crcs_valid

    def bad_inner_crc(self) -> tuple[int, int] | None:
        if self.inner_crcs_valid():
            return None
        for message in self._inner_messages():
            computed = zlib.crc32(message.body)
            if message.crc != computed:
                return message.crc, computed
        return None

    def records(self) -> Iterator[Record]:
        if self.codec is Codec.NONE:
            message = parse_message(self.buffer, 0, len(self.buffer))
            return iter((legacy_record(0, 0, message, message.timestamp),))
        return self._iter_inner()

    def _scan_records(self) -> RecordScan:
        records = tuple(self.records())
        stamps = [r.timestamp for r in records] or [0]
        return RecordScan(
            len(records), min(stamps), max(stamps), sum(1 for r in records if r.key is None)
        )

    def stamps(self) -> Iterator[tuple[int, int]]:
        raise ValueError("stamps() reads magic 2 batches")

    def null_key_indexes(self) -> list[int]:
        return [record.index for record in self.records() if record.key is None]

    def values(self) -> Iterator[bytes | None]:
        return (record.value for record in self.records())

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

    def _inner_messages(self) -> Iterator[Message]:
        inner = self._inner()
        for pos, end in self._inner_bounds():
            yield parse_message(inner, pos, end)
