"""Produce requests naming many partitions, written straight to bytes (the codec takes seconds
to encode a million partitions), and the figures of their answers."""

from __future__ import annotations

import struct
import uuid

CLIENT_ID = "kvproxy-partitions"
_FIRST_FLEXIBLE = 9


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: str, flexible: bool) -> bytes:
    encoded = value.encode()
    size = _uvarint(len(encoded) + 1) if flexible else struct.pack(">h", len(encoded))
    return size + encoded


def many_partitions_request(
    version: int,
    topics: dict[str, int],
    *,
    correlation_id: int = 1,
    acks: int = 1,
    records: bytes | None = None,
) -> bytes:
    """A Produce request (no size prefix) naming `topics[name]` partitions (0, 1, ...) of each
    topic, every partition holding `records` (None: null records, as in the hostile request);
    from v13 each name is a topic id's text, written as the id."""
    flexible = version >= _FIRST_FLEXIBLE
    out = bytearray(struct.pack(">hhi", 0, version, correlation_id))
    out += struct.pack(">h", len(CLIENT_ID)) + CLIENT_ID.encode()
    if flexible:
        out += b"\x00"
    if version >= 3:
        out += b"\x00" if flexible else struct.pack(">h", -1)  # no transactional id
    out += struct.pack(">hi", acks, 10_000)
    out += _uvarint(len(topics) + 1) if flexible else struct.pack(">i", len(topics))
    if records is None:
        tail = b"\x00" if flexible else struct.pack(">i", -1)
    else:
        tail = (
            _uvarint(len(records) + 1) + records
            if flexible
            else (struct.pack(">i", len(records)) + records)
        )
    if flexible:
        tail += b"\x00"
    for name, count in topics.items():
        out += uuid.UUID(name).bytes if version >= 13 else _string(name, flexible)
        out += _uvarint(count + 1) if flexible else struct.pack(">i", count)
        out += b"".join(struct.pack(">i", index) + tail for index in range(count))
        if flexible:
            out += b"\x00"
    if flexible:
        out += b"\x00"
    return bytes(out)
