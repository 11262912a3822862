"""Refused batches written again as kvproxy's own producer's, for a replay or a dead letter."""

from __future__ import annotations

import struct
from collections.abc import Collection

import crc32c

from kvproxy.protocol.records.layout import (
    CONTROL_BIT,
    TRANSACTIONAL_BIT,
    V2_ATTRIBUTES_POS,
    V2_CRC_POS,
)
from kvproxy.protocol.records.readers import read_batches
from kvproxy.protocol.records.writer import build_batch

_PRODUCER_FIELDS = struct.Struct(">qhi")
_PRODUCER_ID_POS = 43
"""Producer id (int64), epoch (int16) and base sequence (int32) follow each other here."""


def as_own_producer(
    buf: bytes | bytearray | memoryview, keep: Collection[int] | None = None
) -> bytes:
    """The batches of `buf` written again as a plain producer's: producer id, epoch and base
    sequence -1, not transactional, base offset 0, the CRC recomputed; timestamps, headers and
    compression kept.

    What a replay or a dead-letter copy sends: the original producer's id, epoch and sequences
    belong to its own session, and a broker refuses them from anyone else (PRODUCER_FENCED,
    OUT_OF_ORDER_SEQUENCE_NUMBER) or drops them as duplicates. `keep`: the 0-based indexes
    (across all batches, as in `record_errors`) of the records to keep; None keeps every one,
    and then a magic 2 batch keeps its bytes but for the header. A batch with none kept is left
    out; magic 0/1 messages carry no producer fields and are kept or rebuilt as they are.
    Raises `DecodeError` when the records do not decode.
    """
    out = bytearray()
    start = 0
    for batch in read_batches(buf):
        count = max(batch.record_count, 0)
        chosen = (
            None if keep is None else [i - start for i in range(start, start + count) if i in keep]
        )
        start += count
        if chosen is not None and len(chosen) == count:
            chosen = None
        if chosen is None and batch.magic == 2:
            raw = bytearray(batch.buffer)
            attributes = batch.attributes & ~(TRANSACTIONAL_BIT | CONTROL_BIT)
            struct.pack_into(">q", raw, 0, 0)
            struct.pack_into(">h", raw, V2_ATTRIBUTES_POS, attributes)
            _PRODUCER_FIELDS.pack_into(raw, _PRODUCER_ID_POS, -1, -1, -1)
            struct.pack_into(">I", raw, V2_CRC_POS, crc32c.crc32c(bytes(raw[V2_ATTRIBUTES_POS:])))
            out += raw
        elif chosen is None:
            out += batch.buffer
        elif chosen:
            records = tuple(batch.records())
            picked = [records[i] for i in chosen]
            out += build_batch(
                [(r.key, r.value, r.headers, r.timestamp) for r in picked],
                magic=batch.magic,
                codec=batch.codec,
            )
    return bytes(out)
