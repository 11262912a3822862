"""Kafka log segments as audit work: find them, cut them into ranges at batch boundaries.

A broker's log directory holds `<topic>-<partition>/<base offset>.log` files, each a run of
record batches (or magic 0/1 messages) framed by the same 12-byte prefix: offset, then length.
Planning reads only those prefixes (and the magic byte), seeking from one batch to the next, so
a segment of any size costs a few bytes per batch to plan; each task then reads its own range
of about `RANGE_BYTES`. A batch whose frame is broken (a length past the end of the file, below
the minimum, an unknown magic) cannot be stepped over by its length: the planner reports the
bytes from there to the next batch it can verify (magic 2, sane length, valid CRC) as one corrupt
region, and the scan goes on after it.

The same pass checks what no CRC covers: the offset field of each batch. Offsets must rise from
batch to batch within a segment, and the first batch may not start below the offset the file is
named after; a batch that breaks this is reported as an `OffsetDisorder` (check `offset_order`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import IO

from kvproxy.pipeline import files
from kvproxy.protocol.records.layout import MIN_LENGTH_BY_MAGIC
from kvproxy.protocol.records.segment import (
    ReadAt,
    frame_end,
    partition_of,
    resync,
    segment_base_offset,
)

__all__ = [
    "OFFSET_ORDER",
    "RANGE_BYTES",
    "CorruptRegion",
    "JournalSegment",
    "OffsetDisorder",
    "SegmentFile",
    "SegmentRange",
    "discover",
    "name_offset",
    "plan_segment",
]

RANGE_BYTES = 32 * 1024 * 1024
"""Target size of one task's range; a range ends at the first batch boundary past it."""

_PREFIX = struct.Struct(">qi")
_HEAD = 17  # offset, length, leader epoch / crc, magic: enough to step and to check the magic
_V2_HEAD = 27  # ... then crc, attributes and lastOffsetDelta (a magic 2 batch's last offset)
_V2_LAST_DELTA = struct.Struct(">i")
_V2_LAST_DELTA_POS = 23
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
    reason: str
    offset: int | None = None
    """The offset field at `start` for a truncated last batch (its header whole and sane, only
    its bytes run past the end of the file, no batch after it); None (unknown) for bytes skipped
    up to a resynced batch: they frame no batch, so their first 8 bytes are no offset."""


OFFSET_ORDER = "offset_order"
"""The name violations of the offset order carry in their `policy` column."""


@dataclass(frozen=True, slots=True)
class OffsetDisorder:
    """A batch whose offset breaks the segment's order: reported as a violation; its bytes are
    still checked by the range that holds them."""

    uri: str
    topic: str
    partition: int
    position: int
    """The byte where the batch starts."""
    offset: int
    """The batch's offset field (its base offset; the last offset for magic 0/1)."""
    reason: str


@dataclass(frozen=True, slots=True)
class _Head:
    """Where a batch sits and the offsets its header names."""

    position: int
    end: int
    first: int
    last: int


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
) -> list[SegmentRange | CorruptRegion | OffsetDisorder]:
    """Cut one segment into ranges of whole batches, reading only batch headers; report bytes
    that frame no batch and batches whose offsets break the order."""
    size = files.size(segment.uri)
    out: list[SegmentRange | CorruptRegion | OffsetDisorder] = []
    order = _OffsetOrder(segment)
    with files.open_binary(segment.uri) as handle:
        start = pos = 0
        while pos < size:
            step = _step(handle, pos, size)
            if isinstance(step, _Head):
                out.extend(order.see(step))
                pos = step.end
                if pos - start >= range_bytes:
                    out.append(_range(segment, start, pos))
                    start = pos
                continue
            if pos > start:
                out.append(_range(segment, start, pos))
            reason, offset = step
            resume = _resync(handle, pos + 1, size)
            # Resynced: the length was wrong, so the rest of that header is not trusted either.
            known = offset if resume == size else None
            out.append(_region(segment, pos, resume, reason, known))
            start = pos = resume
        if pos > start:
            out.append(_range(segment, start, pos))
    return out


