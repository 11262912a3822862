"""The shape of a Produce request read from its bytes, without decoding it: how many partitions
it names, and each partition's topic and index; and a whole-request refusal answer written
straight to bytes.

Decoding a Produce request builds several Python objects per partition (about 2.5 s and
hundreds of MiB for a million partitions), and answering it through the codec costs more still.
A request naming more partitions than the proxy takes is refused from this scan alone: counting
stops as soon as the count passes the limit, so refusing costs at most the limit's worth of
steps, and the answer (one fixed-size entry per partition) is written without any object per
partition.
"""

from __future__ import annotations

import struct
import sys
import uuid
from array import array
from dataclasses import dataclass

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, NegativeSize, ProtocolError
from kvproxy.protocol.fast_accept import answer_plain
from kvproxy.protocol.headers import (
    RequestHeader,
    read_request_header,
    read_unsigned_varint,
    request_header_version,
    skip_tagged_fields,
)

__all__ = [
    "LAST_SCANNED_VERSION",
    "ProduceShape",
    "answer_names_nodes",
    "refusal_answer",
    "scan_produce",
]

LAST_SCANNED_VERSION = 13
_FIRST_WITH_TOPIC_IDS = 13
"""Produce v13 names each topic by its id (16 bytes) where earlier versions wrote its name; the
scan gives such a topic as the id's text (`uuid.UUID(text)`)."""
_UUID_SIZE = 16
_FIRST_FLEXIBLE = 9
_FIRST_TRANSACTIONAL = 3
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INDEX_AND_LENGTH = struct.Struct(">ii")
_ANSWER_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8
"""A flexible Produce answer's partition before its record errors: index, error code, base
offset, log append time, log start offset."""


@dataclass(frozen=True, slots=True)
class ProduceShape:
    """What `scan_produce` read: the header, `acks`, and the partitions it counted."""

    api_version: int
    correlation_id: int
    client_id: str | None
    acks: int
    partitions: int
    """Partitions counted; when `complete` is False, the count at which the scan stopped."""
    complete: bool
    """Whether every partition was read (the scan stops once it passes `stop_after`)."""
    topics: tuple[tuple[str, array[int]], ...] = ()
    """Each topic's name and partition indexes, in request order (only with `indexes=True`):
    4 bytes per partition, not an object each."""
    first_topic: str = ""
    """The name of the request's first topic ("" when it names none)."""


def scan_produce(
    payload: bytes | memoryview,
    stop_after: int,
    *,
    indexes: bool = False,
    header: tuple[RequestHeader, int] | None = None,
) -> ProduceShape:
    """Count the partitions of a Produce request (v0-v13), stopping once the count passes
    `stop_after`: a topic declaring more partitions than remain stops the scan at once.

    Raises `DecodeError` for bytes that are not such a request (the codec then reads it and
    answers as it always has). `header`: the header and where the body starts, when already
    read (`RequestView`)."""
    buf = memoryview(payload)
    head, offset = read_request_header(buf) if header is None else header
    version = head.api_version
    if version > LAST_SCANNED_VERSION:
        raise DecodeError(f"Produce v{version} is not scanned")
    flexible = request_header_version(head.api_key, version) >= 2
    by_id = version >= _FIRST_WITH_TOPIC_IDS
    if version >= _FIRST_TRANSACTIONAL:
        offset = _skip_string(buf, offset, flexible)
    acks = _read(_INT16, buf, offset)
    offset += _INT16.size + _INT32.size  # acks, timeout
    topic_count, offset = _array_length(buf, offset, flexible)
    counted = 0
    topics: list[tuple[str, array[int]]] = []
    first_start: int | None = None
    for _ in range(topic_count):
        name_start = offset
        if first_start is None:
            first_start = offset
        offset = _check(buf, offset + _UUID_SIZE) if by_id else _skip_string(buf, offset, flexible)
        count, offset = _array_length(buf, offset, flexible)
        if counted + count > stop_after:  # declared: no need to read them
            first = _topic(buf, first_start, flexible, by_id) if first_start is not None else ""
            return ProduceShape(
                version,
                head.correlation_id,
                head.client_id,
                acks,
                counted + count,
                False,
                first_topic=first,
            )
        found = array("i")
        for _ in range(count):
            if flexible:
                index = _read(_INT32, buf, offset)
                size, offset = read_unsigned_varint(buf, offset + _INT32.size)
                offset = skip_tagged_fields(buf, _check(buf, offset + max(size - 1, 0)))
            else:
                if offset + _INDEX_AND_LENGTH.size > len(buf):
                    raise BufferUnderflow("input ended inside a partition")
                index, size = _INDEX_AND_LENGTH.unpack_from(buf, offset)
                offset = _check(buf, offset + _INDEX_AND_LENGTH.size + max(size, 0))
            if indexes:
                found.append(index)
        counted += count
        if flexible:
            offset = skip_tagged_fields(buf, offset)
        if indexes:
            topics.append((_topic(buf, name_start, flexible, by_id), found))
    first = _topic(buf, first_start, flexible, by_id) if first_start is not None else ""
    return ProduceShape(
        version,
        head.correlation_id,
        head.client_id,
        acks,
        counted,
        True,
        tuple(topics),
        first_topic=first,
    )


