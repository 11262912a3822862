"""Writing log segments for the audit tests, the way a broker lays them out."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka.record import MemoryRecords

from kvproxy.protocol.records import read_batch

TESTDATA_LOGS = Path(__file__).resolve().parents[1] / "data" / "kafka-logs"


@dataclass(frozen=True)
class Placed:
    """Where one batch landed in a written segment."""

    position: int
    base_offset: int
    data: bytes


def assign_offsets(batches: Sequence[bytes], first_offset: int = 0) -> list[bytes]:
    """Give each batch the offsets the broker would: consecutive, from `first_offset`.

    The offset field is outside the CRC, so rewriting it keeps every batch valid. A magic 1
    wrapper stores its last inner offset (its inner offsets are relative); a magic 0 part must be
    one uncompressed message.
    """
    out = []
    offset = first_offset
    for data in batches:
        batch, end = read_batch(data)
        assert end == len(data), "one batch (or one legacy message) per part"
        count = batch.last_offset_delta + 1 if batch.magic == 2 else batch.record_count
        stored = offset + count - 1 if batch.magic == 1 else offset
        out.append(struct.pack(">q", stored) + data[8:])
        offset += count
    return out


def write_segment(folder: Path, topic: str, partition: int, parts: Sequence[bytes]) -> Path:
    """`<folder>/<topic>-<partition>/00000000000000000000.log` holding `parts` back to back."""
    directory = folder / f"{topic}-{partition}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "00000000000000000000.log"
    path.write_bytes(b"".join(parts))
    return path


def placements(parts: Sequence[bytes]) -> list[Placed]:
    out = []
    position = 0
    for data in parts:
        base_offset = struct.unpack_from(">q", data)[0] if len(data) >= 8 else -1
        out.append(Placed(position, base_offset, data))
        position += len(data)
    return out


def independent_offsets(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, key) of every record, as kafka-python's reader sees them."""
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out.extend((r.offset, r.key) for r in batch)
    return out
