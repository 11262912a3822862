"""A pass over a magic 2 batch's records that reads their headers and skips their keys and values.

aiokafka's C reader builds a record object and copies every key and value into a new `bytes`
while holding the GIL: for a record of 60 MiB that is tens of milliseconds in which no other
thread (the event loop) runs, and for small records the objects and copies are most of the cost
of counting them. Counting records, their timestamps and null keys needs none of those bytes.

`skim_v2` is the compiled skim (`_skim.c`, built on install) when it could be imported, else
the pure-Python one below: the same answers, one per batch. Compiled, it costs a few nanoseconds
per record and every batch is skimmed; in Python it pays off only for large records
(`SKIM_FROM_BYTES_PER_RECORD`).

`values_v2`, compiled only (None without the extension), reads every record's value in the
same walk: the `bytes` of each value and nothing else, for checks that read only values (the
`json` policy), where aiokafka's reader would build a record object per record.

The skim accepts only what is plainly well formed (every length within the buffer, every record
exactly its declared length, the declared count, nothing after it); on anything else it returns
None and the caller reads the batch with the C reader, whose error is the one answered.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproxy.protocol.compiled import extensions_allowed
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.protocol.records.record import RecordScan

__all__ = [
    "COMPILED",
    "PYTHON_SKIM_FROM_BYTES_PER_RECORD",
    "SKIM_FROM_BYTES_PER_RECORD",
    "python_skim_v2",
    "skim_v2",
    "values_v2",
]

SkimV2 = Callable[[bytes | bytearray | memoryview, int, int, int, bool], RecordScan | None]
"""(plain batch, record count, first timestamp, max timestamp, log append time) -> scan."""

ValuesV2 = Callable[
    [bytes | bytearray | memoryview, int, int, int, bool], list[bytes | None] | None
]
"""The same arguments -> every record's value, or None when the batch is not plainly well formed."""

PYTHON_SKIM_FROM_BYTES_PER_RECORD = 16 * 1024
"""The pure-Python skim runs for batches whose records average at least this many bytes: there
the C reader's copies cost more than the Python steps, and a single copy can hold the GIL for
long."""

_UINT64 = 2**64 - 1
_INT64_HALF, _INT64_SPAN = 2**63, 2**64


class _Malformed(Exception):
    """Not plainly well formed: the C reader decides."""


def _raw_varint(view: memoryview, pos: int, max_bytes: int) -> tuple[int, int]:
    """The unsigned varint at `pos` of at most `max_bytes` bytes; (value, position after it)."""
    result = 0
    shift = 0
    end = min(len(view), pos + max_bytes)
    while pos < end:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _Malformed


def _varint(view: memoryview, pos: int, max_bytes: int) -> tuple[int, int]:
    """A zigzag varint at `pos` of at most `max_bytes` bytes; (value, position after it). One of
    5 bytes is Kafka's int: a fifth byte with bits beyond the 32nd, which Kafka's
    `ByteUtils.readVarint` drops and aiokafka's reader keeps, is left to the reader."""
    raw, pos = _raw_varint(view, pos, max_bytes)
    if max_bytes == 5 and raw >> 32:
        raise _Malformed
    return (raw >> 1) ^ -(raw & 1), pos


def _timestamp(view: memoryview, pos: int, first_timestamp: int) -> tuple[int, int]:
    """The record's timestamp: its delta, a zigzag varlong of at most 10 bytes read into 64 bits
    as Kafka's `ByteUtils.readVarlong` and aiokafka's reader read it (of a tenth byte only the
    lowest bit counts), added to the first timestamp as Java adds longs, wrapping."""
    raw, pos = _raw_varint(view, pos, 10)
    raw &= _UINT64
    delta = (raw >> 1) ^ -(raw & 1)
    return (first_timestamp + delta + _INT64_HALF) % _INT64_SPAN - _INT64_HALF, pos


def _skip(view: memoryview, pos: int, nullable: bool) -> tuple[bool, int]:
    """Skip a length-prefixed field; (whether it was null, position after it)."""
    length, pos = _varint(view, pos, 5)
    if length < 0:
        if length == -1 and nullable:
            return True, pos
        raise _Malformed
    if pos + length > len(view):
        raise _Malformed
    return False, pos + length


def python_skim_v2(
    plain: bytes | bytearray | memoryview,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    log_append_time: bool,
) -> RecordScan | None:
    """Count, timestamp range and null keys of an uncompressed magic 2 batch (`plain` holds its
    61-byte header, then the records), as the C reader would find them; None when the batch is
    not plainly well formed."""
    view = memoryview(plain).cast("B") if isinstance(plain, memoryview) else memoryview(plain)
    try:
        return _skim(view, count, first_timestamp, max_timestamp, log_append_time)
    except _Malformed:
        return None


def _skim(
    view: memoryview, count: int, first_timestamp: int, max_timestamp: int, log_append: bool
) -> RecordScan:
    pos = V2_HEADER_SIZE
    low = high = 0
    null_keys = 0
    for index in range(count):
        length, pos = _varint(view, pos, 5)
        start = pos
        if length < 0 or start + length > len(view):
            raise _Malformed
        _, pos = _varint(view, pos, 1)  # attributes: one byte, read as a varint by aiokafka
        timestamp, pos = _timestamp(view, pos, first_timestamp)
        _, pos = _varint(view, pos, 5)  # offset delta
        if log_append:
            timestamp = max_timestamp
        null_key, pos = _skip(view, pos, nullable=True)
        _, pos = _skip(view, pos, nullable=True)  # value
        headers, pos = _varint(view, pos, 5)
        if headers < 0:
            raise _Malformed
        for _ in range(headers):
            key_start = pos
            _, pos = _skip(view, pos, nullable=False)
            _header_key(view, key_start, pos)
            _, pos = _skip(view, pos, nullable=True)
        if pos - start != length:
            raise _Malformed
        null_keys += null_key
        if index == 0:
            low = high = timestamp
        elif timestamp < low:
            low = timestamp
        elif timestamp > high:
            high = timestamp
    if pos != len(view):
        raise _Malformed
    return RecordScan(count, low, high, null_keys)


def _header_key(view: memoryview, start: int, end: int) -> None:
    """A header key is UTF-8 (the C reader decodes it): its length prefix, then the text."""
    _, text_start = _varint(view, start, 5)
    try:
        bytes(view[text_start:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed from None


def _compiled_skim() -> tuple[SkimV2, ValuesV2] | None:
    """The compiled skim and value reader, or None when they were not built (no C compiler
    where kvproxy was installed, or `KVPROXY_NO_EXTENSIONS` set: `kvproxy.protocol.compiled`)."""
    if not extensions_allowed():
        return None
    try:
        from kvproxy.protocol.records import _skim  # noqa: PLC0415
    except ImportError:
        return None
    return _skim.skim_v2, _skim.values_v2


_compiled = _compiled_skim()
COMPILED: bool = _compiled is not None
"""Whether `skim_v2` is the compiled skim (the proxy says which at start-up)."""
skim_v2: SkimV2 = python_skim_v2 if _compiled is None else _compiled[0]
values_v2: ValuesV2 | None = None if _compiled is None else _compiled[1]
SKIM_FROM_BYTES_PER_RECORD = 0 if COMPILED else PYTHON_SKIM_FROM_BYTES_PER_RECORD
"""Batches whose records average at least this many bytes are skimmed: every batch when the
skim is compiled."""
