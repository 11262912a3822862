"""Kafka's record compression codecs, as the Java client and broker frame them.

Everything goes through cramjam (one wheel for gzip, snappy, lz4 and zstd). The Kafka-specific
framing lives here so that `records` only sees plain bytes in and out:

- snappy: the Java client writes xerial-framed streams (16-byte header, then blocks of
  `int32 length + raw snappy`); librdkafka and others may write raw snappy. Both are read.
- lz4: the LZ4 frame format with independent blocks (KIP-57). Kafka 0.8/0.9 (magic 0) computed the
  frame descriptor checksum over the magic number too (KAFKA-3160); `legacy_lz4_checksum=True`
  writes and reads that variant.

What a frame header declares (a zstd window, an lz4 block size, a content size) is charged
before the frame is decoded (`kvproxy.protocol.declared_sizes`). A large output is a private
anonymous mapping, not a `bytearray`: the interpreter zero-fills a `bytearray` while holding the GIL
(tens of milliseconds for 60 MiB, every other thread waiting), where a fresh mapping costs nothing
until the decoder writes it, with the GIL released.

Any failure while decompressing becomes `CorruptRecords`, except a failed allocation, which is
the proxy's own failure (`OutOfMemory`); codec ids 5-7 are `UnsupportedCompression`.
"""

from __future__ import annotations

import mmap
import re
import struct
from enum import IntEnum
from typing import Any, TypeAlias

import cramjam

from kvproxy.protocol.budget import Allowance, OutOfMemory, ResourceLimit
from kvproxy.protocol.declared_sizes import Declared, lz4_declared, zstd_declared
from kvproxy.protocol.errors import CorruptRecords, UnsupportedCompression

Buffer: TypeAlias = bytes | bytearray | memoryview
Plain: TypeAlias = bytearray | memoryview
"""A decompressed payload: writable (the caller fills the headroom), sized to what it holds."""

__all__ = ["Buffer", "Codec", "Plain", "codec_from_id", "compress", "decompress"]


class Codec(IntEnum):
    """The compression id stored in the low three bits of a batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


CODEC_MASK = 0x07

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, min compatible version 1
_XERIAL_BLOCK_SIZE = 32 * 1024
_INT32 = struct.Struct(">i")

# A snappy element of 3 bytes expands to at most 64 bytes; anything claiming more is not snappy
# and must not make us allocate what it claims.
_SNAPPY_MAX_RATIO = 64

MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""A compressed payload that expands beyond this is refused as corrupt (a decompression bomb):
a few KiB of zstd can claim gigabytes. 64 MiB is far above what Kafka producers write into one
batch (batch.size defaults to 16 KiB, max.request.size to 1 MiB)."""
_FIRST_GUESS_RATIO = 16
_MAPPED_FROM = 256 * 1024
"""Outputs from this size on are mapped (`_Output.buffer`); smaller ones are a bytearray."""

_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"


_CODEC_BY_ID: dict[int, Codec] = {codec.value: codec for codec in Codec}


def codec_from_id(codec_id: int) -> Codec:
    """The codec for an attributes value's compression bits; ids Kafka never defined are refused.

    A dict lookup rather than `Codec(id)`: it runs once per batch, and the enum call costs more
    than the rest of reading a batch header.
    """
    codec = _CODEC_BY_ID.get(codec_id & CODEC_MASK)
    if codec is None:
        raise UnsupportedCompression(f"unknown compression codec id {codec_id & 7}")
    return codec


def compress(codec: Codec | int, data: Buffer, *, legacy_lz4_checksum: bool = False) -> bytes:
    """Compress `data` the way the Java client frames it for `codec`."""
    codec = codec_from_id(codec) if not isinstance(codec, Codec) else codec
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec is Codec.SNAPPY:
        return _xerial_encode(data)
    if codec is Codec.LZ4:
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(data)
        frame = bytes(compressor.finish())
        return _lz4_set_header_checksum(frame, legacy=True) if legacy_lz4_checksum else frame
    return bytes(cramjam.zstd.compress(data, level=3))


