"""Finding the batches in a buffer: `read_batch`, `read_batches`, `iter_batches`."""

from __future__ import annotations

from collections.abc import Iterator

from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.errors import BatchFraming, BufferUnderflow, CorruptRecords
from kvproxy.protocol.records.batch import RecordBatch
from kvproxy.protocol.records.batch_v2 import V2Batch
from kvproxy.protocol.records.layout import (
    LOG_OVERHEAD,
    MAGIC_POS,
    MIN_LENGTH,
    MIN_LENGTH_BY_MAGIC,
    PREFIX,
)
from kvproxy.protocol.records.legacy_batch import LegacyBatch


def read_batch(
    buf: bytes | bytearray | memoryview, offset: int = 0, allowance: Allowance | None = None
) -> tuple[RecordBatch, int]:
    """Read the batch (or legacy message) starting at `offset`; returns it and the offset after.

    BufferUnderflow when the buffer ends inside it; CorruptRecords when its header is nonsense
    (length below the minimum for its magic, magic above 2); UnsupportedCompression for codec
    ids 5-7.
    """
    return _read_batch(_byte_view(buf), offset, allowance)


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _read_batch(
    view: memoryview, offset: int, allowance: Allowance | None = None
) -> tuple[RecordBatch, int]:
    available = len(view) - offset
    if offset < 0:
        raise CorruptRecords(f"negative buffer offset {offset}")
    if available < LOG_OVERHEAD:
        raise BufferUnderflow(f"batch header at byte {offset} needs 12 bytes, {available} left")
    (_, length) = PREFIX.unpack_from(view, offset)
    if length < MIN_LENGTH:
        raise BatchFraming(
            f"batch at byte {offset} has length {length}, below the minimum",
            f"Record size {length} is less than the minimum record overhead ({MIN_LENGTH})",
        )
    if available > MAGIC_POS:
        magic = view[offset + MAGIC_POS]
        if magic > 2:
            raise BatchFraming(
                f"batch at byte {offset} has unknown magic {magic}",
                f"Invalid magic found in record: {magic - 256 if magic > 127 else magic}",
            )
        if length < MIN_LENGTH_BY_MAGIC[magic]:
            raise CorruptRecords(
                f"magic {magic} batch at byte {offset} has length {length}, below the minimum"
            )
    end = offset + LOG_OVERHEAD + length
    if end > len(view):
        raise BufferUnderflow(
            f"batch at byte {offset} needs {end - offset} bytes, {available} left"
        )
    if view[offset + MAGIC_POS] == 2:
        return V2Batch(view[offset:end], allowance), end
    return LegacyBatch(view[offset:end], allowance), end


def read_batches(
    buf: bytes | bytearray | memoryview, allowance: Allowance | None = None
) -> tuple[RecordBatch, ...]:
    """Every batch of `buf`, which must end where its last batch ends (BufferUnderflow if not).

    `tuple(iter_batches(buf))` without the generator: this runs for every partition of every
    produce request."""
    view = _byte_view(buf)
    end = len(view)
    offset = 0
    batches = []
    while offset < end:
        batch, offset = _read_batch(view, offset, allowance)
        batches.append(batch)
    return tuple(batches)


def first_batch_incomplete(buf: bytes | bytearray | memoryview) -> bool:
    """Whether `buf` ends before its first batch does (Kafka's batch iterator then finds no
    batch at all: `ByteBufferLogInputStream` stops quietly at an incomplete batch)."""
    if len(buf) < LOG_OVERHEAD:
        return True
    length: int = PREFIX.unpack_from(buf, 0)[1]
    return LOG_OVERHEAD + length > len(buf)


def iter_batches(
    buf: bytes | bytearray | memoryview, offset: int = 0, *, allow_partial_tail: bool = False
) -> Iterator[RecordBatch]:
    """Every batch until the buffer ends.

    A trailing partial batch raises BufferUnderflow, or ends the iteration silently with
    `allow_partial_tail` (fetch responses and segments being written may end mid-batch).
    """
    view = _byte_view(buf)
    end = len(view)
    while offset < end:
        try:
            batch, offset = _read_batch(view, offset)
        except BufferUnderflow:
            if allow_partial_tail:
                return
            raise
        yield batch
