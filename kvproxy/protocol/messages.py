"""Decode and encode the Kafka messages the project reads, by (api key, version) from a table.

kio supplies the schemas and its native serializer for every version it generates; the versions
it lacks are declared in `legacy_messages`. A pair missing from `CODECS` raises
`UnsupportedVersion`: the proxy relays such messages opaquely and never guesses a layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Final, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.serial.errors import BufferUnderflow as _KioBufferUnderflow
from kio.serial.errors import SerialError as _KioSerialError

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, EncodeError, UnsupportedVersion
from kvproxy.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    read_request_header,
    read_response_header,
    request_header_version,
    response_header_version,
    write_request_header,
    write_response_header,
)
from kvproxy.protocol.legacy_messages import LEGACY_SCHEMAS
from kvproxy.protocol.schema_reader import entity_reader

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
FIND_COORDINATOR: Final = 10
API_VERSIONS: Final = 18
DESCRIBE_CONFIGS: Final = 32
DESCRIBE_CLUSTER: Final = 60
SHARE_FETCH: Final = 78
SHARE_ACKNOWLEDGE: Final = 79

API_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {
        PRODUCE: "Produce",
        FETCH: "Fetch",
        LIST_OFFSETS: "ListOffsets",
        METADATA: "Metadata",
        FIND_COORDINATOR: "FindCoordinator",
        API_VERSIONS: "ApiVersions",
        DESCRIBE_CONFIGS: "DescribeConfigs",
        DESCRIBE_CLUSTER: "DescribeCluster",
        SHARE_FETCH: "ShareFetch",
        SHARE_ACKNOWLEDGE: "ShareAcknowledge",
    }
)
"""The APIs the project decodes. Everything else passes through the proxy as opaque bytes."""

Reader = Callable[[bytes | bytearray | memoryview, int], tuple[Any, int]]
Writer = Callable[[Any, Any], None]


@dataclass(frozen=True, slots=True)
class MessageCodec:
    """The request and response schema of one (api key, version), with their kio serializers."""

    api_key: int
    api_version: int
    request_type: type
    response_type: type
    read_request_body: Reader
    write_request_body: Writer
    read_response_body: Reader
    write_response_body: Writer

    @property
    def flexible(self) -> bool:
        return bool(getattr(self.request_type, "__flexible__", False))


def _codec(api_key: int, api_version: int, request_type: type, response_type: type) -> MessageCodec:
    return MessageCodec(
        api_key,
        api_version,
        request_type,
        response_type,
        entity_reader(request_type),
        cast(Writer, entity_writer(request_type)),
        entity_reader(response_type),
        cast(Writer, entity_writer(response_type)),
    )


def _table_keys() -> frozenset[tuple[int, int]]:
    keys = {
        (api_key, version)
        for api_key in API_NAMES
        for version in schema_name_map[api_key_map[api_key]]
    }
    keys.update(key for key in LEGACY_SCHEMAS if key[0] in API_NAMES)
    return frozenset(keys)


CODEC_KEYS: Final[frozenset[tuple[int, int]]] = _table_keys()
"""Every (api key, version) of the APIs in `API_NAMES` that Kafka defines."""


@cache
def codec_for(api_key: int, api_version: int) -> MessageCodec:
    """The codec of one (api key, version), built on first use (schemas load lazily)."""
    if (api_key, api_version) not in CODEC_KEYS:
        raise UnsupportedVersion(api_key, api_version)
    legacy = LEGACY_SCHEMAS.get((api_key, api_version))
    if legacy is not None:
        return _codec(api_key, api_version, *legacy)
    return _codec(
        api_key,
        api_version,
        load_request_schema(api_key, api_version),
        load_response_schema(api_key, api_version),
    )


def supported_versions(api_key: int) -> tuple[int, ...]:
    return tuple(sorted(version for key, version in CODEC_KEYS if key == api_key))


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any


@dataclass(frozen=True, slots=True)
class Response:
    header: ResponseHeader
    body: Any


def _read_body(reader: Reader, buf: bytes | bytearray | memoryview, offset: int) -> tuple[Any, int]:
    """Run a kio reader, turning every library failure into the project's DecodeError."""
    try:
        return reader(buf, offset)
    except _KioBufferUnderflow as exc:
        raise BufferUnderflow(str(exc) or "input ended inside the message") from None
    except (_KioSerialError, ValueError, OverflowError, TypeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"{type(exc).__name__}: {exc}") from None


