"""`RecordBatch`: a lazy view over one batch or message; what both formats share.

The records are read by the format's own class: `V2Batch` (magic 2, `batch_v2`) and
`LegacyBatch` (magic 0/1, `legacy_batch`); `read_batch` picks one by the magic byte.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator

import crc32c

from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import Codec, decompress
from kvproxy.protocol.records.layout import (
    CONTROL_BIT,
    MAGIC_POS,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    V2_ATTRIBUTES_POS,
)
from kvproxy.protocol.records.record import Record, RecordScan


class RecordBatch(ABC):
    """A lazy view over one magic-2 batch or one magic 0/1 message (maybe a compressed wrapper):
    the header fields, read when it is made, and the records, decoded only when asked for."""

    __slots__ = (
        "_charged",
        "_count",
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
    _plain: memoryview | bytes | bytearray | None
    _scan: RecordScan | None
    allowance: Allowance | None
    """Where the memory of decompressing is counted (None: bounded by the codec's constant)."""
    _charged: int

    def __init__(self, buffer: memoryview, allowance: Allowance | None) -> None:
        """Wrap exactly one batch's bytes; use `read_batch` rather than calling this directly."""
        self.buffer = buffer
        self.allowance = allowance
        self._charged = 0
        self._plain = None
        self._scan = None

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
    @abstractmethod
    def record_count(self) -> int:
        """Magic 2: the header's count. Magic 0/1: 1, or the inner messages of a wrapper
        (counted by their length fields, without parsing them)."""

    @property
    def counted_records(self) -> int:
        """`record_count` when it is known without decoding anything more; 1 for a compressed
        wrapper whose inner messages were never counted (it did not decode, or would have
        needed more memory than allowed). For the metrics, which must not decode on their own."""
        return self._count if self._count is not None else 1

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

    def scan(self) -> RecordScan:
        """Count, timestamp range and null keys of the records, in one pass; cached.

        Magic 2 reads each record with the C reader and keeps only those figures (about three
        times the rate of building `Record`s); bad bytes raise CorruptRecords as `records()` does.
        """
        if self._scan is None:
            self._scan = self._scan_records()
        return self._scan

    def _decompress(self, payload: memoryview, headroom: int = 0) -> bytearray | memoryview:
        """`payload` decompressed, its memory counted in the allowance until `release`."""
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

    @abstractmethod
    def records(self) -> Iterator[Record]:
        """Decode the records, decompressing first when needed; bad bytes raise CorruptRecords."""

    @abstractmethod
    def values(self) -> Iterator[bytes | None]:
        """Each record's value, without building `Record`s where the format allows (for checks
        that read only values); bad bytes raise CorruptRecords as `records()` does."""

    @abstractmethod
    def stamps(self) -> Iterator[tuple[int, int]]:
        """Magic 2: each record's (offset delta, timestamp), read with the C reader, no `Record`
        built; bad bytes raise CorruptRecords as `records()` does. ValueError for magic 0/1."""

    @abstractmethod
    def null_key_indexes(self) -> list[int]:
        """The 0-based indexes of the records without a key; bad bytes raise CorruptRecords as
        `records()` does."""

    @abstractmethod
    def plain_size(self) -> int:
        """Bytes of the batch once decompressed (decompressing it, once, if it is compressed)."""

    @abstractmethod
    def inner_crcs_valid(self) -> bool:
        """Whether every inner message of a compressed magic 0/1 wrapper has a valid CRC.

        True when there are no inner messages (magic 2, or an uncompressed message).
        """

    @abstractmethod
    def bad_inner_crc(self) -> tuple[int, int] | None:
        """(stored, computed) CRC of the first inner message of a compressed magic 0/1 wrapper
        whose CRC does not match; None when all match (or there are no inner messages)."""

    @abstractmethod
    def _scan_records(self) -> RecordScan:
        """What `scan` returns, read from the records."""