def decompress(
    codec: Codec | int,
    data: Buffer,
    *,
    legacy_lz4_checksum: bool = False,
    allowance: Allowance | None = None,
    headroom: int = 0,
    what: str = "compressed records",
) -> Plain:
    """Decompress a Kafka-framed payload; anything that does not decode is `CorruptRecords`,
    a decompressor that cannot allocate its memory `OutOfMemory`.

    The result starts with `headroom` bytes for the caller to fill (a batch header, so that the
    plain batch is one buffer, never a copy of the payload). Without an allowance a payload that
    expands beyond MAX_DECOMPRESSED_BYTES is refused as corrupt; with one, every buffer is
    counted in it before it is allocated, and a payload that needs more than it has left raises
    the allowance's `BudgetExhausted` (or `InlineLimitReached`).
    """
    codec = codec_from_id(codec) if not isinstance(codec, Codec) else codec
    output = _Output(allowance, headroom, what)
    try:
        if codec is Codec.NONE:
            return output.whole(data)
        if codec is Codec.GZIP:
            return _bounded(cramjam.gzip, data, output, _gzip_declared(data))
        if codec is Codec.SNAPPY:
            if bytes(data[:8]) == XERIAL_MAGIC:
                return _xerial_decode(data, output)
            return _snappy_raw_decode(data, output)
        if codec is Codec.LZ4:
            if legacy_lz4_checksum:
                data = _lz4_set_header_checksum(bytes(data), legacy=False)
            return _bounded(cramjam.lz4, data, output, lz4_declared(data))
        return _bounded(cramjam.zstd, data, output, zstd_declared(data))
    except (CorruptRecords, ResourceLimit):
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError, ValueError, ...
        if isinstance(exc, MemoryError) or _ALLOCATION_FAILED.search(str(exc)):
            raise OutOfMemory(
                f"{output.what} could not be decompressed: the proxy ran out of memory "
                f"({exc or type(exc).__name__}); retry later"
            ) from exc
        raise CorruptRecords(f"{codec.name.lower()} payload does not decompress: {exc}") from exc


_ALLOCATION_FAILED = re.compile(
    r"allocation error|allocation_failed|memory allocation|out of memory|not enough memory",
    re.IGNORECASE,
)
"""How cramjam's codecs say an allocation failed (zstd: "Allocation error : not enough memory",
lz4: "ERROR_allocation_failed"); a frame that asks for more than any decoder allows ("Frame
requires too much memory for decoding") is the data's fault and stays corrupt."""


