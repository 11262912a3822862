"""Record batches (magic 2) and messages (magic 0/1): lazy views, readers and a writer.

A `RecordBatch` is a view over bytes the caller already holds: header fields come straight from
the buffer with `struct`, nothing is decompressed or parsed until `records()` is asked for. Record
parsing for magic 2 is aiokafka's C-accelerated reader, fed the (decompressed) batch; the legacy
formats are small enough to parse here, which also gives us what aiokafka hides (inner attributes,
inner CRCs, Kafka 0.8's lz4 framing). Library types and exceptions never leave this module: every
failure is a `protocol.errors.DecodeError`.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol.budget import Allowance
from protocol.compression import CODEC_MASK, Codec, codec_from_id, compress, decompress
from protocol.errors import BufferUnderflow, CorruptRecords, EncodeError, InvalidRecords

__all__ = [
    "Header",
    "Record",
    "RecordBatch",
    "RecordInput",
    "RecordScan",
    "build_batch",
    "iter_batches",
    "read_batch",
    "read_batches",
]

Header = tuple[str, bytes | None]
RecordInput = tuple[bytes | None, bytes | None, Sequence[Header] | None, int | None]
"""What `build_batch` takes per record: (key, value, headers, timestamp in ms or None for now)."""

# Offset + length prefix shared by every magic: the "log overhead".
LOG_OVERHEAD = 12
_PREFIX = struct.Struct(">qi")
_MAGIC_POS = 16

# Magic 2 header: base offset, length, leader epoch, magic, crc, attributes, last offset delta,
# first timestamp, max timestamp, producer id, producer epoch, base sequence, record count.
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = _V2_HEADER.size  # 61
V2_ATTRIBUTES_POS = 21
V2_CRC_POS = 17
_V2_COUNT_POS = 57

# Legacy message: offset, length, crc, magic, attributes [, timestamp (magic 1)].
_V0_HEADER = struct.Struct(">qiIbb")
_V1_HEADER = struct.Struct(">qiIbbq")
_INT32 = struct.Struct(">i")
_LEGACY_CRC_POS = 12

# Smallest value the length field can hold for each magic (everything after the length field).
MIN_LENGTH_BY_MAGIC: dict[int, int] = {0: 14, 1: 22, 2: V2_HEADER_SIZE - LOG_OVERHEAD}
MIN_LENGTH = MIN_LENGTH_BY_MAGIC[0]

_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

_tuple_new = tuple.__new__


class Record(NamedTuple):
    """One record as a policy sees it.

    A NamedTuple rather than a frozen dataclass: it is built once per record on the hot path, and
    a frozen dataclass's `__init__` (one `object.__setattr__` per field) costs about five times
    as much as `tuple.__new__` and would cap iteration well below a million records/s. It is just
    as immutable.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: Kafka's name
    """0-based position in its batch (Kafka's `batch_index` in record_errors)."""
    offset_delta: int
    """Magic 2: the offset delta; magic 0/1 inner message: its stored offset; plain magic 0/1: 0."""
    timestamp: int
    """Milliseconds; LogAppendTime batches give the batch's time; -1 when absent (magic 0)."""
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    magic: int
    attributes: int
    """Magic 0/1: the message's own attributes (compression bits included). Magic 2: 0 — Kafka
    defines no record-level attribute bits and the C reader does not surface the byte."""

    @property
    def has_key(self) -> bool:
        return self.key is not None

    @property
    def has_value(self) -> bool:
        return self.value is not None