def answer_names_nodes(frame: bytes | memoryview, version: int = 12) -> bool:
    """Whether a flexible Produce answer (v9-v13) may name brokers: its top-level tagged fields,
    where v10+ puts `node_endpoints`, are not empty, or its bytes do not read as such an answer
    (then the codec reads it and says what is wrong). False: the answer has nothing the proxy
    rewrites and reaches the client as the broker wrote it. The compiled scan answers first
    when it is sure (`kvproxy.protocol.fast_accept.answer_plain`)."""
    if answer_plain(frame, version):
        return False
    buf = memoryview(frame)
    try:
        offset = skip_tagged_fields(buf, _check(buf, _INT32.size))  # correlation id, header tags
        topics, offset = _array_length(buf, offset, True)
        by_id = version >= _FIRST_WITH_TOPIC_IDS
        for _ in range(topics):
            offset = _check(buf, offset + _UUID_SIZE) if by_id else _skip_string(buf, offset, True)
            partitions, offset = _array_length(buf, offset, True)
            for _ in range(partitions):
                offset = _check(buf, offset + _ANSWER_PARTITION_FIXED)
                errors, offset = _array_length(buf, offset, True)
                for _ in range(errors):  # batch index, its message, tagged fields
                    offset = _skip_string(buf, _check(buf, offset + _INT32.size), True)
                    offset = skip_tagged_fields(buf, offset)
                offset = _skip_string(buf, offset, True)  # error message
                offset = skip_tagged_fields(buf, offset)  # current_leader (v10+)
            offset = skip_tagged_fields(buf, offset)
        tags, end = read_unsigned_varint(buf, _check(buf, offset + _INT32.size))  # throttle time
    except ProtocolError:
        return True
    return tags != 0 or end != len(buf)


def refusal_answer(shape: ProduceShape, error_code: int, message: str | None) -> bytes:
    """The Produce answer of `shape.api_version` giving every partition `error_code`, as Kafka
    answers a request refused as a whole; `message` (v8+) goes with the first partition only,
    so every further partition costs its fixed fields alone (24-36 bytes)."""
    version = shape.api_version
    flexible = version >= _FIRST_FLEXIBLE
    parts: list[bytes | bytearray] = [_INT32.pack(shape.correlation_id)]
    if flexible:
        parts.append(b"\x00")  # response header v1: no tagged fields
    parts.append(_length(len(shape.topics), flexible))
    first = True
    rest = _partition_tail(error_code, version, None)  # every partition after the first
    by_id = version >= _FIRST_WITH_TOPIC_IDS
    for name, indexes in shape.topics:
        topic = uuid.UUID(name).bytes if by_id else _string(name, flexible)
        parts += (topic, _length(len(indexes), flexible))
        others = indexes
        if first and indexes:
            parts.append(_INT32.pack(indexes[0]) + _partition_tail(error_code, version, message))
            others = indexes[1:]
            first = False
        parts.append(_entries(others, rest))
        if flexible:
            parts.append(b"\x00")
    if version >= 1:
        parts.append(_INT32.pack(0))  # throttle time
    if flexible:
        parts.append(b"\x00")
    return b"".join(parts)


