"""The Confluent wire format of a record value: magic byte 0, a 4-byte big-endian schema id,
then (Protobuf only) the message indexes, then the payload.

`read_schema_id` runs once per record on the proxy's hot path, so it is one length test and
one precompiled `struct` unpack (about three times the rate of slicing and `int.from_bytes`);
the errors carry short messages the proxy puts after "no schema id: ".
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

__all__ = [
    "MAX_MESSAGE_INDEXES",
    "SCHEMA_ID_HEADER",
    "WireFormatError",
    "read_message_indexes",
    "read_schema_id",
    "write_message_indexes",
]

SCHEMA_ID_HEADER = 5
"""Bytes before the payload (Protobuf: before the message indexes): magic byte and schema id."""

MAX_MESSAGE_INDEXES = 100
"""More indexes than this is a corrupt value, not a message nested that deep."""

_MAX_VARINT_BYTES = 10
"""A 64-bit varint takes at most 10 bytes."""

_FIRST_MESSAGE = (0,)

_unpack_header: Callable[[bytes], tuple[int, int]] = struct.Struct(">BI").unpack_from


class WireFormatError(ValueError):
    """The value is not framed as the Confluent serializers frame it."""


def read_schema_id(data: bytes) -> int:
    """The schema id of a framed value; WireFormatError when it has no header."""
    if len(data) >= SCHEMA_ID_HEADER:
        magic, schema_id = _unpack_header(data)
        if magic == 0:
            return schema_id
    if data and data[0] != 0:
        raise WireFormatError(f"magic byte 0x{data[0]:02x}, expected 0x00")
    size = len(data)
    raise WireFormatError(f"{size} byte{'' if size == 1 else 's'}, a schema id header is 5")


def _read_zigzag(data: bytes, offset: int) -> tuple[int, int]:
    """One zigzag varint at `offset` (as Confluent writes message indexes), and the offset after."""
    result = 0
    shift = 0
    position = offset
    end = min(len(data), offset + _MAX_VARINT_BYTES)
    while position < end:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
    if position >= len(data):
        raise WireFormatError(f"message indexes truncated at byte {len(data)}")
    raise WireFormatError(f"a message index at byte {offset} is longer than 10 bytes")


def read_message_indexes(data: bytes, offset: int) -> tuple[tuple[int, ...], int]:
    """Confluent's Protobuf message indexes at `offset`: the path to the message type (into the
    file's messages, then their nested messages), and the offset of the message bytes.

    A count of 0 (the single byte 0) means `(0,)`, the file's first message."""
    if offset + 1 < len(data):
        first = data[offset]
        if first == 0:
            return _FIRST_MESSAGE, offset + 1
        index = data[offset + 1]
        if first == 2 and index < 0x80 and not index & 1:  # one index under 64: most values
            return (index >> 1,), offset + 2
    elif offset < len(data) and data[offset] == 0:
        return _FIRST_MESSAGE, offset + 1
    count, position = _read_zigzag(data, offset)
    if count == 0:
        return _FIRST_MESSAGE, position
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise WireFormatError(f"message index count {count} is not in 1..{MAX_MESSAGE_INDEXES}")
    indexes = []
    for _ in range(count):
        index, position = _read_zigzag(data, position)
        if index < 0:
            raise WireFormatError(f"negative message index {index}")
        indexes.append(index)
    return tuple(indexes), position


def _write_zigzag(out: bytearray, value: int) -> None:
    encoded = (value << 1) ^ (value >> 63)
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)


def write_message_indexes(out: bytearray, indexes: Sequence[int]) -> None:
    """Append `indexes` as the Confluent serializers write them (`[0]` as the single byte 0)."""
    if not 0 < len(indexes) <= MAX_MESSAGE_INDEXES:
        raise ValueError(f"{len(indexes)} message indexes, expected 1..{MAX_MESSAGE_INDEXES}")
    if any(index < 0 or index >= 1 << 62 for index in indexes):
        raise ValueError(f"message indexes {list(indexes)} are not all in 0..2**62-1")
    if len(indexes) == 1 and indexes[0] == 0:
        out.append(0)
        return
    _write_zigzag(out, len(indexes))
    for index in indexes:
        _write_zigzag(out, index)
