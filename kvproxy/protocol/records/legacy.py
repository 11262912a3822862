"""Reading magic 0/1 messages: one message of a message set, and the `Record` it gives."""

from __future__ import annotations

from typing import NamedTuple

from kvproxy.protocol.errors import CorruptRecords
from kvproxy.protocol.records.layout import (
    INT32,
    LOG_OVERHEAD,
    MAGIC_POS,
    MIN_LENGTH_BY_MAGIC,
    V0_HEADER,
    V1_HEADER,
)
from kvproxy.protocol.records.record import Record


class Message(NamedTuple):
    offset: int
    crc: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    body: memoryview  # magic..end, what the CRC covers


def parse_message(buf: memoryview, pos: int, end: int) -> Message:
    """One magic 0/1 message occupying buf[pos:end] exactly."""
    if end - pos < LOG_OVERHEAD + MIN_LENGTH_BY_MAGIC[0]:
        raise CorruptRecords(f"message at byte {pos} shorter than the minimum")
    magic = buf[pos + MAGIC_POS]
    if magic == 0:
        offset, _, crc, _, attributes = V0_HEADER.unpack_from(buf, pos)
        timestamp = -1
        cursor = pos + V0_HEADER.size
    elif magic == 1:
        if end - pos < LOG_OVERHEAD + MIN_LENGTH_BY_MAGIC[1]:
            raise CorruptRecords(f"magic 1 message at byte {pos} shorter than the minimum")
        offset, _, crc, _, attributes, timestamp = V1_HEADER.unpack_from(buf, pos)
        cursor = pos + V1_HEADER.size
    else:
        raise CorruptRecords(f"message at byte {pos} has magic {magic} inside a message set")
    key, cursor = _read_legacy_bytes(buf, cursor, end)
    value, cursor = _read_legacy_bytes(buf, cursor, end)
    if cursor != end:
        raise CorruptRecords(f"message at byte {pos} has {end - cursor} bytes after its value")
    return Message(
        offset, crc, magic, attributes, timestamp, key, value, buf[pos + MAGIC_POS : end]
    )


def _read_legacy_bytes(buf: memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise CorruptRecords(f"length field cut off at byte {pos}")
    (length,) = INT32.unpack_from(buf, pos)
    pos += 4
    if length == -1:
        return None, pos
    if length < 0 or pos + length > end:
        raise CorruptRecords(f"bytes of length {length} at byte {pos - 4} overrun the message")
    return bytes(buf[pos : pos + length]), pos + length


def legacy_record(index: int, offset_delta: int, message: Message, timestamp: int) -> Record:
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
