"""`build_batch`: records encoded as a magic 2 batch or a magic 0/1 message set."""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Sequence

import crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kvproxy.protocol.compression import CODEC_MASK, Codec, compress
from kvproxy.protocol.errors import EncodeError
from kvproxy.protocol.records.layout import (
    CONTROL_BIT,
    INT32,
    LOG_OVERHEAD,
    PREFIX,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    V2_ATTRIBUTES_POS,
    V2_CRC_POS,
    V2_HEADER_SIZE,
)
from kvproxy.protocol.records.record import RecordInput


def build_batch(
    records: Sequence[RecordInput],
    *,
    magic: int = 2,
    codec: Codec = Codec.NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = 0,
) -> bytes:
    """Encode records as one magic-2 batch, or as a magic 0/1 message set.

    Magic 0/1 with a codec gives one compressed wrapper message holding the inner messages (inner
    offsets relative for magic 1, absolute for magic 0; the wrapper carries the last offset, as
    the Java producer writes it). Magic 0/1 without a codec gives one message per record.
    """
    codec = Codec(codec)
    if magic == 2:
        return _build_v2(
            records,
            codec=codec,
            base_offset=base_offset,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            attributes_extra=(TRANSACTIONAL_BIT if is_transactional else 0)
            | (CONTROL_BIT if is_control else 0)
            | (TIMESTAMP_TYPE_BIT if timestamp_type else 0),
        )
    if magic not in (0, 1):
        raise EncodeError(f"unknown magic {magic}")
    if codec is Codec.ZSTD:
        raise EncodeError("zstd needs magic 2")
    if producer_id >= 0 or is_transactional or is_control:
        raise EncodeError(f"magic {magic} has no producer id, transactions or control records")
    if magic == 0 and timestamp_type:
        raise EncodeError("magic 0 has no timestamp type")
    return _build_legacy(
        records, magic=magic, codec=codec, base_offset=base_offset, timestamp_type=timestamp_type
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _build_v2(
    records: Sequence[RecordInput],
    *,
    codec: Codec,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    attributes_extra: int,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        2, 0, 0, producer_id, producer_epoch, base_sequence, 2**31 - 1
    )
    now = _now_ms()
    try:
        for index, (key, value, headers, timestamp) in enumerate(records):
            builder.append(
                index,
                now if timestamp is None else timestamp,
                None if key is None else bytes(key),
                None if value is None else bytes(value),
                list(headers or ()),
            )
        plain = builder.build()
    except Exception as exc:  # struct.error, TypeError, OverflowError from the C writer
        raise EncodeError(f"records do not encode as a magic 2 batch: {exc}") from exc
    header = bytearray(plain[:V2_HEADER_SIZE])
    body = bytes(plain[V2_HEADER_SIZE:])
    if codec is not Codec.NONE:
        body = compress(codec, body)
    (attributes,) = struct.unpack_from(">h", header, V2_ATTRIBUTES_POS)
    attributes = (attributes & ~CODEC_MASK) | int(codec) | attributes_extra
    struct.pack_into(">q", header, 0, base_offset)
    struct.pack_into(">i", header, 8, V2_HEADER_SIZE - LOG_OVERHEAD + len(body))
    struct.pack_into(">h", header, V2_ATTRIBUTES_POS, attributes)
    crc = crc32c.crc32c(bytes(header[V2_ATTRIBUTES_POS:]) + body)
    struct.pack_into(">I", header, V2_CRC_POS, crc)
    return bytes(header) + body


def _encode_message(
    offset: int,
    magic: int,
    attributes: int,
    timestamp: int,
    kv: tuple[bytes | None, bytes | None],
) -> bytes:
    parts = [struct.pack(">bb", magic, attributes)]
    if magic == 1:
        parts.append(struct.pack(">q", timestamp))
    for field in kv:
        if field is None:
            parts.append(INT32.pack(-1))
        else:
            parts.append(INT32.pack(len(field)))
            parts.append(bytes(field))
    body = b"".join(parts)
    crc = zlib.crc32(body)
    return PREFIX.pack(offset, 4 + len(body)) + struct.pack(">I", crc) + body


def _build_legacy(
    records: Sequence[RecordInput],
    *,
    magic: int,
    codec: Codec,
    base_offset: int,
    timestamp_type: int,
) -> bytes:
    now = _now_ms()
    ts_bit = TIMESTAMP_TYPE_BIT if timestamp_type else 0
    messages: list[bytes] = []
    timestamps: list[int] = []
    try:
        for index, (key, value, headers, timestamp) in enumerate(records):
            if headers:
                raise EncodeError(f"magic {magic} records cannot carry headers")
            ts = -1 if magic == 0 else (now if timestamp is None else timestamp)
            timestamps.append(ts)
            if codec is Codec.NONE:
                messages.append(
                    _encode_message(base_offset + index, magic, ts_bit, ts, (key, value))
                )
            else:
                inner_offset = index if magic == 1 else base_offset + index
                messages.append(_encode_message(inner_offset, magic, 0, ts, (key, value)))
    except struct.error as exc:
        raise EncodeError(f"records do not encode as magic {magic} messages: {exc}") from exc
    if codec is Codec.NONE:
        return b"".join(messages)
    payload = compress(codec, b"".join(messages), legacy_lz4_checksum=magic == 0)
    wrapper_ts = max(timestamps, default=-1) if magic == 1 else -1
    return _encode_message(
        base_offset + max(len(messages) - 1, 0),
        magic,
        int(codec) | ts_bit,
        wrapper_ts,
        (None, payload),
    )
