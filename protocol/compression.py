"""Kafka's record compression codecs, as the Java client and broker frame them.

Everything goes through cramjam (one wheel for gzip, snappy, lz4 and zstd). The Kafka-specific
framing lives here so that `records` only sees plain bytes in and out:

- snappy: the Java client writes xerial-framed streams (16-byte header, then blocks of
  `int32 length + raw snappy`); librdkafka and others may write raw snappy. Both are read.
- lz4: the LZ4 frame format with independent blocks (KIP-57). Kafka 0.8/0.9 (magic 0) computed the
  frame descriptor checksum over the magic number too (KAFKA-3160); `legacy_lz4_checksum=True`
  writes and reads that variant.

Any failure while decompressing becomes `CorruptRecords`; codec ids 5-7 are
`UnsupportedCompression`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, TypeAlias

import cramjam

from protocol.errors import CorruptRecords, UnsupportedCompression

Buffer: TypeAlias = bytes | bytearray | memoryview

__all__ = ["Buffer", "Codec", "codec_from_id", "compress", "decompress"]


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


def decompress(codec: Codec | int, data: Buffer, *, legacy_lz4_checksum: bool = False) -> bytes:
    """Decompress a Kafka-framed payload; anything that does not decode is `CorruptRecords`."""
    codec = codec_from_id(codec) if not isinstance(codec, Codec) else codec
    try:
        if codec is Codec.NONE:
            return bytes(data)
        if codec is Codec.GZIP:
            return _bounded(cramjam.gzip, data)
        if codec is Codec.SNAPPY:
            if bytes(data[:8]) == XERIAL_MAGIC:
                return _xerial_decode(data)
            return _snappy_raw_decode(data)
        if codec is Codec.LZ4:
            if legacy_lz4_checksum:
                data = _lz4_set_header_checksum(bytes(data), legacy=False)
            return _bounded(cramjam.lz4, data)
        return _bounded(cramjam.zstd, data)
    except CorruptRecords:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError, ValueError, ...
        raise CorruptRecords(f"{codec.name.lower()} payload does not decompress: {exc}") from exc


def _bounded(codec: Any, data: Buffer) -> bytes:
    """`codec.decompress(data)` into buffers of bounded size: a first guess of 16 times the
    input, then four times larger each time it does not fit, up to MAX_DECOMPRESSED_BYTES."""
    size = min(MAX_DECOMPRESSED_BYTES, max(65536, len(data) * _FIRST_GUESS_RATIO))
    while True:
        out = bytearray(size)
        try:
            written = codec.decompress_into(data, out)
        except Exception as exc:  # cramjam's DecompressionError: corrupt, or does not fit
            if "failed to write whole buffer" not in str(exc):
                raise
            if size >= MAX_DECOMPRESSED_BYTES:
                raise CorruptRecords(
                    f"payload of {len(data)} bytes expands beyond {MAX_DECOMPRESSED_BYTES} bytes"
                ) from None
            size = min(MAX_DECOMPRESSED_BYTES, size * 4)
            del out  # before the larger one is allocated: at most one buffer at a time
            continue
        with memoryview(out) as view:
            return bytes(view[: int(written)])


def _snappy_raw_decode(block: Buffer) -> bytes:
    claimed = cramjam.snappy.decompress_raw_len(block)
    if claimed > len(block) * _SNAPPY_MAX_RATIO + _SNAPPY_MAX_RATIO:
        raise CorruptRecords(f"snappy block of {len(block)} bytes claims {claimed} bytes")
    return bytes(cramjam.snappy.decompress_raw(block))


def _xerial_encode(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    # At least one block: readers that sniff for xerial want more than the 16-byte header.
    for start in range(0, max(len(view), 1), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_decode(data: Buffer) -> bytes:
    view = memoryview(data)
    if len(view) < len(_XERIAL_HEADER):
        raise CorruptRecords("xerial snappy stream shorter than its header")
    pos = len(_XERIAL_HEADER)
    out: list[bytes] = []
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecords(f"xerial snappy block length cut off at byte {pos}")
        (block_len,) = _INT32.unpack_from(view, pos)
        pos += 4
        if block_len < 0 or pos + block_len > len(view):
            raise CorruptRecords(f"xerial snappy block of {block_len} bytes at byte {pos - 4}")
        out.append(_snappy_raw_decode(view[pos : pos + block_len]))
        pos += block_len
    return b"".join(out)


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
