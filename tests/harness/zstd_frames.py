"""zstd frames built by hand: what a frame header declares (window, content size) decides what
a decoder allocates, whatever the frame holds."""

from __future__ import annotations

import struct

import crc32c

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_ATTRIBUTES_POS, V2_CRC_POS, V2_HEADER_SIZE

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_window_frame(window_log: int, content: bytes) -> bytes:
    """A frame declaring a 2**window_log byte window (no content size, no checksum) that holds
    `content` in one raw block."""
    descriptor = b"\x00"  # no content size, not single segment, no checksum, no dictionary
    window = bytes([(window_log - 10) << 3])
    last_raw_block = (len(content) << 3 | 1).to_bytes(3, "little")
    return ZSTD_MAGIC + descriptor + window + last_raw_block + content


def zstd_batch_around(frame_of: bytes | None = None, *, window_log: int = 20) -> bytes:
    """A zstd batch of one record (value b"x") whose compressed payload is the frame built
    from the plain records by `zstd_window_frame`."""
    plain = build_batch([(None, b"x", None, None)], codec=Codec.NONE)
    records = plain[V2_HEADER_SIZE:]
    frame = frame_of if frame_of is not None else zstd_window_frame(window_log, records)
    body = bytearray(plain[:V2_HEADER_SIZE]) + frame
    struct.pack_into(">i", body, 8, len(body) - 12)  # batch length: after offset and length
    (attributes,) = struct.unpack_from(">h", body, V2_ATTRIBUTES_POS)
    struct.pack_into(">h", body, V2_ATTRIBUTES_POS, attributes | Codec.ZSTD)
    struct.pack_into(">I", body, V2_CRC_POS, crc32c.crc32c(bytes(body[V2_ATTRIBUTES_POS:])))
    return bytes(body)


def zstd_window_batch(window_log: int) -> bytes:
    """A zstd batch of one 1-byte record whose frame declares a 2**window_log byte window."""
    return zstd_batch_around(window_log=window_log)


def plain_records() -> bytes:
    """The records part of the one-record batch the frames above hold."""
    return build_batch([(None, b"x", None, None)], codec=Codec.NONE)[V2_HEADER_SIZE:]
