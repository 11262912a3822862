"""Request and response headers, and which header version each (api key, version) uses.

Kafka picks the header version from the message: flexible message versions (KIP-482) use request
header v2 and response header v1; the rest use request header v1 and response header v0.
ApiVersions responses always use response header v0 so that a client can read the answer before it
knows what the broker supports. (Request header v0 served only ControlledShutdown v0, an
inter-broker API that Kafka 4.0 removed and no client sends.)

Headers are read by hand rather than through kio: the proxy reads one for every frame it relays,
and needs the raw tagged-field bytes to re-encode a header byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from typing import Final

from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, NegativeSize, UnsupportedVersion
from kvproxy.protocol.legacy_messages import LEGACY_SCHEMAS

_API_VERSIONS: Final = 18

_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UNSIGNED_VARINT_MAX_BYTES: Final = 5


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    header_version: int = 1
    tagged_fields: bytes = b""
    """The raw tagged-field section of a v2 header (count included), kept for exact re-encoding."""


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    header_version: int = 0
    tagged_fields: bytes = b""


@cache
def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether the message uses compact types and tagged fields (KIP-482)."""
    legacy = LEGACY_SCHEMAS.get((api_key, api_version))
    if legacy is not None:
        return bool(getattr(legacy[0], "__flexible__", False))
    versions = _kio_versions(api_key)
    if not versions or api_version < 0 or api_version > versions[-1]:
        raise UnsupportedVersion(api_key, api_version)
    if api_version < versions[0]:
        # Kafka 4.0 (KIP-896) removed these old versions from its JSON, hence from kio; all
        # of them predate flexible versions, and old clients and brokers still use them.
        return False
    return bool(load_request_schema(api_key, api_version).__flexible__)


def _kio_versions(api_key: int) -> list[int]:
    name = api_key_map.get(api_key)
    return sorted(schema_name_map[name]) if name is not None else []


def request_header_version(api_key: int, api_version: int) -> int:
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == _API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def read_unsigned_varint(buf: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
    """An unsigned LEB128 varint of at most 5 bytes (Kafka's uvarint)."""
    if offset < len(buf):
        first = buf[offset]
        if first < 0x80:  # one byte: the lengths and counts of small requests
            return first, offset + 1
    result = 0
    shift = 0
    for i in range(_UNSIGNED_VARINT_MAX_BYTES):
        if offset + i >= len(buf):
            raise BufferUnderflow("input ended inside a varint")
        byte = buf[offset + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, offset + i + 1
        shift += 7
    raise DecodeError("varint longer than 5 bytes")


def skip_tagged_fields(buf: bytes | bytearray | memoryview, offset: int) -> int:
    """Offset just past a tagged-field section."""
    count, offset = read_unsigned_varint(buf, offset)
    for _ in range(count):
        _tag, offset = read_unsigned_varint(buf, offset)
        size, offset = read_unsigned_varint(buf, offset)
        offset += size
        if offset > len(buf):
            raise BufferUnderflow("input ended inside a tagged field")
    return offset


def read_request_prefix(
    buf: bytes | bytearray | memoryview, offset: int = 0
) -> tuple[tuple[int, int, int], int]:
    """(api key, api version, correlation id): all a relay needs, for any API, known or not."""
    if len(buf) - offset < _PREFIX.size:
        raise BufferUnderflow("request shorter than its header")
    api_key, api_version, correlation_id = _PREFIX.unpack_from(buf, offset)
    return (api_key, api_version, correlation_id), offset + _PREFIX.size


_NO_TAGGED_FIELDS = b"\x00"
"""An empty tagged-field section, as a header keeps it."""


def read_request_header(
    buf: bytes | bytearray | memoryview,
    offset: int = 0,
    prefix: tuple[tuple[int, int, int], int] | None = None,
) -> tuple[RequestHeader, int]:
    """A whole request header; UnsupportedVersion for an (api key, version) unknown to Kafka.
    `prefix`: what `read_request_prefix` read at `offset`, when it has been read already."""
    known = read_request_prefix(buf, offset) if prefix is None else prefix
    (api_key, api_version, correlation_id), offset = known
    version = request_header_version(api_key, api_version)
    client_id: str | None = None
    tagged = b""
    if version >= 1:
        client_id, offset = _read_nullable_string(buf, offset)
    if version >= 2 and offset < len(buf) and buf[offset] == 0:
        tagged = _NO_TAGGED_FIELDS  # the usual header: no tagged field, one byte
        offset += 1
    elif version >= 2:
        end = skip_tagged_fields(buf, offset)
        tagged = bytes(buf[offset:end])
        offset = end
    header = RequestHeader(api_key, api_version, correlation_id, client_id, version, tagged)
    return header, offset


def write_request_header(out: bytearray, header: RequestHeader) -> None:
    out += _PREFIX.pack(header.api_key, header.api_version, header.correlation_id)
    if header.header_version >= 1:
        _write_nullable_string(out, header.client_id)
    if header.header_version >= 2:
        out += header.tagged_fields or b"\x00"


def read_response_header(
    buf: bytes | bytearray | memoryview, offset: int, api_key: int, api_version: int
) -> tuple[ResponseHeader, int]:
    """The header of the response to a request with this api key and version."""
    if len(buf) - offset < _INT32.size:
        raise BufferUnderflow("response shorter than its header")
    (correlation_id,) = _INT32.unpack_from(buf, offset)
    offset += _INT32.size
    version = response_header_version(api_key, api_version)
    tagged = b""
    if version >= 1:
        end = skip_tagged_fields(buf, offset)
        tagged = bytes(buf[offset:end])
        offset = end
    return ResponseHeader(correlation_id, version, tagged), offset


def write_response_header(out: bytearray, header: ResponseHeader) -> None:
    out += _INT32.pack(header.correlation_id)
    if header.header_version >= 1:
        out += header.tagged_fields or b"\x00"


def _read_nullable_string(
    buf: bytes | bytearray | memoryview, offset: int
) -> tuple[str | None, int]:
    if len(buf) - offset < _INT16.size:
        raise BufferUnderflow("input ended inside a string length")
    (length,) = _INT16.unpack_from(buf, offset)
    offset += _INT16.size
    if length == -1:
        return None, offset
    if length < 0:
        raise NegativeSize(f"string length {length} is negative")
    end = offset + length
    if end > len(buf):
        raise BufferUnderflow("input ended inside a string")
    try:
        return bytes(buf[offset:end]).decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise DecodeError(f"string is not UTF-8: {exc}") from None


def _write_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _INT16.pack(-1)
        return
    encoded = value.encode("utf-8")
    out += _INT16.pack(len(encoded))
    out += encoded
