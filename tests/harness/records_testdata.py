"""Shared fixtures for the record-layer tests: the real segments and an independent reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka.record import MemoryRecords

from kvproxy.protocol.compression import Codec

TESTDATA = Path(__file__).resolve().parents[1] / "data"
KAFKA_LOGS = TESTDATA / "kafka-logs"

# folder -> (batches, records, null keys), from the testdata README.
SEGMENTS: dict[str, tuple[int, int, int]] = {
    "cities-0": (11, 11, 11),
    "__consumer_offsets-0": (2, 2, 0),
    "air_quality_data-1": (281, 281, 1),
    "__consumer_offsets-14": (89, 89, 0),
}

# Every (magic, codec) pair Kafka allows: zstd needs magic 2.
MAGIC_CODECS: list[tuple[int, Codec]] = [
    (magic, codec)
    for magic in (0, 1, 2)
    for codec in Codec
    if not (codec is Codec.ZSTD and magic < 2)
]


def segment_paths(folder: str) -> list[Path]:
    return sorted((KAFKA_LOGS / folder).glob("*.log"))


def segment_bytes(folder: str) -> bytes:
    return b"".join(path.read_bytes() for path in segment_paths(folder))


def kafka_python_records(data: bytes) -> list[tuple[Any, ...]]:
    """(offset, timestamp, key, value, headers) as kafka-python's own reader sees them."""
    out: list[tuple[Any, ...]] = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out.extend(
            (r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch
        )
    return out