class _Output:
    """Where decompressed bytes go: buffers counted in an allowance, or bounded by the constant."""

    __slots__ = ("allowance", "headroom", "what")

    def __init__(self, allowance: Allowance | None, headroom: int, what: str) -> None:
        self.allowance = allowance
        self.headroom = headroom
        self.what = what

    def limit(self) -> int:
        """The most a payload may expand to (headroom excluded)."""
        if self.allowance is None:
            return MAX_DECOMPRESSED_BYTES
        return max(0, self.allowance.available() - self.headroom)

    def buffer(self, size: int) -> bytearray | mmap.mmap:
        """A buffer of `size` payload bytes plus the headroom, counted before it is allocated:
        from `_MAPPED_FROM` bytes on a fresh anonymous mapping, which costs no memory and no
        time until the decoder writes it (a bytearray is zero-filled holding the GIL)."""
        total = size + self.headroom
        if self.allowance is not None:
            self.allowance.take(total, self.what)
        if total < _MAPPED_FROM:
            return bytearray(total)
        return mmap.mmap(-1, total)

    def shrink(self, out: bytearray | mmap.mmap, written: int) -> Plain:
        """`out` cut to what was written (no copy), the rest given back: a mapping's pages past
        what was written were never touched and hold no memory."""
        end = self.headroom + written
        if self.allowance is not None:
            self.allowance.give_back(len(out) - end)
        if isinstance(out, bytearray):
            del out[end:]
            return out
        return memoryview(out)[:end]

    def drop(self, out: bytearray | mmap.mmap) -> None:
        if self.allowance is not None:
            self.allowance.give_back(len(out))
        if isinstance(out, mmap.mmap):
            out.close()

    def hold_working(self, declared: Declared) -> int:
        """Count the memory the decoder itself will hold (a window, block buffers) before it
        runs; returns what to give back once it is done."""
        working = declared.working
        if working <= 0:
            return 0
        if self.allowance is None:  # tools reading a file, not a request: the decoder's limits
            return 0
        self.allowance.take(working, f"{self.what} (its decoder's window)")
        return working

    def give_back(self, nbytes: int) -> None:
        if self.allowance is not None and nbytes:
            self.allowance.give_back(nbytes)

    def too_large(self, compressed: int) -> ResourceLimit | CorruptRecords:
        """The error for a payload that expands beyond `limit()`."""
        if self.allowance is None:
            return CorruptRecords(
                f"payload of {compressed} bytes expands beyond {MAX_DECOMPRESSED_BYTES} bytes"
            )
        return self.allowance.refusal(self.allowance.available() + 1, self.what)

    def whole(self, data: Buffer) -> bytearray:
        """`data` copied after the headroom."""
        if len(data) > self.limit():
            raise self.too_large(len(data))
        if self.allowance is not None:
            self.allowance.take(len(data) + self.headroom, self.what)
        out = bytearray(self.headroom)
        out += data
        return out


def _gzip_declared(data: Buffer) -> int | None:
    """The size a gzip member's trailer gives (ISIZE: the input size modulo 2**32): a first
    guess, since members can be concatenated, and a floor: a valid stream holds at least that
    much, so one whose trailer says more than the allowance has is refused undecoded. Only a
    stream that starts as gzip (magic 1f 8b, deflate) has a trailer to read."""
    if len(data) < 18 or bytes(data[:3]) != b"\x1f\x8b\x08":
        return None  # not gzip at all: decoding it says so (corrupt), its last bytes mean nothing
    return int.from_bytes(bytes(data[-4:]), "little")


def _bounded(codec: Any, data: Buffer, output: _Output, declared: Declared | int | None) -> Plain:
    """`codec.decompress_into(data)` into buffers of bounded size, at most one at a time.

    `declared` is what the headers say: a `Declared` content size is the exact output size
    (decoding fails when the frame holds more: corrupt), an int a first guess; without either,
    16 times the input. A guess that does not fit grows four times, up to the output's limit.
    The decoder's own memory (`Declared.working`) is counted while it runs."""
    frames = declared if isinstance(declared, Declared) else Declared(0, None)
    exact = frames.content
    if exact is not None and exact > output.limit() - frames.working:
        raise output.too_large(len(data))  # before anything is taken
    working = output.hold_working(frames)
    try:
        limit = output.limit()
        if exact is not None:
            if exact > limit:
                raise output.too_large(len(data))
            size = exact
        elif isinstance(declared, int):
            if declared > limit:  # a gzip stream is at least its last member's ISIZE
                raise output.too_large(len(data))
            size = max(1, declared)
        else:
            size = min(limit, max(65536, len(data) * _FIRST_GUESS_RATIO))
        while True:
            out = output.buffer(size)
            try:
                with memoryview(out) as view:
                    written = codec.decompress_into(data, view[output.headroom :])
            except Exception as exc:  # cramjam's DecompressionError: corrupt, or does not fit
                output.drop(out)
                del out
                if "failed to write whole buffer" not in str(exc):
                    raise
                if exact is not None:
                    raise CorruptRecords(
                        f"payload holds more than the {exact} bytes its frames declare"
                    ) from None
                if size >= limit:
                    raise output.too_large(len(data)) from None
                size = min(limit, max(65536, size * 4))
                continue
            return output.shrink(out, int(written))
    finally:
        output.give_back(working)


