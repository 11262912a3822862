"""kvproxy/protocol/journal.py: the quarantine journal's entry format."""

from __future__ import annotations

import json
import random
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, EncodeError
from kvproxy.protocol.journal import (
    HEADER_SIZE,
    MAGIC,
    CorruptEntry,
    encode_entry,
    iter_entries,
    read_entry,
    write_entry,
)
from kvproxy.protocol.records import build_batch

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
METADATA = st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=8)

SAMPLE_METADATA = {"id": "ab" * 16, "topic": "orders", "partition": 3, "indexes": [0, 2]}
SAMPLE_RECORDS = build_batch([(b"k", b"v", None, 1), (None, b"\xff\x00", [("h", b"x")], 2)])


def test_layout_byte_by_byte() -> None:
    data = encode_entry({"a": 1}, b"xyz")
    meta = b'{"a":1}'
    body = struct.pack(">I", len(meta)) + meta + b"xyz"
    assert data == MAGIC + struct.pack(">II", len(body), crc32c.crc32c(body)) + body
    assert len(data) == HEADER_SIZE + 4 + len(meta) + 3  # 4: the metadata's length


def test_round_trip_with_real_batch() -> None:
    data = encode_entry(SAMPLE_METADATA, SAMPLE_RECORDS)
    (metadata, records), end = read_entry(data, 0)
    assert metadata == SAMPLE_METADATA
    assert records == SAMPLE_RECORDS
    assert end == len(data)


def test_empty_records_and_memoryview_input() -> None:
    data = encode_entry({}, memoryview(b""))
    assert read_entry(memoryview(data)) == (({}, b""), len(data))


def test_non_ascii_metadata_is_utf8() -> None:
    data = encode_entry({"topic": "café"}, b"")
    assert "café".encode() in data
    assert read_entry(data)[0][0] == {"topic": "café"}


def test_lone_surrogates_still_encode() -> None:
    text = b"bad \xff byte".decode("utf-8", "surrogateescape")
    data = encode_entry({"message": text}, b"")
    assert read_entry(data)[0][0] == {"message": text}


@pytest.mark.parametrize("metadata", [{"x": object()}, {"x": float("nan")}, [1, 2]])
def test_unencodable_metadata_raises_encode_error(metadata: object) -> None:
    out = bytearray(b"prefix")
    with pytest.raises(EncodeError):
        write_entry(out, metadata, b"")  # type: ignore[arg-type]
    assert out == b"prefix"


@settings(max_examples=200, deadline=None)
@given(metadata=METADATA, records=st.binary(max_size=300))
def test_round_trip_property(metadata: dict[str, object], records: bytes) -> None:
    out = bytearray(b"\x00\x01")  # an entry can start anywhere in the buffer
    write_entry(out, metadata, records)
    (read_metadata, read_records), end = read_entry(out, 2)
    assert read_metadata == metadata
    assert read_records == records
    assert end == len(out)


def test_every_proper_prefix_is_buffer_underflow() -> None:
    data = encode_entry(SAMPLE_METADATA, SAMPLE_RECORDS)
    for cut in range(len(data)):
        with pytest.raises(BufferUnderflow):
            read_entry(data[:cut], 0)


def test_trailing_bytes_are_left_for_the_next_read() -> None:
    first = encode_entry({"n": 1}, b"one")
    second = encode_entry({"n": 2}, b"")
    buf = first + second + b"KVQ"
    (metadata, records), end = read_entry(buf, 0)
    assert (metadata, records, end) == ({"n": 1}, b"one", len(first))
    assert read_entry(buf, end)[0] == ({"n": 2}, b"")
    with pytest.raises(BufferUnderflow):
        read_entry(buf, len(first) + len(second))


def test_iter_entries_yields_then_raises_at_the_torn_tail() -> None:
    entries = [encode_entry({"n": n}, bytes([n]) * n) for n in range(4)]
    buf = b"".join(entries)
    seen = []
    with pytest.raises(BufferUnderflow):
        for start, end, metadata, records in iter_entries(buf + entries[0][:-1]):
            seen.append((start, end, metadata["n"], records))
    assert [n for _, _, n, _ in seen] == [0, 1, 2, 3]
    assert seen[-1][1] == len(buf)
    assert len(list(iter_entries(buf))) == 4


def test_every_bit_flip_is_detected() -> None:
    data = encode_entry(SAMPLE_METADATA, SAMPLE_RECORDS)
    for position in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[position] ^= 1 << bit
            with pytest.raises(DecodeError) as caught:
                read_entry(bytes(flipped), 0)
            # A flip in the length field can make the entry look longer than the buffer (a torn
            # tail, BufferUnderflow); anywhere else it must be CorruptEntry. Never a value.
            if not 4 <= position < 8:
                assert isinstance(caught.value, CorruptEntry), (position, bit)


def test_bad_magic_is_corrupt_even_when_short() -> None:
    with pytest.raises(CorruptEntry):
        read_entry(b"KX", 0)
    with pytest.raises(CorruptEntry):
        read_entry(b"garbage that is long enough", 0)


def _entry_with_body(body: bytes) -> bytes:
    return MAGIC + struct.pack(">II", len(body), crc32c.crc32c(body)) + body


@pytest.mark.parametrize(
    "body",
    [
        struct.pack(">I", 2) + b"[]",  # JSON, but not an object
        struct.pack(">I", 1) + b"7",
        struct.pack(">I", 3) + b"{no",  # not JSON
        struct.pack(">I", 2) + b"\xff\xfe",  # not UTF-8
        struct.pack(">I", 50) + b"{}",  # metadata longer than the body
        b"",  # body shorter than meta_length
    ],
)
def test_well_framed_but_wrong_body_is_corrupt(body: bytes) -> None:
    with pytest.raises(CorruptEntry):
        read_entry(_entry_with_body(body), 0)


def test_huge_length_is_corrupt_not_underflow() -> None:
    with pytest.raises(CorruptEntry):
        read_entry(MAGIC + struct.pack(">II", 0x80000000, 0), 0)


def test_negative_offset() -> None:
    with pytest.raises(CorruptEntry):
        read_entry(encode_entry({}, b""), -1)


def test_ten_thousand_random_inputs_raise_only_decode_errors() -> None:
    rng = random.Random(20261122)
    valid = encode_entry(SAMPLE_METADATA, SAMPLE_RECORDS)
    outcomes = {"ok": 0, "error": 0}
    for i in range(10_000):
        kind = i % 4
        if kind == 0:  # pure noise, often with the magic in front to get past it
            data = (MAGIC if rng.random() < 0.7 else b"") + rng.randbytes(rng.randrange(40))
        elif kind == 1:  # a valid entry with random bytes overwritten
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        elif kind == 2:  # a valid entry cut or extended
            data = valid[: rng.randrange(len(valid) + 1)] + rng.randbytes(rng.randrange(8))
        else:  # a correctly framed body of random bytes (CRC right, content arbitrary)
            body = struct.pack(">I", rng.randrange(64)) + rng.randbytes(rng.randrange(64))
            if rng.random() < 0.5:
                meta = json.dumps(rng.choice([[], 1, "s", None, {"a": [1]}])).encode()
                body = struct.pack(">I", len(meta)) + meta + rng.randbytes(rng.randrange(8))
            data = _entry_with_body(body)
        try:
            (metadata, _), _ = read_entry(data, 0)
        except DecodeError:
            outcomes["error"] += 1
        else:
            assert isinstance(metadata, dict)
            outcomes["ok"] += 1
    assert outcomes["error"] > 5_000
    assert outcomes["ok"] + outcomes["error"] == 10_000
