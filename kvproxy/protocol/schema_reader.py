"""A safe reader for kio's message schemas.

kio's native entity reader is fast but unsafe on hostile input: it sizes an array from the length
on the wire before checking that the bytes exist (one 30-byte request made it try to allocate
142 GB and abort the process), it raises on tagged fields it does not know (the protocol says to
skip them), and it rejects error codes newer than its table. Every message the proxy decodes comes
from a peer it does not control, so this module reads kio's schemas with its own field loop:
kio's native primitive readers do the bounds-checked work; arrays are checked against the bytes
that remain, as Kafka's generated Java readers do; unknown tags are skipped; unknown error codes
are kept as `UnknownErrorCode`.

Readers follow the project's convention: `reader(buf, offset) -> (value, new_offset)`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._parse import get_reader

from kvproxy.protocol.errors import BufferUnderflow, DecodeError
from kvproxy.protocol.headers import read_unsigned_varint

Buf = bytes | bytearray | memoryview
FieldReader = Callable[[Buf, int], tuple[Any, int]]

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_NULL_ENTITY: Final = -1


class UnknownErrorCode(int):
    """An error code newer than kio's table: kept as its number so it re-encodes unchanged."""

    retriable = False

    @property
    def value(self) -> int:
        return int(self)

    @property
    def name(self) -> str:
        return f"unknown_error_{int(self)}"


def _read_error_code(buf: Buf, offset: int) -> tuple[Any, int]:
    if len(buf) - offset < _INT16.size:
        raise BufferUnderflow("input ended inside an error code")
    (code,) = _INT16.unpack_from(buf, offset)
    try:
        return ErrorCode(code), offset + _INT16.size
    except ValueError:
        return UnknownErrorCode(code), offset + _INT16.size


def _records(flexible: bool) -> FieldReader:
    """A `records` field as a view of the input, not a copy: a produce request's batches are
    most of its bytes, and the proxy checks and forwards them where they arrived."""

    def read(buf: Buf, offset: int) -> tuple[memoryview | None, int]:
        if flexible:
            encoded, offset = read_unsigned_varint(buf, offset)
            size = encoded - 1
        else:
            if len(buf) - offset < _INT32.size:
                raise BufferUnderflow("input ended inside a records length")
            (size,) = _INT32.unpack_from(buf, offset)
            offset += _INT32.size
        if size == _NULL_ENTITY:
            return None, offset
        if size < 0:
            raise DecodeError(f"records length {size} is negative")
        end = offset + size
        if end > len(buf):
            raise BufferUnderflow(f"records of {size} bytes but only {len(buf) - offset} remain")
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        return view[offset:end].toreadonly(), end

    return read


def _primitive(kafka_type: str, flexible: bool, optional: bool) -> FieldReader:
    if kafka_type == "error_code":
        return _read_error_code
    if kafka_type == "records":
        return _records(flexible)
    sized = get_reader(kafka_type, flexible, optional)

    def read(buf: Buf, offset: int) -> tuple[Any, int]:
        value, size = sized(buf, offset)
        return value, offset + size

    return read


def _array(item: FieldReader, flexible: bool) -> FieldReader:
    def read(buf: Buf, offset: int) -> tuple[Any, int]:
        if flexible:
            encoded, offset = read_unsigned_varint(buf, offset)
            count = encoded - 1
        else:
            if len(buf) - offset < _INT32.size:
                raise BufferUnderflow("input ended inside an array length")
            (count,) = _INT32.unpack_from(buf, offset)
            offset += _INT32.size
        if count < 0:
            if count == -1:
                return None, offset
            raise DecodeError(f"array length {count} is negative")
        if count > len(buf) - offset:
            raise BufferUnderflow(
                f"array of {count} items but only {len(buf) - offset} bytes remain"
            )
        items = []
        for _ in range(count):
            value, offset = item(buf, offset)
            items.append(value)
        return tuple(items), offset

    return read


def _nullable_entity(inner: FieldReader) -> FieldReader:
    def read(buf: Buf, offset: int) -> tuple[Any, int]:
        if len(buf) - offset < _INT8.size:
            raise BufferUnderflow("input ended inside a nullable struct marker")
        (marker,) = _INT8.unpack_from(buf, offset)
        if marker == _NULL_ENTITY:
            return None, offset + 1
        return inner(buf, offset + 1)

    return read


def _field_reader(field: Field[Any], flexible: bool, is_tag: bool) -> FieldReader:
    optional = False if is_tag else is_optional(field)
    match classify_field(field):
        case PrimitiveField():
            return _primitive(get_schema_field_type(field), flexible, optional)
        case PrimitiveTupleField():
            item = _primitive(get_schema_field_type(field), flexible, False)
            return _array(item, flexible)
        case EntityField(entity_type):
            reader = entity_reader(entity_type)
            return _nullable_entity(reader) if optional else reader
        case EntityTupleField(entity_type):
            return _array(entity_reader(entity_type), flexible)
    raise DecodeError(f"unsupported schema field {field.name}")  # pragma: no cover


def _tag_default(field: Field[Any]) -> Callable[[], Any]:
    if field.default is not MISSING:
        default = field.default
        return lambda: default
    if field.default_factory is not MISSING:
        return field.default_factory
    implicit = get_tagged_field_default(field)
    return lambda: implicit


@cache
def entity_reader(entity_type: type) -> FieldReader:
    """A bounds-checked reader for one kio schema class (cached per class)."""
    flexible = bool(getattr(entity_type, "__flexible__", False))
    plain: list[tuple[str, FieldReader]] = []
    tagged: dict[int, tuple[str, FieldReader]] = {}
    tag_defaults: dict[str, Callable[[], Any]] = {}
    for field in fields(entity_type):
        tag = get_field_tag(field)
        if tag is None:
            plain.append((field.name, _field_reader(field, flexible, is_tag=False)))
        else:
            tagged[int(tag)] = (field.name, _field_reader(field, flexible, is_tag=True))
            tag_defaults[field.name] = _tag_default(field)

    def read(buf: Buf, offset: int) -> tuple[Any, int]:
        values: dict[str, Any] = {}
        for name, reader in plain:
            values[name], offset = reader(buf, offset)
        if flexible:
            offset = _read_tags(buf, offset, tagged, values)
            for name, default in tag_defaults.items():
                if name not in values:
                    values[name] = default()
        return entity_type(**values), offset

    return read


def _read_tags(
    buf: Buf, offset: int, tagged: dict[int, tuple[str, FieldReader]], values: dict[str, Any]
) -> int:
    count, offset = read_unsigned_varint(buf, offset)
    for _ in range(count):
        tag, offset = read_unsigned_varint(buf, offset)
        size, offset = read_unsigned_varint(buf, offset)
        end = offset + size
        if end > len(buf):
            raise BufferUnderflow("input ended inside a tagged field")
        known = tagged.get(tag)
        if known is not None:  # unknown tags are skipped, as KIP-482 requires
            name, reader = known
            values[name], value_end = reader(memoryview(buf)[:end], offset)
            if value_end != end:
                raise DecodeError(f"tagged field {tag} is {size} bytes but its value is not")
        offset = end
    return offset
