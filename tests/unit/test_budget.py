"""Memory budgets for decoding: every codec's output counted before it is allocated, the errors
naming the limit, and what a partition held given back."""

from __future__ import annotations

import struct
from unittest import mock

import cramjam
import pytest

from kvproxy.policies.api import RECORD_OBJECT_BYTES, ProducedRecords, parse_records
from kvproxy.protocol import compression
from kvproxy.protocol.budget import (
    Allowance,
    BudgetExhausted,
    InlineLimitReached,
    MemoryBudget,
    ResourceLimit,
)
from kvproxy.protocol.compression import (
    MAX_DECOMPRESSED_BYTES,
    XERIAL_MAGIC,
    Codec,
    compress,
    decompress,
)
from kvproxy.protocol.errors import CorruptRecords, ProtocolError
from kvproxy.protocol.records import build_batch, read_batches

MiB = 1024 * 1024
CODECS = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]


def produced_with(batch: bytes, allowance: Allowance) -> ProducedRecords:
    """One partition's records as a Produce request carries them, counted in `allowance`."""
    produced = parse_records(
        "t",
        0,
        batch,
        produce_version=9,
        acks=1,
        transactional_id=None,
        compacted=None,
        now_ms=0,
        allowance=allowance,
    )
    assert isinstance(produced, ProducedRecords), produced
    return produced


@pytest.mark.parametrize("codec", CODECS)
def test_output_within_the_allowance_is_counted_and_exact(codec: Codec) -> None:
    data = bytes(range(256)) * 4000
    allowance = Allowance(4 * MiB)
    out = decompress(codec, compress(codec, data), allowance=allowance, headroom=7)
    assert bytes(out[7:]) == data
    assert allowance.held == len(out) == len(data) + 7  # what is kept, nothing more
    assert allowance.peak <= 4 * MiB


@pytest.mark.parametrize("codec", CODECS)
def test_output_past_the_allowance_raises_naming_the_limit(codec: Codec) -> None:
    bomb = compress(codec, bytes(3 * MiB))
    budget = MemoryBudget(64 * MiB)
    allowance = Allowance(2 * MiB, budget, name="limits.decode_bytes_per_request")
    with pytest.raises(BudgetExhausted, match=r"limits\.decode_bytes_per_request") as caught:
        decompress(codec, bomb, allowance=allowance)
    assert str(2 * MiB) in str(caught.value)
    assert allowance.held == 0 and budget.in_use == 0  # nothing kept
    assert allowance.peak <= 2 * MiB and budget.peak <= 2 * MiB
    assert isinstance(caught.value, ResourceLimit) and isinstance(caught.value, ProtocolError)
    assert caught.value.error_code == 10  # MESSAGE_TOO_LARGE


def test_the_process_budget_refuses_what_the_request_allowance_would_allow() -> None:
    budget = MemoryBudget(MiB, "limits.decode_memory_bytes")
    allowance = Allowance(64 * MiB, budget)
    with pytest.raises(BudgetExhausted, match=r"limits\.decode_memory_bytes.*retry later"):
        decompress(Codec.ZSTD, compress(Codec.ZSTD, bytes(2 * MiB)), allowance=allowance)
    assert budget.in_use == 0


def test_an_inline_allowance_asks_for_the_work_to_move() -> None:
    allowance = Allowance(MiB, inline=True)
    with pytest.raises(InlineLimitReached):
        decompress(Codec.ZSTD, compress(Codec.ZSTD, bytes(2 * MiB)), allowance=allowance)


def test_without_an_allowance_the_constant_bounds_every_codec() -> None:
    with pytest.raises(CorruptRecords, match="expands beyond"):
        decompress(Codec.ZSTD, compress(Codec.ZSTD, bytes(MAX_DECOMPRESSED_BYTES + 1)))


def test_a_xerial_stream_claiming_a_gibibyte_is_refused_before_allocating() -> None:
    """32 KiB blocks of zeros, as many as make 1 GiB: refused from the blocks' claimed lengths,
    without decompressing one."""
    block = bytes(cramjam.snappy.compress_raw(bytes(32 * 1024)))
    stream = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    stream += (struct.pack(">i", len(block)) + block) * (1024 * 1024 * 1024 // (32 * 1024))
    with mock.patch.object(cramjam.snappy, "decompress_raw_into") as into:
        with pytest.raises(CorruptRecords, match="expands beyond"):
            decompress(Codec.SNAPPY, stream)
        allowance = Allowance(16 * MiB)
        with pytest.raises(BudgetExhausted):
            decompress(Codec.SNAPPY, stream, allowance=allowance)
    into.assert_not_called()
    assert allowance.held == 0


def test_raw_snappy_is_bounded_by_its_claimed_length() -> None:
    raw = bytes(cramjam.snappy.compress_raw(bytes(2 * MiB)))
    assert bytes(decompress(Codec.SNAPPY, raw)) == bytes(2 * MiB)
    with pytest.raises(BudgetExhausted):
        decompress(Codec.SNAPPY, raw, allowance=Allowance(MiB))


def test_a_batch_is_decompressed_into_one_buffer_and_given_back() -> None:
    batch = build_batch([(b"k", bytes(1000), None, 1) for _ in range(1000)], codec=Codec.ZSTD)
    allowance = Allowance(64 * MiB)
    produced = produced_with(batch, allowance)
    scan = produced.batches[0].scan()
    assert scan.record_count == 1000
    plain = allowance.held
    assert 1000 * 1000 < plain < 1000 * 1100  # the decompressed batch, once
    produced.batches[0].scan()
    assert allowance.held == plain  # kept for a second pass, not decompressed again
    records = produced.record_tuple()
    assert len(records) == 1000
    assert allowance.held >= plain + 1000 * RECORD_OBJECT_BYTES
    produced.release()
    assert allowance.held == 0
    assert produced.batches[0].record_count == 1000  # headers stay readable


def test_a_legacy_wrapper_is_decompressed_once_and_counted_from_its_lengths() -> None:
    wrapper = build_batch(
        [(None, b"v%d" % n, None, 5) for n in range(500)], magic=1, codec=Codec.GZIP
    )
    (batch,) = read_batches(wrapper, Allowance(MiB))
    with mock.patch.object(compression, "_bounded", wraps=compression._bounded) as bounded:
        assert batch.record_count == 500
        assert [r.value for r in batch.records()][-1] == b"v499"
        assert batch.inner_crcs_valid()
        assert bounded.call_count == 1


def test_records_past_the_allowance_are_refused_before_they_are_built() -> None:
    batch = build_batch([(None, b"", None, 1) for _ in range(10_000)])
    allowance = Allowance(1 * MiB)
    produced = produced_with(batch, allowance)
    with pytest.raises(BudgetExhausted, match="decoding 10000 records of t-0"):
        produced.record_tuple()
    assert allowance.held == 0
