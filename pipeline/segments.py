"""Kafka log segments as audit work: find them, cut them into ranges at batch boundaries.

A broker's log directory holds `<topic>-<partition>/<base offset>.log` files, each a run of
record batches (or magic 0/1 messages) framed by the same 12-byte prefix: offset, then length.
Planning reads only those prefixes (and the magic byte), seeking from one batch to the next, so
a segment of any size costs a few bytes per batch to plan; each task then reads its own range
of about `RANGE_BYTES`. A batch whose frame is broken (a length past the end of the file, below
the minimum, an unknown magic) cannot be stepped over by its length: the planner reports the
bytes from there to the next batch it can verify (magic 2, sane length, valid CRC) as one corrupt
region, and the scan goes on after it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import IO

from pipeline import files
from protocol.records.segment import (
    FRAME_HEAD,
    ReadAt,
    frame_end,
    partition_of,
    resync,
    segment_base_offset,
)

__all__ = [
    "RANGE_BYTES",
    "CorruptRegion",
    "JournalSegment",
    "SegmentFile",
    "SegmentRange",
    "discover",
    "plan_segment",
]

RANGE_BYTES = 32 * 1024 * 1024
"""Target size of one task's range; a range ends at the first batch boundary past it."""

_PREFIX = struct.Struct(">qi")
_JOURNAL_SEGMENT = re.compile(r"^\d{20}\.kvq$")
_WORKER_JOURNAL = re.compile(r"^worker-\d+$")
"""Where each worker of `kvproxy serve --workers N` keeps its journal, inside quarantine.dir."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One `.log` file and the topic-partition its folder names."""

    uri: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class JournalSegment:
    """One `.kvq` file of a quarantine journal."""

    uri: str


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """Bytes [start, end) of a segment: whole batches, read and checked by one task."""

    uri: str
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class CorruptRegion:
    """Bytes of a segment that do not frame a batch; reported as a violation, never checked."""

    uri: str
    topic: str
    partition: int
    start: int
    end: int
    base_offset: int
    """The offset field at `start` when at least 8 bytes are there, else -1."""
    reason: str


def _is_segment(uri: str) -> bool:
    return segment_base_offset(_name(uri)) is not None


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _parent_name(uri: str) -> str:
    parts = uri.rstrip("/").rsplit("/", 2)
    return parts[-2] if len(parts) >= 2 else ""


def discover(uri: str) -> list[SegmentFile | JournalSegment]:
    """The segments under an `--input`: a log directory, a partition folder, a segment file, a
    quarantine journal directory or one of its files. InputError when there are none."""
    found: list[SegmentFile | JournalSegment] = []
    if not files.is_dir(uri):
        name = _name(uri)
        if _JOURNAL_SEGMENT.match(name) or name.endswith(".kvq"):
            return [JournalSegment(uri)]
        owner = partition_of(_parent_name(uri))
        if owner is None:
            raise files.InputError(
                f"{uri}: a segment file must sit in a <topic>-<partition> folder, as a broker "
                "keeps it, to know its topic and partition"
            )
        return [SegmentFile(uri, *owner)]
    children = list(files.list_dir(uri))
    journal = [JournalSegment(c) for c in children if _JOURNAL_SEGMENT.match(_name(c))]
    for child in children:
        if _WORKER_JOURNAL.match(_name(child)) and files.is_dir(child):
            journal.extend(
                JournalSegment(c) for c in files.list_dir(child) if _JOURNAL_SEGMENT.match(_name(c))
            )
    if journal:
        return list(journal)
    owner = partition_of(_name(uri))
    segments = [c for c in children if _is_segment(c)]
    if owner is not None and segments:
        return [SegmentFile(c, *owner) for c in segments]
    for child in children:
        child_owner = partition_of(_name(child))
        if child_owner is None or not files.is_dir(child):
            continue
        found.extend(SegmentFile(c, *child_owner) for c in files.list_dir(child) if _is_segment(c))
    if not found:
        raise files.InputError(
            f"{uri}: no Kafka log segments (<topic>-<partition>/<offset>.log) and no quarantine "
            "journal (*.kvq) found there"
        )
    return found


def plan_segment(
    segment: SegmentFile, range_bytes: int = RANGE_BYTES
) -> list[SegmentRange | CorruptRegion]:
    """Cut one segment into ranges of whole batches, reading only batch headers."""
    size = files.size(segment.uri)
    out: list[SegmentRange | CorruptRegion] = []
    with files.open_binary(segment.uri) as handle:
        start = pos = 0
        while pos < size:
            step = _step(handle, pos, size)
            if isinstance(step, int):
                pos = step
                if pos - start >= range_bytes:
                    out.append(_range(segment, start, pos))
                    start = pos
                continue
            if pos > start:
                out.append(_range(segment, start, pos))
            resume = _resync(handle, pos + 1, size)
            out.append(_region(segment, handle, pos, resume, step))
            start = pos = resume
        if pos > start:
            out.append(_range(segment, start, pos))
    return out


def _range(segment: SegmentFile, start: int, end: int) -> SegmentRange:
    return SegmentRange(segment.uri, segment.topic, segment.partition, start, end)


def _region(
    segment: SegmentFile, handle: IO[bytes], start: int, end: int, reason: str
) -> CorruptRegion:
    handle.seek(start)
    head = handle.read(8)
    base_offset = _PREFIX.unpack_from(head + bytes(4))[0] if len(head) == 8 else -1
    return CorruptRegion(
        segment.uri, segment.topic, segment.partition, start, end, base_offset, reason
    )


def _reader(handle: IO[bytes]) -> ReadAt:
    def read(pos: int, count: int) -> bytes:
        handle.seek(pos)
        return handle.read(count)

    return read


def _step(handle: IO[bytes], pos: int, size: int) -> int | str:
    """Where the batch at `pos` ends, or why it cannot be stepped over (its frame is broken)."""
    handle.seek(pos)
    end = frame_end(handle.read(min(FRAME_HEAD, size - pos)), pos, size)
    return end if isinstance(end, int) else str(end)


def _resync(handle: IO[bytes], pos: int, size: int) -> int:
    """The first position >= `pos` where a verifiable magic 2 batch starts, else `size`."""
    return resync(_reader(handle), pos, size)
