"""kvproxy.proxy.refusals.dead_letter.dead_letter_records: the copy of a refused batch is kvproxy's
own plain
producer's batch, compressed as the client's was, whatever producer the client was."""

from __future__ import annotations

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch, read_batches
from kvproxy.proxy.refusals.dead_letter import HEADER_POLICY, HEADER_UNREADABLE, dead_letter_records

ROWS = [(b"k%d" % n, b"v%d" % n, (("trace", b"t%d" % n),), 1_700_000_000_000 + n) for n in range(4)]


def copy_of(records: bytes) -> bytes:
    return dead_letter_records(
        records, policy="json", code=87, message="bad", partition=3, client_id="c"
    )


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("transactional", [False, True])
def test_an_idempotent_or_transactional_batch_is_copied_as_a_plain_producers(
    codec: Codec, transactional: bool
) -> None:
    original = build_batch(
        ROWS,
        codec=codec,
        producer_id=7,
        producer_epoch=3,
        base_sequence=42,
        is_transactional=transactional,
    )
    (batch,) = read_batches(copy_of(original))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert not batch.is_transactional and not batch.is_control
    assert batch.codec is codec, "compressed as the client's batch was"
    got = [
        (
            r.key,
            r.value,
            tuple(h for h in r.headers if not h[0].startswith("kvproxy.")),
            r.timestamp,
        )
        for r in batch.records()
    ]
    assert got == ROWS
    assert all(dict(r.headers)[HEADER_POLICY] == b"json" for r in batch.records())


def test_a_batch_that_does_not_decode_travels_uncompressed_as_sent() -> None:
    original = bytearray(build_batch(ROWS, codec=Codec.ZSTD, producer_id=7, producer_epoch=0))
    original[-3:] = b"\xff\xff\xff"  # the compressed payload no longer decompresses
    (batch,) = read_batches(copy_of(bytes(original)))
    assert batch.codec is Codec.NONE and batch.producer_id == -1
    (record,) = batch.records()
    assert record.value == bytes(original)
    assert dict(record.headers)[HEADER_UNREADABLE] == b"1"
