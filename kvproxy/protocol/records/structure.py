"""Why a magic 2 batch's records do not read, in the words of Kafka's record iterators."""

from __future__ import annotations

from kvproxy.protocol.records.layout import V2_HEADER_SIZE

PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
RECORDS_REMAINING = "Incorrect declared batch size, records still remaining in file"
INVALID_STRUCTURE = "Found invalid record structure"


def v2_structure_error(
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
    """A zigzag varint at `pos` read as Kafka's `ByteUtils.readVarint` reads an int: at most 5
    bytes, the bits beyond the 32nd dropped; None when the input ends inside it."""
    raw = 0
    for shift in range(0, 35, 7):
        if pos >= len(data):
            return None, pos
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            raw &= 0xFFFF_FFFF
            return (raw >> 1) ^ -(raw & 1), pos
    return -1, pos  # longer than an int's varint: Kafka refuses it as malformed
