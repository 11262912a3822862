"""What a compressed payload's frame headers declare, read before anything is decoded.

A decoder allocates what a frame asks for: a zstd frame's window (up to 128 MiB for a frame of
a few bytes), an lz4 frame's block size (up to 4 MiB). That memory is counted in the request's
allowance before decoding starts, and a frame that declares more than the allowance has is
refused without being decoded. A declared content size also says how large the output will be,
so it is allocated once, not guessed and grown.

Only the headers (and, to find where a frame ends, the block headers) are read: the walk costs
one step per block, at most one per 3 bytes of input. Skippable frames are skipped; anything
else that is not a frame is `CorruptRecords`, as the decoder would find it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kvproxy.protocol.errors import CorruptRecords

__all__ = ["Declared", "lz4_declared", "zstd_declared"]

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK = 0xFFFFFFF0
_SKIPPABLE_MAGIC = 0x184D2A50
_LZ4_MAGIC = 0x184D2204
_U32 = struct.Struct("<I")
_ZSTD_BLOCK_MAX = 128 * 1024
_LZ4_BLOCK_SIZES = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}
_LZ4_LINKED_HISTORY = 64 * 1024


class Declared(NamedTuple):
    """What decoding a payload will hold besides its output (`working`: the largest window or
    block buffers any frame asks for) and the output's size when every frame declares it."""

    working: int
    content: int | None


def zstd_declared(data: bytes | bytearray | memoryview) -> Declared:
    """The zstd frames' largest window (RFC 8878 3.1.1.1.2) and their total content size.

    A single-segment frame (its window is its content size) is decoded straight into an output
    of that size and needs no window; any other frame may need a window buffer of the size it
    declares (at most its content size, when it declares one)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    pos, end = 0, len(view)
    working = 0
    total: int | None = 0
    while pos < end:
        magic = _u32(view, pos, "zstd frame")
        if magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
            pos += 8 + _u32(view, pos + 4, "zstd skippable frame")
            continue
        if magic != _ZSTD_MAGIC:
            raise CorruptRecords(f"zstd payload holds no frame at byte {pos}")
        window, content, checksum, pos = _zstd_frame_header(view, pos + 4)
        pos = _zstd_skip_blocks(view, pos) + checksum
        if content is None:
            working = max(working, window + _ZSTD_BLOCK_MAX)
            total = None
        else:
            if window:  # not single-segment: a streaming decoder may buffer up to the content
                working = max(working, min(window, content) + _ZSTD_BLOCK_MAX)
            if total is not None:
                total += content
    if pos > end:
        raise CorruptRecords("zstd frame cut off")
    return Declared(working, total)


def _zstd_frame_header(view: memoryview, pos: int) -> tuple[int, int | None, int, int]:
    """(window size, 0 for a single-segment frame; content size or None; checksum length;
    position after the header)."""
    if pos >= len(view):
        raise CorruptRecords("zstd frame header cut off")
    descriptor = view[pos]
    pos += 1
    size_flag = descriptor >> 6
    single_segment = descriptor & 0x20
    if descriptor & 0x08:
        raise CorruptRecords("zstd frame header sets its reserved bit")
    window = 0
    if not single_segment:
        if pos >= len(view):
            raise CorruptRecords("zstd frame header cut off")
        exponent, mantissa = view[pos] >> 3, view[pos] & 7
        base = 1 << (10 + exponent)
        window = base + (base >> 3) * mantissa
        pos += 1
    pos += (0, 1, 2, 4)[descriptor & 3]  # dictionary id
    field = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if pos + field > len(view):
        raise CorruptRecords("zstd frame header cut off")
    content: int | None = None
    if field:
        content = int.from_bytes(view[pos : pos + field], "little") + (256 if field == 2 else 0)
    return window, content, 4 if descriptor & 0x04 else 0, pos + field


def _zstd_skip_blocks(view: memoryview, pos: int) -> int:
    """The position after the frame's last block."""
    while True:
        if pos + 3 > len(view):
            raise CorruptRecords("zstd block header cut off")
        header = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
        block_type = (header >> 1) & 3
        if block_type == 3:
            raise CorruptRecords("zstd block of the reserved type")
        pos += 3 + (1 if block_type == 1 else header >> 3)
        if header & 1:
            return pos


def lz4_declared(data: bytes | bytearray | memoryview) -> Declared:
    """The lz4 frames' largest block buffers (LZ4 frame format: block maximum size, twice, plus
    the history of linked blocks) and their total content size."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    pos, end = 0, len(view)
    working = 0
    total: int | None = 0
    while pos < end:
        magic = _u32(view, pos, "lz4 frame")
        if magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
            pos += 8 + _u32(view, pos + 4, "lz4 skippable frame")
            continue
        if magic != _LZ4_MAGIC:
            raise CorruptRecords(f"lz4 payload holds no frame at byte {pos}")
        if pos + 7 > end:
            raise CorruptRecords("lz4 frame header cut off")
        flags, block_descriptor = view[pos + 4], view[pos + 5]
        block_size = _LZ4_BLOCK_SIZES.get((block_descriptor >> 4) & 7)
        if block_size is None:
            raise CorruptRecords(f"lz4 frame declares block size id {block_descriptor >> 4 & 7}")
        linked = not flags & 0x20
        working = max(working, 2 * block_size + (_LZ4_LINKED_HISTORY if linked else 0))
        pos += 6
        if flags & 0x08:
            if pos + 8 > end:
                raise CorruptRecords("lz4 frame header cut off")
            if total is not None:
                total += int.from_bytes(view[pos : pos + 8], "little")
            pos += 8
        else:
            total = None
        pos += (4 if flags & 0x01 else 0) + 1  # dictionary id, header checksum
        block_checksum = 4 if flags & 0x10 else 0
        while True:
            size = _u32(view, pos, "lz4 block")
            pos += 4
            if size == 0:
                break
            pos += (size & 0x7FFFFFFF) + block_checksum
        pos += 4 if flags & 0x04 else 0  # content checksum
    if pos > end:
        raise CorruptRecords("lz4 frame cut off")
    return Declared(working, total)


def _u32(view: memoryview, pos: int, what: str) -> int:
    if pos + 4 > len(view):
        raise CorruptRecords(f"{what} cut off at byte {pos}")
    (value,) = _U32.unpack_from(view, pos)
    return int(value)