def _xerial_encode(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    # At least one block: readers that sniff for xerial want more than the 16-byte header.
    for start in range(0, max(len(view), 1), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_claimed(block: Buffer) -> int:
    """The length a raw snappy block says it expands to; refused when no snappy block could."""
    claimed = int(cramjam.snappy.decompress_raw_len(block))
    if claimed > len(block) * _SNAPPY_MAX_RATIO + _SNAPPY_MAX_RATIO:
        raise CorruptRecords(f"snappy block of {len(block)} bytes claims {claimed} bytes")
    return claimed


def _snappy_raw_decode(block: Buffer, output: _Output) -> Plain:
    claimed = _snappy_claimed(block)
    if claimed > output.limit():
        raise output.too_large(len(block))
    out = output.buffer(claimed)
    with memoryview(out) as view:
        written = cramjam.snappy.decompress_raw_into(block, view[output.headroom :])
    return output.shrink(out, int(written))


def _xerial_decode(data: Buffer, output: _Output) -> Plain:
    """A xerial stream: every block's claimed length first (a header read), so the whole
    output is counted and allocated once, then each block decompressed into its place."""
    view = memoryview(data)
    if len(view) < len(_XERIAL_HEADER):
        raise CorruptRecords("xerial snappy stream shorter than its header")
    pos = len(_XERIAL_HEADER)
    blocks: list[tuple[int, int, int]] = []  # (start, end, claimed length)
    total = 0
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecords(f"xerial snappy block length cut off at byte {pos}")
        (block_len,) = _INT32.unpack_from(view, pos)
        pos += 4
        if block_len < 0 or pos + block_len > len(view):
            raise CorruptRecords(f"xerial snappy block of {block_len} bytes at byte {pos - 4}")
        claimed = _snappy_claimed(view[pos : pos + block_len])
        total += claimed
        blocks.append((pos, pos + block_len, claimed))
        pos += block_len
    if total > output.limit():
        raise output.too_large(len(view))
    out = output.buffer(total)
    at = output.headroom
    with memoryview(out) as target:
        for start, end, claimed in blocks:
            written = int(cramjam.snappy.decompress_raw_into(view[start:end], target[at:]))
            if written != claimed:
                raise CorruptRecords(
                    f"snappy block at byte {start} holds {written} bytes, "
                    f"not the {claimed} it claims"
                )
            at += written
    return out if isinstance(out, bytearray) else memoryview(out)


def _lz4_set_header_checksum(frame: bytes, *, legacy: bool) -> bytes:
    """Rewrite the frame descriptor checksum byte: Kafka 0.8/0.9's variant or the standard one.

    Kafka's old code hashed the 4 magic bytes along with the descriptor; the standard hashes the
    descriptor (FLG, BD and the optional content size / dictionary id) only.
    """
    if len(frame) < 7 or frame[:4] != _LZ4_FRAME_MAGIC:
        raise CorruptRecords("lz4 payload does not start with an lz4 frame header")
    flg = frame[4]
    hc_pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if len(frame) <= hc_pos:
        raise CorruptRecords("lz4 frame header cut off")
    hashed = frame[0:hc_pos] if legacy else frame[4:hc_pos]
    checksum = (_xxh32(hashed) >> 8) & 0xFF
    return frame[:hc_pos] + bytes((checksum,)) + frame[hc_pos + 1 :]


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of a short input (the lz4 frame descriptor: at most 19 bytes, so no stripes)."""
    if len(data) >= 16:  # never the case for a frame descriptor; keep the short path honest
        raise CorruptRecords("lz4 frame descriptor too long")
    h = (seed + _P5 + len(data)) & _M32
    pos = 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    for byte in data[pos:]:
        h = (_rotl((h + byte * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h
