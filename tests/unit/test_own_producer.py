"""kvproxy.protocol.records.own_producer: a refused batch written again as a plain producer's."""

from __future__ import annotations

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch, read_batches
from kvproxy.protocol.records.own_producer import as_own_producer

ROWS = [
    (b"k0", b"v0", [("h", b"1")], 1_700_000_000_000),
    (None, b"v1", [], 1_700_000_000_001),
    (b"k2", None, [("h", b"2"), ("i", b"3")], 1_700_000_000_002),
]


def fields(raw: bytes) -> list[tuple[object, ...]]:
    return [
        (r.key, r.value, tuple(r.headers), r.timestamp)
        for batch in read_batches(raw)
        for r in batch.records()
    ]


@pytest.mark.parametrize("codec", list(Codec))
def test_every_record_kept_only_the_header_changes(codec: Codec) -> None:
    original = build_batch(
        ROWS,
        codec=codec,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        is_transactional=True,
    )
    again = as_own_producer(original)
    (batch,) = read_batches(again)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert not batch.is_transactional and batch.codec is codec and batch.crc_valid()
    assert again[61:] == original[61:]  # the records, compressed or not, as they were
    assert fields(again) == fields(original)


@pytest.mark.parametrize("codec", list(Codec))
def test_only_the_chosen_records_are_kept(codec: Codec) -> None:
    original = build_batch(ROWS, codec=codec, producer_id=7, producer_epoch=0, base_sequence=0)
    again = as_own_producer(original, keep={0, 2})
    (batch,) = read_batches(again)
    assert batch.producer_id == -1 and batch.codec is codec and batch.crc_valid()
    assert fields(again) == [fields(original)[0], fields(original)[2]]
    assert as_own_producer(original, keep=set()) == b""


def test_legacy_messages_are_kept_as_they_are() -> None:
    legacy = build_batch([(b"k", b"a", None, 5), (b"k", b"b", None, 6)], magic=1)
    assert as_own_producer(legacy) == legacy
    assert fields(as_own_producer(legacy, keep={1})) == [(b"k", b"b", (), 6)]
