"""A broker's log on disk: folder and file names, batch frames, and resyncing after a broken one.

Shared by the audit's planner and `kvproxy dump`, so that both read a damaged segment the same
way. Sans-IO: the caller hands over the bytes it read (`frame_end`) or a `ReadAt` that reads them
(`resync`), from a local file, a remote one or a buffer.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator

import crc32c

from kvproxy.protocol.errors import BufferUnderflow, CorruptRecords, DecodeError
from kvproxy.protocol.records.layout import (
    LOG_OVERHEAD,
    MIN_LENGTH,
    MIN_LENGTH_BY_MAGIC,
    PREFIX,
    V2_ATTRIBUTES_POS,
    V2_CRC_POS,
)

__all__ = [
    "FRAME_HEAD",
    "ReadAt",
    "frame_end",
    "partition_of",
    "resync",
    "segment_base_offset",
]

FRAME_HEAD = 17
"""Offset, length, leader epoch / crc, magic: enough to step over a batch and check its magic."""

ReadAt = Callable[[int, int], bytes]
"""`read(position, count)`: up to `count` bytes of the segment from `position`."""

_V2_CRC = struct.Struct(">I")
_RESYNC_CHUNK = 1024 * 1024
_MAX_BATCH = 0x7FFFFFFF
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
"""`<topic>-<partition>`; a folder being deleted or moved (`-delete`, `-future`, `-stray`
suffixes) does not match."""
_SEGMENT = re.compile(r"^(?P<base_offset>\d+)\.log$")
"""`<base offset>.log`; files being deleted, swapped or cleaned (`.log.deleted`, `.log.swap`,
`.log.cleaned`) do not match."""


def partition_of(folder_name: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition folder's name, None for any other folder."""
    match = _PARTITION_DIR.match(folder_name)
    if match is None:
        return None
    return match["topic"], int(match["partition"])


def segment_base_offset(file_name: str) -> int | None:
    """The base offset a segment file's name gives, None when it is not a live segment file."""
    match = _SEGMENT.match(file_name)
    return None if match is None else int(match["base_offset"])


def frame_end(head: bytes, pos: int, size: int) -> int | DecodeError:
    """Where the batch at `pos` ends, from its first `FRAME_HEAD` bytes (fewer at the end of the
    file), or why it cannot be stepped over: its frame is broken (BufferUnderflow when the file
    ends inside it, CorruptRecords for a length below the minimum or an unknown magic)."""
    left = size - pos
    if len(head) < LOG_OVERHEAD:
        return BufferUnderflow(
            f"truncated batch header at byte {pos}: {len(head)} bytes left in the file"
        )
    length: int = PREFIX.unpack_from(head)[1]
    if length < MIN_LENGTH:
        return CorruptRecords(f"batch at byte {pos} has length {length}, below the minimum")
    if len(head) < FRAME_HEAD:
        return BufferUnderflow(
            f"truncated batch at byte {pos}: needs {LOG_OVERHEAD + length} bytes, {left} left"
        )
    magic = head[16]
    if magic > 2:
        return CorruptRecords(f"batch at byte {pos} has unknown magic {magic}")
    if length < MIN_LENGTH_BY_MAGIC[magic]:
        return CorruptRecords(
            f"magic {magic} batch at byte {pos} has length {length}, below the minimum"
        )
    if LOG_OVERHEAD + length > left:
        return BufferUnderflow(
            f"truncated batch at byte {pos}: needs {LOG_OVERHEAD + length} bytes, {left} left"
        )
    return pos + LOG_OVERHEAD + length


def resync(read: ReadAt, pos: int, size: int) -> int:
    """The first position >= `pos` where a verifiable magic 2 batch starts (sane length, valid
    CRC), else `size`. Reads 1 MiB at a time, plus each candidate batch."""
    while pos < size:
        chunk = read(pos, min(_RESYNC_CHUNK + FRAME_HEAD, size - pos))
        for candidate in _magic2_candidates(chunk):
            at = pos + candidate
            if _verifies(read, at, size):
                return at
        pos += _RESYNC_CHUNK
    return size


def _magic2_candidates(chunk: bytes) -> Iterator[int]:
    """Positions in `chunk` whose magic byte would be 2 (byte 16 of a batch)."""
    index = chunk.find(b"\x02", 16)
    limit = min(len(chunk), _RESYNC_CHUNK + 16)
    while 0 <= index < limit:
        yield index - 16
        index = chunk.find(b"\x02", index + 1)


def _verifies(read: ReadAt, at: int, size: int) -> bool:
    head = read(at, FRAME_HEAD)
    if len(head) < FRAME_HEAD:
        return False
    base_offset, length = PREFIX.unpack_from(head)
    if base_offset < 0 or not MIN_LENGTH_BY_MAGIC[2] <= length <= min(_MAX_BATCH, size - at - 12):
        return False
    body = read(at + V2_CRC_POS, LOG_OVERHEAD + length - V2_CRC_POS)
    (crc,) = _V2_CRC.unpack_from(body)
    return bool(crc32c.crc32c(body[V2_ATTRIBUTES_POS - V2_CRC_POS :]) == crc)
