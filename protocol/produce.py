"""What the relay must know about a Produce request before deciding how to handle it."""

from __future__ import annotations

import struct

from protocol.errors import BufferUnderflow, NegativeSize
from protocol.headers import read_request_header, read_unsigned_varint

_INT16 = struct.Struct(">h")
_FIRST_WITH_TRANSACTIONAL_ID = 3
_FIRST_FLEXIBLE = 9


def read_produce_acks(frame: bytes | bytearray | memoryview) -> int:
    """The `acks` of a Produce request frame, read without decoding its records.

    acks=0 requests get no response from a broker, so the relay must not wait for one.
    """
    header, offset = read_request_header(frame, 0)
    if header.api_version >= _FIRST_WITH_TRANSACTIONAL_ID:
        if header.api_version >= _FIRST_FLEXIBLE:
            encoded, offset = read_unsigned_varint(frame, offset)
            length = encoded - 1
        else:
            if len(frame) - offset < _INT16.size:
                raise BufferUnderflow("request ended inside transactional_id")
            (length,) = _INT16.unpack_from(frame, offset)
            offset += _INT16.size
        if length < -1:
            raise NegativeSize(f"transactional_id length {length}")
        offset += max(length, 0)
    if len(frame) - offset < _INT16.size:
        raise BufferUnderflow("request ended before acks")
    (acks,) = _INT16.unpack_from(frame, offset)
    return int(acks)
