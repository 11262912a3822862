"""`V2Batch`: a magic-2 record batch, its records read by aiokafka's C reader (scanned by the
skim of skim.py when it can)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatch

from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import CODEC_MASK, Codec, codec_from_id
from kvproxy.protocol.errors import CorruptRecords, InvalidRecords
from kvproxy.protocol.records.batch import RecordBatch
from kvproxy.protocol.records.layout import V2_ATTRIBUTES_POS, V2_HEADER, V2_HEADER_SIZE
from kvproxy.protocol.records.record import Record, RecordScan
from kvproxy.protocol.records.skim import SKIM_FROM_BYTES_PER_RECORD, skim_v2, values_v2
from kvproxy.protocol.records.structure import PREMATURE_EOF, RECORDS_REMAINING, v2_structure_error

_tuple_new = tuple.__new__


class V2Batch(RecordBatch):
    """A magic-2 batch: the header is read when it is made, the records (decompressed once, kept
    for a second pass until `release`) when asked for. Bad bytes raise CorruptRecords, or
    InvalidRecords with Kafka's reason when the records' length prefixes explain them."""

    __slots__ = ()

    _count: int

    def __init__(self, buffer: memoryview, allowance: Allowance | None = None) -> None:
        super().__init__(buffer, allowance)
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
        self.codec = codec_from_id(self.attributes & CODEC_MASK)

    @property
    def record_count(self) -> int:
        return self._count

    def plain_size(self) -> int:
        if self.codec is Codec.NONE:
            return len(self.buffer)
        return len(self._plain_v2())

    def inner_crcs_valid(self) -> bool:
        return True

    def bad_inner_crc(self) -> tuple[int, int] | None:
        return None

    def records(self) -> Iterator[Record]:
        count = self._checked_count()
        return self._iter_records(self._plain_v2(), count)

    def _scan_records(self) -> RecordScan:
        count = self._checked_count()
        low = high = 0
        null_keys = 0
        index = 0
        plain = self._plain_v2()  # outside the try: a decompression error is its own
        # the skim, compiled, reads every batch; in pure Python only batches of large records
        if len(plain) - V2_HEADER_SIZE >= count * SKIM_FROM_BYTES_PER_RECORD:
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
        base_offset = self.base_offset
        return ((raw.offset - base_offset, raw.timestamp) for raw in self._raw_records())

    def null_key_indexes(self) -> list[int]:
        if self._scan is not None and self._scan.null_keys == 0:
            return []
        return [index for index, raw in enumerate(self._raw_records()) if raw.key is None]

    def _raw_records(self) -> Iterator[Any]:
        """aiokafka's records, its errors as CorruptRecords, the count checked at the end (for
        the rejection paths: `_scan_records` keeps its own loop, it is hot)."""
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
        count = self._checked_count()
        plain = self._plain_v2()  # outside the try: a decompression error is its own
        if values_v2 is not None:  # compiled: the values alone, no record objects
            log_append = self.timestamp_type == 1
            read = values_v2(plain, count, self.first_timestamp, self.max_timestamp, log_append)
            if read is not None:
                return iter(read)
        return self._read_values(plain, count)

    def _read_values(
        self, plain: memoryview | bytes | bytearray, count: int
    ) -> Iterator[bytes | None]:
        """The values by aiokafka's reader: its errors as `_raw_records` words them."""
        index = 0
        try:
            for raw in DefaultRecordBatch(plain):
                yield raw.value
                index += 1
        except Exception as exc:  # aiokafka's CorruptRecordException, struct.error, ...
            raise self._undecodable(index, exc) from exc
        self._check_read(index, count)

    def _undecodable(self, index: int, exc: Exception) -> CorruptRecords:
        """What a record the reader could not read means: Kafka's reason (`InvalidRecords`,
        from the records' length prefixes) once the records are at hand; else CorruptRecords."""
        if self._plain is not None:
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
        if count < 0:
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

    def _iter_records(self, source: memoryview | bytes | bytearray, count: int) -> Iterator[Record]:
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
