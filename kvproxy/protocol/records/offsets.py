"""Where a record sits in its batch's offsets, as a broker's record iterator reports it."""

from __future__ import annotations

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import Record, RecordBatch

__all__ = ["record_offset"]


def record_offset(batch: RecordBatch, record: Record, last_inner: int = 0) -> int:
    """The record's offset as the broker's iterator reports it before assigning offsets.

    Magic 2: base offset + delta. Plain magic 0/1 message: its offset field. Magic 0 wrapper:
    the inner (absolute) offset. Magic 1 wrapper: wrapper offset - last inner + inner, as
    `AbstractLegacyRecordBatch`'s deep iterator computes it (`last_inner` = last inner offset).
    """
    if batch.magic == 2:
        return batch.base_offset + record.offset_delta
    if batch.codec is Codec.NONE:
        return batch.base_offset
    if batch.magic == 0:
        return record.offset_delta
    return batch.base_offset - last_inner + record.offset_delta
