"""Kafka-framed codecs: round trips, the framings other clients write, and failure mapping."""

from __future__ import annotations

import os

import aiokafka.codec
import cramjam
import kafka.codec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvproxy.protocol.compression import (
    MAX_DECOMPRESSED_BYTES,
    XERIAL_MAGIC,
    Codec,
    codec_from_id,
    compress,
    decompress,
)
from kvproxy.protocol.errors import CorruptRecords, UnsupportedCompression

PAYLOADS = [b"", b"x", b"hello kafka " * 1000, os.urandom(3000), os.urandom(100) + b"\x00" * 70_000]


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_round_trip(codec: Codec, payload: bytes) -> None:
    assert decompress(codec, compress(codec, payload)) == payload
    assert decompress(codec, memoryview(compress(codec, payload))) == payload


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Codec)), st.binary(max_size=5000))
def test_round_trip_any_bytes(codec: Codec, payload: bytes) -> None:
    assert decompress(codec, compress(codec, payload)) == payload


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_other_clients_read_what_we_write(payload: bytes) -> None:
    assert kafka.codec.gzip_decode(compress(Codec.GZIP, payload)) == payload
    assert kafka.codec.snappy_decode(compress(Codec.SNAPPY, payload)) == payload
    assert kafka.codec.lz4_decode(compress(Codec.LZ4, payload)) == payload
    assert kafka.codec.zstd_decode(compress(Codec.ZSTD, payload)) == payload
    assert aiokafka.codec.snappy_decode(compress(Codec.SNAPPY, payload)) == payload


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_we_read_what_other_clients_write(payload: bytes) -> None:
    assert decompress(Codec.GZIP, kafka.codec.gzip_encode(payload)) == payload
    assert decompress(Codec.SNAPPY, kafka.codec.snappy_encode(payload)) == payload  # xerial
    assert (
        decompress(Codec.SNAPPY, kafka.codec.snappy_encode(payload, xerial_compatible=False))
        == payload
    )
    assert decompress(Codec.LZ4, kafka.codec.lz4_encode(payload)) == payload
    assert decompress(Codec.LZ4, aiokafka.codec.lz4_encode(payload)) == payload
    assert decompress(Codec.ZSTD, kafka.codec.zstd_encode(payload)) == payload


def test_snappy_is_xerial_framed_in_blocks() -> None:
    payload = os.urandom(80_000)  # three 32 KiB blocks
    framed = compress(Codec.SNAPPY, payload)
    assert framed.startswith(XERIAL_MAGIC)
    assert decompress(Codec.SNAPPY, framed) == payload
    raw = bytes(cramjam.snappy.compress_raw(payload))
    assert decompress(Codec.SNAPPY, raw) == payload


def test_legacy_lz4_header_checksum() -> None:
    """Kafka 0.8/0.9 hashed the frame magic into the descriptor checksum (KAFKA-3160)."""
    payload = b"legacy lz4 " * 100
    standard = compress(Codec.LZ4, payload)
    legacy = compress(Codec.LZ4, payload, legacy_lz4_checksum=True)
    assert legacy != standard
    assert len(legacy) == len(standard)
    assert decompress(Codec.LZ4, legacy, legacy_lz4_checksum=True) == payload
    with pytest.raises(CorruptRecords):
        decompress(Codec.LZ4, legacy)  # a strict reader refuses the broken checksum
    # Our xxh32 reproduces the standard checksum byte lz4 itself wrote.
    assert decompress(Codec.LZ4, standard, legacy_lz4_checksum=False) == payload


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"not compressed at all",
        XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01\x7f\xff\xff\xff",
    ],
)
def test_garbage_is_corrupt_records(codec: Codec, garbage: bytes) -> None:
    if (codec, garbage) in VALID_ENCODINGS_OF_NOTHING:
        assert decompress(codec, garbage) == b""
        return
    with pytest.raises(CorruptRecords):
        decompress(codec, garbage)


VALID_ENCODINGS_OF_NOTHING = {
    (Codec.SNAPPY, b"\x00"),  # a lone zero is the raw snappy encoding of nothing
}


def test_truncated_payloads_are_corrupt_records() -> None:
    payload = os.urandom(2000)
    for codec in (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD):
        data = compress(codec, payload)
        for cut in (1, len(data) // 2, len(data) - 1):
            try:
                result = decompress(codec, data[:cut])
            except CorruptRecords:
                continue
            assert result != payload


def test_snappy_block_claiming_huge_output_is_refused() -> None:
    with pytest.raises(CorruptRecords):
        decompress(Codec.SNAPPY, b"\xff\xff\xff\xff\x0f\x00")


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_ids(codec_id: int) -> None:
    with pytest.raises(UnsupportedCompression):
        codec_from_id(codec_id)
    with pytest.raises(UnsupportedCompression):
        decompress(codec_id, b"x")
    with pytest.raises(UnsupportedCompression):
        compress(codec_id, b"x")


def test_codec_ids_match_kafka() -> None:
    assert [(c.name, int(c)) for c in Codec] == [
        ("NONE", 0),
        ("GZIP", 1),
        ("SNAPPY", 2),
        ("LZ4", 3),
        ("ZSTD", 4),
    ]
    assert issubclass(UnsupportedCompression, CorruptRecords)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_decompression_is_bounded_and_grows_to_fit(codec: Codec) -> None:
    """A payload expanding far beyond its size still decompresses (the buffer grows), up to
    MAX_DECOMPRESSED_BYTES; beyond that it is refused as corrupt without being expanded."""
    plain = b"kafka " * (2 * 1024 * 1024)  # 12 MiB from well under 1 MiB: several growth steps
    assert decompress(codec, compress(codec, plain)) == plain
    bomb = compress(codec, bytes(MAX_DECOMPRESSED_BYTES + 1))
    with pytest.raises(CorruptRecords, match="expands beyond"):
        decompress(codec, bomb)
