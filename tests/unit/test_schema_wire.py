"""The Confluent wire format: the schema id header and Protobuf's message indexes."""

from __future__ import annotations

import io

import pytest
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from hypothesis import given
from hypothesis import strategies as st

from kvproxy.policies.schemas.wire import (
    SCHEMA_ID_HEADER,
    WireFormatError,
    read_message_indexes,
    read_schema_id,
    write_message_indexes,
)

FRAMED = b"\x00\x00\x01\x02\x03" + b'{"id": 1}'


def test_the_schema_id_is_the_four_big_endian_bytes_after_the_magic_byte() -> None:
    assert read_schema_id(FRAMED) == 0x010203
    assert read_schema_id(b"\x00\xff\xff\xff\xff") == 2**32 - 1
    assert SCHEMA_ID_HEADER == 5


def test_bytes_after_the_header_are_the_payload_and_do_not_matter() -> None:
    assert read_schema_id(FRAMED + b"trailing") == 0x010203


@pytest.mark.parametrize("size", range(SCHEMA_ID_HEADER))
def test_a_value_cut_inside_the_header_says_how_long_it_is(size: int) -> None:
    expected = f"{size} byte{'' if size == 1 else 's'}, a schema id header is 5"
    with pytest.raises(WireFormatError) as raised:
        read_schema_id(FRAMED[:size])
    assert str(raised.value) == expected


@pytest.mark.parametrize("value", [b"{", b'{"id": 1}', b"\x7b\x00\x00\x00\x01"])
def test_a_value_without_the_magic_byte_names_the_byte_it_has(value: bytes) -> None:
    with pytest.raises(WireFormatError, match=r"^magic byte 0x7b, expected 0x00$"):
        read_schema_id(value)


def test_wire_format_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        read_schema_id(b"\x01")


def encoded(indexes: list[int]) -> bytes:
    out = bytearray()
    write_message_indexes(out, indexes)
    return bytes(out)


def test_the_first_message_is_the_single_byte_zero() -> None:
    assert encoded([0]) == b"\x00"
    assert read_message_indexes(b"\x00rest", 0) == ((0,), 1)


def test_an_explicit_count_of_one_zero_index_also_names_the_first_message() -> None:
    assert read_message_indexes(b"\x02\x00", 0) == ((0,), 2)


def test_indexes_are_zigzag_varints_after_a_zigzag_count() -> None:
    assert encoded([1]) == b"\x02\x02"
    assert encoded([1, 0]) == b"\x04\x02\x00"
    assert encoded([64]) == b"\x02\x80\x01"
    assert read_message_indexes(b"\xff\x04\x02\x00payload", 1) == ((1, 0), 4)


@pytest.mark.parametrize("indexes", [[0], [1], [1, 0], [3, 2, 1], [64], [300, 70000]])
def test_the_encoding_is_the_confluent_serializers_own(indexes: list[int]) -> None:
    theirs = io.BytesIO()
    ProtobufSerializer._encode_varints(theirs, indexes)
    assert encoded(indexes) == theirs.getvalue()


@given(
    st.lists(st.integers(min_value=0, max_value=2**62 - 1), min_size=1, max_size=100), st.binary()
)
def test_indexes_round_trip_and_end_where_the_payload_starts(
    indexes: list[int], payload: bytes
) -> None:
    data = b"\x00\x00\x00\x00\x07" + encoded(indexes) + payload
    read, offset = read_message_indexes(data, SCHEMA_ID_HEADER)
    assert list(read) == indexes
    assert data[offset:] == payload


@pytest.mark.parametrize("indexes", [[1], [1, 0], [300, 70000], [2**62 - 1]])
def test_indexes_cut_at_any_byte_are_truncated(indexes: list[int]) -> None:
    whole = encoded(indexes)
    for size in range(len(whole)):
        with pytest.raises(WireFormatError) as raised:
            read_message_indexes(whole[:size], 0)
        assert str(raised.value) == f"message indexes truncated at byte {size}"


def test_no_bytes_at_all_are_truncated_indexes() -> None:
    with pytest.raises(WireFormatError, match=r"^message indexes truncated at byte 5$"):
        read_message_indexes(b"\x00\x00\x00\x00\x01", 5)


def test_a_count_over_the_bound_is_refused_before_reading_the_indexes() -> None:
    with pytest.raises(WireFormatError, match=r"^message index count 101 is not in 1\.\.100$"):
        read_message_indexes(bytes([202, 1]), 0)


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(WireFormatError, match=r"^message index count -1 is not in 1\.\.100$"):
        read_message_indexes(b"\x01\x02", 0)


def test_a_negative_index_is_refused() -> None:
    with pytest.raises(WireFormatError, match=r"^negative message index -2$"):
        read_message_indexes(b"\x02\x03", 0)


def test_a_varint_longer_than_ten_bytes_is_refused() -> None:
    with pytest.raises(
        WireFormatError, match=r"^a message index at byte 1 is longer than 10 bytes$"
    ):
        read_message_indexes(b"\x02" + b"\x80" * 11 + b"\x00", 0)


@pytest.mark.parametrize("indexes", [[], [-1], [2**62], [0] * 101])
def test_the_writer_refuses_what_the_reader_would_refuse(indexes: list[int]) -> None:
    with pytest.raises(ValueError):
        encoded(indexes)