def name_offset(uri: str) -> int | None:
    """The base offset a segment file is named after (`00000000000000000100.log`), if it is."""
    return segment_base_offset(_name(uri))


class _OffsetOrder:
    """Follows the batches of one segment in file order and reports those out of order.

    A single batch whose offset field jumped (a flipped byte: 99, 155, 101) breaks the order
    with both neighbours; when the batch after it fits the one before it, the jumping batch is
    the one reported, not its innocent successor.
    """

    def __init__(self, segment: SegmentFile) -> None:
        self.segment = segment
        self.named = name_offset(segment.uri)
        self.before: _Head | None = None
        self.previous: _Head | None = None

    def see(self, head: _Head) -> list[OffsetDisorder]:
        found: list[OffsetDisorder] = []
        before, previous = self.before, self.previous
        if previous is None:
            if self.named is not None and head.first < self.named:
                found.append(
                    self._disorder(
                        head,
                        f"first batch at byte {head.position} has base offset {head.first}, "
                        f"below the segment's base offset {self.named} (its file name)",
                    )
                )
        elif head.first <= previous.last:
            spike = before is not None and previous.first > before.last and head.first > before.last
            if spike and before is not None:
                found.append(
                    self._disorder(
                        previous,
                        f"batch at byte {previous.position} has offset {previous.first}, out of "
                        f"order between offsets {before.last} (byte {before.position}) and "
                        f"{head.first} (byte {head.position})",
                    )
                )
            else:
                found.append(
                    self._disorder(
                        head,
                        f"batch at byte {head.position} has offset {head.first}, not above the "
                        f"last offset {previous.last} of the batch before it "
                        f"(byte {previous.position})",
                    )
                )
        self.before, self.previous = previous, head
        return found

    def _disorder(self, head: _Head, reason: str) -> OffsetDisorder:
        segment = self.segment
        return OffsetDisorder(
            segment.uri, segment.topic, segment.partition, head.position, head.first, reason
        )


def _range(segment: SegmentFile, start: int, end: int) -> SegmentRange:
    return SegmentRange(segment.uri, segment.topic, segment.partition, start, end)


def _region(
    segment: SegmentFile, start: int, end: int, reason: str, offset: int | None
) -> CorruptRegion:
    return CorruptRegion(segment.uri, segment.topic, segment.partition, start, end, reason, offset)


def _reader(handle: IO[bytes]) -> ReadAt:
    def read(pos: int, count: int) -> bytes:
        handle.seek(pos)
        return handle.read(count)

    return read


def _step(handle: IO[bytes], pos: int, size: int) -> _Head | tuple[str, int | None]:
    """The batch at `pos` (where it ends, its offsets), or why it cannot be stepped over (its
    frame is broken) and its offset if the header is sane and only its bytes run short."""
    handle.seek(pos)
    head = handle.read(min(_V2_HEAD, size - pos))
    end = frame_end(head, pos, size)
    if not isinstance(end, int):
        return str(end), _offset_if_only_short(head)
    offset = _PREFIX.unpack_from(head)[0]
    last = offset
    if head[16] == 2:  # a magic 2 frame is long enough to hold lastOffsetDelta
        last = offset + _V2_LAST_DELTA.unpack_from(head, _V2_LAST_DELTA_POS)[0]
    return _Head(pos, end, offset, last)


def _offset_if_only_short(head: bytes) -> int | None:
    """The offset of a batch whose header is sane but whose bytes run short (a file's truncated
    last batch); None when the header itself is broken."""
    if len(head) < _HEAD:
        return None
    offset, length = _PREFIX.unpack_from(head)
    magic = head[16]
    if magic > 2 or length < MIN_LENGTH_BY_MAGIC[magic]:
        return None
    return int(offset)


def _resync(handle: IO[bytes], pos: int, size: int) -> int:
    """The first position >= `pos` where a verifiable magic 2 batch starts, else `size`."""
    return resync(_reader(handle), pos, size)
