"""Counting a batch's records, timestamps and null keys does not copy its keys and values: a
record of many MiB is skimmed, not copied into a new `bytes` while holding the GIL. The skim,
compiled or in pure Python, agrees with the C reader on every batch it accepts and leaves every
other to it (tests/unit/test_skim_compiled.py compares the two skims input by input)."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.protocol.records.readers import read_batch
from kvproxy.protocol.records.record import RecordScan
from kvproxy.protocol.records.skim import SkimV2, python_skim_v2, skim_v2

MiB = 1024 * 1024


def c_reader_scan(batch: bytes) -> RecordScan | type[Exception]:
    """What the C reader finds (skim disabled by reading records one by one)."""
    rb, _ = read_batch(batch)
    try:
        records = list(rb.records())
    except DecodeError as exc:
        return type(exc)
    stamps = [r.timestamp for r in records] or [0]
    return RecordScan(len(records), min(stamps), max(stamps), sum(r.key is None for r in records))


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_a_large_record_is_counted_without_copying_its_value(codec: Codec) -> None:
    batch = build_batch([(b"k", bytes(16 * MiB), None, 5), (None, b"v", None, 7)], codec=codec)
    rb, _ = read_batch(batch)
    rb.plain_size()  # decompressed before measuring
    tracemalloc.start()
    try:
        scan = rb.scan()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (scan.record_count, scan.null_keys) == (2, 1)
    assert peak < MiB, f"{peak} bytes copied to count two records"


def _batches(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(120):
        rows = []
        for _ in range(rng.randint(1, 3)):
            key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 40))
            value = None if rng.random() < 0.1 else bytes(rng.randint(20_000, 70_000))
            headers = [(f"h{n}", rng.choice([None, b"x" * n])) for n in range(rng.randint(0, 2))]
            rows.append((key, value, headers, rng.randint(0, 10**13)))
        out.append(build_batch(rows, timestamp_type=rng.choice([0, 1])))
    return out


@pytest.mark.parametrize("skim", [skim_v2, python_skim_v2], ids=["chosen", "pure-python"])
def test_the_skim_agrees_with_the_c_reader_or_leaves_the_batch_to_it(skim: SkimV2) -> None:
    rng = random.Random(28)
    checked = declined = 0
    for batch in _batches(rng):
        variants = [batch]
        for _ in range(12):  # a byte changed in the records, or the records cut short
            broken = bytearray(batch)
            at = rng.randrange(V2_HEADER_SIZE, min(len(batch), V2_HEADER_SIZE + 200))
            broken[at] ^= 1 << rng.randrange(8)
            variants.append(bytes(broken))
        for variant in variants:
            rb, _ = read_batch(variant)
            count = rb.record_count
            skimmed = skim(
                variant, count, rb.first_timestamp, rb.max_timestamp, rb.timestamp_type == 1
            )
            expected = c_reader_scan(variant)
            if skimmed is None:
                declined += 1
                continue
            checked += 1
            assert skimmed == expected, variant[:100]
            assert rb.scan() == expected
    assert checked >= 40 and declined >= 40


def test_a_malformed_batch_of_large_records_gets_the_c_readers_error() -> None:
    batch = bytearray(build_batch([(b"k", bytes(100_000), None, None)]))
    batch[V2_HEADER_SIZE] ^= 0x02  # the record's length prefix no longer matches
    rb, _ = read_batch(bytes(batch))
    expected = c_reader_scan(bytes(batch))
    assert isinstance(expected, type)
    with pytest.raises(expected):
        rb.scan()
