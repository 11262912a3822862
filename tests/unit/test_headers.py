"""Header versions per (api key, version), as Kafka chooses them, and exact header round-trips."""

from __future__ import annotations

import pytest

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, UnsupportedVersion
from kvproxy.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    is_flexible,
    read_request_header,
    read_request_prefix,
    read_response_header,
    request_header_version,
    response_header_version,
    write_request_header,
    write_response_header,
)


@pytest.mark.parametrize(
    ("api_key", "version", "request_version", "response_version"),
    [
        (0, 0, 1, 0),  # Produce v0, hand-written schema
        (0, 2, 1, 0),
        (0, 8, 1, 0),
        (0, 9, 2, 1),  # Produce turns flexible at v9
        (0, 12, 2, 1),
        (3, 8, 1, 0),  # Metadata turns flexible at v9
        (3, 9, 2, 1),
        (10, 2, 1, 0),  # FindCoordinator turns flexible at v3
        (10, 3, 2, 1),
        (18, 2, 1, 0),  # ApiVersions turns flexible at v3 ...
        (18, 3, 2, 0),  # ... but its response header is always v0
        (32, 0, 1, 0),  # DescribeConfigs v0, hand-written schema
        (32, 4, 2, 1),
        (60, 0, 2, 1),  # DescribeCluster is flexible from v0
        (1, 11, 1, 0),  # an API the proxy relays without decoding still gets the right header
        (1, 12, 2, 1),
    ],
)
def test_header_versions_follow_kafka(
    api_key: int, version: int, request_version: int, response_version: int
) -> None:
    assert request_header_version(api_key, version) == request_version
    assert response_header_version(api_key, version) == response_version


def test_unknown_pair_is_reported_not_guessed() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        is_flexible(0, 99)
    assert (info.value.api_key, info.value.api_version) == (0, 99)
    assert info.value.error_code == 35
    with pytest.raises(UnsupportedVersion):
        request_header_version(9999, 0)


V1 = b"\x00\x03\x00\x05\x00\x00\x00\x07\x00\x03abc"  # Metadata v5, correlation 7, client "abc"
V2 = b"\x00\x03\x00\x0c\x00\x00\x00\x07\xff\xff\x01\x00\x02hi"  # Metadata v12, null client, 1 tag


def test_read_request_header_v1() -> None:
    header, end = read_request_header(V1)
    assert header == RequestHeader(3, 5, 7, "abc", 1, b"")
    assert end == len(V1)


def test_read_request_header_v2_keeps_tagged_fields() -> None:
    header, end = read_request_header(V2)
    assert header.client_id is None
    assert header.header_version == 2
    assert header.tagged_fields == b"\x01\x00\x02hi"
    assert end == len(V2)
    out = bytearray()
    write_request_header(out, header)
    assert bytes(out) == V2


@pytest.mark.parametrize("encoded", [V1, V2])
def test_request_header_fed_whole_byte_by_byte_and_with_trailing_bytes(encoded: bytes) -> None:
    for size in range(len(encoded)):
        with pytest.raises(BufferUnderflow):
            read_request_header(encoded[:size])
    header, end = read_request_header(encoded + b"trailing")
    assert end == len(encoded)
    out = bytearray()
    write_request_header(out, header)
    assert bytes(out) == encoded


def test_request_prefix_reads_any_api() -> None:
    (api_key, version, correlation), end = read_request_prefix(b"\x7f\x00\x00\x63\x00\x00\x01\x00")
    assert (api_key, version, correlation, end) == (32512, 99, 256, 8)


def test_client_id_must_be_utf8() -> None:
    with pytest.raises(DecodeError, match="UTF-8"):
        read_request_header(b"\x00\x03\x00\x05\x00\x00\x00\x07\x00\x02\xff\xfe")


@pytest.mark.parametrize(
    ("api_key", "version", "encoded"),
    [(3, 5, b"\x00\x00\x00\x09"), (3, 12, b"\x00\x00\x00\x09\x00"), (18, 3, b"\x00\x00\x00\x09")],
)
def test_response_header_round_trip(api_key: int, version: int, encoded: bytes) -> None:
    header, end = read_response_header(encoded + b"body", 0, api_key, version)
    assert header.correlation_id == 9
    assert end == len(encoded)
    out = bytearray()
    write_response_header(out, header)
    assert bytes(out) == encoded
    for size in range(len(encoded)):
        with pytest.raises(BufferUnderflow):
            read_response_header(encoded[:size], 0, api_key, version)


def test_response_header_v1_default_writes_empty_tag_section() -> None:
    out = bytearray()
    write_response_header(out, ResponseHeader(5, 1))
    assert bytes(out) == b"\x00\x00\x00\x05\x00"


@pytest.mark.parametrize(("api_key", "version"), [(1, 0), (1, 3), (2, 0), (9, 0)])
def test_versions_removed_by_kafka_4_are_known_and_not_flexible(api_key: int, version: int) -> None:
    assert is_flexible(api_key, version) is False
    assert response_header_version(api_key, version) == 0