class RecordScan(NamedTuple):
    """What one pass over a batch's records tells without building a `Record` per record.

    The checks that pass on almost every batch (timestamps in range, keys present on a compacted
    topic) read this first and decode `Record`s only to word a rejection.
    """

    record_count: int
    min_timestamp: int
    """Smallest record timestamp (-1 counts like any other value); 0 when there are no records."""
    max_timestamp: int
    null_keys: int
    """Records without a key."""


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
        magic = buffer[_MAGIC_POS]
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
            ) = _V2_HEADER.unpack_from(buffer)
        else:
            if magic == 1:
                offset, length, crc, _, attributes, timestamp = _V1_HEADER.unpack_from(buffer)
            else:
                offset, length, crc, _, attributes = _V0_HEADER.unpack_from(buffer)
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
        return 1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return self.magic == 2 and bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return self.magic == 2 and bool(self.attributes & _CONTROL_BIT)

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
        return zlib.crc32(self.buffer[_MAGIC_POS:])

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
                _v2_structure_error(
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

    def _decompress(self, payload: memoryview, headroom: int = 0) -> bytearray:
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
            message = _parse_message(self.buffer, 0, len(self.buffer))
            return iter((_legacy_record(0, 0, message, message.timestamp),))
        return self._iter_inner()

    def _iter_inner(self) -> Iterator[Record]:
        log_append = self.magic == 1 and self.attributes & _TIMESTAMP_TYPE_BIT
        for index, message in enumerate(self._inner_messages()):
            timestamp = self.max_timestamp if log_append else message.timestamp
            yield _legacy_record(index, message.offset, message, timestamp)

    def _inner(self) -> memoryview:
        """A compressed wrapper's inner message set (decompressed once, kept as `_plain`)."""
        if self._plain is None:
            wrapper = _parse_message(self.buffer, 0, len(self.buffer))
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
            (_, length) = _PREFIX.unpack_from(inner, pos)
            end = pos + LOG_OVERHEAD + length
            if length < MIN_LENGTH_BY_MAGIC[0] or end > len(inner):
                raise CorruptRecords(f"inner message at byte {pos} has bad length {length}")
            yield pos, end
            pos = end

    def _count_inner(self) -> int:
        return sum(1 for _ in self._inner_bounds())

    def _inner_messages(self) -> Iterator[_Message]:
        inner = self._inner()
        for pos, end in self._inner_bounds():
            yield _parse_message(inner, pos, end)


PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
RECORDS_REMAINING = "Incorrect declared batch size, records still remaining in file"
INVALID_STRUCTURE = "Found invalid record structure"


def _v2_structure_error(
    plain: memoryview | bytes | bytearray, count: int, *, compressed: bool
) -> str:
    """Why the records of a magic 2 batch (`plain`: header and uncompressed records) do not
    read, in the words of Kafka's record iterators, found by walking the records' length
    prefixes: fewer records than `count` ("premature EOF"), a record longer than what is left
    ("Invalid record size ..."), bytes after the last record ("records still remaining"), or
    a record whose inside does not parse ("Found invalid record structure").

    Only a rejection pays for this walk: the common path reads records with the C reader.
    """
    data = memoryview(plain)[V2_HEADER_SIZE:]
    end = len(data)
    pos = 0
    for _ in range(count):
        length, pos = _read_varint(data, pos)
        if length is None:
            return PREMATURE_EOF
        if length < 0:
            return INVALID_STRUCTURE
        if end - pos < length:
            if compressed:
                return (
                    f"Invalid record size: expected {length} bytes in record payload, but the "
                    "record payload reached EOF."
                )
            return (
                f"Invalid record size: expected {length} bytes in record payload, but instead "
                f"the buffer has only {end - pos} remaining bytes."
            )
        pos += length
    if pos != end:
        return RECORDS_REMAINING
    return INVALID_STRUCTURE


def _read_varint(data: memoryview, pos: int) -> tuple[int | None, int]:
    """A zigzag varint (at most 5 bytes) at `pos`, or None when the input ends inside it."""
    raw = 0
    for shift in range(0, 35, 7):
        if pos >= len(data):
            return None, pos
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    return -1, pos  # longer than an int's varint: Kafka refuses it as malformed


class _Message(NamedTuple):
    offset: int
    crc: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    body: memoryview  # magic..end, what the CRC covers


def _parse_message(buf: memoryview, pos: int, end: int) -> _Message:
    """One magic 0/1 message occupying buf[pos:end] exactly."""
    if end - pos < LOG_OVERHEAD + MIN_LENGTH_BY_MAGIC[0]:
        raise CorruptRecords(f"message at byte {pos} shorter than the minimum")
    magic = buf[pos + _MAGIC_POS]
    if magic == 0:
        offset, _, crc, _, attributes = _V0_HEADER.unpack_from(buf, pos)
        timestamp = -1
        cursor = pos + _V0_HEADER.size
    elif magic == 1:
        if end - pos < LOG_OVERHEAD + MIN_LENGTH_BY_MAGIC[1]:
            raise CorruptRecords(f"magic 1 message at byte {pos} shorter than the minimum")
        offset, _, crc, _, attributes, timestamp = _V1_HEADER.unpack_from(buf, pos)
        cursor = pos + _V1_HEADER.size
    else:
        raise CorruptRecords(f"message at byte {pos} has magic {magic} inside a message set")
    key, cursor = _read_legacy_bytes(buf, cursor, end)
    value, cursor = _read_legacy_bytes(buf, cursor, end)
    if cursor != end:
        raise CorruptRecords(f"message at byte {pos} has {end - cursor} bytes after its value")
    return _Message(
        offset, crc, magic, attributes, timestamp, key, value, buf[pos + _MAGIC_POS : end]
    )


def _read_legacy_bytes(buf: memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise CorruptRecords(f"length field cut off at byte {pos}")
    (length,) = _INT32.unpack_from(buf, pos)
    pos += 4
    if length == -1:
        return None, pos
    if length < 0 or pos + length > end:
        raise CorruptRecords(f"bytes of length {length} at byte {pos - 4} overrun the message")
    return bytes(buf[pos : pos + length]), pos + length


def _legacy_record(index: int, offset_delta: int, message: _Message, timestamp: int) -> Record:
    return Record(
        index=index,
        offset_delta=offset_delta,
        timestamp=timestamp if message.magic == 1 else -1,
        key=message.key,
        value=message.value,
        headers=(),
        magic=message.magic,
        attributes=message.attributes,
    )


# -- readers -----------------------------------------------------------------------------------


def read_batch(
    buf: bytes | bytearray | memoryview, offset: int = 0, allowance: Allowance | None = None
) -> tuple[RecordBatch, int]:
    """Read the batch (or legacy message) starting at `offset`; returns it and the offset after.

    BufferUnderflow when the buffer ends inside it; CorruptRecords when its header is nonsense
    (length below the minimum for its magic, magic above 2); UnsupportedCompression for codec
    ids 5-7.
    """
    return _read_batch(_byte_view(buf), offset, allowance)


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _read_batch(
    view: memoryview, offset: int, allowance: Allowance | None = None
) -> tuple[RecordBatch, int]:
    available = len(view) - offset
    if offset < 0:
        raise CorruptRecords(f"negative buffer offset {offset}")
    if available < LOG_OVERHEAD:
        raise BufferUnderflow(f"batch header at byte {offset} needs 12 bytes, {available} left")
    (_, length) = _PREFIX.unpack_from(view, offset)
    if length < MIN_LENGTH:
        raise CorruptRecords(f"batch at byte {offset} has length {length}, below the minimum")
    if available > _MAGIC_POS:
        magic = view[offset + _MAGIC_POS]
        if magic > 2:
            raise CorruptRecords(f"batch at byte {offset} has unknown magic {magic}")
        if length < MIN_LENGTH_BY_MAGIC[magic]:
            raise CorruptRecords(
                f"magic {magic} batch at byte {offset} has length {length}, below the minimum"
            )
    end = offset + LOG_OVERHEAD + length
    if end > len(view):
        raise BufferUnderflow(
            f"batch at byte {offset} needs {end - offset} bytes, {available} left"
        )
    return RecordBatch(view[offset:end], allowance), end


def read_batches(
    buf: bytes | bytearray | memoryview, allowance: Allowance | None = None
) -> tuple[RecordBatch, ...]:
    """Every batch of `buf`, which must end where its last batch ends (BufferUnderflow if not).

    `tuple(iter_batches(buf))` without the generator: this runs for every partition of every
    produce request."""
    view = _byte_view(buf)
    end = len(view)
    offset = 0
    batches = []
    while offset < end:
        batch, offset = _read_batch(view, offset, allowance)
        batches.append(batch)
    return tuple(batches)


_PRODUCER_FIELDS = struct.Struct(">qhi")
_PRODUCER_ID_POS = 43
"""Producer id (int64), epoch (int16) and base sequence (int32) follow each other here."""


def as_own_producer(
    buf: bytes | bytearray | memoryview, keep: Collection[int] | None = None
) -> bytes:
    """The batches of `buf` written again as a plain producer's: producer id, epoch and base
    sequence -1, not transactional, base offset 0, the CRC recomputed; timestamps, headers and
    compression kept.

    What a replay or a dead-letter copy sends: the original producer's id, epoch and sequences
    belong to its own session, and a broker refuses them from anyone else (PRODUCER_FENCED,
    OUT_OF_ORDER_SEQUENCE_NUMBER) or drops them as duplicates. `keep`: the 0-based indexes
    (across all batches, as in `record_errors`) of the records to keep; None keeps every one,
    and then a magic 2 batch keeps its bytes but for the header. A batch with none kept is left
    out; magic 0/1 messages carry no producer fields and are kept or rebuilt as they are.
    Raises `DecodeError` when the records do not decode.
    """
    out = bytearray()
    start = 0
    for batch in read_batches(buf):
        count = max(batch.record_count, 0)
        chosen = (
            None if keep is None else [i - start for i in range(start, start + count) if i in keep]
        )
        start += count
        if chosen is not None and len(chosen) == count:
            chosen = None
        if chosen is None and batch.magic == 2:
            raw = bytearray(batch.buffer)
            attributes = batch.attributes & ~(_TRANSACTIONAL_BIT | _CONTROL_BIT)
            struct.pack_into(">q", raw, 0, 0)
            struct.pack_into(">h", raw, V2_ATTRIBUTES_POS, attributes)
            _PRODUCER_FIELDS.pack_into(raw, _PRODUCER_ID_POS, -1, -1, -1)
            struct.pack_into(">I", raw, V2_CRC_POS, crc32c.crc32c(bytes(raw[V2_ATTRIBUTES_POS:])))
            out += raw
        elif chosen is None:
            out += batch.buffer
        elif chosen:
            records = tuple(batch.records())
            picked = [records[i] for i in chosen]
            out += build_batch(
                [(r.key, r.value, r.headers, r.timestamp) for r in picked],
                magic=batch.magic,
                codec=batch.codec,
            )
    return bytes(out)


def first_batch_incomplete(buf: bytes | bytearray | memoryview) -> bool:
    """Whether `buf` ends before its first batch does (Kafka's batch iterator then finds no
    batch at all: `ByteBufferLogInputStream` stops quietly at an incomplete batch)."""
    if len(buf) < LOG_OVERHEAD:
        return True
    length: int = _PREFIX.unpack_from(buf, 0)[1]
    return LOG_OVERHEAD + length > len(buf)


def iter_batches(
    buf: bytes | bytearray | memoryview, offset: int = 0, *, allow_partial_tail: bool = False
) -> Iterator[RecordBatch]:
    """Every batch until the buffer ends.

    A trailing partial batch raises BufferUnderflow, or ends the iteration silently with
    `allow_partial_tail` (fetch responses and segments being written may end mid-batch).
    """
    view = _byte_view(buf)
    end = len(view)
    while offset < end:
        try:
            batch, offset = _read_batch(view, offset)
        except BufferUnderflow:
            if allow_partial_tail:
                return
            raise
        yield batch


# -- writer ------------------------------------------------------------------------------------


def build_batch(
    records: Sequence[RecordInput],
    *,
    magic: int = 2,
    codec: Codec = Codec.NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = 0,
) -> bytes:
    """Encode records as one magic-2 batch, or as a magic 0/1 message set.

    Magic 0/1 with a codec gives one compressed wrapper message holding the inner messages (inner
    offsets relative for magic 1, absolute for magic 0; the wrapper carries the last offset, as
    the Java producer writes it). Magic 0/1 without a codec gives one message per record.
    """
    codec = Codec(codec)
    if magic == 2:
        return _build_v2(
            records,
            codec=codec,
            base_offset=base_offset,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            attributes_extra=(_TRANSACTIONAL_BIT if is_transactional else 0)
            | (_CONTROL_BIT if is_control else 0)
            | (_TIMESTAMP_TYPE_BIT if timestamp_type else 0),
        )
    if magic not in (0, 1):
        raise EncodeError(f"unknown magic {magic}")
    if codec is Codec.ZSTD:
        raise EncodeError("zstd needs magic 2")
    if producer_id >= 0 or is_transactional or is_control:
        raise EncodeError(f"magic {magic} has no producer id, transactions or control records")
    if magic == 0 and timestamp_type:
        raise EncodeError("magic 0 has no timestamp type")
    return _build_legacy(
        records, magic=magic, codec=codec, base_offset=base_offset, timestamp_type=timestamp_type
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _build_v2(
    records: Sequence[RecordInput],
    *,
    codec: Codec,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    attributes_extra: int,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        2, 0, 0, producer_id, producer_epoch, base_sequence, 2**31 - 1
    )
    now = _now_ms()
    try:
        for index, (key, value, headers, timestamp) in enumerate(records):
            builder.append(
                index,
                now if timestamp is None else timestamp,
                None if key is None else bytes(key),
                None if value is None else bytes(value),
                list(headers or ()),
            )
        plain = builder.build()
    except Exception as exc:  # struct.error, TypeError, OverflowError from the C writer
        raise EncodeError(f"records do not encode as a magic 2 batch: {exc}") from exc
    header = bytearray(plain[:V2_HEADER_SIZE])
    body = bytes(plain[V2_HEADER_SIZE:])
    if codec is not Codec.NONE:
        body = compress(codec, body)
    (attributes,) = struct.unpack_from(">h", header, V2_ATTRIBUTES_POS)
    attributes = (attributes & ~CODEC_MASK) | int(codec) | attributes_extra
    struct.pack_into(">q", header, 0, base_offset)
    struct.pack_into(">i", header, 8, V2_HEADER_SIZE - LOG_OVERHEAD + len(body))
    struct.pack_into(">h", header, V2_ATTRIBUTES_POS, attributes)
    crc = crc32c.crc32c(bytes(header[V2_ATTRIBUTES_POS:]) + body)
    struct.pack_into(">I", header, V2_CRC_POS, crc)
    return bytes(header) + body


def _encode_message(
    offset: int,
    magic: int,
    attributes: int,
    timestamp: int,
    kv: tuple[bytes | None, bytes | None],
) -> bytes:
    parts = [struct.pack(">bb", magic, attributes)]
    if magic == 1:
        parts.append(struct.pack(">q", timestamp))
    for field in kv:
        if field is None:
            parts.append(_INT32.pack(-1))
        else:
            parts.append(_INT32.pack(len(field)))
            parts.append(bytes(field))
    body = b"".join(parts)
    crc = zlib.crc32(body)
    return _PREFIX.pack(offset, 4 + len(body)) + struct.pack(">I", crc) + body


def _build_legacy(
    records: Sequence[RecordInput],
    *,
    magic: int,
    codec: Codec,
    base_offset: int,
    timestamp_type: int,
) -> bytes:
    now = _now_ms()
    ts_bit = _TIMESTAMP_TYPE_BIT if timestamp_type else 0
    messages: list[bytes] = []
    timestamps: list[int] = []
    try:
        for index, (key, value, headers, timestamp) in enumerate(records):
            if headers:
                raise EncodeError(f"magic {magic} records cannot carry headers")
            ts = -1 if magic == 0 else (now if timestamp is None else timestamp)
            timestamps.append(ts)
            if codec is Codec.NONE:
                messages.append(
                    _encode_message(base_offset + index, magic, ts_bit, ts, (key, value))
                )
            else:
                inner_offset = index if magic == 1 else base_offset + index
                messages.append(_encode_message(inner_offset, magic, 0, ts, (key, value)))
    except struct.error as exc:
        raise EncodeError(f"records do not encode as magic {magic} messages: {exc}") from exc
    if codec is Codec.NONE:
        return b"".join(messages)
    payload = compress(codec, b"".join(messages), legacy_lz4_checksum=magic == 0)
    wrapper_ts = max(timestamps, default=-1) if magic == 1 else -1
    return _encode_message(
        base_offset + max(len(messages) - 1, 0),
        magic,
        int(codec) | ts_bit,
        wrapper_ts,
        (None, payload),
    )
