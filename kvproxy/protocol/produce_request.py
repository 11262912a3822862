"""A Produce request decoded in one reading of its bytes, its partitions counted on the way.

Every Produce request is decoded before the policies run, and one naming too many partitions
must be found before that work is done (`kvproxy.proxy.produce.many_partitions`). The schema-driven
codec (`kvproxy.protocol.messages`) builds each field through a generic loop; this reader knows
the layout of Produce v3-v13 and counts the partitions as it reads them, stopping at once when
they pass the bound: a request the proxy decides on the event loop is read once, not counted
and then decoded. It gives the very objects the codec gives (kio's schema classes, the same
primitive readers, the records a view of the frame) or nothing: anything it does not read
plainly (tagged fields, null arrays, a version outside v3-v13, bytes the codec would refuse) is
left to the codec, which decodes it or says what is wrong, as it always has.
"""

from __future__ import annotations

import importlib
import struct
from functools import cache
from typing import Any

from kio.serial._parse import get_reader
from kio.serial.errors import SerialError

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.headers import RequestHeader, read_request_header, read_unsigned_varint
from kvproxy.protocol.messages import PRODUCE, Request, codec_for

__all__ = ["read_produce"]

_FIRST_READ = 3
"""Produce v0-v2 are the legacy schemas: left to the codec (their clients are rare)."""
_LAST_READ = 13
_FIRST_WITH_TOPIC_IDS = 13
_FIRST_FLEXIBLE = 9
_INT32 = struct.Struct(">i")
_NULL = -1


class _NotPlain(Exception):
    """The request holds something this reader leaves to the codec."""


@cache
def _layout(version: int) -> tuple[Any, ...]:
    """The schema classes and kio's primitive readers of one Produce version."""
    request_type = codec_for(PRODUCE, version).request_type
    module = importlib.import_module(request_type.__module__)
    flexible = version >= _FIRST_FLEXIBLE
    return (
        request_type,
        module.TopicProduceData,
        module.PartitionProduceData,
        flexible,
        get_reader("string", flexible, True),  # transactional id
        get_reader("int16", flexible, False),  # acks
        get_reader("timedelta_i32", flexible, False),  # timeout
        version >= _FIRST_WITH_TOPIC_IDS,
        get_reader("uuid", flexible, False)  # topic id (v13+)
        if version >= _FIRST_WITH_TOPIC_IDS
        else get_reader("string", flexible, False),  # topic name
        get_reader("int32", flexible, False),  # partition index
    )


def read_produce(
    frame: bytes | memoryview,
    stop_after: int,
    header: tuple[RequestHeader, int] | None = None,
) -> Request | None:
    """The Produce request in `frame` (size prefix removed) as `decode_request` gives it, when it
    names at most `stop_after` partitions; None when it names more (no partition past the bound
    is read) or when it is not a request this reader takes (the codec's, then). `header`: the
    header and where the body starts, when already read (`RequestView`)."""
    try:
        buf = frame if isinstance(frame, memoryview) else memoryview(frame)
        return _read(buf, stop_after, header or read_request_header(buf))
    except (_NotPlain, ProtocolError, SerialError, ValueError, OverflowError, TypeError):
        return None


def _read(buf: memoryview, stop_after: int, read: tuple[RequestHeader, int]) -> Request | None:
    header, offset = read
    version = header.api_version
    if header.api_key != PRODUCE or not _FIRST_READ <= version <= _LAST_READ:
        return None
    (
        request_type,
        topic_type,
        partition_type,
        flexible,
        read_transactional_id,
        read_acks,
        read_timeout,
        by_id,
        read_name,
        read_index,
    ) = _layout(version)
    transactional_id, size = read_transactional_id(buf, offset)
    offset += size
    acks, size = read_acks(buf, offset)
    offset += size
    timeout, size = read_timeout(buf, offset)
    offset += size
    topic_count, offset = _count(buf, offset, flexible)
    counted = 0
    topics = []
    for _ in range(topic_count):
        name, size = read_name(buf, offset)
        offset += size
        count, offset = _count(buf, offset, flexible)
        counted += count
        if counted > stop_after:
            return None
        partitions = []
        for _ in range(count):
            index, size = read_index(buf, offset)
            records, offset = _records(buf, offset + size, flexible)
            if flexible:
                offset = _no_tags(buf, offset)
            partitions.append(partition_type(index=index, records=records))
        if flexible:
            offset = _no_tags(buf, offset)
        if by_id:
            topics.append(topic_type(topic_id=name, partition_data=tuple(partitions)))
        else:
            topics.append(topic_type(name=name, partition_data=tuple(partitions)))
    if flexible:
        offset = _no_tags(buf, offset)
    if offset != len(buf):
        return None
    body = request_type(
        transactional_id=transactional_id, acks=acks, timeout=timeout, topic_data=tuple(topics)
    )
    return Request(header, body)


def _length(buf: memoryview, offset: int, flexible: bool) -> tuple[int, int]:
    """A length as the version writes it: a compact one (unsigned varint, plus one) or an int32;
    -1 stands for null either way."""
    if flexible:
        encoded, offset = read_unsigned_varint(buf, offset)
        return encoded - 1, offset
    if offset + _INT32.size > len(buf):
        raise _NotPlain
    (length,) = _INT32.unpack_from(buf, offset)
    return length, offset + _INT32.size


def _count(buf: memoryview, offset: int, flexible: bool) -> tuple[int, int]:
    """An array's length; a null or impossible one is the codec's to read."""
    count, offset = _length(buf, offset, flexible)
    if count < 0 or count > len(buf) - offset:
        raise _NotPlain
    return count, offset


def _records(buf: memoryview, offset: int, flexible: bool) -> tuple[memoryview | None, int]:
    """A partition's records: a view of the frame, as the codec reads them."""
    size, offset = _length(buf, offset, flexible)
    if size == _NULL:
        return None, offset
    end = offset + size
    if size < 0 or end > len(buf):
        raise _NotPlain
    return buf[offset:end].toreadonly(), end


def _no_tags(buf: memoryview, offset: int) -> int:
    """Past an empty tagged-field section; tagged fields are the codec's to read."""
    if offset >= len(buf) or buf[offset] != 0:
        raise _NotPlain
    return offset + 1