def _entries(indexes: array[int], rest: bytes) -> bytearray:
    """Each index (big-endian) followed by `rest`, written by slice assignment: a million
    entries cost two buffers and no object each."""
    big_endian = array("i", indexes)
    if sys.byteorder == "little":
        big_endian.byteswap()
    index_bytes = big_endian.tobytes()
    stride = _INT32.size + len(rest)
    out = bytearray((bytes(_INT32.size) + rest) * len(indexes))
    for byte in range(_INT32.size):
        out[byte::stride] = index_bytes[byte :: _INT32.size]
    return out


def _partition_tail(error_code: int, version: int, message: str | None) -> bytes:
    """A partition's answer after its index."""
    flexible = version >= _FIRST_FLEXIBLE
    out = bytearray(struct.pack(">hq", error_code, -1))  # base offset
    if version >= 2:
        out += struct.pack(">q", -1)  # log append time
    if version >= 5:
        out += struct.pack(">q", -1)  # log start offset
    if version >= 8:
        out += _length(0, flexible)  # record errors
        out += _string(message, flexible)
    if flexible:
        out += b"\x00"
    return bytes(out)


def _length(count: int, flexible: bool) -> bytes:
    return _uvarint(count + 1) if flexible else _INT32.pack(count)


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else _INT16.pack(-1)
    encoded = value.encode("utf-8")
    prefix = _length(len(encoded), flexible) if flexible else _INT16.pack(len(encoded))
    return prefix + encoded


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read(fmt: struct.Struct, buf: memoryview, offset: int) -> int:
    if offset + fmt.size > len(buf):
        raise BufferUnderflow("input ended inside the request")
    return int(fmt.unpack_from(buf, offset)[0])


def _check(buf: memoryview, offset: int) -> int:
    if offset > len(buf):
        raise BufferUnderflow("input ended inside a partition's records")
    return offset


def _array_length(buf: memoryview, offset: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        count, offset = read_unsigned_varint(buf, offset)
        return max(count - 1, 0), offset
    count = _read(_INT32, buf, offset)
    if count < -1:
        raise NegativeSize(f"array length {count} is negative")
    return max(count, 0), offset + _INT32.size


def _skip_string(buf: memoryview, offset: int, flexible: bool) -> int:
    if flexible:
        size, offset = read_unsigned_varint(buf, offset)
        return _check(buf, offset + max(size - 1, 0))
    size = _read(_INT16, buf, offset)
    if size < -1:
        raise NegativeSize(f"string length {size} is negative")
    return _check(buf, offset + _INT16.size + max(size, 0))


def _topic(buf: memoryview, offset: int, flexible: bool, by_id: bool) -> str:
    """A topic's name, or (v13) its id's text."""
    if by_id:
        return str(uuid.UUID(bytes=bytes(buf[offset : offset + _UUID_SIZE])))
    return _name(buf, offset, flexible)


def _name(buf: memoryview, offset: int, flexible: bool) -> str:
    if flexible:
        size, start = read_unsigned_varint(buf, offset)
        size -= 1
    else:
        size, start = _read(_INT16, buf, offset), offset + _INT16.size
    try:
        return bytes(buf[start : start + max(size, 0)]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"topic name is not UTF-8: {exc}") from None
