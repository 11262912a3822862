"""The record layer against real broker segments, generated batches and kafka-python's reader."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvproxy.protocol.compression import Codec, compress
from kvproxy.protocol.errors import (
    BufferUnderflow,
    CorruptRecords,
    EncodeError,
    UnsupportedCompression,
)
from kvproxy.protocol.records import (
    Record,
    RecordBatch,
    build_batch,
    iter_batches,
    read_batch,
)
from kvproxy.protocol.records.writer import _encode_message
from tests.harness.records_testdata import (
    MAGIC_CODECS,
    SEGMENTS,
    kafka_python_records,
    segment_bytes,
    segment_paths,
)

# -- real segments -------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", sorted(SEGMENTS))
def test_real_segment_counts(folder: str) -> None:
    batches = records = null_keys = 0
    for path in segment_paths(folder):
        for batch in iter_batches(path.read_bytes()):
            batches += 1
            for record in batch.records():
                records += 1
                null_keys += not record.has_key
    assert (batches, records, null_keys) == SEGMENTS[folder]


@pytest.mark.parametrize("folder", sorted(SEGMENTS))
def test_real_segment_crcs_valid_and_headers_consistent(folder: str) -> None:
    data = segment_bytes(folder)
    position = 0
    for batch in iter_batches(data):
        assert batch.crc_valid()
        assert batch.inner_crcs_valid()
        assert batch.magic == 2
        assert batch.codec is Codec.NONE
        assert batch.size == batch.batch_length + 12
        assert bytes(batch.buffer) == data[position : position + batch.size]
        assert batch.record_count == len(list(batch.records()))
        assert batch.last_offset_delta == batch.record_count - 1
        position += batch.size
    assert position == len(data)


@pytest.mark.parametrize("folder", sorted(SEGMENTS))
def test_real_segment_agrees_with_kafka_python(folder: str) -> None:
    data = segment_bytes(folder)
    assert absolute_view(data) == kafka_python_records(data)


def test_read_batch_views_without_copy() -> None:
    data = bytearray(segment_bytes("cities-0"))
    batch, _ = read_batch(data)
    data[20] ^= 0xFF  # a change in the caller's buffer shows through the view
    assert batch.buffer[20] == data[20]


# -- round trips --------------------------------------------------------------------------------

keys = st.one_of(st.none(), st.binary(max_size=40))
header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
timestamps = st.integers(min_value=0, max_value=2**41)


@st.composite
def batch_inputs(draw: st.DrawFn) -> tuple[int, Codec, list[tuple[object, ...]]]:
    magic, codec = draw(st.sampled_from(MAGIC_CODECS))
    headers = header_lists if magic == 2 else st.just([])
    records = draw(st.lists(st.tuples(keys, keys, headers, timestamps), min_size=1, max_size=8))
    return magic, codec, records


def absolute_view(data: bytes) -> list[tuple[object, ...]]:
    """Our records in kafka-python's shape (absolute offsets, None for magic 0's timestamp)."""
    out: list[tuple[object, ...]] = []
    for batch in iter_batches(data):
        records = list(batch.records())
        for record in records:
            if batch.magic == 2:
                offset = batch.base_offset + record.offset_delta
            elif batch.codec is Codec.NONE:
                offset = batch.base_offset
            elif batch.magic == 0:
                offset = record.offset_delta
            else:
                offset = batch.base_offset - records[-1].offset_delta + record.offset_delta
            timestamp = None if record.magic == 0 else record.timestamp
            out.append(
                (offset, timestamp, record.key, record.value, [tuple(h) for h in record.headers])
            )
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_inputs(), st.integers(min_value=0, max_value=2**40))
def test_round_trip_every_magic_and_codec(
    spec: tuple[int, Codec, list[tuple[object, ...]]], base_offset: int
) -> None:
    magic, codec, records = spec
    data = build_batch(records, magic=magic, codec=codec, base_offset=base_offset)  # type: ignore[arg-type]
    batches = list(iter_batches(data))
    decoded = [record for batch in batches for record in batch.records()]
    assert [(r.key, r.value) for r in decoded] == [(k, v) for k, v, _, _ in records]
    assert all(r.magic == magic for r in decoded)
    for batch in batches:
        assert batch.magic == magic
        assert batch.codec is codec
        assert batch.crc_valid()
        assert batch.inner_crcs_valid()
        # the one-pass readers agree with the records
        records_of_batch = list(batch.records())
        scan = batch.scan()
        stamps = [r.timestamp for r in records_of_batch] or [0]
        assert scan.record_count == len(records_of_batch)
        assert (scan.min_timestamp, scan.max_timestamp) == (min(stamps), max(stamps))
        assert scan.null_keys == sum(1 for r in records_of_batch if r.key is None)
        assert list(batch.values()) == [r.value for r in records_of_batch]
    if codec is Codec.NONE and magic < 2:
        assert len(batches) == len(records)
        assert [r.index for r in decoded] == [0] * len(records)
    else:
        assert len(batches) == 1
        assert batches[0].record_count == len(records)
        assert [r.index for r in decoded] == list(range(len(records)))
    if magic == 0:
        assert all(r.timestamp == -1 for r in decoded)
    else:
        assert [r.timestamp for r in decoded] == [ts for _, _, _, ts in records]
    if magic == 2:
        assert [list(r.headers) for r in decoded] == [list(h) for _, _, h, _ in records]
        assert [r.offset_delta for r in decoded] == list(range(len(records)))
        assert batches[0].base_offset == base_offset
    # kafka-python reads Kafka 0.8's lz4 framing only with xxhash installed; everything else it
    # reads independently and must agree with us record for record.
    if not (magic == 0 and codec is Codec.LZ4):
        assert absolute_view(data) == kafka_python_records(data)
        assert [o for o, *_ in absolute_view(data)] == [
            base_offset + i for i in range(len(records))
        ]


def test_v2_header_fields() -> None:
    data = build_batch(
        [(b"k", b"v", [("h", b"x")], 1000), (None, b"w", None, 3000), (b"k2", None, None, 2000)],
        base_offset=42,
        producer_id=7,
        producer_epoch=3,
        base_sequence=11,
        is_transactional=True,
        codec=Codec.ZSTD,
    )
    batch, end = read_batch(data)
    assert end == len(data) == batch.size
    assert (batch.base_offset, batch.last_offset_delta, batch.record_count) == (42, 2, 3)
    assert (batch.first_timestamp, batch.max_timestamp) == (1000, 3000)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, 11)
    assert batch.has_producer_id and batch.is_transactional and not batch.is_control
    assert batch.partition_leader_epoch == -1
    assert batch.timestamp_type == 0
    assert batch.codec is Codec.ZSTD
    records = list(batch.records())
    assert records[0] == Record(0, 0, 1000, b"k", b"v", (("h", b"x"),), 2, 0)
    assert records[1].has_value and not records[1].has_key
    assert not records[2].has_value


def test_log_append_time_gives_batch_time() -> None:
    data = build_batch([(b"a", b"1", None, 5), (b"b", b"2", None, 9)], timestamp_type=1)
    batch, _ = read_batch(data)
    assert batch.timestamp_type == 1 and batch.crc_valid()
    assert [r.timestamp for r in batch.records()] == [9, 9]
    legacy = build_batch(
        [(b"a", b"1", None, 5), (b"b", b"2", None, 9)], magic=1, codec=Codec.GZIP, timestamp_type=1
    )
    wrapper, _ = read_batch(legacy)
    assert wrapper.timestamp_type == 1 and wrapper.max_timestamp == 9
    assert [r.timestamp for r in wrapper.records()] == [9, 9]


def test_control_batch_flag() -> None:
    batch, _ = read_batch(build_batch([(b"\x00\x00\x00\x00", b"", None, 1)], is_control=True))
    assert batch.is_control and batch.crc_valid()


def test_legacy_wrapper_exposes_inner_attributes_and_offsets() -> None:
    data = build_batch(
        [(b"a", b"1", None, 5), (None, b"2", None, 6)], magic=1, codec=Codec.SNAPPY, base_offset=100
    )
    wrapper, _ = read_batch(data)
    assert wrapper.base_offset == 101  # the wrapper carries the last inner offset
    assert wrapper.attributes & 0x07 == Codec.SNAPPY
    assert [(r.offset_delta, r.attributes, r.magic) for r in wrapper.records()] == [
        (0, 0, 1),
        (1, 0, 1),
    ]
    assert wrapper.record_count == 2


def test_builder_refuses_what_kafka_cannot_encode() -> None:
    with pytest.raises(EncodeError):
        build_batch([(b"k", b"v", [("h", b"x")], 1)], magic=1)
    with pytest.raises(EncodeError):
        build_batch([(b"k", b"v", None, 1)], magic=1, codec=Codec.ZSTD)
    with pytest.raises(EncodeError):
        build_batch([(b"k", b"v", None, 1)], magic=0, producer_id=5)
    with pytest.raises(EncodeError):
        build_batch([(b"k", b"v", None, 1)], magic=3)


# -- partial input, trailing bytes -----------------------------------------------------------------


def one_batch_samples() -> list[bytes]:
    samples = [read_batch(segment_bytes("cities-0"))[0].buffer.tobytes()]
    for magic, codec in MAGIC_CODECS:
        records = [(b"key", b"value" * 10, [("h", b"v")] if magic == 2 else None, 1234)]
        if codec is not Codec.NONE or magic == 2:
            records = records * 3
        samples.append(build_batch(records, magic=magic, codec=codec))  # type: ignore[arg-type]
    return samples


@pytest.mark.parametrize(
    "sample",
    one_batch_samples(),
    ids=lambda b: f"magic{b[16]}-codec{b[17 if b[16] < 2 else 22] & 7}-{len(b)}",
)
def test_every_prefix_is_underflow(sample: bytes) -> None:
    for cut in range(len(sample)):
        with pytest.raises(BufferUnderflow):
            read_batch(sample[:cut])
        if cut:  # an empty buffer simply holds no batches
            with pytest.raises(BufferUnderflow):
                list(iter_batches(sample[:cut]))
        assert list(iter_batches(sample[:cut], allow_partial_tail=True)) == []
    batch, end = read_batch(sample)
    assert end == len(sample)
    assert len(list(batch.records())) == batch.record_count


@pytest.mark.parametrize("sample", one_batch_samples())
def test_trailing_bytes_are_ignored_by_read_batch(sample: bytes) -> None:
    prefix = b"\xaa" * 5
    for trailer in (b"", b"\x00", b"garbage" * 10, sample[:20]):
        batch, end = read_batch(prefix + sample + trailer, len(prefix))
        assert end == len(prefix) + len(sample)
        assert bytes(batch.buffer) == sample
        assert batch.crc_valid()
        list(batch.records())


def test_iter_batches_partial_tail() -> None:
    data = segment_bytes("cities-0")
    whole = list(iter_batches(data))
    cut = data[: len(data) - 3]
    with pytest.raises(BufferUnderflow):
        list(iter_batches(cut))
    assert len(list(iter_batches(cut, allow_partial_tail=True))) == len(whole) - 1


# -- nonsense headers ---------------------------------------------------------------------------


def test_length_below_minimum_is_corrupt() -> None:
    data = bytearray(build_batch([(b"k", b"v", None, 1)]))
    struct.pack_into(">i", data, 8, 13)
    with pytest.raises(CorruptRecords):
        read_batch(data)
    struct.pack_into(">i", data, 8, 30)  # enough for a legacy message, not for magic 2
    with pytest.raises(CorruptRecords):
        read_batch(data)


@pytest.mark.parametrize("magic", [3, 4, 127, 0x80, 0xFF])
def test_unknown_magic_is_corrupt(magic: int) -> None:
    data = bytearray(build_batch([(b"k", b"v", None, 1)]))
    data[16] = magic
    with pytest.raises(CorruptRecords):
        read_batch(data)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_is_unsupported_compression(codec_id: int) -> None:
    data = bytearray(build_batch([(b"k", b"v", None, 1)]))
    data[22] = (data[22] & ~7) | codec_id
    with pytest.raises(UnsupportedCompression):
        read_batch(data)


def test_negative_and_wrong_record_counts_are_corrupt() -> None:
    for count in (-1, 0, 2):
        data = bytearray(build_batch([(b"k", b"v", None, 1)]))
        struct.pack_into(">i", data, 57, count)
        batch, _ = read_batch(data)
        with pytest.raises(CorruptRecords):
            list(batch.records())
        with pytest.raises(CorruptRecords):
            batch.scan()
        with pytest.raises(CorruptRecords):
            list(batch.values())


def test_garbage_compressed_payload_is_corrupt() -> None:
    for codec in (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD):
        data = bytearray(build_batch([(b"k", b"v" * 50, None, 1)] * 3, codec=codec))
        data[61:] = b"\x17" * (len(data) - 61)
        batch, _ = read_batch(data)
        with pytest.raises(CorruptRecords):
            list(batch.records())


# -- CRC -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", one_batch_samples())
def test_flipped_byte_breaks_crc(sample: bytes) -> None:
    magic = sample[16]
    first_covered = 21 if magic == 2 else 16
    for position in range(first_covered, len(sample)):
        data = bytearray(sample)
        data[position] ^= 0x01
        try:
            batch, _ = read_batch(data)
        except CorruptRecords:
            continue  # the flip hit the magic or codec bits: refused before any CRC check
        assert not batch.crc_valid(), position
        assert batch.computed_crc() != batch.crc


def test_bad_inner_crc_is_detected() -> None:
    inner = bytearray(
        _encode_message(0, 1, 0, 5, (b"k", b"v")) + _encode_message(1, 1, 0, 6, (b"k", b"w"))
    )
    inner[-1] ^= 0xFF  # corrupt the second message's value, keep its stored CRC
    wrapper = _encode_message(1, 1, int(Codec.GZIP), 6, (None, compress(Codec.GZIP, bytes(inner))))
    batch, _ = read_batch(wrapper)
    assert batch.crc_valid()
    assert not batch.inner_crcs_valid()
    assert len(list(batch.records())) == 2
    good, _ = read_batch(build_batch([(b"k", b"v", None, 5)], magic=1, codec=Codec.GZIP))
    assert good.inner_crcs_valid()


def test_legacy_crc_is_crc32_over_magic_to_end() -> None:
    data = build_batch([(b"k", b"v", None, 1)], magic=1)
    batch, _ = read_batch(data)
    assert batch.crc == zlib.crc32(data[16:]) == batch.computed_crc()


def test_batch_view_repr_names_what_it_is() -> None:
    batch, _ = read_batch(build_batch([(b"k", b"v", None, 1)], codec=Codec.LZ4))
    assert isinstance(batch, RecordBatch)
    assert "LZ4" in repr(batch)