class _Appender:
    """The file-like `write` kio's writers call, appending to the caller's bytearray."""

    __slots__ = ("out",)

    def __init__(self, out: bytearray) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        self.out += data
        return len(data)


def _write_body(writer: Writer, out: bytearray, body: Any) -> None:
    try:
        writer(_Appender(out), body)
    except (_KioSerialError, ValueError, OverflowError, TypeError, AttributeError) as exc:
        raise EncodeError(f"{type(exc).__name__}: {exc}") from None


def read_request(
    buf: bytes | bytearray | memoryview,
    offset: int = 0,
    header: tuple[RequestHeader, int] | None = None,
) -> tuple[Request, int]:
    """A request at `offset`; `header`: its header and where its body starts, when already read."""
    known = read_request_header(buf, offset) if header is None else header
    header_read, offset = known
    codec = codec_for(header_read.api_key, header_read.api_version)
    body, offset = _read_body(codec.read_request_body, buf, offset)
    return Request(header_read, body), offset


def write_request(out: bytearray, request: Request) -> None:
    header = request.header
    codec = codec_for(header.api_key, header.api_version)
    if not isinstance(request.body, codec.request_type):
        raise EncodeError(
            f"body {type(request.body).__name__} does not match api key {header.api_key} "
            f"version {header.api_version}"
        )
    write_request_header(out, header)
    _write_body(codec.write_request_body, out, request.body)


def read_response(
    buf: bytes | bytearray | memoryview, offset: int, api_key: int, api_version: int
) -> tuple[Response, int]:
    codec = codec_for(api_key, api_version)
    header, offset = read_response_header(buf, offset, api_key, api_version)
    body, offset = _read_body(codec.read_response_body, buf, offset)
    return Response(header, body), offset


def write_response(out: bytearray, api_key: int, api_version: int, response: Response) -> None:
    codec = codec_for(api_key, api_version)
    if not isinstance(response.body, codec.response_type):
        raise EncodeError(
            f"body {type(response.body).__name__} does not match api key {api_key} "
            f"version {api_version}"
        )
    write_response_header(out, response.header)
    _write_body(codec.write_response_body, out, response.body)


def _require_whole(frame: bytes | bytearray | memoryview, end: int, what: str) -> None:
    if end != len(frame):
        raise DecodeError(f"{len(frame) - end} unexpected bytes after the {what}")


def decode_request(
    frame: bytes | bytearray | memoryview, header: tuple[RequestHeader, int] | None = None
) -> Request:
    """A whole request frame (size prefix removed); trailing bytes are an error. `header`: its
    header and where its body starts, when already read (`RequestView`)."""
    request, end = read_request(frame, 0, header)
    _require_whole(frame, end, "request")
    return request


def encode_request(request: Request) -> bytes:
    out = bytearray()
    write_request(out, request)
    return bytes(out)


def decode_response(
    frame: bytes | bytearray | memoryview, api_key: int, api_version: int
) -> Response:
    response, end = read_response(frame, 0, api_key, api_version)
    _require_whole(frame, end, "response")
    return response


def encode_response(api_key: int, api_version: int, response: Response) -> bytes:
    out = bytearray()
    write_response(out, api_key, api_version, response)
    return bytes(out)


def make_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: Any
) -> Request:
    """A request with the header version Kafka uses for this (api key, version)."""
    return Request(
        RequestHeader(
            api_key,
            api_version,
            correlation_id,
            client_id,
            request_header_version(api_key, api_version),
        ),
        body,
    )


def make_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> Response:
    """A response with the header version Kafka uses for this (api key, version)."""
    return Response(
        ResponseHeader(correlation_id, response_header_version(api_key, api_version)), body
    )


__all__ = [
    "API_NAMES",
    "CODEC_KEYS",
    "MessageCodec",
    "Request",
    "Response",
    "codec_for",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "make_request",
    "make_response",
    "read_request",
    "read_response",
    "supported_versions",
    "write_request",
    "write_response",
]
